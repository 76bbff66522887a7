from ._matmul_transpose import MatmulApply

__all__ = ["matmul_transpose"]


def matmul_transpose(*args, **kwargs):
    """matmul_transpose(tensor1, tensor2): tensor1 @ tensor2.transpose(-2, -1) (e.g. query @ key^T),
    differentiable. (torch_npu exports it as an ``autograd.Function.apply``, hence the signature.)"""
    return MatmulApply.apply(*args, **kwargs)
