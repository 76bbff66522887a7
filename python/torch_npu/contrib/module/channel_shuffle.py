import torch
from torch import nn

__all__ = ["ChannelShuffle", "IndexSelectFullImplementation", "IndexSelectHalfImplementation",
           "indexselect_full_implementation_forward", "indexselect_half_implementation_forward"]


class ChannelShuffle(nn.Module):
    """ShuffleNetV2's channel shuffle of cat([x1, x2], dim=1) with ``groups`` groups.

    forward(x1, x2) returns the shuffled channels split in two halves when
    ``split_shuffle`` (default), else the whole tensor. As in torch_npu, training with
    ``groups=2`` runs through ``IndexSelectHalfImplementation`` / ``IndexSelectFullImplementation``
    (index_select forward, index_select of the interleaved gradient backward); other
    group counts use index_select with autograd's own backward."""

    def __init__(self, in_channels, groups=2, split_shuffle=True):
        super().__init__()
        if in_channels % groups:
            raise ValueError(f"ChannelShuffle: groups ({groups}) must divide in_channels ({in_channels})")
        self.in_channels = in_channels
        self.groups = groups
        self.split_shuffle = split_shuffle
        self.group_len = in_channels // groups
        order = torch.arange(in_channels).reshape(groups, self.group_len).t().flatten()
        self.register_buffer("out_channels", order, persistent=False)
        # torch_npu's forward/backward indices (its autograd functions are for groups=2)
        if split_shuffle:
            self.fp_index1 = order[:self.group_len]
            self.fp_index2 = order[self.group_len:]
        else:
            self.fp_index = order
        self.bp_index1 = torch.arange(0, in_channels, 2)
        self.bp_index2 = torch.arange(1, in_channels, 2)
        self.checked = False

    def check_self(self, x):
        """Move the forward/backward indices to ``x``'s device (int32 on npu, as torch_npu)."""
        if self.bp_index1.device == x.device:
            self.checked = True
            return
        names = ["fp_index1", "fp_index2"] if self.split_shuffle else ["fp_index"]
        for name in names + ["bp_index1", "bp_index2"]:
            index = getattr(self, name)
            if x.device.type == "npu":
                index = index.int()
            setattr(self, name, index.to(x.device))
        self.checked = True

    def forward(self, x1, x2):
        x = torch.cat([x1, x2], dim=1)
        # As torch_npu, the first in_channels channels of the concatenation are shuffled
        # (more channels in total are allowed and the extra ones dropped).
        if x.size(1) < self.in_channels:
            raise ValueError(f"ChannelShuffle: expected at least in_channels = {self.in_channels} channels "
                             f"in x1 and x2 together, got {x.size(1)}")
        if self.groups == 2 and x1.size(1) == x2.size(1) == self.group_len:
            if not self.checked or self.bp_index1.device != x1.device:
                self.check_self(x1)
            if self.split_shuffle:
                if self.training:
                    return IndexSelectHalfImplementation.apply(x1, x2, self.fp_index1, self.fp_index2,
                                                               self.bp_index1, self.bp_index2)
                return indexselect_half_implementation_forward(x1, x2, self.fp_index1, self.fp_index2)
            if self.training:
                return IndexSelectFullImplementation.apply(x1, x2, self.fp_index, self.bp_index1, self.bp_index2)
            return indexselect_full_implementation_forward(x1, x2, self.fp_index)
        out = x.index_select(1, self.out_channels.to(x.device))
        if self.split_shuffle:
            return out[:, :self.group_len * self.groups // 2], out[:, self.group_len * self.groups // 2:]
        return out


def indexselect_full_implementation_forward(x1, x2, fp_index):
    """cat([x1, x2], 1) with its channels reordered by ``fp_index``."""
    return torch.cat([x1, x2], dim=1).index_select(1, fp_index)


def indexselect_half_implementation_forward(x1, x2, fp_index1, fp_index2):
    """The two halves of the shuffled cat([x1, x2], 1): channels ``fp_index1`` and ``fp_index2``."""
    x = torch.cat([x1, x2], dim=1)
    return x.index_select(1, fp_index1), x.index_select(1, fp_index2)


class IndexSelectFullImplementation(torch.autograd.Function):
    """Shuffle of two inputs into one output; the gradient of x1 (x2) is the output gradient's
    channels ``bp_index1`` (``bp_index2``)."""

    @staticmethod
    def forward(ctx, x1, x2, fp_index, bp_index1, bp_index2):
        ctx.bp_index1 = bp_index1
        ctx.bp_index2 = bp_index2
        return torch.cat([x1, x2], dim=1).index_select(1, fp_index)

    @staticmethod
    def backward(ctx, grad_output):
        out1 = grad_output.index_select(1, ctx.bp_index1)
        out2 = grad_output.index_select(1, ctx.bp_index2)
        return out1, out2, None, None, None


class IndexSelectHalfImplementation(torch.autograd.Function):
    """Shuffle of two inputs into two halves; backward concatenates the halves' gradients and
    takes channels ``bp_index1`` for x1 and ``bp_index2`` for x2."""

    @staticmethod
    def forward(ctx, x1, x2, fp_index1, fp_index2, bp_index1, bp_index2):
        ctx.bp_index1 = bp_index1
        ctx.bp_index2 = bp_index2
        x = torch.cat([x1, x2], dim=1)
        return x.index_select(1, fp_index1), x.index_select(1, fp_index2)

    @staticmethod
    def backward(ctx, grad_output1, grad_output2):
        grad_output = torch.cat([grad_output1, grad_output2], 1)
        out1 = grad_output.index_select(1, ctx.bp_index1)
        out2 = grad_output.index_select(1, ctx.bp_index2)
        return out1, out2, None, None, None, None
