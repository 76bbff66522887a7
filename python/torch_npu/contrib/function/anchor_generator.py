"""Anchor helpers of torch_npu.contrib.function (mmdetection's YOLO anchor generator)."""
import torch

import torch_npu

__all__ = ["npu_single_level_responsible_flags", "box_dtype_check"]


def box_dtype_check(box):
    """``box`` as float32 unless it already is float32 or float16 (the dtypes the kernel takes)."""
    if box.dtype not in (torch.float, torch.half):
        return box.float()
    return box


def npu_single_level_responsible_flags(featmap_size, gt_bboxes, stride, num_base_anchors):
    """Responsible flags of the anchors of one feature map level.

    Args:
        featmap_size (tuple[int]): the feature map's size (h, w).
        gt_bboxes (Tensor): ground-truth boxes, shape (n, 4), (x1, y1, x2, y2).
        stride (tuple[int]): the stride of this level.
        num_base_anchors (int): anchors per grid cell.

    Returns:
        Tensor: uint8 flags of shape [featmap_size[0] * featmap_size[1] * num_base_anchors],
        1 for the anchors of every cell that holds a box centre.
    """
    if not isinstance(gt_bboxes, torch.Tensor):
        raise TypeError(f"npu_single_level_responsible_flags: expected gt_bboxes to be a Tensor, got "
                        f"{type(gt_bboxes).__name__}")
    gt_bboxes = box_dtype_check(gt_bboxes)
    return torch_npu.npu_anchor_response_flags(gt_bboxes, list(featmap_size), list(stride), num_base_anchors)
