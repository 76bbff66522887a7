"""torch_npu's quantised products against plain-PyTorch references written here:
npu_trans_quant_param, npu_quant_matmul, npu_weight_quant_batchmatmul, npu_quant_conv2d and the
LinearQuant family / QuantConv2d modules; shapes under FakeTensorMode, torch.compile tracing
and errors for bad arguments."""
import pytest
import torch
import torch.nn.functional as F

import torch_npu
from torch_npu.contrib import module as cm
from test_contrib_modules import make_rois


# ---- quantisation ------------------------------------------------------------------------------

def fp19(x):
    """float32 truncated to its top 19 bits, as npu_trans_quant_param packs it."""
    return (x.float().contiguous().view(torch.int32) & -8192).view(torch.float32)


def ref_pack(scale, offset=None):
    bits = scale.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFE000
    out = bits | (1 << 46)
    if offset is not None:
        o = offset.round().clamp(-256, 255).to(torch.int64) & 0x1FF
        out = (out & 0x4000FFFFFFFF) | (o << 37)
    return out


def test_trans_quant_param_bits():
    scale = torch.rand(6) * 3 + 0.01
    torch.testing.assert_close(torch_npu.npu_trans_quant_param(scale.npu()).cpu(), ref_pack(scale))
    offset = torch.tensor([-300., -3.4, 0., 2.6, 255., 400.])
    packed = torch_npu.npu_trans_quant_param(scale[:1].npu(), offset.npu()).cpu()
    torch.testing.assert_close(packed, ref_pack(scale[:1].expand(6), offset))


def int8(*shape, seed=0, lo=-8, hi=8):
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


def int_mm(a, b):
    return (a.double() @ b.double())


def test_quant_matmul_int8_out_per_channel_offset():
    x1, x2 = int8(5, 32, seed=1), int8(32, 7, seed=2)
    scale, offset = torch.rand(7) * 0.05, torch.randn(7) * 3
    bias = torch.randint(-100, 100, (7,), dtype=torch.int32)
    out = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), scale.npu(), offset=offset.npu(), bias=bias.npu())
    assert out.dtype == torch.int8
    ref = ((int_mm(x1, x2) + bias) * scale.double() + offset.double()).round().clamp(-128, 127)
    assert (out.cpu().double() - ref).abs().max() <= 1  # float32 epilogue vs float64 reference at .5 ties


def test_quant_matmul_float_outputs():
    x1, x2 = int8(2, 3, 6, 16, seed=3), int8(16, 9, seed=4)  # batch broadcast of x2
    scale, pertoken = torch.rand(9), torch.rand(6)
    acc = int_mm(x1, x2)
    out = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), scale.npu(), pertoken_scale=pertoken.npu(),
                                     output_dtype=torch.float16)
    assert out.shape == (2, 3, 6, 9) and out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), acc * scale.double() * pertoken.double()[:, None],
                               rtol=2e-3, atol=1e-2)
    fbias = torch.randn(9)
    out = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), scale.bfloat16().npu(), bias=fbias.bfloat16().npu(),
                                     output_dtype=torch.bfloat16)
    ref = acc * scale.bfloat16().double() + fbias.bfloat16().double()
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-1)


def test_quant_matmul_batched_bias_and_packed_scale():
    x1, x2 = int8(3, 4, 8, seed=5), int8(3, 8, 5, seed=6)
    bias = torch.randint(-50, 50, (3, 1, 5), dtype=torch.int32)
    scale = torch.rand(1) * 0.1 + 0.01
    packed = torch_npu.npu_trans_quant_param(scale.npu())
    out = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), packed, bias=bias.npu(), output_dtype=torch.float16)
    ref = (int_mm(x1, x2) + bias) * fp19(scale).double()
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=1e-2)


