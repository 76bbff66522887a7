"""``torch_npu.npu.mstx``: marks and ranges for the profiler (MindStudio Tools Extension).

A mark or a range is a user annotation that a ``torch_npu.profiler.profile`` run with mstx
enabled (``experimental_config=_ExperimentalConfig(mstx=True)``) shows in its traces, as
``cat: "mstx"`` events with their domain (see torch_npu/_mstx.py, the runtime behind
``torch_npu._C._mstx``). Without such a run the calls do nothing (a range start returns 0, a
push or pop -1). As in torch_npu, a bad argument warns (naming it) and the call does nothing.
"""

import functools
import warnings

import torch_npu
from torch_npu.npu.streams import Stream

__all__ = ["mstx", "annotate"]


def _warn_on_error(default):
    """Markers never break the program: an error is reported as a warning."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except Exception as ex:  # noqa: BLE001
                warnings.warn(f"mstx.{func.__name__} failed: {ex}")
                return default
        return wrapper
    return decorator


def _invalid(fn, message, stream, domain, need_message=True, need_domain=True) -> bool:
    """Warns about the first bad argument of ``mstx.<fn>`` and returns True, else False."""
    if need_message and (not message or not isinstance(message, str)):
        warnings.warn(f"Invalid message for mstx.{fn} function. Please provide a valid message string.")
        return True
    if not isinstance(domain, str) or (need_domain and not domain):
        warnings.warn(f"Invalid domain for mstx.{fn} function. Please provide a valid domain string.")
        return True
    if stream and not isinstance(stream, Stream):
        warnings.warn(f"Invalid stream for mstx.{fn} function. Please provide a valid npu stream.")
        return True
    return False


def _call(name, message, stream, domain):
    """``torch_npu._C._mstx.<name>`` with the stream's identity, or its ``..._on_host`` form."""
    runtime = torch_npu._C._mstx
    if stream:
        return getattr(runtime, name)(message, stream.stream_id, stream.device_index, stream.device_type, domain)
    return getattr(runtime, name + "_on_host")(message, domain)


class mstx:
    @staticmethod
    @_warn_on_error(None)
    def mark(message: str, stream=None, domain: str = 'default'):
        """An instant marker ``message`` (on ``stream``'s timeline position when given)."""
        if not _invalid("mark", message, stream, domain, need_domain=False):
            _call("_mark", message, stream, domain)

    @staticmethod
    @_warn_on_error(-1)
    def range_push(message: str, stream=None, domain: str = 'default') -> int:
        """Opens a range on this thread's stack of ``domain``; returns the stack's depth
        before the push, -1 when nothing was opened."""
        if _invalid("range_push", message, stream, domain):
            return -1
        return _call("_range_push", message, stream, domain)

    @staticmethod
    @_warn_on_error(-1)
    def range_pop(domain: str = 'default') -> int:
        """Closes this thread's innermost ``range_push`` of ``domain``; returns the stack's
        depth after the pop, -1 when there was none."""
        if _invalid("range_pop", None, None, domain, need_message=False):
            return -1
        return torch_npu._C._mstx._range_pop(domain)

    @staticmethod
    @_warn_on_error(0)
    def range_start(message: str, stream=None, domain: str = 'default') -> int:
        """Opens a range that ``range_end(id)`` closes, from any thread; returns its id
        (0: nothing was opened)."""
        if _invalid("range_start", message, stream, domain):
            return 0
        return _call("_range_start", message, stream, domain)

    @staticmethod
    @_warn_on_error(None)
    def range_end(range_id: int, domain: str = 'default'):
        """Closes the range ``range_id`` of ``range_start``."""
        if not isinstance(range_id, int):
            warnings.warn("Invalid range_id for mstx.range_end function. "
                          "Please provide the return value from mstx.range_start.")
            return
        if _invalid("range_end", None, None, domain, need_message=False):
            return
        torch_npu._C._mstx._range_end(range_id, domain)

    @staticmethod
    def mstx_range(message: str, stream=None, domain: str = 'default'):
        """Decorator: each call of the function is a range ``message``."""
        return annotate(message, stream, domain)


class annotate:
    """A range ``message`` as a context manager or decorator (the function's name when
    ``message`` is empty)."""

    def __init__(self, message: str = '', stream=None, domain: str = 'default'):
        self.message = message
        self.stream = stream
        self.domain = domain
        self.range_id = None

    def __enter__(self):
        self.range_id = mstx.range_start(self.message, self.stream, self.domain)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.range_id is not None:
            mstx.range_end(self.range_id, self.domain)
            self.range_id = None
        return False

    def __call__(self, func):
        message = self.message or func.__name__

        @functools.wraps(func)
        def inner(*args, **kwargs):
            with annotate(message, self.stream, self.domain):
                return func(*args, **kwargs)
        return inner


mstx.annotate = annotate
