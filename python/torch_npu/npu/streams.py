"""NPU streams and events: ``torch.npu.Stream``/``Event`` and the current-stream API.

``Stream`` and ``Event`` subclass PyTorch's device-generic ``torch.Stream`` and
``torch.Event``; the work (stream pools, recording, waiting, timing) happens in the
C++ device guard registered for PrivateUse1, so ``torch.Stream("npu")`` and
``torch.npu.Stream()`` are interchangeable. This module adds torch_npu's
constructor signatures, the raw ``npu_stream`` handle and the stream context
managers.
"""

import collections
import ctypes
import functools
from typing import Any, Optional

import torch

from torch_npu import _C
from .utils import _valid_device_index, _lazy_init
from ..utils._error_code import ErrCode, pta_error

__all__ = [
    "Stream",
    "Event",
    "ExternalEvent",
    "ExternalStream",
    "SyncLaunchStream",
    "StreamContext",
    "stream",
    "set_stream",
    "current_stream",
    "default_stream",
    "set_sync_debug_mode",
    "get_sync_debug_mode",
]


def _check_npu_stream(obj, *, fn: str, arg: str = "stream") -> None:
    if not isinstance(obj, torch.Stream):
        raise TypeError(f"{fn}(): argument '{arg}' must be a torch.npu.Stream (or a torch.Stream "
                        f"on an npu device), got {type(obj).__name__}")
    if obj.device.type != "npu":
        raise ValueError(f"{fn}(): argument '{arg}' must be a stream of an npu device, "
                         f"got a stream of {obj.device}")


_data_preprocess_streams = {}   # (device index, stream id) -> bool


class Stream(torch.Stream):
    r"""Wrapper around an NPU stream: an ordered queue of work on one device.

    Args:
        device (torch.device, str or int, optional): device on which to create the
            stream; the current device if ``None``.
        priority (int, optional): priority of the stream, lower is higher. Default 0.

    It can be used as a context manager (``with torch.npu.Stream() as s:``) to make it
    the current stream for the block.
    """

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs.pop("is_sync_launch", False):
            if kwargs:
                raise TypeError(f"torch.npu.Stream(is_sync_launch=True) got unexpected keyword arguments "
                                f"{sorted(kwargs)}")
            _lazy_init()
            idx = _valid_device_index(device, fn="torch.npu.Stream")
            stream_id, device_index, device_type = _C._npu_getSyncLaunchStream(idx)
            return super().__new__(cls, priority=priority, stream_id=stream_id, device_index=device_index,
                                   device_type=device_type)
        if "stream_id" in kwargs:
            # Re-wrap an existing stream: Stream(stream_id=, device_index=, device_type=).
            missing = {"device_index", "device_type"} - kwargs.keys()
            if missing:
                raise TypeError(f"torch.npu.Stream(stream_id=...) also needs {sorted(missing)}")
            stream = super().__new__(cls, priority=priority, **kwargs)
            # Fail fast, as torch_npu: the id must name a stream of an npu device.
            if stream.device.type != "npu":
                raise RuntimeError(f"torch.npu.Stream(): device_type {kwargs['device_type']} is not the npu's")
            count = _C._npu_getDeviceCount()
            if not 0 <= stream.device_index < count:
                raise RuntimeError(f"torch.npu.Stream(): device_index {stream.device_index} is out of range: "
                                   f"{count} npu device(s) are visible")
            _C._npu_streamRawHandle(stream.stream_id, stream.device_index)
            return stream
        if kwargs:
            raise TypeError(f"torch.npu.Stream() got unexpected keyword arguments {sorted(kwargs)}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"torch.npu.Stream(): argument 'priority' must be an int, "
                            f"got {type(priority).__name__}")
        _lazy_init()
        # As torch_npu's and torch.cuda's: a negative index (or a float, which their
        # torch.npu.device(...) does not read as an index) means the current device.
        if isinstance(device, float) or (type(device) is int and device < 0):
            device = None
        idx = _valid_device_index(device, fn="torch.npu.Stream")
        return super().__new__(cls, torch.device("npu", idx), priority=priority)

    def wait_event(self, event):
        r"""Make all future work submitted to this stream wait for ``event``."""
        event.wait(self)

    def wait_stream(self, stream):
        r"""Make all future work submitted to this stream wait for the work
        submitted so far to ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        r"""Record ``event`` (a new :class:`Event` if ``None``) on this stream and return it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    @property
    def priority(self):
        r"""The stream's priority: -1 (high) or 0 (normal)."""
        return _C._npu_streamPriority(self.stream_id, self.device_index)

    def query(self):
        r"""Return whether all work submitted to this stream has completed."""
        return super().query()

    def synchronize(self):
        r"""Wait until all work submitted to this stream has completed."""
        super().synchronize()

    def set_data_preprocess_stream(self, is_data_preprocess_stream=False):
        r"""Mark the stream as the one that prepares input data (torch_npu gives such a stream
        its own hardware queue). The simulator records the mark
        (``_is_data_preprocess_stream``); its streams all run on host worker threads."""
        _data_preprocess_streams[(self.device_index, self.stream_id)] = bool(is_data_preprocess_stream)

    @property
    def _is_data_preprocess_stream(self) -> bool:
        return _data_preprocess_streams.get((self.device_index, self.stream_id), False)

    @property
    def npu_stream(self) -> int:
        r"""Address of the underlying ``aclrtStream``."""
        return int(_C._npu_streamRawHandle(self.stream_id, self.device_index))

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_stream)

    def __eq__(self, other) -> bool:
        if isinstance(other, torch.Stream):
            return super().__eq__(other)
        return False

    def __hash__(self) -> int:
        return hash((self.stream_id, self.device_index, self.device_type))

    def __repr__(self) -> str:
        return f"<torch_npu.npu.Stream device={self.device} npu_stream={self.npu_stream:#x}>"


