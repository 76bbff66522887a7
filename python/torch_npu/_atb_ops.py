"""op-plugin's ATB (Ascend Transformer Boost) operators: ``torch.ops.atb.*``.

In Huawei's torch_npu they are kernels of the NNAL package's ATB library, exposed as
``torch_npu._npu_paged_attention``, ``torch_npu._npu_quantize_per_tensor``, ... and, for the
newer ones, ``torch_npu.atb.<name>``. Most write their result into an output tensor the
caller passes (``Tensor(a!) out``) and return nothing. Here they are compositions of ATen
operators on the npu tensors (CompositeImplicitAutograd, as ``_composite_ops``), so
torch.compile traces them without fake implementations of their own. No workspace is
needed: the ``*_get_workspace`` operators return an empty one.

Schemas are op-plugin's (op_plugin/ops/atb/*.cpp).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from torch_npu._composite_ops import _check, _npu_mrope, _op, _quantize_int8, _scatter_paged

_lib = torch.library.Library("atb", "FRAGMENT")

# ATB's tensor descriptors hold at most this many dimensions.
_MAX_DIMS = 8

# Exposed as torch_npu.<name> (the others as torch_npu.atb.<name>), as in torch_npu.
TORCH_NPU_NAMES = []
ATB_NAMES = []


def _atb_op(schema: str, module_level: bool = True, keys=("CompositeImplicitAutograd",)):
    """An atb operator (see ``_composite_ops._op``) whose tensors ATB accepts: at most 8
    dimensions each. ``module_level``: exposed as torch_npu.<name>, else torch_npu.atb.<name>."""
    name = schema.split("(", 1)[0].split(".", 1)[0]
    names = TORCH_NPU_NAMES if module_level else ATB_NAMES
    if name not in names:  # an .out overload shares its name
        names.append(name)

    def register(fn):
        @functools.wraps(fn)
        def checked(*args, **kwargs):
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor) and value.dim() > _MAX_DIMS:
                    raise RuntimeError(f"{name}: ATB tensor supports at most {_MAX_DIMS} dimensions, "
                                       f"but got {value.dim()}")
            return fn(*args, **kwargs)
        _op(schema, _lib, keys)(checked)
        return fn
    return register


def _workspace(like: torch.Tensor) -> torch.Tensor:
    """The simulator's kernels need no workspace: an empty uint8 tensor on like's device."""
    return torch.empty(0, dtype=torch.uint8, device=like.device)


def _lengths(name: str, arg: str, lens, count: int) -> list[int]:
    """Per-sequence lengths (a tensor on any device, or a list) as host ints."""
    values = lens.tolist() if isinstance(lens, torch.Tensor) else list(lens)
    _check(len(values) == count, f"{name}: {arg} must hold {count} lengths (one per sequence), got {len(values)}")
    return [int(n) for n in values]


def _attention(q, k, v, scale, mask=None, lse=False):
    """Softmax attention in float32 with grouped KV heads: q [Sq, H, D], k [Skv, KVH, D],
    v [Skv, KVH, Dv] (H a multiple of KVH, query head h reads KV head h // (H / KVH)); mask
    is added to the scaled scores [H, Sq, Skv] (broadcast). Returns [Sq, H, Dv] float32 and,
    with lse, also the log-sum-exp of each query's scores [H, Sq]."""
    group = q.size(1) // k.size(1)
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if mask is not None:
        scores = scores + mask.float()
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)
    return (out, torch.logsumexp(scores, -1)) if lse else out


def _check_heads(name, num_heads, num_kv_heads, query_heads, kv_heads):
    _check(num_heads == query_heads, f"{name}: num_heads ({num_heads}) must be query's head count ({query_heads})")
    _check(num_kv_heads > 0 and num_heads % num_kv_heads == 0 and num_kv_heads == kv_heads,
           f"{name}: num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads}) and be the caches' head "
           f"count ({kv_heads})")


