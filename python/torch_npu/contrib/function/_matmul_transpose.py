"""``MatmulApply``: ``tensor1 @ tensor2.transpose(-2, -1)`` as an autograd Function (torch_npu's
``matmul_transpose``, e.g. attention scores ``q @ k^T``)."""
import torch

__all__ = []


class MatmulApply(torch.autograd.Function):
    """``MatmulApply.apply(tensor1, tensor2)`` is ``tensor1 @ tensor2.transpose(-2, -1)``; both
    inputs get gradients (summed over broadcast batch dimensions)."""

    @staticmethod
    def forward(ctx, tensor1, tensor2):
        ctx.save_for_backward(tensor1, tensor2)
        return torch.matmul(tensor1, tensor2.transpose(-2, -1))

    @staticmethod
    def backward(ctx, grad):
        tensor1, tensor2 = ctx.saved_tensors
        grad1 = grad2 = None
        if ctx.needs_input_grad[0]:
            grad1 = torch.matmul(grad, tensor2).sum_to_size(tensor1.shape)
        if ctx.needs_input_grad[1]:
            grad2 = torch.matmul(grad.transpose(-2, -1), tensor1).sum_to_size(tensor2.shape)
        return grad1, grad2
