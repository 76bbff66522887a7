"""``torch.npu.amp.GradScaler``: ``torch.amp.GradScaler("npu")`` plus torch_npu's static loss scale."""

import warnings
from collections import defaultdict
from typing import Any, Dict

import torch
from torch.amp.grad_scaler import _MultiDeviceReplicator, _refresh_per_optimizer_state

__all__ = ["GradScaler"]


class GradScaler(torch.amp.GradScaler):
    r"""Gradient scaler for mixed-precision training on NPUs.

    ``scaler.scale(loss).backward()``, ``scaler.step(optimizer)``, ``scaler.update()``
    as with ``torch.amp.GradScaler("npu")``, whose behaviour this class keeps.

    Args:
        init_scale (float, optional): initial scale factor. Default ``2.**16``.
        growth_factor (float, optional): factor applied by :meth:`update` after
            ``growth_interval`` consecutive steps without inf/NaN gradients. Default 2.0.
        backoff_factor (float, optional): factor applied by :meth:`update` after a step
            with inf/NaN gradients (which is skipped). Default 0.5.
        growth_interval (int, optional): see ``growth_factor``. Default 2000.
        dynamic (bool, optional): ``False`` keeps the scale fixed at ``init_scale`` (a static
            loss scale: gradients are unscaled but neither checked for inf/NaN nor is the
            scale updated), as torch_npu's option. Default ``True``.
        enabled (bool, optional): ``False`` makes every method a no-op
            (:meth:`step` just calls ``optimizer.step()``). Default ``True``.
    """

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, dynamic=True, enabled=True):
        for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                            ("backoff_factor", backoff_factor)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"torch.npu.amp.GradScaler(): argument '{name}' must be a float, "
                                f"got {type(value).__name__}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int):
            raise TypeError("torch.npu.amp.GradScaler(): argument 'growth_interval' must be an int, "
                            f"got {type(growth_interval).__name__}")
        if enabled:
            import torch_npu.npu as npu

            if not npu.is_available():
                warnings.warn("torch.npu.amp.GradScaler is enabled, but no NPU is available. "
                              "Disabling.")
                enabled = False
        if enabled and growth_factor <= 1.0:
            raise ValueError(f"The growth factor must be > 1.0, got {growth_factor}.")
        if enabled and backoff_factor >= 1.0:
            raise ValueError(f"The backoff factor must be < 1.0, got {backoff_factor}.")
        super().__init__("npu", init_scale=float(init_scale), growth_factor=float(growth_factor),
                         backoff_factor=float(backoff_factor), growth_interval=growth_interval,
                         enabled=enabled)
        self._dynamic = bool(dynamic)

    def scale(self, outputs):
        r"""Multiply ``outputs`` (a tensor or an iterable of tensors) by the scale factor."""
        return super().scale(outputs)

    def unscale_(self, optimizer):
        r"""Divide the gradients of ``optimizer``'s parameters by the scale factor (in place)."""
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        r"""Unscale (if not done yet) and call ``optimizer.step(*args, **kwargs)`` unless the
        gradients contain inf/NaN; returns what ``optimizer.step`` returned."""
        return super().step(optimizer, *args, **kwargs)

    @staticmethod
    def get_npu_overflow_flag():
        r"""torch_npu.npu.utils.get_npu_overflow_flag (the chip's global overflow flag)."""
        from torch_npu.npu.utils import get_npu_overflow_flag
        return get_npu_overflow_flag()

    @staticmethod
    def clear_npu_overflow_flag():
        r"""torch_npu.npu.utils.clear_npu_overflow_flag."""
        from torch_npu.npu.utils import clear_npu_overflow_flag
        return clear_npu_overflow_flag()

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        if self._dynamic:
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        # Static loss scale: unscale, report no inf/NaN (the step is never skipped).
        per_device_inv_scale = _MultiDeviceReplicator(inv_scale)
        per_device_found_inf = _MultiDeviceReplicator(found_inf)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    grad = param.grad._values() if param.grad.is_sparse else param.grad
                    grad.mul_(per_device_inv_scale.get(grad.device).to(grad.dtype))
                    per_device_found_inf.get(grad.device)
        return per_device_found_inf._per_device_tensors

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        # torch_npu skips the step of every optimizer once inf/NaN gradients were found in
        # this iteration (since the last update()), not only of the optimizer that had them:
        # with several optimizers, none steps on a corrupted iteration.
        found = sum(v.item() for state in self._per_optimizer_states.values()
                    for v in state["found_inf_per_device"].values())
        if found:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        r"""Update the scale factor (see ``torch.amp.GradScaler.update``).

        With ``dynamic=False`` the scale only changes when ``new_scale`` is given.
        """
        if not self._enabled:
            return
        if self._dynamic or new_scale is not None:
            super().update(new_scale)
            return
        self._check_scale_growth_tracker("update")
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def is_dynamic(self) -> bool:
        r"""Return whether the loss scale is dynamic (``dynamic=True``)."""
        return self._dynamic

    def state_dict(self):
        state = super().state_dict()
        if self._enabled:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        state_dict = dict(state_dict)
        dynamic = state_dict.pop("dynamic", self._dynamic)
        super().load_state_dict(state_dict)
        self._dynamic = bool(dynamic)