def _gather_paged(cache, blocks, length):
    """The first `length` tokens of one sequence of a paged cache [blocks, block_size, ...]
    whose blocks are listed, in order, in `blocks` (a row of the block table)."""
    block_size = cache.size(1)
    used = blocks[:(length + block_size - 1) // block_size].long()
    return cache[used].flatten(0, 1)[:length]


def _split_heads(name, arg, x, heads):
    """x as [tokens, heads, head_size]: ATB also takes the heads merged, [tokens, hidden]."""
    _check(x.dim() in (2, 3), f"{name}: {arg} must be [tokens, heads, head_size] or [tokens, hidden], "
                              f"got {list(x.shape)}")
    if x.dim() == 3:
        return x
    _check(heads > 0 and x.size(1) % heads == 0,
           f"{name}: {arg}'s hidden size {x.size(1)} must be a multiple of its head count ({heads})")
    return x.view(x.size(0), heads, x.size(1) // heads)


def _nd_cache(name, arg, cache, kv_heads, nz=False):
    """A paged cache as ND [blocks, block_size, kv_heads, head_size]. ATB also takes
    [blocks, block_size, hidden] and FRACTAL_NZ [blocks, hidden / c0, block_size, c0], whose
    token (block, slot) is [block, :, slot, :]: with nz, for a cache in that format, or for
    one whose shape is not ND but NZ (c0 16 or 32: Atlas inference products keep their caches
    NZ)."""
    _check(cache.dim() in (3, 4), f"{name}: {arg} must be [blocks, block_size, kv_heads, head_size] or "
                                  f"[blocks, block_size, hidden], got {list(cache.shape)}")
    if cache.dim() == 4 and (nz or (cache.size(2) != kv_heads and cache.size(3) in (16, 32)) or _is_nz(cache)):
        cache = cache.permute(0, 2, 1, 3).flatten(2)
    if cache.dim() == 3:
        _check(kv_heads > 0 and cache.size(2) % kv_heads == 0,
               f"{name}: {arg}'s hidden size {cache.size(2)} must be a multiple of num_kv_heads ({kv_heads})")
        cache = cache.unflatten(2, (kv_heads, cache.size(2) // kv_heads))
    return cache


def _paged_kv(key_cache, value_cache, block_table):
    """kv_of (see _varlen_attention) for paged caches: sequence b's tokens are in the blocks
    block_table[b]."""
    return lambda b, n: (_gather_paged(key_cache, block_table[b], n), _gather_paged(value_cache, block_table[b], n))


def _packed_kv(key, value, lens):
    """kv_of (see _varlen_attention) for sequences of lens tokens stored one after the other."""
    starts = [sum(lens[:b]) for b in range(len(lens))]
    return lambda b, n: (key[starts[b]:starts[b] + n], value[starts[b]:starts[b] + n])


def _varlen_attention(query, kv_of, q_lens, kv_lens, scale, bias_of, out, lse=None):
    """Attention of sequences packed one after another: sequence b's q_lens[b] queries (rows
    of query [tokens, H, D]) attend to its kv_lens[b] tokens, kv_of(b, n) -> (k [n, KVH, D],
    v [n, KVH, Dv]), with the additive mask bias_of(b, q_len, kv_len) (bias_of None: no mask).
    Writes the rows of out [tokens, H, Dv] and, given lse [tokens, H], their log-sum-exp;
    a sequence without tokens to attend to gets zeros."""
    start = 0
    for b, (nq, nk) in enumerate(zip(q_lens, kv_lens)):
        rows = slice(start, start + nq)
        start += nq
        if nk <= 0:
            out[rows] = 0
            if lse is not None:
                lse[rows] = 0
            continue
        k, v = kv_of(b, nk)
        o, row_lse = _attention(query[rows], k, v, scale, None if bias_of is None else bias_of(b, nq, nk), lse=True)
        out[rows] = o.to(out.dtype)
        if lse is not None:
            lse[rows] = row_lse.t().to(lse.dtype)


def _check_lens(name, q_lens, kv_lens):
    _check(all(0 <= q <= k or k == 0 for q, k in zip(q_lens, kv_lens)),
           f"{name}: each sequence needs as many tokens to attend to as queries (or none), got query lengths "
           f"{q_lens} and key/value lengths {kv_lens}")


# ---- masks (bias_of functions of _varlen_attention) ----------------------------------------------

def _causal(device, top_left=False):
    """A causal mask: the q_len queries are the last q_len of the kv_len positions (a cached
    prefix precedes them; top_left: the first q_len) and see the positions up to their own."""
    def bias_of(b, q_len, kv_len):
        first = 0 if top_left else kv_len - q_len
        rows = torch.arange(first, first + q_len, device=device)[:, None]
        hidden = torch.arange(kv_len, device=device) > rows
        return torch.zeros(q_len, kv_len, device=device).masked_fill(hidden, float("-inf"))
    return bias_of


def _alibi(name, slopes, heads, sqrt, device):
    """A causal mask plus ALiBi biases slopes[h] * d (sqrt: slopes[h] * sqrt(d)), d = i - j the
    distance of query position i back to key position j. ATB's compressed ALiBi masks hold this
    (negated) distance table for one tile; the simulator computes it for every distance."""
    _check(slopes is not None and slopes.numel() == heads,
           f"{name}: a compressed ALiBi mask needs slopes with one value per head ({heads})")
    causal = _causal(device)

    def bias_of(b, q_len, kv_len):
        dist = (torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
                - torch.arange(kv_len, device=device)).float().clamp(min=0)
        return slopes.float().reshape(-1, 1, 1) * (dist.sqrt() if sqrt else dist) + causal(b, q_len, kv_len)
    return bias_of


def _full_mask(name, mask, per_head):
    """An additive mask given in full: [S, S] for every sequence, [B, S, S] one per sequence
    ([1, S, S]: shared; per_head, an ALiBi mask: [H, S, S] shared) or [B, H, S, S]; decoding
    masks hold the query row alone ([B, H, 1, S], [H, 1, S], [B, 1, S]). The q_len queries
    of a sequence are the last of its kv_len positions."""
    _check(mask is not None and mask.dim() in (2, 3, 4),
           f"{name}: mask must be [S, S], [batch, S, S], [heads, S, S] or [batch, heads, S, S], "
           f"got {None if mask is None else list(mask.shape)}")

    def bias_of(b, q_len, kv_len):
        m = mask
        if mask.dim() == 4 or (mask.dim() == 3 and not per_head):
            m = mask[b if mask.size(0) > 1 else 0]
        start = 0 if m.size(-2) == q_len else kv_len - q_len
        _check(m.size(-2) >= start + q_len and m.size(-1) >= kv_len,
               f"{name}: mask {list(mask.shape)} does not cover sequence {b} ({q_len} queries over {kv_len} tokens)")
        return m[..., start:start + q_len, :kv_len]
    return bias_of


def _spec_mask(name, mask, q_lens):
    """A mask for several queries per sequence: the rows of all queries one after the other,
    [tokens, S], or a mask in full (see _full_mask)."""
    if mask is not None and mask.dim() == 2 and mask.size(0) == sum(q_lens) != mask.size(1):
        starts = [sum(q_lens[:b]) for b in range(len(q_lens))]
        return lambda b, q_len, kv_len: mask[starts[b]:starts[b] + q_len, :kv_len]
    return _full_mask(name, mask, per_head=False)


# SelfAttentionParam::MaskType
_MASK_UNDEFINED, _MASK_NORM, _MASK_ALIBI, _MASK_NORM_COMPRESS, _MASK_ALIBI_COMPRESS, _MASK_ALIBI_COMPRESS_SQRT, \
    _MASK_ALIBI_COMPRESS_LEFT_ALIGN = range(7)
_MASK_CAUSAL = 9


def _self_attention_mask(name, mask_type, allowed, mask, slopes, heads, device):
    """bias_of for a SelfAttention mask_type. A left-aligned compressed ALiBi mask biases key j
    by slope * j instead of slope * (j - i): the same softmax."""
    _check(mask_type in allowed, f"{name}: mask_type must be one of {sorted(allowed)}, got {mask_type}")
    if mask_type == _MASK_UNDEFINED:
        return None
    if mask_type in (_MASK_NORM, _MASK_ALIBI):
        return _full_mask(name, mask, per_head=mask_type == _MASK_ALIBI)
    if mask_type in (_MASK_NORM_COMPRESS, _MASK_CAUSAL):
        return _causal(device)
    return _alibi(name, slopes, heads, mask_type == _MASK_ALIBI_COMPRESS_SQRT, device)


def _paged_attention(name, query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                     context_lens, out, q_lens=None, bias_of=None, nz=False, lse=None):
    """Attention over paged caches: query [tokens, H, D] holds q_lens[b] queries of sequence b
    (None: one each, decoding), key_cache [blocks, block_size, KVH, D], value_cache [blocks,
    block_size, KVH, Dv] (or see _nd_cache); sequence b attends to its first context_lens[b]
    cached tokens, whose blocks are block_table[b]. Writes out [tokens, H, Dv]."""
    key_cache = _nd_cache(name, "key_cache", key_cache, num_kv_heads, nz)
    value_cache = _nd_cache(name, "value_cache", value_cache, num_kv_heads, nz)
    query = _split_heads(name, "query", query, num_heads)
    _check_heads(name, num_heads, num_kv_heads, query.size(1), key_cache.size(2))
    batch = block_table.size(0) if q_lens is not None else query.size(0)
    lens = _lengths(name, "context_lens", context_lens, batch)
    q_lens = [1] * batch if q_lens is None else _lengths(name, "seq_len", q_lens, batch)
    _check_lens(name, q_lens, lens)
    _check(block_table.dim() == 2 and block_table.size(0) == batch,
           f"{name}: block_table must be [{batch}, max_blocks], got {list(block_table.shape)}")
    tokens = query.size(0)
    _check(sum(q_lens) <= tokens, f"{name}: the sequences have {sum(q_lens)} queries, more than query's {tokens}")
    _check(out.numel() == tokens * num_heads * value_cache.size(-1) and out.size(0) == tokens,
           f"{name}: out must be [{tokens}, {num_heads}, {value_cache.size(-1)}], got {list(out.shape)}")
    _varlen_attention(query, _paged_kv(key_cache, value_cache, block_table), q_lens, lens, scale_value, bias_of,
                      out.view(tokens, num_heads, -1), lse)


def _self_attention(name, query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out, bias_of=None):
    """Self attention of unpadded sequences: query [tokens, H, D], key [tokens, KVH, D] and
    value [tokens, KVH, Dv] (or [tokens, hidden]) hold the sequences one after the other
    (seq_len [B] tokens each); each token attends to the tokens of its sequence, under the
    mask bias_of. Writes out [tokens, H, Dv] (or [tokens, H * Dv])."""
    _check(num_heads > 0 and num_kv_heads > 0,
           f"{name}: num_heads ({num_heads}) and num_kv_heads ({num_kv_heads}) must be positive")
    query = _split_heads(name, "query", query, num_heads)
    key = _split_heads(name, "key", key, num_kv_heads)
    value = _split_heads(name, "value", value, num_kv_heads)
    _check_heads(name, num_heads, num_kv_heads, query.size(1), key.size(1))
    lens = _lengths(name, "seq_len", seq_len, seq_len.numel() if isinstance(seq_len, torch.Tensor) else len(seq_len))
    _check(sum(lens) <= query.size(0) and sum(lens) <= key.size(0),
           f"{name}: seq_len sums to {sum(lens)} tokens, more than query ({query.size(0)}) or key ({key.size(0)}) hold")
    _check(out.size(0) == query.size(0) and out.numel() == query.size(0) * num_heads * value.size(-1),
           f"{name}: out must be [{query.size(0)}, {num_heads}, {value.size(-1)}], got {list(out.shape)}")
    _varlen_attention(query, _packed_kv(key, value, lens), lens, lens, scale_value, bias_of,
                      out.view(query.size(0), num_heads, -1))


# ---- quantization, normalisation, matmul -----------------------------------------------------

@_atb_op("_npu_quantize_per_tensor(Tensor x, Tensor scale, Tensor zero_point, Tensor(a!) y) -> ()")
def _npu_quantize_per_tensor(x, scale, zero_point, y):
    """y = saturate_int8(round(x / scale) + zero_point), scale and zero_point broadcast against
    x (an empty zero_point: none). Rounding is to nearest, ties to even."""
    name = "_npu_quantize_per_tensor"
    _check(y.dtype == torch.int8 and y.shape == x.shape,
           f"{name}: y must be int8 of x's shape {list(x.shape)}, got {y.dtype} {list(y.shape)}")
    q = torch.round(x.float() / scale.float())
    if zero_point.numel():
        q = q + zero_point.float()
    y.copy_(q.clamp(-128, 127).to(torch.int8))


@_atb_op("_npu_quant_rms_norm(Tensor self, Tensor gamma, Tensor beta, Tensor scale, Tensor offset, "
         "Tensor(a!) output, float eps=1e-05) -> ()")
def _npu_quant_rms_norm(self, gamma, beta, scale, offset, output, eps=1e-5):
    """output = saturate_int8(round((x / sqrt(mean(x^2) + eps) * gamma + beta) / scale + offset)),
    normalised over the last dimension, in float32."""
    _check(output.dtype == torch.int8 and output.shape == self.shape,
           f"_npu_quant_rms_norm: output must be int8 of self's shape {list(self.shape)}, "
           f"got {output.dtype} {list(output.shape)}")
    x = self.float()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma.float().reshape(-1) + beta.float().reshape(-1)
    output.copy_(_quantize_int8(y, scale.reshape(-1), offset.reshape(-1), True, "_npu_quant_rms_norm"))


@_atb_op("_npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()")
def _npu_matmul_add_fp32(x, weight, C):
    """C += x^T @ weight (x [K, M], weight [K, N], C float32 [M, N]), accumulated in float32:
    the gradient accumulation of a linear layer's weight."""
    name = "_npu_matmul_add_fp32"
    _check(x.dim() == 2 and weight.dim() == 2 and x.size(0) == weight.size(0),
           f"{name}: x [K, M] and weight [K, N] must share K, got {list(x.shape)} and {list(weight.shape)}")
    _check(C.dtype == torch.float32 and C.shape == (x.size(1), weight.size(1)),
           f"{name}: C must be float32 [{x.size(1)}, {weight.size(1)}], got {C.dtype} {list(C.shape)}")
    C.addmm_(x.t().float(), weight.float())


# ---- KV caches ----------------------------------------------------------------------------------

def _is_nz(cache):
    # A fake tensor (FakeTensorMode, torch.compile's tracing) has no storage format: ND.
    return not torch._subclasses.fake_tensor.is_fake(cache) and torch.ops.npu.get_npu_format(cache) == 29


@_atb_op("_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
         "Tensor slot_indices) -> ()")
def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    """key[t] / value[t] ([T, heads, head_size]) go to slot slot_indices[t] (block slot //
    block_size, offset slot % block_size) of key_cache / value_cache: ND caches [blocks,
    block_size, heads, head_size], or FRACTAL_NZ ones [blocks, heads * head_size / c0,
    block_size, c0]. Negative slots are skipped."""
    _scatter_paged(key_cache, key, slot_indices, _is_nz(key_cache), "_npu_reshape_and_cache")
    _scatter_paged(value_cache, value, slot_indices, _is_nz(value_cache), "_npu_reshape_and_cache")


@_atb_op("_npu_reshape_and_cache_siso(Tensor key, Tensor(a!) key_cache, Tensor slot_indices) -> ()")
def _npu_reshape_and_cache_siso(key, key_cache, slot_indices):
    """_npu_reshape_and_cache of the keys alone."""
    _scatter_paged(key_cache, key, slot_indices, _is_nz(key_cache), "_npu_reshape_and_cache_siso")


def _paged_cache_load(name, key_cache, value_cache, block_table, context_lens, seq_starts, cumsum, key, value):
    """Gathers each sequence's cached tokens, sequence after sequence, into key / value
    [tokens, heads, head_size]: sequence b has context_lens[b] tokens (with cumsum, context_lens
    are cumulative ends) in the blocks block_table[b], from its block seq_starts[b] //
    block_size on."""
    _check(key_cache.dim() == 4 and value_cache.dim() == 4 and not _is_nz(key_cache),
           f"{name}: the caches must be ND [blocks, block_size, heads, head_size] (FRACTAL_NZ caches are not "
           f"simulated), got {list(key_cache.shape)} and {list(value_cache.shape)}")
    batch = block_table.size(0)
    lens = _lengths(name, "context_lens", context_lens, batch)
    if cumsum:
        lens = [end - start for start, end in zip([0] + lens[:-1], lens)]
    _check(all(n >= 0 for n in lens), f"{name}: context_lens must not be negative, got {lens}")
    starts = [0] * batch if seq_starts is None else _lengths(name, "seq_starts", seq_starts, batch)
    block_size = key_cache.size(1)
    row = 0
    for b, n in enumerate(lens):
        blocks = block_table[b, starts[b] // block_size:]
        key[row:row + n] = _gather_paged(key_cache, blocks, n)
        value[row:row + n] = _gather_paged(value_cache, blocks, n)
        row += n
    return key, value


@_atb_op("npu_paged_cache_load(Tensor key_cache, Tensor value_cache, Tensor block_table, Tensor context_lens, *, "
         "Tensor? seq_starts=None, bool cumsum=False) -> (Tensor, Tensor)", module_level=False)
def _npu_paged_cache_load(key_cache, value_cache, block_table, context_lens, *, seq_starts=None, cumsum=False):
    """The cached tokens of each sequence, concatenated: (key, value) [tokens, heads, head_size]
    (see _paged_cache_load)."""
    lens = context_lens.tolist()
    tokens = (lens[-1] if lens else 0) if cumsum else sum(lens)
    key = key_cache.new_empty(tokens, key_cache.size(2), key_cache.size(3))
    value = value_cache.new_empty(tokens, value_cache.size(2), value_cache.size(3))
    return _paged_cache_load("npu_paged_cache_load", key_cache, value_cache, block_table, context_lens, seq_starts,
                             cumsum, key, value)


@_atb_op("npu_paged_cache_load.out(Tensor key_cache, Tensor value_cache, Tensor block_table, Tensor context_lens, *, "
         "Tensor? seq_starts=None, bool cumsum=False, Tensor(a!) key, Tensor(b!) value) -> (Tensor(a!), Tensor(b!))",
         module_level=False)
def _npu_paged_cache_load_out(key_cache, value_cache, block_table, context_lens, *, seq_starts=None, cumsum=False,
                              key, value):
    return _paged_cache_load("npu_paged_cache_load", key_cache, value_cache, block_table, context_lens, seq_starts,
                             cumsum, key, value)


# ---- rotary embedding ---------------------------------------------------------------------------

@_atb_op("_npu_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
         "Tensor cos_sin_cache, bool is_neox_style) -> ()")
def _npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style):
    """vLLM's rotary embedding in place: npu_mrope with 1-D positions, NeoX (halves) or GPT-J
    (even/odd pairs) rotation."""
    q, k = _npu_mrope(positions.reshape(-1), query, key, cos_sin_cache, head_size,
                      rotary_mode="half" if is_neox_style else "interleave")
    query.copy_(q)
    key.copy_(k)


# ---- paged attention ----------------------------------------------------------------------------

# Below autograd (an inference operator): dispatch modes see it whole, e.g. NPUGraph's
# auto_dispatch_capture, whose handler updates its context_lens.
@_atb_op("_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, int num_heads, "
         "float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out, *, Tensor? workspace=None) -> ()",
         keys=("CompositeExplicitAutograd",))
def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out, *, workspace=None):
    """Decoding attention over paged KV caches (see _paged_attention); workspace is not needed."""
    _paged_attention("_npu_paged_attention", query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                  block_table, context_lens, out)


# What the operator does to its arguments' metadata (nothing: it writes `out` in place), for
# FakeTensor (torch.compile traces it as one node).
_lib.impl("_npu_paged_attention", lambda *args, **kwargs: None, "Meta")


@_atb_op("_npu_paged_attention_get_workspace(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
         "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out) -> Tensor")
def _npu_paged_attention_get_workspace(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                                       block_table, context_lens, out):
    return _workspace(query)


@_atb_op("_npu_paged_attention_mla(Tensor query, Tensor key_cache, int num_kv_heads, int num_heads, "
         "float scale_value, Tensor block_table, Tensor context_lens, int mla_vheadsize, Tensor(a!) out) -> ()")
def _npu_paged_attention_mla(query, key_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens,
                             mla_vheadsize, out):
    """Multi-head latent attention decoding: the values are the first mla_vheadsize channels
    of the cached keys (key_cache [blocks, block_size, KVH, D]); out [B, H, mla_vheadsize]."""
    name = "_npu_paged_attention_mla"
    _check(0 < mla_vheadsize <= key_cache.size(-1),
           f"{name}: mla_vheadsize must be in (0, {key_cache.size(-1)}], got {mla_vheadsize}")
    _paged_attention(name, query, key_cache, key_cache[..., :mla_vheadsize], num_kv_heads, num_heads, scale_value,
                  block_table, context_lens, out)


# ---- self attention ------------------------------------------------------------------------------

@_atb_op("_npu_flash_attention_unpad(Tensor query, Tensor key, Tensor value, Tensor seq_len, float scale_value, "
         "int num_heads, int num_kv_heads, Tensor(a!) out) -> ()")
def _npu_flash_attention_unpad(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out):
    """Self attention of unpadded sequences without a mask (see _self_attention)."""
    _self_attention("_npu_flash_attention_unpad", query, key, value, seq_len, scale_value, num_heads, num_kv_heads,
                     out)


@_atb_op("_npu_flash_attention_unpad_v2(Tensor query, Tensor key, Tensor value, Tensor seq_len, float scale_value, "
         "int num_heads, int num_kv_heads, *, int ? kernel_type = 0, Tensor(a!) out) -> ()")
def _npu_flash_attention_unpad_v2(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, *,
                                  kernel_type=0, out):
    """_npu_flash_attention_unpad; kernel_type picks ATB's kernel precision (0 default, 2
    EXP_M8V2), which the simulator's float32 computation does not need."""
    _check(kernel_type in (None, 0, 2), f"_npu_flash_attention_unpad_v2: kernel_type only supports "
                                        f"KERNELTYPE_DEFAULT(0) and KERNELTYPE_EXP_M8V2(2), but got: {kernel_type}")
    _self_attention("_npu_flash_attention_unpad_v2", query, key, value, seq_len, scale_value, num_heads,
                     num_kv_heads, out)


@_atb_op("_npu_flash_attention(Tensor query, Tensor key, Tensor value, Tensor mask, Tensor seq_len, float scale_value, "
         "int num_heads, int num_kv_heads, Tensor(a!) out) -> ()")
def _npu_flash_attention(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out):
    """Self attention of unpadded sequences under an additive mask given in full (see
    _full_mask): [S, S], [batch, S, S] or [batch, heads, S, S]."""
    name = "_npu_flash_attention"
    _self_attention(name, query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out,
                    _full_mask(name, mask, per_head=False))


@_atb_op("_npu_flash_attention_v3(Tensor query, Tensor key, Tensor value, Tensor mask, Tensor seq_len, "
         "float scale_value, int num_heads, int num_kv_heads, *, int ? mask_type = 3, Tensor(a!) out) -> ()")
def _npu_flash_attention_v3(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, *, mask_type=3,
                            out):
    """Causal self attention of unpadded sequences; mask is ATB's compressed causal mask
    (MASK_TYPE_NORM_COMPRESS, any layout: the simulator builds the causal mask itself)."""
    mask_type = _MASK_NORM_COMPRESS if mask_type is None else mask_type
    _check(mask_type == _MASK_NORM_COMPRESS,
           f"_npu_flash_attention_v3: mask_type only supports MASK_TYPE_NORM_COMPRESS, but got: {mask_type}")
    _self_attention("_npu_flash_attention_v3", query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out,
                    _causal(query.device))


@_atb_op("_npu_flash_attention_v2.out(Tensor query, Tensor key, Tensor value, SymInt[] seq_len, *, Tensor? mask=None, "
         "Tensor? slopes=None, int kernel_type=0, int mask_type=2, float scale_value=1, int num_heads=0, "
         "int num_kv_heads=0, Tensor(a!) out) -> Tensor(a!)", module_level=False)
def _npu_flash_attention_v2(query, key, value, seq_len, *, mask=None, slopes=None, kernel_type=0, mask_type=2,
                            scale_value=1.0, num_heads=0, num_kv_heads=0, out):
    """Self attention of unpadded sequences ([tokens, heads, head_size] or [tokens, hidden])
    with mask_type 0 (no mask), 1 (mask in full), 2 (ALiBi mask in full: [batch, heads, S, S]
    or [heads, S, S]), 4 / 5 (compressed ALiBi, linear / square-root distances, with slopes
    [heads]) or 6 (compressed left-aligned ALiBi). kernel_type (0 default, 1 high precision)
    picks ATB's kernel precision; the simulator computes in float32 either way."""
    name = "_npu_flash_attention_v2"
    _check(kernel_type in (0, 1), f"{name}: kernel_type must be 0 (KERNELTYPE_DEFAULT) or 1 "
                                  f"(KERNELTYPE_HIGH_PRECISION), got {kernel_type}")
    bias_of = _self_attention_mask(name, mask_type, {_MASK_UNDEFINED, _MASK_NORM, _MASK_ALIBI, _MASK_ALIBI_COMPRESS,
                                                     _MASK_ALIBI_COMPRESS_SQRT, _MASK_ALIBI_COMPRESS_LEFT_ALIGN},
                                   mask, slopes, num_heads, query.device)
    _self_attention(name, query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out, bias_of)
    return out


# ---- attention over a cached prefix ---------------------------------------------------------------

@_atb_op("_npu_flash_attention_qlens(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
         "Tensor mask, Tensor seq_len, Tensor context_lens, int num_kv_heads, int num_heads, float scale_value, "
         "Tensor(a!) out) -> ()")
def _npu_flash_attention_qlens(query, key_cache, value_cache, block_table, mask, seq_len, context_lens, num_kv_heads,
                               num_heads, scale_value, out):
    """Causal prefill over a cached prefix: sequence b's seq_len[b] queries are the last of its
    context_lens[b] tokens in the paged caches (blocks block_table[b]) and see the tokens up to
    their own. mask is ATB's compressed causal mask (the simulator builds the mask itself)."""
    _paged_attention("_npu_flash_attention_qlens", query, key_cache, value_cache, num_kv_heads, num_heads,
                     scale_value, block_table, context_lens, out, q_lens=seq_len, bias_of=_causal(query.device))


@_atb_op("_npu_flash_attention_prefix_v2.out(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
         "Tensor mask, SymInt[] seq_len, SymInt[] context_lens, *, Tensor? slopes=None, int kernel_type=1, "
         "int mask_type=3, int num_kv_heads=0, int num_heads=0, float scale_value=1, Tensor(a!) out) -> Tensor(a!)",
         module_level=False)
def _npu_flash_attention_prefix_v2(query, key_cache, value_cache, block_table, mask, seq_len, context_lens, *,
                                   slopes=None, kernel_type=1, mask_type=3, num_kv_heads=0, num_heads=0,
                                   scale_value=1.0, out):
    """_npu_flash_attention_qlens with mask_type 3 (causal), 4 or 5 (causal plus ALiBi, linear
    or square-root distances, with slopes [heads]); caches [blocks, block_size, kv_heads,
    head_size] or [blocks, block_size, hidden]. Only the high-precision kernel (1) exists."""
    name = "_npu_flash_attention_prefix_v2"
    _check(kernel_type == 1, f"{name}: kernel_type must be 1 (KERNELTYPE_HIGH_PRECISION), got {kernel_type}")
    bias_of = _self_attention_mask(name, mask_type, {_MASK_NORM_COMPRESS, _MASK_ALIBI_COMPRESS,
                                                     _MASK_ALIBI_COMPRESS_SQRT}, mask, slopes, num_heads, query.device)
    _paged_attention(name, query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                     context_lens, out, q_lens=seq_len, bias_of=bias_of)
    return out


_PREFIX_ENCODER_MASKS = {"mask_type_norm_compress": _MASK_NORM_COMPRESS, "mask_type_alibi_compress": _MASK_ALIBI_COMPRESS,
                         "mask_type_alibi_compress_sort": _MASK_ALIBI_COMPRESS_SQRT, "mask_type_causal_mask": _MASK_CAUSAL}


def _mode(table, value, default, arg):
    """The code of an ATB mode given by name (None: default), as op-plugin's string options."""
    value = default if value is None else value
    _check(value in table, f"Unsupported {arg} value: '{value}'")
    return table[value]


def _self_attention_prefix_encoder(query, key, value, block_tables, seqlen, kv_seqlen, q_headnum, qk_scale,
                                   kv_headnum, mask, slopes, mask_type, output):
    name = "npu_self_attention_prefix_encoder"
    code = _mode(_PREFIX_ENCODER_MASKS, mask_type, "mask_type_causal_mask", "mask_type")
    bias_of = _self_attention_mask(name, code, set(_PREFIX_ENCODER_MASKS.values()), mask, slopes, q_headnum,
                                   query.device)
    _paged_attention(name, query, key, value, kv_headnum, q_headnum, qk_scale, block_tables, kv_seqlen, output,
                     q_lens=seqlen, bias_of=bias_of)
    return output


@_atb_op("npu_self_attention_prefix_encoder(Tensor query, Tensor key, Tensor value, Tensor block_tables, "
         "SymInt[] seqlen, SymInt[] kv_seqlen, int q_headnum, float qk_scale, int kv_headnum, *, Tensor? mask=None, "
         "Tensor? slopes=None, str? mask_type=None) -> Tensor", module_level=False)
def _npu_self_attention_prefix_encoder(query, key, value, block_tables, seqlen, kv_seqlen, q_headnum, qk_scale,
                                       kv_headnum, *, mask=None, slopes=None, mask_type=None):
    """Prefill over a cached prefix (see _npu_flash_attention_prefix_v2): key / value are the
    paged caches, seqlen the query and kv_seqlen the total lengths; mask_type
    'mask_type_causal_mask' (default) / 'mask_type_norm_compress' (causal),
    'mask_type_alibi_compress' / 'mask_type_alibi_compress_sort' (causal plus ALiBi, with
    slopes). Returns the output, in query's shape."""
    return _self_attention_prefix_encoder(query, key, value, block_tables, seqlen, kv_seqlen, q_headnum, qk_scale,
                                          kv_headnum, mask, slopes, mask_type, torch.empty_like(query))


@_atb_op("npu_self_attention_prefix_encoder.out(Tensor query, Tensor key, Tensor value, Tensor block_tables, "
         "SymInt[] seqlen, SymInt[] kv_seqlen, int q_headnum, float qk_scale, int kv_headnum, *, Tensor? mask=None, "
         "Tensor? slopes=None, str? mask_type=None, Tensor(a!) output) -> Tensor(a!)", module_level=False)
def _npu_self_attention_prefix_encoder_out(query, key, value, block_tables, seqlen, kv_seqlen, q_headnum, qk_scale,
                                           kv_headnum, *, mask=None, slopes=None, mask_type=None, output):
    return _self_attention_prefix_encoder(query, key, value, block_tables, seqlen, kv_seqlen, q_headnum, qk_scale,
                                          kv_headnum, mask, slopes, mask_type, output)


# ---- more paged attention ------------------------------------------------------------------------

# PagedAttentionParam::MaskType
_PA_UNDEFINED, _PA_NORM, _PA_ALIBI, _PA_SPEC, _PA_MASK_FREE, _PA_NORM_COMPRESS = range(6)


def _paged_attention_v2(query, key_cache, block_table, context_lens, value_cache, mask, num_kv_heads, num_heads,
                        scale_value, mask_type, out):
    name = "_npu_paged_attention_v2"
    _check(mask_type in (_PA_UNDEFINED, _PA_ALIBI),
           f"{name}: mask_type must be 0 (UNDEFINED) or 2 (MASK_TYPE_ALIBI), got {mask_type}")
    _check(value_cache is not None, f"{name}: value_cache is required")
    bias_of = _full_mask(name, mask, per_head=True) if mask_type == _PA_ALIBI else None
    _paged_attention(name, query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                     context_lens, out, bias_of=bias_of)
    return out


@_atb_op("_npu_paged_attention_v2.out(Tensor query, Tensor key_cache, Tensor block_table, SymInt[] context_lens, *, "
         "Tensor? value_cache=None, Tensor? mask=None, int num_kv_heads=0, int num_heads=0, float scale_value=1.0, "
         "int mask_type=0, Tensor? workspace=None, Tensor(a!) out) -> Tensor(a!)", module_level=False)
def _npu_paged_attention_v2(query, key_cache, block_table, context_lens, *, value_cache=None, mask=None,
                            num_kv_heads=0, num_heads=0, scale_value=1.0, mask_type=0, workspace=None, out):
    """Decoding attention over paged caches (see _paged_attention) with mask_type 0 (no mask)
    or 2 (an ALiBi mask [batch, heads, 1, S] or [heads, 1, S] added to the scores); the
    workspace is not needed."""
    return _paged_attention_v2(query, key_cache, block_table, context_lens, value_cache, mask, num_kv_heads,
                               num_heads, scale_value, mask_type, out)


@_atb_op("_npu_paged_attention_v2_get_workspace(Tensor query, Tensor key_cache, Tensor block_table, "
         "SymInt[] context_lens, *, Tensor? value_cache=None, Tensor? mask=None, int num_kv_heads=0, int num_heads=0, "
         "float scale_value=1.0, int mask_type=0, Tensor(a!) out) -> Tensor", module_level=False)
def _npu_paged_attention_v2_get_workspace(query, key_cache, block_table, context_lens, *, value_cache=None,
                                          mask=None, num_kv_heads=0, num_heads=0, scale_value=1.0, mask_type=0,
                                          out):
    return _workspace(query)


@_atb_op("_npu_paged_attention_splitfuse(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
         "Tensor context_lens, Tensor mask, Tensor seq_len, int num_kv_heads, int num_heads, float scale_value, "
         "Tensor(a!) out) -> ()")
def _npu_paged_attention_splitfuse(query, key_cache, value_cache, block_table, context_lens, mask, seq_len,
                                   num_kv_heads, num_heads, scale_value, out):
    """Chunked prefill and decoding in one batch: sequence b's seq_len[b] queries are the last
    of its context_lens[b] cached tokens; mask holds the rows of all queries, [tokens, S], or
    is given in full ([S, S], [1, S, S], [batch, S, S])."""
    name = "_npu_paged_attention_splitfuse"
    q_lens = _lengths(name, "seq_len", seq_len, block_table.size(0))
    _paged_attention(name, query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                     context_lens, out, q_lens=q_lens, bias_of=_spec_mask(name, mask, q_lens))


@_atb_op("_npu_paged_attention_splitfuse_v2(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
         "Tensor context_lens, Tensor mask, Tensor seq_len, int num_kv_heads, int num_heads, float scale_value, *, "
         "int ? mask_type = 5, Tensor(a!) out) -> ()")
def _npu_paged_attention_splitfuse_v2(query, key_cache, value_cache, block_table, context_lens, mask, seq_len,
                                      num_kv_heads, num_heads, scale_value, *, mask_type=5, out):
    """_npu_paged_attention_splitfuse under a causal mask given compressed
    (MASK_TYPE_NORM_COMPRESS; the simulator builds the mask itself)."""
    mask_type = _PA_NORM_COMPRESS if mask_type is None else mask_type
    _check(mask_type == _PA_NORM_COMPRESS, f"_npu_paged_attention_splitfuse_v2: mask_type only supports "
                                           f"MASK_TYPE_NORM_COMPRESS(5), but got: {mask_type}")
    _paged_attention("_npu_paged_attention_splitfuse_v2", query, key_cache, value_cache, num_kv_heads, num_heads,
                     scale_value, block_table, context_lens, out, q_lens=seq_len, bias_of=_causal(query.device))


# ATB's quantType codes of the int8 paged attention, and the aclDataType codes of its output
_QUANT_QKV_OFFLINE, _QUANT_QKV_ONLINE = 2, 3
_ACL_DTYPES = {1: torch.float16, 27: torch.bfloat16}


@_atb_op("_npu_paged_attention_quant(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
         "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, int quant_type, "
         "int outdata_type, Tensor k_descale, Tensor v_descale, Tensor(a!) out) -> ()")
def _npu_paged_attention_quant(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                               context_lens, quant_type, outdata_type, k_descale, v_descale, out):
    """Decoding attention of int8 queries over int8 paged caches: query head h's scores
    q . k are dequantized by k_descale[h], its output P . v by v_descale[h] (k_descale and
    v_descale [num_heads]). The kernel requantizes the softmax P to int8; the simulator keeps
    it in float32."""
    name = "_npu_paged_attention_quant"
    _check(quant_type in (_QUANT_QKV_OFFLINE, _QUANT_QKV_ONLINE),
           f"{name}: quant_type must be 2 (TYPE_QUANT_QKV_OFFLINE) or 3 (TYPE_QUANT_QKV_ONLINE), got {quant_type}")
    _check(_ACL_DTYPES.get(outdata_type) == out.dtype,
           f"{name}: outdata_type must be the ACL code of out's dtype {out.dtype} (1: float16, 27: bfloat16), "
           f"got {outdata_type}")
    _check(k_descale.numel() == num_heads and v_descale.numel() == num_heads,
           f"{name}: k_descale and v_descale must hold one scale per head ({num_heads}), got "
           f"{k_descale.numel()} and {v_descale.numel()}")
    query = _split_heads(name, "query", query, num_heads)
    per_head = (1, num_heads, 1)
    result = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    _paged_attention(name, query.float() * k_descale.float().reshape(per_head), key_cache.float(),
                     value_cache.float(), num_kv_heads, num_heads, scale_value, block_table, context_lens, result)
    out.copy_((result.view(query.size(0), num_heads, -1) * v_descale.float().reshape(per_head)).view(out.shape))


# ---- multi-head latent attention ------------------------------------------------------------------

_MLA_MASKS = {"undefined": 0, "mask_type_spec": 1, "mask_type_free": 2}
_MLA_CALCS = {"calc_type_undefined": 0, "calc_type_spec": 1, "calc_type_ring": 2}
_MLA_CACHES = {"krope_ctkv": 1, "int8_nzcache": 2, "nzcache": 3}


def _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, mask, qseqlen,
         qk_descale, pv_descale, mask_type, calc_type, cache_mode, output, lse, always_lse=False):
    """Paged attention of MLA: the query is [q_nope, q_rope] and the keys [ctkv, k_rope] (paged
    caches, ND for cache_mode 'krope_ctkv', FRACTAL_NZ [blocks, hidden / c0, block_size, c0]
    for 'nzcache' and 'int8_nzcache'); the values are ctkv. With 'int8_nzcache', q_nope and
    ctkv are int8: query head h's q_nope . ctkv is dequantized by qk_descale[h], its output by
    pv_descale[h]. Each sequence has one query (decoding) or qseqlen[b] ones; mask_type
    'mask_type_spec' applies mask (rows of all queries, [tokens, S], or in full),
    'mask_type_free' a causal mask. calc_type 'calc_type_ring' (or always_lse) also writes
    lse [tokens, H, 1]."""
    name = "npu_multi_head_latent_attention"
    mask_code = _mode(_MLA_MASKS, mask_type, "undefined", "mask_type")
    calc = _mode(_MLA_CALCS, calc_type, "calc_type_undefined", "calc_type")
    cache = _mode(_MLA_CACHES, cache_mode, "krope_ctkv", "cache_mode")
    q = q_nope.float()
    if cache == _MLA_CACHES["int8_nzcache"]:
        _check(qk_descale is not None and pv_descale is not None,
               f"{name}: cache_mode 'int8_nzcache' needs qk_descale and pv_descale")
        q = q * qk_descale.float().reshape(1, -1, 1)
    nz = cache != _MLA_CACHES["krope_ctkv"]
    ctkv = _nd_cache(name, "ctkv", ctkv, kv_headnum, nz)
    k_rope = _nd_cache(name, "k_rope", k_rope, kv_headnum, nz)
    q_lens = None if qseqlen is None else list(qseqlen)
    if q_lens is None and calc == _MLA_CALCS["calc_type_spec"]:
        raise RuntimeError(f"{name}: calc_type 'calc_type_spec' needs qseqlen")
    bias_of = None
    if mask_code == _MLA_MASKS["mask_type_spec"]:
        bias_of = _spec_mask(name, mask, q_lens or [1] * block_tables.size(0))
    elif mask_code == _MLA_MASKS["mask_type_free"]:
        bias_of = _causal(q_nope.device)
    keys = torch.cat([ctkv.float(), k_rope.float()], -1)
    result = torch.empty(output.shape, dtype=torch.float32, device=output.device)
    ring = always_lse or calc == _MLA_CALCS["calc_type_ring"]
    lse_rows = lse.view(lse.size(0), -1) if ring and lse is not None else None
    _paged_attention(name, torch.cat([q, q_rope.float()], -1), keys, ctkv.float(), kv_headnum, q_headnum, qk_scale,
                     block_tables, context_lens, result, q_lens=q_lens, bias_of=bias_of, lse=lse_rows)
    if cache == _MLA_CACHES["int8_nzcache"]:
        result = result.view(result.size(0), q_headnum, -1) * pv_descale.float().reshape(1, -1, 1)
    output.copy_(result.view(output.shape))
    return output, lse


_MLA_SCHEMA = ("(Tensor q_nope, Tensor q_rope, Tensor ctkv, Tensor k_rope, Tensor block_tables, SymInt[] context_lens, "
               "int q_headnum, float qk_scale, int kv_headnum, {lse}*, Tensor? mask=None, SymInt[]? qseqlen=None, "
               "Tensor? qk_descale=None, Tensor? pv_descale=None, str? mask_type=None, str? calc_type=None, "
               "str? cache_mode=None{extra}) -> {returns}")


def _mla_outputs(q_nope, q_rope, calc_type):
    """The output [tokens, H, 512] (q_rope's dtype) and, for calc_type 'calc_type_ring', lse."""
    output = q_nope.new_empty(q_nope.shape, dtype=q_rope.dtype)
    ring = _mode(_MLA_CALCS, calc_type, "calc_type_undefined", "calc_type") == _MLA_CALCS["calc_type_ring"]
    return output, q_nope.new_empty((q_nope.size(0), q_nope.size(1), 1), dtype=q_rope.dtype) if ring else None


@_atb_op("npu_multi_head_latent_attention" + _MLA_SCHEMA.format(lse="", extra="", returns="Tensor"),
         module_level=False)
def _npu_multi_head_latent_attention(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale,
                                     kv_headnum, *, mask=None, qseqlen=None, qk_descale=None, pv_descale=None,
                                     mask_type=None, calc_type=None, cache_mode=None):
    """MLA paged attention (see _mla); returns the output [tokens, heads, 512]."""
    output, lse = _mla_outputs(q_nope, q_rope, calc_type)
    return _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, mask,
                qseqlen, qk_descale, pv_descale, mask_type, calc_type, cache_mode, output, lse)[0]


@_atb_op("npu_multi_head_latent_attention.out" + _MLA_SCHEMA.format(lse="", extra=", Tensor(a!) output",
                                                                     returns="Tensor(a!)"), module_level=False)
def _npu_multi_head_latent_attention_out(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum,
                                         qk_scale, kv_headnum, *, mask=None, qseqlen=None, qk_descale=None,
                                         pv_descale=None, mask_type=None, calc_type=None, cache_mode=None, output):
    return _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, mask,
                qseqlen, qk_descale, pv_descale, mask_type, calc_type, cache_mode, output, None)[0]


