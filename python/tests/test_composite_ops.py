"""op-plugin's ATen-composed operators (python/torch_npu/_composite_ops.py) against
references computed here on the CPU."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from torch_npu import _composite_ops


def _close(npu_result, expected, **tol):
    torch.testing.assert_close(npu_result.cpu(), expected, **tol)


def test_int_dtype_arguments_map_to_scalar_types():
    # an `int dtype` argument given a torch.dtype receives the dtype's ScalarType code
    x = torch.randn(3, 4)
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.bool, torch.float64):
        assert torch_npu.npu_dtype_cast(x.npu(), dtype).dtype == dtype
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        _composite_ops._dtype("npu_dtype_cast", "dtype", 99)


def test_casts_layout_and_shapes():
    x = torch.randn(2, 3, 4)
    xn = x.npu()
    _close(torch_npu.npu_dtype_cast(xn, torch.float16), x.half())
    dst = torch.empty(2, 3, 4, dtype=torch.float16).npu()
    torch_npu.npu_dtype_cast_(dst, xn)
    _close(dst, x.half())
    out = torch_npu.npu_transpose(xn, (2, 0, 1))
    assert out.is_contiguous()
    _close(out, x.permute(2, 0, 1))
    _close(torch_npu.npu_broadcast(torch.tensor([[1], [2], [3]]).npu(), (3, 3)),
           torch.tensor([[1, 1, 1], [2, 2, 2], [3, 3, 3]]))
    _close(torch_npu.npu_slice(xn, [1, 0, 1], [1, 2, 3]), x[1:2, 0:2, 1:4])
    _close(torch_npu.npu_indexing(xn, [0, 1, 0], [2, 3, 4], [1, 1, 2]), x[0:2, 1:3, 0:4:2])
    # masks: dimension 0 from its start (begin_mask), dimension 1 shrunk to index 2
    _close(torch_npu.npu_indexing(xn, [1, 2, 0], [2, 3, 4], [1, 1, 1], begin_mask=1, shrink_axis_mask=2), x[:2, 2])
    _close(torch_npu.npu_reshape(xn, (6, 4)), x.reshape(6, 4))
    _close(torch_npu.npu_stride_copy(xn, (2, 2), (1, 2), 1), x.reshape(-1).as_strided((2, 2), (1, 2), 1))
    # (before, after) pairs from the first dimension on
    _close(torch_npu.npu_pad(x[0].npu(), (1, 2, 3, 4)), F.pad(x[0], (3, 4, 1, 2)))
    _close(torch_npu.npu_bmmV2(xn, xn.transpose(1, 2), []), x @ x.transpose(1, 2), rtol=1e-5, atol=1e-5)
    y = torch.randn(2, 3).npu()
    assert torch.equal(torch_npu.one_(y).cpu(), torch.ones(2, 3)) and torch.equal(y.cpu(), torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="npu_transpose: perm"):
        torch_npu.npu_transpose(xn, (1, 0))
    with pytest.raises(RuntimeError, match="npu_slice: offsets and size"):
        torch_npu.npu_slice(xn, [0], [1])
    out = torch.zeros(5, device="npu")  # out=: resized to the slice
    assert torch_npu.npu_slice(xn, [1, 0, 1], [1, 2, 3], out=out) is out
    _close(out, x[1:2, 0:2, 1:4])
    with pytest.raises(RuntimeError, match="npu_slice: out must have self's dtype"):
        torch_npu.npu_slice(xn, [1, 0, 1], [1, 2, 3], out=torch.zeros(1, 2, 3, dtype=torch.float16, device="npu"))
    traced = torch.jit.trace(lambda a, o: torch_npu.npu_slice(a, [0, 1, 0], [2, 2, 2], out=o),
                             (xn, torch.zeros(2, 2, 2, device="npu")))
    assert "npu::npu_slice" in str(traced.graph)
    o = torch.zeros(2, 2, 2, device="npu")
    traced(xn, o)
    _close(o, x[0:2, 1:3, 0:2])


def test_stride_add_pads_channel_blocks():
    a, b = torch.randn(1, 3, 2, 2, 16), torch.randn(1, 4, 2, 2, 16)
    out = torch_npu.npu_stride_add(a.npu(), b.npu(), 1, 2, 1)
    expected = torch.zeros(1, 16, 2, 2, 16)
    expected[:, :2] += a[:, 1:]
    expected[:, :2] += b[:, 2:]
    _close(out, expected)


def test_reductions_and_sort():
    x = torch.randn(4, 5, 6)
    values, indices = torch_npu.npu_max(x.npu(), 1, True)
    ref = torch.max(x, 1, True)
    _close(values, ref.values)
    assert indices.dtype == torch.int32 and torch.equal(indices.cpu().long(), ref.indices)
    values, indices = torch_npu.npu_min(x.npu(), dim=-1)
    ref = torch.min(x, -1)
    _close(values, ref.values)
    assert torch.equal(indices.cpu().long(), ref.indices)
    _close(torch_npu.npu_sort_v2(x.npu(), dim=0, descending=True), torch.sort(x, 0, True).values)


def test_activations_and_norms():
    x = torch.randn(8, 16)
    xn = x.npu()
    _close(torch_npu.fast_gelu(xn), x * torch.sigmoid(1.702 * x), rtol=1e-5, atol=1e-5)
    _close(torch_npu.npu_gelu(xn, approximate="tanh"), F.gelu(x, approximate="tanh"))
    _close(torch_npu.npu_silu(xn), F.silu(x))
    _close(torch_npu.npu_mish(xn), F.mish(x))
    z = x.clone().npu()
    torch_npu.npu_silu_(z)
    _close(z, F.silu(x))
    w, b = torch.randn(16), torch.randn(16)
    _close(torch_npu.npu_layer_norm_eval(xn, [16], w.npu(), b.npu(), 1e-5), F.layer_norm(x, [16], w, b, 1e-5),
           rtol=1e-5, atol=1e-5)
    gamma = torch.randn(16)
    y, rstd = torch_npu.npu_gemma_rms_norm(xn, gamma.npu(), 1e-6)
    ref_rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    _close(y, x * ref_rstd * (1 + gamma), rtol=1e-5, atol=1e-5)
    _close(rstd, ref_rstd)
    x2 = torch.randn(8, 16)
    y, mean, rstd, s = torch_npu.npu_add_layer_norm(xn, x2.npu(), w.npu(), b.npu(), 1e-5, True)
    _close(s, x + x2)
    _close(y, F.layer_norm(x + x2, [16], w, b, 1e-5), rtol=1e-5, atol=1e-5)
    _close(mean, (x + x2).mean(-1, keepdim=True), rtol=1e-5, atol=1e-6)
    # float16 + float32: y and the sum in float32, as torch_npu's
    y, _, _, s = torch_npu.npu_add_layer_norm(xn.half(), x2.npu(), w.npu(), b.npu(), 1e-5, True)
    assert y.dtype == s.dtype == torch.float32
    _close(y, F.layer_norm(x.half().float() + x2, [16], w, b, 1e-5), rtol=1e-5, atol=1e-5)
    mean, rstd, y = torch_npu.npu_deep_norm(xn, x2.npu(), b.npu(), w.npu(), alpha=0.5)
    _close(y, F.layer_norm(x * 0.5 + x2, [16], w, b, 1e-6), rtol=1e-5, atol=1e-5)
    labels = torch.rand(8, 16)
    _close(torch_npu.npu_softmax_cross_entropy_with_logits(xn, labels.npu()),
           -(labels * F.log_softmax(x, -1)).sum(-1), rtol=1e-5, atol=1e-5)
    bias, mask = torch.randn(1, 1, 3, 4, 4), torch.randn(1, 2, 1, 4, 4)
    s = torch.randn(1, 2, 3, 4, 4)
    _close(torch_npu.npu_masked_softmax_with_rel_pos_bias(s.npu(), mask.npu(), bias.npu()),
           F.softmax(s + mask + bias, -1), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="approximate must be"):
        torch_npu.npu_gelu(xn, approximate="erf")


def test_autograd_flows_through_the_compositions():
    x = torch.randn(4, 6, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    torch_npu.npu_mish(torch_npu.npu_transpose(xn, (1, 0))).sum().backward()
    F.mish(x.t()).sum().backward()
    _close(xn.grad, x.grad, rtol=1e-5, atol=1e-6)


def test_interleave_rope():
    x, cos, sin = torch.randn(2, 3, 4, 8), torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8)
    q = x.reshape(2, 3, 4, 4, 2).transpose(-1, -2).reshape(2, 3, 4, 8)
    expected = q * cos + torch.cat([-q[..., 4:], q[..., :4]], -1) * sin
    _close(torch_npu.npu_interleave_rope(x.npu(), cos.npu(), sin.npu()), expected)


def test_one_hot_scatter_and_fill():
    labels = torch.tensor([[0, 2, 5], [1, 1, 3]])
    out = torch_npu.npu_one_hot(labels.npu(), -1, 4, 2.0, -1.0)
    expected = torch.where(F.one_hot(labels, 6)[..., :4].bool(), 2.0, -1.0)
    _close(out, expected)
    var, upd = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 2, 4)
    idx = torch.tensor([1, 5])
    expected = var.clone()
    expected[0, :, 1:3], expected[1, :, 5:7] = upd[0], upd[1]
    vn = var.npu()
    _close(torch_npu.scatter_update(vn, idx.npu(), upd.npu(), -2), expected)
    _close(vn, var)  # the functional form leaves self alone
    torch_npu.scatter_update_(vn, idx.npu(), upd.npu(), -2)
    _close(vn, expected)
    base, nd_idx, nd_upd = torch.zeros(4, 3), torch.tensor([[0], [2]]), torch.randn(2, 3)
    expected = base.clone()
    expected[0], expected[2] = nd_upd[0], nd_upd[1]
    _close(torch_npu.npu_scatter_nd_update(base.npu(), nd_idx.npu(), nd_upd.npu()), expected)
    s = torch.zeros(3, 5)
    out = torch_npu.npu_scatter(s.npu(), torch.tensor([4, 0, 2]).npu(), torch.tensor([1.0, 2.0, 3.0]).npu(), 1)
    _close(out, torch.tensor([[0, 0, 0, 0, 1.0], [2.0, 0, 0, 0, 0], [0, 0, 3.0, 0, 0]]))
    x = torch.randn(3, 2, 6)
    start, end = torch.tensor([[0, 2, 1]], dtype=torch.int32), torch.tensor([[2, 5, 1]], dtype=torch.int32)
    expected = x.clone()
    expected[0, :, 0:2], expected[1, :, 2:5] = 7.0, 7.0
    _close(torch_npu.npu_masked_fill_range(x.npu(), start.npu(), end.npu(), torch.tensor([7.0]).npu(), 2), expected)


def test_sign_bits_pack_roundtrip():
    x = torch.randn(40)
    packed = torch_npu.npu_sign_bits_pack(x.npu(), 5)
    assert packed.shape == (5, 1) and packed.dtype == torch.uint8
    bits = torch.tensor([int((v >= 0).item()) << (i % 8) for i, v in enumerate(x)]).view(5, 8).sum(-1, keepdim=True)
    assert torch.equal(packed.cpu().long(), bits)
    unpacked = torch_npu.npu_sign_bits_unpack(packed, 1, torch.float32)
    _close(unpacked, torch.where(x >= 0, 1.0, -1.0).view(1, 40))


def test_quantization():
    x = torch.randint(-128, 128, (4, 8), dtype=torch.int8)
    scale, offset = torch.rand(8), torch.randn(8)
    _close(torch_npu.npu_anti_quant(x.npu(), scale.npu(), offset=offset.npu(), dst_dtype=torch.bfloat16),
           ((x.float() + offset) * scale).bfloat16())
    nibbles = torch.randint(-8, 8, (2, 8))
    words = torch.zeros(2, 1, dtype=torch.int64)
    for i in range(8):
        words[:, 0] |= (nibbles[:, i] & 0xF) << (4 * i)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    _close(torch_npu.npu_anti_quant(words.npu(), torch.ones(8).npu()), nibbles.half())
    f = torch.randn(4, 8) * 10
    scales = torch.rand(8) + 0.5
    q = torch_npu.npu_quantize(f.npu(), scales.npu(), None, torch.qint8, axis=1)
    assert q.dtype == torch.int8
    _close(q, torch.round(f / scales).clamp(-128, 127).to(torch.int8))
    y, s = torch_npu.npu_dynamic_quant(f.npu())
    ref_s = f.abs().amax(-1) / 127
    _close(s, ref_s)
    _close(y, torch.round(f / ref_s.unsqueeze(-1)).clamp(-128, 127).to(torch.int8))
    with pytest.raises(RuntimeError, match="npu_quantize: dtype must be"):
        torch_npu.npu_quantize(f.npu(), scales.npu(), None, torch.float32)
    # torch.quint4x2 (div_mode=False): round(x * scale + zero_point) in [-8, 7], packed eight to an int32
    q4 = torch_npu.npu_quantize(f.npu(), scales.npu(), torch.ones(8).npu(), torch.quint4x2, -1, False)
    assert q4.dtype == torch.int32 and q4.shape == (4, 1)
    expected = torch.round(f * scales + 1).clamp(-8, 7)
    _close(torch_npu.npu_anti_quant(q4, torch.ones(8).npu()), expected.half())  # small integers: exact
    with pytest.raises(RuntimeError, match="divded by 8"):
        torch_npu.npu_quantize(f[:, :4].npu(), scales[:4].npu(), None, torch.quint4x2, -1, False)
    # npu_dynamic_quant to int4 (scale = max|x| / 7, packed eight to an int32) and with MoE groups:
    # row r takes smooth_scales[g] for group_index[g - 1] <= r < group_index[g]
    y4, s4 = torch_npu.npu_dynamic_quant(f.npu(), dst_type=torch.quint4x2)
    ref_s4 = f.abs().amax(-1) / 7
    _close(s4, ref_s4)
    assert y4.dtype == torch.int32 and y4.shape == (4, 1)
    _close(torch_npu.npu_anti_quant(y4, torch.ones(8).npu()), torch.round(f / ref_s4.unsqueeze(-1)).half())
    rows = torch.randn(2, 3, 8)
    smooth, ends = torch.rand(3, 8) + 0.5, torch.tensor([2, 2, 6], dtype=torch.int32)
    yg, sg = torch_npu.npu_dynamic_quant(rows.npu(), smooth_scales=smooth.npu(), group_index=ends.npu())
    smoothed = rows.reshape(6, 8) * smooth[torch.tensor([0, 0, 2, 2, 2, 2])]
    ref_sg = smoothed.abs().amax(-1) / 127
    _close(sg, ref_sg.reshape(2, 3))
    _close(yg, torch.round(smoothed / ref_sg.unsqueeze(-1)).clamp(-128, 127).to(torch.int8).reshape(2, 3, 8))
    # asymmetric: scale = (max - min) / 255, offset = 127 - max / scale, y = round(x / scale + offset)
    ya, sa, oa = torch_npu.npu_dynamic_quant_asymmetric(f.npu())
    ref_sa = (f.amax(-1) - f.amin(-1)) / 255
    ref_oa = 127 - f.amax(-1) / ref_sa
    _close(sa, ref_sa)
    _close(oa, ref_oa)
    _close(ya, torch.round(f / ref_sa.unsqueeze(-1) + ref_oa.unsqueeze(-1)).clamp(-128, 127).to(torch.int8))
    y4a, s4a, o4a = torch_npu.npu_dynamic_quant_asymmetric(f.npu(), dst_type=torch.quint4x2)
    _close(s4a, (f.amax(-1) - f.amin(-1)) / 15)
    assert y4a.dtype == torch.int32 and y4a.shape == (4, 1)
    # per MoE group: row r of group e is round(x[r] * scale[e] + offset)
    xg, sc, off = torch.randn(6, 16), torch.rand(3, 16) * 20, torch.tensor([0.5])
    out = torch_npu.npu_group_quant(xg.npu(), sc.npu(), ends.npu(), offset=off.npu(), dst_dtype=torch.qint8)
    _close(out, torch.round(xg * sc[torch.tensor([0, 0, 2, 2, 2, 2])] + 0.5).clamp(-128, 127).to(torch.int8))
    out4 = torch_npu.npu_group_quant(xg.npu(), sc.npu(), ends.npu(), dst_dtype=torch.quint4x2)
    assert out4.dtype == torch.int32 and out4.shape == (6, 2)
    with pytest.raises(RuntimeError, match="dst_dtype must be Int8 or Int4"):
        torch_npu.npu_group_quant(xg.npu(), sc.npu(), ends.npu(), dst_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="npu_quantize: dtype must be"):
        torch_npu.npu_quantize(f.npu(), scales.npu(), None, torch.quint4x2)  # div_mode=True has no int4


def _xywh_diou(p, g, complete):
    eps = 1e-10
    px1, px2, py1, py2 = p[0] - p[2] / 2, p[0] + p[2] / 2, p[1] - p[3] / 2, p[1] + p[3] / 2
    gx1, gx2, gy1, gy2 = g[0] - g[2] / 2, g[0] + g[2] / 2, g[1] - g[3] / 2, g[1] + g[3] / 2
    inter = (min(px2, gx2) - max(px1, gx1)).clamp(0) * (min(py2, gy2) - max(py1, gy1)).clamp(0)
    union = p[2] * p[3] + g[2] * g[3] - inter + eps
    iou = inter / union
    c2 = (max(px2, gx2) - min(px1, gx1)) ** 2 + (max(py2, gy2) - min(py1, gy1)) ** 2 + eps
    out = iou - ((p[0] - g[0]) ** 2 + (p[1] - g[1]) ** 2) / c2
    if complete:
        v = 4 / math.pi ** 2 * (torch.atan(g[2] / g[3]) - torch.atan(p[2] / p[3])) ** 2
        out = out - v * v / ((1 + eps) - iou + v)
    return out


@pytest.mark.parametrize("op,complete", [("npu_diou", False), ("npu_ciou", True)])
def test_distance_ious(op, complete):
    boxes, gt = torch.rand(4, 6) * 10, torch.rand(4, 6) * 10
    out = getattr(torch_npu, op)(boxes.npu(), gt.npu(), trans=True, is_cross=False)
    expected = torch.stack([_xywh_diou(boxes[:, i], gt[:, i], complete) for i in range(6)]).view(1, 6)
    _close(out, expected, rtol=1e-4, atol=1e-5)
    cross = getattr(torch_npu, op)(boxes.npu(), gt[:, :3].npu(), trans=True, is_cross=True)
    assert cross.shape == (3, 6)
    expected_cross = torch.stack([torch.stack([_xywh_diou(boxes[:, i], gt[:, j], complete) for i in range(6)])
                                  for j in range(3)])
    _close(cross, expected_cross, rtol=1e-4, atol=1e-5)


def test_bounding_box_encode_decode_roundtrip():
    anchors = torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 5.0, 20.0, 30.0]])
    gt = torch.tensor([[1.0, 2.0, 12.0, 9.0], [4.0, 6.0, 18.0, 33.0]])
    means, stds = [0.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.2, 0.2]
    deltas = torch_npu.npu_bounding_box_encode(anchors.npu(), gt.npu(), *means, *stds)
    aw, gw = anchors[:, 2] - anchors[:, 0] + 1, gt[:, 2] - gt[:, 0] + 1
    dx = ((gt[:, 0] + gt[:, 2]) / 2 - (anchors[:, 0] + anchors[:, 2]) / 2) / aw / 0.1
    _close(deltas[:, 2], torch.log(gw / aw) / 0.2, rtol=1e-5, atol=1e-5)
    _close(deltas[:, 0], dx, rtol=1e-5, atol=1e-5)
    decoded = torch_npu.npu_bounding_box_decode(anchors.npu(), deltas, *means, *stds, [100, 100], 16 / 1000)
    _close(decoded, gt, rtol=1e-4, atol=1e-3)


def test_convolutions():
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    _close(torch_npu.npu_conv2d(x.npu(), w.npu(), b.npu(), [1, 1], [1, 1], [1, 1], 1),
           F.conv2d(x, w, b, 1, 1), rtol=1e-4, atol=1e-4)
    wt = torch.randn(3, 4, 3, 3)
    _close(torch_npu.npu_convolution_transpose(x.npu(), wt.npu(), None, [1, 1], [1, 1], [2, 2], [1, 1], 1),
           F.conv_transpose2d(x, wt, None, 2, 1, 1), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="npu_conv3d: input must be 5-D"):
        torch_npu.npu_conv3d(x.npu(), w.npu(), None, [1, 1], [0, 0], [1, 1], 1)


def test_npu_conv2d_takes_four_paddings_and_has_a_backward():
    """op-plugin's npu_conv2d reads padding[0] and padding[1] (callers pass (0, 0, 0, 0)), and
    npu_conv2d_backward returns the input, weight and bias gradients output_mask asks for."""
    x, w, b = torch.randn(1, 3, 7, 7), torch.randn(4, 3, 3, 3), torch.randn(4)
    _close(torch_npu.npu_conv2d(x.npu(), w.npu(), b.npu(), [2, 2], (1, 1, 1, 1), [1, 1], 1),
           F.conv2d(x, w, b, 2, 1), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="npu_conv2d: padding has to contain at least 2 elements"):
        torch_npu.npu_conv2d(x.npu(), w.npu(), None, [1, 1], [1], [1, 1], 1)
    xc, wc, bc = (t.clone().requires_grad_() for t in (x, w, b))
    out = F.conv2d(xc, wc, bc, 1, 1)
    grad = torch.randn_like(out)
    out.backward(grad)
    gi, gw, gb = torch_npu.npu_conv2d_backward(x.npu(), grad.npu(), w.npu(), [1, 1], (1, 1, 0, 0), [1, 1], 1,
                                               [True, True, True])
    for got, want in ((gi, xc.grad), (gw, wc.grad), (gb, bc.grad)):
        _close(got, want, rtol=1e-4, atol=1e-4)
    gi, gw, gb = torch_npu.npu_conv2d_backward(x.npu(), grad.npu(), w.npu(), [1, 1], [1, 1], [1, 1], 1,
                                               [False, True, False])
    _close(gw, wc.grad, rtol=1e-4, atol=1e-4)
    assert gi.numel() == 0 and gb.numel() == 0


def test_batch_norm_gather_stats_update_from_per_device_sums():
    x = torch.rand(2, 3, 4, 4) + 1
    sums, squares = torch.rand(4, 3) * 10, torch.rand(4, 3) * 100
    counts = torch.tensor([4.0, 5.0, 6.0, 4.0])
    rm, rv = torch.rand(3), torch.rand(3)
    rm_n, rv_n = rm.npu(), rv.npu()
    mean, invstd = torch_npu.batch_norm_gather_stats_update(x.npu(), sums.npu(), squares.npu(), rm_n, rv_n,
                                                            0.1, 1e-5, counts.npu())
    m = sums.sum(0) / counts.sum()
    var = squares.sum(0) / counts.sum() - m * m
    _close(mean, m)
    _close(invstd, 1 / torch.sqrt(var + 1e-5))
    _close(rm_n, 0.1 * m + 0.9 * rm)
    _close(rv_n, 0.1 * var + 0.9 * rv)
    half, _ = torch_npu.batch_norm_gather_stats_update(x.half().npu(), sums.half().npu(), squares.half().npu(),
                                                       None, None, 0.1, 1e-5, counts.half().npu())
    assert half.dtype == torch.float16
    with pytest.raises(RuntimeError, match="batch_norm_gather_stats_update: expected mean and invstd"):
        torch_npu.batch_norm_gather_stats_update(x.npu(), sums[0].npu(), squares.npu(), None, None, 0.1, 1e-5,
                                                 counts.npu())


@pytest.mark.parametrize("with_offset", [False, True])
def test_npu_ifmr_picks_the_scale_of_least_reconstruction_error(with_offset):
    torch.manual_seed(0)
    x = torch.rand(4, 5, 6) * 2 - 1
    lo, hi = x.min().reshape(1), x.max().reshape(1)
    cumsum = torch.cumsum(torch.histc(x, bins=128, min=lo.item(), max=hi.item()), 0).int()
    scale, offset = torch_npu.npu_ifmr(x.npu(), lo.npu(), hi.npu(), cumsum.npu(), min_percentile=0.999999,
                                       max_percentile=0.999999, search_start=0.7, search_end=1.3,
                                       search_step=0.01, with_offset=with_offset)
    assert scale.shape == (1,) and offset.shape == (1,)
    # 120 values: the 0.999999 percentiles are the first bin's start and the last bin's start
    top = lo + (hi - lo) * 127 / 128
    steps = torch.arange(0.7, 1.3, 0.01)
    if with_offset:
        cand = (top.clamp(min=0) * steps - lo.clamp(max=0)) / 255
        offs = -(torch.round(lo.clamp(max=0) / cand) + 128)
    else:
        cand = torch.maximum(top.abs(), lo.abs()) * steps / 127
        offs = torch.zeros_like(cand)
    err = torch.stack([((torch.round(x / c) + o).clamp(-128, 127) - o).mul(c).sub(x).square().sum()
                       for c, o in zip(cand, offs)])
    i = torch.argmin(err)
    _close(scale, cand[i].reshape(1), rtol=1e-5, atol=0)
    _close(offset, offs[i].reshape(1))
    if not with_offset:
        assert offset.item() == 0
    with pytest.raises(RuntimeError, match="npu_ifmr: expected search_start < search_end"):
        torch_npu.npu_ifmr(x.npu(), lo.npu(), hi.npu(), cumsum.npu(), 0.9, 0.9, 1.3, 0.7, 0.01, with_offset)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0])
def test_npu_renorm_backward_is_renorms_gradient(p):
    torch.manual_seed(0)
    x, g = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    xc = x.clone().requires_grad_()
    torch.renorm(xc, p, 1, 1.5).backward(g)
    _close(torch_npu.npu_renorm_backward(g.npu(), x.npu(), p, 1, 1.5), xc.grad, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="npu_renorm_backward: grad of shape"):
        torch_npu.npu_renorm_backward(g[0].npu(), x.npu(), p, 1, 1.5)


def test_copy_memory_copies_raw_memory_between_npu_tensors():
    src = torch.arange(12.0).npu()
    dst = torch.zeros(3, 4).npu()
    assert torch_npu.copy_memory_(dst, src) is dst
    _close(dst, torch.arange(12.0).reshape(3, 4))
    # memory order, not element order: a transposed destination receives the bytes as laid out
    base = torch.zeros(3, 4).npu()
    torch_npu.copy_memory_(base.t(), src, non_blocking=True)
    torch.npu.synchronize()
    _close(base, torch.arange(12.0).reshape(3, 4))
    with pytest.raises(RuntimeError, match="input tensors of copy_memory_ should have same dtype"):
        torch_npu.copy_memory_(dst, src.int())
    with pytest.raises(RuntimeError, match="copy_memory_ only support npu tensor"):
        torch_npu.copy_memory_(dst, torch.arange(12.0))


def test_moe_routing_helpers():
    sorted_experts = torch.tensor([0, 0, 0, 1, 1, 3], dtype=torch.int32)
    out = torch_npu.npu_moe_compute_expert_tokens(sorted_experts.npu(), 4)
    assert out.dtype == torch.int32 and out.cpu().tolist() == [3, 5, 5, 6]
    n, k, h, e = 3, 2, 4, 5
    rows = torch.randn(n * k, h)
    dst = torch.randperm(n * k)
    scales, experts = torch.rand(n, k), torch.randint(0, e, (n, k))
    bias, skip = torch.randn(e, h), torch.randn(n, h)
    out = torch_npu.npu_moe_finalize_routing(rows.npu(), skip.npu(), None, bias.npu(), scales.npu(), dst.npu(),
                                             experts.npu())
    expected = skip.clone()
    for i in range(n):
        for j in range(k):
            expected[i] += scales[i, j] * (rows[dst[j * n + i]] + bias[experts[i, j]])
    _close(out, expected, rtol=1e-5, atol=1e-5)



def test_moe_finalize_routing_drop_pad_and_row_order():
    """drop_pad_mode 1/3: rows [E, C, H], dst -1 for a dropped token (its row is zeros, its
    bias still adds); modes 2/3 index dst by row (i * K + j) instead of by column."""
    torch.manual_seed(0)
    n, k, e, c, h = 6, 2, 4, 3, 5
    rows = torch.randn(e, c, h)
    skip = torch.randn(n, h)
    bias = torch.randn(e, h)
    scales = torch.randn(n, k)
    experts = torch.randint(0, e, (n, k), dtype=torch.int32)
    dst = torch.randint(-1, e * c, (n * k,), dtype=torch.int32)
    flat = rows.reshape(-1, h)
    for mode in (1, 3):
        out = torch_npu.npu_moe_finalize_routing(rows.npu(), skip.npu(), None, bias.npu(), scales.npu(), dst.npu(),
                                                 experts.npu(), drop_pad_mode=mode)
        expected = skip.clone()
        for i in range(n):
            for j in range(k):
                d = int(dst[j * n + i] if mode == 1 else dst[i * k + j])
                row = flat[d] if d >= 0 else torch.zeros(h)
                expected[i] += scales[i, j] * (row + bias[experts[i, j]])
        _close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="drop_pad_mode must be in"):
        torch_npu.npu_moe_finalize_routing(rows.npu(), skip.npu(), None, bias.npu(), scales.npu(), dst.npu(),
                                           experts.npu(), drop_pad_mode=4)
    with pytest.raises(RuntimeError, match=r"expanded_permuted_rows must be \[E, C, H\]"):
        torch_npu.npu_moe_finalize_routing(flat.npu(), skip.npu(), None, bias.npu(), scales.npu(), dst.npu(),
                                           experts.npu(), drop_pad_mode=1)

def test_top_k_top_p():
    logits = torch.randn(3, 10)
    k, p = torch.tensor([2, 5, 10], dtype=torch.int32), torch.tensor([1.0, 0.5, 0.9])
    out = torch_npu.npu_top_k_top_p(logits.npu(), p.npu(), k.npu()).cpu()
    for b in range(3):
        order = logits[b].argsort(descending=True)
        kept = set(order[:int(k[b])].tolist())
        probs = logits[b][order[:int(k[b])]].softmax(-1)
        # nucleus over the top-k: tokens while the mass before them is below p
        nucleus = {int(order[i]) for i in range(int(k[b])) if probs[:i].sum() < p[b] or i == 0}
        kept &= nucleus
        for v in range(10):
            assert (out[b, v] == logits[b, v]) if v in kept else (out[b, v] == float("-inf")), (b, v)


def test_dropout_bit_masks():
    torch.npu.manual_seed(0)
    mask = torch_npu.npu_dropout_gen_mask([10, 30], 0.25, device="npu")
    assert mask.dtype == torch.uint8 and mask.shape == (384 // 8,)  # 300 elements -> 384 bits
    x = torch.randn(10, 30)
    out, same = torch_npu.npu_dropout_do_mask(x.npu(), mask, 0.25)
    bits = torch.tensor([(int(b) >> i) & 1 for b in mask.cpu() for i in range(8)])[:300].view(10, 30)
    _close(out, x * bits / 0.75)
    assert torch.equal(same.cpu(), mask.cpu())
    assert 0.6 < bits.float().mean() < 0.9  # keep probability 0.75
    xn = torch.randn(64, 64).npu().requires_grad_()
    out, mask = torch_npu._npu_dropout(xn, 0.5)
    out.sum().backward()
    kept = (out != 0).cpu()
    _close(xn.grad, kept.float() * 2.0)


def test_lstm_cell_matches_torch():
    x, h, c = torch.randn(3, 8), torch.randn(3, 7), torch.randn(3, 7)
    w_ih, w_hh, b_ih, b_hh = torch.randn(8, 28), torch.randn(7, 28), torch.randn(28), torch.randn(28)
    out = torch_npu.npu_lstm_cell(x.npu(), w_ih.npu(), w_hh.npu(), h.npu(), c.npu(), b_ih.npu(), b_hh.npu())
    ref_h, ref_c = torch._VF.lstm_cell(x, (h, c), w_ih.t(), w_hh.t(), b_ih, b_hh)
    _close(out[1], ref_h, rtol=1e-5, atol=1e-5)
    _close(out[2], ref_c, rtol=1e-5, atol=1e-5)
    _close(out[7], torch.tanh(ref_c), rtol=1e-5, atol=1e-5)


def _lstm_steps(x, w_ih, w_hh, b, h0, c0, lengths=None, reverse=False):
    """torch's LSTM cell step by step (autograd records it); with lengths, a step t >= length of
    a sequence keeps its state and outputs 0. Returns the [T, B, H] sequences y, h, c."""
    h, c = h0[0], c0[0]
    ys, hs, cs = [None] * len(x), [None] * len(x), [None] * len(x)
    for t in (range(len(x) - 1, -1, -1) if reverse else range(len(x))):
        hn, cn = torch._VF.lstm_cell(x[t], (h, c), w_ih, w_hh, b, torch.zeros_like(b))
        if lengths is not None:
            keep = (t < lengths)[:, None]
            ys[t] = torch.where(keep, hn, torch.zeros_like(hn))
            hn, cn = torch.where(keep, hn, h), torch.where(keep, cn, c)
        else:
            ys[t] = hn
        h, c, hs[t], cs[t] = hn, cn, hn, cn
    return torch.stack(ys), torch.stack(hs), torch.stack(cs)


def test_npu_lstm_matches_torch_lstm():
    steps, batch, features, hidden = 6, 3, 5, 4
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(features, hidden)
    x, h0, c0 = torch.randn(steps, batch, features), torch.randn(1, batch, hidden), torch.randn(1, batch, hidden)
    weight = torch.cat([lstm.weight_ih_l0.t(), lstm.weight_hh_l0.t()]).detach()  # [I + H, 4H]
    bias = (lstm.bias_ih_l0 + lstm.bias_hh_l0).detach()
    out = torch_npu.npu_lstm(x.npu(), weight.npu(), bias.npu(), torch.zeros(0).npu(), h0.npu(), c0.npu(), True, 1, 0.0,
                             True, False, False, False, False)
    assert len(out) == 8 and all(t.shape == (steps, batch, hidden) for t in out)
    y, (hn, cn) = lstm(x, (h0, c0))
    _close(out[0], y.detach(), rtol=1e-5, atol=1e-5)
    _close(out[1][-1:], hn.detach(), rtol=1e-5, atol=1e-5)
    _close(out[2][-1:], cn.detach(), rtol=1e-5, atol=1e-5)
    _close(out[1], y.detach(), rtol=1e-5, atol=1e-5)  # h at every step
    # the gates: c_t = f c_{t-1} + i j, h_t = o tanh(c_t), tanh(c_t)
    y_, h_, c_, i, j, f, o, tanh_c = (t.cpu() for t in out)
    c_prev = torch.cat([c0, c_[:-1]])
    _close(c_, f * c_prev + i * j, rtol=1e-5, atol=1e-5)
    _close(h_, o * tanh_c, rtol=1e-5, atol=1e-5)
    _close(tanh_c, torch.tanh(c_), rtol=1e-5, atol=1e-5)
    # REDIRECTIONAL: the steps run backwards, outputs at their time index
    rev = torch_npu.npu_lstm(x.npu(), weight.npu(), bias.npu(), torch.zeros(0).npu(), h0.npu(), c0.npu(), True, 1,
                             0.0, True, False, False, False, True)
    y_flip, (hn_flip, _) = lstm(x.flip(0), (h0, c0))
    _close(rev[0], y_flip.flip(0).detach(), rtol=1e-5, atol=1e-5)
    _close(rev[1][:1], hn_flip.detach(), rtol=1e-5, atol=1e-5)
    # float16
    half = torch_npu.npu_lstm(x.half().npu(), weight.half().npu(), bias.half().npu(), torch.zeros(0).npu(),
                              h0.half().npu(), c0.half().npu(), True, 1, 0.0, True, False, False, False, False)
    assert all(t.dtype == torch.float16 for t in half)
    _close(half[0].float(), y.detach(), rtol=1e-2, atol=1e-2)


def test_npu_lstm_sequence_mask_matches_packed_lstm():
    steps, batch, features, hidden = 6, 3, 5, 4
    torch.manual_seed(1)
    lstm = torch.nn.LSTM(features, hidden, bidirectional=True)
    lengths = torch.tensor([6, 4, 2], dtype=torch.int32)
    x, h0, c0 = torch.randn(steps, batch, features), torch.randn(2, batch, hidden), torch.randn(2, batch, hidden)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.long())
    y_packed, (hn, cn) = lstm(packed, (h0, c0))
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(y_packed)
    valid = (torch.arange(steps)[:, None] < lengths)[..., None]
    float_mask = valid.expand(steps, batch, hidden).half()
    for d, (suffix, reverse) in enumerate((("", False), ("_reverse", True))):
        weight = torch.cat([getattr(lstm, "weight_ih_l0" + suffix).t(), getattr(lstm, "weight_hh_l0" + suffix).t()])
        bias = getattr(lstm, "bias_ih_l0" + suffix) + getattr(lstm, "bias_hh_l0" + suffix)
        for mask in (lengths, float_mask):  # int32 lengths [B] or a float16 mask [T, B, H]
            out = torch_npu.npu_lstm(x.npu(), weight.detach().npu(), bias.detach().npu(), mask.npu(),
                                     h0[d:d + 1].npu(), c0[d:d + 1].npu(), True, 1, 0.0, True, True, False, True,
                                     reverse)
            _close(out[0], y[..., d * hidden:(d + 1) * hidden].detach(), rtol=1e-5, atol=1e-5)  # 0 past a length
            final = 0 if reverse else -1  # the states reach the last step unchanged past a length
            _close(out[1][final], hn[d].detach(), rtol=1e-5, atol=1e-5)
            _close(out[2][final], cn[d].detach(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="seq_mask of sequence lengths must have 3"):
        torch_npu.npu_lstm(x.npu(), weight.detach().npu(), bias.detach().npu(), lengths[:2].npu(), h0[:1].npu(),
                           c0[:1].npu(), True, 1, 0.0, True, False, False, True, False)


def _lstm_problem(seed, steps, batch, features, hidden):
    """x, w_ih, w_hh, b, h0, c0 of an LSTM layer and output gradients gy, gh, gc [T, B, H]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, batch, features, generator=g)
    w_ih, w_hh = torch.randn(4 * hidden, features, generator=g), torch.randn(4 * hidden, hidden, generator=g)
    b = torch.randn(4 * hidden, generator=g)
    h0, c0 = torch.randn(1, batch, hidden, generator=g), torch.randn(1, batch, hidden, generator=g)
    gy, gh, gc = (torch.randn(steps, batch, hidden, generator=g) for _ in range(3))
    return x, w_ih, w_hh, b, h0, c0, gy, gh, gc