def pack_int4(values):
    """[..., 8 c] integers in [-8, 7] -> [..., c] int32, eight to a word, the lowest nibble first."""
    nib = (values.to(torch.int64) & 15).reshape(*values.shape[:-1], -1, 8)
    word = sum(nib[..., i] << (4 * i) for i in range(8))
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def test_quant_matmul_int4_packed_in_int32():
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-8, 8, (5, 32), generator=g)
    w = torch.randint(-8, 8, (32, 16), generator=g)
    scale, pertoken = torch.rand(16, generator=g) * 0.1, torch.rand(5, generator=g)
    bias = torch.randint(-20, 20, (16,), dtype=torch.int32, generator=g)
    ref = (int_mm(a, w) + bias) * scale.double()
    x1 = pack_int4(a).npu()  # [m, k // 8]
    for x2 in (pack_int4(w).npu(),  # [k, n // 8]
               pack_int4(w.t().contiguous()).npu().t()):  # [k // 8, n], the transpose of [n, k // 8]
        out = torch_npu.npu_quant_matmul(x1, x2, scale.npu(), bias=bias.npu(), output_dtype=torch.float16)
        assert out.shape == (5, 16) and out.dtype == torch.float16
        torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=1e-2)
    out = torch_npu.npu_quant_matmul(x1, pack_int4(w).npu(), scale.npu(), pertoken_scale=pertoken.npu(),
                                     output_dtype=torch.bfloat16)
    torch.testing.assert_close(out.cpu().double(), int_mm(a, w) * scale.double() * pertoken.double()[:, None],
                               rtol=1e-2, atol=5e-2)
    with pytest.raises(RuntimeError, match="float16 or bfloat16 output_dtype"):
        torch_npu.npu_quant_matmul(x1, pack_int4(w).npu(), scale.npu())
    with pytest.raises(RuntimeError, match="contiguous"):
        torch_npu.npu_quant_matmul(x1, pack_int4(w).npu()[:, :1], scale[:8].npu(), output_dtype=torch.float16)
    m = cm.LinearQuant(32, 16, bias=False, output_dtype=torch.float16).npu()
    m.weight.data, m.scale.data = pack_int4(w.t().contiguous()).npu(), scale.npu()  # [n, k // 8]
    torch.testing.assert_close(m(x1).cpu().double(), int_mm(a, w) * fp19(scale).double(), rtol=2e-3, atol=1e-2)


def test_quant_matmul_a8w4_per_group():
    # int8 x1 times int4 weights: ((x1 - 8) @ (w * group scale) + y_offset) * pertoken_scale, the
    # cube's split of int8 into int4 halves (y_offset carries 8 * sum(w * scale) back)
    g = torch.Generator().manual_seed(41)
    m, k, n, group = 3, 64, 16, 16
    x1 = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-8, 8, (k, n), dtype=torch.int32, generator=g)
    scale = torch.rand(k // group, n, generator=g) * 0.1
    y_offset, pertoken = torch.randn(n, generator=g), torch.rand(m, 1, generator=g)
    x2 = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    packed = torch_npu.npu_trans_quant_param(scale.npu().reshape(-1)).reshape(k // group, n)
    for s in (scale.npu(), packed):
        out = torch_npu.npu_quant_matmul(x1.npu(), x2, s, offset=y_offset.npu(), pertoken_scale=pertoken.npu(),
                                         output_dtype=torch.bfloat16, group_sizes=[0, 0, group])
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        sc = (scale if s is not packed else fp19(scale)).double().repeat_interleave(group, 0)
        ref = ((x1.double() - 8) @ (w.double() * sc) + y_offset.double()) * pertoken.double()
        torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="must divide k"):
        torch_npu.npu_quant_matmul(x1.npu(), x2, scale.npu(), output_dtype=torch.float16, group_sizes=[0, 0, 24])
    with pytest.raises(RuntimeError, match="float16 or bfloat16"):
        torch_npu.npu_quant_matmul(x1.npu(), x2, scale.npu(), group_sizes=[0, 0, group])


def test_quant_matmul_int32_output_is_the_sums():
    x1, x2 = int8(2, 6, 24, seed=21), int8(24, 10, seed=22)
    bias = torch.randint(-100, 100, (10,), dtype=torch.int32)
    out = torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), torch.rand(10).npu(), bias=bias.npu(),
                                     output_dtype=torch.int32)
    assert out.dtype == torch.int32 and out.shape == (2, 6, 10)
    assert torch.equal(out.cpu(), x1.int() @ x2.int() + bias)
    m = cm.LinearQuant(24, 10, bias=False, output_dtype=torch.int32).npu()
    m.weight.data, m.scale.data = x2.t().contiguous().npu(), torch.rand(10).npu()
    assert torch.equal(m(x1.npu()).cpu(), x1.int() @ x2.int())
    with pytest.raises(RuntimeError, match="int32 output"):
        torch_npu.npu_quant_matmul(x1.npu(), x2.npu(), torch.rand(10).npu(), pertoken_scale=torch.rand(6).npu(),
                                   output_dtype=torch.int32)


