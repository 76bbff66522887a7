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


def _atb_op(schema: str, module_level: bool = True):
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
        _op(schema, _lib)(checked)
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


def _attention(q, k, v, scale, mask=None):
    """Softmax attention in float32 with grouped KV heads: q [Sq, H, D], k [Skv, KVH, D],
    v [Skv, KVH, Dv] (H a multiple of KVH, query head h reads KV head h // (H / KVH)); mask
    is added to the scaled scores [H, Sq, Skv] (broadcast). Returns [Sq, H, Dv] float32."""
    group = q.size(1) // k.size(1)
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if mask is not None:
        scores = scores + mask.float()
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)


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


def _paged_decode(name, query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                  context_lens, out):
    """Decoding attention over paged caches: query [B, H, D] (one token per sequence),
    key_cache [blocks, block_size, KVH, D], value_cache [blocks, block_size, KVH, Dv];
    sequence b attends to its first context_lens[b] cached tokens, whose blocks are
    block_table[b]. Writes out [B, H, Dv]."""
    _check(query.dim() == 3 and key_cache.dim() == 4 and value_cache.dim() == 4,
           f"{name}: query must be [tokens, heads, head_size] and the caches [blocks, block_size, kv_heads, "
           f"head_size], got {list(query.shape)}, {list(key_cache.shape)} and {list(value_cache.shape)}")
    _check_heads(name, num_heads, num_kv_heads, query.size(1), key_cache.size(2))
    batch = query.size(0)
    lens = _lengths(name, "context_lens", context_lens, batch)
    _check(block_table.dim() == 2 and block_table.size(0) == batch,
           f"{name}: block_table must be [{batch}, max_blocks], got {list(block_table.shape)}")
    _check(out.shape == (batch, num_heads, value_cache.size(-1)),
           f"{name}: out must be [{batch}, {num_heads}, {value_cache.size(-1)}], got {list(out.shape)}")
    for b, n in enumerate(lens):
        if n <= 0:
            out[b] = 0
            continue
        k = _gather_paged(key_cache, block_table[b], n)
        v = _gather_paged(value_cache, block_table[b], n)
        out[b] = _attention(query[b:b + 1], k, v, scale_value)[0].to(out.dtype)


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
    return torch.ops.npu.get_npu_format(cache) == 29  # FRACTAL_NZ


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

@_atb_op("_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, int num_heads, "
         "float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out, *, Tensor? workspace=None) -> ()")
def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out, *, workspace=None):
    """Decoding attention over paged KV caches (see _paged_decode); workspace is not needed."""
    _paged_decode("_npu_paged_attention", query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                  block_table, context_lens, out)


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
    _paged_decode(name, query, key_cache, key_cache[..., :mla_vheadsize], num_kv_heads, num_heads, scale_value,
                  block_table, context_lens, out)


# ---- self attention ------------------------------------------------------------------------------

def _unpad_attention(name, query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out):
    """Self attention of unpadded sequences: query [tokens, H, D], key [tokens, KVH, D] and
    value [tokens, KVH, Dv] hold the sequences one after the other (seq_len [B] tokens each);
    each token attends to every token of its sequence. Writes out [tokens, H, Dv]."""
    _check(query.dim() == 3 and key.dim() == 3 and value.dim() == 3,
           f"{name}: query, key and value must be [tokens, heads, head_size], got {list(query.shape)}, "
           f"{list(key.shape)} and {list(value.shape)}")
    _check_heads(name, num_heads, num_kv_heads, query.size(1), key.size(1))
    lens = _lengths(name, "seq_len", seq_len, seq_len.numel() if isinstance(seq_len, torch.Tensor) else len(seq_len))
    _check(sum(lens) <= query.size(0) and sum(lens) <= key.size(0),
           f"{name}: seq_len sums to {sum(lens)} tokens, more than query ({query.size(0)}) or key ({key.size(0)}) hold")
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        out[rows] = _attention(query[rows], key[rows], value[rows], scale_value).to(out.dtype)
        start += n


@_atb_op("_npu_flash_attention_unpad(Tensor query, Tensor key, Tensor value, Tensor seq_len, float scale_value, "
         "int num_heads, int num_kv_heads, Tensor(a!) out) -> ()")
def _npu_flash_attention_unpad(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out):
    """Self attention of unpadded sequences without a mask (see _unpad_attention)."""
    _unpad_attention("_npu_flash_attention_unpad", query, key, value, seq_len, scale_value, num_heads, num_kv_heads,
                     out)


@_atb_op("_npu_flash_attention_unpad_v2(Tensor query, Tensor key, Tensor value, Tensor seq_len, float scale_value, "
         "int num_heads, int num_kv_heads, *, int ? kernel_type = 0, Tensor(a!) out) -> ()")
def _npu_flash_attention_unpad_v2(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, *,
                                  kernel_type=0, out):
    """_npu_flash_attention_unpad; kernel_type picks ATB's kernel precision (0 default, 2
    EXP_M8V2), which the simulator's float32 computation does not need."""
    _check(kernel_type in (None, 0, 2), f"_npu_flash_attention_unpad_v2: kernel_type only supports "
                                        f"KERNELTYPE_DEFAULT(0) and KERNELTYPE_EXP_M8V2(2), but got: {kernel_type}")
    _unpad_attention("_npu_flash_attention_unpad_v2", query, key, value, seq_len, scale_value, num_heads,
                     num_kv_heads, out)
