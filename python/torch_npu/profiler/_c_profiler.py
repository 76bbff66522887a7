"""``torch_npu._C._profiler``: the profiler's low-level API under torch_npu's binding names.

torch_npu binds its C++ profiler manager as ``torch_npu._C._profiler``; here the same names
drive the recorders this build has: torch's Kineto for the host side (operators, shapes,
stacks, memory) and the simulator's task records for the npu side (``_C._npu_profilerEnable``
/ ``_npu_profilerDrain``), plus the mstx markers. One session per process:

    _init_profiler(path, activities)            # a result directory for the next run
    _warmup_profiler(NpuProfilerConfig(...), activities)   # optional: prepares Kineto
    _start_profiler(NpuProfilerConfig(...), activities)
    ... work ...
    _stop_profiler()
    _finalize_profiler()                        # writes the run's raw data into path

which ``torch_npu.profiler.profiler_interface._ProfInterface`` (and through it
``ProfActionController``) uses; ``torch_npu.profiler.analyse(path)`` then parses the
directory. The system counter is the simulator's steady clock (``_get_syscnt``, ns; its
frequency ``_get_freq`` in MHz is 1000), the clock of the npu task records.
"""
import enum
import os
import tempfile
import threading
import time
import json

import torch

__all__ = []


class ProfilerActivity(enum.Enum):
    """What to record: host operators (``CPU``) and/or device tasks (``NPU``)."""

    CPU = "CPU"
    NPU = "NPU"


class _ExperimentalConfig:
    """The native form of ``torch_npu.profiler._ExperimentalConfig`` (what calling one returns)."""

    def __init__(self, trace_level: str = "Level0", metrics: str = "ACL_AICORE_NONE", l2_cache: bool = False,
                 record_op_args: bool = False, msprof_tx: bool = False, op_attr: bool = False, host_sys=None,
                 mstx_domain_include=None, mstx_domain_exclude=None, sys_io: bool = False,
                 sys_interconnection: bool = False):
        for name, value in (("l2_cache", l2_cache), ("record_op_args", record_op_args), ("msprof_tx", msprof_tx),
                            ("op_attr", op_attr), ("sys_io", sys_io), ("sys_interconnection", sys_interconnection)):
            if not isinstance(value, bool):
                raise TypeError(f"_ExperimentalConfig: {name} must be a bool, got {value!r}")
        for name, value in (("trace_level", trace_level), ("metrics", metrics)):
            if not isinstance(value, str):
                raise TypeError(f"_ExperimentalConfig: {name} must be a str, got {value!r}")
        lists = {}
        for name, value in (("host_sys", host_sys), ("mstx_domain_include", mstx_domain_include),
                            ("mstx_domain_exclude", mstx_domain_exclude)):
            value = [] if value is None else value
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"_ExperimentalConfig: {name} must be a list of str, got {value!r}")
            lists[name] = list(value)
        self.trace_level = trace_level
        self.metrics = metrics
        self.l2_cache = l2_cache
        self.record_op_args = record_op_args
        self.msprof_tx = msprof_tx
        self.op_attr = op_attr
        self.host_sys = lists["host_sys"]
        self.mstx_domain_include = lists["mstx_domain_include"]
        self.mstx_domain_exclude = lists["mstx_domain_exclude"]
        self.sys_io = sys_io
        self.sys_interconnection = sys_interconnection

    # what torch_npu._mstx.start reads
    @property
    def tx_enabled(self) -> bool:
        return self.msprof_tx

    @property
    def _mstx_domain_include(self) -> list:
        return self.mstx_domain_include

    @property
    def _mstx_domain_exclude(self) -> list:
        return self.mstx_domain_exclude

    def _to_dict(self) -> dict:
        return {"profiler_level": self.trace_level, "aic_metrics": self.metrics, "l2_cache": self.l2_cache,
                "msprof_tx": self.msprof_tx, "record_op_args": self.record_op_args, "op_attr": self.op_attr,
                "host_sys": list(self.host_sys)}

    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        return f"_ExperimentalConfig({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class NpuProfilerConfig:
    """What one run records: ``NpuProfilerConfig(path, record_shapes, profile_memory, with_stack,
    with_flops, with_modules, experimental_config)``."""

    def __init__(self, path: str, record_shapes: bool, profile_memory: bool, with_stack: bool, with_flops: bool,
                 with_modules: bool, experimental_config: _ExperimentalConfig):
        if not isinstance(path, str):
            raise TypeError(f"NpuProfilerConfig: path must be a str, got {path!r}")
        for name, value in (("record_shapes", record_shapes), ("profile_memory", profile_memory),
                            ("with_stack", with_stack), ("with_flops", with_flops), ("with_modules", with_modules)):
            if not isinstance(value, bool):
                raise TypeError(f"NpuProfilerConfig: {name} must be a bool, got {value!r}")
        if not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("NpuProfilerConfig: experimental_config must be a torch_npu._C._profiler._ExperimentalConfig"
                            f" (call a torch_npu.profiler._ExperimentalConfig), got {experimental_config!r}")
        self.path = path
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.with_modules = with_modules
        self.experimental_config = experimental_config


