"""op-plugin's attention-merging and sparse-attention operators, as compositions of ATen operators.

``torch_npu.npu_ring_attention_update`` merges the outputs of two FlashAttention runs over
disjoint key ranges (ring / context-parallel attention) with their softmax statistics::

    softmax_max = max(prev_softmax_max, cur_softmax_max)
    softmax_sum = prev_softmax_sum * exp(prev_softmax_max - softmax_max)
                + cur_softmax_sum * exp(cur_softmax_max - softmax_max)
    attn_out = prev_attn_out * exp(prev_softmax_max - softmax_max) * prev_softmax_sum / softmax_sum
             + cur_attn_out * exp(cur_softmax_max - softmax_max) * cur_softmax_sum / softmax_sum

Layouts: "SBH" (attention [S, B, H] with H = N * D, softmax statistics [B, N, S, 8]) and
"TND" (attention [T, N, D], statistics [T, N, 8]). With "TND", input_softmax_layout "TND"
stores the statistics of token t and head n at [t, n]; "" or "SBH" (the default) stores them
batch by batch as [N, S_b, 8] blocks (FlashAttention's BNS order), the batches being the
ranges of actual_seq_qlen (cumulative token counts, with or without the leading 0). The 8
values of a statistic are equal; all 8 are updated.

``torch_npu.npu_nsa_select_attention`` is the selected-block branch of Native Sparse
Attention (training, "TND" layout). For query token t of batch b and key/value head n2, the
blocks topk_indices[t, n2, :] (block i = keys [i * select_block_size, (i + 1) *
select_block_size) of batch b) are gathered and the query heads of group n2 attend to them::

    attention_out = softmax(scale_value * query @ selected_key^T) @ selected_value

It also returns the softmax max and sum ([T1, N1, 8] float32, the value repeated 8 times).
actual_seq_qlen / actual_seq_kvlen are cumulative token counts per batch (without the
leading 0). With atten_mask (the kernel runs sparse_mode 2, left-up causal) a selected key
at position p of its batch is hidden from the query at position s of its batch when p > s.

Both compute in float32 and round once to the output dtype; npu_nsa_select_attention
rounds the softmax probabilities to the input dtype before the second matrix product, as
the Ascend kernel does. Autograd differentiates the composition.
"""
from __future__ import annotations

import torch

from torch_npu._composite_ops import _check, _op
from torch_npu.utils._error_code import ErrCode, ops_error

# The softmax statistics of Ascend's attention kernels repeat each value over a last dimension of 8.
_SOFTMAX_TAIL = 8


def _concrete(t: torch.Tensor) -> bool:
    """Whether t holds data (not a fake or meta tensor): data-dependent checks only run then."""
    return not (t.is_meta or torch._subclasses.fake_tensor.is_fake(t))


# ---- npu_ring_attention_update ------------------------------------------------------------

def _ring_check(cond: bool, msg: str, code: ErrCode = ErrCode.VALUE) -> None:
    # op-plugin's TORCH_CHECKs, with torch_npu's error-code suffix (OPS_ERROR).
    if not cond:
        raise RuntimeError(msg + ops_error(code))


