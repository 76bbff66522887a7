import torch
from torch import Tensor, nn
from torch.nn.common_types import _size_2_t
from torch.nn.modules.utils import _pair
from torch.nn.parameter import Parameter

__all__ = ["QuantConv2d"]


class QuantConv2d(nn.Module):
    """int8 Conv2d + dequantisation on torch_npu.npu_quant_conv2d:
    ``output = (conv(input, weight) + bias) * scale`` per output channel.

    Args as torch_npu's: in_channels, out_channels, kernel_size, output_dtype (torch.float16,
    torch.bfloat16 or torch.float32), stride=1, padding=0, dilation=1, groups=1, bias=True,
    offset=False (must be False), offset_x=0 (the value padding takes), round_mode="rint",
    input_dtype=None, weight_dtype=None (hifloat8 is not supported).
    ``weight`` (int8 [out, in / groups, kh, kw]), ``scale`` (int64 packed or float32 [out])
    and ``bias`` (int32 [out]) are set by the user.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_2_t, output_dtype: int,
                 stride: _size_2_t = 1, padding: _size_2_t = 0, dilation: _size_2_t = 1, groups: int = 1,
                 bias: bool = True, offset: bool = False, offset_x: int = 0, round_mode: str = "rint",
                 input_dtype: int = None, weight_dtype: int = None, device=None, dtype=None) -> None:
        super().__init__()
        if offset:
            raise ValueError("QuantConv2d: offset must be False")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.offset_x = offset_x
        self.round_mode = round_mode
        self.input_dtype = input_dtype
        self.weight_dtype = weight_dtype
        self.output_dtype = output_dtype
        self.weight = Parameter(torch.empty((out_channels, in_channels // groups, *self.kernel_size), device=device),
                                False)
        self.scale = Parameter(torch.empty(out_channels, dtype=torch.int64, device=device), False)
        self.bias = Parameter(torch.empty(out_channels, device=device), False) if bias else None
        self.offset = None

    def forward(self, quant_conv2d_input: Tensor) -> Tensor:
        scale = self.scale
        if scale.dtype == torch.float32:
            scale = torch.ops.npu.npu_trans_quant_param(scale)
        return torch.ops.npu.npu_quant_conv2d(quant_conv2d_input, self.weight, scale, self.stride, self.padding,
                                              self.dilation, self.groups, self.offset_x, self.round_mode,
                                              self.output_dtype, self.bias, self.offset, self.input_dtype,
                                              self.weight_dtype)
