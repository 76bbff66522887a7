"""Vision kernels (custom_ops/src/vision.cpp) against plain-torch references written here:
IoU family, NMS variants, RoI Align and modulated deformable convolution, forward and
backward, shapes under FakeTensorMode, and errors for bad arguments."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu


def rand_boxes(n, scale=100., seed=0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * scale
    wh = torch.rand(n, 2, generator=g) * scale / 2 + 1
    return torch.cat([xy, xy + wh], 1)


def ref_iou(b, g, mode=0):  # [M, N]: gt rows, box columns
    iw = (torch.min(b[None, :, 2], g[:, None, 2]) - torch.max(b[None, :, 0], g[:, None, 0])).clamp(min=0)
    ih = (torch.min(b[None, :, 3], g[:, None, 3]) - torch.max(b[None, :, 1], g[:, None, 1])).clamp(min=0)
    inter = iw * ih
    ab = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    ag = (g[:, 2] - g[:, 0]) * (g[:, 3] - g[:, 1])
    return inter / (ab[None, :] + ag[:, None] - inter) if mode == 0 else inter / ag[:, None]


def ref_giou(b, g, trans, is_cross):  # columns
    def corners(x):
        if trans:
            return x[0] - x[2] / 2, x[1] - x[3] / 2, x[0] + x[2] / 2, x[1] + x[3] / 2
        return x[0], x[1], x[2], x[3]
    if is_cross:
        b, g = b[:, None, :], g[:, :, None]
    ax1, ay1, ax2, ay2 = corners(b)
    bx1, by1, bx2, by2 = corners(g)
    inter = (torch.min(ax2, bx2) - torch.max(ax1, bx1)).clamp(min=0) * (torch.min(ay2, by2) - torch.max(ay1, by1)).clamp(min=0)
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter + 1e-16
    outer = (torch.max(ax2, bx2) - torch.min(ax1, bx1)).abs() * (torch.max(ay2, by2) - torch.min(ay1, by1)).abs()
    out = inter / union - (outer - union) / outer
    return out if is_cross else out[None]


def ref_nms(boxes, scores, iou_thr, score_thr=None, limit=None):
    order = [i for i in torch.sort(scores, descending=True, stable=True).indices.tolist()
             if score_thr is None or scores[i] > score_thr]
    keep = []
    for i in order:
        if limit is not None and len(keep) >= limit:
            break
        if all(ref_iou(boxes[i:i + 1], boxes[k:k + 1])[0, 0] <= iou_thr for k in keep):
            keep.append(i)
    return keep


# ---- IoU ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["npu_iou", "npu_ptiou"])
@pytest.mark.parametrize("mode", [0, 1])
def test_iou(op, mode):
    b, g = rand_boxes(7, seed=1), rand_boxes(5, seed=2)
    b[3] = g[1]  # an exact match
    out = getattr(torch_npu, op)(b.npu(), g.npu(), mode)
    assert out.shape == (5, 7) and out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), ref_iou(b, g, mode), atol=1e-6, rtol=1e-5)


def test_iou_doc_example_half():
    b = torch.tensor([[0, 0, 10, 10], [10, 10, 20, 20], [32, 32, 38, 42]], dtype=torch.float16)
    g = torch.tensor([[0, 0, 10, 20], [0, 10, 10, 10], [10, 10, 20, 20]], dtype=torch.float16)
    out = torch_npu.npu_iou(b.npu(), g.npu(), 0).cpu()
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), torch.tensor([[0.5, 0, 0], [0, 0, 0], [0, 1., 0]]), atol=3e-3, rtol=0)


@pytest.mark.parametrize("trans", [True, False])
@pytest.mark.parametrize("is_cross", [False, True])
def test_giou_forward(trans, is_cross):
    n, m = 6, (4 if is_cross else 6)
    b = (rand_boxes(n, 1., seed=3) if not trans else torch.rand(n, 4) + 0.2).t().contiguous()
    g = (rand_boxes(m, 1., seed=4) if not trans else torch.rand(m, 4) + 0.2).t().contiguous()
    out = torch_npu.npu_giou(b.npu(), g.npu(), trans, is_cross, 0)
    assert out.shape == ((n, m) if is_cross else (n, 1))  # torch_npu's shapes
    torch.testing.assert_close(out.cpu(), ref_giou(b, g, trans, is_cross).t(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("trans", [True, False])
def test_giou_backward_matches_reference_and_gradcheck(trans):
    torch.manual_seed(0)
    n = 8
    b = (torch.rand(n, 4) * 0.5 + 0.3).t().contiguous().double()
    g = (torch.rand(n, 4) * 0.5 + 0.3).t().contiguous().double()
    if not trans:  # valid xyxy boxes
        b[2:] += b[:2]
        g[2:] += g[:2]
    bn, gn = b.npu().requires_grad_(), g.npu().requires_grad_()
    out = torch_npu.npu_giou(bn, gn, trans, False, 0)
    bc, gc = b.clone().requires_grad_(), g.clone().requires_grad_()
    ref = ref_giou(bc, gc, trans, False).t()
    w = torch.randn_like(ref)
    (out * w.npu()).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(bn.grad.cpu(), bc.grad, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(gn.grad.cpu(), gc.grad, atol=1e-9, rtol=1e-7)
    assert torch.autograd.gradcheck(lambda x, y: torch_npu.npu_giou(x, y, trans, False, 0),
                                    (b.npu().requires_grad_(), g.npu().requires_grad_()))


def test_giou_backward_op_float32():
    b = (torch.rand(5, 4) + 0.2).t().contiguous()
    g = (torch.rand(5, 4) + 0.2).t().contiguous()
    db, dg = torch_npu.npu_giou_backward(torch.ones(1, 5).npu(), b.npu(), g.npu(), True, False, 0)
    assert db.shape == b.shape and dg.shape == g.shape
    bc, gc = b.clone().requires_grad_(), g.clone().requires_grad_()
    ref_giou(bc, gc, True, False).sum().backward()
    torch.testing.assert_close(db.cpu(), bc.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dg.cpu(), gc.grad, atol=1e-4, rtol=1e-4)


# ---- NMS ----------------------------------------------------------------------------------

@pytest.mark.parametrize("pad", [False, True])
def test_nms_v4(pad):
    boxes, scores = rand_boxes(60, seed=5), torch.rand(60, generator=torch.Generator().manual_seed(6))
    sel, valid = torch_npu.npu_nms_v4(boxes.npu(), scores.npu(), 20, torch.tensor(0.3).npu(),
                                      torch.tensor(0.2).npu(), pad)
    expected = ref_nms(boxes, scores, 0.3, 0.2, 20)
    assert sel.dtype == torch.int32 and valid.dtype == torch.int32 and valid.dim() == 0
    assert int(valid) == len(expected)
    assert sel.shape == ((20,) if pad else (len(expected),))
    assert sel.cpu()[:len(expected)].tolist() == expected
    if pad:
        assert (sel.cpu()[len(expected):] == 0).all()


def test_nms_with_mask():
    boxes, scores = rand_boxes(30, seed=7), torch.rand(30, generator=torch.Generator().manual_seed(8))
    inp = torch.cat([boxes, scores[:, None]], 1)
    out_boxes, idx, mask = torch_npu.npu_nms_with_mask(inp.npu(), 0.4)
    order = torch.sort(scores, descending=True, stable=True).indices
    assert idx.dtype == torch.int32 and mask.dtype == torch.uint8 and out_boxes.shape == (30, 5)
    assert idx.cpu().tolist() == order.tolist()
    torch.testing.assert_close(out_boxes.cpu(), inp[order])
    keep = set(ref_nms(boxes, scores, 0.4))
    assert mask.cpu().tolist() == [int(i in keep) for i in order.tolist()]
    # the documented example: (N, 8) input, two disjoint boxes kept
    ex = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.6, 0.5, 0.4, 0.3], [6.0, 7.0, 8.0, 9.0, 0.4, 0.5, 0.6, 0.7]])
    b, i, m = torch_npu.npu_nms_with_mask(ex.npu(), 0.5)
    assert b.shape == (2, 5) and i.cpu().tolist() == [0, 1] and m.cpu().tolist() == [1, 1]


def test_nms_rotated_axis_aligned_matches_nms():
    boxes, scores = rand_boxes(40, seed=9), torch.rand(40, generator=torch.Generator().manual_seed(10))
    xywh = torch.cat([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2], torch.zeros(40, 1)], 1)
    sel, num = torch_npu.npu_nms_rotated(xywh.npu(), scores.npu(), 0.3)
    expected = ref_nms(boxes, scores, 0.3, 0.0)
    assert num.shape == (1,) and int(num) == len(expected)
    assert sel.cpu().tolist() == expected
    # mode 1 (x1, y1, x2, y2, angle) and max_output_size
    xyxy = torch.cat([boxes, torch.zeros(40, 1)], 1)
    sel1, _ = torch_npu.npu_nms_rotated(xyxy.npu(), scores.npu(), 0.3, 0.0, 5, 1)
    assert sel1.cpu().tolist() == expected[:5]


def test_nms_rotated_rotation():
    # a 4x2 box and the same box rotated by 90 degrees overlap in a 2x2 square: IoU = 4 / 12
    dets = torch.tensor([[0., 0., 4., 2., 0.], [0., 0., 4., 2., 90.]])
    scores = torch.tensor([0.9, 0.8])
    assert torch_npu.npu_nms_rotated(dets.npu(), scores.npu(), 0.3)[0].cpu().tolist() == [0]
    assert torch_npu.npu_nms_rotated(dets.npu(), scores.npu(), 0.34)[0].cpu().tolist() == [0, 1]


# ---- RoI Align ------------------------------------------------------------------------------

def bilinear_ref(img, y, x):
    H, W = img.shape[-2:]
    if y < -1 or y > H or x < -1 or x > W:
        return img.new_zeros(img.shape[:-2])
    y, x = max(y, 0.), max(x, 0.)
    y0, x0 = int(y), int(x)
    if y0 >= H - 1:
        y0 = y1 = H - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= W - 1:
        x0 = x1 = W - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * img[..., y0, x0] + (1 - ly) * lx * img[..., y0, x1] +
            ly * (1 - lx) * img[..., y1, x0] + ly * lx * img[..., y1, x1])


def ref_roi_align(x, rois, scale, ph, pw, sample, mode):
    out = []
    for r in rois.tolist():
        off = 0.5 if mode == 3 else 0.
        x1, y1 = r[1] * scale - off, r[2] * scale - off
        end = 1. if mode == 1 else 0.  # roi_end_mode 1: the end pixel is included
        x2, y2 = (r[3] + end) * scale - off, (r[4] + end) * scale - off
        w, h = x2 - x1, y2 - y1
        if mode != 3:
            w, h = max(w, 1.), max(h, 1.)
        bh, bw = h / ph, w / pw
        gh = sample if sample > 0 else math.ceil(h / ph)
        gw = sample if sample > 0 else math.ceil(w / pw)
        img = x[int(r[0])]
        pooled = torch.stack([torch.stack([
            sum(bilinear_ref(img, y1 + i * bh + (iy + .5) * bh / gh, x1 + j * bw + (ix + .5) * bw / gw)
                for iy in range(gh) for ix in range(gw)) / (gh * gw)
            for j in range(pw)], -1) for i in range(ph)], -2)
        out.append(pooled)
    return torch.stack(out)


def test_roi_align_doc_example():
    x = torch.arange(1, 37.).reshape(1, 1, 6, 6)
    rois = torch.tensor([[0, -2.0, -2.0, 22.0, 22.0]])
    out = torch_npu.npu_roi_align(x.npu(), rois.npu(), 0.25, 3, 3, 2, 0)
    expected = torch.tensor([[[[4.5, 6.5, 8.5], [16.5, 18.5, 20.5], [28.5, 30.5, 32.5]]]])
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("sample,mode", [(2, 0), (0, 0), (2, 1), (3, 3)])
def test_roi_align_vs_reference(sample, mode):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 9, 11)
    rois = torch.tensor([[0, 1.0, 2.0, 30.0, 25.0], [1, -4.0, 0.0, 12.0, 44.0], [1, 10.0, 10.0, 10.5, 11.0]])
    out = torch_npu.npu_roi_align(x.npu(), rois.npu(), 0.25, 2, 3, sample, mode)
    assert out.shape == (3, 3, 2, 3)
    torch.testing.assert_close(out.cpu(), ref_roi_align(x, rois, 0.25, 2, 3, sample, mode), atol=1e-5, rtol=1e-5)


def test_roi_align_gradcheck_and_alignbk():
    torch.manual_seed(2)
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 1.3, 2.1, 15.2, 13.7], [1, 0.4, 3.3, 9.9, 18.1]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: torch_npu.npu_roi_align(t, rois.npu(), 0.3, 2, 2, 2, 0),
                                    (x.npu().requires_grad_(),))
    # npu_roi_alignbk is the adjoint: <roi_align(x), y> == <x, roi_alignbk(y)>
    y = torch.randn(2, 2, 2, 2, dtype=torch.float64)
    fwd = torch_npu.npu_roi_align(x.npu(), rois.npu(), 0.3, 2, 2, 2, 0).cpu()
    bk = torch_npu.npu_roi_alignbk(y.npu(), rois.npu(), list(x.shape), 2, 2, 0.3, 2, 0).cpu()
    torch.testing.assert_close((fwd * y).sum(), (x * bk).sum())


# ---- deformable convolution ----------------------------------------------------------------

def ref_deform_conv(x, weight, offset, bias, stride, pad, dil, groups, dg):
    """Sampling by grid_sample (zeros outside, align_corners=True = pixel centres at integers)."""
    N, C, H, W = x.shape
    KH, KW = weight.shape[2:]
    OH, OW = offset.shape[2:]
    K = KH * KW
    cols = []
    for n in range(N):
        per_group = []
        for g in range(dg):
            xs, ys, ms = (offset[n, (p * dg + g) * K:(p * dg + g + 1) * K] for p in range(3))
            kh = torch.arange(KH, dtype=x.dtype).repeat_interleave(KW).view(K, 1, 1)
            kw = torch.arange(KW, dtype=x.dtype).repeat(KH).view(K, 1, 1)
            oh = torch.arange(OH, dtype=x.dtype).view(1, OH, 1)
            ow = torch.arange(OW, dtype=x.dtype).view(1, 1, OW)
            py = oh * stride - pad + kh * dil + ys
            px = ow * stride - pad + kw * dil + xs
            grid = torch.stack([px / (W - 1) * 2 - 1, py / (H - 1) * 2 - 1], -1).view(1, K * OH, OW, 2)
            img = x[n:n + 1, g * (C // dg):(g + 1) * (C // dg)]
            s = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
            per_group.append(s.view(C // dg, K, OH, OW) * ms)
        cols.append(torch.cat(per_group))  # [C, K, OH, OW]
    col = torch.stack(cols)  # [N, C, K, OH, OW]
    col = col.view(N, C, KH, KW, OH, OW).permute(0, 1, 4, 2, 5, 3).reshape(N, C, OH * KH, OW * KW)
    return F.conv2d(col, weight, bias, stride=(KH, KW), groups=groups), col


def dcn_args(stride=1, pad=1, dil=1):
    return dict(kernel_size=[3, 3], stride=[1, 1, stride, stride], padding=[pad] * 4, dilation=[1, 1, dil, dil])


def test_deformable_conv2d_zero_offset_unit_mask_is_conv2d():
    torch.manual_seed(3)
    x, w, b = torch.randn(2, 4, 7, 8), torch.randn(6, 2, 3, 3), torch.randn(6)
    offset = torch.cat([torch.zeros(2, 2 * 9, 4, 4), torch.ones(2, 9, 4, 4)], 1)
    out, off_out = torch_npu.npu_deformable_conv2d(x.npu(), w.npu(), offset.npu(), b.npu(), groups=2,
                                                   **dcn_args(stride=2, pad=1))
    assert out.shape == (2, 6, 4, 4) and off_out.shape == (2, 4, 12, 12)
    torch.testing.assert_close(out.cpu(), F.conv2d(x, w, b, stride=2, padding=1, groups=2), atol=1e-4, rtol=1e-4)


def test_deformable_conv2d_vs_reference_and_gradcheck():
    torch.manual_seed(4)
    N, C, H, W, O, dg = 1, 4, 5, 6, 3, 2
    x = torch.randn(N, C, H, W, dtype=torch.float64)
    w = torch.randn(O, C, 3, 3, dtype=torch.float64)
    b = torch.randn(O, dtype=torch.float64)
    offset = torch.cat([torch.rand(N, 2 * dg * 9, H, W, dtype=torch.float64) * 3 - 1.5,
                        torch.rand(N, dg * 9, H, W, dtype=torch.float64)], 1)
    out, off_out = torch_npu.npu_deformable_conv2d(x.npu(), w.npu(), offset.npu(), b.npu(), deformable_groups=dg,
                                                   **dcn_args())
    ref, ref_col = ref_deform_conv(x, w, offset, b, 1, 1, 1, 1, dg)
    torch.testing.assert_close(off_out.cpu(), ref_col)
    torch.testing.assert_close(out.cpu(), ref)

    def f(xx, ww, oo, bb):
        return torch_npu.npu_deformable_conv2d(xx, ww, oo, bb, deformable_groups=dg, **dcn_args())[0]
    args = [t.npu().requires_grad_() for t in (x, w, offset, b)]
    assert torch.autograd.gradcheck(f, args, atol=1e-6)


def test_deformable_conv2dbk_float32_vs_reference():
    torch.manual_seed(5)
    x, w = torch.randn(2, 2, 6, 6), torch.randn(4, 2, 3, 3)
    offset = torch.cat([torch.randn(2, 18, 6, 6), torch.rand(2, 9, 6, 6)], 1)
    xn, wn, on = (t.npu().requires_grad_() for t in (x, w, offset))
    out, off_out = torch_npu.npu_deformable_conv2d(xn, wn, on, None, **dcn_args())
    xc, wc, oc = (t.clone().requires_grad_() for t in (x, w, offset))
    ref, _ = ref_deform_conv(xc, wc, oc, None, 1, 1, 1, 1, 1)
    g = torch.randn_like(ref)
    out.backward(g.npu())
    ref.backward(g)
    for a, e in ((xn, xc), (wn, wc), (on, oc)):
        torch.testing.assert_close(a.grad.cpu(), e.grad, atol=1e-3, rtol=1e-3)
    gi, gw, go, gb = torch_npu.npu_deformable_conv2dbk(x.npu(), g.npu(), off_out.detach(), w.npu(), offset.npu(),
                                                       **dcn_args())
    torch.testing.assert_close(gb.cpu(), g.sum((0, 2, 3)), atol=1e-4, rtol=1e-4)


# ---- shapes for tracing and bad arguments ----------------------------------------------------

def test_fakes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        dev = torch.device("npu:0")
        b, g = torch.empty(7, 4, device=dev), torch.empty(5, 4, device=dev)
        assert torch.ops.npu.npu_iou(b, g).shape == (5, 7)
        assert torch.ops.npu.npu_giou(b.t(), b.t()).shape == (7, 1)
        assert torch.ops.npu.npu_giou(b.t(), g.t(), True, True).shape == (7, 5)
        s = torch.empty(7, device=dev)
        t = torch.empty((), device=dev)
        sel, valid = torch.ops.npu.npu_nms_v4(b, s, 4, t, t, True)
        assert sel.shape == (4,) and valid.shape == ()
        sel, _ = torch.ops.npu.npu_nms_v4(b, s, 4, t, t)
        assert sel.dim() == 1
        bx, idx, m = torch.ops.npu.npu_nms_with_mask(torch.empty(7, 8, device=dev), 0.5)
        assert bx.shape == (7, 5) and idx.dtype == torch.int32 and m.dtype == torch.uint8
        sel, num = torch.ops.npu.npu_nms_rotated(torch.empty(7, 5, device=dev), s, 0.5)
        assert num.shape == (1,)
        x = torch.empty(2, 3, 9, 11, device=dev)
        r = torch.empty(4, 5, device=dev)
        assert torch.ops.npu.npu_roi_align(x, r, 0.25, 2, 3, 2, 0).shape == (4, 3, 2, 3)
        assert torch.ops.npu.npu_roi_alignbk(torch.empty(4, 3, 2, 3, device=dev), r, [2, 3, 9, 11], 3, 2, 0.25,
                                             2).shape == (2, 3, 9, 11)
        out, col = torch.ops.npu.npu_deformable_conv2d(torch.empty(2, 4, 7, 8, device=dev),
                                                       torch.empty(6, 4, 3, 3, device=dev),
                                                       torch.empty(2, 27, 4, 4, device=dev), None,
                                                       **dcn_args(stride=2))
        assert out.shape == (2, 6, 4, 4) and col.shape == (2, 4, 12, 12)


@pytest.mark.parametrize("call,match", [
    (lambda: torch_npu.npu_iou(torch.zeros(3, 5).npu(), torch.zeros(2, 4).npu()), r"bboxes of shape \[N, 4\]"),
    (lambda: torch_npu.npu_iou(torch.zeros(3, 4).npu(), torch.zeros(2, 4)), "gtboxes to be an npu tensor"),
    (lambda: torch_npu.npu_iou(torch.zeros(3, 4).npu(), torch.zeros(2, 4).npu(), 2), "mode 0"),
    (lambda: torch_npu.npu_giou(torch.zeros(3, 4).npu(), torch.zeros(4, 3).npu()), r"self of shape \[4, N\]"),
    (lambda: torch_npu.npu_giou(torch.zeros(4, 3).npu(), torch.zeros(4, 2).npu()), r"gtboxes of shape \[4, 3\]"),
    (lambda: torch_npu.npu_nms_v4(torch.zeros(3, 4).npu(), torch.zeros(2).npu(), 2, torch.tensor(.5).npu(),
                                  torch.tensor(.1).npu()), r"scores of shape \[3\]"),
    (lambda: torch_npu.npu_nms_v4(torch.zeros(3, 4).npu(), torch.zeros(3).npu(), 2, torch.zeros(2).npu(),
                                  torch.tensor(.1).npu()), "iou_threshold to be a 0-dimensional"),
    (lambda: torch_npu.npu_nms_with_mask(torch.zeros(3, 4).npu(), 0.5), r"input of shape \[N, 5\] or \[N, 8\]"),
    (lambda: torch_npu.npu_nms_rotated(torch.zeros(3, 4).npu(), torch.zeros(3).npu(), 0.5), r"self of shape \[N, 5\]"),
    (lambda: torch_npu.npu_roi_align(torch.zeros(1, 1, 4, 4).npu(), torch.zeros(2, 4).npu(), 1., 2, 2, 2, 0),
     r"rois of shape \[K, 5\]"),
    (lambda: torch_npu.npu_roi_align(torch.zeros(1, 1, 4, 4).npu(), torch.zeros(2, 5).npu(), 1., 0, 2, 2, 0),
     "pooled_height and pooled_width > 0"),
    (lambda: torch_npu.npu_roi_align(torch.zeros(1, 4, 4).npu(), torch.zeros(2, 5).npu(), 1., 2, 2, 2, 0),
     "self to be 4-dimensional"),
    (lambda: torch_npu.npu_deformable_conv2d(torch.zeros(1, 2, 5, 5).npu(), torch.zeros(3, 2, 3, 3).npu(),
                                             torch.zeros(1, 26, 5, 5).npu(), None, **dcn_args()),
     r"offset of shape \[1, 27, 5, 5\]"),
    (lambda: torch_npu.npu_deformable_conv2d(torch.zeros(1, 2, 5, 5).npu(), torch.zeros(3, 2, 3, 3).npu(),
                                             torch.zeros(1, 27, 5, 5).npu(), None, [3, 3], [1, 1], [1, 1, 1, 1]),
     "stride of 4 elements"),
    (lambda: torch_npu.npu_deformable_conv2d(torch.zeros(1, 2, 5, 5).npu(), torch.zeros(3, 2, 3, 3).npu(),
                                             torch.zeros(1, 27, 5, 5).npu(), torch.zeros(2).npu(), **dcn_args()),
     r"bias of shape \[3\]"),
])
def test_bad_arguments(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


def _anchor_flags_reference(boxes, featmap_size, stride, num_base_anchors):
    """torch_npu's documented reference computation of npu_anchor_response_flags."""
    feat_h, feat_w = featmap_size
    cx = (boxes[:, 0] + boxes[:, 2]) * 0.5
    cy = (boxes[:, 1] + boxes[:, 3]) * 0.5
    gx = torch.floor(cx / stride[0]).int().clamp(0, feat_w - 1)
    gy = torch.floor(cy / stride[1]).int().clamp(0, feat_h - 1)
    grid = torch.zeros(feat_h * feat_w, dtype=torch.uint8)
    grid[(gy * feat_w + gx).long()] = 1
    return grid[:, None].expand(grid.size(0), num_base_anchors).contiguous().view(-1)