@_atb_op("npu_multi_head_latent_attention.lse" + _MLA_SCHEMA.format(
    lse="bool return_lse, ", extra=", Tensor? workspace=None", returns="(Tensor, Tensor)"), module_level=False)
def _npu_multi_head_latent_attention_lse(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum,
                                         qk_scale, kv_headnum, return_lse, *, mask=None, qseqlen=None,
                                         qk_descale=None, pv_descale=None, mask_type=None, calc_type=None,
                                         cache_mode=None, workspace=None):
    """MLA paged attention returning (output, lse): lse [tokens, heads, 1] is the log-sum-exp
    of each query's scaled scores (None without return_lse). ATB computes it for calc_type
    'calc_type_ring' (torch_npu's eager call returns None for the others, its shape function a
    tensor); the simulator always does. The workspace is not needed."""
    output = q_nope.new_empty(q_nope.shape, dtype=q_rope.dtype)
    lse = q_nope.new_empty((q_nope.size(0), q_nope.size(1), 1), dtype=q_rope.dtype)
    _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, mask, qseqlen,
         qk_descale, pv_descale, mask_type, calc_type, cache_mode, output, lse, always_lse=True)
    return output, lse if return_lse else None


@_atb_op("npu_multi_head_latent_attention.lse_out" + _MLA_SCHEMA.format(
    lse="bool return_lse, ", extra=", Tensor? workspace=None, Tensor(a!) output, Tensor(b!) lse",
    returns="(Tensor(a!), Tensor(b!))"), module_level=False)
