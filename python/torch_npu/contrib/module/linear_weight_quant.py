"""``LinearWeightQuant``: the weight-only quantised linear layer."""
import torch
from torch import Tensor, nn
from torch.nn.parameter import Parameter

__all__ = ["LinearWeightQuant"]


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
