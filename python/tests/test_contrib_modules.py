"""The later torch_npu.contrib members against plain-PyTorch references written here:
npu_ps_roi_pooling / PSROIPool (forward, backward, gradcheck), the quantised products
(npu_trans_quant_param, npu_quant_matmul, npu_weight_quant_batchmatmul, npu_quant_conv2d and
the LinearQuant family / QuantConv2d modules), BiLSTM, FusedColorJitter, FastSyncBatchNorm,
npu_fast_condition_index_put; shapes under FakeTensorMode and errors for bad arguments."""
import math
import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_npu
from torch_npu.contrib import function as cf
from torch_npu.contrib import module as cm


# ---- npu_ps_roi_pooling ------------------------------------------------------------------------

def ref_ps_roi_pool(x, rois, scale, gs, od):
    """R-FCN PSROIPooling written out bin by bin (differentiable in x)."""
    N, C, H, W = x.shape
    R = rois.shape[2]
    outs = []
    for b in range(N):
        for r in range(R):
            bid, x1, y1, x2, y2 = [float(v) for v in rois[b, :, r]]
            sw, sh = round(x1) * scale, round(y1) * scale
            ew, eh = (round(x2) + 1) * scale, (round(y2) + 1) * scale
            bw, bh = max(ew - sw, 0.1) / gs, max(eh - sh, 0.1) / gs
            vals = []
            for d in range(od):
                for i in range(gs):
                    for j in range(gs):
                        hs = min(max(math.floor(i * bh + sh), 0), H)
                        he = min(max(math.ceil((i + 1) * bh + sh), 0), H)
                        ws = min(max(math.floor(j * bw + sw), 0), W)
                        we = min(max(math.ceil((j + 1) * bw + sw), 0), W)
                        if he <= hs or we <= ws:
                            vals.append(x.new_zeros(()))
                        else:
                            vals.append(x[int(bid), (d * gs + i) * gs + j, hs:he, ws:we].mean())
            outs.append(torch.stack(vals).reshape(od, gs, gs))
    return torch.stack(outs)


def make_rois(N, R, H, W, scale, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rois = torch.empty(N, 5, R, dtype=dtype)
    for b in range(N):
        rois[b, 0] = torch.randint(0, N, (R,), generator=g).to(dtype)
        xy = torch.rand(2, R, generator=g) * torch.tensor([[W / scale], [H / scale]]) * 0.8
        wh = torch.rand(2, R, generator=g) * torch.tensor([[W / scale], [H / scale]]) * 0.6
        rois[b, 1:3] = xy
        rois[b, 3:5] = xy + wh
    return rois


@pytest.mark.parametrize("gs,od,scale", [(2, 2, 1.0), (3, 2, 0.5), (1, 3, 0.25)])
def test_ps_roi_pooling_forward(gs, od, scale):
    N, H, W, R = 2, 9, 11, 4
    x = torch.randn(N, od * gs * gs, H, W)
    rois = make_rois(N, R, H, W, scale, seed=gs)
    out = torch_npu.npu_ps_roi_pooling(x.npu(), rois.npu(), scale, gs, od)
    assert out.shape == (N * R, od, gs, gs)
    torch.testing.assert_close(out.cpu(), ref_ps_roi_pool(x, rois, scale, gs, od), rtol=1e-5, atol=1e-5)
    half = torch_npu.npu_ps_roi_pooling(x.half().npu(), rois.half().npu(), scale, gs, od)
    torch.testing.assert_close(half.cpu().float(), ref_ps_roi_pool(x.half().float(), rois.half().float(), scale, gs,
                                                                    od), rtol=1e-2, atol=1e-2)


def test_ps_roi_pooling_backward_matches_reference():
    N, gs, od, H, W, R, scale = 2, 2, 3, 8, 8, 3, 0.5
    x = torch.randn(N, od * gs * gs, H, W)
    rois = make_rois(N, R, H, W, scale, seed=7)
    gy = torch.randn(N * R, od, gs, gs)
    xr = x.clone().requires_grad_()
    ref_ps_roi_pool(xr, rois, scale, gs, od).backward(gy)
    xn = x.npu().requires_grad_()
    torch_npu.npu_ps_roi_pooling(xn, rois.npu(), scale, gs, od).backward(gy.npu())
    torch.testing.assert_close(xn.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)
    direct = torch.ops.npu.npu_ps_roi_pooling_backward(gy.npu(), rois.npu(), scale, gs, od, [H, W])
    torch.testing.assert_close(direct.cpu(), xr.grad, rtol=1e-5, atol=1e-5)


def test_ps_roi_pooling_gradcheck():
    rois = make_rois(2, 2, 5, 6, 1.0, seed=3, dtype=torch.float64).npu()
    x = torch.randn(2, 2 * 4, 5, 6, dtype=torch.float64).npu().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: torch_npu.npu_ps_roi_pooling(t, rois, 1.0, 2, 2), (x,))


