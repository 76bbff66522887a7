"""Multi-class NMS (torch_npu.contrib.function.nms) on torch_npu.npu_nms_v4 per class."""
import torch

__all__ = ["npu_multiclass_nms", "npu_batched_multiclass_nms"]


def _single_image_nms(bboxes, scores, score_thr, nms_thr, max_num):
    """bboxes (n, #class, 4), scores (n, #class) -> boxes+score (max_num, 5), classes (max_num,)
    zero-padded, the kept boxes of every class ordered by descending score."""
    num_classes = scores.shape[1]
    kept_boxes, kept_scores, kept_classes = [], [], []
    iou_thr = torch.tensor(float(nms_thr), device=scores.device)
    sc_thr = torch.tensor(float(score_thr), device=scores.device)
    for c in range(num_classes):
        boxes_c = bboxes[:, c].contiguous()
        scores_c = scores[:, c].contiguous()
        idx, _ = torch.ops.npu.npu_nms_v4(boxes_c, scores_c, max_num, iou_thr, sc_thr)
        idx = idx.long()
        kept_boxes.append(boxes_c[idx])
        kept_scores.append(scores_c[idx])
        kept_classes.append(torch.full((idx.numel(),), c, dtype=scores.dtype, device=scores.device))
    boxes = torch.cat(kept_boxes)
    sc = torch.cat(kept_scores)
    cls = torch.cat(kept_classes)
    order = torch.sort(sc, descending=True, stable=True).indices[:max_num]
    out = torch.zeros((max_num, 5), dtype=scores.dtype, device=scores.device)
    labels = torch.zeros((max_num,), dtype=scores.dtype, device=scores.device)
    k = order.numel()
    out[:k, :4] = boxes[order]
    out[:k, 4] = sc[order]
    labels[:k] = cls[order]
    return out, labels


def npu_multiclass_nms(multi_bboxes, multi_scores, score_thr=0.05, nms_thr=0.45, max_num=50, score_factors=None):
    """NMS of multi-class boxes: multi_bboxes (n, #class, 4) or (n, 4), multi_scores
    (n, #class + 1) whose last column (background) is ignored. Boxes with a score above
    ``score_thr``; the ``max_num`` best after per-class NMS, zero-padded.

    Returns (dets (max_num, 5) [x1, y1, x2, y2, score], labels (max_num,))."""
    if max_num is None or max_num < 0:
        raise ValueError(f"max_num must be a non-negative int (memory is allocated up front), got {max_num}")
    num_classes = multi_scores.size(1) - 1
    num_boxes = multi_scores.size(0)
    scores = multi_scores[:, :-1]
    if score_factors is not None:
        scores = scores * score_factors[:, None]
    bboxes = multi_bboxes.reshape(num_boxes, -1, 4).expand(num_boxes, num_classes, 4)
    return _single_image_nms(bboxes, scores, score_thr, nms_thr, max_num)


def npu_batched_multiclass_nms(multi_bboxes, multi_scores, score_thr=0.05, nms_thr=0.45, max_num=50,
                               score_factors=None):
    """npu_multiclass_nms over a batch: multi_bboxes (bs, n, #class, 4) or (bs, n, 4),
    multi_scores (bs, n, #class + 1). Returns (dets (bs, max_num, 5), labels (bs, max_num))."""
    if max_num is None or max_num < 0:
        raise ValueError(f"max_num must be a non-negative int (memory is allocated up front), got {max_num}")
    batch_size, num_boxes = multi_scores.shape[:2]
    num_classes = multi_scores.size(2) - 1
    scores = multi_scores[..., :-1]
    if score_factors is not None:
        scores = scores * score_factors[..., None]
    bboxes = multi_bboxes.reshape(batch_size, num_boxes, -1, 4).expand(batch_size, num_boxes, num_classes, 4)
    results = [_single_image_nms(bboxes[b], scores[b], score_thr, nms_thr, max_num) for b in range(batch_size)]
    return torch.stack([r[0] for r in results]), torch.stack([r[1] for r in results])
