"""``torch.npu`` backend switches with torch_npu's names: scaled-dot-product-attention
backends, the preferred linalg library, and ``fft_plan_cache`` (the FFT plan cache, see
``torch_npu.npu._fft_plan_cache``).

The SDPA switches are PyTorch's global ones (``torch.backends.cuda`` reads the same
flags). On npu, ``scaled_dot_product_attention`` runs the fused attention kernel as
PyTorch's "overrideable" backend; ``torch.nn.attention.sdpa_kernel([SDPBackend.MATH])``
(which turns that backend off) selects the math kernel.
"""
import contextlib
import warnings
from typing import Union

import torch

from torch_npu.npu._fft_plan_cache import NPUFFTPlanCache

__all__ = ["flash_sdp_enabled", "enable_flash_sdp", "mem_efficient_sdp_enabled",
           "enable_mem_efficient_sdp", "math_sdp_enabled", "enable_math_sdp", "sdp_kernel",
           "preferred_linalg_library"]


def _check_bool(fn: str, enabled) -> bool:
    if not isinstance(enabled, bool):
        raise TypeError(f"{fn}(): argument 'enabled' must be a bool, got {type(enabled).__name__}")
    return enabled


def flash_sdp_enabled() -> bool:
    r"""Whether the flash scaled-dot-product-attention backend is enabled."""
    return torch._C._get_flash_sdp_enabled()


def enable_flash_sdp(enabled: bool) -> None:
    r"""Enable or disable the flash scaled-dot-product-attention backend."""
    torch._C._set_sdp_use_flash(_check_bool("enable_flash_sdp", enabled))


def mem_efficient_sdp_enabled() -> bool:
    r"""Whether the memory-efficient scaled-dot-product-attention backend is enabled."""
    return torch._C._get_mem_efficient_sdp_enabled()


def enable_mem_efficient_sdp(enabled: bool) -> None:
    r"""Enable or disable the memory-efficient scaled-dot-product-attention backend."""
    torch._C._set_sdp_use_mem_efficient(_check_bool("enable_mem_efficient_sdp", enabled))


def math_sdp_enabled() -> bool:
    r"""Whether the math (reference) scaled-dot-product-attention backend is enabled."""
    return torch._C._get_math_sdp_enabled()


def enable_math_sdp(enabled: bool) -> None:
    r"""Enable or disable the math scaled-dot-product-attention backend."""
    torch._C._set_sdp_use_math(_check_bool("enable_math_sdp", enabled))


@contextlib.contextmanager
def sdp_kernel(enable_flash: bool = True, enable_math: bool = True, enable_mem_efficient: bool = True):
    r"""Context manager enabling/disabling the three SDPA backends, restoring them on exit."""
    previous = (flash_sdp_enabled(), mem_efficient_sdp_enabled(), math_sdp_enabled())
    try:
        enable_flash_sdp(enable_flash)
        enable_mem_efficient_sdp(enable_mem_efficient)
        enable_math_sdp(enable_math)
        yield {}
    finally:
        enable_flash_sdp(previous[0])
        enable_mem_efficient_sdp(previous[1])
        enable_math_sdp(previous[2])


def preferred_linalg_library(backend: Union[None, str, torch._C._LinalgBackend] = None):
    r"""The linear-algebra library of the NPU: there is no choice to make, so this warns
    and returns ``torch._C._LinalgBackend.Default`` (as torch_npu does)."""
    warnings.warn("torch.npu.preferred_linalg_library isn't implemented!")
    return torch._C._LinalgBackend.Default


fft_plan_cache = NPUFFTPlanCache()
