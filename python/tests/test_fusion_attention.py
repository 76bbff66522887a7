"""npu_fusion_attention and npu_fusion_attention_grad against a plain PyTorch reference.

The reference computes softmax(scale * (Q K^T + pse), masked, with the sink logit) V in
float64 on the CPU, one batch at a time in BNSD, with the masks of the sparse modes
built from torch.triu/tril as torch_npu's documentation describes them; gradients come
from its autograd.
"""
import math

import pytest
import torch
import torch_npu

FA = torch_npu.npu_fusion_attention
FA_GRAD = torch_npu.npu_fusion_attention_grad
LAYOUTS = ["BSH", "SBH", "BSND", "BNSD", "TND"]
LOWEST = torch.finfo(torch.float32).min
TOKENS = 2147483647


# ---- layouts ----------------------------------------------------------------------------
def to_layout(x, layout):
    """[B, N, S, D] -> the layout (TND takes B == 1 batches concatenated elsewhere)."""
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.permute(0, 2, 1, 3).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    return x


def from_layout(x, layout, n):
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, n, h // n).permute(0, 2, 1, 3)
    if layout == "SBH":
        s, b, h = x.shape
        return x.reshape(s, b, n, h // n).permute(1, 2, 0, 3)
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    return x


# ---- reference ----------------------------------------------------------------------------
def masked_positions(mode, mask, pre, nxt, sq, skv, prefix=None, batch=0, last=0):
    """[.., sq, skv] bool, True = not attended, for one batch; None when nothing is masked."""
    if mask is None:
        return None  # torch_npu: no atten_mask, no sparsity, whatever sparse_mode says
    ones = torch.ones(sq, skv, dtype=torch.bool)
    shift = skv - sq

    def band(origin_shift):
        return torch.triu(ones, nxt + 1 + origin_shift) | torch.tril(ones, -pre - 1 + origin_shift)

    if mode == 0:
        return mask | band(0)
    if mode in (1, 5):
        return mask
    if mode == 2:
        return torch.triu(ones, 1)
    if mode == 3:
        return torch.triu(ones, 1 + shift)
    if mode == 4:
        return band(shift)
    if mode == 6:
        return torch.triu(ones, 1 + shift) & (torch.arange(skv) >= prefix[batch])
    if mode == 7:
        return band(shift) if batch == last else torch.triu(ones, 1 + shift)
    if mode == 8:
        return band(shift) if batch == 0 else torch.triu(ones, 1)
    raise AssertionError(mode)


def reference(q, k, v, scale, masked=None, pse=None, sink=None, keep=None, keep_prob=1.0):
    """q [B, N, S1, D], k/v [B, Nkv, S2, D]: (out, max, sum) with max/sum [B, N, S1]."""
    n = q.shape[1]
    g = n // k.shape[1]
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2)
    if pse is not None:
        s = s + pse
    s = s * scale
    if masked is None:
        masked = torch.zeros(s.shape[-2:], dtype=torch.bool)
    masked = masked.expand(s.shape)
    s = s.masked_fill(masked, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.view(1, n, 1, 1).expand(*s.shape[:-1], 1).to(s.dtype)], -1)
        masked = torch.cat([masked, torch.zeros_like(masked[..., :1])], -1)
    dead = masked.all(-1, keepdim=True)  # rows that see nothing: 0, without NaN in the graph
    s = s.masked_fill(dead, 0.0)
    mx = s.amax(-1, keepdim=True)
    p = torch.softmax(s, -1).masked_fill(dead, 0.0)
    total = torch.exp(s - mx).sum(-1, keepdim=True)
    mx = mx.masked_fill(dead, LOWEST)
    total = total.masked_fill(dead, 0.0)
    if sink is not None:
        p = p[..., :-1]
    if keep is not None:
        p = p * keep / keep_prob
    return p @ v, mx.squeeze(-1), total.squeeze(-1)


def split_tnd(x, ends):
    starts = [0] + list(ends[:-1])
    return [x[s:e] for s, e in zip(starts, ends)]


def ref_layout(q, k, v, n, layout, scale=1.0, atten_mask=None, sparse_mode=0, pre=TOKENS, nxt=TOKENS,
               qlen=None, kvlen=None, pse=None, sink=None, prefix=None, keep=None, keep_prob=1.0):
    """The reference on tensors in `layout`: (out in the layout, max [.., S1], sum)."""
    if layout != "TND":
        nkv = k.shape[-1] // (q.shape[-1] // n) if layout in ("BSH", "SBH") else None
        qb, kb, vb = from_layout(q, layout, n), from_layout(k, layout, nkv), from_layout(v, layout, nkv)
        outs, maxs, sums = [], [], []
        for b in range(qb.shape[0]):
            m = atten_mask
            if m is not None and m.dim() == 4:
                m = m[b if m.shape[0] > 1 else 0]
            masked = masked_positions(sparse_mode, m, pre, nxt, qb.shape[2], kb.shape[2], prefix, b)
            p = None if pse is None else pse[b if pse.shape[0] > 1 else 0].unsqueeze(0)
            kp = None if keep is None else keep[b:b + 1]
            o, mx, sm = reference(qb[b:b + 1], kb[b:b + 1], vb[b:b + 1], scale, masked, p, sink, kp, keep_prob)
            outs.append(o)
            maxs.append(mx)
            sums.append(sm)
        return to_layout(torch.cat(outs), layout), torch.cat(maxs), torch.cat(sums)
    # TND: batches of [T_b, N, D]
    qs, ks, vs = split_tnd(q, qlen), split_tnd(k, kvlen), split_tnd(v, kvlen)
    last = max(i for i, t in enumerate(qs) if t.shape[0] > 0) if any(t.shape[0] for t in qs) else 0
    outs, maxs, sums = [], [], []
    for b, (qb, kb, vb) in enumerate(zip(qs, ks, vs)):
        sq, skv = qb.shape[0], kb.shape[0]
        m = None if atten_mask is None else atten_mask[:sq, :skv]
        masked = masked_positions(sparse_mode, m, pre, nxt, sq, skv, prefix, b, last)
        kp = None if keep is None else keep[b]
        o, mx, sm = reference(qb.permute(1, 0, 2)[None], kb.permute(1, 0, 2)[None], vb.permute(1, 0, 2)[None],
                              scale, masked, None, sink, kp, keep_prob)
        outs.append(o[0].permute(1, 0, 2))
        maxs.append(mx[0].T)
        sums.append(sm[0].T)
    return torch.cat(outs), torch.cat(maxs), torch.cat(sums)


