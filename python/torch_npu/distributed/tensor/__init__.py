"""torch_npu.distributed.tensor: DTensor support of torch_npu.

Importing it adds npu ring attention to the context-parallel dispatcher of
``torch.distributed.tensor.experimental`` (see ``experimental``).
"""
from torch_npu.distributed.tensor import experimental  # noqa: F401