class SyncLaunchStream(Stream):
    r"""An NPU stream whose kernels bypass the task queue (torch_npu's sync-launch streams):
    each launch runs on the calling thread, after what the stream already holds, as with
    ``TASK_QUEUE_ENABLE=0`` for this stream alone. Events and waits work as on any stream.

    Args:
        device (torch.device or int, optional): the device; the current one if ``None``.
        priority (int, optional): accepted for torch_npu's signature (sync-launch streams
            have one priority).
    """

    def __new__(cls, device=None, priority=0, **kwargs):
        return super().__new__(cls, device=device, priority=priority, is_sync_launch=True, **kwargs)


class ExternalStream(Stream):
    r"""Wrapper around an ``aclrtStream`` created outside PyTorch.

    The caller keeps the stream alive while this object is used, and tracks its completion:
    as in torch_npu, :meth:`query` and :meth:`synchronize` refuse an external stream (record
    an event on it instead).

    Args:
        stream_ptr (int): address of the ``aclrtStream``.
        device (torch.device or int, optional): device the stream was created on.
    """

    def __new__(cls, stream_ptr, device=None, **kwargs):
        if not isinstance(stream_ptr, int) or isinstance(stream_ptr, bool):
            raise TypeError("torch.npu.ExternalStream(): argument 'stream_ptr' must be an int "
                            f"(an aclrtStream address), got {type(stream_ptr).__name__}")
        _lazy_init()
        idx = _valid_device_index(device, fn="torch.npu.ExternalStream")
        stream_id, device_index, device_type = _C._npu_getStreamFromExternal(stream_ptr, idx)
        return super().__new__(cls, stream_id=stream_id, device_index=device_index,
                               device_type=device_type, **kwargs)