@pytest.mark.parametrize("reverse,masked", [(False, False), (True, False), (False, True), (True, True)])
def test_npu_lstm_backward(reverse, masked):
    x, w_ih, w_hh, b, h0, c0, gy, gh, gc = _lstm_problem(2, 5, 3, 4, 6)
    lengths = torch.tensor([5, 2, 3], dtype=torch.int32) if masked else None
    leaves = [t.clone().requires_grad_() for t in (x, w_ih, w_hh, b, h0, c0)]
    ys, hs, cs = _lstm_steps(*leaves, lengths=lengths, reverse=reverse)
    ((ys * gy).sum() + (hs * gh).sum() + (cs * gc).sum()).backward()
    ref = [leaves[0].grad, torch.cat([leaves[1].grad.t(), leaves[2].grad.t()]), leaves[3].grad, leaves[4].grad,
           leaves[5].grad]
    npu = [t.npu().requires_grad_() for t in (x, torch.cat([w_ih.t(), w_hh.t()]), b, h0, c0)]
    mask = lengths.npu() if masked else torch.zeros(0).npu()
    out = torch_npu.npu_lstm(npu[0], npu[1], npu[2], mask, npu[3], npu[4], True, 1, 0.0, True, False, False, masked,
                             reverse)
    _close(out[0].detach(), ys.detach(), rtol=1e-5, atol=1e-5)
    _close(out[2].detach(), cs.detach(), rtol=1e-5, atol=1e-5)
    assert all(not t.requires_grad for t in out[3:])  # the gates are not differentiable
    ((out[0] * gy.npu()).sum() + (out[1] * gh.npu()).sum() + (out[2] * gc.npu()).sum()).backward()
    for leaf, want in zip(npu, ref):
        _close(leaf.grad, want, rtol=1e-4, atol=1e-4)


