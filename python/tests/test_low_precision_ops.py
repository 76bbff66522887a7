"""float16/bfloat16 operators computed in float32 on npu, as torch_npu's aclnn kernels do.

Some ATen CPU kernels have no float16/bfloat16 version (avg_pool3d, cdist, the antialiased
upsamplings, ctc_loss, rrelu_with_noise, multilabel_margin_loss) and some accumulate in the
low precision (the slow convolutions, binary_cross_entropy_with_logits' composite kernel, index_add);
torch_npu computes them in float32 and rounds the results once. So here the npu result of a
float16/bfloat16 input equals the float32 computation on the CPU rounded to that dtype.
"""
import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401

LOW = [torch.float16, torch.bfloat16]


def _rounded(fn, *args, dtype):
    """fn on float32 CPU copies of args, its floating results rounded to dtype."""
    out = fn(*(a.float() if a.is_floating_point() else a for a in args))
    return out.to(dtype)


def _npu(*args, dtype):
    return [a.to(dtype).npu() if a.is_floating_point() else a.npu() for a in args]


@pytest.mark.parametrize("dtype", LOW)
def test_avg_pool3d_in_low_precision_forward_and_backward(dtype):
    x = torch.randn(2, 3, 6, 6, 6).to(dtype).float()
    xn = x.to(dtype).npu().requires_grad_()
    out = F.avg_pool3d(xn, 2, stride=2)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu(), _rounded(lambda v: F.avg_pool3d(v, 2, stride=2), x, dtype=dtype),
                               rtol=0, atol=0)
    out.sum().backward()
    assert xn.grad.dtype == dtype
    torch.testing.assert_close(xn.grad.cpu().float(), torch.full_like(x, 1 / 8))


def test_low_precision_out_variant_returns_and_fills_the_callers_tensor():
    x = torch.randn(1, 2, 4, 4, 4)
    out = torch.empty(0, dtype=torch.float16).npu()
    returned = torch.ops.aten.avg_pool3d.out(x.half().npu(), [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True, None,
                                             out=out)
    assert returned is out and out.shape == (1, 2, 2, 2, 2) and out.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), F.avg_pool3d(x.half().float(), 2).half(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW)
def test_cdist_in_low_precision(dtype):
    a, b = torch.randn(5, 8).to(dtype).float(), torch.randn(4, 8).to(dtype).float()
    for p in (0.0, 1.0, 2.0, 3.0, float("inf")):
        an, bn = _npu(a, b, dtype=dtype)
        an.requires_grad_()
        out = torch.cdist(an, bn, p=p)
        assert out.dtype == dtype
        ref = _rounded(lambda u, v: torch.cdist(u, v, p=p), a, b, dtype=dtype)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-2, atol=1e-2)
        out.sum().backward()
        assert an.grad.dtype == dtype and an.grad.shape == a.shape


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_antialiased_upsampling_in_float16(mode):
    x = torch.randn(1, 3, 8, 8).half().float()
    xn = x.half().npu().requires_grad_()
    out = F.interpolate(xn, scale_factor=0.5, mode=mode, antialias=True)
    assert out.dtype == torch.float16
    ref = _rounded(lambda v: F.interpolate(v, scale_factor=0.5, mode=mode, antialias=True), x, dtype=torch.float16)
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)
    out.sum().backward()
    xc = x.clone().requires_grad_()
    F.interpolate(xc, scale_factor=0.5, mode=mode, antialias=True).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad.half(), rtol=0, atol=0)


