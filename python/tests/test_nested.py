"""Strided nested tensors on npu (torch.nested.nested_tensor(..., device="npu"); ops/src/nested.cpp):
each operator runs PyTorch's NestedTensorCPU kernel on aliases of the npu buffers, so every result
must equal the CPU's to the bit, forward and backward."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


def _parts(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def _nested(parts, device, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor(parts, device=device, **kw)


def _same(npu, cpu):
    assert npu.device.type == "npu" and npu.is_nested == cpu.is_nested
    if cpu.is_nested:
        assert len(npu.unbind()) == len(cpu.unbind())
        for x, y in zip(npu.unbind(), cpu.unbind()):
            torch.testing.assert_close(x.cpu(), y, rtol=0, atol=0)
    else:
        torch.testing.assert_close(npu.cpu(), cpu, rtol=0, atol=0)


@pytest.mark.parametrize("op", [
    lambda a, b: a + b,
    lambda a, b: a * b - 2,
    lambda a, b: torch.relu(a),
    lambda a, b: torch.softmax(a, -1),
    lambda a, b: torch.bmm(a, b.transpose(1, 2)),
    lambda a, b: a.transpose(1, 2).contiguous(),
    lambda a, b: a.to_padded_tensor(0.0),
    lambda a, b: F.linear(a, torch.ones(5, 3, device=a.device) * 0.5),
], ids=["add", "mul_sub", "relu", "softmax", "bmm", "transpose", "to_padded", "linear"])
def test_nested_operators_equal_the_cpu(op):
    """Two different nested arguments: the kernel's aliases are made from each one's storage (a
    temporary storage tensor reused the first one's address, and b read a's memory)."""
    pa, pb = _parts((2, 3), (4, 3)), _parts((2, 3), (4, 3), seed=1)
    _same(op(_nested(pa, "npu"), _nested(pb, "npu")), op(_nested(pa, "cpu"), _nested(pb, "cpu")))


def test_nested_in_place_unbind_and_copies():
    parts = _parts((2, 3), (4, 3))
    a = _nested(parts, "npu")
    a.mul_(3).add_(1)
    for x, p in zip(a.unbind(), parts):
        torch.testing.assert_close(x.cpu(), p * 3 + 1, rtol=0, atol=0)
    back = a.cpu()
    assert back.device.type == "cpu" and back.is_nested
    again = back.npu()
    assert again.device == torch.device("npu:0") and again.is_nested
    _same(again.to(torch.float64), back.to(torch.float64))


def test_nested_autograd_equals_the_cpu():
    parts, w0 = _parts((2, 3), (4, 3)), _parts((5, 3), seed=2)[0]

    def step(device):
        a = _nested(parts, device, requires_grad=True)
        w = w0.clone().to(device).requires_grad_()
        loss = (F.linear(a, w).relu() * 3).to_padded_tensor(0.0).sum()
        loss.backward()
        return loss.detach().cpu(), w.grad.cpu(), [g.cpu() for g in a.grad.unbind()]

    (l1, w1, g1), (l2, w2, g2) = step("npu"), step("cpu")
    torch.testing.assert_close(l1, l2, rtol=0, atol=0)
    torch.testing.assert_close(w1, w2, rtol=0, atol=0)
    for x, y in zip(g1, g2):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_nested_scaled_dot_product_attention():
    q = _parts((2, 5, 8), (2, 7, 8))
    out = F.scaled_dot_product_attention(*[_nested(q, "npu")] * 3)
    ref = F.scaled_dot_product_attention(*[_nested(q, "cpu")] * 3)
    assert out.is_nested and out.device.type == "npu"
    for x, y in zip(out.unbind(), ref.unbind()):
        torch.testing.assert_close(x.cpu(), y, rtol=1e-6, atol=1e-6)