# ---- running the op ---------------------------------------------------------------------------
def tnd_ends(lengths):
    out, total = [], 0
    for x in lengths:
        total += x
        out.append(total)
    return out


def make_qkv(layout, b, n, nkv, s1, s2, d, dv=None, dtype=torch.float32, qlen=None, kvlen=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    if layout == "TND":
        t1, t2 = sum(qlen), sum(kvlen)
        return (torch.randn(t1, n, d, generator=g, dtype=torch.float64).to(dtype),
                torch.randn(t2, nkv, d, generator=g, dtype=torch.float64).to(dtype),
                torch.randn(t2, nkv, dv, generator=g, dtype=torch.float64).to(dtype))
    q = torch.randn(b, n, s1, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, nkv, s2, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, nkv, s2, dv, generator=g, dtype=torch.float64)
    return tuple(to_layout(t, layout).contiguous().to(dtype) for t in (q, k, v))


TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=4e-3, rtol=4e-3),
       torch.bfloat16: dict(atol=3e-2, rtol=3e-2), torch.float64: dict(atol=1e-10, rtol=1e-10)}
GRAD_TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.float16: dict(atol=2e-2, rtol=2e-2),
            torch.bfloat16: dict(atol=1.5e-1, rtol=1e-1), torch.float64: dict(atol=1e-9, rtol=1e-9)}


def check(layout, q, k, v, n, grads=True, tol=None, grad_tol=None, **kw):
    """Runs the op on npu (forward and backward) and the reference, and compares."""
    dtype = q.dtype
    tol = tol or TOL[dtype]
    grad_tol = grad_tol or GRAD_TOL[dtype]
    ref_kw = {key: kw[key] for key in ("scale", "atten_mask", "sparse_mode", "pse", "sink", "prefix") if key in kw}
    ref_kw["pre"] = kw.get("pre_tockens", TOKENS)
    ref_kw["nxt"] = kw.get("next_tockens", TOKENS)
    ref_kw["qlen"] = kw.get("actual_seq_qlen")
    ref_kw["kvlen"] = kw.get("actual_seq_kvlen")
    leaves = [t.double().requires_grad_(grads) for t in (q, k, v)]
    extra = {}
    for name in ("pse", "sink"):
        if kw.get(name) is not None:
            extra[name] = kw[name].double().requires_grad_(grads)
            ref_kw[name] = extra[name]
    if ref_kw.get("atten_mask") is not None:
        ref_kw["atten_mask"] = ref_kw["atten_mask"].bool()
    ref_out, ref_max, ref_sum = ref_layout(*leaves, n, layout, **ref_kw)

    npu_leaves = [t.npu().requires_grad_(grads) for t in (q, k, v)]
    npu_kw = dict(kw)
    for name in ("pse", "sink", "atten_mask"):
        if kw.get(name) is not None:
            npu_kw[name] = kw[name].npu().requires_grad_(grads and name != "atten_mask")
    out = FA(*npu_leaves, n, layout, **npu_kw)
    torch.testing.assert_close(out[0].cpu().double(), ref_out, **tol)
    assert out[0].dtype == dtype
    # softmax_max / softmax_sum: the value 8 times
    stat_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert out[1].dtype == stat_dtype and out[2].dtype == stat_dtype
    smax, ssum = out[1].cpu().double(), out[2].cpu().double()
    assert smax.shape[-1] == 8 and (smax == smax[..., :1]).all() and (ssum == ssum[..., :1]).all()
    if layout == "TND":
        if kw.get("softmax_layout", "") == "TND":
            smax, ssum = smax[..., 0], ssum[..., 0]
        else:  # N-major data in the [T, N, 8] tensor
            t = smax.shape[0]
            smax, ssum = smax.reshape(n, t, 8)[..., 0].T, ssum.reshape(n, t, 8)[..., 0].T
    else:
        smax, ssum = smax[..., 0], ssum[..., 0]
    stat_tol = dict(atol=max(tol["atol"], 1e-5) * 10, rtol=tol["rtol"] * 10)
    torch.testing.assert_close(smax, ref_max.detach(), **stat_tol)
    torch.testing.assert_close(ssum, ref_sum.detach(), **stat_tol)
    assert out[3].numel() == 0
    if not grads:
        return out
    dout = torch.randn(ref_out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    ref_out.backward(dout)
    out[0].backward(dout.to(dtype).npu())
    for name, a, b in zip("qkv", npu_leaves, leaves):
        torch.testing.assert_close(a.grad.cpu().double(), b.grad, **grad_tol, msg=lambda m: f"d{name}: {m}")
    for name in extra:
        torch.testing.assert_close(npu_kw[name].grad.cpu().double(), extra[name].grad, **grad_tol,
                                   msg=lambda m: f"d{name}: {m}")
    return out


# ---- layouts, GQA, sizes ----------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(layout):
    n, nkv, d = 4, 2, 16
    qlen, kvlen = [70, 0, 33, 1], [150, 5, 40, 1]
    q, k, v = make_qkv(layout, 2, n, nkv, 70, 150, d, qlen=qlen, kvlen=kvlen)
    kw = dict(scale=0.3)
    if layout == "TND":
        kw.update(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(kvlen))
    check(layout, q, k, v, n, **kw)


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "TND"])
@pytest.mark.parametrize("nkv", [1, 2, 8])
def test_gqa(layout, nkv):
    qlen = [20, 45]
    q, k, v = make_qkv(layout, 2, 8, nkv, 20, 45, 8, qlen=qlen, kvlen=qlen)
    kw = dict(scale=0.5)
    if layout == "TND":
        kw.update(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(qlen))
    check(layout, q, k, v, 8, **kw)


@pytest.mark.parametrize("layout", ["BSH", "BSND", "TND"])
def test_value_head_dim_differs(layout):
    qlen = [9, 30]
    q, k, v = make_qkv(layout, 2, 4, 2, 9, 30, 16, dv=8, qlen=qlen, kvlen=qlen)
    kw = dict(scale=0.25)
    if layout == "TND":
        kw.update(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(qlen))
    out = check(layout, q, k, v, 4, **kw)
    assert out[0].shape[-1] == (4 * 8 if layout == "BSH" else 8)


