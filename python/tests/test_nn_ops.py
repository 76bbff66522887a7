"""Dtype rules of nn operators on npu, as torch_npu's aclnn kernels have them: F.one_hot and
torch.histc of integer tensors, int32 class targets of the losses, softmax / log_softmax with
half_to_float, silu's backward rounded once; references computed here."""
import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401


# ---- F.one_hot of int32 labels (torch_npu: any integer dtype, result in that dtype) ----------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
def test_one_hot_takes_integer_labels_of_any_dtype(dtype):
    labels = torch.tensor([[0, 2], [1, 4]])
    ref = torch.nn.functional.one_hot(labels)  # int64, 5 classes
    out = torch.nn.functional.one_hot(labels.to(dtype).npu())
    assert out.dtype == dtype and out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), ref.to(dtype))
    out = torch.nn.functional.one_hot(labels.to(dtype).npu(), num_classes=7)
    torch.testing.assert_close(out.cpu(), torch.nn.functional.one_hot(labels, 7).to(dtype))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_counts_integer_tensors(dtype):
    """As aclnnHistc and CUDA (transformers' MoE routing counts int32 expert ids with it):
    the counts in the input's dtype; CPU's kernel takes floating types only."""
    ids = torch.tensor([0, 0, 1, 3, 3, 3, 7], dtype=dtype)
    counts = torch.histc(ids.npu(), bins=4, min=0, max=3)
    assert counts.dtype == dtype and counts.device.type == "npu"
    assert counts.cpu().tolist() == [2, 1, 0, 3]  # 7 is outside [min, max]
    out = torch.empty(0, dtype=dtype, device="npu")
    assert torch.histc(ids.npu(), bins=4, min=0, max=3, out=out) is out
    assert out.cpu().tolist() == [2, 1, 0, 3]
    with pytest.raises(RuntimeError, match="expected out of dtype"):
        torch.histc(ids.npu(), bins=4, out=torch.empty(0, device="npu"))
    floats = torch.histc(ids.float().npu(), bins=4, min=0, max=3)
    assert floats.dtype == torch.float32 and floats.cpu().tolist() == [2, 1, 0, 3]


def test_one_hot_rejects_what_pytorch_rejects():
    f = torch.nn.functional.one_hot
    with pytest.raises(RuntimeError, match="integer type"):
        f(torch.tensor([0.0, 1.0]).npu())
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        f(torch.tensor([0, 3]).npu(), 3)
    with pytest.raises(RuntimeError, match="non-negative"):
        f(torch.tensor([-1, 0]).npu())
    with pytest.raises(RuntimeError, match="empty tensor"):
        f(torch.tensor([], dtype=torch.long).npu())
    assert f(torch.tensor([], dtype=torch.int32).npu(), 3).shape == (0, 3)


# ---- int32 class targets and half_to_float softmax, as torch_npu's aclnn kernels take them ----

@pytest.mark.parametrize("loss", ["nll_loss", "nll_loss2d", "multilabel_margin_loss"])
def test_losses_take_int32_targets(loss):
    torch.manual_seed(0)
    if loss == "nll_loss":
        x, target = torch.randn(6, 5).log_softmax(1), torch.randint(0, 5, (6,))
        fn = torch.nn.functional.nll_loss
    elif loss == "nll_loss2d":
        x, target = torch.randn(2, 5, 3, 3).log_softmax(1), torch.randint(0, 5, (2, 3, 3))
        fn = torch.nn.functional.nll_loss
    else:
        x, target = torch.randn(4, 5), torch.tensor([[1, 2, -1, 0, 0]] * 4)
        fn = torch.nn.functional.multilabel_margin_loss
    expected_x = x.clone().requires_grad_()
    expected = fn(expected_x, target)
    expected.backward()
    npu_x = x.npu().requires_grad_()
    got = fn(npu_x, target.to(torch.int32).npu())
    torch.testing.assert_close(got.cpu(), expected.detach())
    if loss == "multilabel_margin_loss":
        # torch_npu registers no kernel for multilabel_margin_loss_backward: it takes the CPU
        # fallback, whose kernel wants int64 targets.
        got = fn(npu_x, target.npu())
    got.backward()
    torch.testing.assert_close(npu_x.grad.cpu(), expected_x.grad)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_half_to_float(log):
    x = torch.randn(4, 7, dtype=torch.float16)
    op = torch._log_softmax if log else torch._softmax
    npu_x = x.npu().requires_grad_()
    y = op(npu_x, 1, True)
    assert y.dtype == torch.float32
    ref_x = x.float().requires_grad_()
    ref = op(ref_x, 1, False)
    torch.testing.assert_close(y.detach().cpu(), ref.detach())
    weight = torch.randn(4, 7)
    (y * weight.npu()).sum().backward()
    (ref * weight).sum().backward()
    assert npu_x.grad.dtype == torch.float16
    torch.testing.assert_close(npu_x.grad.cpu(), ref_x.grad.half())


# ---- silu_backward: one rounding (the kernel), not PyTorch's decomposition ------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_silu_backward_matches_cpu_kernel(dtype):
    x = (torch.rand(4096) * 20 - 10).to(dtype)
    xc = x.clone().requires_grad_()
    F.silu(xc).sum().backward()
    xn = x.npu().requires_grad_()
    F.silu(xn).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, atol=0, rtol=0)
    # Huawei's test_activations.py::test_silu: the float32 gradient rounded once.
    xf = x.float().requires_grad_()
    (xf * torch.sigmoid(xf)).sum().backward()
    torch.testing.assert_close(xn.grad.cpu().float(), xf.grad.to(dtype).float(), atol=0, rtol=1e-2)


def test_silu_double_backward():
    x = torch.randn(5, dtype=torch.double).npu().requires_grad_()
    assert torch.autograd.gradgradcheck(F.silu, (x,))
