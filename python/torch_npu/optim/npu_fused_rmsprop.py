import torch

from ._checks import check_eps, check_lr, check_non_negative
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedRMSprop"]


class NpuFusedRMSprop(NpuFusedOptimizerBase):
    r"""RMSprop (``torch.optim.RMSprop``'s algorithm) as one fused kernel per parameter group
    and dtype over combined buffers.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): learning rate (default: 1e-2)
        alpha (float, optional): smoothing constant (default: 0.99)
        eps (float, optional): added to the denominator (default: 1e-8)
        weight_decay (float, optional): L2 penalty (default: 0)
        momentum (float, optional): momentum factor (default: 0)
        centered (bool, optional): normalise by the estimated variance (default: False)
    """

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False):
        check_lr(lr)
        check_eps(eps)
        check_non_negative("momentum", momentum)
        check_non_negative("weight_decay", weight_decay)
        check_non_negative("alpha", alpha)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("momentum", 0)
            group.setdefault("centered", False)

    def _state_keys(self, group):
        keys = ["square_avg"]
        if group["momentum"] > 0:
            keys.append("momentum_buffer")
        if group["centered"]:
            keys.append("grad_avg")
        return keys

    def _init_param_state(self, p, momentum, centered):
        """Creates ``p``'s state (``step``, ``square_avg``, ``momentum_buffer`` when momentum > 0,
        ``grad_avg`` when centered), or re-allocates a loaded one (torch_npu's signature)."""
        NpuFusedOptimizerBase._init_param_state(self, p, {"momentum": momentum, "centered": centered})

    def _init_group_param_state(self, p, group):
        self._init_param_state(p, group["momentum"], group["centered"])

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        for _, params, param, grad, state in self._combined_group(group_index):
            self._advance_step(params, state)
            torch.ops.npu._npu_fused_rmsprop_step(
                param, grad, state["square_avg"], state["grad_avg"] if group["centered"] else None,
                state["momentum_buffer"] if group["momentum"] > 0 else None, float(group["lr"]),
                float(group["alpha"]), float(group["eps"]), float(group["weight_decay"]), float(group["momentum"]),
                bool(group["centered"]))