def test_long_sequences_cross_blocks():
    # several query blocks (64) and key tiles (128), ragged ends
    q, k, v = make_qkv("BNSD", 1, 2, 2, 200, 300, 32)
    check("BNSD", q, k, v, 2, scale=1 / math.sqrt(32))


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (1, 3, 1, 7, 4), (2, 2, 5, 1, 3), (1, 1, 3, 3, 1)])
def test_small_sizes(shape):
    b, n, s1, s2, d = shape
    q, k, v = make_qkv("BNSD", b, n, n, s1, s2, d)
    check("BNSD", q, k, v, n, scale=0.7)


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
@pytest.mark.parametrize("empty", ["batch", "s1", "s2"])
def test_empty(layout, empty):
    b, s1, s2 = {"batch": (0, 5, 6), "s1": (2, 0, 6), "s2": (2, 5, 0)}[empty]
    leaves = [t.npu().requires_grad_() for t in make_qkv(layout, b, 2, 2, s1, s2, 4)]
    out = FA(*leaves, 2, layout, scale=0.5)
    assert out[0].shape == leaves[0].shape and out[1].shape == (b, 2, s1, 8)
    assert out[6] == b * 2 * s1 * s2
    # no key at all: zero output, lowest max, zero sum
    assert (out[0] == 0).all() and (out[2] == 0).all() and (out[1] == LOWEST).all()
    out[0].sum().backward()
    for t in leaves:
        assert t.grad.shape == t.shape and (t.grad == 0).all()


# ---- masks and sparse modes --------------------------------------------------------------------
def random_mask(shape, p=0.3, seed=1):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p


@pytest.mark.parametrize("mask_shape", ["BNSS", "B1SS", "11SS", "SS"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_mask_shapes(mask_shape, dtype):
    b, n, s1, s2 = 2, 3, 40, 70
    shape = {"BNSS": (b, n, s1, s2), "B1SS": (b, 1, s1, s2), "11SS": (1, 1, s1, s2), "SS": (s1, s2)}[mask_shape]
    mask = random_mask(shape).to(dtype)
    for layout in ("BSH", "BNSD"):
        q, k, v = make_qkv(layout, b, n, n, s1, s2, 8)
        check(layout, q, k, v, n, scale=0.4, atten_mask=mask)


COMPRESSED = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)


@pytest.mark.parametrize("s1,s2", [(50, 50), (30, 90), (90, 30)])
@pytest.mark.parametrize("mode,pre,nxt", [
    (0, 10, 5), (0, TOKENS, 0), (0, 20, -4), (0, -3, 12), (0, 0, 0),
    (1, 7, 7), (2, 0, 0), (3, 0, 0), (4, 8, 3), (4, 30, -5), (4, TOKENS, 0)])
def test_sparse_modes(s1, s2, mode, pre, nxt):
    n = 2
    q, k, v = make_qkv("BNSD", 2, n, n, s1, s2, 8)
    mask = random_mask((s1, s2), 0.2) if mode in (0, 1) else COMPRESSED
    check("BNSD", q, k, v, n, scale=0.3, atten_mask=mask, sparse_mode=mode, pre_tockens=pre, next_tockens=nxt)


def test_mode0_band_only():
    # an all-False mask leaves just the band of pre_tockens / next_tockens
    q, k, v = make_qkv("BSH", 1, 2, 2, 100, 100, 8)
    mask = torch.zeros(100, 100, dtype=torch.bool)
    check("BSH", q, k, v, 2, scale=0.3, atten_mask=mask, pre_tockens=9, next_tockens=3)


def test_no_mask_ignores_sparse_mode():
    # torch_npu: without atten_mask, sparse_mode and the tokens do not apply
    q, k, v = make_qkv("BNSD", 1, 2, 2, 20, 20, 8)
    full = FA(q.npu(), k.npu(), v.npu(), 2, "BNSD")[0]
    causal_no_mask = FA(q.npu(), k.npu(), v.npu(), 2, "BNSD", sparse_mode=2, next_tockens=0)[0]
    torch.testing.assert_close(full.cpu(), causal_no_mask.cpu())


@pytest.mark.parametrize("mode", [5, 6])
def test_prefix_modes(mode):
    b, n, s1, s2 = 2, 2, 24, 32
    prefix = [5, 12]
    q, k, v = make_qkv("BNSD", b, n, n, s1, s2, 8)
    if mode == 5:  # the full mask, right-down causal plus the prefix columns
        cols = torch.arange(s2)
        causal = torch.triu(torch.ones(s1, s2, dtype=torch.bool), 1 + s2 - s1)
        mask = torch.stack([causal & (cols >= p) for p in prefix])[:, None]
    else:
        mask = torch.triu(torch.ones(3072, 2048, dtype=torch.bool), 1)
    check("BNSD", q, k, v, n, scale=0.3, atten_mask=mask, sparse_mode=mode, prefix=prefix)


def test_fully_masked_rows():
    q, k, v = make_qkv("BNSD", 1, 2, 2, 10, 12, 8)
    mask = random_mask((10, 12), 0.3)
    mask[3] = True
    mask[7] = True
    out = check("BNSD", q, k, v, 2, scale=0.5, atten_mask=mask)
    assert (out[0][:, :, [3, 7]] == 0).all()
    assert (out[1][:, :, [3, 7]] == LOWEST).all() and (out[2][:, :, [3, 7]] == 0).all()
    assert not out[0].isnan().any()


# ---- TND (varlen) ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,pre,nxt", [(0, TOKENS, TOKENS), (0, 6, 2), (1, 0, 0), (2, 0, 0), (3, 0, 0),
                                          (4, 10, 2), (7, 50, -2), (8, 4, 1)])
def test_tnd_sparse(mode, pre, nxt):
    n = 2
    qlen, kvlen = [3, 17, 0, 9], [3, 25, 4, 9]
    q, k, v = make_qkv("TND", 0, n, n, 0, 0, 8, qlen=qlen, kvlen=kvlen)
    mask = random_mask((max(qlen), max(kvlen)), 0.2) if mode in (0, 1) else COMPRESSED
    check("TND", q, k, v, n, scale=0.4, atten_mask=mask, sparse_mode=mode, pre_tockens=pre, next_tockens=nxt,
          actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(kvlen))


def test_tnd_trailing_batches_left_out():
    # [2, 5, 9, 0, 0]: the last two batches take no part; rows past the last end stay 0
    n = 2
    q, k, v = make_qkv("TND", 0, n, n, 0, 0, 8, qlen=[2, 3, 4, 3], kvlen=[2, 3, 4, 5])
    out = FA(q.npu(), k.npu(), v.npu(), n, "TND", scale=0.5, actual_seq_qlen=[2, 5, 9, 0],
             actual_seq_kvlen=[2, 5, 9, 0])
    ref, _, _ = ref_layout(q.double(), k.double(), v.double(), n, "TND", 0.5, qlen=[2, 5, 9], kvlen=[2, 5, 9])
    torch.testing.assert_close(out[0][:9].cpu().double(), ref, **TOL[torch.float32])
    assert (out[0][9:] == 0).all()
    assert out[6] == n * (4 + 9 + 16)


