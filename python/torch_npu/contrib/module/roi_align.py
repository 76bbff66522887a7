import torch
from torch import nn
from torch.nn.modules.utils import _pair

__all__ = ["ROIAlign"]


class ROIAlign(nn.Module):
    """RoI Align on torch_npu.npu_roi_align (differentiable in the features).

    Args:
        output_size: (h, w) of the pooled output, or one int.
        spatial_scale: the features' scale relative to the rois' coordinates.
        sampling_ratio: samples per bin and axis (0: ceil(bin size)).
        aligned: shift the box by -0.5 pixel (roi_end_mode 3) as Detectron2's aligned
            RoIAlign; False is the legacy mode (roi_end_mode 0). Default True (torchvision's is False).
    forward(input_tensor (N, C, H, W), rois (K, 5) [batch index, x1, y1, x2, y2]) -> (K, C, h, w).
    """

    def __init__(self, output_size, spatial_scale, sampling_ratio, aligned=True):
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input_tensor, rois):
        if input_tensor.dim() != 4 or rois.dim() != 2 or rois.size(1) != 5:
            raise ValueError(f"ROIAlign: expected input (N, C, H, W) and rois (K, 5), got "
                             f"{tuple(input_tensor.shape)} and {tuple(rois.shape)}")
        return torch.ops.npu.npu_roi_align(input_tensor, rois.to(input_tensor.dtype), float(self.spatial_scale),
                                           self.output_size[0], self.output_size[1], int(self.sampling_ratio),
                                           3 if self.aligned else 0)

    def __repr__(self):
        return (f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned})")
