"""``torch_npu._C._mstx``: the marker runtime behind ``torch_npu.npu.mstx``.

torch_npu's markers (MindStudio Tools Extension) go to the profiler only while a profile
with mstx enabled (``_ExperimentalConfig(mstx=True)``, or ``msprof_tx``) records, and only
for the domains it takes (``mstx_domain_include`` / ``mstx_domain_exclude``); otherwise a
call does nothing and returns torch_npu's "disabled" value (0 from a range start, -1 from a
push or pop). The running profile collects them here (:func:`start` / :func:`stop`) and puts
them into its host trace as ``cat: "mstx"`` events: a mark is an instant event, a range a
complete event on the thread that started it (it may end on another thread). A marker with a
stream is recorded at its host time with the stream's id; on a real NPU it would also go
through the stream's task queue, the simulator's device timeline is not annotated.
"""
import itertools
import threading
import time

_lock = threading.Lock()
_run = None  # the recording profile run's collector, or None
_ids = itertools.count(1)  # range ids (0 means "not started")
_open = {}  # range id -> (message, domain, tid, start ns, stream id)
_stacks = threading.local()  # .by_domain: domain -> [range ids] of this thread's range_push


class _Run:
    def __init__(self, include, exclude):
        self.include, self.exclude = set(include), set(exclude)
        self.start_ns = time.time_ns()
        self.events = []  # ("mark" | "range", message, domain, tid, start ns, end ns, stream id)

    def takes(self, domain):
        return domain in self.include if self.include else domain not in self.exclude


def start(config) -> None:
    """Collect the markers of a profile run whose ``_ExperimentalConfig`` is ``config``
    (nothing is collected unless it enables mstx)."""
    global _run
    with _lock:
        _run = _Run(config._mstx_domain_include, config._mstx_domain_exclude) if config.tx_enabled else None


def stop() -> list:
    """End collecting; returns the run's markers (for :func:`trace_events`). Ranges still
    open are left out."""
    global _run
    with _lock:
        run, _run = _run, None
        _open.clear()
    return run.events if run is not None else []


def trace_events(markers, base_ns: int, pid: int) -> list:
    """``stop()``'s markers as chrome trace events of process ``pid``, in µs after ``base_ns``
    (epoch ns: the trace's ``baseTimeNanoseconds``)."""
    events = []
    for kind, message, domain, tid, start_ns, end_ns, stream in markers:
        e = {"ph": "X", "cat": "mstx", "name": message, "pid": pid, "tid": tid, "ts": (start_ns - base_ns) / 1000.0,
             "dur": (end_ns - start_ns) / 1000.0, "args": {"domain": domain}}
        if kind == "mark":
            del e["dur"]
            e.update(ph="i", s="t")  # an instant event of its thread
        if stream is not None:
            e["args"]["stream_id"] = stream
        events.append(e)
    return events


def _enabled(domain) -> bool:
    run = _run
    return run is not None and run.takes(domain)


def _record(kind, message, domain, tid, start_ns, end_ns, stream) -> None:
    with _lock:
        # A range that began before this run started is not part of it.
        if _run is not None and _run.takes(domain) and start_ns >= _run.start_ns:
            _run.events.append((kind, message, domain, tid, start_ns, end_ns, stream))


def _mark_impl(message, domain, stream):
    if _enabled(domain):
        now = time.time_ns()
        _record("mark", message, domain, threading.get_native_id(), now, now, stream)


def _range_start_impl(message, domain, stream) -> int:
    if not _enabled(domain):
        return 0
    range_id = next(_ids)
    with _lock:
        _open[range_id] = (message, domain, threading.get_native_id(), time.time_ns(), stream)
    return range_id


def _range_end(range_id: int, domain: str = "default") -> None:
    with _lock:
        entry = _open.pop(range_id, None)
    if entry is not None:
        message, domain, tid, start_ns, stream = entry
        _record("range", message, domain, tid, start_ns, time.time_ns(), stream)


def _range_push_impl(message, domain, stream) -> int:
    """Returns the depth of the domain's stack before the push (0 for the outermost range)."""
    range_id = _range_start_impl(message, domain, stream)
    if not range_id:
        return -1
    if not hasattr(_stacks, "by_domain"):
        _stacks.by_domain = {}
    stack = _stacks.by_domain.setdefault(domain, [])
    stack.append(range_id)
    return len(stack) - 1


def _range_pop(domain: str = "default") -> int:
    """Ends this thread's innermost pushed range of ``domain``; returns the depth after the
    pop, -1 when nothing was pushed."""
    stack = getattr(_stacks, "by_domain", {}).get(domain)
    if not stack:
        return -1
    _range_end(stack.pop(), domain)
    return len(stack)


# torch_npu's bindings: with a stream (given by its stream_id, device_index, device_type) or on the host.
def _mark_on_host(message: str, domain: str = "default") -> None:
    _mark_impl(message, domain, None)


def _mark(message: str, stream_id: int = 0, device_index: int = 0, device_type: int = 0,
          domain: str = "default") -> None:
    _mark_impl(message, domain, stream_id)


def _range_start_on_host(message: str, domain: str = "default") -> int:
    return _range_start_impl(message, domain, None)


def _range_start(message: str, stream_id: int = 0, device_index: int = 0, device_type: int = 0,
                 domain: str = "default") -> int:
    return _range_start_impl(message, domain, stream_id)


def _range_push_on_host(message: str, domain: str = "default") -> int:
    return _range_push_impl(message, domain, None)


def _range_push(message: str, stream_id: int = 0, device_index: int = 0, device_type: int = 0,
                domain: str = "default") -> int:
    return _range_push_impl(message, domain, stream_id)