def test_tnd_softmax_layout():
    n, qlen = 3, [5, 7]
    q, k, v = make_qkv("TND", 0, n, n, 0, 0, 8, qlen=qlen, kvlen=qlen)
    ends = tnd_ends(qlen)
    for layout in ("", "TND"):
        out = check("TND", q, k, v, n, scale=0.5, actual_seq_qlen=ends, actual_seq_kvlen=ends,
                    softmax_layout=layout)
        assert out[1].shape == (12, n, 8)


# ---- pse, sink, dtypes -------------------------------------------------------------------------
@pytest.mark.parametrize("pse_shape", ["BNSS", "BN1S", "1NSS"])
def test_pse(pse_shape):
    b, n, s1, s2 = 2, 3, 20, 150
    shape = {"BNSS": (b, n, s1, s2), "BN1S": (b, n, 1, s2), "1NSS": (1, n, s1, s2)}[pse_shape]
    pse = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    mask = torch.triu(torch.ones(s1, s2, dtype=torch.bool), 100)
    for layout in ("BSND", "SBH"):
        q, k, v = make_qkv(layout, b, n, n, s1, s2, 8)
        check(layout, q, k, v, n, scale=0.3, pse=pse, atten_mask=mask)


@pytest.mark.parametrize("layout", ["BNSD", "TND"])
def test_sink(layout):
    n, qlen = 4, [20, 33]
    q, k, v = make_qkv(layout, 2, n, 2, 20, 33, 8, qlen=qlen, kvlen=qlen)
    sink = torch.linspace(-1, 2, n)
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    kw = dict(scale=0.5, sink=sink, atten_mask=mask, sparse_mode=3)
    if layout == "TND":
        kw.update(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(qlen))
    check(layout, q, k, v, n, **kw)


def test_sink_doc_example():
    # torch_npu's documented reference: append the sink logit, softmax, drop that column
    b, n, s, d = 1, 4, 16, 64
    q, k, v = make_qkv("BNSD", b, n, n, s, s, d, dtype=torch.float16)
    sink = torch.linspace(-0.2, 0.2, steps=n)
    out = FA(q.npu(), k.npu(), v.npu(), n, "BNSD", sink=sink.npu(), scale=1 / math.sqrt(d))[0]
    scores = q.float() @ k.float().transpose(2, 3) / math.sqrt(d)
    probs = torch.softmax(torch.cat([scores, sink.view(1, n, 1, 1).expand(b, n, s, 1)], -1), -1)[..., :-1]
    torch.testing.assert_close(out.cpu().float(), probs @ v.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["BSH", "BNSD", "TND"])
def test_half_types(dtype, layout):
    qlen = [40, 130]
    q, k, v = make_qkv(layout, 2, 4, 2, 40, 130, 32, dtype=dtype, qlen=qlen, kvlen=qlen)
    kw = dict(scale=1 / math.sqrt(32), atten_mask=COMPRESSED, sparse_mode=3)
    if layout == "TND":
        kw.update(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(qlen))
    check(layout, q, k, v, 4, **kw)


def test_half_pse():
    q, k, v = make_qkv("BNSD", 1, 2, 2, 30, 40, 16, dtype=torch.float16)
    pse = torch.randn(1, 2, 30, 40).half()
    check("BNSD", q, k, v, 2, scale=0.25, pse=pse)


def test_gradcheck_float64():
    # float64 is a simulator extension (float64 statistics), for gradcheck
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 4, dtype=torch.float64, generator=g).npu().requires_grad_()
    k = torch.randn(1, 7, 2, dtype=torch.float64, generator=g).npu().requires_grad_()  # GQA: 2 query heads
    v = torch.randn(1, 7, 4, dtype=torch.float64, generator=g).npu().requires_grad_()
    pse = torch.randn(1, 2, 5, 7, dtype=torch.float64, generator=g).npu().requires_grad_()
    sink = torch.randn(2, dtype=torch.float64, generator=g).npu().requires_grad_()
    mask = (torch.rand(5, 7, generator=g) < 0.3).npu()

    def fn(q, k, v, pse, sink):
        return FA(q, k, v, 2, "BSH", pse=pse, sink=sink, atten_mask=mask, scale=0.6, pre_tockens=3,
                  next_tockens=2)[0]
    assert torch.autograd.gradcheck(fn, (q, k, v, pse, sink))


# ---- dropout -------------------------------------------------------------------------------------
def dropout_keep_mask(b, n, s1, s2, keep_prob, seed, offset):
    """The keep mask of (seed, offset) recovered with Q = K = 0 (uniform probabilities) and V = I."""
    q = torch.zeros(b, n, s1, 1).npu()
    k = torch.zeros(b, n, s2, 1).npu()
    v = torch.eye(s2).expand(b, n, s2, s2).contiguous().npu()
    out = FA(q, k, v, n, "BNSD", keep_prob=keep_prob, seed=seed, offset=offset)[0].cpu()
    return out != 0


def test_dropout_reproducible_from_generator():
    q, k, v = (t.npu() for t in make_qkv("BNSD", 2, 2, 2, 30, 40, 8))
    torch.npu.manual_seed(123)
    a = FA(q, k, v, 2, "BNSD", keep_prob=0.7)
    b = FA(q, k, v, 2, "BNSD", keep_prob=0.7)
    torch.npu.manual_seed(123)
    c = FA(q, k, v, 2, "BNSD", keep_prob=0.7)
    assert a[4] != 0 and a[4:6] != b[4:6] and a[4:] == c[4:]
    assert a[6] == 2 * 2 * 30 * 40
    torch.testing.assert_close(a[0].cpu(), c[0].cpu(), rtol=0, atol=0)
    assert not torch.equal(a[0].cpu(), b[0].cpu())
    # the returned seed and offset select the same mask again
    d = FA(q, k, v, 2, "BNSD", keep_prob=0.7, seed=a[4], offset=a[5])
    torch.testing.assert_close(a[0].cpu(), d[0].cpu(), rtol=0, atol=0)