def test_ctc_loss_kernel_in_float16():
    torch.manual_seed(0)
    log_probs = torch.randn(6, 2, 5).log_softmax(2).half().float()
    targets = torch.tensor([[1, 2, 3], [2, 4, 1]])
    nll, alpha = torch.ops.aten._ctc_loss(log_probs.half().npu(), targets.npu(), [6, 6], [3, 3])
    assert nll.dtype == torch.float16 and alpha.dtype == torch.float16
    ref_nll, ref_alpha = torch.ops.aten._ctc_loss(log_probs, targets, [6, 6], [3, 3])
    torch.testing.assert_close(nll.cpu(), ref_nll.half(), rtol=0, atol=0)
    grad = torch.ops.aten._ctc_loss_backward(torch.ones(2, dtype=torch.float16).npu(), log_probs.half().npu(),
                                             targets.npu(), [6, 6], [3, 3], nll, alpha, 0)
    ref_grad = torch.ops.aten._ctc_loss_backward(torch.ones(2), log_probs, targets, [6, 6], [3, 3], ref_nll,
                                                 ref_alpha, 0)
    assert grad.dtype == torch.float16
    torch.testing.assert_close(grad.cpu().float(), ref_grad, rtol=2e-3, atol=2e-3)


def test_rrelu_with_noise_in_float16_writes_its_noise():
    x = torch.randn(64).half()
    noise = torch.empty(64, dtype=torch.float16).npu()
    out = torch.ops.aten.rrelu_with_noise(x.npu(), noise, 0.1, 0.3, True)
    assert out.dtype == torch.float16 and noise.dtype == torch.float16
    n = noise.cpu()
    assert ((n[x >= 0] == 1).all() and (n[x < 0] >= 0.0999).all() and (n[x < 0] <= 0.3001).all())
    torch.testing.assert_close(out.cpu(), (x.float() * n.float()).half(), rtol=1e-3, atol=1e-3)


def test_multilabel_margin_loss_in_float16_with_int32_targets():
    x = torch.randn(3, 4).half().float()
    y = torch.tensor([[1, 2, -1, 0], [0, -1, 2, 3], [3, 1, 0, -1]])
    loss = F.multilabel_margin_loss(x.half().npu(), y.int().npu())
    assert loss.dtype == torch.float16
    torch.testing.assert_close(loss.cpu(), F.multilabel_margin_loss(x, y).half(), rtol=0, atol=0)


def test_binary_cross_entropy_with_logits_rounds_once_in_float16():
    torch.manual_seed(0)
    x = (torch.rand(20, 32) * 10).half().float()
    t = torch.randint(0, 2, (20, 32)).float()
    w = (torch.rand(32) * 10).half().float()
    for reduction in ("none", "mean", "sum"):
        out = F.binary_cross_entropy_with_logits(x.half().npu(), t.half().npu(), weight=w.half().npu(),
                                                 pos_weight=w.half().npu(), reduction=reduction)
        assert out.dtype == torch.float16
        ref = F.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=w, reduction=reduction).half()
        torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)
    # float32 unchanged, and autograd goes through it
    xn = x.npu().requires_grad_()
    F.binary_cross_entropy_with_logits(xn, t.npu()).backward()
    xc = x.clone().requires_grad_()
    F.binary_cross_entropy_with_logits(xc, t).backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)


@pytest.mark.parametrize("dtype", LOW)
def test_convolutions_accumulate_in_float32(dtype):
    """conv2d (convolution_overrideable) and its backward: the float32 result rounded once."""
    torch.manual_seed(0)
    x = torch.rand(1, 64, 6, 6).to(dtype).float() * 10
    w = torch.rand(8, 64, 3, 3).to(dtype).float() * 10
    xn, wn = (t.to(dtype).npu().requires_grad_() for t in (x, w))
    out = F.conv2d(xn, wn, padding=1)
    assert out.dtype == dtype
    xc, wc = (t.clone().requires_grad_() for t in (x, w))
    ref = F.conv2d(xc, wc, padding=1)
    torch.testing.assert_close(out.cpu(), ref.to(dtype))
    out.backward(torch.ones_like(out))
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(wn.grad.cpu(), wc.grad.to(dtype))
    torch.testing.assert_close(xn.grad.cpu(), xc.grad.to(dtype))