def _check_ring_inputs(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max,
                       cur_softmax_sum, actual_seq_qlen, input_layout, input_softmax_layout):
    """op-plugin's argument checks (RingAttentionUpdateKernelNpuOpApi.cpp), in its order."""
    _ring_check(input_layout in ("SBH", "TND"),
                f"input_layout only supports 'SBH' or 'TND', but got {input_layout}")
    _ring_check(input_softmax_layout in ("", "SBH", "TND"),
                f"input_softmax_layout only supports '', 'SBH' or 'TND', but got {input_softmax_layout}")
    _ring_check(prev_attn_out.shape == cur_attn_out.shape,
                "prev_attn_out and cur_attn_out must have the same shape.")
    _ring_check(prev_attn_out.dtype == cur_attn_out.dtype,
                "prev_attn_out and cur_attn_out must have the same dtype.")
    _ring_check(prev_attn_out.dtype in (torch.float16, torch.float32, torch.bfloat16),
                f"attn_out dtype only supports float16, float32 or bfloat16, but got {prev_attn_out.dtype}",
                ErrCode.TYPE)
    softmax = (prev_softmax_max, prev_softmax_sum, cur_softmax_max, cur_softmax_sum)
    _ring_check(all(t.shape == prev_softmax_max.shape for t in softmax),
                "softmax tensors must keep the same shape.")
    _ring_check(all(t.dtype == torch.float32 for t in softmax), "softmax tensors must use float32.", ErrCode.TYPE)
    _ring_check(prev_softmax_max.dim() > 0 and prev_softmax_max.size(-1) == _SOFTMAX_TAIL,
                "softmax tensors require the last dimension to be 8.")
    _ring_check(prev_attn_out.dim() == 3, f"prev_attn_out must be a 3D tensor, but got {prev_attn_out.dim()}D.")
    _ring_check(cur_attn_out.dim() == 3, f"cur_attn_out must be a 3D tensor, but got {cur_attn_out.dim()}D.")
    if input_layout == "SBH":
        _ring_check(prev_softmax_max.dim() == 4, "softmax tensors must be 4D when input_layout is 'SBH'.")
    else:
        _ring_check(actual_seq_qlen is not None, "actual_seq_qlen is required when input_layout is 'TND'.")
        _ring_check(prev_softmax_max.dim() == 3, "softmax tensors must be 3D when input_layout is 'TND'.")
    if actual_seq_qlen is not None:
        _ring_check(actual_seq_qlen.dtype == torch.int64, "actual_seq_qlen must use int64 dtype.", ErrCode.TYPE)

    # The shapes the kernel assumes (aclnnRingAttentionUpdateV2's documentation).
    op = "npu_ring_attention_update"
    if input_layout == "SBH":
        s, b, h = prev_attn_out.shape
        _check(prev_softmax_max.shape[0] == b and prev_softmax_max.shape[2] == s,
               f"{op}: with input_layout 'SBH' the softmax tensors must be [B, N, S, 8] = [{b}, N, {s}, 8] "
               f"for attn_out [S, B, H] = {list(prev_attn_out.shape)}, got {list(prev_softmax_max.shape)}")
        n = prev_softmax_max.shape[1]
        _check(n > 0 and h % n == 0,
               f"{op}: the hidden size H={h} of attn_out must be a multiple of the head number N={n} "
               f"of the softmax tensors")
    else:
        t, n, d = prev_attn_out.shape
        _check(tuple(prev_softmax_max.shape[:2]) == (t, n),
               f"{op}: with input_layout 'TND' the softmax tensors must be [T, N, 8] = [{t}, {n}, 8], "
               f"got {list(prev_softmax_max.shape)}")
        # Atlas A2 / A3 kernel limits of the TND layout.
        _check(d % 64 == 0 and 0 < d <= 768,
               f"{op}: with input_layout 'TND' the head dim D of attn_out must be a multiple of 64 and at "
               f"most 768, got {d}")
        _check(n <= 256, f"{op}: with input_layout 'TND' the head number N must be at most 256, got {n}")


def _bns_gather_index(cu_seqlens: torch.Tensor, tokens: int, heads: int, op: str) -> torch.Tensor:
    """[T, N] flat positions (in units of 8 values) of the statistics of token t and head n
    when each batch stores them as an [N, S_b, 8] block: start_b * N + n * S_b + (t - start_b)."""
    _check(cu_seqlens.dim() == 1, f"{op}: actual_seq_qlen must be a 1-D tensor of cumulative sequence "
                                  f"lengths, got {cu_seqlens.dim()} dimensions")
    cu = cu_seqlens.to(torch.int64)
    if _concrete(cu):
        values = cu.tolist()
        _check(len(values) > 0 and all(0 <= a <= b for a, b in zip([0] + values, values))
               and values[-1] == tokens,
               f"{op}: actual_seq_qlen must be the non-decreasing cumulative sequence lengths ending at "
               f"T={tokens}, got {values}")
    # A leading 0 is optional: prepending one more only adds an empty batch.
    cu = torch.cat([cu.new_zeros(1), cu])
    t = torch.arange(tokens, device=cu.device)
    batch = torch.searchsorted(cu, t, right=True) - 1  # the last boundary <= t
    start = cu[batch]
    length = cu[batch + 1] - start
    n = torch.arange(heads, device=cu.device)
    return start[:, None] * heads + n[None, :] * length[:, None] + (t - start)[:, None]


