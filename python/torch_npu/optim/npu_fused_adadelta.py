import torch

from ._checks import check_eps, check_lr, check_non_negative
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedAdadelta"]


class NpuFusedAdadelta(NpuFusedOptimizerBase):
    r"""Adadelta (``torch.optim.Adadelta``'s algorithm) as one fused kernel per parameter
    group and dtype over combined buffers.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): coefficient that scales delta (default: 1.0)
        rho (float, optional): running-average coefficient (default: 0.9)
        eps (float, optional): added to the denominator (default: 1e-6)
        weight_decay (float, optional): L2 penalty (default: 0)
    """

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0):
        check_lr(lr)
        if rho < 0.0 or rho > 1.0:
            raise ValueError("Invalid rho value: {}".format(rho))
        check_eps(eps)
        check_non_negative("weight_decay", weight_decay)
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _state_keys(self, group):
        return ["square_avg", "acc_delta"]

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        for _, params, param, grad, state in self._combined_group(group_index):
            self._advance_step(params, state)
            torch.ops.npu._npu_fused_adadelta_step(
                param, grad, state["square_avg"], state["acc_delta"], float(group["lr"]), float(group["rho"]),
                float(group["eps"]), float(group["weight_decay"]))
