"""``NPUDTensorTestBase``: torch's ``DTensorTestBase`` on npu devices over hccl, for DTensor tests
written against torch_npu (e.g. Huawei's context-parallel attention tests)."""
import torch
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase

__all__ = ["NPUDTensorTestBase"]


class NPUDTensorTestBase(DTensorTestBase):
    @property
    def device_type(self) -> str:
        return "npu"

    @property
    def world_size(self) -> int:
        count = torch.npu.device_count()
        return min(4, count) if count >= 2 else 4
