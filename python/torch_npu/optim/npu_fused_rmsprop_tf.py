import torch

from ._checks import check_eps, check_lr, check_non_negative
from .npu_fused_rmsprop import NpuFusedRMSprop
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedRMSpropTF"]


class NpuFusedRMSpropTF(NpuFusedOptimizerBase):
    r"""RMSprop as TensorFlow computes it (timm's RMSpropTF): ``square_avg`` starts at 1,
    ``eps`` inside the square root, optional decoupled weight decay and learning rate
    applied inside the momentum buffer. One fused kernel per parameter group and dtype.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): learning rate (default: 1e-2)
        alpha (float, optional): smoothing constant (default: 0.9)
        eps (float, optional): added inside the square root (default: 1e-10)
        weight_decay (float, optional): weight decay (default: 0)
        momentum (float, optional): momentum factor (default: 0)
        centered (bool, optional): normalise by the estimated variance (default: False)
        decoupled_decay (bool, optional): decoupled weight decay as AdamW (default: False)
        lr_in_momentum (bool, optional): learning rate scaling inside the momentum buffer,
            as TensorFlow (default: True)
    """

    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0., centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        check_lr(lr)
        check_eps(eps)
        check_non_negative("momentum", momentum)
        check_non_negative("weight_decay", weight_decay)
        check_non_negative("alpha", alpha)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered, weight_decay=weight_decay,
                        decoupled_decay=decoupled_decay, lr_in_momentum=lr_in_momentum)
        super().__init__(params, defaults)

    _state_keys = NpuFusedRMSprop._state_keys
    _init_param_state = NpuFusedRMSprop._init_param_state
    _init_group_param_state = NpuFusedRMSprop._init_group_param_state

    def _new_state(self, p, key, group):
        if key == "square_avg":
            return torch.ones_like(p, memory_format=torch.contiguous_format)  # PyTorch starts at zero
        return torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        for _, params, param, grad, state in self._combined_group(group_index):
            self._advance_step(params, state)
            torch.ops.npu._npu_fused_rmsprop_tf_step(
                param, grad, state["square_avg"], state["grad_avg"] if group["centered"] else None,
                state["momentum_buffer"] if group["momentum"] > 0 else None, float(group["lr"]),
                float(group["alpha"]), float(group["eps"]), float(group["weight_decay"]), float(group["momentum"]),
                bool(group["centered"]), bool(group.get("decoupled_decay", False)),
                bool(group.get("lr_in_momentum", False)))
