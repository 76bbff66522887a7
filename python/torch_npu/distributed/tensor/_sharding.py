"""DTensor sharding strategies of torch_npu's fused operators (as torch_npu registers them), so
that a tensor- or data-parallel model calls ``torch_npu.npu_rms_norm``, ``npu_add_rms_norm``,
``npu_rotary_mul``, ``npu_swiglu``, ``npu_fusion_attention``, ``npu_conv2d`` (and their backward
operators), ``npu_cross_entropy_loss`` (and its backward), ``npu_grouped_matmul_add(_)`` and
``torch.repeat_interleave`` with an int count on DTensors.

Registered when ``torch.distributed.tensor`` is first imported (torch_npu.distributed sets up the
hook), through ``torch.distributed.tensor.experimental.register_sharding``: each function lists
the placements it accepts on one mesh dimension, as ``(outputs, inputs)``, with ``None`` for the
arguments that are not tensors; DTensor picks the cheapest and redistributes the inputs to it.
"""
import math

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
from torch.distributed.tensor.experimental import register_sharding

npu = torch.ops.npu

__all__ = []


def _tensor_like(arg):
    return hasattr(arg, "placements") and hasattr(arg, "ndim")


def _with_kwargs(args, kwargs, placement_of):
    """Input placements of args then kwargs (in the order DTensor lists them): placement_of(name
    or position, value) for tensors, None for the rest."""
    out = [placement_of(i, a) if _tensor_like(a) else None for i, a in enumerate(args)]
    out += [placement_of(k, v) if _tensor_like(v) else None for k, v in kwargs.items()]
    return out


def _inputs(args, placements):
    """``placements`` (one per tensor argument, in order) spread over ``args``, None elsewhere."""
    it = iter(placements)
    return _with_kwargs(args, {}, lambda i, t: next(it))


def _leading_dims(x, trailing):
    """The dims of ``x`` before its last ``trailing`` ones: where a row-wise op may shard."""
    return range(max(x.ndim - trailing, 0))


def _cache_on_arguments(op, first):
    """DTensor caches an operator's sharding on its tensors' specs and, for register_sharding,
    on its arguments from the first int one on (keyword ones only if keyword-only ints); a rule
    that reads another (a str, a float, a list) must have it hashed too: every argument from
    position ``first`` on, positional or passed by name."""
    names = [a.name for a in op._schema.arguments[first:]]
    DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(first, names,
                                                                                         needs_pytree=True)


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
    if x1.shape == x2.shape:
        for d in _leading_dims(x1, gamma.ndim):
            rows.append(([Shard(d)] * 3, _inputs(tensors, [Shard(d), Shard(d), Replicate()])))
    return rows


def _rotary_table_placement(table, d):
    """A cos/sin table (r1, r2) broadcast along dim d stays whole; one as long as x is sharded too."""
    return Replicate() if table.shape[d] == 1 else Shard(d)


def _rotary_dims(x, r1, r2):
    if r1.ndim != x.ndim or r2.ndim != x.ndim:
        return []
    return [d for d in range(x.ndim - 1)  # never the rotated (last) dim
            if all(t.shape[d] in (1, x.shape[d]) for t in (r1, r2)) and r1.shape[d] == r2.shape[d]]


@register_sharding(npu.npu_rotary_mul.default)
def _rotary_mul(x, r1, r2, *args):
    tensors = (x, r1, r2) + args
    n = sum(_tensor_like(a) for a in tensors)
    rows = [([Replicate()], _inputs(tensors, [Replicate()] * n))]
    for d in _rotary_dims(x, r1, r2):
        tables = [_rotary_table_placement(t, d) for t in (r1, r2)]
        rows.append(([Shard(d)], _inputs(tensors, [Shard(d)] + tables + [Replicate()] * (n - 3))))
    return rows


@register_sharding(npu.npu_rotary_mul_backward.default)
def _rotary_mul_backward(grad, x, r1, r2, *args):
    tensors = (grad, x, r1, r2) + args
    rows = [([Replicate()] * 3, _inputs(tensors, [Replicate()] * 4))]
    for d in _rotary_dims(x, r1, r2):
        tables = [_rotary_table_placement(t, d) for t in (r1, r2)]
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


# ---- fused attention: data parallel over the batch ----------------------------------------
# Sharding the batch leaves every sequence whole, so each rank's attention is exact. Not with
# dropout (the ranks would draw other masks than one device), nor with the arguments that
# index across the batch (pse, padding_mask, prefix, actual sequence lengths, sink), nor with
# a mask of its own per batch: DTensor does not redistribute keyword arguments, and the
# backward operator takes the mask as one, so it must stay whole (broadcast over the batch).

