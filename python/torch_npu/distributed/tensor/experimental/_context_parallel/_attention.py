"""Context parallelism for attention on npu: DTensor handlers running ring attention, and
``context_parallel``.

With the context-parallel dispatcher of ``torch.distributed.tensor.experimental`` enabled
(inside ``context_parallel``, or between ``_enable_context_parallel_dispatcher()`` and
``_disable_context_parallel_dispatcher()``), attention on DTensors sharded along the
sequence runs as ring attention over ``npu_fusion_attention`` (see ``_ring``):

* ``F.scaled_dot_product_attention`` on npu, whose fused backend is
  ``aten._scaled_dot_product_fused_attention_overrideable`` (and ``_backward``): [B, N, S, D]
  inputs placed ``Shard(2)``; ``is_causal``, ``dropout_p``, ``scale`` and grouped key/value
  heads (``enable_gqa``) are kept;
* ``torch_npu.npu_fusion_attention`` (and ``npu_fusion_attention_v2`` / ``_v3``, which call it)
  and ``npu_fusion_attention_grad``: layouts BNSD, BSND (placed ``Shard(1)``), BSH
  (``Shard(1)``) and SBH (``Shard(0)``); full attention (no ``atten_mask``) or causal attention
  (the compressed causal mask with ``sparse_mode`` 2 or 3); its softmax_max / softmax_sum
  outputs are the statistics over the whole sequence, placed ``Shard(2)``.

Importing this module adds the npu handlers to torch's context-parallel dispatcher
(``_enable_cp_dtensor_dispatcher`` / ``_disable_cp_dtensor_dispatcher`` of
``torch.distributed.tensor.experimental._context_parallel._attention``), so torch's own
``context_parallel`` and ``_ContextParallel`` plans work on npu as well.
"""
import contextlib
from collections.abc import Generator

import torch
import torch.distributed.tensor.experimental._context_parallel._attention as _torch_cp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._redistribute import redistribute_local_tensor

from torch_npu.distributed.tensor.experimental._context_parallel._ring import ring_backward, ring_forward

__all__ = ["context_parallel"]

aten = torch.ops.aten

# The sequence dimension of npu_fusion_attention's layouts (TND, packed sequences, has none to shard).
_SEQ_DIM = {"BNSD": 2, "BSND": 1, "BSH": 1, "SBH": 0}
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_COMPRESSED = 2048  # the side of the compressed causal mask of sparse_mode 2 / 3
# npu_fusion_attention arguments that are tied to positions of the whole sequence.
_POSITIONAL_ARGS = ("pse", "padding_mask", "prefix", "actual_seq_qlen", "actual_seq_kvlen", "sink", "dropout_mask")


def _bind(op, args, kwargs) -> dict:
    """The arguments of a call of ``op`` by name, defaults filled in."""
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        bound[arg.name] = args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value)
    return bound


def _local_shards(op: str, seq_dim: int, mesh=None, **tensors):
    """(mesh, local shards) of DTensors placed ``Shard(seq_dim)`` on one 1-D mesh."""
    shards = []
    for name, t in tensors.items():
        if not isinstance(t, DTensor):
            raise TypeError(f"{op} with context parallel: {name} must be a DTensor sharded along the "
                            f"sequence (Shard({seq_dim})), got {type(t).__name__}")
        if mesh is None:
            mesh = t.device_mesh
            if mesh.ndim != 1:
                raise ValueError(f"{op} with context parallel: {name} must be on a 1-D DeviceMesh (the "
                                 f"context-parallel group), got a {mesh.ndim}-D mesh")
        elif t.device_mesh != mesh:
            raise ValueError(f"{op} with context parallel: {name} is on {t.device_mesh}, the other inputs "
                             f"on {mesh}")
        # Only the shards of the sequence in the ring's order: a replicated query, say, does not
        # say whether the ranks hold contiguous or head-tail balanced shards.
        if tuple(t.placements) != (Shard(seq_dim),):
            raise ValueError(f"{op} with context parallel: {name} must be placed (Shard({seq_dim}),) (sharded "
                             f"along the sequence), got {tuple(t.placements)}")
        if t.shape[seq_dim] % mesh.size() != 0:
            raise ValueError(f"{op} with context parallel: the sequence length {t.shape[seq_dim]} of {name} "
                             f"must split evenly over the {mesh.size()} ranks of the mesh")
        shards.append(t._local_tensor)
    return mesh, shards


