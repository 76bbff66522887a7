"""Quantized npu tensors (QuantizedPrivateUse1, ops/src/quantized.cpp): the operators torch_npu
registers for them, with the CPU's values, and its errors where it has no kernel."""
import os
import warnings

import pytest
import torch

import torch_npu  # noqa: F401
from torch_npu import _op_table

QDTYPES = [torch.quint8, torch.qint8, torch.qint32]
UNDERLYING = {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*:UserWarning")


def assert_same_quantized(npu_q, cpu_q):
    assert npu_q.device.type == "npu" and npu_q.is_quantized
    assert npu_q.dtype == cpu_q.dtype and npu_q.shape == cpu_q.shape
    assert npu_q.qscheme() == cpu_q.qscheme()
    r = npu_q.int_repr()
    assert r.device.type == "npu" and r.dtype == UNDERLYING[cpu_q.dtype]
    assert torch.equal(r.cpu(), cpu_q.int_repr())
    d = npu_q.dequantize()
    assert d.device.type == "npu" and d.dtype == torch.float32
    assert torch.equal(d.cpu(), cpu_q.dequantize())


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("shape", [(3, 3), (2, 3, 4, 5), (0, 4), ()])
def test_quantize_per_tensor_matches_cpu(dtype, shape):
    x = torch.randn(shape) * 3
    q = torch.quantize_per_tensor(x.npu(), 0.05, 7, dtype)
    c = torch.quantize_per_tensor(x, 0.05, 7, dtype)
    assert_same_quantized(q, c)
    assert q.q_scale() == 0.05 and q.q_zero_point() == 7
    assert q.qscheme() == torch.per_tensor_affine


def test_quantize_per_tensor_non_contiguous_and_channels_last():
    x = torch.randn(2, 3, 4, 5)
    for src in (x.transpose(1, 3), x.contiguous(memory_format=torch.channels_last), x[:, ::2]):
        q = torch.quantize_per_tensor(src.npu(), 0.1, 3, torch.quint8)
        c = torch.quantize_per_tensor(src, 0.1, 3, torch.quint8)
        assert_same_quantized(q, c)
        assert q.stride() == c.stride()


def test_quantized_storage_is_device_memory():
    torch.npu.synchronize()
    before = torch.npu.memory_allocated()
    x = torch.randn(1024, 1024, device="npu")
    q = torch.quantize_per_tensor(x, 0.1, 0, torch.qint32)
    assert torch.npu.memory_allocated() - before >= 2 * 4 * 1024 * 1024
    del x, q


def test_quantize_after_queued_work_sees_its_results():
    # The quantize kernel runs in stream order after the operators that made its input.
    x = torch.randn(256, 256)
    y = (x.npu() @ x.npu()).mul_(0.01)
    q = torch.quantize_per_tensor(y, 0.02, 128, torch.quint8)
    c = torch.quantize_per_tensor((x @ x).mul_(0.01), 0.02, 128, torch.quint8)
    # matmul's summation order may differ by an ulp, so allow one quantization step
    assert (q.int_repr().cpu().int() - c.int_repr().int()).abs().max() <= 1


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("zp_dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_quantize_per_channel_matches_cpu(dtype, zp_dtype, axis):
    x = torch.randn(3, 4, 5)
    n = x.shape[axis]
    scales = torch.rand(n) * 0.1 + 0.01
    zero_points = torch.arange(n, dtype=zp_dtype)
    q = torch.quantize_per_channel(x.npu(), scales.npu(), zero_points.npu(), axis, dtype)
    c = torch.quantize_per_channel(x, scales, zero_points, axis, dtype)
    assert_same_quantized(q, c)
    assert q.qscheme() == torch.per_channel_affine
    assert q.q_per_channel_axis() == axis
    assert torch.equal(q.q_per_channel_scales().cpu(), c.q_per_channel_scales())
    assert torch.equal(q.q_per_channel_zero_points().cpu(), c.q_per_channel_zero_points())


def test_quantize_per_channel_with_host_parameters():
    x = torch.randn(4, 6)
    scales, zps = torch.full((6,), 0.05, dtype=torch.float64), torch.arange(6)
    assert_same_quantized(torch.quantize_per_channel(x.npu(), scales, zps, 1, torch.qint8),
                          torch.quantize_per_channel(x, scales, zps, 1, torch.qint8))


def test_quantize_errors_are_the_cpus():
    x = torch.randn(4, 3, device="npu")
    with pytest.raises(RuntimeError, match="Quantize only works on Float Tensor, got Half"):
        torch.quantize_per_tensor(x.half(), 0.1, 0, torch.quint8)
    with pytest.raises(RuntimeError, match="zero_point 300 is above upper bound"):
        torch.quantize_per_tensor(x, 0.1, 300, torch.quint8)
    with pytest.raises(RuntimeError, match="zero_point 300 is above upper bound"):
        torch.quantize_per_channel(x, torch.ones(3, device="npu"), torch.tensor([0, 300, 0], device="npu"), 1,
                                   torch.quint8)
    with pytest.raises(RuntimeError, match="zero_point -129 is below lower bound"):
        torch.quantize_per_channel(x, torch.ones(3, device="npu"), torch.tensor([0, -129, 0], device="npu"), 1,
                                   torch.qint8)
    with pytest.raises(RuntimeError, match="length of scales must equal to channel"):
        torch.quantize_per_channel(x, torch.ones(4, device="npu"), torch.zeros(4, dtype=torch.long, device="npu"),
                                   1, torch.quint8)


def test_sub_byte_dtypes_have_no_npu_kernel():
    # torch_npu registers no PrivateUse1 kernels for quint4x2 / quint2x4 either.
    with pytest.raises(RuntimeError):
        torch.quantize_per_tensor(torch.randn(4, 4, device="npu"), 0.1, 0, torch.quint4x2)
    q = torch._empty_affine_quantized([4], scale=1.0, zero_point=0, dtype=torch.quint4x2, device="npu")
    with pytest.raises(RuntimeError, match="sub-byte quantized dtypes"):
        q.int_repr()


def test_copies_between_devices():
    x = torch.randn(5, 6)
    for dtype in QDTYPES:
        c = torch.quantize_per_tensor(x, 0.1, 4, dtype)
        # host -> npu into a quantized npu tensor: it takes the source's quantizer
        q = torch._empty_affine_quantized([5, 6], scale=1.0, zero_point=0, dtype=dtype, device="npu")
        q.copy_(c)
        assert q.q_scale() == 0.1 and q.q_zero_point() == 4
        assert_same_quantized(q, c)
        # npu -> host, npu -> npu (through a transposed view)
        back = torch._empty_affine_quantized([5, 6], scale=1.0, zero_point=0, dtype=dtype)
        back.copy_(q)
        assert torch.equal(back.int_repr(), c.int_repr()) and back.q_scale() == 0.1
        other = torch._empty_affine_quantized([6, 5], scale=1.0, zero_point=0, dtype=dtype, device="npu")
        other.copy_(q.t())
        assert torch.equal(other.int_repr().cpu(), c.t().int_repr())
    with pytest.raises(RuntimeError, match="Copying from quantized Tensor to non-quantized Tensor is not allowed"):
        torch.empty(5, 6, device="npu").copy_(q)


def test_to_and_cpu_raise_as_in_torch_npu():
    # PyTorch's _to_copy makes the destination with aten::empty_quantized, which torch_npu
    # does not register for quantized npu tensors.
    q = torch.quantize_per_tensor(torch.randn(3, device="npu"), 0.1, 0, torch.quint8)
    with pytest.raises(NotImplementedError, match="empty_quantized"):
        q.cpu()
    with pytest.raises(NotImplementedError, match="empty_quantized"):
        torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.quint8).npu()


def test_views_contiguous_clone_flip():
    x = torch.randn(4, 6)
    q = torch.quantize_per_tensor(x.npu(), 0.1, 10, torch.qint8)
    c = torch.quantize_per_tensor(x, 0.1, 10, torch.qint8)
    v = q.view(2, 12)
    assert v.is_quantized and v.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
    assert_same_quantized(v, c.view(2, 12))
    t = q.t()
    assert not t.is_contiguous() and t.q_scale() == 0.1
    assert_same_quantized(t, c.t())
    tc = t.contiguous()
    assert tc.is_contiguous() and tc.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    assert_same_quantized(tc, c.t().contiguous())
    assert q.contiguous() is q
    assert_same_quantized(t.ravel(), c.t().ravel())
    assert_same_quantized(q.ravel(), c.ravel())
    assert_same_quantized(q[1:3, ::2], c[1:3, ::2])
    assert_same_quantized(q.flip(0), c.flip(0))
    assert_same_quantized(q.flip((0, 1)), c.flip((0, 1)))
    cl = q.clone()
    assert cl.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    assert_same_quantized(cl, c)
    cl = q.view(1, 2, 3, 4).contiguous(memory_format=torch.channels_last)
    assert cl.stride() == (24, 1, 8, 2)
    assert_same_quantized(cl, c.view(1, 2, 3, 4).contiguous(memory_format=torch.channels_last))


def test_per_channel_clone_and_flip_error():
    x = torch.randn(2, 3)
    q = torch.quantize_per_channel(x.npu(), torch.ones(3, device="npu") * 0.1,
                                   torch.zeros(3, dtype=torch.long, device="npu"), 1, torch.qint8)
    c = torch.quantize_per_channel(x, torch.ones(3) * 0.1, torch.zeros(3, dtype=torch.long), 1, torch.qint8)
    assert_same_quantized(q.clone(), c)
    with pytest.raises(RuntimeError, match="Setting strides is possible only on uniformly quantized tensor"):
        q.flip((0,))
    with pytest.raises(RuntimeError, match="Setting strides is possible only on uniformly quantized tensor"):
        q.t()


def test_allocation():
    q = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=2, dtype=torch.quint8, device="npu")
    assert q.device.type == "npu" and q.dtype == torch.quint8 and q.shape == (2, 3)
    assert q.q_scale() == 0.5 and q.q_zero_point() == 2
    like = torch.empty_like(q)
    assert like.device == q.device and like.dtype == torch.quint8 and like.q_scale() == 0.5
    assert torch.empty_like(q, dtype=torch.float32).dtype == torch.float32
    e = torch.empty(2, 3, dtype=torch.qint8, device="npu")
    assert e.is_quantized and e.device.type == "npu" and e.shape == (2, 3)
    s = torch.empty_strided((2, 3), (1, 2), dtype=torch.qint32, device="npu")
    assert s.is_quantized and s.stride() == (1, 2)
    with pytest.raises(RuntimeError, match="Quantized tensors do not support pin_memory"):
        torch.ops.aten.empty_strided((2,), (1,), dtype=torch.qint8, device="npu", pin_memory=True)


