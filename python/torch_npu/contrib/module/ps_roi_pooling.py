from torch import nn

import torch

__all__ = ["PSROIPool"]


class PSROIPool(nn.Module):
    """Position-sensitive RoI pooling (R-FCN) on torch_npu.npu_ps_roi_pooling (differentiable in
    the features).

    Args:
        pooled_height, pooled_width: the output grid; must equal group_size.
        spatial_scale: the features' scale relative to the rois' coordinates.
        group_size: the side of the grid of position-sensitive score maps.
        output_dim: output channels; the features have output_dim * group_size^2 channels.
    forward(features (N, output_dim * group_size^2, H, W), rois (N, 5, R) [batch index, x1, y1, x2, y2])
        -> (N * R, output_dim, group_size, group_size).
    """

    def __init__(self, pooled_height=7, pooled_width=7, spatial_scale=1 / 16.0, group_size=7, output_dim=22):
        super().__init__()
        if not pooled_height == pooled_width == group_size:
            raise ValueError("PSROIPool: only pooled_height == pooled_width == group_size is supported, got "
                             f"pooled_height={pooled_height}, pooled_width={pooled_width}, group_size={group_size}")
        self.pooled_height = pooled_height
        self.pooled_width = pooled_width
        self.group_size = group_size
        self.spatial_scale = spatial_scale
        self.output_dim = output_dim

    def forward(self, features, rois):
        return torch.ops.npu.npu_ps_roi_pooling(features, rois, float(self.spatial_scale), self.group_size,
                                                self.output_dim)

    def __repr__(self):
        return (f"{self.__class__.__name__}(pooled_width={self.pooled_width}, pooled_height={self.pooled_height}, "
                f"spatial_scale={self.spatial_scale}, group_size={self.group_size}, output_dim={self.output_dim})")
