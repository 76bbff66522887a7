import math

import torch
from torch import nn
from torch.nn.modules.utils import _pair

__all__ = ["ModulatedDeformConv2dFunction", "ModulatedDeformConv", "DCNv2"]


class ModulatedDeformConv2dFunction(torch.autograd.Function):
    """torch_npu's modulated deformable convolution as an autograd Function: forward is
    ``npu_deformable_conv2d`` on float32 inputs with the offsets reordered by
    ``sort_index_for_npu_fp`` (mmcv's interleaved (y, x) pairs -> all x, then all y) and the
    mask appended; backward is ``npu_deformable_conv2dbk``, its offset gradient put back in
    mmcv's order with ``sort_index_for_npu_bp``."""

    @staticmethod
    def forward(ctx, input_tensor, offset_ori, mask, weight, bias=None, with_bias=False, stride=1, padding=0,
                dilation=1, groups=1, deformable_groups=1, sort_index_for_npu_fp=None, sort_index_for_npu_bp=None):
        input_tensor = input_tensor.float()
        offset_ori = offset_ori.float()
        mask = mask.float()
        split_num = offset_ori.shape[1]
        if sort_index_for_npu_fp is None:
            index = list(range(split_num))
            sort_index_for_npu_fp = torch.tensor(index[1::2] + index[::2], device=offset_ori.device)
        if sort_index_for_npu_bp is None:
            sort_index_for_npu_bp = torch.argsort(sort_index_for_npu_fp.long().cpu()).to(offset_ori.device)
        ctx.stride, ctx.padding, ctx.dilation = stride, padding, dilation
        ctx.groups, ctx.deformable_groups = groups, deformable_groups
        ctx.sort_index_for_npu_bp = sort_index_for_npu_bp
        ctx.with_bias = with_bias
        offset = offset_ori.index_select(1, sort_index_for_npu_fp.to(offset_ori.device))
        offset_all = torch.cat([offset, mask], dim=1)
        output, offset_out = torch.ops.npu.npu_deformable_conv2d(
            input_tensor, weight, offset_all, bias, kernel_size=[weight.shape[3], weight.shape[2]],
            stride=[1, 1, stride, stride], padding=[padding] * 4, dilation=[1, 1, dilation, dilation],
            groups=groups, deformable_groups=deformable_groups, modulated=True)
        ctx.save_for_backward(input_tensor, weight, offset_out, offset_all)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_tensor, weight, offset_out, offset_all = ctx.saved_tensors
        grad_input, grad_weight, grad_offset_all, grad_bias = torch.ops.npu.npu_deformable_conv2dbk(
            input_tensor, grad_output.contiguous(), offset_out, weight, offset_all,
            kernel_size=[weight.shape[3], weight.shape[2]], stride=[1, 1, ctx.stride, ctx.stride],
            padding=[ctx.padding] * 4, dilation=[1, 1, ctx.dilation, ctx.dilation], groups=ctx.groups,
            deformable_groups=ctx.deformable_groups, modulated=True)
        bp = ctx.sort_index_for_npu_bp.to(grad_offset_all.device)
        grad_offset = grad_offset_all.index_select(1, bp)
        grad_mask = grad_offset_all[:, grad_offset.shape[1]:, :, :]
        if not ctx.with_bias:
            grad_bias = None
        return (grad_input, grad_offset, grad_mask, grad_weight, grad_bias,
                None, None, None, None, None, None, None, None)


class ModulatedDeformConv(nn.Module):
    """Modulated deformable convolution (DCNv2) on torch_npu.npu_deformable_conv2d.

    With ``pack`` (default) the offsets and masks come from an internal ``conv_offset``
    (zero-initialised, so the layer starts as a plain convolution); otherwise forward takes
    ``(x, offset, mask)`` with mmcv's offset layout ((y, x) pairs per kernel tap) and a mask
    in [0, 1]."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 deformable_groups=1, bias=True, pack=True):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.groups = groups
        self.deformable_groups = deformable_groups
        self.with_bias = bias
        self.pack = pack
        self.weight = nn.Parameter(torch.Tensor(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.Tensor(out_channels))
        else:
            self.register_parameter("bias", None)
        if self.pack:
            self.conv_offset = nn.Conv2d(self.in_channels,
                                         self.deformable_groups * 3 * self.kernel_size[0] * self.kernel_size[1],
                                         kernel_size=self.kernel_size, stride=_pair(self.stride),
                                         padding=_pair(self.padding), bias=True)
        self.split_num = self.deformable_groups * 2 * self.kernel_size[0] * self.kernel_size[1]
        # mmcv interleaves (y, x) per tap; the kernel takes all x offsets, then all y offsets.
        index = list(range(self.split_num))
        self.register_buffer("sort_index_for_npu_fp", torch.tensor(index[1::2] + index[::2]), persistent=False)
        self.init_param()

    def init_param(self):
        n = self.in_channels
        for k in self.kernel_size:
            n *= k
        stdv = 1. / math.sqrt(n)
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.zero_()
        if self.pack:
            self.conv_offset.weight.data.zero_()
            self.conv_offset.bias.data.zero_()

    def forward(self, x):
        if self.pack:
            out = self.conv_offset(x)
            offset = out[:, :self.split_num, ...]
            mask = torch.sigmoid(out[:, self.split_num:, ...])
        else:
            x, offset, mask = x
        index = self.sort_index_for_npu_fp.to(offset.device)
        offset_all = torch.cat([offset.index_select(1, index), mask], dim=1).to(x.dtype)
        s, p, d = self.stride, self.padding, self.dilation
        output, _ = torch.ops.npu.npu_deformable_conv2d(
            x, self.weight.to(x.dtype), offset_all, None if self.bias is None else self.bias.to(x.dtype),
            kernel_size=list(self.kernel_size), stride=[1, 1, s, s], padding=[p, p, p, p], dilation=[1, 1, d, d],
            groups=self.groups, deformable_groups=self.deformable_groups, modulated=True)
        return output


DCNv2 = ModulatedDeformConv
