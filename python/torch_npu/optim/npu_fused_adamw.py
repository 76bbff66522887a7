from .npu_fused_adam import NpuFusedAdam

__all__ = ["NpuFusedAdamW"]


class NpuFusedAdamW(NpuFusedAdam):
    r"""AdamW (``torch.optim.AdamW``'s algorithm, decoupled weight decay) as one fused kernel
    per parameter group and dtype over combined buffers; see :class:`NpuFusedOptimizerBase`.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float, optional): learning rate (default: 1e-3)
        betas (Tuple[float, float], optional): running-average coefficients (default: (0.9, 0.999))
        eps (float, optional): added to the denominator (default: 1e-8)
        weight_decay (float, optional): decoupled weight decay coefficient (default: 1e-2)
        amsgrad (bool, optional): the AMSGrad variant (default: False)
    """
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
