"""Data safety after a device fault (torch_npu's ``torch_npu.npu._recovery``).

After a fault (on Ascend: an uncorrectable memory error, or a device stopped and
restarted), the data in device memory can no longer be trusted. ``mark_all_npu_tensor_unsafe``
marks every block the caching allocator has handed out on a device; a block is safe again
once it is freed (the next tensor there writes its own data) or written by a copy
(``tensor.copy_(safe)``). While the check flag is set (``set_npu_tensor_unsafe_check_flag``),
operators refuse inputs in unsafe memory with ``RuntimeError: There is unsafe data in the
input tensor.``. ``restart_device(..., rebuild_all_resources=True)`` does both.

``stop_device(device_id)`` stops a device as a fault handler does before recovery (torch_npu's
FORCE STOP): the kernels queued on its streams are dropped, and launching or synchronising on
the device raises ``RuntimeError: FORCE STOP.`` until ``restart_device(device_id)``.

The simulator's device memory is host RAM and has no uncorrectable errors: nothing is
marked unsafe unless a program does so.
"""

import logging

import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = [
    "check_npu_storage_is_safe", "check_npu_tensor_is_safe", "mark_all_npu_tensor_unsafe",
    "update_npu_storage_to_safe", "update_npu_tensor_to_safe", "set_npu_tensor_unsafe_check_flag",
    "get_npu_tensor_unsafe_check_flag", "restart_device", "stop_device",
]

logger = logging.getLogger("torch_npu.recovery")

_STORAGE_TYPES = (torch.storage.TypedStorage, torch.storage.UntypedStorage)


def _untyped(storage_obj):
    if isinstance(storage_obj, torch.storage.TypedStorage):
        return storage_obj._untyped_storage
    return storage_obj


def check_npu_storage_is_safe(storage_obj):
    r"""Whether the memory of ``storage_obj`` (a TypedStorage or UntypedStorage) is safe."""
    if isinstance(storage_obj, _STORAGE_TYPES):
        return torch_npu._C._check_npu_data_ptr(_untyped(storage_obj))
    raise RuntimeError(f"param type should be TypedStorage or UntypedStorage, could not be {type(storage_obj)}"
                       + pta_error(ErrCode.TYPE))


def check_npu_tensor_is_safe(tensor_obj):
    r"""Whether the memory of ``tensor_obj``'s storage is safe (CPU tensors always are)."""
    if isinstance(tensor_obj, torch.Tensor):
        return check_npu_storage_is_safe(tensor_obj.untyped_storage())
    raise RuntimeError(f"param type should be Tensor, could not be {type(tensor_obj)}" + pta_error(ErrCode.TYPE))


def mark_all_npu_tensor_unsafe(device: int):
    r"""Mark the memory of every tensor now allocated on ``device`` unsafe."""
    return torch_npu._C._mark_all_npu_data_ptr_unsafe(device)


def update_npu_storage_to_safe(storage_obj):
    r"""Mark the memory of ``storage_obj`` safe again."""
    if isinstance(storage_obj, _STORAGE_TYPES):
        return torch_npu._C._update_npu_data_ptr(_untyped(storage_obj))
    raise RuntimeError(f"param type should be TypedStorage or UntypedStorage, could not be {type(storage_obj)}"
                       + pta_error(ErrCode.TYPE))


def update_npu_tensor_to_safe(tensor_obj):
    r"""Mark the memory of ``tensor_obj``'s storage safe again."""
    if isinstance(tensor_obj, torch.Tensor):
        return update_npu_storage_to_safe(tensor_obj.untyped_storage())
    raise RuntimeError(f"param type should be Tensor, could not be {type(tensor_obj)}" + pta_error(ErrCode.TYPE))


def set_npu_tensor_unsafe_check_flag(flag: bool) -> None:
    r"""Turn the operators' check of their inputs' safety on (``True``) or off."""
    return torch_npu._C._set_npu_data_unsafe_flag(bool(flag))


def get_npu_tensor_unsafe_check_flag() -> bool:
    r"""Whether operators check that their inputs are safe."""
    return torch_npu._C._get_npu_data_unsafe_flag()


def _recovery_all_npu_stream(device: int) -> None:
    return torch_npu._C._recovery_all_npu_stream(device)


def restart_device(device_id: int, rebuild_all_resources: bool = False, disable_tensor_unsafe_check: bool = False):
    r"""Make ``device_id`` usable again after a fault: its streams are drained and the errors
    of their failed tasks dropped. With ``rebuild_all_resources``, the memory of every tensor on
    the device is marked unsafe and operators check their inputs (unless
    ``disable_tensor_unsafe_check``): tensors written again (copies, new allocations) pass."""
    from .utils import _check_device_index
    logger.info("restart device start, device_id=%s, rebuild_all_resources=%s, disable_tensor_unsafe_check=%s",
                device_id, rebuild_all_resources, disable_tensor_unsafe_check)
    torch_npu.npu._lazy_init()
    device_id = _check_device_index(int(device_id), fn="restart_device", arg="device_id")
    if rebuild_all_resources:
        if not disable_tensor_unsafe_check:
            mark_all_npu_tensor_unsafe(device_id)
            set_npu_tensor_unsafe_check_flag(True)
        _recovery_all_npu_stream(device_id)
    torch_npu._C._npu_restart_device(device_id)
    logger.info("restart device end, device_id=%s", device_id)


def stop_device(device_id):
    r"""Stops ``device_id``: the kernels queued on its streams are dropped, and every launch or
    synchronisation on it raises ``RuntimeError: FORCE STOP.`` until :func:`restart_device`.
    Returns 0 (torch_npu: 0 when the device's tasks were aborted, else 1)."""
    from .utils import _check_device_index
    logger.info("stop device start, device_id=%s", device_id)
    torch_npu.npu._lazy_init()
    device_id = _check_device_index(int(device_id), fn="stop_device", arg="device_id")
    result = torch_npu._C._npu_stopDevice(device_id)
    logger.info("stop device end, device_id=%s, result=%s", device_id, result)
    return result
