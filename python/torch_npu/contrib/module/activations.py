import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Mish", "SiLU", "Swish"]


class Mish(nn.Module):
    """x * tanh(softplus(x))."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.mish(x)


class SiLU(nn.Module):
    """x * sigmoid(x) (also called Swish)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.silu(x)


Swish = SiLU