def test_quant_matmul_bad_args():
    x1, x2, s = int8(4, 8).npu(), int8(8, 3).npu(), torch.ones(3).npu()
    with pytest.raises(RuntimeError, match="x2"):
        torch_npu.npu_quant_matmul(x1, int8(7, 3).npu(), s)
    with pytest.raises(RuntimeError, match="scale"):
        torch_npu.npu_quant_matmul(x1, x2, torch.ones(2).npu())
    with pytest.raises(RuntimeError, match="x1"):
        torch_npu.npu_quant_matmul(x1.float(), x2, s)
    with pytest.raises(NotImplementedError, match="group_sizes"):
        torch_npu.npu_quant_matmul(x1, x2, s, group_sizes=[1, 1, 1])
    with pytest.raises(RuntimeError, match="output_dtype"):
        torch_npu.npu_quant_matmul(x1, x2, s, output_dtype=torch.float64)
    with pytest.raises(RuntimeError, match="npu tensor"):
        torch_npu.npu_quant_matmul(x1, x2.cpu(), s)


@pytest.mark.parametrize("mode", ["tensor", "channel", "group"])
def test_weight_quant_batchmatmul(mode):
    M, K, N, G = 5, 64, 12, 16
    x = torch.randn(M, K, dtype=torch.float16)
    w = int8(K, N, seed=8)
    shape = {"tensor": (1,), "channel": (N,), "group": (K // G, N)}[mode]
    s = (torch.rand(shape) * 0.1).half()
    o = torch.randn(shape).half()
    bias = torch.randn(N).half()
    out = torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), s.npu(), o.npu(), bias=bias.npu(),
                                                 antiquant_group_size=G if mode == "group" else 0)
    rows = torch.arange(K) // G if mode == "group" else torch.zeros(K, dtype=torch.long)
    s2 = s.double().reshape(-1, shape[-1])[rows if mode == "group" else torch.zeros(K, dtype=torch.long)]
    o2 = o.double().reshape(-1, shape[-1])[rows if mode == "group" else torch.zeros(K, dtype=torch.long)]
    ref = x.double() @ ((w.double() + o2) * s2) + bias.double()
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=2e-2)


def test_weight_quant_batchmatmul_requant_to_int8():
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), int8(32, 6, seed=9)
    s = (torch.rand(6) * 0.1).bfloat16()
    qs, qo = torch.rand(6) * 2, torch.randn(6) * 4
    out = torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), s.npu(), quant_scale=qs.npu(),
                                                 quant_offset=qo.npu())
    assert out.dtype == torch.int8
    ref = ((x.double() @ (w.double() * s.double())) * qs.double() + qo.double()).round().clamp(-128, 127)
    assert (out.cpu().double() - ref).abs().max() <= 1


