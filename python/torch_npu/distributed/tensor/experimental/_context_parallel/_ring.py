"""Ring attention over ``npu_fusion_attention`` on the local shards of a context-parallel group.

Each rank holds a block of the query, key and value sequence ([B, N, S, D] tensors, BNSD);
the key/value blocks travel around the ring of ``group`` so that every query block meets
every key block once. Step ``i`` on rank ``r`` computes the attention of its query block with
the key/value block of rank ``(r - i) % W``; the step outputs are merged with
``torch_npu.npu_ring_attention_update`` through their softmax statistics (running max and
sum, [B, N, S, 8] float32 as the kernel returns them), so the merged output and statistics are
those of one attention over the whole sequence. The backward runs the same ring with
``npu_fusion_attention_grad`` on the merged statistics and output: each step gives the exact
part of dq for its query rows and of dk / dv for its key rows; the dk / dv accumulators travel
around the ring with their key block and arrive back at its owner after ``W`` steps.

Causal attention (query and key of one sequence) is handled per step, for the two ways
``torch.distributed.tensor.experimental`` shards the sequence:

* contiguous blocks (rank r holds block r): step 0 is the causal diagonal block; a key
  block of a lower rank is attended in full; one of a higher rank is skipped;
* head-tail load balancing (``_cp_options.enable_load_balance``: the sequence in 2W chunks,
  rank r holds chunks r and 2W-1-r): step 0 is causal over the two local chunks; a key block
  of a lower rank is attended by the whole local query with its first chunk only; one of a
  higher rank by the second query chunk only, in full.

The key/value rotation is ``_cp_options.rotate_method``'s (all-to-all, or one all-gather),
the gradient rotation all-to-all, as torch's own ring attention. Dropout: step ``i`` of rank
``r`` draws its mask from ``(seed, offset + (r * W + i) * block_elements)``, the forward and
the backward alike.
"""
import torch
import torch.distributed as dist
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _create_rotater,
    _cp_options,
    _RotateMethod,
)

import torch_npu

__all__ = []

# npu_fusion_attention's sparse_mode 2 (left-up causal) with its compressed 2048 x 2048 mask.
_LEFT_UP_CAUSAL = 2
_COMPRESSED_MASK_SIZE = 2048
_causal_masks = {}


def _causal_mask(device: torch.device) -> torch.Tensor:
    mask = _causal_masks.get(device)
    if mask is None:
        size = _COMPRESSED_MASK_SIZE
        mask = torch.ones(size, size, dtype=torch.bool, device=device).triu(1)
        _causal_masks[device] = mask
    return mask


def _step_plan(rank: int, size: int, step: int, causal: bool):
    """(query rows, key rows, causal) of ring step ``step``, or None when it is skipped.

    Rows are "all", "head" (the first half of the local block) or "tail" (the second half)."""
    if not causal:
        return "all", "all", False
    if step == 0:
        return "all", "all", True
    source = (rank - step) % size
    if _cp_options.enable_load_balance:
        return ("all", "head", False) if source < rank else ("tail", "all", False)
    return ("all", "all", False) if source < rank else None


def _rows(t: torch.Tensor, part: str, dim: int = 2) -> torch.Tensor:
    if part == "all":
        return t
    half = t.size(dim) // 2
    return t.narrow(dim, 0, half) if part == "head" else t.narrow(dim, half, t.size(dim) - half)


def _split(buffer: torch.Tensor, first: torch.Tensor, second: torch.Tensor):
    """The two tensors (of the shapes of ``first`` and ``second``) packed in ``buffer``."""
    n = first.numel()
    return buffer[:n].reshape(first.shape), buffer[n:].reshape(second.shape)


def _dropout_args(keep_prob, seed, offset, rank, size, step, block_elements):
    if keep_prob >= 1.0:
        return 0, 0
    return seed, offset + (rank * size + step) * block_elements


def _to_sbh(x: torch.Tensor) -> torch.Tensor:
    """[B, N, S, D] -> [S, B, N * D] (npu_ring_attention_update's SBH layout)."""
    b, n, s, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d)


def _from_sbh(x: torch.Tensor, heads: int) -> torch.Tensor:
    s, b, h = x.shape
    return x.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)


