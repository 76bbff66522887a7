"""torch_npu.contrib.function and torch_npu.contrib.module against plain-torch references
written here; the nn / nn.functional additions torch_npu makes."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_npu
import torch_npu.contrib as contrib
from torch_npu.contrib import function as cf
from torch_npu.contrib import module as cm


@pytest.fixture(autouse=True)
def _no_deprecation_noise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def boxes(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 50
    return torch.cat([xy, xy + torch.rand(n, 2, generator=g) * 30 + 1], 1)


def pair_iou(a, b):
    iw = (torch.min(a[:, None, 2], b[None, :, 2]) - torch.max(a[:, None, 0], b[None, :, 0])).clamp(min=0)
    ih = (torch.min(a[:, None, 3], b[None, :, 3]) - torch.max(a[:, None, 1], b[None, :, 1])).clamp(min=0)
    inter = iw * ih
    area = lambda t: (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1])
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def test_public_names():
    for name in ["npu_iou", "npu_ptiou", "npu_giou", "npu_diou", "npu_ciou", "npu_multiclass_nms",
                 "npu_batched_multiclass_nms", "fuse_add_softmax_dropout", "roll", "matmul_transpose",
                 "dropout_with_byte_mask", "npu_bbox_coder_encode_yolo", "npu_bbox_coder_encode_xyxy2xywh",
                 "npu_bbox_coder_decode_xywh2xyxy"]:
        assert callable(getattr(cf, name))
    for name in ["ChannelShuffle", "Prefetcher", "LabelSmoothingCrossEntropy", "ROIAlign", "ModulatedDeformConv",
                 "DCNv2", "Mish", "SiLU", "Swish", "NpuFairseqDropout", "NpuCachedDropout", "NpuDropPath", "Focus",
                 "FastBatchNorm1d", "FastBatchNorm2d", "FastBatchNorm3d", "DropoutWithByteMask",
                 "MultiheadAttention"]:
        assert isinstance(getattr(cm, name), type)
    assert contrib.DCNv2 is contrib.ModulatedDeformConv
    # torch_npu's documented patches: npu_functional -> torch.nn.functional, npu_modules -> torch.nn
    assert torch.nn.functional.dropout_with_byte_mask is cf.dropout_with_byte_mask
    assert torch.nn.DropoutWithByteMask is cm.DropoutWithByteMask


@pytest.mark.parametrize("mode", ["iou", "ptiou"])
def test_iou(mode):
    a, b = boxes(6, 0), boxes(4, 1)
    out = cf.npu_iou(a.npu(), b.npu(), mode=mode)
    assert out.shape == (6, 4)
    torch.testing.assert_close(out.cpu(), pair_iou(a, b), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cf.npu_iou(a.npu() / 100, b.npu() / 100, mode, True, 100.).cpu(), pair_iou(a, b),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="mode"):
        cf.npu_iou(a.npu(), b.npu(), mode="giou")


def xywh(t):
    return torch.cat([(t[:, :2] + t[:, 2:]) / 2, t[:, 2:] - t[:, :2]], 1)


def test_giou_diou_ciou():
    a, b = xywh(boxes(5, 2)), xywh(boxes(5, 3))
    an, bn = a.npu().requires_grad_(), b.npu().requires_grad_()
    giou = cf.npu_giou(an, bn)
    assert giou.shape == (5, 1)  # torch_npu's [n, 1]
    c = lambda t: torch.cat([t[:, :2] - t[:, 2:] / 2, t[:, :2] + t[:, 2:] / 2], 1)
    ca, cb = c(a), c(b)
    iou = pair_iou(ca, cb).diagonal()
    lo, hi = torch.min(ca[:, :2], cb[:, :2]), torch.max(ca[:, 2:], cb[:, 2:])
    enclose = (hi - lo).prod(1)
    area = lambda t: (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1])
    union = area(ca) + area(cb) - iou * 0  # recomputed below
    inter = iou * (area(ca) + area(cb)) / (1 + iou)
    union = area(ca) + area(cb) - inter
    torch.testing.assert_close(giou.cpu()[:, 0], iou - (enclose - union) / enclose, atol=1e-5, rtol=1e-5)
    giou.sum().backward()
    assert an.grad.shape == a.shape and torch.isfinite(an.grad).all()

    rho2 = ((ca[:, :2] + ca[:, 2:]) / 2 - (cb[:, :2] + cb[:, 2:]) / 2).pow(2).sum(1)
    diag2 = (hi - lo).pow(2).sum(1)
    diou = cf.npu_diou(a.t().npu(), b.t().npu())
    torch.testing.assert_close(diou.cpu()[0], iou - rho2 / diag2, atol=1e-5, rtol=1e-5)
    v = 4 / math.pi ** 2 * (torch.atan(b[:, 2] / b[:, 3]) - torch.atan(a[:, 2] / a[:, 3])) ** 2
    alpha = v / (1 - iou + v)
    ciou = cf.npu_ciou(a.t().npu(), b.t().npu())
    torch.testing.assert_close(ciou.cpu()[0], iou - rho2 / diag2 - alpha * v, atol=1e-5, rtol=1e-5)
    assert cf.npu_diou(a.t().npu(), b[:3].t().npu(), is_cross=True).shape == (3, 5)


def ref_multiclass_nms(bboxes, scores, score_thr, nms_thr, max_num):
    """bboxes (n, 4), scores (n, C): per class NMS, the max_num best overall, zero padded."""
    dets, labels = [], []
    for c in range(scores.shape[1]):
        s = scores[:, c]
        order = [i for i in torch.sort(s, descending=True, stable=True).indices.tolist() if s[i] > score_thr]
        keep = []
        for i in order:
            if len(keep) < max_num and all(pair_iou(bboxes[i:i + 1], bboxes[k:k + 1])[0, 0] <= nms_thr for k in keep):
                keep.append(i)
        dets += [torch.cat([bboxes[i], s[i:i + 1]]) for i in keep]
        labels += [c] * len(keep)
    out = torch.zeros(max_num, 5)
    lab = torch.zeros(max_num)
    if dets:
        d = torch.stack(dets)
        order = torch.sort(d[:, 4], descending=True, stable=True).indices[:max_num]
        out[:len(order)] = d[order]
        lab[:len(order)] = torch.tensor(labels, dtype=torch.float)[order]
    return out, lab


def test_multiclass_nms():
    b = boxes(40, 4)
    scores = torch.rand(40, 4, generator=torch.Generator().manual_seed(5))
    dets, labels = cf.npu_multiclass_nms(b.npu(), scores.npu(), 0.3, 0.4, 20)
    ref_d, ref_l = ref_multiclass_nms(b, scores[:, :-1], 0.3, 0.4, 20)
    torch.testing.assert_close(dets.cpu(), ref_d)
    torch.testing.assert_close(labels.cpu(), ref_l)
    bd, bl = cf.npu_batched_multiclass_nms(torch.stack([b, b.flip(0)]).npu(), torch.stack([scores, scores.flip(0)]).npu(),
                                           0.3, 0.4, 20)
    assert bd.shape == (2, 20, 5) and bl.shape == (2, 20)
    torch.testing.assert_close(bd[0].cpu(), ref_d)


def test_roll_matmul_transpose_fuse_add_softmax_dropout():
    x = torch.randn(2, 5, 6, 3)
    torch.testing.assert_close(cf.roll(x.npu(), (1, -2), (1, 2)).cpu(), torch.roll(x, (1, -2), (1, 2)))
    a, b = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(cf.matmul_transpose(a.npu(), b.npu()).cpu(), a @ b.transpose(-2, -1),
                               atol=1e-5, rtol=1e-5)
    scores, mask = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    out = cf.fuse_add_softmax_dropout(False, torch.nn.Dropout(0.1).eval(), mask.npu(), scores.npu(), 16., p=0.1)
    torch.testing.assert_close(out.cpu(), F.softmax(mask + scores / 4., -1), atol=1e-5, rtol=1e-5)


def test_matmul_apply_gradients_with_broadcast():
    from torch_npu.contrib.function._matmul_transpose import MatmulApply

    a = torch.randn(2, 3, 4, 8)
    b = torch.randn(5, 8)  # broadcast over a's batch dimensions
    an, bn = a.npu().requires_grad_(), b.npu().requires_grad_()
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = MatmulApply.apply(an, bn)
    ref = ac @ bc.transpose(-2, -1)
    torch.testing.assert_close(out.cpu(), ref.detach(), atol=1e-5, rtol=1e-5)
    g = torch.randn_like(ref)
    out.backward(g.npu())
    ref.backward(g)
    torch.testing.assert_close(an.grad.cpu(), ac.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.grad.cpu(), bc.grad, atol=1e-5, rtol=1e-5)
    assert bn.grad.shape == (5, 8)
    # float64 on the cpu: the Function's own backward against finite differences
    assert torch.autograd.gradcheck(MatmulApply.apply, (a[:1, :1].double().requires_grad_(),
                                                        b[:3].double().requires_grad_()))


def test_dropout_with_byte_mask():
    x = torch.ones(1000, 10).npu()
    y = cf.dropout_with_byte_mask(x, 0.3)
    kept = (y != 0).float().mean().item()
    assert 0.6 < kept < 0.8
    torch.testing.assert_close(y[y != 0].cpu(), torch.full_like(y[y != 0].cpu(), 1 / 0.7))
    assert cf.dropout_with_byte_mask(x, 0.3, training=False) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        cf.dropout_with_byte_mask(x, 1.5)
    m = torch.nn.DropoutWithByteMask(p=0.5).eval()
    assert m(x) is x


def test_roi_align_module():
    x = torch.arange(1, 37.).reshape(1, 1, 6, 6).npu().requires_grad_()
    rois = torch.tensor([[0, -2.0, -2.0, 22.0, 22.0]]).npu()
    m = cm.ROIAlign((3, 3), 0.25, 2, aligned=False)
    out = m(x, rois)
    torch.testing.assert_close(out.cpu(), torch.tensor([[[[4.5, 6.5, 8.5], [16.5, 18.5, 20.5], [28.5, 30.5, 32.5]]]]))
    out.sum().backward()
    # each of the 9 bins samples 4 in-image points with weights summing to 1/4 each
    torch.testing.assert_close(x.grad.sum().cpu(), torch.tensor(9.))
    # aligned=True shifts by half a pixel
    aligned = cm.ROIAlign(1, 1.0, 1)(x.detach(), torch.tensor([[0, 0.5, 0.5, 1.5, 1.5]]).npu())
    torch.testing.assert_close(aligned.cpu().flatten(), torch.tensor([4.5]))  # (1 + 2 + 7 + 8) / 4 at (0.5, 0.5)
    assert "aligned=True" in repr(cm.ROIAlign(7, 0.5, 2))


def test_dcnv2_starts_as_conv_and_trains():
    torch.manual_seed(0)
    m = cm.DCNv2(4, 6, 3, stride=1, padding=1)
    x = torch.randn(2, 4, 8, 8)
    mn = cm.DCNv2(4, 6, 3, stride=1, padding=1)
    mn.load_state_dict(m.state_dict())
    mn = mn.npu()
    out = mn(x.npu())
    # zero-initialised conv_offset: offsets 0, masks sigmoid(0) = 0.5
    torch.testing.assert_close(out.cpu(), 0.5 * F.conv2d(x, m.weight, None, padding=1) + m.bias[None, :, None, None],
                               atol=1e-4, rtol=1e-4)
    out.sum().backward()
    assert mn.weight.grad is not None and mn.conv_offset.weight.grad is not None and mn.bias.grad is not None
    # unpacked form: (x, offset in mmcv's (y, x) layout, mask)
    u = cm.ModulatedDeformConv(4, 6, 3, padding=1, bias=False, pack=False).npu()
    off = torch.zeros(2, 18, 8, 8).npu()
    mask = torch.ones(2, 9, 8, 8).npu()
    torch.testing.assert_close(u((x.npu(), off, mask)).cpu(), F.conv2d(x, u.weight.detach().cpu(), None, padding=1),
                               atol=1e-4, rtol=1e-4)
    # a y-only shift of one pixel: mmcv puts y at even channels
    off[:, 0::2] = 1.0
    shifted = u((x.npu(), off, mask)).cpu()
    # tap (kh, kw) of output (oh, ow) reads x[oh + kh, ow + kw - 1] (zero outside)
    z = F.pad(x, (1, 1, 0, 2))
    torch.testing.assert_close(shifted, F.conv2d(z, u.weight.detach().cpu(), None), atol=1e-4, rtol=1e-4)


def test_activations_and_small_modules():
    x = torch.randn(4, 6, 4, 4)
    xn = x.npu()
    torch.testing.assert_close(cm.Mish()(xn).cpu(), x * torch.tanh(F.softplus(x)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cm.SiLU()(xn).cpu(), x * torch.sigmoid(x), atol=1e-5, rtol=1e-5)
    assert cm.Swish is cm.SiLU
    a, b = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    o1, o2 = cm.ChannelShuffle(8, groups=2)(a.npu(), b.npu())
    full = torch.cat([a, b], 1).view(2, 2, 4, 3, 3).transpose(1, 2).reshape(2, 8, 3, 3)
    torch.testing.assert_close(torch.cat([o1, o2], 1).cpu(), full)
    torch.testing.assert_close(cm.ChannelShuffle(8, split_shuffle=False)(a.npu(), b.npu()).cpu(), full)
    pred, target = torch.randn(5, 10), torch.randint(0, 10, (5,))
    loss = cm.LabelSmoothingCrossEntropy(10, 0.1)(pred.npu(), target.npu())
    torch.testing.assert_close(loss.cpu(), F.cross_entropy(pred, target, label_smoothing=0.1 * 10 / 9),
                               atol=1e-5, rtol=1e-5)
    dp = cm.NpuDropPath(0.5)
    assert dp.eval()(xn) is xn  # samples are dropped with the ensemble: test_drop_path_*
    for cls in (cm.NpuFairseqDropout, cm.NpuCachedDropout):
        d = cls(0.2, module_name="attn")
        assert d.eval()(xn).data_ptr() == xn.data_ptr() or torch.equal(d(xn).cpu(), x)
    f = cm.Focus(3, 8, k=3).npu().eval()
    img = torch.randn(1, 3, 8, 8)
    assert f(img.npu()).shape == (1, 8, 4, 4)
    for cls, shape in ((cm.FastBatchNorm1d, (4, 6)), (cm.FastBatchNorm2d, (4, 6, 3, 3)),
                       (cm.FastBatchNorm3d, (4, 6, 2, 2, 2))):
        t = torch.randn(shape)
        torch.testing.assert_close(cls(6).npu()(t.npu()).cpu(), torch.nn.BatchNorm1d(6)(t.flatten(2) if t.dim() > 2
                                   else t).reshape(shape), atol=1e-5, rtol=1e-5)


def test_fast_batchnorm_counts_batches_in_int32():
    from torch_npu.contrib.module._batchnorm_with_int32_count import _BatchNorm, _NormBase

    bn = cm.FastBatchNorm2d(6).npu()
    assert isinstance(bn, _BatchNorm) and isinstance(bn, _NormBase) and isinstance(bn, torch.nn.BatchNorm2d)
    assert bn.num_batches_tracked.dtype == torch.int32
    for _ in range(3):
        bn(torch.randn(4, 6, 3, 3).npu())
    assert bn.num_batches_tracked.item() == 3 and bn.num_batches_tracked.dtype == torch.int32
    with pytest.raises(ValueError, match="expected 4D input"):
        bn(torch.randn(4, 6).npu())
    ref = torch.nn.BatchNorm2d(6)
    ref.load_state_dict(bn.cpu().state_dict())  # int32 count loads into torch's int64 buffer, and back
    bn.load_state_dict(ref.state_dict())
    assert bn.num_batches_tracked.dtype == torch.int32 and bn.num_batches_tracked.item() == 3
    momentum_none = cm.FastBatchNorm1d(4, momentum=None)
    momentum_none(torch.randn(8, 4))
    momentum_none(torch.randn(8, 4))
    assert momentum_none.num_batches_tracked.item() == 2  # cumulative average: factor 1 / num_batches_tracked
    base = _BatchNorm(5)
    with pytest.raises(NotImplementedError):  # subclasses define _check_input_dim
        base(torch.randn(2, 5))
    assert _BatchNorm(5, track_running_stats=False).num_batches_tracked is None


def test_prefetcher():
    data = [(torch.full((2, 3), float(i)), torch.tensor([i])) for i in range(3)]
    p = cm.Prefetcher(data)
    seen = []
    batch = p.next()
    while batch is not None:
        assert batch[0].device.type == "npu"
        seen.append(int(batch[1].item()))
        batch = p.next()
    assert seen == [0, 1, 2]


def test_bbox_coders():
    anchors = torch.tensor([[1., 2., 3., 4.], [3., 4., 5., 6.]])
    gt = torch.tensor([[5., 6., 7., 8.], [7., 8., 9., 6.]])
    # torch_npu's documented examples (Ascend rounds 13.3333 to 13.3281; the last is log(-1/3))
    enc = cf.npu_bbox_coder_encode_xyxy2xywh(anchors.npu(), gt.npu(), stds=[0.1, 0.1, 0.2, 0.2]).cpu()
    torch.testing.assert_close(enc[:, :3], torch.tensor([[40 / 3, 40 / 3, 0.], [40 / 3, 20 / 3, 0.]]))
    assert torch.isnan(enc[1, 3]) and enc[0, 3] == 0
    dec = cf.npu_bbox_coder_decode_xywh2xyxy(anchors.npu(), gt.npu(), max_shape=(10, 10), wh_ratio_clip=0.1).cpu()
    torch.testing.assert_close(dec, torch.tensor([[2.5, 6.5, 9., 9.], [9., 9., 9., 9.]]))
    # decode inverts encode
    a, g = boxes(6, 11), boxes(6, 12)
    means, stds = [0.1, -0.1, 0.0, 0.2], [0.5, 0.5, 1.0, 1.0]
    d = cf.npu_bbox_coder_encode_xyxy2xywh(a.npu(), g.npu(), means, stds)
    torch.testing.assert_close(cf.npu_bbox_coder_decode_xywh2xyxy(a.npu(), d, means, stds, wh_ratio_clip=1e-6).cpu(),
                               g, atol=1e-4, rtol=1e-4)
    y = cf.npu_bbox_coder_encode_yolo(a.npu(), g.npu(), torch.full((6,), 32, dtype=torch.int32).npu()).cpu()
    c = lambda t: ((t[:, :2] + t[:, 2:]) / 2, t[:, 2:] - t[:, :2])
    (gc, gwh), (ac, awh) = c(g), c(a)
    ref = torch.cat([((gc - ac) / 32 + 0.5).clamp(1e-6, 1 - 1e-6), torch.log((gwh / awh).clamp(min=1e-6))], 1)
    torch.testing.assert_close(y, ref)
    with pytest.raises(ValueError, match="size"):
        cf.npu_bbox_coder_encode_yolo(a.npu(), g[:3].npu(), torch.ones(6).npu())


def test_multihead_attention_fairseq_style():
    torch.manual_seed(0)
    bsz, tgt, src, E, H = 2, 3, 5, 16, 4
    m = cm.MultiheadAttention(E, H, dropout=0.0, self_attention=False)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
        ref.out_proj.weight.copy_(m.out_proj.weight)
        ref.out_proj.bias.copy_(m.out_proj.bias)
    q, k, v = torch.randn(bsz, tgt, E), torch.randn(bsz, src, E), torch.randn(bsz, src, E)
    mask = torch.zeros(bsz, 1, 1, src)
    mask[1, ..., -2:] = float("-inf")
    m = m.npu()
    out, none = m(q.reshape(-1, E).npu(), k.reshape(-1, E).npu(), v.reshape(-1, E).npu(), bsz, tgt, src,
                  key_padding_mask=mask.npu())
    assert none is None and out.shape == (bsz * tgt, E)
    expected, _ = ref(q, k, v, key_padding_mask=mask[:, 0, 0] != 0)
    torch.testing.assert_close(out.cpu().view(bsz, tgt, E), expected, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert m.q_proj.weight.grad is not None


# ---- npu_fast_condition_index_put --------------------------------------------------------------

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


# ---- npu_giou: [n, 1] as torch_npu (op-plugin permutes the kernel's [1, n]) -----------------

def _giou_ref(b, g):  # boxes as rows, xywh
    def corners(t):
        return t[:, 0] - t[:, 2] / 2, t[:, 1] - t[:, 3] / 2, t[:, 0] + t[:, 2] / 2, t[:, 1] + t[:, 3] / 2
    ax1, ay1, ax2, ay2 = corners(b)
    bx1, by1, bx2, by2 = corners(g)
    inter = (torch.min(ax2, bx2) - torch.max(ax1, bx1)).clamp(min=0) * \
        (torch.min(ay2, by2) - torch.max(ay1, by1)).clamp(min=0)
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    outer = (torch.max(ax2, bx2) - torch.min(ax1, bx1)) * (torch.max(ay2, by2) - torch.min(ay1, by1))
    return inter / union - (outer - union) / outer


def test_giou_has_torch_npus_shape_and_backward():
    # Huawei's test/contrib/test_iou.py::test_npu_giou: expected [[0.5], [0.0111], [-0.2523]]
    box1 = torch.tensor([[0, 0, 10, 10], [10, 10, 20, 20], [32, 32, 38, 42]], dtype=torch.float32)
    box2 = torch.tensor([[0, 0, 10, 20], [0, 10, 10, 10], [10, 10, 20, 20]], dtype=torch.float32)
    out = cf.npu_giou(box1.npu(), box2.npu())
    assert out.shape == (3, 1)
    torch.testing.assert_close(out.cpu()[:, 0], _giou_ref(box1, box2))
    torch.testing.assert_close(out.cpu(), torch.tensor([[0.5], [0.0111], [-0.2523]]), atol=1e-4, rtol=0)
    # The backward takes the [n, 1] gradient (random boxes: no ties between corners).
    g = torch.Generator().manual_seed(1)
    box1, box2 = torch.rand(5, 4, generator=g) + 0.5, torch.rand(5, 4, generator=g) + 0.5
    b, bc = box1.npu().requires_grad_(), box1.clone().requires_grad_()
    w = torch.randn(5, 1, generator=g)
    (cf.npu_giou(b, box2.npu()) * w.npu()).sum().backward()
    (_giou_ref(bc, box2)[:, None] * w).sum().backward()
    torch.testing.assert_close(b.grad.cpu(), bc.grad, atol=1e-5, rtol=1e-5)
    # torch_npu.npu_giou itself: boxes as columns, [n, 1]; is_cross: [n, m].
    cols = torch.rand(4, 6) + 0.2
    assert torch_npu.npu_giou(cols.npu(), cols.npu(), True, False, 0).shape == (6, 1)
    assert torch_npu.npu_giou(cols.npu(), cols[:, :4].contiguous().npu(), True, True, 0).shape == (6, 4)


# ---- NpuDropPath: torch_npu's pre-generated random tensors ----------------------------------

def test_drop_path_without_ensemble_keeps_input():
    cm.NpuDropPath.task_dict.clear()
    x = torch.randn(6, 3, 4).npu()
    dp = cm.NpuDropPath(0.5).train()
    assert dp(x) is x and dp(x) is x  # torch_npu drops only with pre-generated tensors
    assert cm.NpuDropPath(0.0).train()(x) is x
    assert dp.eval()(x) is x
    with pytest.raises(RuntimeError, match="Tensor"):
        dp.train()([1, 2])
    with pytest.raises(ValueError, match="drop_prob"):
        cm.NpuDropPath(None)


def test_drop_path_ensemble_drops_whole_samples():
    cm.NpuDropPath.task_dict.clear()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = cm.NpuDropPath(0.5)

        def forward(self, x):
            return self.drop(x)

    model = Block().npu().train()
    cm.NpuDropPath.enable_droppath_ensemble(model)
    assert isinstance(cm.NpuDropPath.droppath_stream, torch.npu.Stream)
    x = torch.randn(64, 3, 5).npu()
    assert torch.equal(model(x).cpu(), x.cpu())  # first pass: registers what it needs
    kept = 0
    for _ in range(4):
        y, xc = model(x).cpu(), x.cpu()
        per_sample = y.flatten(1)
        dropped = (per_sample == 0).all(1)
        torch.testing.assert_close(y[~dropped], xc[~dropped] * 2)  # kept samples scaled by 1/keep
        kept += int((~dropped).sum())
        assert 0 < int(dropped.sum()) < 64
    assert 64 < kept < 192  # of 4 x 64 samples, about half kept
    cm.NpuDropPath.task_dict.clear()


def test_channel_shuffle_takes_more_channels_than_in_channels():
    # Huawei's test_channel_shuffle.py: ChannelShuffle(2) on two 2-channel inputs shuffles
    # the first two channels of the concatenation.
    x = torch.randn(2, 2, 3, 3)
    out = cm.ChannelShuffle(2, split_shuffle=False)(x.npu(), x.npu()).cpu()
    ref = x.view(2, 2, 1, 3, 3).transpose(1, 2).reshape(2, 2, 3, 3)
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="in_channels"):
        cm.ChannelShuffle(8)(x.npu(), x.npu())


def test_multihead_attention_fused_path(monkeypatch):
    # after set_fussion(): torch_npu.npu_multi_head_attention, which takes float16 activations with the
    # module's float32 weights and gives what the composed path gives in float32
    from torch_npu.contrib.module.multihead_attention import _MHAConfig
    torch.manual_seed(0)
    bsz, tgt, src, E, H = 2, 16, 32, 256, 16
    m = cm.MultiheadAttention(E, H, dropout=0.1, self_attention=False).npu().eval()
    q, k, v = torch.randn(bsz * tgt, E).npu(), torch.randn(bsz * src, E).npu(), torch.randn(bsz * src, E).npu()
    mask = torch.zeros(bsz, H, tgt, src)
    mask[0, ..., :3] = -10000.0
    composed, _ = m(q, k, v, bsz, tgt, src, key_padding_mask=mask.npu())
    monkeypatch.setattr(_MHAConfig, "use_fussion_mha", False)
    _MHAConfig.set_fussion()
    fused, none = m(q, k, v, bsz, tgt, src, key_padding_mask=mask.npu())
    assert none is None
    torch.testing.assert_close(fused.cpu(), composed.cpu(), rtol=1e-4, atol=1e-4)
    half, _ = m(q.half(), k.half(), v.half(), bsz, tgt, src, key_padding_mask=mask.half().npu())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float().cpu(), composed.cpu(), rtol=2e-2, atol=2e-2)


def test_multihead_attention_private_helpers(monkeypatch):
    from torch_npu.contrib.module.multihead_attention import _MHAConfig, _NpuLinear
    monkeypatch.setattr(_MHAConfig, "use_fussion_mha", _MHAConfig.use_fussion_mha)  # restored afterwards
    _MHAConfig.set_fussion()
    assert _MHAConfig.use_fussion_mha
    lin = _NpuLinear(10, 20)
    x = torch.randn(5, 10)
    torch.testing.assert_close(lin(x), x @ lin.weight.t() + lin.bias)
    assert lin(torch.randn(2, 5, 10)).shape == (2, 5, 20)
    with pytest.raises(RuntimeError, match="2-D or 3-D"):
        lin(torch.randn(5, 10, 3, 1))
