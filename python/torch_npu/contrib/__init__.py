"""torch_npu.contrib: fused operators and modules (``function``, ``module``, ``transfer_to_npu``).

``transfer_to_npu`` (run CUDA scripts unchanged on NPUs) is imported on request only --
``from torch_npu.contrib import transfer_to_npu`` or ``TORCH_TRANSFER_TO_NPU=1`` -- since
importing it changes ``torch`` for the whole process.

As torch_npu does, the members of ``function.npu_functional`` are also set on
``torch.nn.functional`` and those of ``module.npu_modules`` on ``torch.nn``.
"""
import torch as _torch

from . import function, module
from .function import (npu_iou, npu_ptiou, npu_giou, npu_diou, npu_ciou, npu_multiclass_nms,
                       npu_batched_multiclass_nms, npu_single_level_responsible_flags, npu_bbox_coder_encode_yolo, npu_bbox_coder_encode_xyxy2xywh,
                       npu_bbox_coder_decode_xywh2xyxy, fuse_add_softmax_dropout, roll, matmul_transpose,
                       npu_fast_condition_index_put, npu_fused_attention, npu_fused_attention_with_layernorm)
from .module import (ChannelShuffle, Prefetcher, LabelSmoothingCrossEntropy, ROIAlign, DCNv2, ModulatedDeformConv,
                     Mish, SiLU, Swish, NpuFairseqDropout, NpuCachedDropout, NpuDropPath, Focus, FastBatchNorm1d,
                     FastBatchNorm2d, FastBatchNorm3d, MultiheadAttention, PSROIPool, BiLSTM, FusedColorJitter,
                     FastSyncBatchNorm, LinearQuant, LinearA8W8Quant, LinearWeightQuant, QuantConv2d)
from .function import npu_functional as _npu_functional
from .module import npu_modules as _npu_modules


def _apply_nn_patches():
    for target, source in ((_torch.nn.functional, _npu_functional), (_torch.nn, _npu_modules)):
        for name in source.__all__:
            setattr(target, name, getattr(source, name))


_apply_nn_patches()

__all__ = [
    # from function
    "npu_iou", "npu_ptiou", "npu_giou", "npu_diou", "npu_ciou",
    "npu_multiclass_nms", "npu_batched_multiclass_nms", "npu_single_level_responsible_flags",
    "npu_bbox_coder_encode_yolo", "npu_bbox_coder_encode_xyxy2xywh", "npu_bbox_coder_decode_xywh2xyxy",
    "fuse_add_softmax_dropout", "roll", "matmul_transpose", "npu_fast_condition_index_put",
    "npu_fused_attention", "npu_fused_attention_with_layernorm",
    # from module
    "ChannelShuffle", "Prefetcher", "LabelSmoothingCrossEntropy", "ROIAlign", "ModulatedDeformConv", "DCNv2",
    "Mish", "SiLU", "Swish", "NpuFairseqDropout", "NpuCachedDropout", "NpuDropPath", "Focus",
    "FastBatchNorm1d", "FastBatchNorm2d", "FastBatchNorm3d", "MultiheadAttention",
    "PSROIPool", "BiLSTM", "FusedColorJitter", "FastSyncBatchNorm", "LinearQuant", "LinearA8W8Quant",
    "LinearWeightQuant", "QuantConv2d",
]
