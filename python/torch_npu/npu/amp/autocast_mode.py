"""``torch.npu.amp.autocast`` and the custom autograd function decorators."""

import functools
from typing import Any

import torch

__all__ = ["autocast", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast_mode.autocast):
    r"""Autocast context manager / decorator for NPUs.

    ``torch.npu.amp.autocast(args...)`` is ``torch.autocast("npu", args...)``: inside it,
    ops on the autocast lists (matmul, conv, linear, ...) run in ``dtype`` (float16 by
    default) and precision-sensitive ops in float32.

    Args:
        enabled (bool, optional): whether autocasting is on in the region. Default ``True``.
        dtype (torch.dtype, optional): ``torch.float16`` (default) or ``torch.bfloat16``.
        cache_enabled (bool, optional): cache casted weights inside the region. Default ``True``.
    """

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        if torch._jit_internal.is_scripting():
            self._enabled = enabled
            self.device = "npu"
            self.fast_dtype = dtype
            return
        if not isinstance(dtype, torch.dtype):
            raise TypeError("torch.npu.amp.autocast(): argument 'dtype' must be a torch.dtype "
                            f"(torch.float16 or torch.bfloat16), got {type(dtype).__name__}")
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    def __enter__(self):
        if torch._jit_internal.is_scripting():
            return self
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any):
        if torch._jit_internal.is_scripting():
            return None
        return super().__exit__(exc_type, exc_val, exc_tb)

    def __call__(self, func):
        if torch._jit_internal.is_scripting():
            return func
        return super().__call__(func)


def custom_fwd(fwd=None, *, cast_inputs=None):
    r"""Decorator for ``forward`` of a custom ``torch.autograd.Function`` under NPU autocast.

    Usable bare (``@custom_fwd``) or with ``cast_inputs`` (``@custom_fwd(cast_inputs=torch.float32)``):
    with ``cast_inputs``, floating-point NPU tensor arguments are cast to that dtype and
    ``forward`` runs with autocast disabled, when called inside an autocast region.
    Same as ``torch.amp.custom_fwd(device_type="npu")``.
    """
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    r"""Decorator for ``backward`` of a custom ``torch.autograd.Function``: runs it with the
    autocast state its ``forward`` had. Same as ``torch.amp.custom_bwd(device_type="npu")``."""
    return torch.amp.custom_bwd(bwd, device_type="npu")
