"""``torch_npu.npu.mstx``: marks and ranges for the profiler (MindStudio Tools Extension).

A mark or a range is a host-side user annotation of the running profiler: it appears in
``torch_npu.profiler`` / ``torch.profiler`` traces as a ``record_function`` event named by the
message (``"<domain>::<message>"`` outside the ``default`` domain). Without a profiler it
costs a dictionary update. As in torch_npu, a bad argument warns and the call does nothing;
``stream`` must be an npu Stream when given (on a real NPU the marker is also put on the
stream's task queue; the simulator's device timeline is not annotated).
"""

import functools
import itertools
import threading
import warnings

import torch

__all__ = ["mstx", "annotate"]

_lock = threading.Lock()
_ids = itertools.count(1)
_ranges = {}                    # range id -> (domain, record_function handle)
_stacks = threading.local()     # per thread, per domain: [range ids] of range_push


def _valid(fn, message, stream, domain, need_message=True):
    if need_message and (not message or not isinstance(message, str)):
        warnings.warn(f"Invalid message for mstx.{fn} function. Please provide a valid message string.")
        return False
    if not isinstance(domain, str):
        warnings.warn(f"Invalid domain for mstx.{fn} function. Please provide a valid domain string.")
        return False
    if stream is not None and not (isinstance(stream, torch.Stream) and stream.device.type == "npu"):
        warnings.warn(f"Invalid stream for mstx.{fn} function. Please provide a valid stream.")
        return False
    return True


def _name(message, domain):
    return message if domain == "default" else f"{domain}::{message}"


def _enter(message, domain):
    return torch.ops.profiler._record_function_enter_new(_name(message, domain), None)


def _exit(handle):
    torch.ops.profiler._record_function_exit._RecordFunction(handle)


class mstx:
    @staticmethod
    def mark(message: str, stream=None, domain: str = 'default'):
        if _valid("mark", message, stream, domain):
            _exit(_enter(message, domain))

    @staticmethod
    def range_push(message: str, stream=None, domain: str = 'default') -> int:
        if not _valid("range_push", message, stream, domain):
            return 0
        range_id = mstx.range_start(message, stream, domain)
        if not hasattr(_stacks, "by_domain"):
            _stacks.by_domain = {}
        _stacks.by_domain.setdefault(domain, []).append(range_id)
        return range_id

    @staticmethod
    def range_pop(domain: str = 'default') -> int:
        stack = getattr(_stacks, "by_domain", {}).get(domain)
        if not stack:
            warnings.warn("mstx.range_pop: no range was pushed in this domain.")
            return 0
        range_id = stack.pop()
        mstx.range_end(range_id, domain)
        return range_id

    @staticmethod
    def range_start(message: str, stream=None, domain: str = 'default') -> int:
        if not _valid("range_start", message, stream, domain):
            return 0
        handle = _enter(message, domain)
        with _lock:
            range_id = next(_ids)
            _ranges[range_id] = (domain, handle)
        return range_id

    @staticmethod
    def range_end(range_id: int, domain: str = 'default'):
        if isinstance(range_id, bool) or not isinstance(range_id, int):
            warnings.warn("Invalid range_id for mstx.range_end function. Please use the id from range_start.")
            return
        with _lock:
            entry = _ranges.pop(range_id, None)
        if entry is None:
            warnings.warn(f"mstx.range_end: range id {range_id} is not open.")
            return
        _exit(entry[1])

    @staticmethod
    def mstx_range(message: str, stream=None, domain: str = 'default'):
        def wrapper(func):
            @functools.wraps(func)
            def inner(*args, **kwargs):
                range_id = mstx.range_start(message, stream, domain)
                try:
                    return func(*args, **kwargs)
                finally:
                    if range_id:
                        mstx.range_end(range_id, domain)
            return inner
        return wrapper


class annotate:
    def __init__(self, message: str = '', stream=None, domain: str = 'default'):
        self.message = message
        self.stream = stream
        self.domain = domain
        self.range_id = 0

    def __enter__(self):
        self.range_id = mstx.range_start(self.message, self.stream, self.domain)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.range_id:
            mstx.range_end(self.range_id, self.domain)
            self.range_id = 0
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            with annotate(self.message, self.stream, self.domain):
                return func(*args, **kwargs)
        return inner


mstx.annotate = annotate
