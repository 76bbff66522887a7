"""The NPU trace in Python: callbacks for what the host asks of the runtime.

While ``torch_npu._C._activate_npu_trace(0)`` is on, the runtime reports event creation,
deletion, record, wait and synchronisation, stream creation and synchronisation, device
synchronisation, NPU (and pinned host) allocations and frees, and ``record_stream`` /
``erase_stream``, in call order, on the calling thread, to :func:`_fire`, which calls the
callbacks registered here. ``torch_npu.npu._sanitizer`` is the client. Names and
signatures are torch_npu's (``torch_npu.utils._npu_trace``).
"""
import logging
import os
from typing import Callable, List, Tuple

logger = logging.getLogger(__name__)


def print_check_msg(msg: str):
    print(f"[sanitizer]({os.getpid()}) {msg}")


class CallbackRegistry:
    def __init__(self, name: str):
        self.name = name
        self.callback_list: List[Tuple[Callable, str]] = []

    def add_callback(self, cb: Callable, cb_name: str) -> None:
        # A name registers one callback: enabling the sanitizer again replaces its
        # handlers instead of also calling the previous ones.
        self.callback_list = [(c, n) for c, n in self.callback_list if n != cb_name]
        self.callback_list.append((cb, cb_name))

    def remove_callback(self, cb_name: str) -> None:
        self.callback_list = [(c, n) for c, n in self.callback_list if n != cb_name]

    def fire_callbacks(self, *args, **kwargs) -> None:
        for cb, cb_name in self.callback_list:
            try:
                cb(*args, **kwargs)
            except Exception:
                logger.exception("Exception in callback %s for %s registered with NPU trace", cb_name, self.name)


NPUEventCreationCallbacks = CallbackRegistry("[stream check] NPU event creation")
NPUEventDeletionCallbacks = CallbackRegistry("[stream check] NPU event deletion")
NPUEventRecordCallbacks = CallbackRegistry("[stream check] NPU event record")
NPUEventWaitCallbacks = CallbackRegistry("[stream check] NPU event wait")
NPUMemoryAllocationCallbacks = CallbackRegistry("[stream check] NPU memory allocation")
NPUMemoryDeallocationCallbacks = CallbackRegistry("[stream check] NPU memory deallocation")
NPUStreamCreationCallbacks = CallbackRegistry("[stream check] NPU stream creation")
NPUDeviceSynchronizationCallbacks = CallbackRegistry("[stream check] NPU device synchronization")
NPUStreamSynchronizationCallbacks = CallbackRegistry("[stream check] NPU stream synchronization")
NPUEventSynchronizationCallbacks = CallbackRegistry("[stream check] NPU event synchronization")
NPURecordStreamCallbacks = CallbackRegistry("[stream check] NPU record_stream")
NPUEraseStreamCallbacks = CallbackRegistry("[stream check] NPU erase_stream")
NPUHostAllocationCallbacks = CallbackRegistry("[stream check] pinned host memory allocation")
NPUHostDeallocationCallbacks = CallbackRegistry("[stream check] pinned host memory deallocation")

# Indexed by torch_npu::trace::Kind (core/include/torch_npu/core/npu_trace.h), with the
# number of arguments each kind passes.
_KINDS = (
    (NPUEventCreationCallbacks, 1),
    (NPUEventDeletionCallbacks, 1),
    (NPUEventRecordCallbacks, 2),
    (NPUEventWaitCallbacks, 2),
    (NPUMemoryAllocationCallbacks, 1),
    (NPUMemoryDeallocationCallbacks, 1),
    (NPUStreamCreationCallbacks, 1),
    (NPUDeviceSynchronizationCallbacks, 0),
    (NPUStreamSynchronizationCallbacks, 1),
    (NPUEventSynchronizationCallbacks, 1),
    (NPURecordStreamCallbacks, 2),
    (NPUEraseStreamCallbacks, 2),
    (NPUHostAllocationCallbacks, 1),
    (NPUHostDeallocationCallbacks, 1),
)


def _fire(kind: int, a: int, b: int) -> None:
    """Called by the runtime for each trace point while the trace is active."""
    registry, arity = _KINDS[kind]
    if registry.callback_list:
        registry.fire_callbacks(*(a, b)[:arity])


def register_callback_for_npu_event_creation(cb: Callable[[int], None], cb_name: str) -> None:
    NPUEventCreationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_deletion(cb: Callable[[int], None], cb_name: str) -> None:
    NPUEventDeletionCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_record(cb: Callable[[int, int], None], cb_name: str) -> None:
    NPUEventRecordCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_wait(cb: Callable[[int, int], None], cb_name: str) -> None:
    NPUEventWaitCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_memory_allocation(cb: Callable[[int], None], cb_name: str) -> None:
    NPUMemoryAllocationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_memory_deallocation(cb: Callable[[int], None], cb_name: str) -> None:
    NPUMemoryDeallocationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_stream_creation(cb: Callable[[int], None], cb_name: str) -> None:
    NPUStreamCreationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_device_synchronization(cb: Callable[[], None], cb_name: str) -> None:
    NPUDeviceSynchronizationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_stream_synchronization(cb: Callable[[int], None], cb_name: str) -> None:
    NPUStreamSynchronizationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_synchronization(cb: Callable[[int], None], cb_name: str) -> None:
    NPUEventSynchronizationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_record_stream(cb: Callable[[int, int], None], cb_name: str) -> None:
    """``cb(data_ptr, stream)``: ``tensor.record_stream(stream)`` of a storage at ``data_ptr``."""
    NPURecordStreamCallbacks.add_callback(cb, cb_name)


def register_callback_for_host_memory_allocation(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(data_ptr)``: pinned host memory handed out (a fresh or a reused block)."""
    NPUHostAllocationCallbacks.add_callback(cb, cb_name)


def register_callback_for_host_memory_deallocation(cb: Callable[[int], None], cb_name: str) -> None:
    NPUHostDeallocationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_erase_stream(cb: Callable[[int, int], None], cb_name: str) -> None:
    """``cb(data_ptr, stream)``: ``torch_npu.erase_stream(tensor, stream)``."""
    NPUEraseStreamCallbacks.add_callback(cb, cb_name)
