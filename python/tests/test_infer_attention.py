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


# ---- layout conversions, ragged NTD, TND with a paged cache ------------------------------------
FIA2 = torch_npu.npu_fused_infer_attention_score_v2


def to_axes(x, axes):
    """[B, N, S, D] -> the layout with these axes (BSH: "BSH"); NSD takes B = 1."""
    if axes == "BSH":
        return to_layout(x, "BSH")
    if axes == "NSD":
        return x[0].contiguous()
    return x.permute(*["BNSD".index(a) for a in axes]).contiguous()


def ragged(xs, axes):
    """Batches [1, N, s, D] -> TND (rows of all batches, then N, D) or NTD."""
    if axes == "TND":
        return torch.cat([x[0].permute(1, 0, 2) for x in xs])
    return torch.cat([x[0] for x in xs], 1)


def cumulative(lens):
    return [sum(lens[:i + 1]) for i in range(len(lens))]


@pytest.mark.parametrize("layout", ["NSD", "BSH_BNSD", "BSND_BNSD", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD"])
def test_fia_layout_conversions(layout):
    in_axes, _, out_axes = layout.partition("_")
    out_axes = out_axes or in_axes
    B = 1 if in_axes == "NSD" else 2
    N, nkv, S1, S2, D, Dv = 4, 2, 9, 21, 16, 8
    q, k, v = rand(B, N, S1, D), rand(B, nkv, S2, D), rand(B, nkv, S2, Dv)
    mask = torch.rand(S1, S2) < 0.3
    mask[:, 0] = False
    out, lse = FIA(*npu(to_axes(q, in_axes), to_axes(k, in_axes), to_axes(v, in_axes)), atten_mask=mask.npu(),
                   num_heads=N, num_key_value_heads=nkv, scale=0.3, input_layout=layout, sparse_mode=1,
                   softmax_lse_flag=True)
    ref, ref_lse = reference(q, k, v, 0.3, mask)
    assert out.shape == to_axes(ref, out_axes).shape
    check(out, to_axes(ref, out_axes))
    assert lse.shape == (B, N, S1, 1)
    check(lse[..., 0], ref_lse)


@pytest.mark.parametrize("layout", ["NTD", "NTD_TND", "TND_NTD"])
def test_fia_ragged_ntd_layouts(layout):
    in_axes, _, out_axes = layout.partition("_")
    out_axes = out_axes or in_axes
    N, nkv, D = 4, 2, 16
    lens_q, lens_kv = [5, 1, 12], [9, 30, 12]
    qs = [rand(1, N, s, D) for s in lens_q]
    ks, vs = [rand(1, nkv, s, D) for s in lens_kv], [rand(1, nkv, s, D) for s in lens_kv]
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out, lse = FIA(*npu(ragged(qs, in_axes), ragged(ks, in_axes), ragged(vs, in_axes)), atten_mask=mask.npu(),
                   actual_seq_lengths=cumulative(lens_q), actual_seq_lengths_kv=cumulative(lens_kv), num_heads=N,
                   num_key_value_heads=nkv, scale=0.25, input_layout=layout, sparse_mode=3, softmax_lse_flag=True)
    refs = [reference(qb, kb, vb, 0.25, band(qb.shape[2], kb.shape[2], 10**6, 0, kb.shape[2] - qb.shape[2]))
            for qb, kb, vb in zip(qs, ks, vs)]
    check(out, ragged([r[0] for r in refs], out_axes))
    assert lse.shape == (sum(lens_q), N, 1)
    check(lse[..., 0], torch.cat([r[1][0].t() for r in refs]))


@pytest.mark.parametrize("cache3d", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fia_tnd_query_over_paged_cache(cache3d, dtype):
    # Ragged queries (cumulative actual_seq_lengths) over a paged cache whose per-batch
    # lengths (actual_seq_lengths_kv) are not cumulative: a chunked prefill and a decode.
    N, nkv, D, bs = 4, 2, 16, 16
    lens_q, lens_kv = [7, 1, 20], [40, 17, 20]
    B = len(lens_q)
    kv_len = max(lens_kv)
    k, v = rand(B, nkv, kv_len, D, dtype=dtype), rand(B, nkv, kv_len, D, dtype=dtype)
    qs = [rand(1, N, s, D, dtype=dtype) for s in lens_q]
    cache, table = paged(torch.cat([k, v], 1), bs, 12, layout3d=False)  # [blocks, 2 * nkv, bs, D]
    kc, vc = cache[:, :nkv].contiguous(), cache[:, nkv:].contiguous()
    if cache3d:
        kc, vc = [c.permute(0, 2, 1, 3).reshape(c.shape[0], bs, nkv * D).contiguous() for c in (kc, vc)]
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out, lse = FIA(*npu(ragged(qs, "TND"), kc, vc), atten_mask=mask.npu(), block_table=table.npu(), block_size=bs,
                   actual_seq_lengths=cumulative(lens_q), actual_seq_lengths_kv=lens_kv, num_heads=N,
                   num_key_value_heads=nkv, scale=0.25, input_layout="TND", sparse_mode=3, softmax_lse_flag=True)
    refs = []
    for b, qb in enumerate(qs):
        kb, vb = k[b:b + 1, :, :lens_kv[b]].double(), v[b:b + 1, :, :lens_kv[b]].double()
        refs.append(reference(qb.double(), kb, vb, 0.25, band(lens_q[b], lens_kv[b], 10**6, 0,
                                                                lens_kv[b] - lens_q[b])))
    assert out.shape == (sum(lens_q), N, D) and out.dtype == dtype
    check(out, ragged([r[0] for r in refs], "TND"), dtype)
    check(lse[..., 0], torch.cat([r[1][0].t() for r in refs]), dtype)


# ---- npu_fused_infer_attention_score_v2 -------------------------------------------------------
def test_fia_v2_equals_v1_with_its_argument_names():
    B, N, nkv, S1, S2, D = 2, 4, 2, 13, 30, 16
    q, k, v = rand(B, N, S1, D), rand(B, nkv, S2, D), rand(B, nkv, S2, D)
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    args = npu(to_layout(q, "BSH"), to_layout(k, "BSH"), to_layout(v, "BSH"))
    out2, lse2 = FIA2(*args, atten_mask=mask.npu(), actual_seq_qlen=[13, 6], actual_seq_kvlen=[30, 25],
                      num_query_heads=N, num_key_value_heads=nkv, softmax_scale=0.3, input_layout="BSH",
                      sparse_mode=3, return_softmax_lse=True)
    out1, lse1 = FIA(*args, atten_mask=mask.npu(), actual_seq_lengths=[13, 6], actual_seq_lengths_kv=[30, 25],
                     num_heads=N, num_key_value_heads=nkv, scale=0.3, input_layout="BSH", sparse_mode=3,
                     softmax_lse_flag=True)
    torch.testing.assert_close(out2.cpu(), out1.cpu(), atol=0, rtol=0)
    torch.testing.assert_close(lse2.cpu(), lse1.cpu(), atol=0, rtol=0)
    out2 = from_layout(out2.cpu(), "BSH", N)
    for b, (sq, skv) in enumerate([(13, 30), (6, 25)]):
        ref, ref_lse = reference(q[b:b + 1, :, :sq], k[b:b + 1, :, :skv], v[b:b + 1, :, :skv], 0.3,
                                 band(sq, skv, 10**6, 0, skv - sq))
        check(out2[b:b + 1, :, :sq], ref)
        check(lse2[b:b + 1, :, :sq, 0], ref_lse)
    # defaults: no lse (an empty tensor), decode for one query token
    out, lse = FIA2(*npu(q[:, :, -1:], k, v), num_query_heads=N, num_key_value_heads=nkv, input_layout="BNSD")
    assert lse.shape == (0,)
    check(out, reference(q[:, :, -1:], k, v, 1.0)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fia_v2_learnable_sink(dtype):
    # The sink is one more logit per query head in the softmax denominator, with no value.
    N, D = 4, 16
    lens_q, lens_kv = [6, 10], [6, 10]
    qs = [rand(1, N, s, D, dtype=dtype) for s in lens_q]
    ks, vs = [rand(1, N, s, D, dtype=dtype) for s in lens_kv], [rand(1, N, s, D, dtype=dtype) for s in lens_kv]
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0]).to(dtype)
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out, lse = FIA2(*npu(ragged(qs, "TND"), ragged(ks, "TND"), ragged(vs, "TND")), atten_mask=mask.npu(),
                    learnable_sink=sink.npu(), actual_seq_qlen=cumulative(lens_q),
                    actual_seq_kvlen=cumulative(lens_kv), num_query_heads=N, softmax_scale=0.25,
                    input_layout="TND", sparse_mode=3, return_softmax_lse=True)
    outs, lses = [], []
    for qb, kb, vb in zip(qs, ks, vs):
        s = (qb.double() @ kb.double().transpose(-1, -2)) * 0.25
        s = s.masked_fill(band(s.shape[2], s.shape[3], 10**6, 0), -math.inf)
        sinks = sink.double().view(1, N, 1, 1).expand(1, N, s.shape[2], 1)
        full = torch.cat([s, sinks], -1)
        row_lse = torch.logsumexp(full, -1, keepdim=True)
        outs.append(torch.exp(s - row_lse) @ vb.double())
        lses.append(row_lse[0, :, :, 0].t())
    check(out, ragged(outs, "TND"), dtype)
    check(lse[..., 0], torch.cat(lses), dtype)


def test_fia_v2_half_ntd_tnd_with_gqa():
    N, nkv, D = 4, 1, 32
    lens = [3, 17]
    dtype = torch.float16
    qs = [rand(1, N, s, D, dtype=dtype) for s in lens]
    ks, vs = [rand(1, nkv, s, D, dtype=dtype) for s in lens], [rand(1, nkv, s, D, dtype=dtype) for s in lens]
    out, _ = FIA2(*npu(ragged(qs, "NTD"), ragged(ks, "NTD"), ragged(vs, "NTD")), actual_seq_qlen=cumulative(lens),
                  actual_seq_kvlen=cumulative(lens), num_query_heads=N, num_key_value_heads=nkv,
                  softmax_scale=D ** -0.5, input_layout="NTD_TND")
    assert out.shape == (sum(lens), N, D) and out.dtype == dtype
    refs = [reference(qb.double(), kb.double(), vb.double(), D ** -0.5)[0] for qb, kb, vb in zip(qs, ks, vs)]
    check(out, ragged(refs, "TND"), dtype)


# ---- .out variants ----------------------------------------------------------------------------
@pytest.mark.parametrize("v2", [False, True])
def test_out_variants_write_the_given_tensors(v2):
    B, N, S1, S2, D = 2, 4, 5, 12, 8
    q, k, v = npu(rand(B, N, S1, D), rand(B, N, S2, D), rand(B, N, S2, D))
    ref_out, ref_lse = reference(q.cpu(), k.cpu(), v.cpu(), 0.5)
    if v2:
        op = torch.ops.npu.npu_fused_infer_attention_score_v2.out
        kw = lambda lse: dict(num_query_heads=N, softmax_scale=0.5, input_layout="BNSD",  # noqa: E731
                              return_softmax_lse=lse)
    else:
        op = torch.ops.npu.npu_fused_infer_attention_score.out
        kw = lambda lse: dict(num_heads=N, scale=0.5, input_layout="BNSD", softmax_lse_flag=lse)  # noqa: E731
    out, lse = torch.empty(B, N, S1, D).npu(), torch.empty(B, N, S1, 1).npu()
    ptrs = out.data_ptr(), lse.data_ptr()
    got = op(q, k, v, workspace=None, attention_out=out, softmax_lse=lse, **kw(True))
    assert got[0] is out and got[1] is lse and (out.data_ptr(), lse.data_ptr()) == ptrs
    check(out, ref_out)
    check(lse[..., 0], ref_lse)
    # empty outputs are resized; without the flag softmax_lse is left as it is
    out, lse = torch.empty(0).npu(), torch.full((1,), 7.0).npu()
    op(q, k, v, attention_out=out, softmax_lse=lse, **kw(False))
    check(out, ref_out)
    assert lse.shape == (1,) and lse.item() == 7.0
    # a non-contiguous attention_out: computed aside and copied in
    out = torch.empty(B, N, D, S1).npu().transpose(-1, -2)
    op(q, k, v, attention_out=out, softmax_lse=torch.empty(0).npu(), **kw(False))
    check(out, ref_out)
    with pytest.raises(RuntimeError, match="attention_out"):
        op(q, k, v, attention_out=torch.empty(0, dtype=torch.float16).npu(), softmax_lse=lse, **kw(False))
    with pytest.raises(RuntimeError, match="softmax_lse"):
        op(q, k, v, attention_out=out, softmax_lse=torch.empty(0).cpu(), **kw(True))


# ---- bad arguments of the new operators and layouts ---------------------------------------------
def test_v2_and_tnd_paged_bad_arguments():
    q, k, v = npu(rand(1, 4, 64), rand(1, 4, 64), rand(1, 4, 64))
    with pytest.raises(RuntimeError, match="num_query_heads"):
        FIA2(q, k, v, num_query_heads=3)
    with pytest.raises(RuntimeError, match="input_layout"):
        FIA2(q, k, v, num_query_heads=4, input_layout="SBH")
    with pytest.raises(RuntimeError, match="actual_seq_qlen"):
        FIA2(q, k, v, num_query_heads=4, actual_seq_qlen=[9])
    with pytest.raises(RuntimeError, match="actual_seq_qlen"):
        FIA2(q[0].view(4, 4, 16), k[0].view(4, 4, 16), v[0].view(4, 4, 16), num_query_heads=4, input_layout="TND")
    with pytest.raises(RuntimeError, match="learnable_sink"):
        FIA2(q, k, v, num_query_heads=4, learnable_sink=torch.zeros(3).npu())
    for name in ["query_rope", "dequant_scale_key", "quant_scale_out", "quant_scale_p"]:
        with pytest.raises(NotImplementedError, match=name):
            FIA2(q, k, v, num_query_heads=4, **{name: torch.ones(4).npu()})
    # TND over a paged cache: block_size a multiple of 16 (at most 1024), per-batch kv lengths
    qt = rand(6, 2, 16).npu()
    cache = rand(4, 16, 32).npu()
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).npu()
    args = dict(block_table=table, actual_seq_lengths=[2, 6], num_heads=2, input_layout="TND")
    with pytest.raises(RuntimeError, match="block_size"):
        FIA(qt, cache, cache, block_size=8, actual_seq_lengths_kv=[5, 5], **args)
    with pytest.raises(RuntimeError, match="actual_seq_lengths_kv"):
        FIA(qt, cache, cache, block_size=16, actual_seq_lengths_kv=[5, 33], **args)
    with pytest.raises(RuntimeError, match="block_table"):
        FIA(qt, cache, cache, block_size=16, actual_seq_lengths_kv=[5, 5],
            **dict(args, block_table=table[:1].contiguous()))


# ---- tracing of the new operators ---------------------------------------------------------------
def test_fake_shapes_of_new_layouts_and_v2():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = rand(2, 4, 5, 16), rand(2, 2, 9, 16), rand(2, 2, 9, 8)
    lens = [3, 5]
    t = lambda x: ragged([x[:1, :, :lens[0]], x[1:, :, :lens[1]]], "TND")  # noqa: E731
    kc, table = paged(torch.cat([k, k], 1), 16, 4)
    cases = [
        (FIA, (to_axes(q, "BSH"), to_axes(k, "BSH"), to_axes(v, "BSH")),
         dict(num_heads=4, num_key_value_heads=2, input_layout="BSH_NBSD", softmax_lse_flag=True)),
        (FIA, (q[0], k[0], v[0]), dict(num_heads=4, num_key_value_heads=2, input_layout="NSD", softmax_lse_flag=True)),
        (FIA, (t(q), t(k), t(v)), dict(num_heads=4, num_key_value_heads=2, input_layout="TND_NTD",
                                       actual_seq_lengths=[3, 8], actual_seq_lengths_kv=[3, 8],
                                       softmax_lse_flag=True)),
        (FIA, (t(q), kc, kc), dict(num_heads=4, num_key_value_heads=4, input_layout="TND", block_table=table,
                                   block_size=16, actual_seq_lengths=[3, 8], actual_seq_lengths_kv=[9, 9])),
        (FIA2, (q, k, v), dict(num_query_heads=4, num_key_value_heads=2, input_layout="BNSD_BSND",
                               return_softmax_lse=True)),
        (FIA2, (q, k, v), dict(num_query_heads=4, num_key_value_heads=2, input_layout="BNSD")),
    ]
    for op, tensors, kwargs in cases:
        real_args = [x.npu() for x in tensors]
        real_kwargs = {n: (a.npu() if isinstance(a, torch.Tensor) else a) for n, a in kwargs.items()}
        real = op(*real_args, **real_kwargs)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(x) for x in real_args],
                      **{n: (mode.from_tensor(a) if isinstance(a, torch.Tensor) else a)
                         for n, a in real_kwargs.items()})
        for r, f in zip(real, fake):
            assert r.shape == f.shape and r.dtype == f.dtype, (kwargs, r.shape, f.shape)


