"""The NPU sanitizer: finds unsynchronised accesses between streams, and between a stream
and the host, and tensors used on another stream that need ``record_stream``.

Enable it with ``TORCH_NPU_SANITIZER=1`` (at ``import torch_npu``) or::

    import torch_npu.npu._sanitizer as sanitizer
    sanitizer.enable_npu_sanitizer()

A race raises ``torch.cuda._sanitizer.CUDASanitizerErrors`` at the operator that makes it,
with the stack traces of both accesses (and prints them to stderr). A missing
``record_stream`` is printed when the tensor is freed and kept in
``npu_sanitizer.event_handler.record_stream_errors``;
``npu_sanitizer.event_handler.flush_record_stream_warnings()`` checks the live tensors.
What the checks know and how they go beyond ``torch.cuda._sanitizer``:
``torch_npu/npu/_stream_check.py``. The cost: every operator call goes through a Python
``TorchDispatchMode`` (see docs/BENCHMARKS.md); with the sanitizer off there is none.

``SanitizerMode.KERNEL`` is torch_npu's check of AscendC operator memory accesses with the
debug kernels of ``ASCEND_OPP_DEBUG_PATH``. The simulator's operators are CPU kernels,
with no such debug builds, so ``enable_kernel_check`` reports that and returns False, and
``enable()`` uses the stream check.
"""
import os
import warnings

import torch_npu
import torch_npu.npu._stream_check as stream_check
import torch_npu.utils._npu_trace as npu_trace

__all__ = ["SanitizerMode", "NPUSanitizer", "enable_npu_sanitizer", "npu_sanitizer"]


class SanitizerMode:
    STREAM = 0
    KERNEL = 1


_CALLBACKS = (
    # (registration function of torch_npu.utils._npu_trace, handler method)
    ("register_callback_for_npu_event_creation", "_handle_event_creation"),
    ("register_callback_for_npu_event_deletion", "_handle_event_deletion"),
    ("register_callback_for_npu_event_record", "_handle_event_record"),
    ("register_callback_for_npu_event_wait", "_handle_event_wait"),
    ("register_callback_for_npu_memory_allocation", "_handle_memory_allocation"),
    ("register_callback_for_npu_memory_deallocation", "_handle_memory_deallocation"),
    ("register_callback_for_npu_stream_creation", "_handle_stream_creation"),
    ("register_callback_for_npu_device_synchronization", "_handle_device_synchronization"),
    ("register_callback_for_npu_stream_synchronization", "_handle_stream_synchronization"),
    ("register_callback_for_npu_event_synchronization", "_handle_event_synchronization"),
    ("register_callback_for_npu_record_stream", "_handle_record_stream"),
    ("register_callback_for_npu_erase_stream", "_handle_erase_stream"),
    ("register_callback_for_host_memory_allocation", "_handle_host_memory_allocation"),
    ("register_callback_for_host_memory_deallocation", "_handle_host_memory_deallocation"),
)


class NPUSanitizer:
    """Owns the sanitizer's dispatch mode and event handler for the process's lifetime."""

    def __init__(self):
        self.event_handler = None
        self.dispatch = None
        self.mode = SanitizerMode.STREAM
        self.enabled = False
        self.opp_debug_kernel_path = os.getenv("ASCEND_OPP_DEBUG_PATH")

    def enable(self):
        if self.enabled:
            return
        if self.opp_debug_kernel_path and self.enable_kernel_check():
            self.mode = SanitizerMode.KERNEL
        else:
            self.enable_stream_check()
            self.mode = SanitizerMode.STREAM
        torch_npu._C._activate_npu_trace(self.mode)
        self.enabled = True

    def enable_kernel_check(self) -> bool:
        if not os.getenv("ASCEND_OPP_DEBUG_PATH"):
            warnings.warn("ASCEND_OPP_DEBUG_PATH is not set! The kernel check of TORCH_NPU_SANITIZER takes no effect!")
        else:
            warnings.warn("The NPU sanitizer's kernel check needs the AscendC debug kernels of ASCEND_OPP_DEBUG_PATH; "
                          "the simulator's operators are CPU kernels without them. Using the stream check instead.")
        return False

    def enable_stream_check(self) -> bool:
        self.event_handler = stream_check.NPURecordStreamHandler()
        self.dispatch = stream_check.NPUSanitizerDispatchMode(self.event_handler)
        self.dispatch.__enter__()
        for register, method in _CALLBACKS:
            getattr(npu_trace, register)(getattr(self.event_handler, method), method.lstrip("_"))
        return True

    def disable(self):
        """Turns the sanitizer off: no more checks, no trace."""
        if self.dispatch is not None:
            self.dispatch.__exit__(None, None, None)
            self.dispatch = None
        torch_npu._C._deactivate_npu_trace()
        for registry, _ in npu_trace._KINDS:
            for _, method in _CALLBACKS:
                registry.remove_callback(method.lstrip("_"))
        self.enabled = False

    def __del__(self):
        try:
            if self.dispatch:
                self.dispatch.__exit__(None, None, None)
        except Exception:
            pass


def enable_npu_sanitizer():
    """Enables the NPU sanitizer for the rest of the process (see the module's docstring)."""
    npu_sanitizer.enable()


npu_sanitizer = NPUSanitizer()
