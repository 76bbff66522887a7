"""torch_npu's module path of NpuPreGenDropout (defined in pregen_dropout.py)."""
from .pregen_dropout import NpuPreGenDropout

__all__ = []