def _npu_multi_head_latent_attention_lse_out(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum,
                                             qk_scale, kv_headnum, return_lse, *, mask=None, qseqlen=None,
                                             qk_descale=None, pv_descale=None, mask_type=None, calc_type=None,
                                             cache_mode=None, workspace=None, output, lse):
    return _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, mask,
                qseqlen, qk_descale, pv_descale, mask_type, calc_type, cache_mode, output, lse)


@_atb_op("_npu_multi_head_latent_attention_get_workspace.lse" + _MLA_SCHEMA.format(
    lse="bool return_lse, ", extra="", returns="Tensor"), module_level=False)
def _npu_multi_head_latent_attention_get_workspace(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens,
                                                   q_headnum, qk_scale, kv_headnum, return_lse, *, mask=None,
                                                   qseqlen=None, qk_descale=None, pv_descale=None, mask_type=None,
                                                   calc_type=None, cache_mode=None):
    return _workspace(q_nope)


_RING_KERNELS = {"kernel_type_default": 0, "kernel_type_high_precision": 1}
_RING_MASKS = {"no_mask": 0, "mask_type_triu": 1}
_RING_LAYOUTS = {"type_bsnd": 0}
_RING_CALCS = {"calc_type_default": 0, "calc_type_first_ring": 1}


