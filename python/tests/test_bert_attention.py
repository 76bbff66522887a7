"""BERT attention operators (custom_ops/src/bert_attention.cpp) and
torch_npu.contrib.function.npu_fused_attention(_with_layernorm), against plain PyTorch
references computed here on the CPU."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from torch_npu.contrib.function import npu_fused_attention, npu_fused_attention_with_layernorm

NZ, ND = 29, 2
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.float64: dict(atol=1e-10, rtol=1e-10)}


def nz(t):
    return torch_npu.npu_format_cast(t.npu(), NZ)


def attention_ref(q, k, v, mask, scale, keep_prob, drop_mask):
    """softmax(q k^T * scale + mask) with dropout, times v; context as [B*S, N*Dv] rows."""
    b, n, s, _ = q.shape
    p = torch.softmax(q @ k.transpose(-1, -2) * scale + mask, -1)
    keep = drop_mask.view(p.shape).to(p.dtype) * (1 / keep_prob if keep_prob > 0 else 0)
    ctx = (p * keep) @ v
    return ctx.transpose(1, 2).reshape(b * s, n * v.shape[-1]), p


def rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


# ---- npu_fused_attention_score(_fwd, _backward, _grad) ------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("keep_prob", [1.0, 0.8])
def test_score_fwd_and_backward_match_reference(dtype, keep_prob):
    torch.manual_seed(1)
    B, N, S, Sk, D, Dv = 2, 3, 6, 7, 8, 5
    q, k, v = rand(B, N, S, D, dtype=dtype), rand(B, N, Sk, D, dtype=dtype), rand(B, N, Sk, Dv, dtype=dtype)
    mask = torch.where(torch.rand(B, 1, S, Sk) < 0.2, -10000.0, 0.0).to(dtype)
    qn, kn, vn = (t.npu().requires_grad_() for t in (q, k, v))
    ctx, sm, dm = torch_npu.npu_fused_attention_score_fwd(qn, kn, vn, mask.npu(), 0.35, keep_prob)
    assert ctx.shape == (B * S, N * Dv) and sm.shape == (B, N, S, Sk) and dm.shape == (B * N * S * Sk,)
    assert dm.dtype == torch.uint8 and set(dm.cpu().unique().tolist()) <= {0, 1}
    if keep_prob == 1.0:
        assert bool((dm.cpu() == 1).all())
    else:
        assert 0.6 < dm.float().mean().item() < 0.95  # 504 Bernoulli(0.8) draws
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    ref, p = attention_ref(qr, kr, vr, mask.float(), 0.35, keep_prob, dm.cpu())
    torch.testing.assert_close(ctx.cpu().float(), ref.detach(), **TOL[dtype])
    torch.testing.assert_close(sm.cpu().float(), p.detach(), **TOL[dtype])

    g = rand(B * S, N * Dv, dtype=dtype)
    ctx.backward(g.npu())
    ref.backward(g.float())
    for got, want in ((qn, qr), (kn, kr), (vn, vr)):
        assert got.grad.shape == want.shape
        torch.testing.assert_close(got.grad.cpu().float(), want.grad, **TOL[dtype])

    # _grad: the same gradients as [B*S, N*D] rows in FRACTAL_NZ
    dq, dk, dv = torch_npu.npu_fused_attention_score_grad(g.npu(), sm, qn.detach(), kn.detach(), vn.detach(), dm,
                                                          0.35, keep_prob)
    for got, want in ((dq, qr), (dk, kr), (dv, vr)):
        assert torch_npu.get_npu_format(got) == NZ
        assert got.shape == (want.shape[0] * want.shape[2], want.shape[1] * want.shape[3])
        torch.testing.assert_close(got.cpu().float(), want.grad.transpose(1, 2).reshape(got.shape), **TOL[dtype])


def test_score_backward_returns_bnsd_views():
    B, N, S, D = 1, 2, 4, 8
    q, k, v = (rand(B, N, S, D).npu() for _ in range(3))
    ctx, sm, dm = torch_npu.npu_fused_attention_score_fwd(q, k, v, torch.zeros(B, 1, S, S).npu(), 1.0, 1.0)
    dq, dk, dv = torch_npu.npu_fused_attention_score_backward(torch.ones_like(ctx), sm, q, k, v, dm, 1.0, 1.0)
    for t in (dq, dk, dv):
        assert t.shape == (B, N, S, D)
        assert t.stride() == (S * N * D, D, N * D, 1)  # [B, S, N, D] buffers, as torch_npu's kernel


def test_score_gradcheck_and_composite():
    torch.manual_seed(2)
    B, N, S, D = 1, 2, 3, 4
    args = [rand(B, N, S, D, dtype=torch.float64).npu().requires_grad_() for _ in range(3)]
    mask = rand(B, N, S, S, dtype=torch.float64).npu()
    assert torch.autograd.gradcheck(
        lambda q, k, v: torch_npu.npu_fused_attention_score(q, k, v, mask, 0.7, 1.0), args)
    # with dropout: the same seed draws the same mask
    torch.npu.manual_seed(7)
    a = torch_npu.npu_fused_attention_score(*args, mask, 0.7, 0.5)
    torch.npu.manual_seed(7)
    b = torch_npu.npu_fused_attention_score_fwd(*args, mask, 0.7, 0.5)
    torch.npu.manual_seed(8)
    c = torch_npu.npu_fused_attention_score_fwd(*args, mask, 0.7, 0.5)
    assert torch.equal(a.cpu(), b[0].cpu())
    assert not torch.equal(b[2].cpu(), c[2].cpu())


def test_score_keep_prob_zero_drops_everything():
    q = rand(1, 1, 4, 8).npu()
    ctx, sm, dm = torch_npu.npu_fused_attention_score_fwd(q, q, q, torch.zeros(1, 1, 4, 4).npu(), 1.0, 0.0)
    assert bool((dm.cpu() == 0).all()) and bool((ctx.cpu() == 0).all())
    torch.testing.assert_close(sm.cpu().sum(-1), torch.ones(1, 1, 4))


def test_score_nz_inputs_give_nz_outputs():
    torch.manual_seed(3)
    q, k, v = (rand(2, 2, 16, 16) for _ in range(3))
    mask = torch.zeros(2, 1, 16, 16)
    ctx, sm, dm = torch_npu.npu_fused_attention_score_fwd(nz(q), nz(k), nz(v), nz(mask), 0.25, 1.0)
    assert [torch_npu.get_npu_format(t) for t in (ctx, sm, dm)] == [NZ, NZ, ND]
    ref, _ = attention_ref(q, k, v, mask, 0.25, 1.0, torch.ones(2 * 2 * 16 * 16, dtype=torch.uint8))
    torch.testing.assert_close(ctx.cpu(), ref, **TOL[torch.float32])


def test_score_bad_arguments():
    q = rand(1, 2, 4, 8).npu()
    m = torch.zeros(1, 1, 4, 4).npu()
    with pytest.raises(RuntimeError, match="key_layer of shape"):
        torch_npu.npu_fused_attention_score_fwd(q, rand(1, 2, 4, 6).npu(), q, m, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="attention_mask broadcastable"):
        torch_npu.npu_fused_attention_score_fwd(q, q, q, torch.zeros(1, 1, 3, 4).npu(), 1.0, 1.0)
    with pytest.raises(RuntimeError, match="keep_prob in"):
        torch_npu.npu_fused_attention_score_fwd(q, q, q, m, 1.0, 1.5)
    with pytest.raises(RuntimeError, match="query_layer to be 4-dimensional"):
        torch_npu.npu_fused_attention_score_fwd(q[0], q, q, m, 1.0, 1.0)
    with pytest.raises(NotImplementedError, match="key_transpose"):
        torch_npu.npu_fused_attention_score_fwd(q, q, q, m, 1.0, 1.0, key_transpose=True)
    ctx, sm, dm = torch_npu.npu_fused_attention_score_fwd(q, q, q, m, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="mask .*the dropout mask"):
        torch_npu.npu_fused_attention_score_grad(ctx, sm, q, q, q, dm[:5], 1.0, 1.0)
    with pytest.raises(RuntimeError, match="grad_output of the context's shape"):
        torch_npu.npu_fused_attention_score_backward(ctx[:2], sm, q, q, q, dm, 1.0, 1.0)


# ---- layer norm + q/k/v projections and their gradients ------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layernorm_qkv_fwd_matches_reference(dtype):
    torch.manual_seed(4)
    B, S, N, H = 2, 16, 4, 64
    x = rand(B * S, H, dtype=dtype, scale=3)
    ws = [rand(H, H, dtype=dtype, scale=0.1) for _ in range(3)]
    bs = [rand(H, dtype=dtype) for _ in range(3)]
    gamma, beta = rand(H, dtype=dtype), rand(H, dtype=dtype)
    out = torch_npu.npu_fused_attention_layernorm_qkv_fwd(nz(x), *(nz(w) for w in ws), gamma.npu(), beta.npu(),
                                                          *(b.npu() for b in bs), S, N)
    norm, q, k, v, mean, var = out
    xf = x.float()
    ref_norm = F.layer_norm(xf, (H,), gamma.float(), beta.float(), eps=1e-5)
    torch.testing.assert_close(norm.cpu().float(), ref_norm, **TOL[dtype])
    torch.testing.assert_close(mean.cpu().float(), xf.mean(1), **TOL[dtype])
    torch.testing.assert_close(var.cpu().float(), xf.var(1, unbiased=False), **TOL[dtype])
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else TOL[dtype]
    for got, w, b in zip((q, k, v), ws, bs):
        want = (norm.cpu().float() @ w.float() + b.float()).view(B, S, N, H // N).transpose(1, 2)
        assert got.shape == (B, N, S, H // N)
        torch.testing.assert_close(got.cpu().float(), want, **tol)
    assert [torch_npu.get_npu_format(t) for t in out] == [NZ, NZ, NZ, NZ, ND, ND]
    # ND in, ND out
    nd = torch_npu.npu_fused_attention_layernorm_qkv_fwd(x.npu(), *(w.npu() for w in ws), gamma.npu(), beta.npu(),
                                                         seq_len=S, num_heads=N)
    assert [torch_npu.get_npu_format(t) for t in nd[:4]] == [ND] * 4
    torch.testing.assert_close(nd[1].cpu().float(),
                               (ref_norm @ ws[0].float()).view(B, S, N, H // N).transpose(1, 2), **tol)


def test_layernorm_qkv_fwd_bad_arguments():
    x, w, g = rand(32, 64).npu(), rand(64, 64).npu(), rand(64).npu()
    with pytest.raises(RuntimeError, match="divisible by seq_len"):
        torch_npu.npu_fused_attention_layernorm_qkv_fwd(x, w, w, w, g, g, seq_len=5, num_heads=4)
    with pytest.raises(RuntimeError, match="divisible by num_heads"):
        torch_npu.npu_fused_attention_layernorm_qkv_fwd(x, w, w, w, g, g, seq_len=16, num_heads=5)
    with pytest.raises(RuntimeError, match="kernel_key of shape"):
        torch_npu.npu_fused_attention_layernorm_qkv_fwd(x, w, rand(32, 64).npu(), w, g, g, seq_len=16, num_heads=4)
    with pytest.raises(RuntimeError, match="bias_value of shape"):
        torch_npu.npu_fused_attention_layernorm_qkv_fwd(x, w, w, w, g, g, None, None, rand(3).npu(), 16, 4)
    with pytest.raises(RuntimeError, match="seq_len and num_heads > 0"):
        torch_npu.npu_fused_attention_layernorm_qkv_fwd(x, w, w, w, g, g, seq_len=0, num_heads=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_qkv_grad_matches_reference(dtype):
    torch.manual_seed(5)
    M, H = 32, 48
    h = rand(M, H, dtype=dtype).float().requires_grad_()
    ws = [rand(H, H, dtype=dtype, scale=0.2).float().requires_grad_() for _ in range(3)]
    bs = [rand(H, dtype=dtype).float().requires_grad_() for _ in range(3)]
    gs = [rand(M, H, dtype=dtype) for _ in range(3)]
    gln = rand(M, H, dtype=dtype)
    ys = [h @ w + b for w, b in zip(ws, bs)]
    torch.autograd.backward(ys + [h], [g.float() for g in gs] + [gln.float()])
    out = torch_npu.npu_fused_attention_qkv_grad(*(nz(g) for g in gs), *(nz(w.detach().to(dtype)) for w in ws),
                                                 nz(h.detach().to(dtype)), nz(gln))
    wants = [h.grad] + [w.grad for w in ws] + [b.grad for b in bs]
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)
    for got, want in zip(out, wants):
        assert got.shape == want.shape
        torch.testing.assert_close(got.cpu().float(), want, **tol)
    assert [torch_npu.get_npu_format(t) for t in out] == [NZ, NZ, NZ, NZ, ND, ND, ND]
    with pytest.raises(RuntimeError, match="grad_output_key of shape"):
        torch_npu.npu_fused_attention_qkv_grad(gs[0].npu(), gs[1][:4].npu(), gs[2].npu(),
                                               *(w.detach().to(dtype).npu() for w in ws), h.detach().to(dtype).npu(),
                                               gln.npu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_weight", [True, False])
def test_layernorm_grad_matches_reference(dtype, with_weight):
    torch.manual_seed(6)
    x = rand(3, 5, 40, dtype=dtype, scale=2)
    w = rand(40, dtype=dtype) if with_weight else None
    b = rand(40, dtype=dtype) if with_weight else None
    dy = rand(3, 5, 40, dtype=dtype)
    xr = x.float().requires_grad_()
    wr = (w.float() if with_weight else torch.ones(40)).requires_grad_()
    br = (b.float() if with_weight else torch.zeros(40)).requires_grad_()
    F.layer_norm(xr, (40,), wr, br, eps=1e-5).backward(dy.float())
    mean = x.float().mean(-1)
    var = x.float().var(-1, unbiased=False)  # torch_npu's LayerNormGrad takes the variance
    dx, dg, db = torch_npu.npu_layernorm_grad(dy.npu(), x.npu(), [40], mean.npu(), var.npu(),
                                              w.npu() if with_weight else None, b.npu() if with_weight else None)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx.cpu().float(), xr.grad, **tol)
    torch.testing.assert_close(dg.cpu().float(), wr.grad, **tol)
    torch.testing.assert_close(db.cpu().float(), br.grad, **tol)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        torch_npu.npu_layernorm_grad(dy.npu(), x.npu(), [41], mean.npu(), var.npu(), None, None)
    with pytest.raises(RuntimeError, match="mean and rstd"):
        torch_npu.npu_layernorm_grad(dy.npu(), x.npu(), [40], mean[:2].npu(), var.npu(), None, None)


# ---- npu_linear -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_forward_backward(dtype):
    torch.manual_seed(7)
    x, w, b = rand(12, 20, dtype=dtype), rand(9, 20, dtype=dtype), rand(9, dtype=dtype)
    xn, wn, bn = (t.npu().requires_grad_() for t in (x, w, b))
    xr, wr, br = (t.float().requires_grad_() for t in (x, w, b))
    y = torch_npu.npu_linear(xn, wn, bn)
    yr = F.linear(xr, wr, br)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.float16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y.cpu().float(), yr.detach(), **tol)
    g = rand(12, 9, dtype=dtype)
    y.backward(g.npu())
    yr.backward(g.float())
    for got, want in ((xn, xr), (wn, wr), (bn, br)):
        torch.testing.assert_close(got.grad.cpu().float(), want.grad, **tol)
    gi, gw = torch_npu.npu_linear_backward(g.npu(), x.npu(), w.npu())
    torch.testing.assert_close(gi.cpu().float(), xr.grad, **tol)
    torch.testing.assert_close(gw.cpu().float(), wr.grad, **tol)
    torch.testing.assert_close(torch_npu.npu_linear(x.npu(), w.npu()).cpu().float(), F.linear(x.float(), w.float()),
                               **tol)


@pytest.mark.skipif(torch.npu.device_count() < 2, reason="needs two npus")
def test_linear_on_two_devices_raises_pytorchs_error():
    x, w = torch.rand(2, 16).npu(), torch.rand(4, 16).npu()
    b = torch.rand(4).to("npu:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two "
                                           "devices, npu:0 and npu:1! .*argument bias of npu_linear"):
        torch_npu.npu_linear(x, w, b)


def test_linear_gradcheck_formats_and_errors():
    args = tuple(rand(*shape, dtype=torch.float64).npu().requires_grad_() for shape in ((4, 6), (3, 6), (3,)))
    assert torch.autograd.gradcheck(torch_npu.npu_linear, args)
    x, w = rand(16, 32), rand(16, 32)
    y = torch_npu.npu_linear(nz(x), nz(w))
    assert torch_npu.get_npu_format(y) == NZ
    torch.testing.assert_close(y.cpu(), x @ w.t(), atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="weight of shape"):
        torch_npu.npu_linear(x.npu(), rand(16, 31).npu())
    with pytest.raises(RuntimeError, match="bias of shape"):
        torch_npu.npu_linear(x.npu(), w.npu(), rand(3).npu())
    with pytest.raises(RuntimeError, match="grad of shape"):
        torch_npu.npu_linear_backward(rand(16, 3).npu(), x.npu(), w.npu())


def test_fake_shapes_match_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode
    B, N, S, D, H = 1, 2, 32, 16, 32
    q = rand(B, N, S, D).npu()
    m = torch.zeros(B, 1, S, S).npu()
    x, w, g = rand(B * S, H).npu(), rand(H, H).npu(), rand(H).npu()
    calls = [
        (torch.ops.npu.npu_fused_attention_score_fwd, (q, q, q, m, 1.0, 1.0)),
        (torch.ops.npu.npu_fused_attention_layernorm_qkv_fwd, (x, w, w, w, g, g, None, None, None, S, N)),
        (torch.ops.npu.npu_fused_attention_qkv_grad, (x, x, x, w, w, w, x, x)),
        (torch.ops.npu.npu_layernorm_grad, (x, x, [H], x[:, 0], x[:, 0], g, g)),
        (torch.ops.npu.npu_linear, (x, w, g)),
        (torch.ops.npu.npu_linear_backward, (x, x, w)),
    ]
    ctx, sm, dm = torch.ops.npu.npu_fused_attention_score_fwd(q, q, q, m, 1.0, 1.0)
    calls += [(torch.ops.npu.npu_fused_attention_score_backward, (ctx, sm, q, q, q, dm, 1.0, 1.0)),
              (torch.ops.npu.npu_fused_attention_score_grad, (ctx, sm, q, q, q, dm, 1.0, 1.0))]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for op, args in calls:
        real = op(*args)
        real = [real] if isinstance(real, torch.Tensor) else list(real)
        with mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        fake = [fake] if isinstance(fake, torch.Tensor) else list(fake)
        assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real], op
        if op is torch.ops.npu.npu_fused_attention_score_backward:
            assert [t.stride() for t in fake] == [t.stride() for t in real]


# ---- torch_npu.contrib.function ---------------------------------------------------------------

def _bert_inputs(B=2, S=32, H=768, seed=0):
    torch.manual_seed(seed)
    return dict(
        hidden_states=rand(B * S, H),
        attention_mask=torch.where(torch.rand(B, 1, S, S) < 0.15, -10000.0, 0.0),
        query_kernel=rand(H, H, scale=0.03), key_kernel=rand(H, H, scale=0.03), value_kernel=rand(H, H, scale=0.03),
        query_bias=rand(H, scale=0.1), key_bias=rand(H, scale=0.1), value_bias=rand(H, scale=0.1),
        gamma=1 + rand(H, scale=0.1), beta=rand(H, scale=0.1))


def _npu_args(inputs, names):
    out = []
    for name in names:
        t = inputs[name].npu()
        if name in ("hidden_states", "attention_mask") or name.endswith("kernel"):
            t = torch_npu.npu_format_cast(t, NZ)
        out.append(t.requires_grad_(name != "attention_mask"))
    return out


def _reference(inputs, names, scale, keep_prob, drop_mask, layernorm):
    t = {n: inputs[n].clone().requires_grad_(n != "attention_mask") for n in names}
    B, S, S2 = t["attention_mask"].shape[0], t["attention_mask"].shape[2], t["attention_mask"].shape[3]
    h = t["hidden_states"]
    x = F.layer_norm(h, (h.shape[1],), t["gamma"], t["beta"], eps=1e-5) if layernorm else h
    N = h.shape[1] // 64
    q, k, v = ((x @ t[p + "_kernel"] + t[p + "_bias"]).view(B, S, N, 64).transpose(1, 2)
               for p in ("query", "key", "value"))
    ctx, _ = attention_ref(q, k, v, t["attention_mask"], scale, keep_prob, drop_mask)
    return t, ctx, x


ARGS = ["hidden_states", "attention_mask", "query_kernel", "key_kernel", "value_kernel",
        "query_bias", "key_bias", "value_bias"]


def _mask_for(seed, numel, keep_prob):
    """The dropout mask the operators draw after torch.npu.manual_seed(seed)."""
    torch.npu.manual_seed(seed)
    q, kv = torch.zeros(1, 1, numel, 1).npu(), torch.zeros(1, 1, 1, 1).npu()
    return torch_npu.npu_fused_attention_score_fwd(q, kv, kv, kv, 1.0, keep_prob)[2].cpu()


@pytest.mark.parametrize("keep_prob", [1.0, 0.9])
def test_npu_fused_attention_end_to_end(keep_prob):
    inputs = _bert_inputs()
    args = _npu_args(inputs, ARGS)
    B, S = 2, 32
    drop_mask = _mask_for(11, B * 12 * S * S, keep_prob)
    torch.npu.manual_seed(11)
    ctx = npu_fused_attention(*args, scale=0.125, keep_prob=keep_prob)
    t, ref, _ = _reference(inputs, ARGS, 0.125, keep_prob, drop_mask, layernorm=False)
    assert ctx.shape == (B * S, 768) and torch_npu.get_npu_format(ctx) == NZ
    torch.testing.assert_close(ctx.cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
    g = rand(B * S, 768)
    ctx.backward(nz(g))
    ref.backward(g)
    for name, a in zip(ARGS, args):
        if name == "attention_mask":
            assert a.grad is None
            continue
        torch.testing.assert_close(a.grad.cpu(), t[name].grad, atol=2e-4, rtol=2e-4, msg=name)


def test_npu_fused_attention_with_layernorm_end_to_end():
    names = ARGS + ["gamma", "beta"]
    inputs = _bert_inputs(H=1024, B=1, S=32, seed=3)
    args = _npu_args(inputs, names)
    keep_prob = 0.85
    drop_mask = _mask_for(5, 16 * 32 * 32, keep_prob)
    torch.npu.manual_seed(5)
    with pytest.warns(FutureWarning, match="deprecated"):
        ctx, norm = npu_fused_attention_with_layernorm(*args, scale=0.125, keep_prob=keep_prob)
    t, ref, ref_norm = _reference(inputs, names, 0.125, keep_prob, drop_mask, layernorm=True)
    torch.testing.assert_close(norm.cpu(), ref_norm.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ctx.cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
    g, gn = rand(32, 1024), rand(32, 1024)
    (ctx * nz(g)).sum().add((norm * gn.npu()).sum()).backward()
    ((ref * g).sum() + (ref_norm * gn).sum()).backward()
    for name, a in zip(names, args):
        if name == "attention_mask":
            continue
        torch.testing.assert_close(a.grad.cpu(), t[name].grad, atol=5e-4, rtol=5e-4, msg=name)


def test_contrib_exports():
    import torch_npu.contrib.function as fn
    assert "npu_fused_attention" in fn.__all__ and "npu_fused_attention_with_layernorm" in fn.__all__
    assert fn.npu_fused_attention is npu_fused_attention


def test_npu_fused_attention_compatibility_errors():
    inputs = _bert_inputs(B=1, S=32)
    args = [t.detach() for t in _npu_args(inputs, ARGS)]
    bad = list(args)
    bad[0] = inputs["hidden_states"].npu()  # ND instead of FRACTAL_NZ
    with pytest.raises(RuntimeError, match="format not matches"):
        npu_fused_attention(*bad)
    bad = list(args)
    bad[5] = nz(inputs["query_bias"].view(1, -1))  # bias must stay ND
    with pytest.raises(RuntimeError, match="format not matches"):
        npu_fused_attention(*bad)
    bad = list(args)
    bad[0] = nz(rand(32, 512))
    with pytest.raises(RuntimeError, match="shape of hidden_states"):
        npu_fused_attention(*bad)
    bad = list(args)
    bad[0] = nz(rand(30, 768))
    with pytest.raises(RuntimeError, match="shape of hidden_states"):
        npu_fused_attention(*bad)
    bad = list(args)
    bad[1] = nz(torch.zeros(1, 2, 32, 32))
    with pytest.raises(RuntimeError, match="shape of attention_mask"):
        npu_fused_attention(*bad)
    bad = list(args)
    bad[3] = nz(rand(512, 768))
    with pytest.raises(RuntimeError, match="shape of kernel"):
        npu_fused_attention(*bad)
    gamma = nz(inputs["gamma"].view(1, -1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(RuntimeError, match="gamma or beta format"):
            npu_fused_attention_with_layernorm(*args, gamma, inputs["beta"].npu())


def test_ops_trace_under_torch_compile():
    """The fake implementations let Dynamo/AOTAutograd trace the ops and their backward."""
    def f(x, w, b, q, m):
        ctx, _, _ = torch_npu.npu_fused_attention_score_fwd(q, q, q, m, 0.5, 1.0)
        return torch_npu.npu_linear(x, w, b).sum() + ctx.sum()

    torch.manual_seed(8)
    args = [rand(8, 16).npu().requires_grad_(), rand(4, 16).npu().requires_grad_(), rand(4).npu(),
            rand(1, 2, 4, 8).npu().requires_grad_(), torch.zeros(1, 1, 4, 4).npu()]
    torch.compile(f, backend="aot_eager", fullgraph=True)(*args).backward()
    compiled = [args[i].grad.cpu() for i in (0, 1, 3)]
    for i in (0, 1, 3):
        args[i].grad = None
    f(*args).backward()
    for got, i in zip(compiled, (0, 1, 3)):
        torch.testing.assert_close(got, args[i].grad.cpu())