class _Session:
    """The process's profiling session (torch_npu's C++ ProfilerMgr)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.path = None
        self.activities = set()
        self.config = None
        self.kineto = None  # torch.profiler._KinetoProfile of the host side
        self.state = "idle"  # idle -> inited -> (warmup) -> running -> stopped -> idle
        self.records = []
        self.mstx_markers = []
        self.epoch_minus_steady = 0


_session = _Session()


def _activities(activities) -> set:
    chosen = set()
    for a in activities or ():
        if not isinstance(a, ProfilerActivity):
            raise TypeError(f"activities must hold torch_npu._C._profiler.ProfilerActivity values, got {a!r}")
        chosen.add(a)
    return chosen


def _supported_npu_activities() -> set:
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def _init_profiler(path: str, activities) -> None:
    """Begin a session writing into the result directory ``path``."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"_init_profiler: path must be a result directory, got {path!r}")
    with _session.lock:
        if _session.state in ("warmup", "running"):
            raise RuntimeError("_init_profiler: a profiling session is running; stop and finalize it first")
        _session.reset()
        _session.path = path
        _session.activities = _activities(activities)
        _session.state = "inited"


def _kineto(config: NpuProfilerConfig):
    import torch.profiler as tp

    experimental = torch._C._profiler._ExperimentalConfig(verbose=True) if config.with_stack else None
    return tp.profiler._KinetoProfile(activities=[tp.ProfilerActivity.CPU], record_shapes=config.record_shapes,
                                      profile_memory=config.profile_memory, with_stack=config.with_stack,
                                      with_flops=config.with_flops, with_modules=config.with_modules,
                                      experimental_config=experimental)


def _check_config(config) -> None:
    if not isinstance(config, NpuProfilerConfig):
        raise TypeError(f"config must be a torch_npu._C._profiler.NpuProfilerConfig, got {config!r}")


def _warmup_profiler(config: NpuProfilerConfig, activities) -> None:
    """Prepare the recorders (Kineto's warm-up) without recording. Outside a session just
    begun by _init_profiler there is nothing to prepare: a warning, as torch_npu logs it."""
    _check_config(config)
    with _session.lock:
        if _session.state != "inited":
            import warnings

            warnings.warn(f"[torch_npu.profiler] _warmup_profiler: no profiling session was initialized "
                          f"(the session is {_session.state}); nothing to warm up.")
            return
        _session.activities = _activities(activities) or _session.activities
        _session.config = config
        if ProfilerActivity.CPU in _session.activities:
            _session.kineto = _kineto(config)
            _session.kineto.prepare_trace()
        _session.state = "warmup"