def test_ps_roi_pooling_op_plugin_example():
    # op-plugin's own test: every bin falls outside the 1x1 map, so the output is zeros.
    roi = torch.tensor([[[1], [2], [3], [4], [5]], [[6], [7], [8], [9], [10]]], dtype=torch.float16).npu()
    x = torch.arange(1, 17, dtype=torch.float16).reshape(2, 8, 1, 1).npu().requires_grad_()
    out = torch_npu.npu_ps_roi_pooling(x, roi, 0.5, 2, 2)
    assert out.shape == (2, 2, 2, 2) and out.abs().sum().item() == 0
    out.backward(torch.ones_like(out))
    assert x.grad.abs().sum().item() == 0


def test_psroipool_module():
    m = cm.PSROIPool(pooled_height=3, pooled_width=3, spatial_scale=0.5, group_size=3, output_dim=2)
    assert "group_size=3" in repr(m)
    x = torch.randn(1, 18, 10, 10)
    rois = make_rois(1, 3, 10, 10, 0.5, seed=1)
    torch.testing.assert_close(m(x.npu(), rois.npu()).cpu(), ref_ps_roi_pool(x, rois, 0.5, 3, 2))
    with pytest.raises(ValueError, match="group_size"):
        cm.PSROIPool(pooled_height=7, pooled_width=5, group_size=7)


def test_ps_roi_pooling_bad_args():
    x = torch.randn(1, 8, 4, 4).npu()
    rois = torch.tensor([[[0.], [0.], [0.], [2.], [2.]]]).npu()
    with pytest.raises(RuntimeError, match="channels"):
        torch_npu.npu_ps_roi_pooling(x, rois, 1.0, 2, 3)
    with pytest.raises(RuntimeError, match="rois"):
        torch_npu.npu_ps_roi_pooling(x, rois[:, :4], 1.0, 2, 2)
    with pytest.raises(RuntimeError, match="group_size"):
        torch_npu.npu_ps_roi_pooling(x, rois, 1.0, 0, 2)
    bad = torch.tensor([[[5.], [0.], [0.], [2.], [2.]]]).npu()
    with pytest.raises(RuntimeError, match="batch index"):
        torch_npu.npu_ps_roi_pooling(x, bad, 1.0, 2, 2).cpu()


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


def test_torch_compile_traces_quant_and_ps_roi_ops():
    def block(x1, x2, scale, feats, rois):
        y = torch_npu.npu_quant_matmul(x1, x2, torch_npu.npu_trans_quant_param(scale), output_dtype=torch.float16)
        return y, torch_npu.npu_ps_roi_pooling(feats, rois, 0.5, 2, 2)

    args = [int8(4, 8).npu(), int8(8, 3).npu(), torch.rand(3).npu(), torch.randn(1, 8, 6, 6).npu(),
            make_rois(1, 2, 6, 6, 0.5).npu()]
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(*args), block(*args)):
        torch.testing.assert_close(got.cpu(), want.cpu())


# ---- modules -----------------------------------------------------------------------------------

def test_bilstm_matches_bidirectional_lstm():
    # On the CPU: torch.nn.LSTM on npu needs aten::_thnn_fused_lstm_cell (ATen's LSTM cell
    # for non-CPU devices), which the NPU op table lacks; see test_bilstm_on_npu.
    torch.manual_seed(0)
    with pytest.warns(FutureWarning):
        m = cm.BiLSTM(6, 5)
    m = m.double()
    ref = torch.nn.LSTM(6, 5, bidirectional=True).double()
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(ref, name).copy_(getattr(m.fw_rnn, name))
            getattr(ref, name + "_reverse").copy_(getattr(m.bw_rnn, name))
    x = torch.randn(7, 3, 6, dtype=torch.float64)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, _ = ref(xr)
    y = m(xm)
    assert y.shape == (7, 3, 10)
    torch.testing.assert_close(y, y_ref)
    gy = torch.randn(7, 3, 10, dtype=torch.float64)
    y_ref.backward(gy)
    y.backward(gy)
    torch.testing.assert_close(xm.grad, xr.grad)
    with pytest.raises(ValueError, match="seq_len"):
        m(torch.randn(3, 6))