def _ring_mla(q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, head_num, kv_head_num, pre_out, prev_lse,
              qk_scale, kernel_type, mask_type, input_layout, calc_type, output, softmax_lse):
    """One step of ring attention for MLA: the query [q_nope, q_rope] attends to the keys
    [k_nope, k_rope] and value of this chunk (sequences one after the other; seqlen [batch]
    lengths shared by queries and keys, or [2, batch]: query lengths, key lengths), under a
    causal mask for mask_type 'mask_type_triu' (query i sees keys 0..i; mask is ATB's
    compressed one, the simulator builds the mask itself). softmax_lse [H, q_tokens] gets the log-sum-exp of the scores;
    calc_type 'calc_type_default' merges the result with the previous chunks' pre_out and
    prev_lse, 'calc_type_first_ring' starts the ring. A sequence without keys gets zeros."""
    name = "npu_ring_mla"
    _mode(_RING_KERNELS, kernel_type, "kernel_type_high_precision", "kernel_type")
    triu = _mode(_RING_MASKS, mask_type, "no_mask", "mask_type") == _RING_MASKS["mask_type_triu"]
    _mode(_RING_LAYOUTS, input_layout, "type_bsnd", "input_layout")
    merge = _mode(_RING_CALCS, calc_type, "calc_type_first_ring", "calc_type") == _RING_CALCS["calc_type_default"]
    _check(seqlen.device.type == "cpu",
           "Expected CPU tensor, please check whether the input seqlen tensor device is correct.")
    _check(seqlen.dim() in (1, 2), f"{name}: seqlen must be [batch] or [2, batch], got {list(seqlen.shape)}")
    q_lens, kv_lens = (seqlen.tolist(),) * 2 if seqlen.dim() == 1 else seqlen.tolist()
    _check_lens(name, q_lens, kv_lens)
    query = torch.cat([q_nope, q_rope], -1)
    key = torch.cat([k_nope, k_rope], -1)
    _check_heads(name, head_num, kv_head_num, query.size(1), key.size(1))
    tokens = query.size(0)
    _check(sum(q_lens) == tokens and sum(kv_lens) <= key.size(0),
           f"{name}: seqlen {seqlen.tolist()} does not match {tokens} query and {key.size(0)} key tokens")
    out = torch.empty(tokens, head_num, value.size(-1), dtype=torch.float32, device=query.device)
    lse = torch.empty(tokens, head_num, dtype=torch.float32, device=query.device)
    _varlen_attention(query, _packed_kv(key, value, kv_lens), q_lens, kv_lens, qk_scale,
                      _causal(query.device, top_left=True) if triu else None, out, lse)
    if merge:
        _check(pre_out is not None and prev_lse is not None,
               f"{name}: calc_type 'calc_type_default' needs pre_out and prev_lse")
        old_lse = prev_lse.float().t()
        new_lse = torch.logaddexp(old_lse, lse)
        merged = (pre_out.float() * (old_lse - new_lse).exp()[..., None]
                  + out * (lse - new_lse).exp()[..., None])
        keyless = torch.repeat_interleave(torch.tensor([n == 0 for n in kv_lens], device=query.device),
                                          torch.tensor(q_lens, device=query.device))
        out = merged.masked_fill(keyless[:, None, None], 0)
        lse = new_lse.masked_fill(keyless[:, None], 0)
    output.copy_(out)
    softmax_lse.copy_(lse.t())
    return output, softmax_lse