class Event(torch.Event):
    r"""Wrapper around an NPU event: a marker in a stream to synchronise on or time.

    Args:
        enable_timing (bool, optional): record timestamps for :meth:`elapsed_time`.
        blocking (bool, optional): make :meth:`synchronize` block the thread
            (instead of spinning).
        interprocess (bool, optional): allow sharing the event between processes
            (:meth:`ipc_handle`, :meth:`from_ipc_handle`, pickling through
            ``torch.multiprocessing``); cannot be combined with ``enable_timing``.

    The event belongs to the device of the first stream it is recorded on.
    """

    _ipc = None  # interprocess events: the _C._NPUIpcEvent

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        if interprocess and enable_timing:
            raise RuntimeError("Parameter interprocess cannot be specified together with other parameters."
                               + pta_error(ErrCode.NOT_SUPPORT))
        self = super().__new__(cls, torch.device("npu"), enable_timing=bool(enable_timing),
                               blocking=bool(blocking), interprocess=bool(interprocess))
        if interprocess:
            self._ipc = _C._NPUIpcEvent()
        return self

    @classmethod
    def from_ipc_handle(cls, device, handle):
        r"""The interprocess event of another process, from its :meth:`ipc_handle`, on ``device``."""
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "npu":
                raise RuntimeError("Event can only be created on PrivateUse1 devices, but got device type "
                                   f"{device.type}" + pta_error(ErrCode.PARAM))
            device = device.index
        idx = _valid_device_index(device, fn="Event.from_ipc_handle")
        if not isinstance(handle, (bytes, bytearray)):
            raise TypeError("Event.from_ipc_handle(): argument 'handle' must be bytes (an Event.ipc_handle()), "
                            f"got {type(handle).__name__}")
        _lazy_init()
        ipc = _C._NPUIpcEvent.from_ipc_handle(idx, bytes(handle))
        self = torch.Event.__new__(cls, torch.device("npu", idx), interprocess=True)
        self._ipc = ipc
        return self

    @property
    def device(self):
        r"""The device of the event: ``None`` until it is recorded (or, for an interprocess event,
        exported), as torch_npu's and CUDA's."""
        if self._ipc is not None:
            return torch.device("npu", self._ipc.device) if self._ipc.device >= 0 else None
        device = torch.Event.device.__get__(self)
        return device if device.index is not None else None

    def record(self, stream=None):
        r"""Record the event on ``stream`` (the current stream if ``None``)."""
        if stream is None:
            stream = current_stream()
        else:
            _check_npu_stream(stream, fn="Event.record")
        if self._ipc is not None:
            self._ipc.record(stream.stream_id, stream.device_index)
            return
        super().record(stream)

    def wait(self, stream=None):
        r"""Make all future work submitted to ``stream`` (the current stream if
        ``None``) wait for this event."""
        if stream is None:
            stream = current_stream()
        else:
            _check_npu_stream(stream, fn="Event.wait")
        if self._ipc is not None:
            self._ipc.wait(stream.stream_id, stream.device_index)
            return
        super().wait(stream)

    def query(self):
        r"""Return whether the work captured by the event has completed."""
        if self._ipc is not None:
            return self._ipc.query()
        return super().query()

    def elapsed_time(self, end_event):
        r"""Return the milliseconds between this event and ``end_event``.

        Both events need ``enable_timing=True`` and must have been recorded; as in torch_npu,
        this waits for both to complete.
        """
        if not isinstance(end_event, torch.Event):
            raise TypeError("Event.elapsed_time(): argument 'end_event' must be a "
                            f"torch.npu.Event, got {type(end_event).__name__}")
        if self._ipc is not None or getattr(end_event, "_ipc", None) is not None:
            raise RuntimeError("Event.elapsed_time(): interprocess events do not time (create both with "
                               "enable_timing=True and interprocess=False)")
        if type(end_event) is torch.Event:
            # torch_npu's events wait for both ends; PyTorch's generic Event requires them done.
            self.synchronize()
            end_event.synchronize()
            return super().elapsed_time(end_event)
        # torch.Event.elapsed_time() rejects subclasses of torch.Event as its argument
        # (exact type check in torch/csrc/Event.cpp): time the raw events instead.
        device = self.device.index if self.device is not None else -1
        return float(_C._npu_eventElapsedTime(self.event_id, end_event.event_id, device))

    def recorded_time(self):
        r"""When the event's latest record completed, in microseconds since the device
        started (an int). As in torch_npu, this waits for the event to complete."""
        if not self.event_id:
            raise RuntimeError("Event must be recorded before getting recorded timestamp.")
        self.synchronize()
        return int(_C._npu_eventRecordedTime(self.event_id))

    def synchronize(self):
        r"""Wait until the work captured by the event has completed."""
        if self._ipc is not None:
            self._ipc.synchronize()
            return
        super().synchronize()

    def ipc_handle(self):
        r"""A handle (64 bytes) another process opens with :meth:`from_ipc_handle`: the same
        event there. The event must be created with ``interprocess=True``; if not yet recorded,
        it is created on the current device. Valid while this process keeps the event."""
        if self._ipc is None:
            raise RuntimeError("Event.ipc_handle(): the event was not created with interprocess=True"
                               + pta_error(ErrCode.PARAM))
        return self._ipc.ipc_handle()

    @property
    def npu_event(self) -> int:
        r"""Address of the underlying ``aclrtEvent`` (0 before the first record)."""
        if self._ipc is not None:
            return int(self._ipc.npu_event)
        return int(self.event_id)

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_event)

    def __repr__(self) -> str:
        if self.npu_event:
            return f"<torch_npu.npu.Event {self.npu_event:#x}>"
        return "<torch_npu.npu.Event uninitialized>"