def test_npu_lstm_backward_operator():
    # npu_lstm_backward (DynamicRNNGrad): grady for every step, the last step of gradh and gradc
    x, w_ih, w_hh, b, h0, c0, gy, gh, gc = _lstm_problem(3, 4, 2, 3, 5)
    leaves = [t.clone().requires_grad_() for t in (x, w_ih, w_hh, b, h0, c0)]
    ys, hs, cs = _lstm_steps(*leaves)
    ((ys * gy).sum() + (hs[-1] * gh[-1]).sum() + (cs[-1] * gc[-1]).sum()).backward()
    weight = torch.cat([w_ih.t(), w_hh.t()])
    out = torch_npu.npu_lstm(x.npu(), weight.npu(), b.npu(), torch.zeros(0).npu(), h0.npu(), c0.npu(), True, 1, 0.0,
                             True, False, False, False, False)
    grads = torch_npu.npu_lstm_backward(gy.npu(), gh.npu(), gc.npu(), x.npu(), weight.npu(), b.npu(), h0.npu(),
                                        c0.npu(), *out)
    want = [leaves[0].grad, torch.cat([leaves[1].grad.t(), leaves[2].grad.t()]), leaves[3].grad, leaves[4].grad,
            leaves[5].grad]
    assert [tuple(t.shape) for t in grads] == [tuple(t.shape) for t in want]
    for got, expected in zip(grads, want):
        _close(got, expected, rtol=1e-4, atol=1e-4)
    # without gradh / gradc: the gradients of y alone
    grads = torch_npu.npu_lstm_backward(gy.npu(), None, None, x.npu(), weight.npu(), b.npu(), h0.npu(), c0.npu(),
                                        *out)
    leaves = [t.clone().requires_grad_() for t in (x, w_ih, w_hh, b, h0, c0)]
    dx, dw_ih, dw_hh, db, dh0, dc0 = torch.autograd.grad((_lstm_steps(*leaves)[0] * gy).sum(), leaves)
    for got, expected in zip(grads, (dx, torch.cat([dw_ih.t(), dw_hh.t()]), db, dh0, dc0)):
        _close(got, expected, rtol=1e-4, atol=1e-4)


