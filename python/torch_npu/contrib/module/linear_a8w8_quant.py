"""torch_npu's module path of LinearA8W8Quant (defined in linear_quant.py)."""
from .linear_quant import LinearA8W8Quant

__all__ = ["LinearA8W8Quant"]
