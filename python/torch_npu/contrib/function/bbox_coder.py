"""Box coders (torch_npu.contrib.function.bbox_coder): mmdet's YOLO and delta-xywh coders
with Ascend's conventions (legacy +1 widths for the delta coder)."""
import math

import torch

__all__ = ["npu_bbox_coder_encode_yolo", "npu_bbox_coder_encode_xyxy2xywh", "npu_bbox_coder_decode_xywh2xyxy"]


def _check_pair(a, b, names):
    if a.size(0) != b.size(0):
        raise ValueError(f"Expected {names[0]}.size(0) == {names[1]}.size(0), got {a.size(0)} and {b.size(0)}")
    if not (a.size(-1) == b.size(-1) == 4):
        raise ValueError(f"Expected {names[0]}.size(-1) == {names[1]}.size(-1) == 4, got {a.size(-1)} and {b.size(-1)}")


def _float(t):
    return t if t.dtype in (torch.float16, torch.float32, torch.float64) else t.float()


def npu_bbox_coder_encode_yolo(bboxes, gt_bboxes, stride):
    """YOLO deltas of gt_bboxes relative to bboxes (both (n, 4) xyxy), stride (n,):
    [(gt_cx - cx) / stride + 0.5, (gt_cy - cy) / stride + 0.5] clamped to [eps, 1 - eps] and
    [log(gt_w / w), log(gt_h / h)] with the ratios clamped at eps = 1e-6."""
    _check_pair(bboxes, gt_bboxes, ("bboxes", "gt_bboxes"))
    bboxes, gt_bboxes = _float(bboxes), _float(gt_bboxes)
    if stride.dim() != 1 or stride.size(0) != bboxes.size(0):
        raise ValueError(f"Expected stride of shape ({bboxes.size(0)},), got {tuple(stride.shape)}")
    eps = 1e-6
    stride = stride.to(bboxes.dtype)
    gcx, gcy = (gt_bboxes[:, 0] + gt_bboxes[:, 2]) * .5, (gt_bboxes[:, 1] + gt_bboxes[:, 3]) * .5
    gw, gh = gt_bboxes[:, 2] - gt_bboxes[:, 0], gt_bboxes[:, 3] - gt_bboxes[:, 1]
    cx, cy = (bboxes[:, 0] + bboxes[:, 2]) * .5, (bboxes[:, 1] + bboxes[:, 3]) * .5
    w, h = bboxes[:, 2] - bboxes[:, 0], bboxes[:, 3] - bboxes[:, 1]
    w_t = torch.log((gw / w).clamp(min=eps))
    h_t = torch.log((gh / h).clamp(min=eps))
    x_t = ((gcx - cx) / stride + .5).clamp(eps, 1 - eps)
    y_t = ((gcy - cy) / stride + .5).clamp(eps, 1 - eps)
    return torch.stack([x_t, y_t, w_t, h_t], dim=-1)


def npu_bbox_coder_encode_xyxy2xywh(bboxes, gt_bboxes, means=None, stds=None, is_normalized=False,
                                    normalized_scale=10000.):
    """Deltas (dx, dy, dw, dh) of gt_bboxes relative to bboxes ((N, 4) xyxy; widths x2 - x1 + 1),
    normalised by ``means``/``stds``."""
    means = [0., 0., 0., 0.] if means is None else means
    stds = [1., 1., 1., 1.] if stds is None else stds
    _check_pair(bboxes, gt_bboxes, ("bboxes", "gt_bboxes"))
    bboxes, gt_bboxes = _float(bboxes), _float(gt_bboxes)
    if is_normalized:
        bboxes = bboxes * normalized_scale
        gt_bboxes = gt_bboxes * normalized_scale
    px, py = (bboxes[:, 0] + bboxes[:, 2]) * .5, (bboxes[:, 1] + bboxes[:, 3]) * .5
    pw, ph = bboxes[:, 2] - bboxes[:, 0] + 1., bboxes[:, 3] - bboxes[:, 1] + 1.
    gx, gy = (gt_bboxes[:, 0] + gt_bboxes[:, 2]) * .5, (gt_bboxes[:, 1] + gt_bboxes[:, 3]) * .5
    gw, gh = gt_bboxes[:, 2] - gt_bboxes[:, 0] + 1., gt_bboxes[:, 3] - gt_bboxes[:, 1] + 1.
    deltas = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], dim=-1)
    return (deltas - deltas.new_tensor(means)) / deltas.new_tensor(stds)


def npu_bbox_coder_decode_xywh2xyxy(bboxes, pred_bboxes, means=None, stds=None, max_shape=None,
                                    wh_ratio_clip=16 / 1000):
    """Boxes (N, 4) xyxy from anchors ``bboxes`` and deltas ``pred_bboxes`` (the inverse of
    npu_bbox_coder_encode_xyxy2xywh); dw/dh clipped to |log(wh_ratio_clip)|, corners
    clamped to [0, W - 1] x [0, H - 1] of ``max_shape`` (H, W), default (9999, 9999)."""
    means = [0., 0., 0., 0.] if means is None else means
    stds = [1., 1., 1., 1.] if stds is None else stds
    max_shape = [9999, 9999] if max_shape is None else max_shape
    _check_pair(bboxes, pred_bboxes, ("bboxes", "pred_bboxes"))
    bboxes, pred_bboxes = _float(bboxes), _float(pred_bboxes)
    d = pred_bboxes * pred_bboxes.new_tensor(stds) + pred_bboxes.new_tensor(means)
    max_ratio = abs(math.log(wh_ratio_clip))
    dw, dh = d[:, 2].clamp(-max_ratio, max_ratio), d[:, 3].clamp(-max_ratio, max_ratio)
    px, py = (bboxes[:, 0] + bboxes[:, 2]) * .5, (bboxes[:, 1] + bboxes[:, 3]) * .5
    pw, ph = bboxes[:, 2] - bboxes[:, 0] + 1., bboxes[:, 3] - bboxes[:, 1] + 1.
    gw, gh = pw * dw.exp(), ph * dh.exp()
    gx, gy = px + pw * d[:, 0], py + ph * d[:, 1]
    x1 = (gx - gw * .5 + .5).clamp(0, max_shape[1] - 1)
    y1 = (gy - gh * .5 + .5).clamp(0, max_shape[0] - 1)
    x2 = (gx + gw * .5 - .5).clamp(0, max_shape[1] - 1)
    y2 = (gy + gh * .5 - .5).clamp(0, max_shape[0] - 1)
    return torch.stack([x1, y1, x2, y2], dim=-1)
