"""torch_npu.distributed.fsdp: ``fully_shard`` (FSDP2) for npu modules.

It is torch.distributed.fsdp.fully_shard (torch_npu wraps torch's to apply its FSDP
patches first; the simulator's hccl needs none): parameters are sharded as DTensors over
the mesh's npu devices and all-gathered around forward and backward.
"""
from torch.distributed.fsdp import fully_shard as _torch_fully_shard

__all__ = ["fully_shard"]


def fully_shard(*args, **kwargs):
    return _torch_fully_shard(*args, **kwargs)


fully_shard.state = _torch_fully_shard.state
fully_shard.__doc__ = _torch_fully_shard.__doc__