_RING_SCHEMA = ("(Tensor q_nope, Tensor q_rope, Tensor k_nope, Tensor k_rope, Tensor value, Tensor mask, "
                "Tensor seqlen, int head_num, int kv_head_num, *, Tensor? pre_out=None, Tensor? prev_lse=None, "
                "float qk_scale=1, str? kernel_type=None, str? mask_type=None, str? input_layout=None, "
                "str? calc_type=None{extra}) -> {returns}")


@_atb_op("npu_ring_mla" + _RING_SCHEMA.format(extra="", returns="(Tensor, Tensor)"), module_level=False)
def _npu_ring_mla(q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, head_num, kv_head_num, *, pre_out=None,
                  prev_lse=None, qk_scale=1.0, kernel_type=None, mask_type=None, input_layout=None, calc_type=None):
    """Ring attention step of MLA (see _ring_mla); returns (output [q_tokens, heads, head_size_v],
    softmax_lse [heads, q_tokens] float32)."""
    output = q_nope.new_empty((q_nope.size(0), head_num, value.size(-1)))
    softmax_lse = q_nope.new_empty((head_num, q_nope.size(0)), dtype=torch.float32)
    return _ring_mla(q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, head_num, kv_head_num, pre_out, prev_lse,
                     qk_scale, kernel_type, mask_type, input_layout, calc_type, output, softmax_lse)