@_op("npu_ring_attention_update(Tensor prev_attn_out, Tensor prev_softmax_max, Tensor prev_softmax_sum, "
     "Tensor cur_attn_out, Tensor cur_softmax_max, Tensor cur_softmax_sum, *, Tensor? actual_seq_qlen=None, "
     "str input_layout=\"SBH\", str input_softmax_layout=\"\") -> (Tensor, Tensor, Tensor)")
def _npu_ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max,
                               cur_softmax_sum, *, actual_seq_qlen=None, input_layout="SBH",
                               input_softmax_layout=""):
    _check_ring_inputs(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max,
                       cur_softmax_sum, actual_seq_qlen, input_layout, input_softmax_layout)
    # The statistics merge elementwise, in whatever layout they are stored.
    softmax_max = torch.maximum(prev_softmax_max, cur_softmax_max)
    prev_scaled = prev_softmax_sum * torch.exp(prev_softmax_max - softmax_max)
    cur_scaled = cur_softmax_sum * torch.exp(cur_softmax_max - softmax_max)
    softmax_sum = prev_scaled + cur_scaled
    # The weights of the two attention outputs, one per (token, head): the first of the 8 copies.
    prev_weight = (prev_scaled / softmax_sum)[..., 0]
    cur_weight = (cur_scaled / softmax_sum)[..., 0]

    if input_layout == "SBH":
        s, b, h = prev_attn_out.shape
        n = prev_softmax_max.shape[1]
        shape = (s, b, n, h // n)
        prev_weight = prev_weight.permute(2, 0, 1)  # [B, N, S] -> [S, B, N]
        cur_weight = cur_weight.permute(2, 0, 1)
    else:
        t, n, _ = prev_attn_out.shape
        shape = prev_attn_out.shape
        if input_softmax_layout != "TND":  # batch-major [N, S_b] blocks: pick (t, n)'s entry
            index = _bns_gather_index(actual_seq_qlen.to(prev_attn_out.device), t, n, "npu_ring_attention_update")
            prev_weight = prev_weight.reshape(-1)[index]
            cur_weight = cur_weight.reshape(-1)[index]
    attn_out = (prev_attn_out.float().reshape(shape) * prev_weight.unsqueeze(-1)
                + cur_attn_out.float().reshape(shape) * cur_weight.unsqueeze(-1))
    return attn_out.reshape(prev_attn_out.shape).to(prev_attn_out.dtype), softmax_max, softmax_sum


# ---- npu_nsa_select_attention -------------------------------------------------------------

# Elements of gathered keys (or values) per chunk of query tokens, to bound the memory used.
_GATHER_BUDGET = 1 << 23


def _batch_bounds(lengths, total: int, name: str, op: str):
    """[(start, end)] of each batch from cumulative token counts (without the leading 0)."""
    _check(lengths is not None and len(lengths) > 0,
           f"{op}: {name} is required: the cumulative token counts of the batches, e.g. [s0, s0 + s1, ...]")
    _check(len(lengths) <= 1024, f"{op}: at most 1024 batches are supported, {name} has {len(lengths)}")
    starts = [0] + list(lengths[:-1])
    _check(all(0 <= a <= b for a, b in zip(starts, lengths)) and lengths[-1] <= total,
           f"{op}: {name} must be non-decreasing cumulative token counts of at most {total} (the T axis), "
           f"got {list(lengths)}")
    return list(zip(starts, lengths))


def _check_nsa_inputs(query, key, value, topk_indices, head_num, select_block_size, select_block_count,
                      atten_mask, actual_seq_qlen, actual_seq_kvlen):
    op = "npu_nsa_select_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check(t.dim() == 3, f"{op}: {name} must be 3-D in the TND layout [T, N, D], got {list(t.shape)}")
        _check(t.dtype in (torch.float16, torch.bfloat16),
               f"{op}: {name} must be float16 or bfloat16, got {t.dtype}")
    _check(query.dtype == key.dtype == value.dtype,
           f"{op}: query, key and value must have the same dtype, got {query.dtype}, {key.dtype} and {value.dtype}")
    t1, n1, d = query.shape
    t2, n2, dk = key.shape
    _check(value.shape[:2] == key.shape[:2],
           f"{op}: value [T2, N2, D2] must match key's T2 and N2, got key {list(key.shape)} and value "
           f"{list(value.shape)}")
    dv = value.size(2)
    _check(d == dk, f"{op}: query and key must have the same head dim, got {d} and {dk}")
    _check(dk >= dv, f"{op}: the head dim of key ({dk}) must be at least that of value ({dv})")
    _check(0 < d <= 768, f"{op}: the head dim must be in (0, 768], got {d}")
    _check(head_num == n1, f"{op}: head_num ({head_num}) must be the N axis of query ({n1})")
    _check(n2 > 0 and n1 % n2 == 0 and n1 // n2 <= 32,
           f"{op}: the head number of query ({n1}) must be 1 to 32 times that of key and value ({n2})")
    _check(0 < select_block_size <= 128 and select_block_size % 16 == 0,
           f"{op}: select_block_size must be a multiple of 16 of at most 128, got {select_block_size}")
    _check(0 < select_block_count <= 32, f"{op}: select_block_count must be in [1, 32], got {select_block_count}")
    _check(topk_indices.dtype == torch.int32, f"{op}: topk_indices must be int32, got {topk_indices.dtype}")
    _check(tuple(topk_indices.shape) == (t1, n2, select_block_count),
           f"{op}: topk_indices must be [T1, N2, select_block_count] = [{t1}, {n2}, {select_block_count}], "
           f"got {list(topk_indices.shape)}")
    if atten_mask is not None:
        _check(atten_mask.dtype in (torch.bool, torch.uint8) and atten_mask.dim() == 2,
               f"{op}: atten_mask must be a 2-D bool or uint8 tensor, got a {atten_mask.dim()}-D "
               f"{atten_mask.dtype} one")
    q_bounds = _batch_bounds(actual_seq_qlen, t1, "actual_seq_qlen", op)
    kv_bounds = _batch_bounds(actual_seq_kvlen, t2, "actual_seq_kvlen", op)
    _check(len(q_bounds) == len(kv_bounds),
           f"{op}: actual_seq_qlen and actual_seq_kvlen must have one entry per batch each, got "
           f"{len(q_bounds)} and {len(kv_bounds)}")
    selected = select_block_size * select_block_count
    for b, (start, end) in enumerate(kv_bounds):
        _check(end - start >= selected and (end - start) % select_block_size == 0,
               f"{op}: the key/value length of batch {b} ({end - start}) must be a multiple of "
               f"select_block_size ({select_block_size}) of at least select_block_size * select_block_count "
               f"({selected})")
        (q_start, q_end) = q_bounds[b]
        if q_end > q_start and _concrete(topk_indices):
            blocks = topk_indices[q_start:q_end]
            lo, hi, limit = int(blocks.min()), int(blocks.max()), (end - start) // select_block_size
            _check(lo >= 0 and hi < limit,
                   f"{op}: topk_indices of batch {b} must be block indices in [0, {limit}) "
                   f"(its key/value length / select_block_size), got values in [{lo}, {hi}]")
    return q_bounds, kv_bounds


@_op("npu_nsa_select_attention(Tensor query, Tensor key, Tensor value, Tensor topk_indices, float scale_value, "
     "int head_num, int select_block_size, int select_block_count, *, Tensor? atten_mask=None, "
     "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None) -> (Tensor, Tensor, Tensor)")
def _npu_nsa_select_attention(query, key, value, topk_indices, scale_value, head_num, select_block_size,
                              select_block_count, *, atten_mask=None, actual_seq_qlen=None, actual_seq_kvlen=None):
    q_bounds, kv_bounds = _check_nsa_inputs(query, key, value, topk_indices, head_num, select_block_size,
                                            select_block_count, atten_mask, actual_seq_qlen, actual_seq_kvlen)
    t1, n1, d = query.shape
    n2, dv = key.size(1), value.size(2)
    g = n1 // n2
    bs, count = select_block_size, select_block_count
    selected = bs * count
    heads = torch.arange(n2, device=query.device)
    in_block = torch.arange(bs, device=query.device)
    chunk = max(1, _GATHER_BUDGET // (n2 * selected * d))

    outs, maxes, sums = [], [], []
    for (q_start, q_end), (kv_start, kv_end) in zip(q_bounds, kv_bounds):
        # This batch's keys and values as [N2, blocks, block_size, D].
        blocks = (kv_end - kv_start) // bs
        k = key[kv_start:kv_end].float().reshape(blocks, bs, n2, d).permute(2, 0, 1, 3)
        v = value[kv_start:kv_end].float().reshape(blocks, bs, n2, dv).permute(2, 0, 1, 3)
        for t0 in range(q_start, q_end, chunk):
            t_end = min(t0 + chunk, q_end)
            t = t_end - t0
            idx = topk_indices[t0:t_end].long()  # [t, N2, count]
            k_sel = k[heads[None, :, None], idx].reshape(t * n2, selected, d)
            v_sel = v[heads[None, :, None], idx].reshape(t * n2, selected, dv)
            q = query[t0:t_end].float().reshape(t * n2, g, d)
            scores = torch.matmul(q, k_sel.transpose(1, 2)) * scale_value  # [t * N2, G, selected]
            if atten_mask is not None:
                # left-up causal within the batch: key position > query position is hidden; the
                # kernel writes a large finite negative there, so a fully hidden row stays finite.
                key_pos = (idx[..., None] * bs + in_block).reshape(t, n2, selected)
                query_pos = torch.arange(t0 - q_start, t_end - q_start, device=query.device)
                hidden = (key_pos > query_pos[:, None, None]).reshape(t * n2, 1, selected)
                scores = scores.masked_fill(hidden, torch.finfo(torch.float32).min)
            row_max = scores.amax(-1, keepdim=True)
            e = torch.exp(scores - row_max)
            row_sum = e.sum(-1, keepdim=True)
            # the probabilities enter the second matrix product in the input dtype
            p = (e / row_sum).to(query.dtype).float()
            outs.append(torch.matmul(p, v_sel).reshape(t, n1, dv))
            maxes.append(row_max.reshape(t, n1, 1))
            sums.append(row_sum.reshape(t, n1, 1))
    covered = q_bounds[-1][1]
    if covered < t1:  # tokens after the last batch are not computed
        outs.append(query.new_zeros(t1 - covered, n1, dv, dtype=torch.float32))
        maxes.append(query.new_zeros(t1 - covered, n1, 1, dtype=torch.float32))
        sums.append(query.new_zeros(t1 - covered, n1, 1, dtype=torch.float32))
    if not outs:
        outs.append(query.new_zeros(0, n1, dv, dtype=torch.float32))
        maxes.append(query.new_zeros(0, n1, 1, dtype=torch.float32))
        sums.append(query.new_zeros(0, n1, 1, dtype=torch.float32))
    attention_out = torch.cat(outs).to(query.dtype)
    softmax_max = torch.cat(maxes).expand(t1, n1, _SOFTMAX_TAIL).contiguous()
    softmax_sum = torch.cat(sums).expand(t1, n1, _SOFTMAX_TAIL).contiguous()
    return attention_out, softmax_max, softmax_sum
