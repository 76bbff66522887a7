"""torch_npu.distributed.distributed_c10d: torch_npu's additions to torch.distributed's c10d."""
import torch.distributed as dist

__all__ = ["is_hccl_available"]


def is_hccl_available():
    """True when the ``hccl`` backend is registered with torch.distributed."""
    return dist.is_available() and "hccl" in dist.Backend.backend_list