@_atb_op("npu_ring_mla.out" + _RING_SCHEMA.format(extra=", Tensor(a!) output, Tensor(b!) softmax_lse",
                                                  returns="(Tensor(a!), Tensor(b!))"), module_level=False)
def _npu_ring_mla_out(q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, head_num, kv_head_num, *, pre_out=None,
                      prev_lse=None, qk_scale=1.0, kernel_type=None, mask_type=None, input_layout=None,
                      calc_type=None, output, softmax_lse):
    return _ring_mla(q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, head_num, kv_head_num, pre_out, prev_lse,
                     qk_scale, kernel_type, mask_type, input_layout, calc_type, output, softmax_lse)


# ---- MoE routing ----------------------------------------------------------------------------------

def _keep_top_groups(name, scores, group_num, k, n):
    """scores [tokens, experts] with the experts outside the k groups of highest score zeroed: the
    experts form group_num consecutive groups, a group scores the sum of its n highest values;
    ties go to the lower group."""
    _check(scores.dim() == 2, f"{name}: the scores must be [tokens, experts], got {list(scores.shape)}")
    tokens, experts = scores.shape
    _check(group_num > 0 and experts % group_num == 0,
           f"{name}: group_num ({group_num}) must divide the expert count ({experts})")
    _check(0 <= k <= group_num, f"{name}: k ({k}) must be in [0, group_num ({group_num})]")
    _check(1 <= n <= experts // group_num,
           f"{name}: n ({n}) must be in [1, experts per group ({experts // group_num})]")
    groups = scores.reshape(tokens, group_num, -1)
    order = torch.sort(groups.topk(n, dim=-1).values.sum(-1), dim=-1, descending=True, stable=True).indices
    dropped = torch.ones(tokens, group_num, dtype=torch.bool, device=scores.device).scatter_(1, order[:, :k], False)
    return groups.masked_fill(dropped[..., None], 0).reshape(tokens, experts)


