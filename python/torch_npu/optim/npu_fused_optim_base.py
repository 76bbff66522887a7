"""The base of torch_npu's fused optimizers: combined parameter, grad and state buffers."""
import math
from collections import defaultdict

import torch
from torch.optim.optimizer import Optimizer

from torch_npu.utils import get_part_combined_tensor, npu_combine_tensors

__all__ = ["NpuFusedOptimizerBase"]

# The dtypes torch_npu's fused optimizers take; index = position in the combined lists.
_DTYPES = (torch.float32, torch.float16)


class NpuFusedOptimizerBase(Optimizer):
    r"""Base class of the ``NpuFused*`` optimizers.

    On the first :meth:`step` (or :meth:`zero_grad` / :meth:`clip_grad_norm_fused_`), the
    parameters that have a grad are combined, per dtype (float32, float16) over all
    parameter groups, into one flat npu buffer: each parameter keeps its identity but its
    storage becomes a slice of the buffer. Their grads are combined the same way, and the
    optimizer states into flat buffers parallel to them, so that a step is one fused kernel
    per parameter group and dtype.

    Constraints (as torch_npu documents them):

    * build the optimizer after the model is on npu, and do not re-create or re-assign the
      parameters or their grads afterwards (``p.data = ...``, ``p.grad = None``, replacing
      a module's parameter): such a tensor leaves the combined buffer and is no longer
      updated;
    * parameters without a grad at the first step are not combined and never updated;
    * ``zero_grad(set_to_none=True)`` on the optimizer is not supported (a ValueError).
      A module's ``zero_grad()`` (set_to_none=True by default, as Hugging Face's Trainer
      calls it) is: the grads backward then creates are copied into the combined buffer at
      the next step, and a combined parameter left without a grad steps with a zero grad,
      as after this optimizer's own ``zero_grad()``;
    * parameters must be float32 or float16.
    """

    def __init__(self, params, default):
        super().__init__(params, default)
        self.combined_params_indexed_by_group = None
        self.combined_grads_indexed_by_group = None
        self.combined_param_states_indexed_by_group = None
        self.params_lists_indexed_by_group = []
        self.params_all_group = [[] for _ in _DTYPES]
        self.params_all_group_combined = [None] * len(_DTYPES)
        self.grads_all_group_combined = [None] * len(_DTYPES)
        self._combined_grads = [[] for _ in _DTYPES]  # per dtype, parallel to params_all_group
        self.is_params_grads_combined = False
        self.is_states_combined = False
        self.is_fused_optimizer = True

    # ---- combining ---------------------------------------------------------------------
    def _maybe_init_combined_params_and_grads(self):
        if self.is_params_grads_combined:
            return
        lists_each_group, sizes_each_group = [], []
        params_all = [[] for _ in _DTYPES]
        grads_all = [[] for _ in _DTYPES]
        for group in self.param_groups:
            lists = [[] for _ in _DTYPES]
            sizes = [0] * len(_DTYPES)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("{} does not support sparse gradients".format(type(self).__name__))
                if p.dtype not in _DTYPES:
                    raise TypeError("Fused optimizer's parameters must be either float32 or float16, "
                                    "but received {}".format(p.dtype))
                if p.device.type != "npu":
                    raise RuntimeError("{}: parameters must be on npu, got one on {}".format(
                        type(self).__name__, p.device))
                if p.grad.dtype != p.dtype or p.grad.shape != p.shape or not p.grad.is_contiguous():
                    p.grad = p.grad.to(p.dtype).contiguous().view(p.shape)
                d = _DTYPES.index(p.dtype)
                lists[d].append(p)
                sizes[d] += p.numel()
            for d in range(len(_DTYPES)):
                params_all[d] += lists[d]
                grads_all[d] += [p.grad for p in lists[d]]
            lists_each_group.append(lists)
            sizes_each_group.append(sizes)

        self.params_lists_indexed_by_group = lists_each_group
        self.params_all_group = params_all
        self._combined_grads = grads_all
        for d in range(len(_DTYPES)):
            self.params_all_group_combined[d] = npu_combine_tensors(params_all[d])
            self.grads_all_group_combined[d] = npu_combine_tensors(grads_all[d])

        offsets = [0] * len(_DTYPES)
        self.combined_params_indexed_by_group = []
        self.combined_grads_indexed_by_group = []
        for sizes in sizes_each_group:
            group_params, group_grads = [], []
            for d in range(len(_DTYPES)):
                group_params.append(get_part_combined_tensor(self.params_all_group_combined[d], offsets[d], sizes[d]))
                group_grads.append(get_part_combined_tensor(self.grads_all_group_combined[d], offsets[d], sizes[d]))
                offsets[d] += sizes[d]
            self.combined_params_indexed_by_group.append(group_params)
            self.combined_grads_indexed_by_group.append(group_grads)
        if any(c is not None for c in self.params_all_group_combined):
            self.is_params_grads_combined = True

    @torch.no_grad()
    def _adopt_replaced_grads(self):
        """Grads that are no longer the combined ones (``p.grad = None``, as a module's
        ``zero_grad()`` does, then a new grad from backward; or an out-of-place accumulation)
        are copied into their slice of the combined buffer, which becomes ``p.grad`` again; a
        missing grad is a zero one. Without this a step would silently reuse stale grads."""
        for params, grads in zip(self.params_all_group, self._combined_grads):
            for p, combined in zip(params, grads):
                g = p.grad
                if g is combined:
                    continue
                if g is None:
                    combined.zero_()
                else:
                    combined.copy_(g)
                p.grad = combined

    # Subclasses: the tensor states of a parameter (names, in order) and how to create them.
    def _state_keys(self, group):
        raise NotImplementedError

    def _new_state(self, p, key, group):
        return torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _init_param_state(self, p, group):
        """Creates the parameter's state, or re-allocates a loaded one (fresh tensors, so that
        combining never moves a tensor the caller still holds)."""
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
        else:
            state["step"] = int(float(state["step"]))
        for key in self._state_keys(group):
            fresh = self._new_state(p, key, group)
            old = state.get(key)
            if old is not None:
                fresh.copy_(old.reshape(p.shape))
            state[key] = fresh

    def _init_group_param_state(self, p, group):
        """The state of ``p``, a parameter of ``group``: subclasses whose ``_init_param_state``
        takes torch_npu's arguments (e.g. ``momentum, centered``) pass them from the group."""
        self._init_param_state(p, group)

    def _maybe_init_combined_states(self):
        if self.is_states_combined:
            return
        self.combined_param_states_indexed_by_group = []
        for group, lists in zip(self.param_groups, self.params_lists_indexed_by_group):
            keys = self._state_keys(group)
            group_states = []
            for params in lists:
                combined = defaultdict(dict)
                combined["step"] = 0
                for key in keys:
                    combined[key] = None
                # (parameters combined at the first step all have a grad then)
                params = [p for p in params if p.grad is not None]
                if params:
                    for p in params:
                        self._init_group_param_state(p, group)
                    combined["step"] = self.state[params[0]].get("step", 0)
                    for key in keys:
                        combined[key] = npu_combine_tensors([self.state[p][key] for p in params])
                group_states.append(combined)
            self.combined_param_states_indexed_by_group.append(group_states)
        self.is_states_combined = True

    # ---- step ----------------------------------------------------------------------------
    def _group_step(self, group_index):
        raise NotImplementedError

    def _combined_group(self, group_index):
        """(dtype index, params, combined param, combined grad, combined state) of a group's
        non-empty dtypes."""
        for d in range(len(_DTYPES)):
            param = self.combined_params_indexed_by_group[group_index][d]
            grad = self.combined_grads_indexed_by_group[group_index][d]
            if param is None or grad is None:
                continue
            yield (d, self.params_lists_indexed_by_group[group_index][d], param, grad,
                   self.combined_param_states_indexed_by_group[group_index][d])

    def _advance_step(self, params, combined_state):
        for p in params:
            self.state[p]["step"] += 1
        combined_state["step"] += 1
        return combined_state["step"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._maybe_init_combined_params_and_grads()
        if not self.is_params_grads_combined:
            return loss
        self._adopt_replaced_grads()
        self._maybe_init_combined_states()
        self._before_group_steps()
        for i in range(len(self.param_groups)):
            self._group_step(i)
        return loss

    def _before_group_steps(self):
        pass

    @torch.no_grad()
    def zero_grad(self, set_to_none=False):
        if set_to_none:
            raise ValueError("set_to_none is not supported in fused optimizers")
        if not self.is_params_grads_combined:
            self._maybe_init_combined_params_and_grads()
            if not self.is_params_grads_combined:
                super().zero_grad(set_to_none=False)
                return
        self._adopt_replaced_grads()
        for grads in self.grads_all_group_combined:
            if grads is not None:
                grads.zero_()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # The loaded states are new tensors: combine them again at the next step.
        self.is_states_combined = False
        self.combined_param_states_indexed_by_group = None

    def __setstate__(self, state):
        super().__setstate__(state)

    # ---- combined buffers and fused clipping ----------------------------------------------
    def get_combined_params(self):
        r"""The combined parameter buffers: a list indexed by dtype (float32, float16), each a
        flat npu tensor or ``None``."""
        return self.params_all_group_combined

    def get_combined_grads(self):
        r"""The combined grad buffers, parallel to :meth:`get_combined_params`."""
        return self.grads_all_group_combined

    @torch.no_grad()
    def clip_grad_norm_fused_(self, max_norm, norm_type=2):
        r"""``torch.nn.utils.clip_grad_norm_`` over all parameters of the optimizer, computed on
        the combined grad buffers. Returns the total norm (a float32 tensor)."""
        self._maybe_init_combined_params_and_grads()
        if self.is_params_grads_combined:
            self._adopt_replaced_grads()
        grads = [g for g in self.get_combined_grads() if g is not None]
        if not grads:
            return torch.tensor(0.)
        max_norm = float(max_norm)
        norm_type = float(norm_type)
        norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in grads]
        if math.isinf(norm_type):
            total_norm = torch.stack(norms).max() if len(norms) > 1 else norms[0]
        else:
            total_norm = torch.linalg.vector_norm(torch.stack(norms), norm_type) if len(norms) > 1 else norms[0]
        clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(clip_coef.to(g.dtype))
        return total_norm