def test_slow_conv_transpose2d_in_float16_matches_the_float32_reference():
    torch.manual_seed(0)
    x = (torch.rand(1, 12, 20, 20) * 10).half().float()
    w = (torch.rand(12, 12, 3, 3) * 10).half().float()
    b = (torch.rand(12) * 10).half().float()
    xn, wn, bn = (t.half().npu().requires_grad_() for t in (x, w, b))
    out = torch._C._nn.slow_conv_transpose2d(xn, wn, kernel_size=[3, 3], bias=bn)
    assert out.dtype == torch.float16
    xc, wc, bc = (t.clone().requires_grad_() for t in (x, w, b))
    ref = torch._C._nn.slow_conv_transpose2d(xc, wc, kernel_size=[3, 3], bias=bc)
    torch.testing.assert_close(out.cpu(), ref.half())
    out.backward(torch.ones_like(out))
    ref.backward(torch.ones_like(ref))
    for got, want in ((xn, xc), (wn, wc), (bn, bc)):
        torch.testing.assert_close(got.grad.cpu(), want.grad.half())


def test_nnpack_spatial_convolution_runs_on_npu():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 2), torch.randn(5)
    xn = x.npu().requires_grad_()
    out = torch._nnpack_spatial_convolution(xn, w.npu(), b.npu(), [1, 2], [2, 1])
    assert out.device.type == "npu"
    ref = F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    xc = x.clone().requires_grad_()
    F.conv2d(xc, w, b, stride=(2, 1), padding=(1, 2)).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="_nnpack_spatial_convolution: expected a 4-D input"):
        torch._nnpack_spatial_convolution(x[0].npu(), w.npu(), None, [0, 0])


def test_native_batch_norm_inference_saves_have_num_features():
    """In inference torch_npu's native_batch_norm returns save_mean/save_invstd of shape [C]
    (ATen's meta shape; unfilled), the CPU kernel [0]; training results are the CPU's."""
    x = torch.randn(3, 4, 5)
    rm, rv = torch.randn(4), torch.rand(4) + 0.5
    out, sm, si = torch.ops.aten.native_batch_norm(x.npu(), None, None, rm.npu(), rv.npu(), False, 0.1, 1e-5)
    assert sm.shape == (4,) and si.shape == (4,) and sm.device.type == "npu"
    ref = torch.ops.aten.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5)[0]
    torch.testing.assert_close(out.cpu(), ref)
    _, sm, si = torch.ops.aten.native_batch_norm(x.npu(), None, None, rm.npu(), rv.npu(), True, 0.1, 1e-5)
    torch.testing.assert_close(sm.cpu(), x.mean((0, 2)))


@pytest.mark.parametrize("dtype", LOW)
def test_index_add_accumulates_in_float32(dtype):
    """index_add sums many source rows into one: float32 inside, rounded once (as aclnnIndexAdd);
    repeat_interleave's backward is such a sum (Huawei's test_repeat_interleave_backward)."""
    torch.manual_seed(0)
    base, src = torch.rand(4, 8).to(dtype).float(), torch.rand(200, 8).to(dtype).float()
    index = torch.randint(0, 4, (200,))
    out = torch.index_add(*_npu(base, dtype=dtype), 0, index.npu(), *_npu(src, dtype=dtype))
    torch.testing.assert_close(out.cpu(), _rounded(lambda b, s: b.index_add(0, index, s), base, src, dtype=dtype),
                               rtol=0, atol=0)
    x = torch.rand(40, 1, 16).to(dtype).requires_grad_()
    y = torch.repeat_interleave(x.npu(), 100, 0)
    grad = torch.rand(y.shape).to(dtype)
    y.backward(grad.npu())
    expected = grad.float().view(40, 100, 1, 16).sum(1).to(dtype)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW)
