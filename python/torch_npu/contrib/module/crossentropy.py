import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LabelSmoothingCrossEntropy"]


class LabelSmoothingCrossEntropy(nn.Module):
    """Cross entropy against smoothed one-hot labels: on_value = 1 - smooth_factor,
    off_value = smooth_factor / (num_classes - 1); the batch mean, in float32."""

    def __init__(self, num_classes=1000, smooth_factor=0.):
        super().__init__()
        self.num_classes = num_classes
        self.on_value = 1.0 - smooth_factor
        self.off_value = 1.0 * smooth_factor / (num_classes - 1)

    def forward(self, pred, target):
        one_hot = torch.full_like(pred, self.off_value)
        one_hot.scatter_(1, target.long().unsqueeze(1), self.on_value)
        loss = -(one_hot * F.log_softmax(pred, dim=1)).sum(dim=1)
        return torch.mean(loss, [0], keepdim=False, dtype=torch.float32)