def test_convert_weight_to_int4pack_and_int4_weight_quant_batchmatmul():
    g = torch.Generator().manual_seed(31)
    w = torch.randint(-8, 8, (64, 32), dtype=torch.int32, generator=g)
    packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    assert packed.dtype == torch.int32 and packed.shape == (64, 4)
    assert torch.equal(packed.cpu(), pack_int4(w))
    assert torch_npu.npu_convert_weight_to_int4pack(w.view(2, 32, 32).npu()).shape == (2, 32, 4)
    # a FRACTAL_NZ weight gives a FRACTAL_NZ result over the same values
    nz = torch_npu.npu_convert_weight_to_int4pack(torch_npu.npu_format_cast(w.npu(), 29))
    assert torch_npu.get_npu_format(nz) == torch_npu.Format.FRACTAL_NZ and torch.equal(nz.cpu(), pack_int4(w))
    # float32 FLOAT4_E2M1 values: their 4-bit codes
    fp4 = torch.tensor([[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]])
    codes = torch_npu.npu_convert_weight_to_int4pack(fp4.npu())
    assert codes.dtype == torch.float32
    assert codes.cpu().view(torch.int32).flatten().tolist() == [0x76543210, 0xFEDCBA98 - 2 ** 32]
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch_npu.npu_convert_weight_to_int4pack(w[:, :12].contiguous().npu())
    with pytest.raises(RuntimeError, match="contiguous"):
        torch_npu.npu_convert_weight_to_int4pack(w.t().npu())
    x = torch.randn(5, 64, dtype=torch.float16, generator=g)
    s, o = (torch.rand(1, 32, generator=g) * 0.1).half(), torch.randn(1, 32, generator=g).half()
    ref = x.double() @ ((w.half() + o) * s).double()  # the antiquantisation rounds in float16
    out = torch_npu.npu_weight_quant_batchmatmul(x.npu(), packed, s.npu(), o.npu())
    assert out.shape == (5, 32) and out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=2e-2)
    transposed = torch_npu.npu_convert_weight_to_int4pack(w.t().contiguous().npu()).t()  # [k // 8, n]
    assert torch.equal(torch_npu.npu_weight_quant_batchmatmul(x.npu(), transposed, s.npu(), o.npu()).cpu(), out.cpu())


def test_weight_quant_batchmatmul_bad_args():
    x, w = torch.randn(4, 8, dtype=torch.float16).npu(), int8(8, 3).npu()
    with pytest.raises(RuntimeError, match="antiquant_scale"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, torch.ones(2, dtype=torch.float16).npu())
    with pytest.raises(RuntimeError, match="weight"):
        torch_npu.npu_weight_quant_batchmatmul(x, int8(7, 3).npu(), torch.ones(3, dtype=torch.float16).npu())
    with pytest.raises(NotImplementedError, match="weight_dtype"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, torch.ones(3, dtype=torch.float16).npu(), weight_dtype=1)


def ref_quant_conv(x, w, scale, bias, stride, pad, dil, groups, offset_x=0):
    xd = F.pad(x.double(), (pad[1], pad[1], pad[0], pad[0]), value=float(offset_x))
    acc = F.conv2d(xd, w.double(), None, stride, 0, dil, groups)
    return (acc + bias.double()[None, :, None, None]) * scale.double()[None, :, None, None]


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_quant_conv2d(out_dtype):
    x, w = int8(2, 4, 9, 8, seed=10), int8(6, 2, 3, 3, seed=11)
    scale, bias = torch.rand(6) * 0.1, torch.randint(-20, 20, (6,), dtype=torch.int32)
    out = torch_npu.npu_quant_conv2d(x.npu(), w.npu(), scale.npu(), [2, 1], [1, 2], [1, 2], 2, 3, "rint",
                                     out_dtype, bias.npu())
    ref = ref_quant_conv(x, w, scale, bias, (2, 1), (1, 2), (1, 2), 2, offset_x=3)
    assert out.dtype == out_dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=1e-2)