class ExternalEvent:
    r"""An NPU event that works as a flag (torch_npu's ``graph_external`` events): :meth:`record`
    sets it, :meth:`reset` clears it, and a stream told to :meth:`wait` waits until it is set,
    also when the wait comes before any record. Waits and resets issued while a stream
    captures an NPU graph are part of the graph: each replay waits for the flag at that point
    (task group updates use this: see :func:`torch.npu.graph_task_update_begin`). A replay
    waiting for a flag nobody sets waits forever, as on Ascend.

    The event belongs to the device of the first stream it is used with.
    """

    def __init__(self):
        self._event = _C._NPUExternalEvent()

    def _apply(self, method, stream, fn):
        if stream is None:
            stream = current_stream()
        else:
            _check_npu_stream(stream, fn=fn)
        method(stream.stream_id, stream.device_index)

    def record(self, stream=None):
        r"""Set the flag when ``stream`` (the current stream if ``None``) gets there."""
        self._apply(self._event.record, stream, "ExternalEvent.record")

    def wait(self, stream=None):
        r"""Make the work submitted to ``stream`` (the current stream if ``None``) from now on
        wait until the flag is set."""
        self._apply(self._event.wait, stream, "ExternalEvent.wait")

    def reset(self, stream=None):
        r"""Clear the flag when ``stream`` (the current stream if ``None``) gets there."""
        self._apply(self._event.reset, stream, "ExternalEvent.reset")

    @property
    def npu_event(self) -> int:
        r"""Address of the underlying ``aclrtEvent`` (0 before the first use)."""
        return int(self._event.npu_event)

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_event)

    def __repr__(self) -> str:
        if self.npu_event:
            return f"<torch_npu.npu.ExternalEvent {self.npu_event:#x}>"
        return "<torch_npu.npu.ExternalEvent uninitialized>"


def _stream_of(data) -> Stream:
    stream_id, device_index, device_type = data
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device=None):
    r"""Return the current :class:`Stream` of ``device`` (the current device if ``None``)."""
    _lazy_init()
    idx = _valid_device_index(device, fn="current_stream")
    return _stream_of(_C._npu_getCurrentStream(idx))


def default_stream(device=None):
    r"""Return the default :class:`Stream` of ``device`` (the current device if ``None``)."""
    _lazy_init()
    idx = _valid_device_index(device, fn="default_stream")
    return _stream_of(_C._npu_getDefaultStream(idx))


def set_stream(stream):
    r"""Make ``stream`` the current stream of its device. ``None`` is a no-op.

    Prefer the :func:`stream` context manager.
    """
    if stream is None:
        return
    _check_npu_stream(stream, fn="set_stream")
    _lazy_init()
    _C._npu_setStream(stream.stream_id, stream.device_index, stream.device_type)


class StreamContext:
    r"""Context manager that makes ``stream`` the current stream (no-op for ``None``).

    If the stream is on another device than the current one, that device becomes the
    current device inside the block (as in torch_npu and CUDA); both are restored after it.
    """

    def __init__(self, stream_ctx: Optional["torch_npu.npu.Stream"]):
        if stream_ctx is not None:
            _check_npu_stream(stream_ctx, fn="torch.npu.stream")
        self.stream = stream_ctx
        self.src_prev_stream = None
        self.dst_prev_stream = None

    def __enter__(self):
        cur = self.stream
        if cur is None:
            return self
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device != cur.device:
            self.dst_prev_stream = current_stream(cur.device)
        set_stream(cur)
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any):
        cur = self.stream
        if cur is None:
            return False
        if self.dst_prev_stream is not None:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)
        return False


def stream(stream):
    r"""Context manager that selects ``stream`` as the current stream (see :class:`StreamContext`)."""
    return StreamContext(stream)


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode):
    r"""Set the debug mode for synchronising operations.

    Args:
        debug_mode (str or int): ``"default"``/0, ``"warn"``/1 or ``"error"``/2.

    Synchronising operations are those that wait for the device: ``.item()``, copies to
    the host and blocking copies from pageable host memory, ``Stream.synchronize()``.
    ``"warn"`` warns "called a synchronizing NPU operation" at each, ``"error"`` raises.
    """
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, "
                               f"`error`, got {debug_mode!r}" + pta_error(ErrCode.PARAM))
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    elif isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise TypeError("set_sync_debug_mode(): argument 'debug_mode' must be a str or an int, "
                        f"got {type(debug_mode).__name__}")
    elif debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode, expected one of 0,1,2, got {debug_mode}"
                           + pta_error(ErrCode.PARAM))
    _C._npu_set_sync_debug_mode(debug_mode)