def test_npu_lstm_shapes_and_errors():
    x, w, b = torch.empty(7, 2, 3, device="meta"), torch.empty(3 + 4, 16, device="meta"), torch.empty(16, device="meta")
    h = torch.empty(1, 2, 4, device="meta")
    out = torch_npu.npu_lstm(x, w, b, torch.empty(0, device="meta"), h, h, True, 1, 0.0, True, False, False, False,
                             False)
    assert all(t.shape == (7, 2, 4) and t.device.type == "meta" for t in out)
    with pytest.raises(RuntimeError, match=r"weight must be \[input_size \+ hidden_size, 4 \* hidden_size\]"):
        torch_npu.npu_lstm(torch.randn(7, 2, 3).npu(), torch.randn(6, 16).npu(), torch.randn(16).npu(),
                           torch.zeros(0).npu(), torch.randn(1, 2, 4).npu(), torch.randn(1, 2, 4).npu(), True, 1, 0.0,
                           True, False, False, False, False)


# ---- MoE gating / permutation / re-routing (references from op-plugin's formulas) -----------

def test_moe_gating_top_k_softmax_v2():
    x = torch.randn(2, 5, 16)
    finished = torch.tensor([[False, True, False, False, True], [False] * 5])
    y, idx, sm = torch_npu.npu_moe_gating_top_k_softmax_v2(x.npu(), k=3, finished=finished.npu(), output_softmax=True)
    p = torch.softmax(x, -1)
    ref = p.topk(3, -1)
    _close(y, ref.values, rtol=1e-5, atol=1e-6)
    expected_idx = ref.indices.masked_fill(finished.unsqueeze(-1), 16).int()
    assert idx.dtype == torch.int32 and torch.equal(idx.cpu(), expected_idx)
    _close(sm, p, rtol=1e-5, atol=1e-6)
    # renorm=1: top-k of the logits, softmax over the k chosen
    y, idx, sm = torch_npu.npu_moe_gating_top_k_softmax_v2(x.npu(), k=3, renorm=1, output_softmax=True)
    ref = x.topk(3, -1)
    _close(y, torch.softmax(ref.values, -1), rtol=1e-5, atol=1e-6)
    assert torch.equal(idx.cpu().long(), ref.indices) and sm.numel() == 0


