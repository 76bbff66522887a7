"""``FSDPNPUTest``: torch's ``FSDPTest`` on npu devices over hccl (as torch_npu.testing._internal
has it), for FSDP tests written against torch_npu.

Importing this module points torch's FSDP test helpers at npu (``DEVICE_TYPE``,
``DISTRIBUTED_BACKEND`` and ``DEVICE_COUNT`` of ``torch.testing._internal.common_fsdp``): their
models and the world size of every FSDPTest follow.
"""
import torch
import torch.testing._internal.common_fsdp as _torch_common_fsdp
from torch.testing._internal.common_fsdp import FSDPTest

__all__ = ["FSDPNPUTest"]

_torch_common_fsdp.DEVICE_TYPE = "npu"
_torch_common_fsdp.DISTRIBUTED_BACKEND = "hccl"
_torch_common_fsdp.DEVICE_COUNT = torch.npu.device_count()


class FSDPNPUTest(FSDPTest):
    """One process per npu device (``world_size`` = the visible devices), each on its own device."""

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        # torch's _run chooses the device of CUDA and XPU ranks only
        torch.npu.set_device(rank % torch.npu.device_count())
        super()._run(rank, test_name, file_name, pipe, **kwargs)
