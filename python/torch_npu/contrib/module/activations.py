import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Mish", "SiLU", "Swish"]


class Mish(nn.Module):
    """x * tanh(softplus(x))."""

    def forward(self, x):
        return F.mish(x)


class SiLU(nn.Module):
    """x * sigmoid(x) (also called Swish)."""

    def forward(self, x):
        return F.silu(x)


Swish = SiLU