def test_moe_gating_top_k_grouped_sigmoid():
    n, experts, groups = 5, 16, 4
    x, bias = torch.randn(n, experts), torch.randn(experts) * 0.1
    y, idx, norm = torch_npu.npu_moe_gating_top_k(x.npu(), 3, bias=bias.npu(), k_group=2, group_count=groups,
                                                  group_select_mode=1, norm_type=1, out_flag=True,
                                                  routed_scaling_factor=2.5)
    p = torch.sigmoid(x)
    for r in range(n):
        scores = p[r] + bias
        # best two groups by the sum of each group's two largest scores
        group_score = [sorted(scores[g * 4:(g + 1) * 4].tolist())[-2:] for g in range(groups)]
        best = sorted(range(groups), key=lambda g: -sum(group_score[g]))[:2]
        allowed = [e for e in range(experts) if e // 4 in best]
        chosen = sorted(allowed, key=lambda e: -scores[e].item())[:3]
        assert idx[r].cpu().tolist() == chosen
        w = p[r, chosen]
        _close(y[r], w / w.sum() * 2.5, rtol=1e-5, atol=1e-6)
    _close(norm, p)
    # softmax norm, no groups: the plain top k of the probabilities, unnormalised
    y, idx, norm = torch_npu.npu_moe_gating_top_k(x.npu(), 2)
    ref = torch.softmax(x, -1).topk(2, -1)
    _close(y, ref.values, rtol=1e-5, atol=1e-6)
    assert torch.equal(idx.cpu().long(), ref.indices) and norm.numel() == 0
    with pytest.raises(RuntimeError, match="group_count"):
        torch_npu.npu_moe_gating_top_k(x.npu(), 2, group_count=3)


def test_moe_init_routing_v2():
    n, k, h, experts = 7, 3, 4, 6
    x = torch.randn(n, h)
    expert_idx = torch.randint(0, experts, (n, k))
    scale = torch.rand(n)
    pairs = sorted(((expert_idx[i, j].item(), i * k + j) for i in range(n) for j in range(k)))
    # all experts, gather index, cumulative counts
    ex, row_idx, tokens, ex_scale = torch_npu.npu_moe_init_routing_v2(
        x.npu(), expert_idx.npu(), scale=scale.npu(), expert_num=experts, expert_tokens_num_flag=True)
    sources = [s for _, s in pairs]
    _close(ex, x[[s // k for s in sources]])
    _close(ex_scale, scale[[s // k for s in sources]])
    expected_row = [0] * (n * k)
    for d, s in enumerate(sources):
        expected_row[s] = d
    assert row_idx.dtype == torch.int32 and row_idx.cpu().tolist() == expected_row
    counts = [sum(1 for e, _ in pairs if e == i) for i in range(experts)]
    assert tokens.dtype == torch.int64 and tokens.cpu().tolist() == list(torch.tensor(counts).cumsum(0).tolist())
    # experts [2, 5) only, scatter index, counts, at most 5 rows
    ex, row_idx, tokens, _ = torch_npu.npu_moe_init_routing_v2(
        x.npu(), expert_idx.npu(), active_num=5, active_expert_range=[2, 5], row_idx_type=1,
        expert_tokens_num_type=1, expert_tokens_num_flag=True)
    kept = [s for e, s in pairs if 2 <= e < 5]
    _close(ex, x[[s // k for s in kept[:5]]])
    assert row_idx.cpu().tolist()[:len(kept)] == kept
    assert tokens.cpu().tolist() == counts[2:5]


def test_moe_token_permute_unpermute_roundtrip_and_grad():
    n, topk, h = 6, 2, 5
    tokens = torch.randn(n, h)
    indices = torch.randint(0, 4, (n, topk))
    order = sorted(range(n * topk), key=lambda s: (indices.view(-1)[s].item(), s))
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens.npu(), indices.npu())
    _close(permuted, tokens[[s // topk for s in order]])
    assert sorted_indices.dtype == torch.int32
    assert [order[d] for d in sorted_indices.cpu().tolist()] == list(range(n * topk))
    probs = torch.rand(n, topk)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs.npu())
    _close(out, tokens * probs.sum(1, keepdim=True), rtol=1e-5, atol=1e-5)
    # num_out_tokens drops the last sorted rows; unpermute adds nothing for them
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens.npu(), indices.npu(), num_out_tokens=8)
    assert permuted.shape == (8, h)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs.npu())
    keep = (sorted_indices.cpu().view(n, topk) < 8).float()
    _close(out, tokens * (probs * keep).sum(1, keepdim=True), rtol=1e-5, atol=1e-5)
    # gradients of the composition (autograd, no _grad op)
    t = tokens.npu().requires_grad_()
    pr = probs.npu().requires_grad_()
    p, si = torch_npu.npu_moe_token_permute(t, indices.npu())
    torch_npu.npu_moe_token_unpermute(p, si, pr).sum().backward()
    _close(t.grad, probs.sum(1, keepdim=True).expand(n, h), rtol=1e-5, atol=1e-5)
    _close(pr.grad, tokens.sum(1, keepdim=True).expand(n, topk), rtol=1e-5, atol=1e-5)


def test_moe_re_routing_groups_by_expert_then_rank():
    counts = torch.tensor([[1, 2, 0], [3, 1, 2]])
    tokens = torch.randn(9, 4)
    scales = torch.rand(9)
    out, out_scales, idx, per_expert = torch_npu.npu_moe_re_routing(tokens.npu(), counts.npu(),
                                                                     per_token_scales=scales.npu())
    # source blocks (rank, expert) in rank-major order; destination expert-major
    starts, pos = {}, 0
    for r in range(2):
        for e in range(3):
            starts[r, e] = pos
            pos += counts[r, e].item()
    expected = [starts[r, e] + i for e in range(3) for r in range(2) for i in range(counts[r, e].item())]
    assert idx.dtype == torch.int32 and idx.cpu().tolist() == expected
    _close(out, tokens[expected])
    _close(out_scales, scales[expected])
    assert per_expert.cpu().tolist() == [4, 3, 2]
    with pytest.raises(RuntimeError, match="sums to"):
        torch_npu.npu_moe_re_routing(tokens[:5].npu(), counts.npu())


# ---- LLM losses, norms, quantized activations ---------------------------------------------------

def test_cross_entropy_loss():
    x = torch.randn(6, 10)
    t = torch.randint(0, 10, (6,))
    t[3] = -100
    w = torch.rand(10)
    for reduction in ("mean", "sum", "none"):
        loss, log_prob, zloss, lse = torch_npu.npu_cross_entropy_loss(x.npu(), t.npu(), w.npu(), reduction=reduction,
                                                                      label_smoothing=0.2)
        ref = F.cross_entropy(x, t, w, reduction=reduction, label_smoothing=0.2)
        _close(loss, ref.reshape(1) if reduction != "none" else ref, rtol=1e-5, atol=1e-5)
        _close(log_prob, x - x.logsumexp(-1, keepdim=True), rtol=1e-5, atol=1e-5)
        assert zloss.numel() == 0
    loss, _, zloss, lse = torch_npu.npu_cross_entropy_loss(x.npu(), t.npu(), return_zloss=True,
                                                           lse_square_scale_for_zloss=1e-2)
    keep = t != -100
    _close(lse, x.logsumexp(-1), rtol=1e-5, atol=1e-5)
    _close(zloss, (1e-2 * x.logsumexp(-1)[keep] ** 2).mean(), rtol=1e-5, atol=1e-6)


def test_group_norm_silu_and_add_rms_norm_cast():
    x, g, b = torch.randn(2, 6, 3, 3), torch.randn(6), torch.randn(6)
    y, mean, rstd = torch_npu.npu_group_norm_silu(x.npu(), g.npu(), b.npu(), 3, 1e-4)
    xg = x.view(2, 3, -1)
    _close(mean, xg.mean(-1), rtol=1e-5, atol=1e-5)
    _close(rstd, 1 / torch.sqrt(xg.var(-1, unbiased=False) + 1e-4), rtol=1e-4, atol=1e-5)
    _close(y, F.silu(F.group_norm(x, 3, g, b, 1e-4)), rtol=1e-4, atol=1e-5)
    x1, x2, gamma = torch.randn(4, 8).half(), torch.randn(4, 8).half(), torch.randn(8).half()
    y32, y16, rstd, s = torch_npu.npu_add_rms_norm_cast(x1.npu(), x2.npu(), gamma.npu())
    xs = (x1 + x2).float()
    ref_rstd = 1 / torch.sqrt((xs * xs).mean(-1, keepdim=True) + 1e-6)
    assert y32.dtype == torch.float32 and y16.dtype == torch.float16
    _close(rstd, ref_rstd, rtol=1e-4, atol=1e-4)
    _close(y32, xs * ref_rstd * gamma.float(), rtol=1e-3, atol=1e-3)
    _close(y16, (xs * ref_rstd * gamma.float()).half(), rtol=1e-3, atol=1e-3)
    _close(s, x1 + x2)


def _rms(x, gamma, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma


def test_rms_norm_quant_and_add_rms_norm_quant():
    x, gamma, beta = torch.randn(4, 16), torch.rand(16) + 0.5, torch.randn(16) * 0.1
    scale, offset = torch.tensor([0.02]), torch.tensor([3.0])
    out = torch_npu.npu_rms_norm_quant(x.npu(), gamma.npu(), beta.npu(), scale.npu(), offset.npu())
    ref = ((_rms(x, gamma) + beta) / 0.02 + 3).round().clamp(-128, 127)
    assert out.dtype == torch.int8 and (out.cpu().int() - ref.int()).abs().max() <= 1
    x2 = torch.randn(4, 16)
    s1, z1, s2 = torch.rand(16) * 0.02 + 0.01, torch.randint(-3, 3, (16,)).float(), torch.rand(16) + 1
    y1, y2, xs = torch_npu.npu_add_rms_norm_quant(x.npu(), x2.npu(), gamma.npu(), s1.npu(), z1.npu(),
                                                  scales2=s2.npu())
    y = _rms(x + x2, gamma)
    assert (y1.cpu().int() - (y / s1 + z1).round().clamp(-128, 127).int()).abs().max() <= 1
    assert (y2.cpu().int() - (y / s2).round().int()).abs().max() <= 1
    _close(xs, x + x2)
    y1, y2, _ = torch_npu.npu_add_rms_norm_quant(x.npu(), x2.npu(), gamma.npu(), s2.npu(), None, div_mode=False)
    assert (y1.cpu().int() - (y * s2).round().clamp(-128, 127).int()).abs().max() <= 1
    # without scales2, y2 is y quantized with scale 1 (x's shape, as torch_npu allocates it)
    assert y2.shape == y1.shape and (y2.cpu().int() - y.round().clamp(-128, 127).int()).abs().max() <= 1


def test_swiglu_quant():
    x = torch.randn(6, 8)
    a, b = x[:, :4], x[:, 4:]
    # static, no groups, activate on the right half
    s, o = torch.rand(4) + 0.5, torch.randn(4)
    y, scale = torch_npu.npu_swiglu_quant(x.npu() * 20, smooth_scales=s.npu(), offsets=o.npu())
    ref = (20 * a * F.silu(20 * b) * s + o).round().clamp(-128, 127)
    assert (y.cpu().int() - ref.int()).abs().max() <= 1 and scale.numel() == 0
    # dynamic with two row groups given by their ends (cumsum)
    s = torch.rand(2, 4) + 0.5
    y, scale = torch_npu.npu_swiglu_quant(x.npu(), smooth_scales=s.npu(), group_index=torch.tensor([2, 6]).npu(),
                                          activate_left=True, quant_mode=1)
    act = F.silu(a) * b * torch.cat([s[0].expand(2, 4), s[1].expand(4, 4)])
    ref_scale = 127 / act.abs().amax(-1)
    _close(scale, ref_scale, rtol=1e-5, atol=1e-4)
    assert (y.cpu().int() - (act * ref_scale[:, None]).round().int()).abs().max() <= 1


# ---- detection helpers -----------------------------------------------------------------------

def test_grid_assign_positive():
    n, k = 6, 3
    assigned = torch.tensor([-1., 0., -1., 0., -1., 0.])
    overlaps = torch.rand(k, n)
    flags = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.uint8)
    max_overlaps, argmax = overlaps.max(0)
    gt_max, gt_argmax = overlaps.max(1)
    gt_max[1] = 0.0  # below min_pos_iou: gt 1 claims nothing
    for assign_all in (True, False):
        out = torch_npu.npu_grid_assign_positive(
            assigned.npu(), overlaps.npu(), flags.npu(), max_overlaps.npu(), argmax.int().npu(), gt_max.npu(),
            gt_argmax.int().npu(), k, 0.5, 0.1, assign_all)
        # mmdetection's GridAssigner, step by step
        ref = assigned.clone()
        pos = (max_overlaps > 0.5) & flags.bool()
        ref[pos] = argmax[pos].float() + 1
        for i in range(k):
            if gt_max[i] > 0.1:
                if assign_all:
                    ref[(overlaps[i] == gt_max[i]) & flags.bool()] = i + 1
                elif flags[gt_argmax[i]]:
                    ref[gt_argmax[i]] = i + 1
        _close(out, ref)


def test_yolo_boxes_encode():
    anchors = torch.tensor([[0., 0., 4., 2.], [2., 2., 6., 8.]])
    gt = torch.tensor([[1., 1., 3., 2.], [2., 2., 2., 10.]])
    stride = torch.tensor([4, 2], dtype=torch.int32)
    out = torch_npu.npu_yolo_boxes_encode(anchors.npu(), gt.npu(), stride.npu())
    # centres (2, 1) vs (2, 1.5); (4, 5) vs (2, 6); sizes 4x2 vs 2x1; 4x6 vs 0x8
    expected = torch.tensor([[0.5, 0.5 + 0.5 / 4, math.log(0.5), math.log(0.5)],
                             [0.5 - 2 / 2, 0.5 + 1 / 2, math.log(1e-6), math.log(8 / 6)]])
    expected[1, 0] = 1e-6  # centre offsets clamp to [eps, 1 - eps]
    expected[1, 1] = 1 - 1e-6
    _close(out, expected, rtol=1e-5, atol=1e-6)


def test_moe_init_routing_v2_quant_modes():
    n, k, h = 5, 2, 6
    x = torch.randn(n, h)
    expert_idx = torch.randint(0, 4, (n, k))
    order = sorted(range(n * k), key=lambda s: (expert_idx.view(-1)[s].item(), s))
    rows = x[[s // k for s in order]]
    smooth = torch.rand(4, h) + 0.5
    q, _, _, row_scale = torch_npu.npu_moe_init_routing_v2(x.npu(), expert_idx.npu(), scale=smooth.npu(),
                                                           expert_num=4, quant_mode=1)
    smoothed = rows * smooth[[expert_idx.view(-1)[s].item() for s in order]]
    ref_scale = smoothed.abs().amax(-1) / 127
    _close(row_scale, ref_scale, rtol=1e-5, atol=1e-7)
    assert q.dtype == torch.int8 and (q.cpu().int() - (smoothed / ref_scale[:, None]).round().int()).abs().max() <= 1
    q, *_ = torch_npu.npu_moe_init_routing_v2(x.npu(), expert_idx.npu(), scale=torch.tensor([20.]).npu(),
                                             offset=torch.tensor([1.]).npu(), expert_num=4, quant_mode=0)
    assert (q.cpu().int() - (rows * 20 + 1).round().clamp(-128, 127).int()).abs().max() <= 1
    # dynamic mode, an all-zero token: zeros with scale 0 (not 0/0)
    x[2] = 0
    q, _, _, row_scale = torch_npu.npu_moe_init_routing_v2(x.npu(), expert_idx.npu(), expert_num=4, quant_mode=1)
    zero_rows = [d for d, s in enumerate(order) if s // k == 2]
    assert (q.cpu()[zero_rows] == 0).all() and (row_scale.cpu()[zero_rows] == 0).all()


def _rope_reference(x, cos, sin, head_size, neox):
    """Rotary embedding written out per pair: neox pairs (i, i + d/2), GPT-J pairs (2i, 2i + 1)."""
    t = x.view(x.size(0), -1, head_size).clone()
    half = cos.size(-1)
    for i in range(half):
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
        xa, xb = t[..., a].clone(), t[..., b].clone()
        c, s = cos[:, i].unsqueeze(-1), sin[:, i].unsqueeze(-1)
        t[..., a], t[..., b] = xa * c - xb * s, xb * c + xa * s
    return t.view(x.shape)


def test_mrope():
    tokens, heads, head_size, rotary_dim = 5, 2, 16, 6
    cache = torch.randn(16, rotary_dim)
    q, k = torch.randn(tokens, heads * head_size), torch.randn(tokens, heads * head_size)
    # plain RoPE on 1-D positions, both pairings; channels past rotary_dim pass through
    pos = torch.tensor([3, 0, 7, 7, 15])
    for mode, neox in (("half", True), ("interleave", False)):
        qo, ko = torch_npu.npu_mrope(pos.npu(), q.npu(), k.npu(), cache.npu(), head_size, rotary_mode=mode)
        cos, sin = cache[pos, :3], cache[pos, 3:]
        _close(qo, _rope_reference(q, cos, sin, head_size, neox), rtol=1e-5, atol=1e-5)
        _close(ko, _rope_reference(k, cos, sin, head_size, neox), rtol=1e-5, atol=1e-5)
    # MRoPE: (t, h, w) positions over 6 cos/sin channels; 'default': sections [2, 2, 2] are
    # channels 0-1 from row 0, 2-3 from row 1, 4-5 from row 2; 'interleave': channel c from row c % 3
    cache = torch.randn(16, 12)
    pos3 = torch.randint(0, 16, (3, tokens))
    for cache_mode, rows in (("default", [0, 0, 1, 1, 2, 2]), ("interleave", [0, 1, 2, 0, 1, 2])):
        qo, ko = torch_npu.npu_mrope(pos3.npu(), q.npu(), k.npu(), cache.npu(), head_size,
                                     mrope_section=[2, 2, 2], cache_mode=cache_mode)
        cos = torch.stack([cache[pos3[rows[c]], c] for c in range(6)], -1)
        sin = torch.stack([cache[pos3[rows[c]], 6 + c] for c in range(6)], -1)
        _close(qo, _rope_reference(q, cos, sin, head_size, True), rtol=1e-5, atol=1e-5)
        _close(ko, _rope_reference(k, cos, sin, head_size, True), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="mrope_section"):
        torch_npu.npu_mrope(pos3.npu(), q.npu(), k.npu(), cache.npu(), head_size)


def test_scatter_pa_kv_cache_nd_and_nz():
    tokens, heads, d, blocks, block_size = 5, 2, 16, 3, 4
    key, value = torch.randn(tokens, heads, d), torch.randn(tokens, heads, d)
    slots = torch.tensor([0, 5, -1, 11, 6], dtype=torch.int32)
    kc, vc = torch.randn(blocks, block_size, heads, d), torch.zeros(blocks, block_size, heads, d)
    kn, vn = kc.npu(), vc.npu()
    assert torch_npu.npu_scatter_pa_kv_cache(key.npu(), value.npu(), kn, vn, slots.npu(), cache_mode="Norm") is None
    ref_k, ref_v = kc.clone(), vc.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            ref_k[slot // block_size, slot % block_size] = key[t]
            ref_v[slot // block_size, slot % block_size] = value[t]
    _close(kn, ref_k)
    _close(vn, ref_v)
    # PA_NZ: [blocks, heads * d / 16, block_size, 16], the token's values in 16-wide rows
    kc = torch.randn(blocks, heads * d // 16, block_size, 16)
    kc_npu = kc.npu()
    out_k, out_v = torch_npu.npu_scatter_pa_kv_cache_functional(key.npu(), value.npu(), kc_npu,
                                                                torch.zeros_like(kc).npu(), slots.npu())
    ref_k = kc.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            for row in range(heads * d // 16):
                ref_k[slot // block_size, row, slot % block_size] = key[t].reshape(-1)[row * 16:(row + 1) * 16]
    _close(out_k, ref_k)
    assert torch.equal(kc_npu.cpu(), kc)  # the functional form leaves its inputs alone
    with pytest.raises(RuntimeError, match="cache_mode"):
        torch_npu.npu_scatter_pa_kv_cache(key.npu(), value.npu(), kn, vn, slots.npu(), cache_mode="PA")


def test_quant_scatter():
    var = torch.randint(-5, 5, (2, 6, 8), dtype=torch.int8)
    updates = torch.randn(2, 2, 8) * 3
    scales = torch.rand(8) * 0.05 + 0.01
    zero = torch.randint(-2, 2, (8,)).float()
    indices = torch.tensor([1, 3], dtype=torch.int32)
    out = torch_npu.npu_quant_scatter(var.npu(), indices.npu(), updates.npu(), scales.npu(), zero.npu())
    ref = var.clone()
    for b in range(2):
        ref[b, indices[b]:indices[b] + 2] = (updates[b] / scales + zero).round().clamp(-128, 127).to(torch.int8)
    assert (out.cpu().int() - ref.int()).abs().max() <= 1
    v = var.npu()
    assert torch_npu.npu_quant_scatter_(v, indices.npu(), updates.npu(), scales.npu(), zero.npu()) is v
    assert torch.equal(v.cpu(), out.cpu())


def test_dequant_swiglu_quant():
    rows, h = 6, 4
    x = torch.randint(-20, 20, (rows, 2 * h), dtype=torch.int32)
    ws = torch.rand(2, 2 * h) * 0.1
    act = torch.rand(rows, 1) + 0.5
    qs = torch.rand(2, h) + 0.5
    groups = torch.tensor([2, 3])  # sizes: rows 0-1, 2-4; row 5 is past the groups
    y, scale = torch_npu.npu_dequant_swiglu_quant(x.npu(), weight_scale=ws.npu(), activation_scale=act.npu(),
                                                  quant_scale=qs.npu(), group_index=groups.npu(),
                                                  activate_left=True, quant_mode=1)
    g = torch.tensor([0, 0, 1, 1, 1])
    deq = x[:5].float() * ws[g] * act[:5]
    sw = F.silu(deq[:, :h]) * deq[:, h:] * qs[g]
    ref_scale = sw.abs().amax(-1) / 127
    _close(scale[:5], ref_scale, rtol=1e-5, atol=1e-7)
    assert scale[5].item() == 0 and torch.equal(y[5].cpu(), torch.zeros(h, dtype=torch.int8))
    assert (y[:5].cpu().int() - (sw / ref_scale[:, None]).round().int()).abs().max() <= 1
    # float input, clamped-GLU of even/odd channels, static quantization
    xf = torch.randn(3, 2 * h) * 4
    y, scale = torch_npu.npu_dequant_swiglu_quant(xf.npu(), quant_scale=torch.tensor([0.05]).npu(), swiglu_mode=1,
                                                  clamp_limit=3.0)
    a, b = xf[:, ::2].clamp(max=3.0), xf[:, 1::2].clamp(-3.0, 3.0)
    ref = (a * torch.sigmoid(1.702 * a) * (b + 1.0) / 0.05).round().clamp(-128, 127)
    assert (y.cpu().int() - ref.int()).abs().max() <= 1 and torch.equal(scale.cpu(), torch.zeros(3))


def test_grouped_matmul_finalize_routing():
    m, k, n, experts, top_k, batch = 6, 16, 8, 2, 2, 3
    x = torch.randint(-100, 100, (m, k), dtype=torch.int8)
    w = torch.randint(-100, 100, (experts, k, n), dtype=torch.int8)
    scale, per_token = torch.rand(experts, n), torch.rand(m)
    logit = torch.rand(m)
    row_index = torch.tensor([2, 0, 1, 0, 2, 1])  # each of the 3 tokens twice
    shared = torch.randn(1, n).bfloat16()
    out = torch_npu.npu_grouped_matmul_finalize_routing(
        x.npu(), w.npu(), torch.tensor([4, 2]).npu(), scale=scale.npu(), pertoken_scale=per_token.npu(),
        shared_input=shared.npu(), logit=logit.npu(), row_index=row_index.npu(), shared_input_weight=0.5,
        shared_input_offset=1, output_bs=batch)
    assert out.dtype == torch.float32 and out.shape == (batch, n)
    ref = torch.zeros(batch, n, dtype=torch.float64)
    for r in range(m):
        e = 0 if r < 4 else 1
        acc = (x[r].long() @ w[e].long()).double()  # exact integer accumulation
        ref[row_index[r]] += acc * scale[e].double() * per_token[r].double() * logit[r].double()
    ref[1] += 0.5 * shared[0].double()
    _close(out, ref.float(), rtol=1e-5, atol=1e-3)
    # cumulative group list, no routing: plain grouped matmul
    xf, wf = torch.randn(m, k), torch.randn(experts, k, n)
    out = torch_npu.npu_grouped_matmul_finalize_routing(xf.npu(), wf.npu(), torch.tensor([3, 6]).npu(),
                                                        group_list_type=0)
    _close(out, torch.cat([xf[:3] @ wf[0], xf[3:] @ wf[1]]), rtol=1e-4, atol=1e-4)


def test_rotated_box_encode_decode():
    def boxes(b, n):
        x1, y1 = torch.rand(b, 1, n) * 50, torch.rand(b, 1, n) * 50
        w, h = torch.rand(b, 1, n) * 30 + 5, torch.rand(b, 1, n) * 30 + 5
        return torch.cat([x1, y1, x1 + w, y1 + h, torch.rand(b, 1, n) * 170 - 85], 1)
    anchors, gt = boxes(2, 6), boxes(2, 6)
    weight = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])
    deltas = torch_npu.npu_rotated_box_encode(anchors.npu(), gt.npu(), weight.npu())
    a, g = anchors, gt
    aw, ah, gw, gh = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1], g[:, 2] - g[:, 0], g[:, 3] - g[:, 1]
    expected = torch.stack([((g[:, 0] + g[:, 2]) - (a[:, 0] + a[:, 2])) / 2 / aw,
                            ((g[:, 1] + g[:, 3]) - (a[:, 1] + a[:, 3])) / 2 / ah,
                            torch.log(gw / aw), torch.log(gh / ah),
                            torch.tan(g[:, 4] * math.pi / 180) - torch.tan(a[:, 4] * math.pi / 180)], 1)
    _close(deltas, expected * weight.view(1, 5, 1), rtol=1e-4, atol=1e-4)
    # decoding the deltas gives the gt boxes back (angles within (-90, 90))
    _close(torch_npu.npu_rotated_box_decode(anchors.npu(), deltas, weight.npu()), gt, rtol=1e-4, atol=1e-3)


def test_multi_head_attention_matches_fairseq_attention():
    torch.manual_seed(0)
    bsz, tgt, src, heads, dim = 2, 16, 32, 16, 16
    embed = heads * dim
    q, k, v = torch.randn(bsz * tgt, embed), torch.randn(bsz * src, embed), torch.randn(bsz * src, embed)
    weights = [torch.randn(embed, embed) * embed ** -0.5 for _ in range(4)]
    biases = [torch.randn(embed) * 0.1 for _ in range(4)]
    mask = torch.zeros(bsz, 1, 1, src)
    mask[1, ..., -5:] = -10000.0
    ref = torch.nn.MultiheadAttention(embed, heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat(weights[:3]))
        ref.in_proj_bias.copy_(torch.cat(biases[:3]))
        ref.out_proj.weight.copy_(weights[3])
        ref.out_proj.bias.copy_(biases[3])
    padding = mask.view(bsz, src) != 0
    expected, expected_probs = ref(q.view(bsz, tgt, embed), k.view(bsz, src, embed), v.view(bsz, src, embed),
                                   key_padding_mask=padding, average_attn_weights=False)
    npu = [t.npu() for t in (q, k, v, *weights[:3], mask, weights[3], *biases)]
    out = torch_npu.npu_multi_head_attention(*npu, None, heads, dim, src, tgt, 0.0, True)
    y, drop_mask, q_res, k_res, v_res, scores, attn, context = out
    _close(y, expected.detach().reshape(bsz * tgt, embed), rtol=1e-4, atol=1e-4)
    _close(scores, expected_probs.detach(), rtol=1e-4, atol=1e-5)
    assert scores.dtype == torch.float32 and torch.equal(attn.cpu(), scores.cpu())
    assert drop_mask.dtype == torch.uint8 and drop_mask.shape == (bsz * heads * tgt * src // 8,)
    assert q_res.shape == (bsz, heads, tgt, dim) and k_res.shape == v_res.shape == (bsz, heads, src, dim)
    _close(q_res, (q @ weights[0].t() + biases[0]).view(bsz, tgt, heads, dim).transpose(1, 2) * dim ** -0.5,
           rtol=1e-4, atol=1e-5)
    assert context.shape == (bsz * tgt, embed)
    # dropout with a given keep mask (npu_dropout_gen_mask's bits): dropped scores are 0, kept ones scaled
    keep_mask = torch_npu.npu_dropout_gen_mask([bsz, heads, tgt, src], 0.5, device="npu")
    out = torch_npu.npu_multi_head_attention(*npu, keep_mask, heads, dim, src, tgt, 0.5, True)
    keep = keep_mask.cpu()[:, None].bitwise_and(torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)).ne(0)
    keep = keep.reshape(-1)[:scores.numel()].view(scores.shape)
    _close(out[6], scores.cpu() * keep * 2, rtol=1e-5, atol=1e-6)
    # float16 activations with float32 weights (contrib's MultiheadAttention after set_fussion()), and autograd
    half = [t.half() if i < 3 else t for i, t in enumerate(npu)]
    y16 = torch_npu.npu_multi_head_attention(*half, None, heads, dim, src, tgt, 0.0, False)
    assert y16[0].dtype == torch.float16 and y16[5].dtype == torch.float16
    _close(y16[0].float(), expected.detach().reshape(bsz * tgt, embed), rtol=2e-2, atol=2e-2)
    wq = npu[3].clone().requires_grad_()
    y = torch_npu.npu_multi_head_attention(npu[0], npu[1], npu[2], wq, *npu[4:], None, heads, dim, src, tgt,
                                           0.0, True)[0]
    y.sum().backward()
    assert wq.grad is not None and wq.grad.shape == (embed, embed) and wq.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="should align to 16"):
        torch_npu.npu_multi_head_attention(*npu, None, 4, 64, src, tgt, 0.0, True)
    with pytest.raises(RuntimeError, match="query must be"):
        torch_npu.npu_multi_head_attention(*npu, None, heads, dim, src, 48, 0.0, True)


def _corners(box):
    """Corners of a rotated box (x, y, w, h, degrees), counter-clockwise."""
    x, y, w, h, t = box
    c, s = math.cos(math.radians(t)), math.sin(math.radians(t))
    return [(x + c * px - s * py, y + s * px + c * py)
            for px, py in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))]


def _random_boxes(gen, b, n):
    """[b, n, 5] rotated boxes: centres in [0, 10), sides in [1, 6), angles in [-180, 180)."""
    return torch.cat([torch.rand(b, n, 2, generator=gen) * 10, torch.rand(b, n, 2, generator=gen) * 5 + 1,
                      torch.rand(b, n, 1, generator=gen) * 360 - 180], -1)


def _clip_area(box_a, box_b):
    """Intersection area of two rotated boxes (x, y, w, h, degrees) by Sutherland-Hodgman clipping."""
    poly, clip = _corners(box_a), _corners(box_b)
    for i in range(4):
        (ax, ay), (bx, by) = clip[i], clip[(i + 1) % 4]
        side = [(bx - ax) * (py - ay) - (by - ay) * (px - ax) for px, py in poly]
        kept = []
        for j, p in enumerate(poly):
            q, sp, sq = poly[(j + 1) % len(poly)], side[j], side[(j + 1) % len(poly)]
            if sp >= 0:
                kept.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                kept.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        poly = kept
        if not poly:
            return 0.0
    return 0.5 * abs(sum(poly[i][0] * poly[i - 1][1] - poly[i - 1][0] * poly[i][1] for i in range(len(poly))))


def test_rotated_overlaps():
    gen = torch.Generator().manual_seed(0)
    a, q = _random_boxes(gen, 2, 6), _random_boxes(gen, 2, 4)
    out = torch_npu.npu_rotated_overlaps(a.npu(), q.npu())
    assert out.shape == (2, 6, 4) and out.dtype == torch.float32
    expected = torch.tensor([[[_clip_area(x.tolist(), y.tolist()) for y in q[i]] for x in a[i]] for i in range(2)])
    assert expected.count_nonzero() > 4  # the sample has overlapping and disjoint pairs
    _close(out, expected, rtol=1e-4, atol=1e-4)
    # a box overlaps itself fully; a unit square and the same square turned by 45 degrees share an octagon
    square = torch.tensor([[[0., 0., 1., 1., 0.], [0., 0., 1., 1., 45.], [5., 5., 1., 1., 0.]]])
    _close(torch_npu.npu_rotated_overlaps(square.npu(), square.npu()),
           torch.tensor([[[1., 2 * (math.sqrt(2) - 1), 0.], [2 * (math.sqrt(2) - 1), 1., 0.], [0., 0., 1.]]]),
           rtol=1e-5, atol=1e-5)
    # trans: (x1, y1, x2, y2, angle); float16 in, float16 out
    corner_form = torch.cat([a[..., :2] - a[..., 2:4] / 2, a[..., :2] + a[..., 2:4] / 2, a[..., 4:]], -1)
    q_corner = torch.cat([q[..., :2] - q[..., 2:4] / 2, q[..., :2] + q[..., 2:4] / 2, q[..., 4:]], -1)
    _close(torch_npu.npu_rotated_overlaps(corner_form.npu(), q_corner.npu(), trans=True), expected,
           rtol=1e-4, atol=1e-4)
    half = torch_npu.npu_rotated_overlaps(a.half().npu(), q.half().npu())
    assert half.dtype == torch.float16
    _close(half.float(), expected, rtol=1e-2, atol=5e-2)
    with pytest.raises(RuntimeError, match="equal to 3"):
        torch_npu.npu_rotated_overlaps(a[0].npu(), q[0].npu())
    with pytest.raises(RuntimeError, match="query_boxes"):
        torch_npu.npu_rotated_overlaps(a.npu(), q[..., :4].npu())


def _threshold_area(box_a, box_b, v, e):
    """Intersection area by CANN's RotatedIou rules, one box pair at a time in plain Python: corners
    of each box inside the other (projections on two sides within [v, |side|^2 - v]), sides
    crossing (products of cross products < e), ordered by angle around their mean."""
    ca, cb = _corners(box_a), _corners(box_b)

    def inside(p, box):
        (ax, ay), (bx, by), (dx, dy) = box[0], box[1], box[3]
        along_ab = (p[0] - ax) * (bx - ax) + (p[1] - ay) * (by - ay)
        along_ad = (p[0] - ax) * (dx - ax) + (p[1] - ay) * (dy - ay)
        return (v <= along_ab <= (bx - ax) ** 2 + (by - ay) ** 2 - v
                and v <= along_ad <= (dx - ax) ** 2 + (dy - ay) ** 2 - v)

    def cross(o, p, q):
        return (p[0] - o[0]) * (q[1] - o[1]) - (p[1] - o[1]) * (q[0] - o[0])

    points = [p for p in ca if inside(p, cb)] + [p for p in cb if inside(p, ca)]
    for i in range(4):
        a, b = ca[i], ca[(i + 1) % 4]
        for j in range(4):
            c, d = cb[j], cb[(j + 1) % 4]
            if cross(a, c, d) * cross(b, c, d) < e and cross(c, a, b) * cross(d, a, b) < e:
                denom = (b[0] - a[0]) * (d[1] - c[1]) - (b[1] - a[1]) * (d[0] - c[0])
                if denom != 0:
                    t = ((c[0] - a[0]) * (d[1] - c[1]) - (c[1] - a[1]) * (d[0] - c[0])) / denom
                    points.append((a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])))
    if len(points) < 3:
        return 0.0
    mx, my = sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points)
    points.sort(key=lambda p: math.atan2(p[1] - my, p[0] - mx))
    return 0.5 * abs(sum(points[i][0] * points[i - 1][1] - points[i - 1][0] * points[i][1]
                         for i in range(len(points))))


def _ratio(inter, denom):
    return inter / (denom + 1e-6) if denom > 0 else 0.0


def test_rotated_iou():
    gen = torch.Generator().manual_seed(1)
    a, q = _random_boxes(gen, 2, 6), _random_boxes(gen, 2, 4)
    area = lambda box: box[2] * box[3]  # noqa: E731
    inter = [[[_clip_area(x.tolist(), y.tolist()) for y in q[i]] for x in a[i]] for i in range(2)]
    iou = torch.tensor([[[_ratio(inter[i][n][k], area(a[i, n]) + area(q[i, k]) - inter[i][n][k])
                          for k in range(4)] for n in range(6)] for i in range(2)])
    iof = torch.tensor([[[_ratio(inter[i][n][k], area(a[i, n])) for k in range(4)] for n in range(6)]
                        for i in range(2)])
    assert (iou > 0.01).sum() > 4 and (iou == 0).sum() > 4  # overlapping and disjoint pairs
    out = torch_npu.npu_rotated_iou(a.npu(), q.npu())
    assert out.shape == (2, 6, 4) and out.dtype == torch.float32
    _close(out, iou, rtol=1e-4, atol=1e-5)
    _close(torch_npu.npu_rotated_iou(a.npu(), q.npu(), mode=1), iof, rtol=1e-4, atol=1e-5)
    # one-to-one: box n against query box n, [B, N]
    pairs = torch_npu.npu_rotated_iou(a[:, :4].npu(), q.npu(), is_cross=False)
    assert pairs.shape == (2, 4)
    _close(pairs, iou[:, :4].diagonal(dim1=1, dim2=2), rtol=1e-4, atol=1e-5)
    # trans: (x1, y1, x2, y2, angle); float16 in, float16 out
    corner_form = lambda t: torch.cat([t[..., :2] - t[..., 2:4] / 2, t[..., :2] + t[..., 2:4] / 2, t[..., 4:]], -1)  # noqa: E731
    _close(torch_npu.npu_rotated_iou(corner_form(a).npu(), corner_form(q).npu(), trans=True), iou,
           rtol=1e-4, atol=1e-4)
    half = torch_npu.npu_rotated_iou(a.half().npu(), q.half().npu())
    assert half.dtype == torch.float16
    _close(half.float(), iou, rtol=1e-2, atol=1e-2)
    # squares [0, 2]^2 and [1, 3]^2 share [1, 2]^2: IoU 1 / 7; a box against itself: 1
    sq = torch.tensor([[[1., 1., 2., 2., 0.]]]), torch.tensor([[[2., 2., 2., 2., 0.], [1., 1., 2., 2., 0.]]])
    _close(torch_npu.npu_rotated_iou(sq[0].npu(), sq[1].npu()), torch.tensor([[[1 / (7 + 1e-6), 4 / (4 + 1e-6)]]]))
    # the corners inside the other square project 2 (of |side|^2 = 4) along each side: a v_threshold above 2
    # drops them (two crossings left: no area), one up to 2 keeps them
    assert torch_npu.npu_rotated_iou(sq[0].npu(), sq[1][:, :1].npu(), v_threshold=2.5).item() == 0
    _close(torch_npu.npu_rotated_iou(sq[0].npu(), sq[1][:, :1].npu(), v_threshold=1.5),
           torch.tensor([[[1 / (7 + 1e-6)]]]))
    # thresholds against the same rules in plain Python, box pair by box pair
    for v, e in ((0.5, 0.0), (-0.5, 0.0), (0.0, 4.0), (-1.0, 25.0)):
        want = torch.tensor([[[_ratio(s := _threshold_area(x.tolist(), y.tolist(), v, e), area(x) + area(y) - s)
                               for y in q[i]] for x in a[i]] for i in range(2)])
        got = torch_npu.npu_rotated_iou(a.npu(), q.npu(), v_threshold=v, e_threshold=e)
        _close(got, want, rtol=1e-3, atol=1e-4)
    plain = torch.tensor([[[_ratio(s := _threshold_area(x.tolist(), y.tolist(), 0.0, 0.0), area(x) + area(y) - s)
                            for y in q[i]] for x in a[i]] for i in range(2)])
    _close(plain, iou, rtol=1e-4, atol=1e-5)  # the rules at 0 thresholds: the exact intersection
    assert not torch.allclose(torch_npu.npu_rotated_iou(a.npu(), q.npu(), v_threshold=0.5).cpu(), iou)
    with pytest.raises(RuntimeError, match="must be 3-D"):
        torch_npu.npu_rotated_iou(a[0].npu(), q[0].npu())
    with pytest.raises(RuntimeError, match="mode must be 0"):
        torch_npu.npu_rotated_iou(a.npu(), q.npu(), mode=2)
    with pytest.raises(RuntimeError, match="is_cross=False"):
        torch_npu.npu_rotated_iou(a.npu(), q.npu(), is_cross=False)


def test_batch_nms():
    # one batch, two classes, boxes shared by the classes (q = 1)
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.], [0., 0., 10., 9.]])
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.7], [0.6, 0.65], [0.2, 0.95]])
    out_boxes, out_scores, out_classes, num = torch_npu.npu_batch_nms(
        boxes.view(1, 4, 1, 4).npu(), scores.unsqueeze(0).npu(), 0.15, 0.5, 2, 5)
    # class 0: 0.9 box 0 keeps, box 1 (IoU 0.68) and box 3 (0.9) suppressed, box 2 kept
    # class 1: 0.95 box 3, box 1 (IoU with box 3 ~0.6) suppressed, box 2 (0.65) kept
    assert num.dtype == torch.int32 and num.tolist() == [4]
    _close(out_scores, torch.tensor([[0.95, 0.9, 0.65, 0.6, 0.0]]))
    _close(out_classes, torch.tensor([[1., 0., 1., 0., 0.]]))
    _close(out_boxes[0, :4], boxes[[3, 0, 2, 2]])
    assert torch.equal(out_boxes[0, 4].cpu(), torch.zeros(4))
    # max_total_size truncates the merged list; transpose_box takes [B, q, 4, N]
    _, out_scores, _, num = torch_npu.npu_batch_nms(boxes.t().reshape(1, 1, 4, 4).npu(), scores.unsqueeze(0).npu(),
                                                    0.15, 0.5, 2, 2, transpose_box=True)
    assert num.tolist() == [2]
    _close(out_scores, torch.tensor([[0.95, 0.9]]))


def test_kv_rmsnorm_rope_cache():
    b, s, rms, rope, length = 2, 3, 512, 64, 5
    kv = torch.randn(b, 1, s, rms + rope)
    gamma = torch.rand(rms) + 0.5
    angles = torch.rand(b, 1, s, rope // 2) * 3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    c = kv[..., :rms]
    y = c / torch.sqrt((c * c).mean(-1, keepdim=True) + 1e-5) * gamma
    # rope: the pairs (r[2i], r[2i+1]) rotated by angle i, stored as halves (evens, then odds)
    r = kv[..., rms:]
    ev, od = r[..., 0::2], r[..., 1::2]
    k = torch.cat([ev * angles.cos() - od * angles.sin(), od * angles.cos() + ev * angles.sin()], -1)
    index = torch.tensor([[4, 0, 2], [1, -1, 3]])
    k_cache, ckv_cache = torch.zeros(b, 1, length, rope), torch.zeros(b, 1, length, rms)
    kn, cn = k_cache.npu(), ckv_cache.npu()
    outs = torch_npu.npu_kv_rmsnorm_rope_cache(kv.npu(), gamma.npu(), cos.npu(), sin.npu(), index.npu(), kn, cn,
                                               is_output_kv=True)
    _close(outs[2], k, rtol=1e-4, atol=1e-4)
    _close(outs[3], y, rtol=1e-4, atol=1e-4)
    for bi in range(b):
        for si in range(s):
            if index[bi, si] >= 0:
                k_cache[bi, 0, index[bi, si]] = k[bi, 0, si]
                ckv_cache[bi, 0, index[bi, si]] = y[bi, 0, si]
    _close(kn, k_cache, rtol=1e-4, atol=1e-4)  # updated in place
    _close(cn, ckv_cache, rtol=1e-4, atol=1e-4)
    # paged caches [blocks, block_size, 1, *] with global slots
    kp, cp = torch.zeros(2, 4, 1, rope).npu(), torch.zeros(2, 4, 1, rms).npu()
    slots = torch.tensor([7, 0, 5, 2, 1, 6])
    _, _, k_out, y_out = torch_npu.npu_kv_rmsnorm_rope_cache(kv.npu(), gamma.npu(), cos.npu(), sin.npu(),
                                                             slots.npu(), kp, cp, cache_mode="PA")
    assert k_out.numel() == 0 and y_out.numel() == 0
    _close(kp.view(-1, rope)[slots], k.reshape(-1, rope), rtol=1e-4, atol=1e-4)
    _close(cp.view(-1, rms)[slots], y.reshape(-1, rms), rtol=1e-4, atol=1e-4)


def test_required_tensor_arguments_are_checked():
    # the dispatcher passes None through to a Python kernel; the check names the argument
    with pytest.raises(TypeError, match="npu_mrope: query must be a Tensor, got NoneType"):
        torch.ops.npu.npu_mrope(torch.zeros(2, dtype=torch.long).npu(), None, torch.zeros(2, 8).npu(),
                                torch.zeros(4, 8).npu(), 8)
    with pytest.raises(TypeError, match="one_: self must be a Tensor"):
        torch.ops.npu.one_(None)


def test_fast_gelu_is_an_npu_operator():
    """As torch_npu's: a cpu tensor is refused by the dispatcher naming npu::fast_gelu, and the
    gradient on npu is npu_fast_gelu's."""
    with pytest.raises(NotImplementedError, match="Could not run 'npu::fast_gelu' with arguments from the 'CPU'"):
        torch_npu.fast_gelu(torch.rand(4))
    x = torch.randn(16, dtype=torch.float64)
    xn = x.npu().requires_grad_()
    torch_npu.fast_gelu(xn).sum().backward()
    xr = x.clone().requires_grad_()
    (xr * torch.sigmoid(1.702 * xr)).sum().backward()
    _close(xn.grad, xr.grad, rtol=1e-6, atol=1e-6)


def test_contiguous_only_into_the_contiguous_format():
    # torch_npu's contiguous: channels_last / channels_last_3d copies raise ERR01007
    x = torch.randn(1, 16, 5, 5).npu()
    stride = list(x.stride())
    stride[0] = 20
    x.set_(x.untyped_storage(), 0, x.size(), stride)
    assert x.contiguous() is x and x.contiguous(memory_format=torch.preserve_format) is x
    for fmt in (torch.channels_last, torch.channels_last_3d):
        with pytest.raises(RuntimeError, match="ERR01007 OPS feature not supported"):
            x.contiguous(memory_format=fmt)
    cl = torch.randn(2, 3, 4, 5).npu().to(memory_format=torch.channels_last)
    assert cl.contiguous(memory_format=torch.channels_last) is cl
    # into the contiguous format it copies, and autograd goes through the copy
    a = torch.randn(3, 4, device="npu", requires_grad=True)
    b = a.t().contiguous()
    assert b.is_contiguous() and b.grad_fn is not None
    (b * torch.arange(12.0).view(4, 3).npu()).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), torch.arange(12.0).view(4, 3).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_convolution_results_keep_channels_last(dtype):
    # As torch_npu (and cuDNN): results in the format the input or weight suggests, also where
    # ATen's CPU kernel would give a contiguous output (Conv3d, 16 channels, 18^3).
    for dims, fmt in ((3, torch.channels_last_3d), (2, torch.channels_last)):
        size = (1, 16) + (18,) * dims
        conv = (torch.nn.Conv3d if dims == 3 else torch.nn.Conv2d)(16, 16, 3)
        x = torch.randint(-2, 2, size, dtype=dtype)
        nconv = type(conv)(16, 16, 3).to(device="npu", dtype=dtype, memory_format=fmt)
        nconv.load_state_dict(conv.state_dict())
        nx = x.npu().to(memory_format=fmt).requires_grad_()
        out = nconv(nx)
        out.backward(torch.ones_like(out))
        assert out.is_contiguous(memory_format=fmt)
        assert nx.grad.is_contiguous(memory_format=fmt)
        assert nconv.weight.grad.is_contiguous(memory_format=fmt)
        ref = conv.to(torch.float64)(x.to(torch.float64))
        torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), atol=1e-2 if dtype == torch.float16 else 1e-4,
                                   rtol=1e-3)
    plain = torch.nn.functional.conv2d(torch.randn(1, 4, 6, 6).npu(), torch.randn(2, 4, 3, 3).npu())
    assert plain.is_contiguous()


