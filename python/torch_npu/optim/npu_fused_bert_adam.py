import math

import torch
from torch.optim.optimizer import required

from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedBertAdam"]

WARMUP_DEFAULT = 0.002
DEGREE_DEFAULT = 0.5


def _warmup_cosine(x, warmup=WARMUP_DEFAULT):
    return x / warmup if x < warmup else 0.5 * (1.0 + math.cos(math.pi * x))


def _warmup_constant(x, warmup=WARMUP_DEFAULT):
    return x / warmup if x < warmup else 1.0


def _warmup_linear(x, warmup=WARMUP_DEFAULT):
    return x / warmup if x < warmup else max((x - 1.) / (warmup - 1.), 0.)


def _warmup_poly(x, warmup=WARMUP_DEFAULT, degree=DEGREE_DEFAULT):
    return x / warmup if x < warmup else (1.0 - x) ** degree


SCHEDULES = {
    "warmup_cosine": _warmup_cosine,
    "warmup_constant": _warmup_constant,
    "warmup_linear": _warmup_linear,
    "warmup_poly": _warmup_poly,
}


class NpuFusedBertAdam(NpuFusedOptimizerBase):
    r"""BERT's Adam (pytorch-pretrained-bert's BertAdam: no bias correction, decoupled weight
    decay added to the update, learning-rate warm-up schedules, grads clipped to
    ``max_grad_norm`` per parameter group and dtype) as one fused kernel per group and dtype.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float): learning rate
        warmup (float, optional): portion of t_total for the warm-up, -1 means none (default: -1)
        t_total (int, optional): total number of steps of the schedule, -1 means constant
            learning rate (default: -1)
        schedule (str, optional): one of ``warmup_linear`` (default), ``warmup_cosine``,
            ``warmup_constant``, ``warmup_poly``
        b1 (float, optional): Adam's beta1 (default: 0.9)
        b2 (float, optional): Adam's beta2 (default: 0.999)
        e (float, optional): Adam's epsilon (default: 1e-6)
        weight_decay (float, optional): weight decay (default: 0.01)
        max_grad_norm (float, optional): maximum norm of the grads, -1 means no clipping
            (default: 1.0)
    """

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        if lr is not required and lr < 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr))
        if (warmup < 0.0 and warmup != -1) or warmup >= 1.0:
            raise ValueError("Invalid warmup: {}".format(warmup))
        if schedule not in SCHEDULES:
            raise ValueError("Invalid schedule parameter: {}".format(schedule))
        if b1 < 0.0 or b1 >= 1.0:
            raise ValueError("Invalid b1 parameter: {}".format(b1))
        if b2 < 0.0 or b2 >= 1.0:
            raise ValueError("Invalid b2 parameter: {}".format(b2))
        if e < 0.0:
            raise ValueError("Invalid epsilon value: {}".format(e))
        defaults = dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        self.max_grad_norm = max_grad_norm
        super().__init__(params, defaults)

    def _state_keys(self, group):
        return ["exp_avg", "exp_avg_sq"]

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        for _, params, param, grad, state in self._combined_group(group_index):
            lr = group["lr"]
            if group["t_total"] != -1:
                lr = lr * SCHEDULES[group["schedule"]](state["step"] / group["t_total"], group["warmup"])
            torch.ops.npu._npu_fused_bert_adam_step(
                param, grad, state["exp_avg"], state["exp_avg_sq"], float(lr), float(group["b1"]),
                float(group["b2"]), float(group["e"]), float(group["weight_decay"]), float(self.max_grad_norm))
            self._advance_step(params, state)
