import torch
from torch import nn

__all__ = ["ChannelShuffle"]


class ChannelShuffle(nn.Module):
    """ShuffleNetV2's channel shuffle of cat([x1, x2], dim=1) with ``groups`` groups.

    forward(x1, x2) returns the shuffled channels split in two halves when
    ``split_shuffle`` (default), else the whole tensor."""

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

    def forward(self, x1, x2):
        x = torch.cat([x1, x2], dim=1)
        # As torch_npu, the first in_channels channels of the concatenation are shuffled
        # (more channels in total are allowed and the extra ones dropped).
        if x.size(1) < self.in_channels:
            raise ValueError(f"ChannelShuffle: expected at least in_channels = {self.in_channels} channels "
                             f"in x1 and x2 together, got {x.size(1)}")
        out = x.index_select(1, self.out_channels.to(x.device))
        if self.split_shuffle:
            return out[:, :self.group_len * self.groups // 2], out[:, self.group_len * self.groups // 2:]
        return out
