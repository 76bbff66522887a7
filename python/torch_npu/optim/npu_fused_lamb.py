import torch

from ._checks import check_betas, check_eps, check_lr
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedLamb"]


class NpuFusedLamb(NpuFusedOptimizerBase):
    r"""LAMB (`Large Batch Optimization for Deep Learning`, as torch_npu computes it: Adam
    moments without bias correction, per-parameter trust ratio ``min(|p|, 10) / |update|``)
    as one fused kernel per parameter group and dtype; the per-parameter norms are reduced
    inside the kernel.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): learning rate (default: 1e-3)
        betas (Tuple[float, float], optional): running-average coefficients (default: (0.9, 0.999))
        eps (float, optional): added to the denominator (default: 1e-6)
        weight_decay (float, optional): weight decay (default: 0)
        adam (bool, optional): trust ratio always 1, which makes this Adam without bias
            correction (default: False)
        use_global_grad_norm (bool, optional): divide the grads by their global 2-norm
            (over all groups) when it exceeds 1 (default: False)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0, adam=False,
                 use_global_grad_norm=False):
        check_lr(lr)
        check_betas(betas)
        check_eps(eps)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.adam = adam
        self.use_global_grad_norm = use_global_grad_norm
        self.global_grad_norm = torch.ones(1)
        super().__init__(params, defaults)

    def _state_keys(self, group):
        return ["exp_avg", "exp_avg_sq"]

    def _before_group_steps(self):
        self._grad_scale = 1.0
        if self.use_global_grad_norm:
            grads = [g for g in self.get_combined_grads() if g is not None]
            norms = torch.stack([torch.linalg.vector_norm(g, 2, dtype=torch.float32) for g in grads])
            self.global_grad_norm = torch.linalg.vector_norm(norms, 2)
            norm = float(self.global_grad_norm)
            if norm > 1:
                self._grad_scale = 1.0 / norm

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        beta1, beta2 = group["betas"]
        for _, params, param, grad, state in self._combined_group(group_index):
            self._advance_step(params, state)
            torch.ops.npu._npu_fused_lamb_step(
                param, grad, state["exp_avg"], state["exp_avg_sq"], [p.numel() for p in params], float(group["lr"]),
                float(beta1), float(beta2), float(group["eps"]), float(group["weight_decay"]),
                float(self._grad_scale), bool(self.adam))