def test_bilstm_on_npu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        m = cm.BiLSTM(4, 3)
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(m.npu()(x.npu()).cpu(), m.cpu()(x), rtol=1e-4, atol=1e-5)


def yiq_hue_saturation(hue, saturation):
    """RGB (row vectors) -> YIQ -> rotate IQ by the hue angle, scale by saturation -> RGB."""
    t = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    a = hue * 255. * math.pi / 180.
    rot = np.array([[1, 0, 0], [0, saturation * math.cos(a), -saturation * math.sin(a)],
                    [0, saturation * math.sin(a), saturation * math.cos(a)]])
    return (np.linalg.inv(t) @ rot @ t).T


def test_fused_color_jitter_matrix_and_transform():
    with pytest.warns(FutureWarning):
        jitter = cm.FusedColorJitter(brightness=0.3, contrast=0.2, saturation=0.4, hue=0.1)
    apply = jitter.transformer
    for hue, sat in [(0.0, 1.0), (0.05, 0.6), (-0.1, 1.3)]:
        np.testing.assert_allclose(apply.hue_saturation_matrix(hue, sat), yiq_hue_saturation(hue, sat), atol=6e-3)
    img = np.random.RandomState(0).uniform(0, 255, (5, 4, 3)).astype(np.float32)
    random.seed(123)
    out = jitter(img)
    random.seed(123)
    h = random.uniform(-0.1, 0.1)
    s = random.uniform(0.6, 1.4)
    c = random.uniform(0.8, 1.2)
    b = random.uniform(0.7, 1.3)
    ref = (img.reshape(-1, 3) @ yiq_hue_saturation(h, s) * b * c + (1 - c) * b * 127.5).reshape(5, 4, 3)
    assert out.dtype == np.float32 and out.shape == img.shape
    np.testing.assert_allclose(out, ref.clip(0, 255), atol=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="hue"):
            cm.FusedColorJitter(hue=(0.2, 0.9))
        with pytest.raises(TypeError):
            cm.FusedColorJitter(brightness="x")


def test_fast_sync_batchnorm_single_process_equals_batchnorm():
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(4)
    m = cm.FastSyncBatchNorm(4)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-1, 1)
    m.load_state_dict(ref.state_dict())
    m = m.npu()
    x = torch.randn(3, 4, 5, 5)
    xr, xn = x.clone().requires_grad_(), x.npu().requires_grad_()
    for _ in range(2):
        yr, yn = ref(xr), m(xn)
        torch.testing.assert_close(yn.cpu(), yr.detach(), rtol=1e-5, atol=1e-5)
    gy = torch.randn_like(x)
    yr.backward(gy)
    yn.backward(gy.npu())
    torch.testing.assert_close(xn.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.weight.grad.cpu(), ref.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.running_mean.cpu(), ref.running_mean)
    torch.testing.assert_close(m.running_var.cpu(), ref.running_var)
    m.eval(), ref.eval()
    torch.testing.assert_close(m(x.npu()).cpu(), ref(x), rtol=1e-5, atol=1e-5)
    converted = cm.FastSyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    assert isinstance(converted[0], torch.nn.SyncBatchNorm)


def _sync_bn_rank(rank, world, port, x, gy, state, kind):
    import torch.distributed as dist

    import torch_npu  # noqa: F401  (spawned interpreters start fresh)
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # torch's own SyncBatchNorm runs the batch_norm_stats/... kernels of ops/src/sync_batch_norm.cpp
        m = cm.FastSyncBatchNorm(x.size(1)) if kind == "fast" else torch.nn.SyncBatchNorm(x.size(1))
        m.load_state_dict(state)
        m = m.npu()
        chunk = x.chunk(world)[rank].npu().requires_grad_()
        y = m(chunk)
        y.backward(gy.chunk(world)[rank].npu())
        ref = torch.nn.BatchNorm2d(x.size(1))
        ref.load_state_dict(state)
        xr = x.clone().requires_grad_()
        yr = ref(xr)
        yr.backward(gy)
        torch.testing.assert_close(y.detach().cpu(), yr.detach().chunk(world)[rank], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(chunk.grad.cpu(), xr.grad.chunk(world)[rank], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m.running_mean.cpu(), ref.running_mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.running_var.cpu(), ref.running_var, rtol=1e-4, atol=1e-5)
        assert int(m.num_batches_tracked) == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["fast", "torch"])