def _opcheck_new_cases():
    q, k, v = rand(2, 4, 5, 16), rand(2, 2, 9, 16), rand(2, 2, 9, 16)
    mask = torch.triu(torch.ones(5, 9, dtype=torch.bool), 1)
    v2 = dict(atten_mask=mask, num_query_heads=4, num_key_value_heads=2, input_layout="BNSD", sparse_mode=1,
              return_softmax_lse=True)
    return [
        (torch.ops.npu.npu_fused_infer_attention_score_v2.default, (q, k, v), v2),
        (torch.ops.npu.npu_fused_infer_attention_score_v2.out, (q, k, v),
         dict(v2, attention_out=torch.empty(2, 4, 5, 16), softmax_lse=torch.empty(2, 4, 5, 1))),
        (torch.ops.npu.npu_fused_infer_attention_score.out, (q, k, v),
         dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD_NBSD", softmax_lse_flag=True,
              attention_out=torch.empty(4, 2, 5, 16), softmax_lse=torch.empty(2, 4, 5, 1))),
    ]


@pytest.mark.parametrize("case", range(3))
def test_opcheck_new_operators(case):
    op, args, kwargs = _opcheck_new_cases()[case]
    to_npu = lambda x: x.npu() if isinstance(x, torch.Tensor) else x  # noqa: E731
    # torch does not functionalize custom operators whose outputs alias inputs (the .out
    # variants' (Tensor(a!), Tensor(b!)), torch_npu's schema): no aot_dispatch test for them.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(op, tuple(map(to_npu, args)), {n: to_npu(a) for n, a in kwargs.items()},
                          test_utils=utils if op._overloadname == "out" else torch.library._OPCHECK_DEFAULT_UTILS)


