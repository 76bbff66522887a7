import torch

from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedAdamP"]


class NpuFusedAdamP(NpuFusedOptimizerBase):
    r"""AdamP (`Slowing Down the Weight Norm Increase in Momentum-based Optimizers`): Adam
    whose update of a scale-invariant weight (dim > 1, cosine similarity of grad and weight
    below ``delta / sqrt(fan)``, channel-wise then layer-wise) is projected off the weight's
    direction, with weight decay scaled by ``wd_ratio``. One fused kernel per parameter
    group and dtype; the per-channel norms are reduced inside the kernel.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): learning rate (default: 1e-3)
        betas (Tuple[float, float], optional): running-average coefficients (default: (0.9, 0.999))
        eps (float, optional): added to the denominator (default: 1e-8)
        weight_decay (float, optional): decoupled weight decay (default: 0)
        delta (float, optional): threshold of the cosine similarity (default: 0.1)
        wd_ratio (float, optional): weight-decay ratio of projected weights (default: 0.1)
        nesterov (bool, optional): Nesterov momentum (default: False)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, delta=0.1, wd_ratio=0.1,
                 nesterov=False):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta, wd_ratio=wd_ratio,
                        nesterov=nesterov)
        super().__init__(params, defaults)

    def _state_keys(self, group):
        return ["exp_avg", "exp_avg_sq"]

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        beta1, beta2 = group["betas"]
        for _, params, param, grad, state in self._combined_group(group_index):
            step = self._advance_step(params, state)
            torch.ops.npu._npu_fused_adamp_step(
                param, grad, state["exp_avg"], state["exp_avg_sq"], [p.numel() for p in params],
                [p.shape[0] if p.dim() > 1 else 0 for p in params], float(group["lr"]), float(beta1), float(beta2),
                float(group["eps"]), float(group["weight_decay"]), float(group["delta"]), float(group["wd_ratio"]),
                int(step), bool(group["nesterov"]))