def get_sync_debug_mode():
    r"""Return the debug mode for synchronising operations (0, 1 or 2)."""
    return _C._npu_get_sync_debug_mode()


def _erase_stream(tensor, stream):
    r"""Undo ``tensor.record_stream(stream)`` (``torch_npu.erase_stream``).

    The caching allocator then frees ``tensor``'s memory without waiting for the work
    queued on ``stream`` so far: use it after making the freeing stream wait for
    ``stream`` (an event wait), so that later kernels cannot overwrite memory that
    ``stream`` still reads.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"erase_stream(): argument 'tensor' must be a torch.Tensor, got "
                        f"{type(tensor).__name__}")
    if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
        raise TypeError(f"erase_stream(): argument 'stream' must be a torch.npu.Stream, got "
                        f"{type(stream).__name__}")
    if tensor.device.type != "npu":
        raise ValueError(f"erase_stream(): argument 'tensor' must be an npu tensor, got a tensor "
                         f"on {tensor.device}")
    _C._npu_eraseStream(tensor, stream.stream_id, stream.device_index, stream.device_type)


def _check_host_func_stream(op_stream, fn_name):
    if not isinstance(op_stream, torch.Stream) or op_stream.device.type != "npu":
        raise TypeError(f"{fn_name}(): argument 'op_stream' must be a torch.npu.Stream, "
                        f"got {type(op_stream).__name__}")


def _launch_host_func(op_stream, fn, user_data):
    r"""Queue ``fn(user_data)`` on ``op_stream``: when the stream reaches it, the Python function
    runs (taking the GIL) and the stream waits for it; recorded and run on every replay when the
    stream captures an NPU graph. ``fn`` may queue npu work; an exception it raises surfaces at
    the stream's next synchronisation."""
    _check_host_func_stream(op_stream, "_launch_host_func")
    _C._npu_launch_host_func(op_stream.stream_id, op_stream.device_index, fn, user_data, True)


_pending_runner = None


def _launch_host_func_pending(op_stream, fn, user_data):
    r"""As :func:`_launch_host_func`, but the stream does not wait: when it reaches the call,
    ``fn(user_data)`` is handed to a host thread of torch_npu's, which runs such calls in
    order. An exception ``fn`` raises is printed there.

    As in torch_npu, host memory named in ``user_data`` by ptr specs
    (``torch_npu.npu.graphs._make_npugraph_tensor_ptr_spec``, also inside tuples and lists)
    reaches ``fn`` as buffer specs holding its bytes as they were when the stream reached the
    call (the stream waits for that copy, not for ``fn``)."""
    global _pending_runner
    _check_host_func_stream(op_stream, "_launch_host_func_pending")
    from torch_npu.npu import graphs

    if graphs._holds_npugraph_tensor_ptr_spec(user_data):
        copies = collections.deque()  # oldest first: pending calls run in stream order
        _launch_host_func(op_stream, lambda data: copies.append(graphs._copy_npugraph_tensor_ptr_specs(data)),
                          user_data)
        fn, user_data = functools.partial(_call_with_oldest, fn, copies), None
    if _pending_runner is None:
        import threading

        def run():
            import traceback
            while True:
                try:
                    _C._npu_run_next_pending_host_func()
                except Exception:  # the caller is gone: report it like an unraisable error
                    traceback.print_exc()

        _pending_runner = threading.Thread(target=run, name="npu_host_func", daemon=True)
        _pending_runner.start()
    _C._npu_launch_host_func(op_stream.stream_id, op_stream.device_index, fn, user_data, False)


def _call_with_oldest(fn, copies, _):
    fn(copies.popleft())


def _subscribe_report(op_stream):
    r"""torch_npu's set-up for :func:`_launch_host_func` on ``op_stream`` (a host thread that
    processes the stream's callback reports). Host functions run on the simulated stream's own
    thread, so there is nothing to set up: this checks the stream."""
    _check_host_func_stream(op_stream, "_subscribe_report")
    _C._npu_streamRawHandle(op_stream.stream_id, op_stream.device_index)


def _unsubscribe_report(op_stream):
    r"""Undoes :func:`_subscribe_report` (nothing to undo here: it checks the stream)."""
    _check_host_func_stream(op_stream, "_unsubscribe_report")
    _C._npu_streamRawHandle(op_stream.stream_id, op_stream.device_index)