def ring_forward(group, query, key, value, *, causal, scale, keep_prob=1.0, seed=0, offset=0, inner_precise=0):
    """(out [B, N, S, Dv] in query's dtype, softmax_max, softmax_sum [B, N, S, 8] float32) of the
    attention of the local ``query`` block with the keys and values of every rank of ``group``."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if causal and _cp_options.enable_load_balance and query.size(2) % 2:
        raise ValueError(f"ring attention: head-tail balanced shards (_cp_options.enable_load_balance) hold two "
                         f"chunks of one length, got a local sequence of {query.size(2)}")
    heads = query.size(1)
    acc_dtype = torch.float32 if _cp_options.convert_to_f32 else query.dtype
    block_elements = query.size(0) * heads * query.size(2) * key.size(2)
    key, value = key.contiguous(), value.contiguous()
    rotater = _create_rotater(group, 2)
    out = softmax_max = softmax_sum = None
    for step in range(size):
        if step > 0:
            key, value = _split(rotater.next_buffer(), key, value)
        if step < size - 1:
            rotater.exchange_buffers(torch.cat([key.flatten(), value.flatten()]))
        plan = _step_plan(rank, size, step, causal)
        if plan is None:
            continue
        q_part, kv_part, block_causal = plan
        step_seed, step_offset = _dropout_args(keep_prob, seed, offset, rank, size, step, block_elements)
        block_out, block_max, block_sum, *_ = torch.ops.npu.npu_fusion_attention(
            _rows(query, q_part), _rows(key, kv_part), _rows(value, kv_part), heads, "BNSD",
            atten_mask=_causal_mask(query.device) if block_causal else None, scale=scale, keep_prob=keep_prob,
            inner_precise=inner_precise, sparse_mode=_LEFT_UP_CAUSAL if block_causal else 0,
            seed=step_seed, offset=step_offset)
        block_out = _to_sbh(block_out.to(acc_dtype))
        if out is None:  # step 0: every query row
            out, softmax_max, softmax_sum = block_out, block_max, block_sum
            continue
        rows = (_rows(out, q_part, 0), _rows(softmax_max, q_part), _rows(softmax_sum, q_part))
        merged = torch_npu.npu_ring_attention_update(*rows, block_out, block_max, block_sum, input_layout="SBH")
        if q_part == "all":
            out, softmax_max, softmax_sum = merged
        else:
            for target, merged_part in zip(rows, merged):
                target.copy_(merged_part)
    return _from_sbh(out, heads).to(query.dtype, memory_format=torch.contiguous_format), softmax_max, softmax_sum


def ring_backward(group, query, key, value, out, grad_out, softmax_max, softmax_sum, *, causal, scale,
                  keep_prob=1.0, seed=0, offset=0, inner_precise=0):
    """(dq, dk, dv) of the local blocks, given the merged ``out`` and softmax statistics of
    :func:`ring_forward` and the gradient ``grad_out`` of ``out``."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    heads = query.size(1)
    acc_dtype = torch.float32 if _cp_options.convert_to_f32 else query.dtype
    block_elements = query.size(0) * heads * query.size(2) * key.size(2)
    key, value = key.contiguous(), value.contiguous()
    kv_rotater = _create_rotater(group, 2)
    grad_rotater = _create_rotater(group, 2, method=_RotateMethod.ALL_TO_ALL)
    grad_query = torch.zeros_like(query, dtype=acc_dtype)
    # The gradient of the key / value block held at this step, accumulated around the ring.
    grad_key = torch.zeros_like(key, dtype=acc_dtype)
    grad_value = torch.zeros_like(value, dtype=acc_dtype)
    for step in range(size):
        if step > 0:
            key, value = _split(kv_rotater.next_buffer(), key, value)
            grad_key, grad_value = _split(grad_rotater.next_buffer(), grad_key, grad_value)
        if step < size - 1:
            kv_rotater.exchange_buffers(torch.cat([key.flatten(), value.flatten()]))
        plan = _step_plan(rank, size, step, causal)
        if plan is not None:
            q_part, kv_part, block_causal = plan
            step_seed, step_offset = _dropout_args(keep_prob, seed, offset, rank, size, step, block_elements)
            dq, dk, dv, *_ = torch.ops.npu.npu_fusion_attention_grad(
                _rows(query, q_part), _rows(key, kv_part), _rows(value, kv_part), _rows(grad_out, q_part),
                heads, "BNSD", atten_mask=_causal_mask(query.device) if block_causal else None,
                softmax_max=_rows(softmax_max, q_part).contiguous(),
                softmax_sum=_rows(softmax_sum, q_part).contiguous(), attention_in=_rows(out, q_part),
                scale_value=scale, keep_prob=keep_prob, inner_precise=inner_precise, seed=step_seed,
                offset=step_offset, sparse_mode=_LEFT_UP_CAUSAL if block_causal else 0)
            _rows(grad_query, q_part).add_(dq)
            _rows(grad_key, kv_part).add_(dk)
            _rows(grad_value, kv_part).add_(dv)
        grad_rotater.exchange_buffers(torch.cat([grad_key.flatten(), grad_value.flatten()]))
    grad_key, grad_value = _split(grad_rotater.next_buffer(), grad_key, grad_value)
    return grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype)
