import torch
from torch import Tensor, nn
from torch.nn.parameter import Parameter

from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["LinearQuant"]


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
