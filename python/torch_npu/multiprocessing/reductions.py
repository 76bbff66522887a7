"""Sharing npu tensors between processes, as torch.multiprocessing shares CUDA tensors.

Pickled by torch.multiprocessing (a ``Queue``, ``Pipe``, ``Process`` arguments), an npu
tensor is not copied: the receiving process maps the same device memory and sees the
sender's later writes, and the sender sees the receiver's. The sender names the caching
allocator's allocation holding the tensor (``UntypedStorage._share_npu_``, an
``aclrtIpcMemGetExportKey`` key) after its queued work on the tensor is done; the receiver
imports it (``UntypedStorage._new_shared_npu``). Each send carries a reference counter in
shared CPU memory: the sender keeps the storage alive until every receiver has freed its
copy (``torch.npu.ipc_collect()`` or the next send drops those no longer used), so as with
CUDA the sender may drop its tensor right after sending. A received tensor cannot be sent
on (clone it first), nor can memory the caching allocator did not allocate. Events are not
shared with a tensor: the receiver sees the data as of the send.

A ``torch.npu.Event(interprocess=True)`` pickles as its ``ipc_handle()``: the receiver gets
the same event (``Event.from_ipc_handle``), which records and waits of either process move.
"""
__all__ = ["rebuild_npu_tensor", "rebuild_npu_event", "ipc_collect"]

import multiprocessing

import threading

import torch
import torch.multiprocessing.reductions as _torch_reductions
from torch.multiprocessing.reductions import StorageWeakRef, shared_cache, storage_from_cache

import torch_npu

_original_reduce_tensor = _torch_reductions.reduce_tensor
_original_reduce_storage = _torch_reductions.reduce_storage

# Storages sent to other processes, with their reference counters (shared CPU int64
# tensors, one per send, counting the receivers still holding the storage).
_sent = []
_sent_lock = threading.Lock()


def ipc_collect() -> None:
    """Releases the sent npu storages that no receiving process uses any more."""
    with _sent_lock:
        _sent[:] = [(storage, counter) for storage, counter in _sent if int(counter[0]) > 0]


def _share_npu_(self):
    """(device, handle, size bytes, offset bytes, ref counter, ref counter offset, event
    handle, event sync required) of this npu storage, for ``_new_shared_npu`` in another process."""
    if self.device.type != "npu":
        raise RuntimeError(f"_share_npu_: only available on NPU, got a {self.device.type} storage")
    if self.nbytes() == 0:
        return (self.device.index, None, 0, 0, None, 0, None, False)
    view = torch.empty(0, dtype=torch.uint8, device=self.device).set_(self)
    device, handle, offset = torch_npu._C._npu_ipc_share(view)
    counter = torch.ones(1, dtype=torch.int64).share_memory_()
    ipc_collect()
    with _sent_lock:
        _sent.append((self, counter))
    return (device, handle, self.nbytes(), offset, counter, 0, None, False)


def _typed_share_npu_(self, *args, **kwargs):
    """TypedStorage._share_npu_: its untyped storage's (as torch's _share_cuda_)."""
    return self._untyped_storage._share_npu_(*args, **kwargs)


def _new_shared_npu(cls, device, handle, size_bytes, offset_bytes, ref_counter, ref_counter_offset,
                    event_handle=None, event_sync_required=False):
    """The npu storage another process shared with ``_share_npu_``, over the same memory."""
    view = torch_npu._C._npu_ipc_open(device, handle, size_bytes, offset_bytes, ref_counter, ref_counter_offset)
    return view.untyped_storage()


def _release_ipc_counter_npu(cls, ref_counter, ref_counter_offset, device=None):
    """Gives back the reference a send counted when the receiver already holds the storage."""
    torch_npu._C._npu_ipc_release_counter(ref_counter, ref_counter_offset)


def rebuild_npu_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                       storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                       ref_counter_offset, event_handle, event_sync_required):
    if storage_handle is None or storage_size_bytes == 0:
        storage = torch.UntypedStorage(0, device=torch.device("npu", storage_device))
    else:
        storage = storage_from_cache(storage_cls, (storage_handle, storage_offset_bytes))
        if storage is None:
            torch_npu.npu._lazy_init()
            storage = torch.UntypedStorage._new_shared_npu(
                storage_device, storage_handle, storage_size_bytes, storage_offset_bytes, ref_counter_handle,
                ref_counter_offset, event_handle, event_sync_required)
            shared_cache[(storage_handle, storage_offset_bytes)] = StorageWeakRef(storage)
        else:
            torch.UntypedStorage._release_ipc_counter_npu(ref_counter_handle, ref_counter_offset,
                                                          device=storage_device)
    untyped = storage if isinstance(storage, torch.UntypedStorage) else storage._untyped_storage
    t = torch._utils._rebuild_tensor(
        torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True),
        tensor_offset, tensor_size, tensor_stride)
    if tensor_cls == torch.nn.parameter.Parameter:
        # integer tensors must get requires_grad=False in the constructor
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _npu_reduce_tensor(tensor):
    if tensor.device.type != "npu" or tensor.is_nested or tensor.layout != torch.strided:
        return _original_reduce_tensor(tensor)
    storage = tensor._typed_storage()
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "
            "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue).")
    torch.utils.hooks.warn_if_has_hooks(tensor)
    (device, handle, size_bytes, offset_bytes, ref_counter, ref_counter_offset, event_handle,
     event_sync_required) = storage._share_npu_()
    if handle is not None:
        shared_cache[handle] = StorageWeakRef(storage)
    return (rebuild_npu_tensor,
            (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), type(storage), tensor.dtype,
             device, handle, size_bytes, offset_bytes, tensor.requires_grad, ref_counter, ref_counter_offset,
             event_handle, event_sync_required))


def _npu_reduce_storage(storage):
    if storage.device.type == "npu":
        raise RuntimeError("Cannot pickle NPU storage; try pickling a NPU tensor instead")
    return _original_reduce_storage(storage)


def rebuild_npu_event(device, handle):
    return torch.npu.Event.from_ipc_handle(device, handle)


def _npu_reduce_event(event):
    handle = event.ipc_handle()
    return (rebuild_npu_event, (event.device, handle))


def _add_reductions_methods() -> None:
    """npu storages get their sharing methods; torch.multiprocessing's pickler the npu reductions."""
    torch.UntypedStorage._share_npu_ = _share_npu_
    torch.storage.TypedStorage._share_npu_ = _typed_share_npu_
    torch.UntypedStorage._new_shared_npu = classmethod(_new_shared_npu)
    torch.UntypedStorage._release_ipc_counter_npu = classmethod(_release_ipc_counter_npu)
    _torch_reductions.reduce_tensor = _npu_reduce_tensor
    _torch_reductions.reduce_storage = _npu_reduce_storage
    _torch_reductions.init_reductions()
    multiprocessing.reduction.register(torch_npu.npu.Event, _npu_reduce_event)


# torch.multiprocessing.reductions' helpers, read through at each access (torch_npu's module
# imports them; reading them live keeps a test's patch of torch's names visible here too).
_TORCH_HELPERS = ("rebuild_storage_filename", "rebuild_storage_empty", "rebuild_storage_fd", "fd_id",
                  "rebuild_tensor", "rebuild_typed_storage", "rebuild_typed_storage_child")


def __getattr__(name):
    if name in _TORCH_HELPERS:
        return getattr(_torch_reductions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