def _attention_batch_dim(input_layout, keep_prob, extras, mask):
    if "B" not in input_layout or keep_prob < 1.0 or any(e is not None for e in extras):
        return None
    if mask is not None and mask.ndim == 4 and mask.shape[0] != 1:
        return None
    return input_layout.index("B")


@register_sharding(npu.npu_fusion_attention.default)
def _fusion_attention(query, key, value, head_num, input_layout, *args, **kwargs):
    names = ["pse", "padding_mask", "atten_mask", "scale", "keep_prob", "pre_tockens", "next_tockens",
             "inner_precise", "prefix", "actual_seq_qlen", "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel",
             "sync", "softmax_layout", "sink", "dropout_mask", "seed", "offset"]
    given = dict(zip(names, args), **kwargs)
    positional = (query, key, value, head_num, input_layout) + args
    outputs_replicated = [Replicate()] * 4 + [None] * 3
    rows = [(outputs_replicated, _with_kwargs(positional, kwargs, lambda i, t: Replicate()))]
    extras = [given.get(k) for k in ("pse", "padding_mask", "prefix", "actual_seq_qlen", "actual_seq_kvlen",
                                     "sink", "dropout_mask")]
    b = _attention_batch_dim(input_layout, given.get("keep_prob", 1.0), extras, given.get("atten_mask"))
    if b is not None:
        rows.append(([Shard(b), Shard(0), Shard(0), Replicate(), None, None, None],
                     _with_kwargs(positional, kwargs, lambda i, t: Shard(b) if i in (0, 1, 2) else Replicate())))
    return rows


@register_sharding(npu.npu_fusion_attention_grad.default)
def _fusion_attention_grad(query, key, value, dy, head_num, input_layout, **kwargs):
    positional = (query, key, value, dy, head_num, input_layout)
    rows = [([Replicate()] * 5, _with_kwargs(positional, kwargs, lambda i, t: Replicate()))]
    extras = [kwargs.get(k) for k in ("pse", "padding_mask", "prefix", "actual_seq_qlen", "actual_seq_kvlen", "sink")]
    b = _attention_batch_dim(input_layout, kwargs.get("keep_prob", 1.0), extras, kwargs.get("atten_mask"))
    if b is not None:
        per_row = {"softmax_max": Shard(0), "softmax_sum": Shard(0), "attention_in": Shard(b)}

        def placement(i, t):
            if isinstance(i, int):
                return Shard(b)  # query, key, value, dy
            return per_row.get(i, Replicate())  # the mask; softmax_in, the empty reserved tensor

        rows.append(([Shard(b), Shard(b), Shard(b), Replicate(), Replicate()],
                     _with_kwargs(positional, kwargs, placement)))
    return rows


# (keep_prob and the sequence lengths are keyword arguments the rules read)
_cache_on_arguments(npu.npu_fusion_attention.default, 3)
_cache_on_arguments(npu.npu_fusion_attention_grad.default, 4)


# ---- grouped matmul add (MoE weight gradients): y[g] += x_g^T . weight_g ---------------------
# The groups split the summed dim M, so x stays whole; y and weight may share a sharding of N.

def _grouped_matmul_add_rows(y, x, weight, group_list, **kwargs):
    n = y.ndim - 1
    rows = [([Replicate()], _with_kwargs((y, x, weight, group_list), kwargs, lambda i, t: Replicate()))]
    sharded = {0: Shard(n), 1: Replicate(), 2: Shard(1), 3: Replicate()}
    rows.append(([Shard(n)], _with_kwargs((y, x, weight, group_list), kwargs, lambda i, t: sharded[i])))
    return rows


register_sharding(npu.npu_grouped_matmul_add.default)(_grouped_matmul_add_rows)
register_sharding(npu.npu_grouped_matmul_add_.default)(_grouped_matmul_add_rows)


# ---- 2-D convolution: over the batch, the output channels, or (groups == 1) the input channels --
# Input channels split the summed dim: each rank's convolution is a partial sum, so the bias is
# taken partial too (DTensor splits a replicated one) and added once in the sum.

@register_sharding(npu.npu_conv2d.default)
def _conv2d(input, weight, bias, *args):
    tensors = (input, weight, bias) + args
    rows = [([Replicate()], _inputs(tensors, [Replicate()] * 3)),
            ([Shard(0)], _inputs(tensors, [Shard(0), Replicate(), Replicate()])),
            ([Shard(1)], _inputs(tensors, [Replicate(), Shard(0), Shard(0)]))]
    if args[-1] == 1:
        rows.append(([Partial()], _inputs(tensors, [Shard(1), Shard(1), Partial()])))
    return rows


