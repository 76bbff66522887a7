"""``torch_npu.profiler.profile``: host operators and npu tasks on one timeline.

The host side is torch.profiler's (Kineto's CPU activity: operators, shapes, stacks,
memory, step markers, schedules). The device side comes from the simulator, which
records every task a stream runs (core/acl/src/profiler.cpp). ``profile`` subclasses
torch.profiler.profile, so ``key_averages()``, ``events()`` and ``step()`` behave as in
torch; ``export_chrome_trace`` writes both sides, and ``tensorboard_trace_handler``
writes torch_npu's result directory ``{worker}_{pid}_{time}_ascend_pt/`` with
``ASCEND_PROFILER_OUTPUT/`` (trace_view.json and the CSV views, see _analysis.py).
"""
import enum
import json
import os
import socket
import tempfile
import time
import warnings
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional

import torch
import torch.profiler as _tp

from . import _analysis
from .experimental_config import _ExperimentalConfig

__all__ = ["ProfilerActivity", "supported_activities", "profile", "_KinetoProfile", "tensorboard_trace_handler",
           "analyse", "schedule", "ProfilerAction"]

ProfilerAction = _tp.ProfilerAction


def schedule(wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0):
    """torch_npu's schedule: after skip_first steps, cycles of wait, warmup and active
    steps (repeat of them; 0: until profiling stops). Returns step -> ProfilerAction."""
    for name, value, low in (("wait", wait, 0), ("active", active, 1), ("warmup", warmup, 0),
                             ("repeat", repeat, 0), ("skip_first", skip_first, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"schedule: {name} must be an int >= {low}, got {value!r}")
    return _tp.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
_RAW = os.path.join("FRAMEWORK", "torch_npu_raw.json")


class ProfilerActivity(enum.Enum):
    """What to record: host operators (``CPU``) and/or device tasks (``NPU``)."""

    CPU = "CPU"
    NPU = "NPU"


def supported_activities():
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def _activity(a):
    if isinstance(a, ProfilerActivity):
        return a
    if a == _tp.ProfilerActivity.CPU:
        return ProfilerActivity.CPU
    if a == _tp.ProfilerActivity.PrivateUse1:  # also torch.profiler.ProfilerActivity.NPU
        return ProfilerActivity.NPU
    raise TypeError(f"torch_npu.profiler.profile: activities must hold ProfilerActivity.CPU / .NPU, got {a!r}")


def _warn(msg):
    warnings.warn(f"[torch_npu.profiler] {msg}", stacklevel=3)


def _synchronize_all():
    if torch.npu.is_initialized():
        for d in range(torch.npu.device_count()):
            torch.npu.synchronize(d)


class profile(_tp.profile):
    """Profiler context manager with torch_npu's arguments (``experimental_config`` is
    torch_npu's :class:`_ExperimentalConfig`)."""

    def __init__(self, *, activities: Optional[Iterable[Any]] = None,
                 schedule: Optional[Callable[[int], Any]] = None,
                 on_trace_ready: Optional[Callable[..., Any]] = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Optional[_ExperimentalConfig] = None,
                 execution_trace_observer=None, custom_trace_id_callback=None, use_cuda: Optional[bool] = None):
        chosen = {_activity(a) for a in activities} if activities else supported_activities()
        if not chosen:
            raise ValueError("torch_npu.profiler.profile: activities is empty; pass ProfilerActivity.CPU and/or .NPU")
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            _warn("experimental_config is not an _ExperimentalConfig, set by default.")
            experimental_config = None
        if schedule is not None and not callable(schedule):
            _warn("schedule is not Callable, set by default.")
            schedule = None
        if on_trace_ready is not None and not callable(on_trace_ready):
            _warn("on_trace_ready is not Callable, set by default.")
            on_trace_ready = None
        if use_cuda is not None:
            _warn("This is npu environment, use_cuda is invalid")
        self._cpu = ProfilerActivity.CPU in chosen
        self._npu = ProfilerActivity.NPU in chosen
        self._npu_config = experimental_config or _ExperimentalConfig()
        self._user_on_trace_ready = on_trace_ready
        self._raw = None  # the last finished run (see _analysis)
        self._records = []
        self._npu_metadata = {}
        kwargs = dict(activities=[_tp.ProfilerActivity.CPU], schedule=schedule, on_trace_ready=self._collect_run,
                      record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                      with_flops=with_flops, with_modules=with_modules,
                      execution_trace_observer=execution_trace_observer)
        if custom_trace_id_callback is not None:
            kwargs["custom_trace_id_callback"] = custom_trace_id_callback
        super().__init__(**kwargs)

    # -- recording follows torch's (schedule, start/stop) ------------------------------------
    def start_trace(self):
        super().start_trace()
        if self._npu:
            from torch_npu import _C

            self._records = []
            self._epoch_minus_steady = time.time_ns() - _C._npu_profilerNowNs()
            _C._npu_profilerDrain()  # nothing from before this run
            _C._npu_profilerEnable(True)

    def stop_trace(self):
        if self._npu:
            from torch_npu import _C

            _synchronize_all()  # every task launched while recording has run and is recorded
            _C._npu_profilerEnable(False)
            records, dropped = _C._npu_profilerDrain()
            if dropped:
                _warn(f"{dropped} npu task records were dropped (buffer full); profile fewer steps.")
            self._records = records
        super().stop_trace()

    def _collect_run(self, _):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "host.json")
            super().export_chrome_trace(path)
            with open(path) as f:
                host = json.load(f)
        self._raw = {"trace": host, "records": [list(r) for r in self._records],
                     "epoch_minus_steady_ns": getattr(self, "_epoch_minus_steady", 0), "with_cpu": self._cpu,
                     "config": self._npu_config._to_dict(), "metadata": dict(self._npu_metadata)}
        if self._user_on_trace_ready is not None:
            self._user_on_trace_ready(self)

    # -- results ------------------------------------------------------------------------------
    def _finished_run(self):
        if self._raw is None:
            raise RuntimeError("torch_npu.profiler: no profiling data yet (leave the profile context, or let its "
                               "schedule reach RECORD_AND_SAVE, first)")
        return self._raw

    def export_chrome_trace(self, path: str):
        """Writes the host operators and the npu tasks of the last run as a chrome trace."""
        raw = self._finished_run()
        trace = _analysis.trace_view(raw, _analysis.link_tasks(raw), raw["with_cpu"])
        with open(path, "w") as f:
            json.dump(trace, f)
        return path

    def add_metadata(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            _warn("add_metadata: key and value must be str, ignored.")
            return
        self._npu_metadata[key] = value
        super().add_metadata(key, value)

    def add_metadata_json(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            _warn("add_metadata_json: key and value must be str, ignored.")
            return
        self._npu_metadata[key] = json.loads(value)
        super().add_metadata_json(key, value)

    def npu_tasks(self):
        """The npu tasks of the last run: dicts of name, kind, device, stream, start_us,
        dur_us and the launching host operator's name (a simulator extension)."""
        raw = self._finished_run()
        return [{"name": t.name, "kind": t.kind, "type": t.type, "device": t.device, "stream": t.stream,
                 "start_us": t.start, "dur_us": t.dur, "op": t.op["name"] if t.op else None}
                for t in _analysis.link_tasks(raw)]


_KinetoProfile = profile


def _result_dir(dir_name: Optional[str], worker_name: Optional[str]) -> str:
    if dir_name is None:
        work = os.getenv("ASCEND_WORK_PATH")
        dir_name = os.path.join(os.path.abspath(work), "profiling_data") if work else os.getcwd()
    worker = f"{worker_name or socket.gethostname()}_{os.getpid()}"
    stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
    path = os.path.join(os.path.realpath(dir_name), f"{worker}_{stamp}_ascend_pt")
    os.makedirs(path, exist_ok=True)
    return path


def tensorboard_trace_handler(dir_name: Optional[str] = None, worker_name: Optional[str] = None,
                              analyse_flag: bool = True, async_mode: bool = False):
    """An ``on_trace_ready`` that writes each finished run into its own result directory
    (``{dir_name}/{worker_name or host}_{pid}_{time}_ascend_pt``); with analyse_flag=False
    only the raw data is written (``analyse(path)`` parses it later)."""
    if dir_name is not None and not isinstance(dir_name, str):
        _warn("Invalid parameter dir_name, reset it to default.")
        dir_name = None
    if worker_name is not None and (not isinstance(worker_name, str) or not worker_name or len(worker_name) > 226):
        _warn("Invalid parameter worker_name, reset it to default.")
        worker_name = None
    if not isinstance(analyse_flag, bool):
        _warn("analyse_flag is not bool, set by default.")
        analyse_flag = True
    if not isinstance(async_mode, bool):
        _warn("async_mode is not bool, set by default.")

    def handler_fn(prof) -> None:
        raw = prof._finished_run()
        path = _result_dir(dir_name, worker_name)
        os.makedirs(os.path.join(path, "FRAMEWORK"), exist_ok=True)
        with open(os.path.join(path, _RAW), "w") as f:
            json.dump(raw, f)
        _write_info(path, raw)
        if analyse_flag:
            _analysis.write_results(raw, path, raw["with_cpu"])

    return handler_fn


def _write_info(path: str, raw: dict) -> None:
    import torch_npu

    info = {"config": {"common_config": raw["config"]}, "torch_npu_version": torch_npu.__version__,
            "cann_version": torch_npu.utils.get_cann_version(), "simulator": True}
    with open(os.path.join(path, "profiler_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    if raw.get("metadata"):
        with open(os.path.join(path, "profiler_metadata.json"), "w") as f:
            json.dump(raw["metadata"], f, indent=2)


def analyse(profiler_path: str, max_process_number: int = 1, export_type=None) -> None:
    """Parses result directories written with ``analyse_flag=False``: ``profiler_path`` is
    one ``*_ascend_pt`` directory or a directory holding several."""
    if not isinstance(profiler_path, str) or not os.path.isdir(profiler_path):
        raise ValueError(f"analyse: profiler_path must be an existing directory, got {profiler_path!r}")
    targets = [profiler_path] if os.path.isfile(os.path.join(profiler_path, _RAW)) else [
        os.path.join(profiler_path, d) for d in sorted(os.listdir(profiler_path))
        if os.path.isfile(os.path.join(profiler_path, d, _RAW))]
    if not targets:
        raise ValueError(f"analyse: no torch_npu profiling data under {profiler_path!r}")
    for path in targets:
        with open(os.path.join(path, _RAW)) as f:
            raw = json.load(f)
        _analysis.write_results(raw, path, raw.get("with_cpu", True))
