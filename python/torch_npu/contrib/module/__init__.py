"""torch_npu.contrib.module: modules with torch_npu's names, signatures and defaults."""
from .channel_shuffle import ChannelShuffle
from .prefetcher import Prefetcher
from .crossentropy import LabelSmoothingCrossEntropy
from .roi_align import ROIAlign
from .deform_conv import ModulatedDeformConv, DCNv2
from .activations import Mish, SiLU, Swish
from .ensemble_dropout import NpuFairseqDropout, NpuCachedDropout
from .drop_path import NpuDropPath
from .focus import Focus
from .batchnorm import FastBatchNorm1d, FastBatchNorm2d, FastBatchNorm3d
from .npu_modules import DropoutWithByteMask
from .multihead_attention import MultiheadAttention
from .ps_roi_pooling import PSROIPool
from .bidirectional_lstm import BiLSTM
from .fusedcolorjitter import FusedColorJitter
from .sync_batchnorm import FastSyncBatchNorm
from .linear_quant import LinearQuant
from .linear_a8w8_quant import LinearA8W8Quant
from .linear_weight_quant import LinearWeightQuant
from .quant_conv2d import QuantConv2d
from .pregen_dropout import NpuPreGenDropout

__all__ = [
    "ChannelShuffle",
    "Prefetcher",
    "LabelSmoothingCrossEntropy",
    "ROIAlign",
    "ModulatedDeformConv",
    "DCNv2",
    "Mish",
    "SiLU",
    "Swish",
    "NpuFairseqDropout",
    "NpuCachedDropout",
    "NpuDropPath",
    "Focus",
    "FastBatchNorm1d",
    "FastBatchNorm2d",
    "FastBatchNorm3d",
    "DropoutWithByteMask",
    "MultiheadAttention",
    "PSROIPool",
    "BiLSTM",
    "FusedColorJitter",
    "FastSyncBatchNorm",
    "LinearQuant",
    "LinearA8W8Quant",
    "LinearWeightQuant",
    "QuantConv2d",
    "NpuPreGenDropout",
]