def _gradient_shard(op: str, name: str, grad, mesh: DeviceMesh, seq_dim: int) -> torch.Tensor:
    """The local shard of the gradient of an output placed ``Shard(seq_dim)``, which autograd may
    deliver in another placement (the gradient of ``out.sum()`` is replicated)."""
    if not isinstance(grad, DTensor) or grad.device_mesh != mesh:
        raise TypeError(f"{op} with context parallel: {name} must be a DTensor on the mesh of the inputs, "
                        f"got {type(grad).__name__}")
    target = (Shard(seq_dim),)
    if tuple(grad.placements) == target:
        return grad._local_tensor
    spec = DTensorSpec(mesh, target, tensor_meta=grad._spec.tensor_meta)
    return redistribute_local_tensor(grad._local_tensor, grad._spec, spec)


def _shard(local: torch.Tensor, mesh: DeviceMesh, dim: int) -> DTensor:
    return DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)


def _replicated_empty(like: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(like.new_empty(0), mesh, [Replicate()], run_check=False)


def _check_dtypes(op: str, **tensors) -> None:
    for name, t in tensors.items():
        if t.dtype not in _KERNEL_DTYPES:
            raise TypeError(f"{op} with context parallel: {name} must be float16, bfloat16 or float32 (the "
                            f"dtypes of npu_fusion_attention and npu_ring_attention_update), got {t.dtype}")


def _check_causal_lengths(op: str, query_len: int, key_len: int) -> None:
    if query_len != key_len:
        raise ValueError(f"{op} with context parallel: causal attention needs query and key of the same "
                         f"sequence length, got {query_len} and {key_len}")


def _dropout_seed(keep_prob: float, seed: int, device: torch.device) -> int:
    """The Philox seed of the ring's dropout masks: ``seed`` when given, else a nonzero one drawn
    from the device's generator (npu_fusion_attention reads seed 0 as "draw your own")."""
    if keep_prob >= 1.0:
        return 0
    if seed:
        return seed
    return int(torch.randint(1, 2**62, (), device=device, dtype=torch.int64).item())


# ---- F.scaled_dot_product_attention (the overrideable fused backend) ------------------------

_SDPA = "scaled_dot_product_attention"


def _sdpa_forward(op_call, args, kwargs):
    a = _bind(op_call, args, kwargs)
    if a["attn_bias"] is not None:
        raise NotImplementedError(f"{_SDPA} with context parallel: attn_mask cannot be given (each ring step "
                                  f"would need its own slice of it); use is_causal=True for causal attention")
    if a["return_debug_mask"]:
        raise NotImplementedError(f"{_SDPA} with context parallel: return_debug_mask=True is not available")
    mesh, (q, k, v) = _local_shards(_SDPA, 2, query=a["query"], key=a["key"], value=a["value"])
    _check_dtypes(_SDPA, query=q, key=k, value=v)
    if a["is_causal"]:
        _check_causal_lengths(_SDPA, a["query"].size(2), a["key"].size(2))
    scale = a["scale"] if a["scale"] is not None else q.size(-1) ** -0.5
    keep_prob = 1.0 - a["dropout_p"]
    seed = _dropout_seed(keep_prob, 0, q.device)
    out, softmax_max, softmax_sum = ring_forward(mesh.get_group(), q, k, v, causal=a["is_causal"], scale=scale,
                                                 keep_prob=keep_prob, seed=seed)
    logsumexp = softmax_max[..., 0] + torch.log(softmax_sum[..., 0])
    host_long = dict(dtype=torch.int64, device="cpu")
    return (_shard(out, mesh, 2), _shard(logsumexp, mesh, 2), None, None, a["query"].size(2), a["key"].size(2),
            torch.tensor(seed, **host_long), torch.tensor(0, **host_long), q.new_empty(0))


def _sdpa_backward(op_call, args, kwargs):
    a = _bind(op_call, args, kwargs)
    if a["grad_out"] is None:
        return None, None, None, None
    mesh, (q, k, v, out, logsumexp) = _local_shards(_SDPA, 2, query=a["query"], key=a["key"], value=a["value"],
                                                    out=a["out"], logsumexp=a["logsumexp"])
    dout = _gradient_shard(_SDPA, "grad_out", a["grad_out"], mesh, 2)
    scale = a["scale"] if a["scale"] is not None else q.size(-1) ** -0.5
    # exp(x - logsumexp) / 1 is the softmax: logsumexp stands in for the max, with a sum of 1.
    softmax_max = logsumexp.float().unsqueeze(-1).expand(*logsumexp.shape, 8).contiguous()
    softmax_sum = torch.ones_like(softmax_max)
    dq, dk, dv = ring_backward(mesh.get_group(), q, k, v, out, dout, softmax_max, softmax_sum,
                               causal=a["is_causal"], scale=scale, keep_prob=1.0 - a["dropout_p"],
                               seed=int(a["philox_seed"].item()), offset=int(a["philox_offset"].item()))
    mask = a["grad_input_mask"]
    return (_shard(dq, mesh, 2) if mask[0] else None, _shard(dk, mesh, 2) if mask[1] else None,
            _shard(dv, mesh, 2) if mask[2] else None, None)


# ---- npu_fusion_attention / npu_fusion_attention_grad --------------------------------------

def _fa_layout(op: str, a: dict) -> str:
    layout = a["input_layout"]
    if layout not in _SEQ_DIM:
        raise ValueError(f"{op} with context parallel: input_layout must be one of {', '.join(_SEQ_DIM)} (a "
                         f"layout with a sequence dimension to shard), got {layout!r}")
    present = [name for name in _POSITIONAL_ARGS if a.get(name) is not None]
    if present:
        raise NotImplementedError(f"{op} with context parallel: {', '.join(present)} cannot be given (they hold "
                                  f"positions of the whole sequence, which ring attention splits)")
    if a["softmax_layout"] not in ("", None):
        raise ValueError(f"{op} with context parallel: softmax_layout must be \"\" (statistics [B, N, S, 8]), "
                         f"got {a['softmax_layout']!r}")
    return layout


def _fa_causal(op: str, a: dict) -> bool:
    """Whether the call is causal attention (the compressed mask with sparse_mode 2 or 3) or
    full attention (no mask)."""
    if a["atten_mask"] is None:
        return False
    if a["sparse_mode"] not in (2, 3):
        raise NotImplementedError(
            f"{op} with context parallel: atten_mask is taken as the compressed causal mask of sparse_mode 2 "
            f"or 3 only (other masks would need a slice per ring step), got sparse_mode={a['sparse_mode']}")
    if tuple(a["atten_mask"].shape) != (_COMPRESSED, _COMPRESSED):
        raise ValueError(f"{op} with context parallel: with sparse_mode {a['sparse_mode']} atten_mask must be the "
                         f"compressed causal mask [{_COMPRESSED}, {_COMPRESSED}], got {list(a['atten_mask'].shape)}")
    return True


def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.reshape(t.size(0), t.size(1), heads, -1).transpose(1, 2)
    return t.reshape(t.size(0), t.size(1), heads, -1).permute(1, 2, 0, 3)  # SBH


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return t
    b, n, s, d = t.shape
    if layout == "BSND":
        return t.transpose(1, 2).contiguous()
    if layout == "BSH":
        return t.transpose(1, 2).reshape(b, s, n * d)
    return t.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _heads(op: str, layout: str, query: torch.Tensor, key: torch.Tensor, head_num: int):
    """(query heads, key/value heads) of BNSD-able tensors of ``layout``."""
    if layout in ("BNSD", "BSND"):
        dim = 1 if layout == "BNSD" else 2
        if head_num != query.size(dim):
            raise ValueError(f"{op} with context parallel: head_num={head_num} is not the number of heads of "
                             f"query {list(query.shape)} ({layout})")
        return head_num, key.size(dim)
    if head_num <= 0 or query.size(-1) % head_num != 0:
        raise ValueError(f"{op} with context parallel: the hidden size {query.size(-1)} of query must be a "
                         f"multiple of head_num={head_num}")
    return head_num, key.size(-1) // (query.size(-1) // head_num)


def _fa_forward(op_call, args, kwargs):
    op = "npu_fusion_attention"
    a = _bind(op_call, args, kwargs)
    layout = _fa_layout(op, a)
    causal = _fa_causal(op, a)
    seq_dim = _SEQ_DIM[layout]
    mesh, (q, k, v) = _local_shards(op, seq_dim, query=a["query"], key=a["key"], value=a["value"])
    _check_dtypes(op, query=q, key=k, value=v)
    heads, kv_heads = _heads(op, layout, a["query"], a["key"], a["head_num"])
    q, k, v = _to_bnsd(q, layout, heads), _to_bnsd(k, layout, kv_heads), _to_bnsd(v, layout, kv_heads)
    if causal:
        _check_causal_lengths(op, a["query"].size(seq_dim), a["key"].size(seq_dim))
    keep_prob = a["keep_prob"]
    seed = _dropout_seed(keep_prob, a["seed"], q.device)
    offset = a["offset"] if keep_prob < 1.0 else 0
    out, softmax_max, softmax_sum = ring_forward(mesh.get_group(), q, k, v, causal=causal, scale=a["scale"],
                                                 keep_prob=keep_prob, seed=seed, offset=offset,
                                                 inner_precise=a["inner_precise"])
    # numels: the score elements of the local queries with every key
    numels = q.size(0) * heads * q.size(2) * a["key"].size(seq_dim)
    return (_shard(_from_bnsd(out, layout), mesh, seq_dim), _shard(softmax_max, mesh, 2),
            _shard(softmax_sum, mesh, 2), _replicated_empty(q, mesh), seed, offset, numels)


def _fa_backward(op_call, args, kwargs):
    op = "npu_fusion_attention_grad"
    a = _bind(op_call, args, kwargs)
    layout = _fa_layout(op, a)
    causal = _fa_causal(op, a)
    missing = [name for name in ("softmax_max", "softmax_sum", "attention_in") if a[name] is None]
    if missing:
        raise ValueError(f"{op} with context parallel: {', '.join(missing)} must be given (the forward's "
                         f"softmax_max, softmax_sum and attention output)")
    seq_dim = _SEQ_DIM[layout]
    mesh, (q, k, v, out) = _local_shards(op, seq_dim, query=a["query"], key=a["key"], value=a["value"],
                                         attention_in=a["attention_in"])
    dy = _gradient_shard(op, "dy", a["dy"], mesh, seq_dim)
    _, (softmax_max, softmax_sum) = _local_shards(op, 2, mesh, softmax_max=a["softmax_max"],
                                                  softmax_sum=a["softmax_sum"])
    heads, kv_heads = _heads(op, layout, a["query"], a["key"], a["head_num"])
    q, dy, out = (_to_bnsd(t, layout, heads) for t in (q, dy, out))
    k, v = _to_bnsd(k, layout, kv_heads), _to_bnsd(v, layout, kv_heads)
    dq, dk, dv = ring_backward(mesh.get_group(), q, k, v, out, dy, softmax_max.float(), softmax_sum.float(),
                               causal=causal, scale=a["scale_value"], keep_prob=a["keep_prob"], seed=a["seed"],
                               offset=a["offset"], inner_precise=a["inner_precise"])
    return (_shard(_from_bnsd(dq, layout), mesh, seq_dim), _shard(_from_bnsd(dk, layout), mesh, seq_dim),
            _shard(_from_bnsd(dv, layout), mesh, seq_dim), _replicated_empty(q, mesh), _replicated_empty(q, mesh))


# ---- the context-parallel dispatcher ---------------------------------------------------------

_HANDLERS = {
    aten._scaled_dot_product_fused_attention_overrideable.default: _sdpa_forward,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: _sdpa_backward,
    torch.ops.npu.npu_fusion_attention.default: _fa_forward,
    torch.ops.npu.npu_fusion_attention_grad.default: _fa_backward,
}


def _install() -> None:
    """Makes torch's context-parallel dispatcher switch the npu handlers on and off with its own."""
    torch_enable = getattr(_torch_cp._enable_cp_dtensor_dispatcher, "_torch_original",
                           _torch_cp._enable_cp_dtensor_dispatcher)
    torch_disable = getattr(_torch_cp._disable_cp_dtensor_dispatcher, "_torch_original",
                            _torch_cp._disable_cp_dtensor_dispatcher)

    def enable() -> None:
        torch_enable()
        DTensor._op_dispatcher._custom_op_handlers = {**DTensor._op_dispatcher._custom_op_handlers, **_HANDLERS}

    def disable() -> None:
        handlers = DTensor._op_dispatcher._custom_op_handlers
        DTensor._op_dispatcher._custom_op_handlers = {op: h for op, h in handlers.items() if op not in _HANDLERS}
        torch_disable()

    enable.__doc__ = "Enables torch's context-parallel DTensor handlers and torch_npu's ring attention."
    disable.__doc__ = "Disables torch's context-parallel DTensor handlers and torch_npu's ring attention."
    enable._torch_original, disable._torch_original = torch_enable, torch_disable
    _torch_cp._enable_cp_dtensor_dispatcher = enable
    _torch_cp._disable_cp_dtensor_dispatcher = disable


_install()


def _checked_seq_dims(mesh, buffers, buffer_seq_dims, no_restore_buffers) -> list:
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"context_parallel: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ValueError(f"context_parallel: mesh must be 1-D (the context-parallel group), got a {mesh.ndim}-D "
                         f"mesh; pass its context-parallel dimension, e.g. mesh['cp']")
    if len(buffers) != len(buffer_seq_dims):
        raise ValueError(f"context_parallel: buffer_seq_dims must give one sequence dimension per buffer: "
                         f"{len(buffers)} buffers, {len(buffer_seq_dims)} buffer_seq_dims")
    dims = []
    for i, (buffer, dim) in enumerate(zip(buffers, buffer_seq_dims)):
        if not isinstance(buffer, torch.Tensor):
            raise TypeError(f"context_parallel: buffers[{i}] must be a Tensor, got {type(buffer).__name__}")
        if buffer.device.type != mesh.device_type:
            raise ValueError(f"context_parallel: buffers[{i}] is on {buffer.device}, the mesh on "
                             f"{mesh.device_type}")
        if buffer.requires_grad:
            raise ValueError(f"context_parallel: buffers[{i}] requires grad; the buffers are resized in place "
                             f"to their shards (and back), which a tensor that requires grad cannot be")
        if not isinstance(dim, int) or not -buffer.dim() <= dim < buffer.dim():
            raise ValueError(f"context_parallel: buffer_seq_dims[{i}]={dim!r} is not a dimension of "
                             f"buffers[{i}] {list(buffer.shape)}")
        dims.append(dim % buffer.dim())
    lengths = [b.shape[d] for b, d in zip(buffers, dims)]
    if any(n != lengths[0] for n in lengths):
        raise ValueError(f"context_parallel: the buffers must have one sequence length, got {lengths} along "
                         f"buffer_seq_dims")
    if lengths and lengths[0] % mesh.size() != 0:
        raise ValueError(f"context_parallel: the sequence length {lengths[0]} of the buffers must split evenly "
                         f"over the {mesh.size()} ranks of the mesh")
    if any(not any(b is r for b in buffers) for r in no_restore_buffers):
        raise ValueError("context_parallel: no_restore_buffers must be a subset of buffers")
    return dims