def test_quant_conv2d_bad_args():
    x, w, s = int8(1, 2, 5, 5).npu(), int8(3, 2, 3, 3).npu(), torch.ones(3).npu()
    with pytest.raises(RuntimeError, match="output_dtype"):
        torch_npu.npu_quant_conv2d(x, w, s)
    with pytest.raises(RuntimeError, match="groups"):
        torch_npu.npu_quant_conv2d(x, w, s, groups=2, output_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="strides"):
        torch_npu.npu_quant_conv2d(x, w, s, strides=[0, 1], output_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="offset"):
        torch_npu.npu_quant_conv2d(x, w, s, output_dtype=torch.float16, offset=torch.ones(3).npu())


def test_linear_quant_modules():
    x, w = int8(3, 16, seed=12), int8(10, 16, seed=13)
    scale, offset = torch.rand(10) * 0.05, torch.randn(10) * 2
    bias = torch.randint(-30, 30, (10,), dtype=torch.int32)
    m = cm.LinearQuant(16, 10, bias=True, offset=True).npu()
    m.weight.data, m.scale.data, m.offset.data, m.bias.data = w.npu(), scale.npu(), offset.npu(), bias.npu()
    out = m(x.npu())
    # the float32 scale is packed (truncated to FP19) with the offset (rounded to an integer)
    ref = ((int_mm(x, w.t()) + bias) * fp19(scale).double() + offset.round().double()).round().clamp(-128, 127)
    assert out.dtype == torch.int8 and (out.cpu().double() - ref).abs().max() <= 1
    with pytest.warns(FutureWarning):
        m8 = cm.LinearA8W8Quant(16, 10, bias=False, output_dtype=torch.bfloat16).npu()
    m8.weight.data, m8.scale.data = w.npu(), scale.npu()
    torch.testing.assert_close(m8(x.npu()).cpu().double(), int_mm(x, w.t()) * scale.double(), rtol=1e-2, atol=5e-2)
    m8.scale.data = scale.half().npu()
    with pytest.raises(ValueError, match="scale"):
        m8(x.npu())
    with pytest.raises(ValueError, match="int8"):
        m(x.float().npu())


def test_linear_weight_quant_module():
    x, w = torch.randn(4, 32, dtype=torch.float16), int8(8, 32, seed=14)
    s, o = (torch.rand(8, 2) * 0.1).half(), torch.randn(8, 2).half()  # [out, groups]: per group of 16
    m = cm.LinearWeightQuant(32, 8, bias=False, antiquant_offset=True, antiquant_group_size=16).npu()
    m.weight.data, m.antiquant_scale.data, m.antiquant_offset.data = w.npu(), s.npu(), o.npu()
    rows = torch.arange(32) // 16
    deq = (w.double() + o.double()[:, rows]) * s.double()[:, rows]  # [out, in]
    torch.testing.assert_close(m(x.npu()).cpu().double(), x.double() @ deq.t(), rtol=2e-3, atol=2e-2)


def test_quant_conv2d_module():
    x, w = int8(1, 3, 6, 6, seed=15), int8(4, 3, 3, 3, seed=16)
    scale, bias = torch.rand(4) * 0.1, torch.randint(-10, 10, (4,), dtype=torch.int32)
    m = cm.QuantConv2d(3, 4, 3, torch.float16, padding=1).npu()
    m.weight.data, m.scale.data, m.bias.data = w.npu(), scale.npu(), bias.npu()
    ref = ref_quant_conv(x, w, fp19(scale), bias, (1, 1), (1, 1), (1, 1), 1)
    torch.testing.assert_close(m(x.npu()).cpu().double(), ref, rtol=2e-3, atol=1e-2)
    with pytest.raises(ValueError, match="offset"):
        cm.QuantConv2d(3, 4, 3, torch.float16, offset=True)


