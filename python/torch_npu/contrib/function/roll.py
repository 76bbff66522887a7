import torch

__all__ = ["roll"]


def roll(input1, shifts, dims):
    """torch.roll with torch_npu.contrib's signature (their index_select trick is an Ascend
    performance workaround; the result is torch.roll's)."""
    return torch.roll(input1, shifts, dims)
