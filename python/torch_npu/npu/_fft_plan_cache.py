"""``torch.npu.backends.fft_plan_cache``: torch_npu's cache of FFT plans.

The FFT operators on npu (``torch.fft.*`` through ``_fft_c2c``, ``_fft_r2c``, ``_fft_c2r``) look
their plan up in one process-wide least-recently-used cache: one plan per distinct transform
(kind, signal sizes, direction, input dtype), at most ``max_size`` of them (10 by default, 1 to
99), the least recently used one evicted when a new plan does not fit.

A plan here is the description of its transform: the transforms run through ATen's CPU FFT
on the host aliases of the npu tensors, which plans each call itself, so ``max_size`` and
``clear()`` change which plans are held, not the results or the speed.
"""
import torch_npu
import torch_npu._C
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = []


class NPUFFTPlanCache:
    r"""``size`` (read-only): the number of plans in the cache; ``max_size``: its capacity (an
    int from 1 to 99; lowering it drops the least recently used plans); ``clear()`` empties it."""

    def __getattr__(self, name):
        if name == "size":
            return torch_npu._C._npu_get_fft_plan_cache_size()
        if name == "max_size":
            return torch_npu._C._npu_get_fft_plan_cache_max_size()
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name, value):
        if name == "size":
            raise RuntimeError(".size is a read-only property showing the number of plans currently in the cache.")
        if name == "max_size":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError("fft_plan_cache.max_size must be an int, got " + type(value).__name__
                                + pta_error(ErrCode.TYPE))
            if not 1 <= value <= 99:
                raise RuntimeError(f"invalid value of cache_size, expected 1 to 99, got {value}"
                                   + pta_error(ErrCode.VALUE))
            torch_npu._C._npu_set_fft_plan_cache_max_size(value)
            return
        raise AttributeError("Unknown attribute " + name)

    def clear(self):
        r"""Removes every plan from the cache."""
        torch_npu._C._npu_clear_fft_plan_cache()
