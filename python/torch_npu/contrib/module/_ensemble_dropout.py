"""torch_npu's module path of NpuPreGenDropout (defined in pregen_dropout.py)."""
from .pregen_dropout import NpuPreGenDropout
from .pregen_dropout import _PreGenMasks as _PreGenDropoutTask  # noqa: F401  (torch_npu's name)

__all__ = []
