import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["FastSyncBatchNorm"]


class FastSyncBatchNorm(nn.SyncBatchNorm):
    """SyncBatchNorm with torch_npu's name and signature (num_features, eps=1e-5, momentum=0.1,
    affine=True, track_running_stats=True, process_group=None, device=None, dtype=None).

    In training with an initialised process group of more than one rank, the batch statistics
    (per-channel sum, sum of squares and count) are all-reduced over ``process_group`` (the
    world by default; hccl on npu), through the differentiable all_reduce, so the input
    gradient also sums every rank's contribution, as SyncBatchNorm's; weight and bias
    gradients stay local (DDP reduces them). Otherwise it is BatchNorm over the local batch.
    ``convert_sync_batchnorm`` returns torch.nn.SyncBatchNorm layers, as torch_npu's does.
    """

    def forward(self, input):
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        group = self.process_group or (dist.group.WORLD if dist.is_available() and dist.is_initialized() else None)
        if not (self.training and group is not None and dist.get_world_size(group) > 1):
            return super().forward(input)  # torch's local BatchNorm path (no synchronisation needed)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        return _sync_batch_norm(input, self.weight, self.bias,
                                self.running_mean if self.track_running_stats else None,
                                self.running_var if self.track_running_stats else None,
                                self.eps, momentum, group)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)


def _sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group):
    from torch.distributed.nn.functional import all_reduce

    C = x.size(1)
    dims = [d for d in range(x.dim()) if d != 1]
    xf = x.float()
    count = torch.full((1,), x.numel() // C, dtype=torch.float32, device=x.device)
    stats = all_reduce(torch.cat([xf.sum(dims), (xf * xf).sum(dims), count]), group=group)
    total = stats[-1]
    if total.item() <= 1:
        raise ValueError(f"FastSyncBatchNorm: expected more than 1 value per channel over all ranks when training, "
                         f"got input of size {list(x.shape)} and {int(total.item())} values in total")
    mean = stats[:C] / total
    var = (stats[C:2 * C] / total - mean * mean).clamp(min=0)  # biased, for normalisation
    shape = [1, C] + [1] * (x.dim() - 2)
    y = (xf - mean.view(shape)) * torch.rsqrt(var + eps).view(shape)
    if weight is not None:
        y = y * weight.view(shape) + bias.view(shape)
    if running_mean is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.dtype), alpha=momentum)
            unbiased = var.detach() * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return y.to(x.dtype)