def test_dropout_mask_statistics_and_offset():
    keep = dropout_keep_mask(1, 2, 64, 64, 0.8, seed=77, offset=0)
    assert abs(keep.float().mean().item() - 0.8) < 0.02
    # the mask is a stream of draws: offset 4 moves it by 4 elements
    shifted = dropout_keep_mask(1, 2, 64, 64, 0.8, seed=77, offset=4)
    assert torch.equal(keep.flatten()[4:], shifted.flatten()[:-4])


def tnd_keep(flat, n, qlen, kvlen):
    """A TND problem's keep mask from its flat bits: each batch's [1, N, Sq, Skv], one after the other."""
    keep, at = [], 0
    for a, c in zip(qlen, kvlen):
        keep.append(flat[at:at + n * a * c].reshape(1, n, a, c))
        at += n * a * c
    return keep


def check_against_reference(out, ref, npu_leaves, leaves):
    """out (the operator's outputs on npu_leaves) against ref (the float64 reference on leaves),
    forward and, for a random output gradient, the inputs' gradients."""
    torch.testing.assert_close(out[0].cpu().double(), ref, **TOL[torch.float32])
    dout = torch.randn(ref.shape, dtype=torch.float64)
    ref.backward(dout)
    out[0].backward(dout.float().npu())
    for a, r in zip(npu_leaves, leaves):
        torch.testing.assert_close(a.grad.cpu().double(), r.grad, **GRAD_TOL[torch.float32])


@pytest.mark.parametrize("layout", ["BNSD", "TND"])
def test_dropout_forward_backward_match_mask(layout):
    n, keep_prob, seed, offset = 2, 0.6, 99, 8
    b, s1, s2 = 2, 20, 24
    if layout == "TND":
        qlen = kvlen = [20, 24]
        flat = dropout_keep_mask(1, 1, 1, n * sum(a * c for a, c in zip(qlen, kvlen)), keep_prob, seed,
                                 offset).flatten()
        keep = tnd_keep(flat, n, qlen, kvlen)
        kw = dict(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(kvlen))
        q, k, v = make_qkv("TND", 0, n, n, 0, 0, 8, qlen=qlen, kvlen=kvlen)
    else:
        keep = dropout_keep_mask(b, n, s1, s2, keep_prob, seed, offset)
        kw = {}
        q, k, v = make_qkv("BNSD", b, n, n, s1, s2, 8)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref, _, _ = ref_layout(*leaves, n, layout, 0.5, atten_mask=COMPRESSED, sparse_mode=3, keep=keep,
                           keep_prob=keep_prob, qlen=kw.get("actual_seq_qlen"), kvlen=kw.get("actual_seq_kvlen"))
    npu_leaves = [t.npu().requires_grad_() for t in (q, k, v)]
    out = FA(*npu_leaves, n, layout, scale=0.5, atten_mask=COMPRESSED.npu(), sparse_mode=3, keep_prob=keep_prob,
             seed=seed, offset=offset, **kw)
    assert out[4:6] == (seed, offset)
    check_against_reference(out, ref, npu_leaves, leaves)


def _unpack(bits, shape):
    """_npu_dropout_gen_mask's bytes as a bool tensor of `shape` (lowest bit first)."""
    flat = bits.cpu().unsqueeze(-1).bitwise_right_shift(torch.arange(8, dtype=torch.uint8)).bitwise_and(1)
    return flat.flatten()[:math.prod(shape)].reshape(shape).bool()


def test_dropout_gen_mask_is_the_attentions_mask():
    # op-plugin's tests build their goldens from it: the mask the operator draws for (seed, offset)
    bits = torch_npu._npu_dropout_gen_mask(torch.empty(1).npu(), [2, 2, 30, 40], p=0.3, seed=77, offset=8)
    assert bits.dtype == torch.uint8 and bits.device.type == "npu"
    assert bits.shape == ((2 * 2 * 30 * 40 + 127) // 128 * 16,)
    torch.testing.assert_close(_unpack(bits, [2, 2, 30, 40]), dropout_keep_mask(2, 2, 30, 40, 0.7, 77, 8),
                               rtol=0, atol=0)
    # after manual_seed(s), an operator drawing its seed uses (s, 0): the same mask
    torch.npu.manual_seed(5)
    q, k, v = (t.npu() for t in make_qkv("BNSD", 1, 2, 2, 16, 16, 8))
    out, _, _, _, seed, offset, _ = FA(q, k, v, 2, "BNSD", keep_prob=0.5)
    assert (seed, offset) == (5, 0)
    gen = torch_npu._npu_dropout_gen_mask(q, [1, 2, 16, 16], p=0.5, seed=5, offset=0)
    ref = FA(q, k, v, 2, "BNSD", keep_prob=0.5, dropout_mask=gen, seed=1, offset=0)[0]
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=r"expected p in \[0, 1\]"):
        torch_npu._npu_dropout_gen_mask(q, [4], p=1.5, seed=1, offset=0)


@pytest.mark.parametrize("layout", ["BSH", "TND"])
def test_dropout_mask_from_the_caller_forward_and_backward(layout):
    # a mask of its own (not the seed's): the forward applies it, and autograd's backward too
    n, keep_prob = 2, 0.6
    if layout == "TND":
        qlen, kvlen = [5, 7], [6, 9]
        kw = dict(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(kvlen))
        q, k, v = make_qkv("TND", 0, n, n, 0, 0, 8, qlen=qlen, kvlen=kvlen)
        count = n * sum(a * c for a, c in zip(qlen, kvlen))
    else:
        kw = {}
        q, k, v = make_qkv("BSH", 2, n, n, 12, 10, 8)
        count = 2 * n * 12 * 10
    bits = torch_npu._npu_dropout_gen_mask(torch.empty(1).npu(), [count], p=0.5, seed=31, offset=0)
    flat = _unpack(bits, [count])
    keep = tnd_keep(flat, n, qlen, kvlen) if layout == "TND" else flat.reshape(2, n, 12, 10)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref, _, _ = ref_layout(*leaves, n, layout, 0.5, keep=keep, keep_prob=keep_prob,
                           qlen=kw.get("actual_seq_qlen"), kvlen=kw.get("actual_seq_kvlen"))
    npu_leaves = [t.npu().requires_grad_() for t in (q, k, v)]
    out = FA(*npu_leaves, n, layout, scale=0.5, keep_prob=keep_prob, dropout_mask=bits, seed=3, offset=0, **kw)
    check_against_reference(out, ref, npu_leaves, leaves)


