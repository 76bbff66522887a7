"""torch_npu's module path of the FastBatchNorm family."""
from .batchnorm import _BatchNorm, _NormBase, FastBatchNorm1d, FastBatchNorm2d, FastBatchNorm3d
from .sync_batchnorm import FastSyncBatchNorm

__all__ = []
