"""``LinearA8W8Quant``: LinearQuant for int8 activations and weights (deprecated in torch_npu)."""
import warnings

import torch
from torch import Tensor

from .linear_quant import LinearQuant

__all__ = ["LinearA8W8Quant"]


class LinearA8W8Quant(LinearQuant):
    """LinearQuant for int8 activations and weights, with torch_npu's dtype checks of its
    parameters. Deprecated in torch_npu in favour of LinearQuant (a FutureWarning)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, offset: bool = False,
                 pertoken_scale: bool = False, device=None, dtype=None, output_dtype=None) -> None:
        warnings.warn("torch_npu.contrib.module.LinearA8W8Quant is deprecated and will be removed in a future "
                      "version. Use torch_npu.contrib.module.LinearQuant instead.", FutureWarning)
        super().__init__(in_features, out_features, bias=bias, offset=offset, pertoken_scale=pertoken_scale,
                         device=device, dtype=dtype, output_dtype=output_dtype)

    def _check(self, x: Tensor) -> None:
        super()._check(x)
        name = type(self).__name__
        if self.scale.dtype not in (torch.int64, torch.float32, torch.bfloat16):
            raise ValueError(f"{name}: scale should be torch.int64, torch.float32 or torch.bfloat16, "
                             f"but it is {self.scale.dtype}")
        if self.offset is not None and self.offset.dtype != torch.float32:
            raise ValueError(f"{name}: offset should be torch.float32, but it is {self.offset.dtype}")
        if self.bias is not None and self.bias.dtype not in (torch.int32, torch.bfloat16, torch.float16,
                                                             torch.float32):
            raise ValueError(f"{name}: bias should be torch.int32, torch.bfloat16, torch.float16 or torch.float32, "
                             f"but it is {self.bias.dtype}")
        if self.pertoken_scale is not None and self.pertoken_scale.dtype != torch.float32:
            raise ValueError(f"{name}: pertoken_scale should be torch.float32, but it is {self.pertoken_scale.dtype}")
        if self.output_dtype is not None and self.output_dtype not in (torch.int8, torch.float16, torch.bfloat16):
            raise ValueError(f"{name}: output_dtype should be torch.int8, torch.float16 or torch.bfloat16, "
                             f"but it is {self.output_dtype}")