def test_fusion_attention_v2_rope_and_pse_type():
    # query_rope / key_rope: a second part of each head whose scores add to the first's
    n, d, dr = 2, 8, 4
    q, k, v = make_qkv("BSH", 2, n, n, 6, 7, d)
    qr, kr = torch.randn(2, 6, n * dr), torch.randn(2, 7, n * dr)
    pse = torch.randn(2, n, 6, 7)
    full_q = torch.cat([q.view(2, 6, n, d), qr.view(2, 6, n, dr)], -1).view(2, 6, -1)
    full_k = torch.cat([k.view(2, 7, n, d), kr.view(2, 7, n, dr)], -1).view(2, 7, -1)
    # pse_type 1 (the default): pse added to the scaled scores, i.e. pse / scale inside the scale
    want = FA(full_q.npu(), full_k.npu(), v.npu(), n, "BSH", pse=(pse / 0.3).npu(), scale=0.3)
    got = torch_npu.npu_fusion_attention_v2(q.npu(), k.npu(), v.npu(), n, "BSH", query_rope=qr.npu(),
                                            key_rope=kr.npu(), pse=pse.npu(), scale=0.3)
    assert len(got) == 7
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a.cpu(), b.cpu())
    grads = torch_npu.npu_fusion_attention_grad_v2(
        q.npu(), k.npu(), v.npu(), torch.ones_like(got[0]), n, "BSH", query_rope=qr.npu(), key_rope=kr.npu(),
        pse=pse.npu(), scale_value=0.3, softmax_max=got[1], softmax_sum=got[2], attention_in=got[0])
    leaves = [t.npu().requires_grad_() for t in (q, k, v, qr, kr)]
    out = torch_npu.npu_fusion_attention_v2(*leaves[:3], n, "BSH", query_rope=leaves[3], key_rope=leaves[4],
                                            pse=pse.npu(), scale=0.3)[0]
    out.sum().backward()
    dq, dk, dv, dpse, dqr, dkr, dsink = grads
    for g, leaf in zip((dq, dk, dv, dqr, dkr), leaves):
        torch.testing.assert_close(g.cpu(), leaf.grad.cpu(), **GRAD_TOL[torch.float32])
    with pytest.raises(RuntimeError, match="pse_type 2"):
        torch_npu.npu_fusion_attention_v2(q.npu(), k.npu(), v.npu(), n, "BSH", pse=pse.npu(), pse_type=2)
    with pytest.raises(RuntimeError, match="query_rope and key_rope must be given together"):
        torch_npu.npu_fusion_attention_v2(q.npu(), k.npu(), v.npu(), n, "BSH", query_rope=qr.npu())


def test_fusion_attention_v3_seed_and_offset_tensors():
    q, k, v = (t.npu() for t in make_qkv("TND", 0, 2, 2, 0, 0, 8, qlen=[3, 5], kvlen=[4, 6]))
    ends = dict(actual_seq_qlen=torch.tensor(tnd_ends([3, 5])), actual_seq_kvlen=torch.tensor(tnd_ends([4, 6])))
    torch.npu.manual_seed(9)
    out = torch_npu.npu_fusion_attention_v3(q, k, v, 2, "TND", keep_prob=0.8, softmax_layout="TND", **ends)
    assert len(out) == 6 and out[4].dtype == torch.int64 and out[4].shape == (1,) and out[4].device.type == "cpu"
    assert (out[4].item(), out[5].item()) == (9, 0)
    ref = FA(q, k, v, 2, "TND", keep_prob=0.8, softmax_layout="TND", seed=9, offset=0,
             actual_seq_qlen=tnd_ends([3, 5]), actual_seq_kvlen=tnd_ends([4, 6]))
    torch.testing.assert_close(out[0].cpu(), ref[0].cpu(), rtol=0, atol=0)
    dy = torch.randn(out[0].shape).npu()
    g3 = torch_npu.npu_fusion_attention_grad_v3(q, k, v, dy, 2, "TND", softmax_max=out[1], softmax_sum=out[2],
                                                attention_in=out[0], keep_prob=0.8, seed=out[4], offset=out[5],
                                                softmax_layout="TND", **ends)
    g1 = torch_npu.npu_fusion_attention_grad(q, k, v, dy, 2, "TND", softmax_max=out[1], softmax_sum=out[2],
                                             attention_in=out[0], keep_prob=0.8, seed=9, offset=0,
                                             softmax_layout="TND", actual_seq_qlen=tnd_ends([3, 5]),
                                             actual_seq_kvlen=tnd_ends([4, 6]))
    for a, b in zip(g3[:3], g1[:3]):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="seed and offset .* are required"):
        torch_npu.npu_fusion_attention_grad_v3(q, k, v, dy, 2, "TND", keep_prob=0.8, softmax_layout="TND", **ends)


def test_dropout_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 3, dtype=torch.float64, generator=g).npu().requires_grad_() for _ in range(3))

    def fn(q, k, v):
        return FA(q, k, v, 2, "BNSD", keep_prob=0.5, seed=5, offset=0, scale=0.7)[0]
    assert torch.autograd.gradcheck(fn, (q, k, v))


# ---- the grad op directly --------------------------------------------------------------------------
def test_grad_op_direct_and_recompute():
    n = 2
    q, k, v = (t.npu() for t in make_qkv("BSH", 2, n, 1, 30, 40, 8))
    dy = torch.randn(2, 30, n * 8).npu()
    kw = dict(atten_mask=COMPRESSED.npu(), sparse_mode=3)
    out = FA(q, k, v, n, "BSH", scale=0.5, keep_prob=0.9, **kw)
    full = FA_GRAD(q, k, v, dy, n, "BSH", softmax_max=out[1], softmax_sum=out[2], attention_in=out[0],
                   scale_value=0.5, keep_prob=0.9, seed=out[4], offset=out[5], numels=out[6], **kw)
    # without softmax_max / softmax_sum / attention_in the forward is recomputed
    again = FA_GRAD(q, k, v, dy, n, "BSH", scale_value=0.5, keep_prob=0.9, seed=out[4], offset=out[5], **kw)
    assert len(full) == 5
    for a, b in zip(full[:3], again[:3]):
        torch.testing.assert_close(a.cpu(), b.cpu())
    assert full[3].numel() == 0 and full[4].numel() == 0  # no pse, no sink
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    o = FA(qa, ka, va, n, "BSH", scale=0.5, keep_prob=0.9, seed=out[4], offset=out[5], **kw)[0]
    o.backward(dy)
    for a, b in zip(full[:3], (qa, ka, va)):
        torch.testing.assert_close(a.cpu(), b.grad.cpu())


