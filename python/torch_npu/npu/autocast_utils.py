"""NPU autocast state: ``torch.npu.is_autocast_enabled``, ``set_autocast_dtype``, ... (torch_npu's
``torch_npu.npu.autocast_utils``)."""

import torch

__all__ = ["get_amp_supported_dtype", "is_autocast_enabled", "set_autocast_enabled",
           "get_autocast_dtype", "set_autocast_dtype"]


def get_amp_supported_dtype():
    r"""Return the dtypes ``torch.autocast("npu")`` accepts."""
    return [torch.float16, torch.bfloat16, torch.float32]


def is_autocast_enabled():
    r"""Return whether NPU autocast is enabled in this thread."""
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enable):
    r"""Enable or disable NPU autocast in this thread (prefer ``torch.npu.amp.autocast``)."""
    torch.set_autocast_enabled("npu", bool(enable))


def get_autocast_dtype():
    r"""Return the dtype NPU autocast casts to."""
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype):
    r"""Set the dtype NPU autocast casts to (one of :func:`get_amp_supported_dtype`)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"set_autocast_dtype(): argument 'dtype' must be a torch.dtype, got "
                        f"{type(dtype).__name__}")
    torch.set_autocast_dtype("npu", dtype)
