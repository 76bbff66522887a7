import torch
from torch import nn

__all__ = ["NpuDropPath"]


class NpuDropPath(nn.Module):
    """Stochastic depth: zeroes whole samples with probability ``drop_prob`` in training
    and scales the others by 1 / (1 - drop_prob)."""

    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if not self.drop_prob or not self.training:
            return x
        keep_prob = 1 - self.drop_prob
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        random_tensor = torch.floor(keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device))
        return x.div(keep_prob) * random_tensor

    @classmethod
    def enable_droppath_ensemble(cls, model):
        """torch_npu pre-generates the random tensors on a side stream; here a no-op."""
        return model
