"""torch_npu.distributed.tensor: DTensor support of torch_npu.

Importing it (``import torch_npu`` does, once ``torch.distributed.tensor`` is imported) registers
the DTensor sharding strategies of torch_npu's fused operators (``_sharding``) and adds npu ring
attention to the context-parallel dispatcher of ``torch.distributed.tensor.experimental`` (see
``experimental``).
"""
from torch_npu.distributed.tensor import experimental  # noqa: F401