@contextlib.contextmanager
def context_parallel(
    mesh: DeviceMesh,
    *,
    buffers: list[torch.Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> Generator[None, None, None]:
    """Context parallelism (CP) on ``mesh``: inside the context,
    ``torch.nn.functional.scaled_dot_product_attention`` takes the local shards of query, key
    and value ([B, N, S, D], the sequence dimension 2 sharded over ``mesh``) and returns the
    local shard of the attention over the whole sequence, computed as ring attention over
    ``npu_fusion_attention`` (forward and backward); ``npu_fusion_attention`` on DTensors
    sharded along the sequence runs as ring attention too.

    Args:
        mesh: the 1-D device mesh of the context-parallel group.
        buffers: tensors whose sequence dimension is sharded in place (inputs, labels,
            positional embeddings, or q / k / v themselves); each keeps the shard of this rank
            inside the context and gets its full content back at the end. With the default
            head-tail load balancing of ``torch.distributed.tensor.experimental`` (for causal
            attention, when the sequence length is a multiple of twice the mesh size) the
            shards are the chunks ``r`` and ``2W - 1 - r`` of ``2W``.
        buffer_seq_dims: the sequence dimension of each buffer.
        no_restore_buffers: buffers (a subset of ``buffers``) left sharded at the end.

    Without buffers, the attention inputs are taken as already sharded (as
    ``_context_parallel_shard`` shards them, with ``_cp_options.enable_load_balance`` saying
    whether the shards are head-tail balanced).
    """
    buffers = list(buffers) if buffers is not None else []
    buffer_seq_dims = list(buffer_seq_dims) if buffer_seq_dims is not None else []
    no_restore_buffers = set(no_restore_buffers) if no_restore_buffers is not None else set()
    buffer_seq_dims = _checked_seq_dims(mesh, buffers, buffer_seq_dims, no_restore_buffers)
    if buffers:
        with _torch_cp.context_parallel(mesh, buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                                        no_restore_buffers=no_restore_buffers):
            yield
        return
    # torch's context_parallel needs a buffer to shard: without one, its dispatcher alone.
    _torch_cp._dispatch_mode = _torch_cp._DispatchMode.MONKEY_PATCH
    _torch_cp._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=mesh)
    try:
        yield
    finally:
        _torch_cp._disable_context_parallel_dispatcher_impl()