@register_sharding(npu.npu_conv2d_backward.default)
def _conv2d_backward(input, grad_output, weight, stride, padding, dilation, groups, output_mask):
    tensors = (input, grad_output, weight, stride, padding, dilation, groups, output_mask)

    def outputs(*placements):  # a gradient not asked for is an empty tensor: whole
        return [p if asked else Replicate() for p, asked in zip(placements, output_mask)]

    rows = [(outputs(Replicate(), Replicate(), Replicate()), _inputs(tensors, [Replicate()] * 3)),
            (outputs(Shard(0), Partial(), Partial()), _inputs(tensors, [Shard(0), Shard(0), Replicate()])),
            (outputs(Partial(), Shard(0), Shard(0)), _inputs(tensors, [Replicate(), Shard(1), Shard(0)]))]
    if groups == 1:
        rows.append((outputs(Shard(1), Shard(1), Replicate()), _inputs(tensors, [Shard(1), Replicate(), Shard(1)])))
    return rows


# ---- repeat_interleave with an int count: any dim but the repeated one, which only when its
# shards are even (uneven ones would repeat into shards of other sizes than DTensor's split)

def _evenly_split(x, d):
    return x.shape[d] % math.prod(x.mesh.shape) == 0


def _repeat_interleave_dims(x, dim):
    if dim is None:  # flattened: the rows' shards stay in order when they are even
        return [0] if x.ndim > 0 and _evenly_split(x, 0) else []
    d = dim % x.ndim
    return [i for i in range(x.ndim) if i != d or _evenly_split(x, d)]


@register_sharding(torch.ops.aten.repeat_interleave.self_int)
def _repeat_interleave(x, repeats, dim=None, output_size=None):
    rows = [([Replicate()], [Replicate(), None, None, None])]
    for d in _repeat_interleave_dims(x, dim):
        rows.append(([Shard(d)], [Shard(d), None, None, None]))
    return rows


@register_sharding(npu.repeat_interleave_backward_int.default)
def _repeat_interleave_backward(grad, x, repeats, dim=None):
    rows = [([Replicate()], [Replicate(), Replicate(), None, None])]
    for d in _repeat_interleave_dims(x, dim):
        rows.append(([Shard(d)], [Shard(d), Shard(d), None, None]))
    return rows


# ---- cross entropy: rows over the ranks, for "none" (per row) and "sum" (partial sums) -------
# "mean" divides by the weight of the rows kept (not ignore_index) of all ranks: the ranks'
# means cannot be averaged when their rows differ in number or weight, so it gathers.

def _by_name(names, args, kwargs, placements):
    """Input placements of an operator's args then kwargs from ``placements`` (argument name ->
    placement), in the order DTensor lists them."""
    return _with_kwargs(args, kwargs, lambda i, t: placements[names[i] if isinstance(i, int) else i])


_CROSS_ENTROPY = ["input", "target", "weight", "reduction", "ignore_index", "label_smoothing",
                  "lse_square_scale_for_zloss", "return_zloss"]


@register_sharding(npu.npu_cross_entropy_loss.default)
def _cross_entropy(*args, **kwargs):
    given = dict(zip(_CROSS_ENTROPY, args), **kwargs)
    reduction, zloss = given.get("reduction", "mean"), given.get("return_zloss", False)
    rows = [([Replicate()] * 4, _by_name(_CROSS_ENTROPY, args, kwargs, {k: Replicate() for k in _CROSS_ENTROPY}))]
    if reduction in ("none", "sum"):
        summed = Shard(0) if reduction == "none" else Partial()
        outputs = [summed, Shard(0), summed if zloss else Replicate(), Shard(0) if zloss else Replicate()]
        inputs = {"input": Shard(0), "target": Shard(0), "weight": Replicate()}
        rows.append((outputs, _by_name(_CROSS_ENTROPY, args, kwargs, inputs)))
    return rows


_CROSS_ENTROPY_BACKWARD = ["grad_loss", "log_prob", "target", "weight", "grad_zloss", "lse_for_zloss", "reduction",
                           "ignore_index", "label_smoothing", "lse_square_scale_for_zloss"]


@register_sharding(npu.npu_cross_entropy_loss_backward.default)
def _cross_entropy_backward(*args, **kwargs):
    names = _CROSS_ENTROPY_BACKWARD
    reduction = dict(zip(names, args), **kwargs).get("reduction", "mean")
    rows = [([Replicate()], _by_name(names, args, kwargs, {k: Replicate() for k in names}))]
    if reduction in ("none", "sum"):
        scale = Shard(0) if reduction == "none" else Replicate()  # a gradient per row, or one for all
        inputs = {"grad_loss": scale, "log_prob": Shard(0), "target": Shard(0), "weight": Replicate(),
                  "grad_zloss": scale, "lse_for_zloss": Shard(0)}
        rows.append(([Shard(0)], _by_name(names, args, kwargs, inputs)))
    return rows


_cache_on_arguments(npu.npu_cross_entropy_loss.default, 3)
_cache_on_arguments(npu.npu_cross_entropy_loss_backward.default, 6)