def test_binary_cross_entropy_with_logits_gradient_in_one_float32_kernel(dtype):
    # npu_binary_cross_entropy_with_logits_backward (op-plugin's derivative) computes the input
    # gradient in float32 and rounds once; torch's formula in float16 steps lost up to 3x on
    # op-plugin's test_binary_cross_with_logits_backward_module_float16 (weights and pos_weight to 10)
    torch.manual_seed(0)
    x, t = torch.rand(10, 64) * 10, torch.randint(0, 2, (10, 64)).float()
    w, pw = torch.rand(10, 64) * 10, torch.rand(10, 64) * 10
    x, t, w, pw = (a.to(dtype).float() for a in (x, t, w, pw))  # representable in dtype
    for reduction in ("mean", "sum", "none"):
        ref_x, ref_t = x.clone().requires_grad_(), t.clone().requires_grad_()
        F.binary_cross_entropy_with_logits(ref_x, ref_t, w, pos_weight=pw, reduction=reduction).sum().backward()
        nx, nt = (a.to(dtype).npu().requires_grad_() for a in (x, t))
        F.binary_cross_entropy_with_logits(nx, nt, w.to(dtype).npu(), pos_weight=pw.to(dtype).npu(),
                                           reduction=reduction).sum().backward()
        torch.testing.assert_close(nx.grad.cpu(), ref_x.grad.to(dtype))
        torch.testing.assert_close(nt.grad.cpu(), ref_t.grad.to(dtype))
    # float64 stays float64, and the gradient is differentiable again
    x64 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    t64 = torch.rand(3, 4, dtype=torch.float64)
    assert torch.autograd.gradgradcheck(
        lambda a: F.binary_cross_entropy_with_logits(a.npu(), t64.npu(), pos_weight=t64.npu() + 1).cpu(), (x64,))


def test_cdist_inf_gradient_reaches_the_rounded_distance_in_float16():
    # p = inf: the float16 distance is rounded; the gradient goes to every coordinate with
    # |x1 - x2| >= it, as aclnn (op-plugin's test_cdis_backward_inf): ATen's float32 kernel
    # asked for equality and dropped the gradient where the rounding went down
    gen = torch.Generator().manual_seed(10086)
    x1 = (torch.rand(5, 10, generator=gen) * 2 - 1).half()
    x2 = (torch.rand(4, 10, generator=gen) * 2 - 1).half()
    a = x1.npu().requires_grad_()
    torch.cdist(a, x2.npu(), float("inf")).sum().backward()
    diff = x1.float()[:, None] - x2.float()[None]
    dist = diff.abs().amax(-1).half().float()
    expected = (diff.sign() * (diff.abs() >= dist[..., None])).sum(1)
    torch.testing.assert_close(a.grad.cpu(), expected.half())
    assert (diff.abs() > dist[..., None]).any() or (diff.abs().amax(-1) != dist).any()  # the case arises here


@pytest.mark.parametrize("mode,shape,size", [("linear", (4, 8, 40), (77,)), ("bicubic", (2, 3, 9, 11), (17, 23)),
                                             ("trilinear", (1, 2, 5, 6, 7), (9, 11, 13))])
def test_interpolations_round_once_in_float16(mode, shape, size):
    # the CPU kernels round their weighted sums in float16 (up to 0.0625 off at ~100, op-plugin's
    # test_upsample_linear1d); aclnn computes in float32 and rounds once
    torch.manual_seed(0)
    x = (torch.rand(shape) * 100).half()
    got = F.interpolate(x.npu(), size=size, mode=mode, align_corners=False).cpu()
    assert torch.equal(got, _rounded(lambda t: F.interpolate(t, size=size, mode=mode, align_corners=False), x,
                                     dtype=torch.float16))


def test_nll_loss_sums_in_float32_in_float16():
    # the CPU kernel sums the picked log-probabilities in float16 (off by ulps over thousands of rows,
    # op-plugin's test_nllloss_shape_format_fp16); aclnn sums in float32 and rounds once
    torch.manual_seed(0)
    x = (torch.rand(4800, 300) * 200 - 100).half()
    t = torch.randint(0, 300, (4800,))
    for reduction in ("sum", "mean"):
        got = F.nll_loss(x.npu(), t.int().npu(), reduction=reduction, ignore_index=1).cpu()
        assert torch.equal(got, F.nll_loss(x.float(), t, reduction=reduction, ignore_index=1).half())
