"""IoU family (torch_npu.contrib.function.iou): npu_iou/npu_ptiou on (N, 4) xyxy boxes,
npu_giou/npu_diou/npu_ciou on boxes as columns ((4, n), xywh when ``trans``)."""
import math
import warnings

import torch

__all__ = ["npu_iou", "npu_ptiou", "npu_giou", "npu_diou", "npu_ciou"]


def _box_dtype_check(box):
    if box.dtype not in (torch.float16, torch.float32, torch.float64):
        return box.float()
    return box


def npu_iou(boxes1, boxes2, mode="ptiou", is_normalized=False, normalized_scale=100.):
    """IoU of every pair of ``boxes1`` (N, 4) and ``boxes2`` (M, 4), xyxy: an (N, M) tensor.

    ``mode`` "iou" or "ptiou" (both the plain IoU here); ``is_normalized`` scales the
    coordinates by ``normalized_scale`` first, as torch_npu does."""
    warnings.warn("torch_npu.contrib.npu_iou is deprecated. "
                  "Please use torch_npu.npu_iou or torch_npu.npu_ptiou as a replacement.", FutureWarning)
    if mode not in ("iou", "ptiou"):
        raise ValueError(f"Expected mode in [iou, ptiou], got {mode!r}")
    boxes1 = _box_dtype_check(boxes1)
    boxes2 = _box_dtype_check(boxes2)
    if is_normalized:
        boxes1 = boxes1 * normalized_scale
        boxes2 = boxes2 * normalized_scale
    op = torch.ops.npu.npu_iou if mode == "iou" else torch.ops.npu.npu_ptiou
    return op(boxes2, boxes1)  # the kernel's [gt, box] layout: here [N, M]


npu_ptiou = npu_iou


def npu_giou(boxes1, boxes2, is_permuted=True):
    """GIoU of ``boxes1[i]`` and ``boxes2[i]`` (xywh; (n, 4), permuted to columns when
    ``is_permuted``): a (1, n) tensor, differentiable (torch_npu.npu_giou's backward)."""
    warnings.warn("torch_npu.contrib.npu_giou is deprecated. "
                  "Please use torch_npu.npu_giou as a replacement.", FutureWarning)
    if boxes1.shape != boxes2.shape:
        raise ValueError(f"Expected boxes1.shape == boxes2.shape, got {tuple(boxes1.shape)} and "
                         f"{tuple(boxes2.shape)}")
    boxes1 = _box_dtype_check(boxes1)
    boxes2 = _box_dtype_check(boxes2)
    if is_permuted:
        boxes1 = boxes1.permute(1, 0)
        boxes2 = boxes2.permute(1, 0)
    return torch.ops.npu.npu_giou(boxes1.contiguous(), boxes2.contiguous(), trans=True, is_cross=False)


def _corners(boxes, trans):
    if trans:
        x, y, w, h = boxes.unbind(0)
        return x - w / 2, y - h / 2, x + w / 2, y + h / 2
    return boxes.unbind(0)


def _pairwise(boxes1, boxes2, is_cross):
    """Columns of boxes1 (4, n) against boxes2 (4, m): one-to-one (1, n) or every pair (m, n)."""
    if is_cross:
        return boxes1[:, None, :], boxes2[:, :, None]
    if boxes1.shape != boxes2.shape:
        raise ValueError(f"with is_cross=False expected boxes1.shape == boxes2.shape, got {tuple(boxes1.shape)} "
                         f"and {tuple(boxes2.shape)}")
    return boxes1[:, None, :], boxes2[:, None, :]


def _iou_terms(boxes1, boxes2, trans, is_cross, mode, eps=1e-9):
    if boxes1.dim() != 2 or boxes1.shape[0] != 4 or boxes2.dim() != 2 or boxes2.shape[0] != 4:
        raise ValueError(f"expected boxes of shape (4, n) and (4, m), got {tuple(boxes1.shape)} and "
                         f"{tuple(boxes2.shape)}")
    if mode not in (0, 1):
        raise ValueError(f"expected mode 0 (iou) or 1 (iof), got {mode}")
    b1, b2 = _pairwise(boxes1, boxes2, is_cross)
    ax1, ay1, ax2, ay2 = _corners(b1, trans)
    bx1, by1, bx2, by2 = _corners(b2, trans)
    inter = (torch.min(ax2, bx2) - torch.max(ax1, bx1)).clamp(min=0) * \
            (torch.min(ay2, by2) - torch.max(ay1, by1)).clamp(min=0)
    a1 = (ax2 - ax1) * (ay2 - ay1)
    a2 = (bx2 - bx1) * (by2 - by1)
    union = (a1 + a2 - inter if mode == 0 else a2) + eps
    iou = inter / union
    cw = torch.max(ax2, bx2) - torch.min(ax1, bx1)
    ch = torch.max(ay2, by2) - torch.min(ay1, by1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((ax1 + ax2 - bx1 - bx2) ** 2 + (ay1 + ay2 - by1 - by2) ** 2) / 4
    return iou, rho2, c2, (ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1)


def npu_diou(boxes1, boxes2, trans=True, is_cross=False, mode=0):
    """DIoU = IoU - rho^2 / c^2 (rho: distance of the centres, c: diagonal of the enclosing
    box) of boxes as columns (4, n); (1, n), or (m, n) when ``is_cross``."""
    warnings.warn("torch_npu.contrib.function.npu_diou is deprecated. "
                  "Please use torch_npu.npu_diou as a replacement.", FutureWarning)
    iou, rho2, c2, _ = _iou_terms(boxes1, boxes2, trans, is_cross, mode)
    return iou - rho2 / c2


def npu_ciou(boxes1, boxes2, trans=True, is_cross=False, mode=0):
    """CIoU = DIoU - alpha * v, v = 4/pi^2 (atan(w2/h2) - atan(w1/h1))^2 and
    alpha = v / (1 - IoU + v) (no gradient through alpha), of boxes as columns (4, n)."""
    warnings.warn("torch_npu.contrib.function.npu_ciou is deprecated. "
                  "Please use torch_npu.npu_ciou as a replacement.", FutureWarning)
    iou, rho2, c2, (w1, h1, w2, h2) = _iou_terms(boxes1, boxes2, trans, is_cross, mode)
    v = (4 / math.pi ** 2) * (torch.atan(w2 / (h2 + 1e-9)) - torch.atan(w1 / (h1 + 1e-9))) ** 2
    with torch.no_grad():
        alpha = v / (1 - iou + v + 1e-9)
    return iou - rho2 / c2 - alpha * v