# ---- activations, norms and softmax of later op-plugin releases -----------------------------

def test_gelu_backward_and_gelu_mul():
    x, g = torch.randn(6, 8), torch.randn(6, 8)
    for mode in ("none", "tanh"):
        _close(torch.ops.npu.npu_gelu_backward(g.npu(), x.npu(), approximate=mode),
               torch.ops.aten.gelu_backward(g, x, approximate=mode))
        _close(torch_npu.npu_gelu_mul(x.npu(), approximate=mode), F.gelu(x[:, :4], approximate=mode) * x[:, 4:])
    with pytest.raises(RuntimeError, match="last dimension of input must be even"):
        torch_npu.npu_gelu_mul(torch.randn(3, 5).npu())


def test_group_norm_swish_forward_and_backward():
    x, w, b = torch.randn(2, 6, 5), torch.randn(6), torch.randn(6)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y, mean, rstd = torch.ops.aten.native_group_norm(*leaves, 2, 6, 5, 3, 1e-5)
    ref = y * torch.sigmoid(0.5 * y)
    ref.sum().backward()
    npu = [t.npu().requires_grad_() for t in (x, w, b)]
    out, m, r = torch_npu.npu_group_norm_swish(npu[0], 3, npu[1], npu[2], eps=1e-5, swish_scale=0.5)
    out.sum().backward()
    _close(out, ref.detach(), rtol=1e-5, atol=1e-5)
    _close(m, mean.detach())
    _close(r, rstd.detach())
    for a, e in zip(npu, leaves):
        _close(a.grad, e.grad, rtol=1e-4, atol=1e-5)