def test_quant_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        d = "npu"
        out = torch_npu.npu_quant_matmul(torch.empty(2, 5, 8, dtype=torch.int8, device=d),
                                         torch.empty(8, 3, dtype=torch.int8, device=d), torch.empty(3, device=d),
                                         output_dtype=torch.bfloat16)
        assert out.shape == (2, 5, 3) and out.dtype == torch.bfloat16
        out = torch_npu.npu_quant_matmul(torch.empty(5, 4, dtype=torch.int32, device=d),
                                         torch.empty(32, 2, dtype=torch.int32, device=d), torch.empty(1, device=d),
                                         output_dtype=torch.float16)
        assert out.shape == (5, 16)  # int4: x2 [k, n // 8]
        out = torch_npu.npu_quant_matmul(torch.empty(5, 4, dtype=torch.int32, device=d),
                                         torch.empty(16, 4, dtype=torch.int32, device=d).t(),
                                         torch.empty(1, device=d), output_dtype=torch.int32)
        assert out.shape == (5, 16) and out.dtype == torch.int32
        out = torch_npu.npu_quant_conv2d(torch.empty(1, 2, 7, 7, dtype=torch.int8, device=d),
                                         torch.empty(4, 2, 3, 3, dtype=torch.int8, device=d),
                                         torch.empty(4, device=d), [2, 2], [1, 1], [1, 1], 1, 0, "rint",
                                         torch.float16)
        assert out.shape == (1, 4, 4, 4)
        out = torch_npu.npu_ps_roi_pooling(torch.empty(2, 18, 5, 5, device=d), torch.empty(2, 5, 4, device=d),
                                           1.0, 3, 2)
        assert out.shape == (8, 2, 3, 3)
        out = torch_npu.npu_weight_quant_batchmatmul(torch.empty(3, 8, dtype=torch.float16, device=d),
                                                     torch.empty(8, 5, dtype=torch.int8, device=d),
                                                     torch.empty(5, dtype=torch.float16, device=d))
        assert out.shape == (3, 5) and out.dtype == torch.float16
        out = torch_npu.npu_weight_quant_batchmatmul(torch.empty(3, 64, dtype=torch.float16, device=d),
                                                     torch.empty(64, 4, dtype=torch.int32, device=d),
                                                     torch.empty(32, dtype=torch.float16, device=d))
        assert out.shape == (3, 32)  # int4 weight [k, n // 8]


def test_torch_compile_traces_quant_and_ps_roi_ops():
    def block(x1, x2, scale, feats, rois):
        y = torch_npu.npu_quant_matmul(x1, x2, torch_npu.npu_trans_quant_param(scale), output_dtype=torch.float16)
        return y, torch_npu.npu_ps_roi_pooling(feats, rois, 0.5, 2, 2)

    args = [int8(4, 8).npu(), int8(8, 3).npu(), torch.rand(3).npu(), torch.randn(1, 8, 6, 6).npu(),
            make_rois(1, 2, 6, 6, 0.5).npu()]
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(*args), block(*args)):
        torch.testing.assert_close(got.cpu(), want.cpu())


# ---- npu_weight_quant_batchmatmul: the antiquantisation rounds in x's dtype ------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weight_quant_dequantises_in_x_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    m, k, n = 8, 2048, 64
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randint(-8, 8, (k, n), dtype=torch.int8, generator=g)
    scale = torch.randn(n, generator=g).to(dtype)
    offset = torch.randn(n, generator=g).to(dtype)
    out = torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), scale.npu(), offset.npu()).cpu()
    # Huawei's test/contrib/test_linear_weight_quant.py reference: (w + offset) * scale in x's
    # dtype, then a float32 matmul rounded to x's dtype.
    ref = (x.float() @ ((w.to(dtype) + offset) * scale).float()).to(dtype)
    exact = (x.float() @ ((w.float() + offset.float()) * scale.float())).to(dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=2e-3)
    assert not torch.equal(ref, exact)  # the rounding is visible at this size
    assert (out == ref).float().mean() > 0.95
