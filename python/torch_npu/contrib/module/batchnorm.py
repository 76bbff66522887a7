import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm as _TorchBatchNorm
from torch.nn.modules.batchnorm import _NormBase as _TorchNormBase

__all__ = ["FastBatchNorm1d", "FastBatchNorm2d", "FastBatchNorm3d"]


class _NormBase(_TorchNormBase):
    r"""torch's ``_NormBase`` with torch_npu's ``num_batches_tracked``: an int32 buffer (torch's
    is int64), which Ascend updates without an int64 kernel. Everything else is torch's."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if self.track_running_stats:
            self.register_buffer("num_batches_tracked",
                                 torch.tensor(0, dtype=torch.int32, device=self.running_mean.device))


class _BatchNorm(_NormBase, _TorchBatchNorm):
    r"""Batch normalisation over dimension 1 with an int32 ``num_batches_tracked`` (torch_npu's
    ``_BatchNorm``): the forward is torch's ``_BatchNorm.forward``; subclasses define
    ``_check_input_dim``."""


class FastBatchNorm1d(nn.BatchNorm1d, _BatchNorm):
    """BatchNorm1d with torch_npu's name and signature; ``num_batches_tracked`` is int32."""


class FastBatchNorm2d(nn.BatchNorm2d, _BatchNorm):
    """BatchNorm2d with torch_npu's name and signature; ``num_batches_tracked`` is int32."""


class FastBatchNorm3d(nn.BatchNorm3d, _BatchNorm):
    """BatchNorm3d with torch_npu's name and signature; ``num_batches_tracked`` is int32."""
