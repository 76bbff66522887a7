"""``torch_npu.utils.syncbatchnorm``: the autograd function of synchronized batch norm.

torch_npu's ``SyncBatchNorm`` function is PyTorch's (``torch.nn.SyncBatchNorm`` calls it
across the process group); statistics are gathered over ``process_group`` with the ``hccl``
backend on npu tensors.
"""

from torch.nn.modules._functions import SyncBatchNorm as _TorchSyncBatchNorm

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_TorchSyncBatchNorm):
    @staticmethod
    def forward(self, input_tensor, weight, bias, running_mean, running_var, eps, momentum,
                process_group, world_size):
        return _TorchSyncBatchNorm.forward(self, input_tensor, weight, bias, running_mean,
                                           running_var, eps, momentum, process_group, world_size)

    @staticmethod
    def backward(self, grad_output):
        return _TorchSyncBatchNorm.backward(self, grad_output)