def test_autograd_metadata():
    q, k, v = (t.npu().requires_grad_() for t in make_qkv("BNSD", 1, 2, 2, 4, 4, 8))
    out = FA(q, k, v, 2, "BNSD")
    assert out[0].requires_grad and out[0].grad_fn is not None
    assert not out[1].requires_grad and not out[2].requires_grad
    assert isinstance(out[4], int) and isinstance(out[6], int)


# ---- bad arguments -------------------------------------------------------------------------------
def _bad(**over):
    q, k, v = (t.npu() for t in make_qkv("BSH", 2, 4, 4, 8, 8, 4))
    args = dict(query=q, key=k, value=v, head_num=4, input_layout="BSH")
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    (dict(input_layout="BHS"), "input_layout to be one of BSH, SBH, BSND, BNSD, TND"),
    (dict(head_num=3), r"head_num \(3\) must divide the hidden size of query \(16\)"),
    (dict(head_num=0), "head_num > 0"),
    (dict(keep_prob=0.0), r"keep_prob in \(0, 1\]"),
    (dict(keep_prob=1.5), r"keep_prob in \(0, 1\]"),
    (dict(sparse_mode=9), r"sparse_mode must be in \[0, 6\]"),
    (dict(sparse_mode=7), r"sparse_mode must be in \[0, 6\]"),
    (dict(atten_mask=torch.zeros(8, 9, dtype=torch.bool).npu()), r"atten_mask of shape \[B, N, S1, S2\]"),
    (dict(atten_mask=torch.zeros(3, 1, 8, 8, dtype=torch.bool).npu()), r"atten_mask of shape"),
    (dict(atten_mask=torch.zeros(8, 8).npu()), "atten_mask to be bool or uint8"),
    (dict(atten_mask=torch.zeros(8, 8, dtype=torch.bool).npu(), sparse_mode=2), "compressed 2048x2048"),
    (dict(pse=torch.zeros(2, 4, 8, 7).npu()), r"pse of shape \[B, N, S1, S2\]"),
    (dict(pse=torch.zeros(2, 4, 8, 8).half().npu()), "expected pse to have dtype Float"),
    (dict(sink=torch.zeros(3).npu()), r"sink of shape \[head_num\] = \[4\]"),
    (dict(sink=torch.zeros(4).half().npu()), "expected sink to have dtype Float"),
    (dict(padding_mask=torch.zeros(1).npu()), "padding_mask is not supported"),
    (dict(keep_prob=0.5, dropout_mask=torch.zeros(1, dtype=torch.uint8).npu()),
     r"dropout_mask holds 8 bits, the attention has 512 score elements"),
    (dict(keep_prob=0.5, dropout_mask=torch.zeros(64).npu()), "expected dropout_mask of dtype uint8"),
    (dict(softmax_layout="TND"), "softmax_layout"),
    (dict(sparse_mode=5, atten_mask=torch.zeros(8, 8, dtype=torch.bool).npu()), "needs prefix"),
])
def test_bad_arguments(over, match):
    with pytest.raises(RuntimeError, match=match):
        FA(**_bad(**over))


def test_bad_tensors():
    q, k, v = (t.npu() for t in make_qkv("BSH", 2, 4, 4, 8, 8, 4))
    with pytest.raises(RuntimeError, match="expected key to have dtype Float, got Half"):
        FA(q, k.half(), v, 4, "BSH")
    with pytest.raises(RuntimeError, match="expected value to be an npu tensor"):
        FA(q, k, v.cpu(), 4, "BSH")
    with pytest.raises(RuntimeError, match="expected query to be float16, bfloat16 or float32"):
        FA(q.int(), k.int(), v.int(), 4, "BSH")
    with pytest.raises(RuntimeError, match="expected query to be 4-dimensional for input_layout BNSD"):
        FA(q, k, v, 4, "BNSD")
    with pytest.raises(RuntimeError, match=r"key's hidden size \(6\) to be a multiple of the head dim 4"):
        FA(q, k[..., :6].contiguous(), v, 4, "BSH")
    with pytest.raises(RuntimeError, match=r"number of query heads \(4\) must be a multiple of the number of "
                                           r"key/value heads \(3\)"):
        FA(q, torch.zeros(2, 8, 12).npu(), torch.zeros(2, 8, 12).npu(), 4, "BSH")
    with pytest.raises(RuntimeError, match="expected key and value to have query's batch size"):
        FA(q, k[:1].contiguous(), v, 4, "BSH")
    qb = torch.zeros(1, 4, 8, 4).npu()
    with pytest.raises(RuntimeError, match=r"head_num \(2\) to equal query's head dimension N=4"):
        FA(qb, qb, qb, 2, "BNSD")


def test_bad_tnd_lengths():
    q = torch.zeros(10, 2, 4).npu()
    with pytest.raises(RuntimeError, match="TND needs actual_seq_qlen and actual_seq_kvlen"):
        FA(q, q, q, 2, "TND")
    with pytest.raises(RuntimeError, match="TND needs actual_seq_qlen and actual_seq_kvlen"):
        FA(q, q, q, 2, "TND", actual_seq_qlen=[4, 10], actual_seq_kvlen=[10])
    with pytest.raises(RuntimeError, match=r"actual_seq_qlen \(\[4, 9\]\) add up to 9, but query has 10 rows"):
        FA(q, q, q, 2, "TND", actual_seq_qlen=[4, 9], actual_seq_kvlen=[4, 10])
    with pytest.raises(RuntimeError, match="actual_seq_kvlen to hold non-decreasing cumulative"):
        FA(q, q, q, 2, "TND", actual_seq_qlen=[4, 10], actual_seq_kvlen=[6, 4])
    with pytest.raises(RuntimeError, match=r"sparse_mode must be in \[0, 5\) or \(5, 8\]"):
        FA(q, q, q, 2, "TND", actual_seq_qlen=[10], actual_seq_kvlen=[10], sparse_mode=5)
    with pytest.raises(RuntimeError, match=r"atten_mask of shape \[maxSq, maxSkv\] = \[10, 10\]"):
        FA(q, q, q, 2, "TND", actual_seq_qlen=[10], actual_seq_kvlen=[10],
           atten_mask=torch.zeros(1, 1, 10, 10, dtype=torch.bool).npu())