@_atb_op("_npu_group_topk(Tensor self, int k=0, int group_num=1, int n=1) -> ()")
def _npu_group_topk(self, k=0, group_num=1, n=1):
    """In place on self [tokens, experts]: the experts outside the k best of group_num groups
    become 0 (a group's score is the sum of its n highest values)."""
    self.copy_(_keep_top_groups("_npu_group_topk", self.float(), group_num, k, n))


def _fused_add_topk_div(x, add_num, mapping_num, mapping_table, activation_type, group_num, group_topk, n, k, is_norm,
                        scale, enable_expert_mapping, y, indices):
    """DeepSeek's MoE routing: scores = sigmoid(x) + add_num ([tokens, experts] + [experts]);
    the experts outside the group_topk best of group_num groups (see _keep_top_groups) are
    zeroed, and the k highest scores are the chosen experts (ties: lower index first). y [tokens,
    k] float32 gets their sigmoid(x) (is_norm: divided by their sum, times scale), indices
    int32 their ids; with enable_expert_mapping, expert e of token t becomes the logical
    expert mapping_table[e, t % mapping_num[e]]."""
    name = "npu_fused_add_topk_div"
    _mode({"activation_sigmoid": 8}, activation_type, "activation_sigmoid", "activation_type")
    _check(x.dim() == 2 and add_num.shape == (x.size(1),),
           f"{name}: x must be [tokens, experts] and add_num [experts], got {list(x.shape)} and {list(add_num.shape)}")
    _check(0 < k <= x.size(1), f"{name}: k ({k}) must be in [1, experts ({x.size(1)})]")
    weights = torch.sigmoid(x.float())
    scores = _keep_top_groups(name, weights + add_num.float(), group_num, group_topk, n)
    chosen = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    picked = weights.gather(1, chosen)
    if is_norm:
        picked = picked / picked.sum(-1, keepdim=True) * scale
    if enable_expert_mapping:
        _check(mapping_num is not None and mapping_table is not None,
               f"{name}: enable_expert_mapping needs mapping_num and mapping_table")
        copies = mapping_num.long()[chosen].clamp(min=1)
        token = torch.arange(x.size(0), device=x.device)[:, None]
        chosen = mapping_table.long()[chosen, token % copies]
    y.copy_(picked)
    indices.copy_(chosen)
    return y, indices


_TOPK_DIV_SCHEMA = ("(Tensor x, Tensor add_num, *, Tensor? mapping_num=None, Tensor? mapping_table=None, "
                    "str? activation_type=None, int group_num=1, int group_topk=1, int n=1, int k=1, "
                    "bool is_norm=True, float scale=1, bool enable_expert_mapping=False{extra}) -> {returns}")


@_atb_op("npu_fused_add_topk_div" + _TOPK_DIV_SCHEMA.format(extra="", returns="(Tensor, Tensor)"), module_level=False)
def _npu_fused_add_topk_div(x, add_num, *, mapping_num=None, mapping_table=None, activation_type=None, group_num=1,
                            group_topk=1, n=1, k=1, is_norm=True, scale=1.0, enable_expert_mapping=False):
    """MoE routing (see _fused_add_topk_div); returns (y [tokens, k] float32, indices int32)."""
    y = x.new_empty((x.size(0), k), dtype=torch.float32)
    indices = x.new_empty((x.size(0), k), dtype=torch.int32)
    return _fused_add_topk_div(x, add_num, mapping_num, mapping_table, activation_type, group_num, group_topk, n, k,
                               is_norm, scale, enable_expert_mapping, y, indices)


@_atb_op("npu_fused_add_topk_div.out" + _TOPK_DIV_SCHEMA.format(extra=", Tensor(a!) y, Tensor(b!) indices",
                                                                returns="(Tensor(a!), Tensor(b!))"),
         module_level=False)
def _npu_fused_add_topk_div_out(x, add_num, *, mapping_num=None, mapping_table=None, activation_type=None,
                                group_num=1, group_topk=1, n=1, k=1, is_norm=True, scale=1.0,
                                enable_expert_mapping=False, y, indices):
    return _fused_add_topk_div(x, add_num, mapping_num, mapping_table, activation_type, group_num, group_topk, n, k,
                               is_norm, scale, enable_expert_mapping, y, indices)


def _make_atb_module(package):
    """``torch_npu.atb``: a module made here, as op-plugin makes it (``types.ModuleType`` in
    sys.modules, not a file of the package), holding the ATB_NAMES operators."""
    import sys
    import types

    module = types.ModuleType("torch_npu.atb", "op-plugin's newer ATB operators (torch.ops.atb.*) by name.")
    for name in ATB_NAMES:
        setattr(module, name, getattr(torch.ops.atb, name))
    sys.modules["torch_npu.atb"] = module
    package.atb = module
    return module