def test_torch_compile_v2_prefill():
    B, N, S, D = 2, 4, 24, 16
    q, k, v = npu(rand(B, N, S, D), rand(B, N, S, D), rand(B, N, S, D))

    def step(q, k, v):
        out, lse = FIA2(q * 2, k, v, num_query_heads=N, softmax_scale=0.25, input_layout="BNSD_BSND",
                        actual_seq_kvlen=[S, 9], return_softmax_lse=True)
        return out + 1, lse

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(q, k, v), step(q, k, v)):
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=0, rtol=0)


def test_workspace_flow_of_the_out_variants():
    # torch_npu's graph-mode flow: get_max_workspace, infer_output, then .out into them.
    B, N, nkv, S2, D, Dv = 2, 4, 2, 19, 16, 8
    q, k, v = npu(rand(B, 1, N * D), rand(B, S2, nkv * D), rand(B, S2, nkv * Dv))
    args = dict(num_heads=N, num_key_value_heads=nkv, scale=0.2, actual_seq_lengths_kv=[19, 4], softmax_lse_flag=True)
    ws = torch_npu._npu_fused_infer_attention_score_get_max_workspace(q, k, v, **args)
    assert ws.device == q.device
    out, lse = torch_npu._npu_fused_infer_attention_score_infer_output(q, v, num_heads=N, num_key_value_heads=nkv,
                                                                        softmax_lse_flag=True)
    assert out.shape == (B, 1, N * Dv) and lse.shape == (B, N, 1, 1) and lse.dtype == torch.float32
    torch.ops.npu.npu_fused_infer_attention_score.out(q, k, v, workspace=ws, attention_out=out, softmax_lse=lse,
                                                      **args)
    want_out, want_lse = FIA(q, k, v, **args)
    torch.testing.assert_close(out.cpu(), want_out.cpu(), atol=0, rtol=0)
    torch.testing.assert_close(lse.cpu(), want_lse.cpu(), atol=0, rtol=0)
    # v2, ragged NTD_TND: the output is TND, lse [T, N, 1]
    lens = [3, 8]
    qt, kt, vt = npu(rand(N, 11, D), rand(nkv, 11, D), rand(nkv, 11, Dv))
    args2 = dict(num_query_heads=N, num_key_value_heads=nkv, input_layout="NTD_TND", actual_seq_qlen=[3, 11],
                 actual_seq_kvlen=[3, 11], return_softmax_lse=True)
    ws = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(qt, kt, vt, **args2)
    out, lse = torch_npu._npu_fused_infer_attention_score_v2_infer_output(
        qt, vt, num_query_heads=N, num_key_value_heads=nkv, input_layout="NTD_TND", return_softmax_lse=True)
    assert out.shape == (11, N, Dv) and lse.shape == (11, N, 1)
    torch.ops.npu.npu_fused_infer_attention_score_v2.out(qt, kt, vt, workspace=ws, attention_out=out,
                                                         softmax_lse=lse, **args2)
    start = 0
    for n_rows in lens:
        sl = slice(start, start + n_rows)
        ref, ref_lse = reference(qt.cpu()[:, sl].unsqueeze(0), kt.cpu()[:, sl].unsqueeze(0),
                                 vt.cpu()[:, sl].unsqueeze(0), 1.0)
        check(out[sl].permute(1, 0, 2).unsqueeze(0), ref)
        check(lse[sl, :, 0].t().unsqueeze(0), ref_lse)
        start += n_rows
    # the arguments are checked as the operator checks them; an output may not alias an input
    with pytest.raises(RuntimeError, match="num_query_heads"):
        torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(qt, kt, vt, **dict(args2, num_query_heads=3))
    with pytest.raises(RuntimeError, match="input_layout"):
        torch_npu._npu_fused_infer_attention_score_infer_output(q, v, num_heads=N, input_layout="SBH")
    with pytest.raises(RuntimeError, match="memory location"):
        torch.ops.npu.npu_fused_infer_attention_score.out(q, k, v, attention_out=q, softmax_lse=lse, num_heads=N,
                                                          num_key_value_heads=nkv)