@pytest.mark.parametrize("featmap_size,stride", [((10, 10), (32, 32)), ((20, 12), (16, 24)), ((40, 40), (8, 8))])
def test_anchor_response_flags_and_single_level_responsible_flags(featmap_size, stride):
    from torch_npu.contrib.function import npu_single_level_responsible_flags

    g = torch.Generator().manual_seed(0)
    boxes = torch.randint(-20, 560, (64, 4), generator=g)  # some centres fall outside the map
    expected = _anchor_flags_reference(boxes.float(), featmap_size, stride, 3)
    flags = torch_npu.npu_anchor_response_flags(boxes.float().npu(), featmap_size, stride, 3)
    assert flags.dtype == torch.uint8 and flags.shape == (featmap_size[0] * featmap_size[1] * 3,)
    assert torch.equal(flags.cpu(), expected)
    assert torch.equal(npu_single_level_responsible_flags(featmap_size, boxes.npu(), stride, 3).cpu(), expected)
    half = torch_npu.npu_anchor_response_flags(boxes.half().npu(), featmap_size, stride, 3)
    assert torch.equal(half.cpu(), _anchor_flags_reference(boxes.half().float(), featmap_size, stride, 3))


def test_anchor_response_flags_bad_arguments():
    boxes = torch.rand(4, 4).npu()
    with pytest.raises(RuntimeError, match="featmap_size"):
        torch_npu.npu_anchor_response_flags(boxes, [0, 4], [8, 8], 3)
    with pytest.raises(RuntimeError, match="stride"):
        torch_npu.npu_anchor_response_flags(boxes, [4, 4], [0, 8], 3)
    with pytest.raises(RuntimeError, match="num_base_anchors"):
        torch_npu.npu_anchor_response_flags(boxes, [4, 4], [8, 8], 0)
    with pytest.raises(RuntimeError, match="self"):
        torch_npu.npu_anchor_response_flags(torch.rand(4, 3).npu(), [4, 4], [8, 8], 3)
