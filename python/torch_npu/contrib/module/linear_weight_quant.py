"""torch_npu's module path of LinearWeightQuant (defined in linear_quant.py)."""
from .linear_quant import LinearWeightQuant

__all__ = ["LinearWeightQuant"]
