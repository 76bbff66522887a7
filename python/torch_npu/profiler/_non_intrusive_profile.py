"""Dynamic profiling without code changes, as torch_npu: with ``PROF_CONFIG_PATH=<dir>`` in
the environment, ``import torch_npu`` calls ``dynamic_profile.init(<dir>)`` and makes every
``optimizer.step()`` of the most recently created optimizer call ``dynamic_profile.step()``.
(torch_npu's other trigger, ``MSMONITOR_USE_DAEMON=1`` with the dynolog daemon, needs that
daemon and is not supported: a warning says so.)
"""
import functools
import os
import warnings

import torch

from . import dynamic_profile

__all__ = []

_origin_patch_step_function = torch.optim.Optimizer._patch_step_function


class _NonIntrusiveProfile:
    OPTIMIZER_ID = 0  # id() of the optimizer whose steps count as training steps

    @staticmethod
    def step_wrapper(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            out = func(*args, **kwargs)
            _NonIntrusiveProfile.step(*args, **kwargs)
            return out

        return wrapper

    @staticmethod
    def patch_step_function(optimizer: torch.optim.Optimizer):
        """Replaces Optimizer._patch_step_function (run by every Optimizer.__init__)."""
        _origin_patch_step_function(optimizer)
        _NonIntrusiveProfile.OPTIMIZER_ID = id(optimizer)  # the last optimizer created
        if not getattr(optimizer.__class__.step, "step_hooked", False):
            optimizer.__class__.step = _NonIntrusiveProfile.step_wrapper(optimizer.__class__.step)
            optimizer.__class__.step.step_hooked = True

    @staticmethod
    def check_last_optimizer(optimizer: torch.optim.Optimizer) -> bool:
        return id(optimizer) == _NonIntrusiveProfile.OPTIMIZER_ID

    @staticmethod
    def step(*args, **kwargs):
        optimizer, *_ = args
        if _NonIntrusiveProfile.check_last_optimizer(optimizer):
            dynamic_profile.step()

    @staticmethod
    def init():
        path = os.getenv("PROF_CONFIG_PATH", "")
        if os.getenv("MSMONITOR_USE_DAEMON", os.getenv("KINETO_USE_DAEMON", "0")) == "1" and not path:
            warnings.warn("[torch_npu.profiler] MSMONITOR_USE_DAEMON=1 needs the msmonitor/dynolog daemon, which "
                          "this build does not support; set PROF_CONFIG_PATH=<dir> for file-driven profiling.")
            return
        if not path:
            return
        dynamic_profile.init(path)
        torch.optim.Optimizer._patch_step_function = _NonIntrusiveProfile.patch_step_function
