"""Deterministic algorithms for part of a model, forward and backward (torch_npu's API).

``y = enable_deterministic_with_backward(x)`` turns ``torch.use_deterministic_algorithms``
on from here in the forward pass, and off again when the backward pass gets back to this
point; ``disable_deterministic_with_backward`` is the mirror image. Wrapping a region
between the two makes both its forward and its backward deterministic.
"""
import torch
from torch.autograd.function import Function

__all__ = ["enable_deterministic_with_backward", "disable_deterministic_with_backward"]


class _SetDeterministic(Function):
    """Sets deterministic algorithms to ``enabled`` here in the forward pass and back to
    ``not enabled`` when the backward pass reaches this point (leaving or entering the
    region, which the backward pass crosses in the opposite direction)."""

    @staticmethod
    def forward(ctx, tensor, enabled: bool):
        ctx.enabled = enabled
        torch.use_deterministic_algorithms(enabled)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        torch.use_deterministic_algorithms(not ctx.enabled)
        return grad, None


def _check(fn: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{fn}(): argument 'tensor' must be a Tensor, got {type(tensor).__name__}")


def enable_deterministic_with_backward(tensor: torch.Tensor):
    r"""Turn deterministic algorithms on (forward) and off again in the backward pass."""
    _check("enable_deterministic_with_backward", tensor)
    return _SetDeterministic.apply(tensor, True)


def disable_deterministic_with_backward(tensor: torch.Tensor):
    r"""Turn deterministic algorithms off (forward) and on again in the backward pass."""
    _check("disable_deterministic_with_backward", tensor)
    return _SetDeterministic.apply(tensor, False)


enable_deterministic_with_backward._dynamo_forbidden = True
disable_deterministic_with_backward._dynamo_forbidden = True