def test_random_bad_arguments_of_v2_and_tnd_paged_raise_cleanly():
    # Corruptions of a valid ragged call over a paged cache: an error naming the operator
    # or block_table (or a result), never a crash; the process stays usable.
    import random
    rng = random.Random(1)
    N, nkv, D, bs = 4, 2, 16, 16
    qt = rand(9, N, D).npu()
    cache = rand(6, bs, nkv * D).npu()
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).npu()
    base = dict(block_table=table, block_size=bs, actual_seq_qlen=[4, 9], actual_seq_kvlen=[20, 32],
                num_query_heads=N, num_key_value_heads=nkv, input_layout="TND", return_softmax_lse=True)
    corruptions = [
        ("num_query_heads", [0, -1, 3, 8]), ("num_key_value_heads", [-2, 3, 4, 8]),
        ("input_layout", ["", "BSH", "NTD", "NTD_TND", "TND_NTD", "BNSD_NBSD", "NSD"]),
        ("sparse_mode", [-1, 5, 9, 1, 2, 3]), ("block_size", [-1, 0, 8, 32, 2048]),
        ("actual_seq_qlen", [[7], [1, 2, 3], [-1, 9], [], [5, 4], [4, 12]]),
        ("actual_seq_kvlen", [[11], [-5, 1], [3, 3, 3], [33, 1], None]),
        ("block_table", [torch.zeros(2, 1, dtype=torch.int32).npu(), torch.zeros(2, dtype=torch.int32).npu(),
                         torch.full((2, 2), 9, dtype=torch.int32).npu(), table.long(), None]),
        ("atten_mask", [torch.zeros(9, 32, dtype=torch.bool).npu(), torch.zeros(2048, 2048).npu(),
                        torch.zeros(2, 9, 32, dtype=torch.bool).npu()]),
        ("learnable_sink", [torch.zeros(N).npu(), torch.zeros(3).npu(), torch.zeros(N, dtype=torch.int32).npu(),
                            torch.zeros(N)]),
        ("pse_shift", [torch.zeros(2, N, 9, 32).npu()]),
    ]
    for _ in range(80):
        kwargs = dict(base)
        for name, values in rng.sample(corruptions, rng.randint(1, 3)):
            kwargs[name] = rng.choice(values)
        try:
            FIA2(qt, cache, cache, **kwargs)
            torch.npu.synchronize()
        except (RuntimeError, NotImplementedError) as e:
            assert "npu_fused_infer_attention_score_v2" in str(e) or "block_table" in str(e), str(e)
    out, _ = FIA2(qt, cache, cache, **base)
    torch.npu.synchronize()
    assert out.shape == (9, N, D)