def test_gather_sparse_index_is_an_embedding_lookup():
    table = torch.randn(10, 3, 2)
    index = torch.tensor([[1, 9], [0, 1], [4, 4]], dtype=torch.int32)
    leaf = table.npu().requires_grad_()
    out = torch_npu.npu_gather_sparse_index(leaf, index.npu())
    assert out.shape == (3, 2, 3, 2)
    _close(out, table[index.long()])
    out.sum().backward()
    _close(leaf.grad, torch.zeros(10).index_add_(0, index.flatten().long(), torch.ones(6))[:, None, None]
           .expand(10, 3, 2))


def test_add_rms_norm_v2_in_place_and_functional():
    x1, x2, gamma = torch.randn(4, 16).half(), torch.randn(4, 16).half(), torch.randn(16).half()
    x = x1.float() + x2.float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    y = (x * rstd * gamma.float()).half()
    r, y_f, x_f = torch_npu.npu_add_rms_norm_v2_functional(x1.npu(), x2.npu(), gamma.npu())
    _close(r, rstd)
    _close(y_f, y)
    _close(x_f, x.half())
    a, b = x1.npu(), x2.npu()
    r = torch_npu.npu_add_rms_norm_v2(a, b, gamma.npu())
    assert r.shape == (4, 1) and r.dtype == torch.float32
    _close(a, y)
    _close(b, x.half())


