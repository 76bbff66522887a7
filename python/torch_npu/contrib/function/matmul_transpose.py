import torch

__all__ = ["matmul_transpose"]


def _matmul_transpose(tensor1, tensor2):
    return torch.matmul(tensor1, tensor2.transpose(-2, -1))


def matmul_transpose(*args, **kwargs):
    """matmul_transpose(tensor1, tensor2): tensor1 @ tensor2.transpose(-2, -1) (e.g. query @ key^T),
    differentiable. (torch_npu exports it as an ``autograd.Function.apply``, hence the signature.)"""
    return _matmul_transpose(*args, **kwargs)