def test_sync_batchnorm_two_ranks_equals_batchnorm_on_the_whole_batch(kind):
    import socket

    import torch.multiprocessing as mp
    if torch.npu.device_count() < 2:
        pytest.skip("needs 2 npu devices")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-1, 1)
    x, gy = torch.randn(4, 3, 5, 5) * 2 + 1, torch.randn(4, 3, 5, 5)
    mp.spawn(_sync_bn_rank, args=(2, port, x, gy, ref.state_dict(), kind), nprocs=2, join=True)


def test_npu_pregen_dropout():
    p = 0.3
    drop = cm.NpuPreGenDropout(p, module_name="m")
    model = torch.nn.Sequential(drop).npu()
    x = torch.randn(200, 500).npu()
    with pytest.raises(RuntimeError, match="enable_dropout_ensemble"):
        cm.NpuPreGenDropout(0.77)(x)  # a probability registered after enable_dropout_ensemble
    torch.manual_seed(0)
    cm.NpuPreGenDropout.enable_dropout_ensemble(model)
    outs = [model(x).cpu() for _ in range(2)]
    xc = x.cpu()
    for y in outs:
        kept = y != 0
        torch.testing.assert_close(y[kept], xc[kept] / (1 - p))  # survivors scaled by 1 / (1 - p)
        assert abs((~kept).float().mean().item() - p) < 0.01  # 100k draws: sd of the rate ~0.0015
    assert not torch.equal(outs[0] != 0, outs[1] != 0)  # each forward consumes fresh masks
    mask = drop([(3, 4), torch.float32, "npu"])
    assert mask.shape == (3, 4) and mask.dtype == torch.bool
    model.eval()
    torch.testing.assert_close(model(x).cpu(), xc)
    with pytest.raises(RuntimeError):  # torch_npu's error type for a wrong input
        drop(3)


def test_fast_condition_index_put():
    x = torch.randn(4, 5)
    cond = x > 0.3
    for value in (0, 1, 2.5):
        out = cf.npu_fast_condition_index_put(x.npu(), cond.npu(), value)
        ref = x.clone()
        ref[cond] = value
        torch.testing.assert_close(out.cpu(), ref)
    with pytest.raises(TypeError, match="condition"):
        cf.npu_fast_condition_index_put(x.npu(), cond.int().npu(), 1)


def test_members_importable_from_torch_npu_paths():
    import importlib
    for path, names in {
        "torch_npu.contrib": ["PSROIPool", "BiLSTM", "FusedColorJitter", "FastSyncBatchNorm", "LinearQuant",
                              "LinearA8W8Quant", "LinearWeightQuant", "npu_fast_condition_index_put"],
        "torch_npu.contrib.module": ["QuantConv2d", "DropoutWithByteMask", "NpuPreGenDropout"],
        "torch_npu.contrib.module._ensemble_dropout": ["NpuPreGenDropout"],
        "torch_npu.contrib.module.ps_roi_pooling": ["PSROIPool"],
        "torch_npu.contrib.module.bidirectional_lstm": ["BiLSTM"],
        "torch_npu.contrib.module.fusedcolorjitter": ["FusedColorJitter"],
        "torch_npu.contrib.module.linear_quant": ["LinearQuant"],
        "torch_npu.contrib.module.linear_a8w8_quant": ["LinearA8W8Quant"],
        "torch_npu.contrib.module.linear_weight_quant": ["LinearWeightQuant"],
        "torch_npu.contrib.module.quant_conv2d": ["QuantConv2d"],
        "torch_npu.contrib.module._batchnorm_with_int32_count": ["FastSyncBatchNorm", "FastBatchNorm2d"],
        "torch_npu.contrib.module.npu_modules": ["DropoutWithByteMask"],
        "torch_npu.contrib.function.npu_functional": ["dropout_with_byte_mask"],
        "torch_npu.contrib.function.index_op": ["npu_fast_condition_index_put"],
    }.items():
        mod = importlib.import_module(path)
        for name in names:
            assert hasattr(mod, name), f"{path}.{name}"
    assert torch.nn.DropoutWithByteMask is cm.DropoutWithByteMask
    for name in ("npu_ps_roi_pooling", "npu_quant_matmul", "npu_weight_quant_batchmatmul", "npu_quant_conv2d",
                 "npu_trans_quant_param"):
        assert getattr(torch_npu, name) is getattr(torch.ops.npu, name)
