import torch

__all__ = ["roll"]


def roll(x, shifts, dims):
    """torch.roll with torch_npu.contrib's signature (their index_select trick is an Ascend
    performance workaround; the result is torch.roll's)."""
    return torch.roll(x, shifts, dims)
