"""torch_npu.utils.serialization: ``load`` (torch.load with torch_npu's signature) and
``save_async`` (torch.save on a background thread).

``save_async(obj, f, ..., model=None)`` returns at once; a thread (one per call) copies the
npu tensors to the host on a side stream of the caller's device (ordered after the work the
caller's current stream had queued when it called) and writes ``f`` in torch.save's zip format,
so ``torch.load(f)`` gives the tensors back on their npu devices. As in torch_npu, a
``model`` passed in gets a full backward hook that makes the current stream wait for the
save stream, so a later backward (and the optimizer step after it) does not overwrite
parameters the save is still copying; without it the caller must not modify the tensors in
place until the save has finished. A path ``f`` is written to ``f + ".tmp"`` and renamed when
complete, so it never holds a partial checkpoint.

As in torch_npu, ``torch.save(..., _use_new_zipfile_serialization=False)`` warns that the legacy
format is not recommended for NPU tensors and raises (naming NPUStorageImpl) on an npu storage;
CPU tensors saved so load onto npu with ``map_location``.
"""
import os
import pickle
import threading
from typing import IO, Any, Callable, Union

import torch
from torch.serialization import DEFAULT_PROTOCOL

__all__ = ["load", "save_async"]

_SAVE_THREAD_NAME = "torch_npu_save_async"
_save_async_stream_map = {}
_save_async_stream_lock = threading.Lock()
_hooked_models = set()


def load(
    f: Union[str, os.PathLike[str], IO[bytes]],
    map_location: Union[Callable[[torch.types.Storage, str], torch.types.Storage], torch.device, str,
                        dict[str, str], None] = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    **pickle_load_args: Any,
) -> Any:
    """torch.load: npu tensors come back on their npu devices unless ``map_location`` says otherwise."""
    return torch.load(f, map_location, pickle_module, weights_only=weights_only, mmap=mmap, **pickle_load_args)


_LEGACY_SAVE_WARNING = (
    'Warning: torch.save with "_use_new_zipfile_serialization = False" is not recommended '
    "for NPU tensors, which may cause unexpected errors. It is better to set "
    '"_use_new_zipfile_serialization = True". '
    "If it is necessary to use this, please convert the NPU tensors to CPU tensors for saving."
)
_legacy_save_active = threading.local()


def _install_legacy_save_check():
    """torch.save(_use_new_zipfile_serialization=False) (torch.serialization._legacy_save), as in
    torch_npu: warns that the legacy format is not recommended for npu tensors and raises a
    RuntimeError naming NPUStorageImpl when it comes to write an npu storage (torch_npu's
    legacy writer cannot read an npu storage's desc). Storages on other devices, and
    _write_file outside a legacy save, are untouched."""
    original_save = torch.serialization._legacy_save
    original_write = torch.UntypedStorage._write_file

    def _legacy_save(obj, f, pickle_module, pickle_protocol):
        import warnings

        warnings.warn(_LEGACY_SAVE_WARNING, stacklevel=3)
        _legacy_save_active.on = True
        try:
            return original_save(obj, f, pickle_module, pickle_protocol)
        finally:
            _legacy_save_active.on = False

    def _write_file(self, *args, **kwargs):
        if getattr(_legacy_save_active, "on", False) and self.device.type == "npu":
            raise RuntimeError(
                "torch.save with _use_new_zipfile_serialization=False cannot write an npu storage: "
                "the legacy format has no npu storage desc of an NPUStorageImpl. Save with "
                "_use_new_zipfile_serialization=True, or move the tensors to cpu first.")
        return original_write(self, *args, **kwargs)

    torch.serialization._legacy_save = _legacy_save
    torch.UntypedStorage._write_file = _write_file


def _save_stream(device):
    with _save_async_stream_lock:
        stream = _save_async_stream_map.get(device)
        if stream is None:
            stream = torch.npu.Stream(device=device)
            _save_async_stream_map[device] = stream
        return stream


def _register_model_hook(model, device):
    key = (id(model), device)
    if key in _hooked_models:
        return
    _hooked_models.add(key)
    stream = _save_stream(device)

    def hook_fn(*args):
        torch.npu.current_stream().wait_stream(stream)

    model.register_full_backward_hook(hook_fn)


def _pickle_without_backward_hooks(obj):
    """Remove the modules' backward hooks while pickling (the save hook is a closure)."""
    if not isinstance(obj, torch.nn.Module):
        return {}
    hooks = {}
    for m in obj.modules():
        if m._backward_hooks:
            hooks[m] = m._backward_hooks.copy()
            m._backward_hooks.clear()
    return hooks


def _save_data_thread(save_args, device, ready_event):
    obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization, _disable_byteorder_record = save_args
    torch.npu.set_device(device)
    stream = _save_stream(device)
    stream.wait_event(ready_event)
    target = f
    if isinstance(f, (str, os.PathLike)):
        target = os.fspath(f) + ".tmp"
    hooks = _pickle_without_backward_hooks(obj)
    try:
        with torch.npu.stream(stream):
            torch.save(obj, target, pickle_module=pickle_module, pickle_protocol=pickle_protocol,
                       _use_new_zipfile_serialization=_use_new_zipfile_serialization,
                       _disable_byteorder_record=_disable_byteorder_record)
    finally:
        for m, h in hooks.items():
            m._backward_hooks.update(h)
    if target is not f:
        os.replace(target, os.fspath(f))


def save_async(
    obj: object,
    f,
    pickle_module: Any = pickle,
    pickle_protocol: int = DEFAULT_PROTOCOL,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    model: torch.nn.Module = None,
) -> None:
    """torch.save(obj, f, ...) on a background thread (see the module's documentation)."""
    if _use_new_zipfile_serialization is False:
        raise RuntimeError(
            'Error: torch_npu.save_async with "_use_new_zipfile_serialization = False"'
            " is not recommended for npu tensor, which may bring unexpected errors and hopefully"
            ' set "_use_new_zipfile_serialization = True"; '
            "if it is necessary to use this, please convert the npu tensor to cpu tensor for saving")
    if pickle_module is not None and getattr(pickle_module, "__name__", "") == "dill":
        version = tuple(int(x) for x in pickle_module.__version__.split(".")[:3] if x.isdigit())
        if version < (0, 3, 1):
            raise ValueError(f"'torch' supports dill >= 0.3.1, but you have dill {pickle_module.__version__}.")
    device = torch.npu.current_device()
    ready = torch.npu.Event()
    ready.record(torch.npu.current_stream(device))
    if isinstance(model, torch.nn.Module):
        _register_model_hook(model, device)
    save_args = (obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization, _disable_byteorder_record)
    thread = threading.Thread(target=_save_data_thread, args=(save_args, device, ready), name=_SAVE_THREAD_NAME)
    thread.start()