def test_bad_grad_arguments():
    q, k, v = (t.npu() for t in make_qkv("BSH", 2, 4, 4, 8, 8, 4))
    out = FA(q, k, v, 4, "BSH")
    with pytest.raises(RuntimeError, match="expected dy to have the attention output's shape"):
        FA_GRAD(q, k, v, out[0][:, :4], 4, "BSH", softmax_max=out[1], softmax_sum=out[2], attention_in=out[0])
    with pytest.raises(RuntimeError, match=r"expected softmax_max of shape \[2, 4, 8, 8\]"):
        FA_GRAD(q, k, v, out[0], 4, "BSH", softmax_max=out[1][:1], softmax_sum=out[2], attention_in=out[0])


# ---- tracing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fake_tensor_shapes(layout):
    from torch._subclasses.fake_tensor import FakeTensorMode
    n, qlen = 4, [6, 10]
    q, k, v = make_qkv(layout, 2, n, 2, 6, 10, 8, dv=4, qlen=qlen, kvlen=qlen)
    kw = dict(scale=0.5, atten_mask=COMPRESSED, sparse_mode=2)
    if layout == "TND":
        kw.update(actual_seq_qlen=tnd_ends(qlen), actual_seq_kvlen=tnd_ends(qlen))
    real = FA(q.npu(), k.npu(), v.npu(), n, layout, **{**kw, "atten_mask": COMPRESSED.npu()})
    tensors = [t.npu() for t in (q, k, v, COMPRESSED)]
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fq, fk, fv, fm = (mode.from_tensor(t) for t in tensors)
        fake = FA(fq, fk, fv, n, layout, **{**kw, "atten_mask": fm})
        grads = FA_GRAD(fq, fk, fv, fake[0], n, layout, softmax_max=fake[1], softmax_sum=fake[2],
                        attention_in=fake[0], scale_value=0.5, **{key: val for key, val in kw.items()
                                                                    if key not in ("scale", "atten_mask")})
    for f, r in zip(fake[:4], real[:4]):
        assert f.shape == r.shape and f.dtype == r.dtype and f.device == r.device
    assert fake[6] == real[6]
    for g, t in zip(grads[:3], (q, k, v)):
        assert g.shape == t.shape
    assert grads[3].shape == (0,) and grads[4].shape == (0,)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile(backend):
    torch._dynamo.reset()
    n = 2
    q, k, v = (t.npu() for t in make_qkv("BSND", 2, n, n, 24, 24, 8))
    mask = COMPRESSED.npu()

    def f(q, k, v):
        out = torch_npu.npu_fusion_attention(q, k, v, n, "BSND", atten_mask=mask, sparse_mode=3, scale=0.3)
        return out[0] * 2

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    y = compiled(*leaves)
    y_ref = f(*eager)
    torch.testing.assert_close(y.cpu(), y_ref.cpu())
    y.sum().backward()
    y_ref.sum().backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu())


def test_compile_dropout_with_explicit_seed():
    torch._dynamo.reset()
    q, k, v = (t.npu() for t in make_qkv("BNSD", 1, 2, 2, 16, 16, 8))

    def f(q, k, v):
        return torch_npu.npu_fusion_attention(q, k, v, 2, "BNSD", keep_prob=0.7, seed=11, offset=0)[0]

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).sum().backward()
    f(*eager).sum().backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu())


# ---- memory and integrations ---------------------------------------------------------------------
def test_extra_memory_is_not_quadratic():
    b, n, s, d = 1, 4, 2048, 64
    q, k, v = (torch.randn(b, n, s, d).npu() for _ in range(3))
    mask = COMPRESSED.npu()
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    out = FA(q, k, v, n, "BNSD", atten_mask=mask, sparse_mode=2, scale=0.125)
    torch.npu.synchronize()
    extra = torch.npu.max_memory_allocated() - base
    scores = b * n * s * s * 4
    outputs = sum(t.numel() * t.element_size() for t in out[:4])
    # outputs plus per-thread workspaces of O(S * D); the score matrix alone would be 64 MiB
    assert extra - outputs < scores / 16, (extra, outputs, scores)


def test_transformers_npu_flash_attention():
    pytest.importorskip("transformers")
    from transformers.integrations import npu_flash_attention as integration
    if not hasattr(integration, "npu_fusion_attention"):
        pytest.skip("transformers did not detect torch_npu")
    b, s, n, d = 2, 24, 4, 16
    q, k, v = make_qkv("BSND", b, n, n, s, s, d)
    out = integration.npu_flash_attn_func(q.npu(), k.npu(), v.npu(), causal=True)
    ref, _, _ = ref_layout(q.double(), k.double(), v.double(), n, "BSND", 1 / math.sqrt(d),
                           atten_mask=COMPRESSED, sparse_mode=integration.SPARSE_MODE)
    torch.testing.assert_close(out.cpu().double(), ref, **TOL[torch.float32])
    lengths = [10, 14]
    tq, tk, tv = make_qkv("TND", 0, n, n, 0, 0, d, qlen=lengths, kvlen=lengths)
    cu = torch.tensor([0] + tnd_ends(lengths)).npu()
    out = integration.npu_flash_attn_varlen_func(tq.npu(), tk.npu(), tv.npu(), cu, cu, causal=True)
    ref, _, _ = ref_layout(tq.double(), tk.double(), tv.double(), n, "TND", 1 / math.sqrt(d),
                           atten_mask=COMPRESSED, sparse_mode=integration.SPARSE_MODE, qlen=tnd_ends(lengths),
                           kvlen=tnd_ends(lengths))
    torch.testing.assert_close(out.cpu().double(), ref, **TOL[torch.float32])


def test_non_contiguous_inputs_and_other_device():
    q, k, v = make_qkv("BSND", 2, 2, 2, 12, 20, 8)
    # BNSD views of BSND tensors: not contiguous, copied before the kernel reads them
    views = [t.npu().transpose(1, 2) for t in (q, k, v)]
    assert not views[0].is_contiguous()
    out = FA(*views, 2, "BNSD", scale=0.5)[0]
    ref, _, _ = ref_layout(*(t.double() for t in (q, k, v)), 2, "BSND", 0.5)
    torch.testing.assert_close(out.transpose(1, 2).cpu().double(), ref, **TOL[torch.float32])
    if torch.npu.device_count() > 1:
        out1 = FA(*(t.to("npu:1") for t in (q, k, v)), 2, "BSND", scale=0.5)[0]
        assert out1.device == torch.device("npu:1")
        torch.testing.assert_close(out1.cpu().double(), ref, **TOL[torch.float32])
