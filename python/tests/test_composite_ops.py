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
