import math

import torch
from torch.optim.optimizer import required

from ._checks import check_non_negative
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedSGD"]


class NpuFusedSGD(NpuFusedOptimizerBase):
    r"""SGD with optional (Nesterov) momentum (``torch.optim.SGD``'s algorithm) as one fused
    kernel per parameter group and dtype over combined buffers.

    Args:
        params (iterable): parameters or dicts defining parameter groups
        lr (float): learning rate
        momentum (float, optional): momentum factor (default: 0)
        dampening (float, optional): dampening for momentum (default: 0)
        weight_decay (float, optional): L2 penalty (default: 0)
        nesterov (bool, optional): Nesterov momentum (default: False)
    """

    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        if lr is not required and lr < 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr))
        check_non_negative("momentum", momentum)
        check_non_negative("weight_decay", weight_decay)
        if nesterov and (momentum <= 0.0 or not math.isclose(dampening, 0.0, abs_tol=1e-15)):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def _state_keys(self, group):
        return ["momentum_buffer"] if group["momentum"] != 0 else []

    def _init_param_state(self, p, group):
        state = self.state[p]
        if group["momentum"] != 0 and state.get("momentum_buffer") is None:
            # The first step sets the buffer to the (decayed) grad: the kernel's first_step.
            state.pop("momentum_buffer", None)
            state["_first"] = True
        super()._init_param_state(p, group)
        state.pop("step", None)  # SGD keeps no step count, as torch.optim.SGD

    def _maybe_init_combined_states(self):
        super()._maybe_init_combined_states()
        for group_states, lists in zip(self.combined_param_states_indexed_by_group, self.params_lists_indexed_by_group):
            for state, params in zip(group_states, lists):
                state["first"] = any([self.state[p].pop("_first", False) for p in params])

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        momentum = float(group["momentum"])
        for _, _, param, grad, state in self._combined_group(group_index):
            torch.ops.npu._npu_fused_sgd_step(
                param, grad, state["momentum_buffer"] if momentum != 0 else None, float(group["lr"]), momentum,
                float(group["dampening"]), float(group["weight_decay"]), bool(group["nesterov"]),
                bool(state.get("first", False)))
            state["first"] = False