def test_attn_softmax_in_place_and_its_backward():
    logits, grad, values = torch.randn(2, 5, 7), torch.randn(2, 5, 3), torch.randn(2, 7, 3)
    leaf = logits.clone().requires_grad_()
    p = torch.softmax(leaf, -1)
    (p @ values).backward(grad)
    t = logits.npu()
    assert torch_npu.npu_attn_softmax_(t) is t
    _close(t, p.detach(), rtol=1e-5, atol=1e-6)
    torch_npu.npu_attn_softmax_backward_(t, grad.npu(), values.npu())
    _close(t, leaf.grad, rtol=1e-4, atol=1e-5)


def test_grouped_matmul_add_accumulates_each_groups_weight_gradient():
    # op-plugin's golden: y[g] += x[rows of g]^T @ weight[rows of g], groups by cumulative row ends
    torch.manual_seed(0)
    x, w = torch.randn(10, 4).half(), torch.randn(10, 3).half()
    y = torch.randn(3, 4, 3)
    ends = torch.tensor([2, 7, 10])
    ref = y + torch.stack([x[a:b].float().t() @ w[a:b].float() for a, b in ((0, 2), (2, 7), (7, 10))])
    out = torch_npu.npu_grouped_matmul_add(y.npu(), x.npu(), w.npu(), ends.npu())
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    yn = y.reshape(12, 3).npu()
    assert torch_npu.npu_grouped_matmul_add_(yn, x.npu(), w.npu(), torch.tensor([2, 5, 3]).npu(),
                                             group_list_type=1) is yn  # sizes; in place
    torch.testing.assert_close(yn.cpu(), ref.reshape(12, 3), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="transpose_x=True"):
        torch_npu.npu_grouped_matmul_add(y.npu(), x.npu(), w.npu(), ends.npu(), transpose_x=False)
    with pytest.raises(RuntimeError, match="float32"):
        torch_npu.npu_grouped_matmul_add(y.half().npu(), x.npu(), w.npu(), ends.npu())
    compiled = torch.compile(lambda a: torch_npu.npu_grouped_matmul_add(a, x.npu(), w.npu(), ends.npu()),
                             backend="aot_eager", fullgraph=True)  # traced through its Meta kernel
    torch.testing.assert_close(compiled(y.npu()).cpu(), ref, rtol=1e-4, atol=1e-4)


def test_npu_conv2d_is_differentiable_twice_through_its_own_backward():
    # npu_conv2d is an operator of its own below autograd (DTensor shards it); its gradients,
    # through npu_conv2d_backward, and their gradients (create_graph) are a convolution's
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def conv(x, w, b):
        return torch_npu.npu_conv2d(x.npu(), w.npu(), b.npu(), [2, 1], [1, 0], [1, 1], 1).cpu()

    assert torch.autograd.gradcheck(conv, (x, w, b))
    assert torch.autograd.gradgradcheck(conv, (x, w, b))
    y = torch_npu.npu_conv2d(x.detach().npu(), w.detach().npu(), None, [1, 1], [1, 1], [1, 1], 1)
    assert y.grad_fn is None and y.shape == (2, 4, 6, 6)


@pytest.mark.parametrize("dim", [None, 0, -1])
def test_repeat_interleave_backward_sums_each_elements_copies(dim):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.repeat_interleave(x, 3, dim)
    g = torch.randn(y.shape, dtype=torch.float64)
    (expected,) = torch.autograd.grad(y, x, g)
    _close(torch.ops.npu.repeat_interleave_backward_int(g.npu(), x.detach().npu(), 3, dim), expected)
    # aten.repeat_interleave.self_int on npu is differentiated through it (as op-plugin's derivatives)
    xn = x.detach().npu().requires_grad_()
    yn = torch.repeat_interleave(xn, 3, dim)
    yn.backward(g.npu())
    _close(xn.grad, expected)
    assert torch.autograd.gradgradcheck(lambda t: torch.repeat_interleave(t.npu(), 3, dim).cpu(), (x,))
    # per-element repeats
    repeats = torch.tensor([2, 0, 1, 3]) if dim == -1 else torch.tensor([1, 0, 2])
    if dim is None:
        repeats = torch.arange(12) % 3
    y = torch.repeat_interleave(x, repeats, dim)
    g = torch.randn(y.shape, dtype=torch.float64)
    (expected,) = torch.autograd.grad(y, x, g)
    _close(torch.ops.npu.repeat_interleave_backward_tensor(g.npu(), x.detach().npu(), repeats.npu(), dim), expected)
    # float16 copies are summed in float32 and rounded once
    h = torch.full((1, 2048), 0.1, dtype=torch.float16)
    got = torch.ops.npu.repeat_interleave_backward_int(h.npu(), torch.zeros(1, 1, dtype=torch.float16).npu(), 2048, 1)
    assert got.item() == 2048 * torch.tensor(0.1, dtype=torch.float16).item() == 204.75  # float16 steps: 0.125


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_npu_cross_entropy_loss_backward_matches_autograd_of_the_reference(reduction):
    # npu_cross_entropy_loss is differentiated by npu_cross_entropy_loss_backward (weights,
    # ignore_index, label smoothing, z-loss), as op-plugin's derivatives
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    target, weight = torch.tensor([0, 4, -100, 2, 2, 1]), torch.rand(5, dtype=torch.float64)
    loss = F.cross_entropy(x, target, weight, ignore_index=-100, reduction=reduction, label_smoothing=0.2)
    kept = target != -100
    z = 0.3 * torch.logsumexp(x, -1).pow(2) * kept
    zloss = z.sum() / kept.sum() if reduction == "mean" else z.sum() if reduction == "sum" else z
    grad_loss, grad_zloss = torch.randn(loss.shape, dtype=torch.float64), torch.randn(zloss.shape, dtype=torch.float64)
    torch.autograd.backward([loss, zloss], [grad_loss, grad_zloss])
    xn = x.detach().float().npu().requires_grad_()
    out = torch_npu.npu_cross_entropy_loss(xn, target.npu(), weight.float().npu(), reduction, -100, 0.2, 0.3, True)
    assert not out[1].requires_grad and not out[3].requires_grad  # log_prob and lse are not differentiable
    torch.autograd.backward([out[0], out[2]], [grad_loss.float().npu().reshape(out[0].shape),
                                               grad_zloss.float().npu().reshape(out[2].shape)])
    _close(xn.grad, x.grad.float(), atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="reduction must be"):
        torch.ops.npu.npu_cross_entropy_loss_backward(grad_loss.float().npu(), out[1], target.npu(), reduction="avg")


def test_renorm_takes_p0_as_aclnn_and_keeps_atens_numbers_otherwise():
    # p = 0 (ATen: "non-positive-norm not supported"): slices with more non-zeros than maxnorm are
    # scaled by maxnorm / (count + 1e-7), as op-plugin's test_renorm_3_3_0_0_1
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0], [4.0, 5.0, 6.0]])
    count = torch.tensor([2.0, 1.0, 3.0])[:, None]
    expected = x * torch.where(count > 1, 1 / (count + 1e-7), torch.ones_like(count))
    _close(torch.renorm(x.npu(), 0, 0, 1), expected)
    y = x.npu()
    y.renorm_(0, 0, 1)
    _close(y, expected)
    out = torch.empty(0).npu()
    torch.renorm(x.npu(), 0, 0, 1, out=out)
    _close(out, expected)
    _close(torch.renorm(x.half().npu(), 0, 0, 1), expected.half())
    # other p: the op table's kernel (ATen's numbers exactly), differentiable as ATen's
    a = torch.randn(4, 5, 6)
    assert torch.equal(torch.renorm(a.npu(), 2.5, 1, 0.8).cpu(), torch.renorm(a, 2.5, 1, 0.8))
    a64 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: torch.renorm(t.npu(), 2, 0, 0.5).cpu(), (a64,))
    with pytest.raises(RuntimeError, match="non-positive-norm not supported"):
        torch.renorm(x.npu(), -1, 0, 1)
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.renorm(torch.ones(3).npu(), 0, 0, 1)


def test_put_takes_int32_indices():
    # aclnn's put_ takes int32 indices (op-plugin's test_put_aicore_common_shape_format_*)
    x, src = torch.zeros(4, 3), torch.arange(5.0)
    index = torch.tensor([0, 11, 5, 5, 2])
    expected = x.clone().put_(index, src, accumulate=True)
    _close(x.npu().put_(index.int().npu(), src.npu(), accumulate=True), expected)


def test_fused_linear_cross_entropy_over_a_split_vocabulary_matches_cross_entropy():
    # Megatron's vocabulary-parallel cross entropy of a linear head, two ranks' slices computed
    # here one after the other: npu_fused_linear_online_max_sum, the all-reduced statistics,
    # npu_fused_cross_entropy_loss_with_max_sum and the backward give cross entropy's loss and
    # gradients (both backward forms: softmax given, or recomputed from max and sum)
    torch.manual_seed(0)
    rows, hidden, vocab = 10, 16, 256
    x, w = torch.randn(rows, hidden).half(), torch.randn(vocab, hidden).half()
    target = torch.randint(0, vocab, (rows,))
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    grad = torch.rand(rows)
    F.cross_entropy(xr @ wr.t(), target, reduction="none").backward(grad)
    half = vocab // 2
    local = [torch_npu.npu_fused_linear_online_max_sum(x.npu(), w[r * half:(r + 1) * half].npu(), target.npu(),
                                                       r * half, (r + 1) * half - 1, return_logits=True)
             for r in range(2)]
    logits_max = torch.stack([o[0] for o in local]).amax(0)
    sum_exp = sum(o[1] * torch.exp(o[0] - logits_max) for o in local)
    inside = [(target.npu() >= r * half) & (target.npu() < (r + 1) * half) for r in range(2)]
    predicted = sum(torch.where(inside[r], o[2] + o[0] - logits_max, 0.0) for r, o in enumerate(local))
    loss, _ = torch_npu.npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp, predicted)
    expected_loss = F.cross_entropy(x.float() @ w.float().t(), target, reduction="none")
    _close(loss, expected_loss, atol=1e-3, rtol=1e-3)
    for r, o in enumerate(local):
        assert o[3].dtype == torch.uint8 and o[3].shape == ((rows + 7) // 8,) and o[5].dtype == torch.float16
        assert torch.equal(o[4].cpu(), torch.where(inside[r].cpu(), target - r * half, 0))
    for form in ("softmax", "max_sum"):
        grad_x = torch.zeros(rows, hidden)
        grad_w = []
        for r, o in enumerate(local):
            slice_w = w[r * half:(r + 1) * half].npu()
            kwargs = ({"softmax": (o[5].float() - logits_max[:, None]).exp() / sum_exp[:, None]} if form == "softmax"
                      else {"logits_max": logits_max, "sum_exp_logits": sum_exp})
            gx, gw = torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
                grad.npu(), x.npu(), slice_w, o[3], o[4], **kwargs)
            assert gx.dtype == gw.dtype == torch.float16
            grad_x += gx.float().cpu()
            grad_w.append(gw.float().cpu())
        torch.testing.assert_close(grad_x, xr.grad, atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(torch.cat(grad_w), wr.grad, atol=2e-2, rtol=1e-2)


def test_npu_random_choice_with_mask_shuffles_the_true_indices():
    x = torch.rand(6, 7) > 0.5
    true_rows = {tuple(r) for r in torch.nonzero(x).tolist()}
    y, mask = torch_npu.npu_random_choice_with_mask(x.npu(), 0)  # count 0: all of them
    assert y.dtype == torch.int32 and mask.all() and {tuple(r) for r in y.cpu().tolist()} == true_rows
    y, mask = torch_npu.npu_random_choice_with_mask(x.npu(), len(true_rows) + 3, 7, 1)
    assert mask.cpu().tolist() == [True] * len(true_rows) + [False] * 3
    assert {tuple(r) for r in y[:len(true_rows)].cpu().tolist()} == true_rows and not y[len(true_rows):].any()
    again, _ = torch_npu.npu_random_choice_with_mask(x.npu(), len(true_rows) + 3, 7, 1)
    assert torch.equal(again, y)  # the same seeds, the same shuffle
    with pytest.raises(RuntimeError, match="x must be bool"):
        torch_npu.npu_random_choice_with_mask(torch.ones(3).npu())


def test_npu_sign_bits_unpack_refuses_a_bad_dtype_code_by_name():
    # its dtype is an `int dtype` argument: torch's boxing of a Python kernel read a ScalarType
    # argument's code 64 out of bounds (a segfault in the bad-argument suite, depending on memory)
    packed = torch_npu.npu_sign_bits_pack(torch.randn(16).npu(), 2)
    assert torch_npu.npu_sign_bits_unpack(packed, 2, torch.float16).dtype == torch.float16
    with pytest.raises(TypeError, match="npu_sign_bits_unpack: dtype must be a torch.dtype, got 64"):
        torch.ops.npu.npu_sign_bits_unpack.default(packed, 2, 64)
