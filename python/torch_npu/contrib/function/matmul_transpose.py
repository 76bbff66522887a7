import torch

__all__ = ["matmul_transpose"]


def matmul_transpose(tensor1, tensor2):
    """tensor1 @ tensor2.transpose(-2, -1) (e.g. query @ key^T), differentiable."""
    return torch.matmul(tensor1, tensor2.transpose(-2, -1))