def _start_profiler(config: NpuProfilerConfig, activities, scopes=None) -> None:
    """Start recording (after _init_profiler, and _warmup_profiler if it ran)."""
    from torch_npu import _C, _mstx

    _check_config(config)
    with _session.lock:
        if _session.state not in ("inited", "warmup"):
            raise RuntimeError(f"_start_profiler: call _init_profiler first (the session is {_session.state})")
        _session.activities = _activities(activities) or _session.activities
        _session.config = config
        if ProfilerActivity.CPU in _session.activities:
            if _session.kineto is None:
                _session.kineto = _kineto(config)
                _session.kineto.prepare_trace()
            _session.kineto.start_trace()
        _mstx.start(config.experimental_config)
        _session.epoch_minus_steady = time.time_ns() - _C._npu_profilerNowNs()  # (npu tasks, GC records)
        if ProfilerActivity.NPU in _session.activities:
            _C._npu_profilerDrain()  # nothing from before this run
            _C._npu_profilerEnable(True)
        _session.state = "running"


def _stop_profiler() -> None:
    """Stop recording; the run is kept for _finalize_profiler."""
    from torch_npu import _C, _mstx

    with _session.lock:
        if _session.state != "running":
            return
        if ProfilerActivity.NPU in _session.activities:
            if torch.npu.is_initialized():
                for d in range(torch.npu.device_count()):
                    torch.npu.synchronize(d)
            _C._npu_profilerEnable(False)
            records, dropped = _C._npu_profilerDrain()
            if dropped:
                import warnings

                warnings.warn(f"[torch_npu.profiler] {dropped} npu task records were dropped (buffer full); "
                              "profile fewer steps.")
            _session.records = records
        _session.mstx_markers = _mstx.stop()
        if _session.kineto is not None:
            _session.kineto.stop_trace()
        _session.state = "stopped"


def _finalize_profiler() -> None:
    """Write the run into the session's result directory (its raw data, as
    ``tensorboard_trace_handler(..., analyse_flag=False)`` writes it) and end the session.
    A session that never started (only warmed up) writes nothing."""
    from torch_npu import _mstx

    from .profiler import _rank, _save_raw

    with _session.lock:
        state, session = _session.state, _session
        if state == "running":
            raise RuntimeError("_finalize_profiler: call _stop_profiler first")
        if state == "warmup" and session.kineto is not None:
            session.kineto.start_trace()  # (Kineto cannot drop a prepared trace otherwise)
            session.kineto.stop_trace()
        if state == "stopped":
            host = {"traceEvents": []}
            if session.kineto is not None:
                with tempfile.TemporaryDirectory() as tmp:
                    trace = os.path.join(tmp, "host.json")
                    session.kineto.export_chrome_trace(trace)
                    # (Kineto can write a name that is not UTF-8: kept, with U+FFFD for the bad bytes)
                    with open(trace, encoding="utf-8", errors="replace") as f:
                        host = json.load(f)
            host["traceEvents"] = host.get("traceEvents", []) + _mstx.trace_events(
                session.mstx_markers, int(host.get("baseTimeNanoseconds", 0)), os.getpid())
            config = session.config
            common = {"record_shapes": config.record_shapes, "profile_memory": config.profile_memory,
                      "with_stack": config.with_stack, "with_flops": config.with_flops,
                      "with_modules": config.with_modules}
            raw = {"trace": host, "records": [list(r) for r in session.records],
                   "epoch_minus_steady_ns": session.epoch_minus_steady,
                   "with_cpu": ProfilerActivity.CPU in session.activities,
                   "with_npu": ProfilerActivity.NPU in session.activities,
                   "config": dict(config.experimental_config._to_dict(), **common), "rank": _rank(), "metadata": {}}
            os.makedirs(session.path, exist_ok=True)
            _save_raw(raw, session.path)
        _session.reset()


def _get_syscnt_enable() -> bool:
    return True


def _get_freq() -> int:
    """The system counter's frequency in MHz (the steady clock counts ns: 1000)."""
    return 1000


def _get_syscnt() -> int:
    from torch_npu import _C

    return int(_C._npu_profilerNowNs())


def _get_monotonic() -> int:
    return time.monotonic_ns()


def _get_host_uid() -> int:
    """A number naming this host (from /etc/machine-id, else the host name)."""
    import hashlib
    import socket

    try:
        with open("/etc/machine-id") as f:
            key = f.read().strip()
    except OSError:
        key = socket.gethostname()
    return int(hashlib.sha1(key.encode()).hexdigest()[:15], 16)
