import warnings

import torch
from torch import Tensor, nn
from torch.nn.parameter import Parameter

from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["LinearQuant", "LinearA8W8Quant", "LinearWeightQuant"]


class LinearQuant(nn.Module):
    """Quantised linear layer on torch_npu.npu_quant_matmul:
    ``out = (x @ weight.T [+ bias int32]) * scale [* pertoken_scale] [+ bias float] [+ offset]``.

    Args:
        in_features, out_features: the sizes of x's last axis and the output's.
        bias: learn an int32 bias (set its ``.data``, e.g. to float for bfloat16 output).
        offset: a float32 per-channel offset (int8 output only).
        pertoken_scale: a float32 per-row scale of x (float16/bfloat16 output).
        output_dtype: torch.int8 (None), torch.float16, torch.bfloat16 or torch.int32 (the int32 sums).
    The int8 ``weight`` [out_features, in_features] (or, with an int32 input, int4 values packed
    eight to an int32: [out_features, in_features // 8]) and float32 ``scale`` [out_features] or [1]
    are set by the user (``model.weight.data = ...``); as in torch_npu, a float32 scale is
    packed by npu_trans_quant_param (with the offset) unless pertoken_scale is used or the
    output is bfloat16.
    """

    in_features: int
    out_features: int

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, offset: bool = False,
                 pertoken_scale: bool = False, device=None, dtype=None, output_dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.empty((out_features, in_features), device=device), False)
        self.scale = Parameter(torch.empty(out_features, device=device), False)
        self.output_dtype = output_dtype
        self.offset = Parameter(torch.empty(out_features, dtype=torch.float32, device=device), False) if offset \
            else None
        self.pertoken_scale = Parameter(torch.empty(out_features, dtype=torch.float32, device=device), False) \
            if pertoken_scale else None
        self.bias = Parameter(torch.empty(out_features, dtype=torch.int32, device=device), False) if bias else None

    def _check(self, x: Tensor) -> None:
        if not (x.dtype == self.weight.dtype and x.dtype in (torch.int8, torch.int32)):
            raise ValueError("input and weight should be both torch.int32 or both torch.int8 datatype, "
                             f"but now input is {x.dtype}, weight is {self.weight.dtype}." + ops_error(ErrCode.TYPE))

    def forward(self, linear_quant_input: Tensor) -> Tensor:
        x = linear_quant_input
        self._check(x)
        scale = self.scale
        offset = self.offset
        if self.pertoken_scale is None and scale.dtype == torch.float32 and \
                self.output_dtype not in (torch.bfloat16, torch.int32):
            scale = torch.ops.npu.npu_trans_quant_param(scale, offset)
            offset = None  # packed into the scale
        return torch.ops.npu.npu_quant_matmul(x, self.weight.transpose(-2, -1), scale, offset=offset,
                                              pertoken_scale=self.pertoken_scale, bias=self.bias,
                                              output_dtype=self.output_dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, output_dtype={self.output_dtype}")


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


class LinearWeightQuant(nn.Module):
    """Weight-only quantised linear layer on torch_npu.npu_weight_quant_batchmatmul:
    ``y = x @ ((weight + antiquant_offset) * antiquant_scale).T + bias``, then int8
    ``round(y * quant_scale + quant_offset)`` when quant_scale is set.

    ``weight`` is int8 [out_features, in_features]; ``antiquant_scale``/``antiquant_offset`` are
    [out_features] (per channel), [1] (per tensor) or [out_features, ceil(in_features / group)]
    with ``antiquant_group_size`` = group (transposed for the op, as in torch_npu).
    """

    def __init__(self, in_features, out_features, bias: bool = True, device=None, dtype=None,
                 antiquant_offset: bool = False, quant_scale: bool = False, quant_offset: bool = False,
                 antiquant_group_size: int = 0, inner_precise: int = 0, weight_dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.empty((out_features, in_features), device=device), False)
        self.antiquant_scale = Parameter(torch.empty(out_features, device=device), False)
        self.antiquant_offset = Parameter(torch.empty(out_features, device=device), False) if antiquant_offset \
            else None
        self.quant_scale = Parameter(torch.empty(out_features, device=device), False) if quant_scale else None
        self.quant_offset = Parameter(torch.empty(out_features, device=device), False) if quant_offset else None
        self.bias = Parameter(torch.empty(out_features, device=device), False) if bias else None
        self.antiquant_group_size = antiquant_group_size
        self.inner_precise = inner_precise
        self.weight_dtype = weight_dtype

    def forward(self, x: Tensor) -> Tensor:
        antiquant_scale = self.antiquant_scale
        antiquant_offset = self.antiquant_offset
        if antiquant_scale.dim() == 2:
            antiquant_scale = antiquant_scale.transpose(-1, -2)
        if antiquant_offset is not None and antiquant_offset.dim() == 2:
            antiquant_offset = antiquant_offset.transpose(-1, -2)
        return torch.ops.npu.npu_weight_quant_batchmatmul(
            x, self.weight.transpose(-1, -2), antiquant_scale, antiquant_offset, self.quant_scale,
            self.quant_offset, self.bias, self.antiquant_group_size, self.inner_precise,
            weight_dtype=self.weight_dtype)
