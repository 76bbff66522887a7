from torch import nn

__all__ = ["FastBatchNorm1d", "FastBatchNorm2d", "FastBatchNorm3d"]

# torch_npu keeps num_batches_tracked in int32 for Ascend; the results are BatchNorm's.


class FastBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d with torch_npu's name and signature."""


class FastBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d with torch_npu's name and signature."""


class FastBatchNorm3d(nn.BatchNorm3d):
    """BatchNorm3d with torch_npu's name and signature."""
