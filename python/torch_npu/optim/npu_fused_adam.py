import torch

from ._checks import check_betas, check_eps, check_lr, check_non_negative
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedAdam"]


class NpuFusedAdam(NpuFusedOptimizerBase):
    r"""Adam (``torch.optim.Adam``'s algorithm, L2 weight decay) as one fused kernel per
    parameter group and dtype over combined buffers; see :class:`NpuFusedOptimizerBase`.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): learning rate (default: 1e-3)
        betas (Tuple[float, float], optional): running-average coefficients (default: (0.9, 0.999))
        eps (float, optional): added to the denominator (default: 1e-8)
        weight_decay (float, optional): L2 penalty (default: 0)
        amsgrad (bool, optional): the AMSGrad variant (default: False)
    """
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
        check_lr(lr)
        check_eps(eps)
        check_betas(betas)
        check_non_negative("weight_decay", weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)

    def _state_keys(self, group):
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        beta1, beta2 = group["betas"]
        for _, params, param, grad, state in self._combined_group(group_index):
            step = self._advance_step(params, state)
            torch.ops.npu._npu_fused_adam_step(
                param, grad, state["exp_avg"], state["exp_avg_sq"],
                state["max_exp_avg_sq"] if group["amsgrad"] else None,
                float(group["lr"]), float(beta1), float(beta2), float(group["eps"]), float(group["weight_decay"]),
                int(step), bool(group["amsgrad"]), bool(group.get("maximize", False)), self._decoupled)