def test_plain_npu_tensors_keep_their_autograd():
    # contiguous and ravel are registered for QuantizedPrivateUse1 only.
    a = torch.randn(3, 4, device="npu", requires_grad=True)
    a.t().contiguous().mul(2).sum().backward()
    a.t().ravel().mul(3).sum().backward()
    assert torch.equal(a.grad.cpu(), torch.full((3, 4), 5.0))


def test_op_table_lists_the_registered_kernels():
    assert {"quantize_per_tensor", "quantize_per_channel"} <= _op_table.SUPPORTED
    assert "int_repr" in _op_table.QUANTIZED and "dequantize.self" in _op_table.QUANTIZED
    for op in sorted(_op_table.QUANTIZED):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + op, "QuantizedPrivateUse1"), op
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty_quantized", "QuantizedPrivateUse1")


REGISTERED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "ops",
                          "torch_npu_registered_ops.txt")


@pytest.mark.skipif(not os.path.exists(REGISTERED), reason="ops/ is not next to the tests (installed wheel)")
def test_quantized_section_is_what_torch_npu_registers():
    with open(REGISTERED) as f:
        theirs = {line.split()[0] for line in f if "QuantizedPrivateUse1(" in line}
    assert theirs == set(_op_table.QUANTIZED)


def test_quantize_and_dequantize_in_an_npu_graph():
    x = torch.randn(64, 32, device="npu")
    scales, zps = torch.rand(32, device="npu") * 0.1 + 0.01, torch.arange(32, device="npu")
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        g = torch.npu.NPUGraph()
        g.capture_begin()
        d1 = torch.quantize_per_tensor(x, 0.05, 3, torch.qint8).dequantize()
        q2 = torch.quantize_per_channel(x, scales, zps, 1, torch.quint8)
        d2 = q2.dequantize()
        g.capture_end()
    x.copy_(torch.randn(64, 32))
    g.replay()
    torch.npu.synchronize()
    xc = x.cpu()
    assert torch.equal(d1.cpu(), torch.quantize_per_tensor(xc, 0.05, 3, torch.qint8).dequantize())
    assert torch.equal(d2.cpu(), torch.quantize_per_channel(xc, scales.cpu(), zps.cpu(), 1, torch.quint8).dequantize())


@pytest.mark.skipif(torch.npu.device_count() < 2, reason="needs two npu devices")
def test_second_device_and_copies_across_devices():
    x = torch.randn(4, 5)
    q = torch.quantize_per_tensor(x.to("npu:1"), 0.1, 2, torch.qint8)
    assert q.device == torch.device("npu:1") and q.int_repr().device == q.device and q.dequantize().device == q.device
    c = torch.quantize_per_tensor(x, 0.1, 2, torch.qint8)
    assert_same_quantized(q, c)
    e = torch._empty_affine_quantized([4, 5], scale=1.0, zero_point=0, dtype=torch.qint8, device="npu:0")
    e.copy_(q)
    assert e.device == torch.device("npu:0") and e.q_scale() == 0.1
    assert_same_quantized(e, c)
