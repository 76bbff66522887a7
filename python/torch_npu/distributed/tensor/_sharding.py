"""DTensor sharding strategies of torch_npu's fused operators (as torch_npu registers them), so
that a tensor-parallel model calls ``torch_npu.npu_rms_norm``, ``npu_add_rms_norm``,
``npu_rotary_mul`` and ``npu_swiglu`` (and their backward operators) on DTensors.

Registered when ``torch.distributed.tensor`` is first imported (torch_npu.distributed sets up the
hook), through ``torch.distributed.tensor.experimental.register_sharding``: each function lists
the placements it accepts on one mesh dimension, as ``(outputs, inputs)``, with ``None`` for the
arguments that are not tensors; DTensor picks the cheapest and redistributes the inputs to it.
"""
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

npu = torch.ops.npu

__all__ = []


def _tensor_like(arg):
    return hasattr(arg, "placements") and hasattr(arg, "ndim")


def _inputs(args, placements):
    """``placements`` (one per tensor argument, in order) spread over ``args``, None elsewhere."""
    it = iter(placements)
    return [next(it) if _tensor_like(a) else None for a in args]


def _shape(spec):
    return tuple(spec.shape)


def _leading_dims(x, trailing):
    """The dims of ``x`` before its last ``trailing`` ones: where a row-wise op may shard."""
    return range(max(x.ndim - trailing, 0))


@register_sharding(npu.npu_rms_norm.default)
def _rms_norm(x, gamma, *args):
    rows = [([Replicate(), Replicate()], _inputs((x, gamma) + args, [Replicate(), Replicate()]))]
    for d in _leading_dims(x, gamma.ndim):  # rstd keeps x's rank (1 over the normalised dims)
        rows.append(([Shard(d), Shard(d)], _inputs((x, gamma) + args, [Shard(d), Replicate()])))
    return rows


@register_sharding(npu.npu_rms_norm_backward.default)
def _rms_norm_backward(dy, x, gamma, rstd):
    rows = [([Replicate(), Replicate()], [Replicate()] * 4)]
    for d in _leading_dims(x, gamma.ndim):  # dgamma sums over the rows: partial per shard
        rows.append(([Shard(d), Partial()], [Shard(d), Shard(d), Replicate(), Shard(d)]))
    return rows


@register_sharding(npu.npu_add_rms_norm.default)
def _add_rms_norm(x1, x2, gamma, *args):
    tensors = (x1, x2, gamma) + args
    rows = [([Replicate()] * 3, _inputs(tensors, [Replicate()] * 3))]
    if _shape(x1) == _shape(x2):
        for d in _leading_dims(x1, gamma.ndim):
            rows.append(([Shard(d)] * 3, _inputs(tensors, [Shard(d), Shard(d), Replicate()])))
    return rows


def _rotary_table_placement(x, table, d):
    """A cos/sin table (r1, r2) broadcast along dim d stays whole; one as long as x is sharded too."""
    return Replicate() if table.shape[d] == 1 else Shard(d)


def _rotary_dims(x, r1, r2):
    if r1.ndim != x.ndim or r2.ndim != x.ndim:
        return []
    return [d for d in range(x.ndim - 1)  # never the rotated (last) dim
            if all(t.shape[d] in (1, x.shape[d]) for t in (r1, r2)) and _shape(r1)[d] == _shape(r2)[d]]


@register_sharding(npu.npu_rotary_mul.default)
def _rotary_mul(x, r1, r2, *args):
    tensors = (x, r1, r2) + args
    n = sum(_tensor_like(a) for a in tensors)
    rows = [([Replicate()], _inputs(tensors, [Replicate()] * n))]
    for d in _rotary_dims(x, r1, r2):
        tables = [_rotary_table_placement(x, t, d) for t in (r1, r2)]
        rows.append(([Shard(d)], _inputs(tensors, [Shard(d)] + tables + [Replicate()] * (n - 3))))
    return rows


@register_sharding(npu.npu_rotary_mul_backward.default)
def _rotary_mul_backward(grad, x, r1, r2, *args):
    tensors = (grad, x, r1, r2) + args
    rows = [([Replicate()] * 3, _inputs(tensors, [Replicate()] * 4))]
    for d in _rotary_dims(x, r1, r2):
        tables = [_rotary_table_placement(x, t, d) for t in (r1, r2)]
        # the gradient of a table broadcast along d sums over d: partial per shard
        grads = [Partial() if isinstance(p, Replicate) else p for p in tables]
        rows.append(([Shard(d)] + grads, _inputs(tensors, [Shard(d), Shard(d)] + tables)))
    return rows


def _swiglu_dims(x, dim):
    split = dim % x.ndim
    return [d for d in range(x.ndim) if d != split]  # the halves are split along `dim`


@register_sharding(npu.npu_swiglu.default)
def _swiglu(x, dim=-1):
    rows = [([Replicate()], _inputs((x, dim), [Replicate()]))]
    for d in _swiglu_dims(x, dim):
        rows.append(([Shard(d)], _inputs((x, dim), [Shard(d)])))
    return rows


@register_sharding(npu.npu_swiglu_backward.default)
def _swiglu_backward(grad, x, dim=-1):
    rows = [([Replicate()], _inputs((grad, x, dim), [Replicate(), Replicate()]))]
    for d in _swiglu_dims(x, dim):
        rows.append(([Shard(d)], _inputs((grad, x, dim), [Shard(d), Shard(d)])))
    return rows
