"""npu_prompt_flash_attention, npu_incre_flash_attention and npu_fused_infer_attention_score
against a plain PyTorch reference.

The reference computes softmax(scale * Q K^T + pse_shift, masked) V and the row
log-sum-exp in float64 on the CPU in BNSD, with GQA by repeating key/value heads and
the sparse modes' masks built from torch.triu/tril as torch_npu's documentation
describes them. Rows that see no key give 0 (and lse -inf).
"""
import math

import pytest
import torch
import torch_npu

PFA = torch_npu.npu_prompt_flash_attention
IFA = torch_npu.npu_incre_flash_attention
FIA = torch_npu.npu_fused_infer_attention_score
TOKENS = 2147483647
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


# ---- layouts and reference ------------------------------------------------------------------
def to_layout(x, layout):
    """[B, N, S, D] -> BSH, BSND or BNSD."""
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.permute(0, 2, 1, 3).reshape(b, s, n * d).contiguous()
    if layout == "BSND":
        return x.permute(0, 2, 1, 3).contiguous()
    return x.contiguous()


def from_layout(x, layout, n):
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, n, h // n).permute(0, 2, 1, 3)
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    return x


def reference(q, k, v, scale, masked=None, pse=None):
    """q [B, N, S1, D], k/v [B, Nkv, S2, D] (float64): out [B, N, S1, Dv], lse [B, N, S1].
    `masked` (True = not attended) broadcasts to [B, N, S1, S2]."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if pse is not None:
        s = s + pse
    if masked is not None:
        s = s.masked_fill(masked, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.where(torch.isfinite(lse), torch.exp(s - lse), torch.zeros_like(s))
    return p @ v, lse.squeeze(-1)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def npu(*xs):
    return [x.npu() for x in xs]


def band(sq, skv, pre, nxt, shift=0):
    """True outside the band [i + shift - pre, i + shift + nxt]."""
    ones = torch.ones(sq, skv, dtype=torch.bool)
    return torch.triu(ones, nxt + 1 + shift) | torch.tril(ones, -pre - 1 + shift)


def check(out, ref, dtype=torch.float32):
    torch.testing.assert_close(out.cpu().double(), ref.double(), **TOL[dtype])


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


# ---- npu_prompt_flash_attention -------------------------------------------------------------
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
@pytest.mark.parametrize("nkv", [4, 2, 1])
def test_pfa_layouts_and_gqa(layout, nkv):
    B, N, S1, S2, D = 2, 4, 70, 150, 32
    q, k, v = rand(B, N, S1, D), rand(B, nkv, S2, D), rand(B, nkv, S2, D)
    scale = 1 / math.sqrt(D)
    out = PFA(*npu(to_layout(q, layout), to_layout(k, layout), to_layout(v, layout)), num_heads=N,
              num_key_value_heads=nkv if nkv != N else 0, scale_value=scale, input_layout=layout)
    ref, _ = reference(q, k, v, scale)
    assert out.shape == to_layout(q, layout).shape and out.dtype == torch.float32
    check(from_layout(out.cpu(), layout, N), ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pfa_half_types(dtype):
    B, N, S, D = 1, 2, 100, 64
    q, k, v = rand(B, N, S, D, dtype=dtype), rand(B, N, S, D, dtype=dtype), rand(B, N, S, D, dtype=dtype)
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    out = PFA(*npu(q, k, v, mask)[:3], atten_mask=mask.npu(), num_heads=N, scale_value=0.125, input_layout="BNSD")
    assert out.dtype == dtype
    ref, _ = reference(q.double(), k.double(), v.double(), 0.125, mask)
    check(out, ref, dtype)


def test_pfa_default_mask_uses_next_tokens():
    # sparse_mode 0 with a mask: the mask and the band [i - pre_tokens, i + next_tokens]
    # (next_tokens defaults to 0 for PFA: causal from the top left).
    B, N, S1, S2, D = 2, 2, 40, 56, 16
    q, k, v = rand(B, N, S1, D), rand(B, N, S2, D), rand(B, N, S2, D)
    mask = torch.rand(B, 1, S1, S2) < 0.2
    for pre, nxt in [(TOKENS, 0), (5, 3), (TOKENS, TOKENS), (0, 0)]:
        out = PFA(*npu(q, k, v), atten_mask=mask.npu(), num_heads=N, scale_value=0.3, pre_tokens=pre,
                  next_tokens=nxt, input_layout="BNSD")
        ref, _ = reference(q, k, v, 0.3, mask | band(S1, S2, min(pre, 10**6), min(nxt, 10**6)))
        check(out, ref)
    # without a mask nothing is masked, whatever pre/next_tokens say
    out = PFA(*npu(q, k, v), num_heads=N, scale_value=0.3, pre_tokens=1, next_tokens=0, input_layout="BNSD")
    check(out, reference(q, k, v, 0.3)[0])


@pytest.mark.parametrize("mode", [1, 2, 3, 4])
def test_pfa_sparse_modes(mode):
    B, N, S1, S2, D = 2, 2, 48, 80, 16
    q, k, v = rand(B, N, S1, D), rand(B, N, S2, D), rand(B, N, S2, D)
    pre, nxt = 20, 4
    if mode == 1:
        mask = torch.rand(S1, S2) < 0.3
        masked = mask
    else:
        mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)  # the compressed mask
        shift = S2 - S1
        masked = {2: band(S1, S2, 10**6, 0), 3: band(S1, S2, 10**6, 0, shift), 4: band(S1, S2, pre, nxt, shift)}[mode]
    out = PFA(*npu(q, k, v), atten_mask=mask.npu(), num_heads=N, scale_value=0.25, pre_tokens=pre, next_tokens=nxt,
              input_layout="BNSD", sparse_mode=mode)
    check(out, reference(q, k, v, 0.25, masked)[0])


def test_pfa_actual_seq_lengths():
    B, N, S1, S2, D = 3, 2, 30, 50, 16
    q, k, v = rand(B, N, S1, D), rand(B, N, S2, D), rand(B, N, S2, D)
    qlen, kvlen = [30, 12, 0], [50, 7, 20]
    mask = torch.triu(torch.ones(S1, S2, dtype=torch.bool), 1)
    out = PFA(*npu(to_layout(q, "BSH"), to_layout(k, "BSH"), to_layout(v, "BSH")), atten_mask=mask.npu(),
              actual_seq_lengths=qlen, actual_seq_lengths_kv=kvlen, num_heads=N, scale_value=0.2,
              next_tokens=TOKENS)
    out = from_layout(out.cpu(), "BSH", N)
    for b in range(B):
        sq, skv = qlen[b], kvlen[b]
        ref, _ = reference(q[b:b + 1, :, :sq], k[b:b + 1, :, :skv], v[b:b + 1, :, :skv], 0.2, mask[:sq, :skv])
        check(out[b:b + 1, :, :sq], ref)
        assert torch.all(out[b, :, sq:] == 0)  # rows past the batch's length stay zero


def test_pfa_bnsd_bsnd_and_tnd():
    B, N, S, D = 2, 4, 33, 16
    q, k, v = rand(B, N, S, D), rand(B, N, S, D), rand(B, N, S, D)
    out = PFA(*npu(q, k, v), num_heads=N, scale_value=0.5, input_layout="BNSD_BSND")
    assert out.shape == (B, S, N, D)
    check(out.permute(0, 2, 1, 3), reference(q, k, v, 0.5)[0])

    # TND: ragged batches, cumulative lengths, causal (right-down) per batch
    lens_q, lens_kv = [5, 17, 9], [8, 17, 30]
    qs = [rand(1, N, s, D) for s in lens_q]
    ks, vs = [rand(1, 2, s, D) for s in lens_kv], [rand(1, 2, s, D) for s in lens_kv]
    tnd = lambda xs: torch.cat([x[0].permute(1, 0, 2) for x in xs])  # noqa: E731
    cum = lambda ls: [sum(ls[:i + 1]) for i in range(len(ls))]  # noqa: E731
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out = PFA(*npu(tnd(qs), tnd(ks), tnd(vs)), atten_mask=mask.npu(), actual_seq_lengths=cum(lens_q),
              actual_seq_lengths_kv=cum(lens_kv), num_heads=N, num_key_value_heads=2, scale_value=0.25,
              input_layout="TND", sparse_mode=3)
    assert out.shape == (sum(lens_q), N, D)
    refs = [reference(qb, kb, vb, 0.25, band(qb.shape[2], kb.shape[2], 10**6, 0, kb.shape[2] - qb.shape[2]))[0]
            for qb, kb, vb in zip(qs, ks, vs)]
    check(out, tnd(refs))


def test_pfa_pse_shift_added_after_scaling():
    B, N, S1, S2, D = 2, 2, 20, 24, 8
    q, k, v = rand(B, N, S1, D), rand(B, N, S2, D), rand(B, N, S2, D)
    pse = rand(1, N, S1, S2)
    out = PFA(*npu(q, k, v), pse_shift=pse.npu(), num_heads=N, scale_value=0.5, input_layout="BNSD")
    check(out, reference(q, k, v, 0.5, pse=pse)[0])


def test_pfa_extra_memory_is_linear_in_s():
    # S x S float scores would be 16 MiB; the blockwise kernel needs O(S * D) per thread
    # (one kv head's keys and values, packed) and query-block tiles.
    import os
    S, D = 2048, 64
    q, k, v = npu(rand(1, 1, S, D), rand(1, 1, S, D), rand(1, 1, S, D))
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1).npu()
    torch.npu.synchronize()
    torch.npu.reset_peak_memory_stats()
    base = torch.npu.memory_allocated()
    out = PFA(q, k, v, atten_mask=mask, num_heads=1, scale_value=0.125, input_layout="BNSD", sparse_mode=2)
    torch.npu.synchronize()
    extra = torch.npu.max_memory_allocated() - base - out.numel() * out.element_size()
    assert extra <= (os.cpu_count() or 1) * 3 * S * D * 4 + (1 << 20), extra
    ref, _ = reference(q.cpu().double(), k.cpu().double(), v.cpu().double(), 0.125, band(S, S, 10**6, 0))
    check(out, ref)


# ---- npu_incre_flash_attention (decode) and paged KV ------------------------------------------
def paged(kv, block_size, num_blocks, layout3d=True):
    """kv [B, Nkv, S2, D] -> (cache, block_table): the blocks of each batch scattered over a
    shuffled pool; cache [blocks, block_size, Nkv * D] or [blocks, Nkv, block_size, D]."""
    B, nkv, s2, d = kv.shape
    per = -(-s2 // block_size)
    ids = torch.randperm(num_blocks)[:B * per].view(B, per).to(torch.int32)
    cache = torch.zeros(num_blocks, nkv, block_size, d, dtype=kv.dtype)
    for b in range(B):
        for j in range(per):
            chunk = kv[b, :, j * block_size:(j + 1) * block_size]
            cache[ids[b, j], :, :chunk.shape[1]] = chunk
    if layout3d:
        cache = cache.permute(0, 2, 1, 3).reshape(num_blocks, block_size, nkv * d)
    return cache.contiguous(), ids


@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
def test_ifa_layouts_gqa_lengths_mask(layout):
    B, N, nkv, S2, D = 3, 8, 2, 90, 32
    q, k, v = rand(B, N, 1, D), rand(B, nkv, S2, D), rand(B, nkv, S2, D)
    lens = [90, 41, 1]
    mask = torch.rand(B, S2) < 0.2
    mask[:, 0] = False
    out = IFA(*npu(to_layout(q, layout), to_layout(k, layout), to_layout(v, layout)), atten_mask=mask.npu(),
              actual_seq_lengths=lens, num_heads=N, num_key_value_heads=nkv, scale_value=0.2, input_layout=layout)
    assert out.shape == to_layout(q, layout).shape
    out = from_layout(out.cpu(), layout, N)
    for b in range(B):
        ref, _ = reference(q[b:b + 1], k[b:b + 1, :, :lens[b]], v[b:b + 1, :, :lens[b]], 0.2,
                           mask[b, :lens[b]])
        check(out[b:b + 1], ref)


@pytest.mark.parametrize("layout,cache3d", [("BSH", True), ("BNSD", True), ("BNSD", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ifa_paged_kv_equals_contiguous(layout, cache3d, dtype):
    B, N, nkv, S2, D, bs = 3, 4, 2, 100, 16, 16
    q, k, v = rand(B, N, 1, D, dtype=dtype), rand(B, nkv, S2, D, dtype=dtype), rand(B, nkv, S2, D, dtype=dtype)
    lens = [100, 37, 64]
    kc, table = paged(k, bs, 30, cache3d)
    vcache = torch.zeros_like(kc)  # value's cache, through key's (shuffled) block table
    per = table.shape[1]
    for b in range(B):
        for j in range(per):
            chunk = v[b, :, j * bs:(j + 1) * bs]
            if cache3d:
                vcache[table[b, j], :chunk.shape[1]] = chunk.permute(1, 0, 2).reshape(chunk.shape[1], nkv * D)
            else:
                vcache[table[b, j], :, :chunk.shape[1]] = chunk
    args = dict(num_heads=N, num_key_value_heads=nkv, scale_value=0.25, input_layout=layout)
    out_paged = IFA(*npu(to_layout(q, layout), kc, vcache), block_table=table.npu(), block_size=bs,
                    actual_seq_lengths=lens, **args)
    out_dense = IFA(*npu(to_layout(q, layout), to_layout(k, layout), to_layout(v, layout)),
                    actual_seq_lengths=lens, **args)
    torch.testing.assert_close(out_paged.cpu(), out_dense.cpu(), atol=0, rtol=0)
    out = from_layout(out_paged.cpu(), layout, N)
    for b in range(B):
        ref, _ = reference(q[b:b + 1].double(), k[b:b + 1, :, :lens[b]].double(), v[b:b + 1, :, :lens[b]].double(),
                           0.25)
        check(out[b:b + 1], ref, dtype)


def test_decode_matches_prefill_last_row():
    B, N, nkv, S, D = 2, 4, 2, 65, 32
    q, k, v = rand(B, N, S, D), rand(B, nkv, S, D), rand(B, nkv, S, D)
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    pre = PFA(*npu(q, k, v), atten_mask=mask.npu(), num_heads=N, num_key_value_heads=nkv, scale_value=0.1,
              input_layout="BNSD")
    dec = IFA(*npu(q[:, :, -1:], k, v), num_heads=N, num_key_value_heads=nkv, scale_value=0.1, input_layout="BNSD")
    torch.testing.assert_close(dec.cpu(), pre.cpu()[:, :, -1:], atol=1e-6, rtol=1e-6)
    fia, _ = FIA(*npu(q[:, :, -1:], k, v), num_heads=N, num_key_value_heads=nkv, scale=0.1, input_layout="BNSD")
    torch.testing.assert_close(fia.cpu(), dec.cpu(), atol=0, rtol=0)


# ---- npu_fused_infer_attention_score ------------------------------------------------------
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
def test_fia_prefill_with_lse(layout):
    B, N, nkv, S1, S2, D = 2, 4, 2, 37, 60, 16
    q, k, v = rand(B, N, S1, D), rand(B, nkv, S2, D), rand(B, nkv, S2, D)
    in_layout = layout.split("_")[0]
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out, lse = FIA(*npu(to_layout(q, in_layout), to_layout(k, in_layout), to_layout(v, in_layout)),
                   atten_mask=mask.npu(), num_heads=N, num_key_value_heads=nkv, scale=0.3, input_layout=layout,
                   sparse_mode=3, softmax_lse_flag=True)
    ref, ref_lse = reference(q, k, v, 0.3, band(S1, S2, 10**6, 0, S2 - S1))
    out_layout = layout.split("_")[-1]
    check(from_layout(out.cpu(), out_layout, N), ref)
    assert lse.shape == (B, N, S1, 1) and lse.dtype == torch.float32
    check(lse[..., 0], ref_lse)
    # the same as npu_prompt_flash_attention
    pfa = PFA(*npu(to_layout(q, in_layout), to_layout(k, in_layout), to_layout(v, in_layout)),
              atten_mask=mask.npu(), num_heads=N, num_key_value_heads=nkv, scale_value=0.3, input_layout=layout,
              sparse_mode=3)
    torch.testing.assert_close(pfa.cpu(), out.cpu(), atol=0, rtol=0)


def test_fia_lse_flag_off_and_dead_rows():
    B, N, S, D = 1, 2, 8, 8
    q, k, v = rand(B, N, S, D), rand(B, N, S, D), rand(B, N, S, D)
    out, lse = FIA(*npu(q, k, v), num_heads=N, input_layout="BNSD")
    assert lse.shape == (0,) and lse.dtype == torch.float32
    mask = torch.zeros(S, S, dtype=torch.bool)
    mask[3] = True  # row 3 sees nothing: 0 and lse -inf
    out, lse = FIA(*npu(q, k, v), atten_mask=mask.npu(), num_heads=N, input_layout="BNSD", sparse_mode=1,
                   softmax_lse_flag=True)
    ref, ref_lse = reference(q, k, v, 1.0, mask)
    check(out, ref)
    assert torch.all(out.cpu()[:, :, 3] == 0) and torch.all(lse.cpu()[:, :, 3] == -math.inf)
    check(lse[..., 0], ref_lse)


def test_fia_decode_paged_with_lse_and_prefill_paged():
    B, N, nkv, S2, D, bs = 2, 4, 1, 300, 32, 128
    q, k, v = rand(B, N, 1, D), rand(B, nkv, S2, D), rand(B, nkv, S2, D)
    lens = [300, 129]
    kc, table = paged(torch.cat([k, v], 1), bs, 8)  # key heads then value heads, one table
    kcache = kc[:, :, :nkv * D].contiguous()
    vcache = kc[:, :, nkv * D:].contiguous()
    out, lse = FIA(*npu(to_layout(q, "BSH"), kcache, vcache), block_table=table.npu(), block_size=bs,
                   actual_seq_lengths_kv=lens, num_heads=N, num_key_value_heads=nkv, scale=0.2, input_layout="BSH",
                   softmax_lse_flag=True)
    out = from_layout(out.cpu(), "BSH", N)
    assert lse.shape == (B, N, 1, 1)
    for b in range(B):
        ref, ref_lse = reference(q[b:b + 1], k[b:b + 1, :, :lens[b]], v[b:b + 1, :, :lens[b]], 0.2)
        check(out[b:b + 1], ref)
        check(lse[b:b + 1, ..., 0], ref_lse)

    # prefill over a paged cache (a chunked prefill: the queries are the last 20 tokens)
    S1 = 20
    qp = rand(B, N, S1, D)
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out, _ = FIA(*npu(to_layout(qp, "BSH"), kcache, vcache), atten_mask=mask.npu(), block_table=table.npu(),
                 block_size=bs, actual_seq_lengths=[S1, S1], actual_seq_lengths_kv=lens, num_heads=N,
                 num_key_value_heads=nkv, scale=0.2, input_layout="BSH", sparse_mode=3)
    out = from_layout(out.cpu(), "BSH", N)
    for b in range(B):
        kb, vb = k[b:b + 1, :, :lens[b]], v[b:b + 1, :, :lens[b]]
        ref, _ = reference(qp[b:b + 1], kb, vb, 0.2, band(S1, lens[b], 10**6, 0, lens[b] - S1))
        check(out[b:b + 1], ref)


def test_fia_tnd_lse():
    N, D = 2, 16
    lens = [4, 11]
    cum = [4, 15]
    q, k, v = rand(15, N, D), rand(15, N, D), rand(15, N, D)
    out, lse = FIA(*npu(q, k, v), actual_seq_lengths=cum, actual_seq_lengths_kv=cum, num_heads=N, scale=0.5,
                   input_layout="TND", softmax_lse_flag=True)
    assert out.shape == (15, N, D) and lse.shape == (15, N, 1)
    start = 0
    for n_rows in lens:
        sl = slice(start, start + n_rows)
        bnsd = lambda x: x[sl].permute(1, 0, 2).unsqueeze(0)  # noqa: E731
        ref, ref_lse = reference(bnsd(q), bnsd(k), bnsd(v), 0.5)
        check(out[sl].permute(1, 0, 2).unsqueeze(0), ref)
        check(lse[sl, :, 0].permute(1, 0).unsqueeze(0), ref_lse)
        start += n_rows


def test_empty_kv_gives_zeros():
    q, k, v = npu(rand(1, 2, 3, 8), rand(1, 2, 0, 8), rand(1, 2, 0, 8))
    out = PFA(q, k, v, num_heads=2, input_layout="BNSD")
    assert out.shape == (1, 2, 3, 8) and torch.all(out.cpu() == 0)


# ---- bad arguments --------------------------------------------------------------------------
def test_bad_arguments_name_the_argument():
    q, k, v = npu(rand(1, 4, 64), rand(1, 4, 64), rand(1, 4, 64))
    with pytest.raises(RuntimeError, match="input_layout"):
        PFA(q, k, v, num_heads=4, input_layout="SBH")
    with pytest.raises(RuntimeError, match="num_heads"):
        PFA(q, k, v, num_heads=3)
    with pytest.raises(RuntimeError, match="num_key_value_heads"):
        PFA(q, k, v, num_heads=4, num_key_value_heads=3)
    with pytest.raises(RuntimeError, match="key"):
        PFA(q, k.half(), v, num_heads=4)
    with pytest.raises(RuntimeError, match="atten_mask"):
        PFA(q, k, v, num_heads=4, atten_mask=torch.zeros(3, 3, dtype=torch.bool).npu())
    with pytest.raises(RuntimeError, match="atten_mask"):
        PFA(q, k, v, num_heads=4, sparse_mode=2)
    with pytest.raises(RuntimeError, match="sparse_mode"):
        PFA(q, k, v, num_heads=4, sparse_mode=5)
    with pytest.raises(RuntimeError, match="actual_seq_lengths"):
        PFA(q, k, v, num_heads=4, actual_seq_lengths=[5])
    with pytest.raises(RuntimeError, match="actual_seq_lengths_kv"):
        PFA(q, k, v, num_heads=4, actual_seq_lengths_kv=[-1])
    with pytest.raises(NotImplementedError, match="quant_scale2"):
        PFA(q, k, v, num_heads=4, quant_scale2=torch.ones(1).npu())
    with pytest.raises(RuntimeError, match="query"):
        IFA(q, k, v, num_heads=4)  # S = 4: not a decode
    with pytest.raises(RuntimeError, match="pse_shift"):
        PFA(q, k, v, num_heads=4, pse_shift=torch.zeros(1, 4, 2, 2).npu())
    with pytest.raises(NotImplementedError, match="antiquant_scale"):
        FIA(q, k, v, num_heads=4, antiquant_scale=torch.ones(2).npu())
    with pytest.raises(NotImplementedError, match="query_rope"):
        FIA(q, k, v, num_heads=4, query_rope=torch.ones(1, 4, 16).npu())
    with pytest.raises(RuntimeError, match="TND"):
        FIA(q, k, v, num_heads=4, input_layout="TND")
    with pytest.raises(RuntimeError, match="npu"):
        PFA(q, k.cpu(), v, num_heads=4)


def test_bad_paged_arguments():
    qd = rand(2, 1, 32).npu()
    cache = rand(4, 16, 32).npu()
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block_table"):
        IFA(qd, cache, cache, block_table=table.long().npu(), block_size=16, actual_seq_lengths=[32, 32],
            num_heads=2)
    with pytest.raises(RuntimeError, match="block_size"):
        IFA(qd, cache, cache, block_table=table.npu(), block_size=8, actual_seq_lengths=[32, 32], num_heads=2)
    with pytest.raises(RuntimeError, match="actual_seq_lengths"):
        IFA(qd, cache, cache, block_table=table.npu(), block_size=16, num_heads=2)
    with pytest.raises(RuntimeError, match="actual_seq_lengths"):
        IFA(qd, cache, cache, block_table=table.npu(), block_size=16, actual_seq_lengths=[33, 1], num_heads=2)
    # a block id outside the cache is found by the kernel and reported at the next sync
    bad = torch.tensor([[0, 7], [2, 3]], dtype=torch.int32).npu()
    with pytest.raises(RuntimeError, match="block_table"):
        IFA(qd, cache, cache, block_table=bad, block_size=16, actual_seq_lengths=[32, 32], num_heads=2)
        torch.npu.synchronize()
    torch.npu.synchronize()


# ---- tracing ----------------------------------------------------------------------------------
def test_fake_shapes_match_real():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = rand(2, 4, 5, 16), rand(2, 2, 9, 16), rand(2, 2, 9, 8)  # BNSD, GQA, Dv != D
    kc, table = paged(torch.cat([k, k], 1), 16, 4)
    cases = [
        (PFA, (to_layout(q, "BSH"), to_layout(k, "BSH"), to_layout(v, "BSH")),
         dict(num_heads=4, num_key_value_heads=2)),
        (PFA, (q, k, v), dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD_BSND")),
        (FIA, (q, k, v), dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", softmax_lse_flag=True)),
        (FIA, (to_layout(q[:, :, :1], "BSH"), kc, kc), dict(num_heads=4, num_key_value_heads=4, block_table=table,
                                                            block_size=16, actual_seq_lengths_kv=[9, 9],
                                                            softmax_lse_flag=True)),
        (IFA, (to_layout(q[:, :, :1], "BSND"), to_layout(k, "BSND"), to_layout(v, "BSND")),
         dict(num_heads=4, num_key_value_heads=2, input_layout="BSND")),
    ]
    for op, tensors, kwargs in cases:
        real_args = [t.npu() for t in tensors]
        real_kwargs = {n: (a.npu() if isinstance(a, torch.Tensor) else a) for n, a in kwargs.items()}
        real = op(*real_args, **real_kwargs)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(t) for t in real_args],
                      **{n: (mode.from_tensor(a) if isinstance(a, torch.Tensor) else a)
                         for n, a in real_kwargs.items()})
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        for r, f in zip(real, fake):
            assert r.shape == f.shape and r.dtype == f.dtype, (op, r.shape, f.shape)


def _opcheck_cases():
    q, k, v = rand(2, 4, 5, 16), rand(2, 2, 9, 16), rand(2, 2, 9, 16)
    mask = torch.triu(torch.ones(5, 9, dtype=torch.bool), 1)
    cache = rand(4, 16, 32)
    table = torch.tensor([[0, 1], [3, 2]], dtype=torch.int32)
    return [
        (torch.ops.npu.npu_fused_infer_attention_score.default, (q, k, v),
         dict(atten_mask=mask, num_heads=4, num_key_value_heads=2, input_layout="BNSD", sparse_mode=1,
              softmax_lse_flag=True)),
        (torch.ops.npu.npu_prompt_flash_attention.default, (q, k, v),
         dict(atten_mask=mask, num_heads=4, num_key_value_heads=2, input_layout="BNSD", actual_seq_lengths=[5, 3])),
        (torch.ops.npu.npu_incre_flash_attention.default, (rand(2, 1, 64), cache, cache),
         dict(block_table=table, block_size=16, actual_seq_lengths=[20, 32], num_heads=4, num_key_value_heads=2)),
    ]


@pytest.mark.parametrize("case", range(3))
def test_opcheck(case):
    op, args, kwargs = _opcheck_cases()[case]
    to_npu = lambda x: x.npu() if isinstance(x, torch.Tensor) else x  # noqa: E731
    torch.library.opcheck(op, tuple(map(to_npu, args)), {n: to_npu(a) for n, a in kwargs.items()})


def test_torch_compile_decode_step():
    B, N, nkv, S, D = 2, 4, 2, 40, 16
    q, k, v = npu(rand(B, 1, N * D), rand(B, S, nkv * D), rand(B, S, nkv * D))

    def step(q, k, v):
        out, lse = FIA(q * 2, k, v, num_heads=N, num_key_value_heads=nkv, scale=0.25, actual_seq_lengths_kv=[S, 17],
                       softmax_lse_flag=True)
        return out + 1, lse

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(q, k, v), step(q, k, v)):
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=0, rtol=0)


def test_random_bad_arguments_raise_cleanly():
    # Random corruptions of a valid call: each raises a RuntimeError/NotImplementedError
    # (never crashes), or runs; the process stays usable.
    import random
    rng = random.Random(0)
    base = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", sparse_mode=0)
    q, k, v = npu(rand(2, 4, 6, 8), rand(2, 2, 10, 8), rand(2, 2, 10, 8))
    corruptions = [
        ("num_heads", [0, -1, 3, 8]), ("num_key_value_heads", [-2, 3, 4, 8]),
        ("input_layout", ["", "BSH", "TND", "SBH", "BNSD_NBSD"]), ("sparse_mode", [-1, 5, 9, 1, 2]),
        ("actual_seq_lengths", [[7], [1, 2, 3], [-1], []]), ("actual_seq_lengths_kv", [[11], [-5], [3, 3, 3]]),
        ("atten_mask", [torch.zeros(6, 9, dtype=torch.bool).npu(), torch.zeros(6, 10).npu(),
                        torch.zeros(3, 6, 10, dtype=torch.bool).npu()]),
        ("pse_shift", [torch.zeros(2, 4, 6, 10, dtype=torch.float16).npu(), torch.zeros(2, 3, 6, 10).npu()]),
        ("block_table", [torch.zeros(2, 1, dtype=torch.int32).npu(), torch.zeros(2, dtype=torch.int32).npu()]),
        ("block_size", [-1, 1000]),
    ]
    for _ in range(60):
        kwargs = dict(base)
        for name, values in rng.sample(corruptions, rng.randint(1, 3)):
            kwargs[name] = rng.choice(values)
        try:
            FIA(q, k, v, **kwargs)
            torch.npu.synchronize()
        except (RuntimeError, NotImplementedError) as e:
            assert "npu_fused_infer_attention_score" in str(e) or "block_table" in str(e), str(e)
    out, _ = FIA(q, k, v, **base)
    check(out, reference(q.cpu(), k.cpu(), v.cpu(), 1.0)[0])


def test_ifa_many_query_heads_per_kv_head():
    # 80 query heads on one kv head: decode blocks of 64 heads, then 16
    B, N, S2, D = 2, 80, 30, 8
    q, k, v = rand(B, N, 1, D), rand(B, 1, S2, D), rand(B, 1, S2, D)
    mask = torch.rand(B, 1, 1, S2) < 0.3
    mask[..., 0] = False
    out = IFA(*npu(q, k, v), atten_mask=mask.npu(), num_heads=N, num_key_value_heads=1, scale_value=0.4,
              input_layout="BNSD")
    check(out, reference(q, k, v, 0.4, mask)[0])
