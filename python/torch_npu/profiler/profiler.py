"""``torch_npu.profiler.profile``: host operators and npu tasks on one timeline.

The host side is torch.profiler's (Kineto's CPU activity: operators, shapes, stacks,
memory, step markers, schedules). The device side comes from the simulator, which
records every task a stream runs (core/acl/src/profiler.cpp). ``profile`` subclasses
torch.profiler.profile, so ``key_averages()``, ``events()`` and ``step()`` behave as in
torch; ``export_chrome_trace`` writes both sides, and ``tensorboard_trace_handler``
writes torch_npu's result directory ``{worker}_{pid}_{time}_ascend_pt/`` with
``ASCEND_PROFILER_OUTPUT/`` (trace_view.json and the CSV views, see _analysis.py).
"""
import collections.abc
import glob
import json
import os
import random
import string
import tempfile
import time
import warnings
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.profiler as _tp

from torch_npu import _mstx

from . import _analysis
from ._c_profiler import ProfilerActivity, _supported_npu_activities  # (torch_npu._C._profiler)
from ._flops_hook import FlopsHookManager
from ._profiler_path_creator import ProfPathCreator
from .experimental_config import _ExperimentalConfig
from .scheduler import ProfilerAction, Schedule, _to_torch_action

schedule = Schedule  # torch_npu.profiler.schedule is the class

__all__ = ["supported_activities", "profile", "_KinetoProfile", "tensorboard_trace_handler", "analyse"]

_RAW = os.path.join("FRAMEWORK", "torch_npu_raw.json")  # host side of a run
_TASKS = "sim_task_records.json"  # device side, per device, under PROF_*/device_{d}/data/


def supported_activities():
    return _supported_npu_activities()


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
        self._mstx_markers = []  # torch_npu.npu.mstx's, see torch_npu/_mstx.py
        self._npu_metadata = {}
        if schedule is not None:  # torch_npu's or torch's ProfilerAction -> torch's, which torch's profile uses
            user_schedule = schedule
            schedule = lambda step: _to_torch_action(user_schedule(step))  # noqa: E731
        kwargs = dict(activities=[_tp.ProfilerActivity.CPU], schedule=schedule, on_trace_ready=self._collect_run,
                      record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                      with_flops=with_flops, with_modules=with_modules,
                      execution_trace_observer=execution_trace_observer)
        if custom_trace_id_callback is not None:
            kwargs["custom_trace_id_callback"] = custom_trace_id_callback
        if with_stack:
            # torch keeps the operators' Python stacks (trace "Call stack", export_stacks) only verbose.
            kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
        super().__init__(**kwargs)

    # -- recording follows torch's (schedule, start/stop) ------------------------------------
    def stop(self):
        super().stop()

    def step(self):
        super().step()

    def get_trace_id(self) -> str:
        """The trace id of the current run (``custom_trace_id_callback``'s, else a generated one)."""
        return super().get_trace_id()

    def set_custom_trace_id_callback(self, callback: collections.abc.Callable[[], str]) -> None:
        """Set the callback that makes the trace id of the next runs."""
        super().set_custom_trace_id_callback(callback)

    def start(self):
        if self._user_on_trace_ready is None:
            ProfPathCreator().init(export_only_mode=True)  # as torch_npu: no result directory of its own
        super().start()

    def start_trace(self):
        super().start_trace()
        _mstx.start(self._npu_config)
        if self.with_flops and self._npu_config.tx_enabled:
            # As torch_npu: each call of an operator with a FLOPs formula becomes an mstx
            # range "{flops}-{op}" in the domain mfu_flops (see _flops_hook.py).
            FlopsHookManager.install()
        self._gc_records = []
        self._gc_detector = None
        if self._cpu and self._npu_config.with_gc:
            from ._profiler_gc_detect import ProfGCDetector

            self._gc_detector = ProfGCDetector(self._npu_config.gc_detect_threshold)
            self._gc_detector.start()
        from torch_npu import _C

        self._epoch_minus_steady = time.time_ns() - _C._npu_profilerNowNs()  # (npu tasks and GC records)
        if self._npu:
            self._records = []
            _C._npu_profilerDrain()  # nothing from before this run
            _C._npu_profilerEnable(True)

    def stop_trace(self):
        if self.with_flops and self._npu_config.tx_enabled:
            FlopsHookManager.uninstall()
        if getattr(self, "_gc_detector", None) is not None:
            self._gc_records, self._gc_detector.save_info = self._gc_detector.save_info, []
            self._gc_detector.stop()
            self._gc_detector = None
        if self._npu:
            from torch_npu import _C

            _synchronize_all()  # every task launched while recording has run and is recorded
            _C._npu_profilerEnable(False)
            records, dropped = _C._npu_profilerDrain()
            if dropped:
                _warn(f"{dropped} npu task records were dropped (buffer full); profile fewer steps.")
            self._records = records
        self._mstx_markers = _mstx.stop()
        super().stop_trace()

    def _collect_run(self, _):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "host.json")
            super().export_chrome_trace(path)
            # (Kineto can write a name that is not UTF-8: kept, with U+FFFD for the bad bytes)
            with open(path, encoding="utf-8", errors="replace") as f:
                host = json.load(f)
        for key, value in self._npu_metadata.items():
            host.setdefault(key, value)
        host["traceEvents"] = host.get("traceEvents", []) + _mstx.trace_events(
            self._mstx_markers, int(host.get("baseTimeNanoseconds", 0)), os.getpid())
        self._raw = {"trace": host, "records": [list(r) for r in self._records],
                     "epoch_minus_steady_ns": getattr(self, "_epoch_minus_steady", 0), "with_cpu": self._cpu,
                     "with_npu": self._npu, "config": self._npu_config._to_dict(), "rank": _rank(),
                     "metadata": dict(self._npu_metadata), "gc": [list(g) for g in getattr(self, "_gc_records", [])]}
        handler = self._user_on_trace_ready
        if handler is None and os.getenv("ASCEND_WORK_PATH"):
            # As torch_npu: without a handler the raw data is kept under
            # $ASCEND_WORK_PATH/profiling_data for a later ``analyse``.
            _save_raw(self._raw, _result_dir(None, None))
        elif handler is not None and not getattr(handler, "_npu_trace_handler", False):
            # A handler of the user's: as torch_npu, the run's raw data still gets its result
            # directory (ProfPathCreator().get_prof_dir(); ``analyse`` parses it later).
            _save_raw(self._raw, _result_dir(None, None))
        if handler is not None:
            handler(self)

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
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(trace, f)
        return path

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total"):
        """Writes the operators' Python stacks with their time, one "frame;frame;... value"
        line each (flame-graph input). metric: ``self_cpu_time_total`` (host time, µs) or
        ``self_npu_time_total`` (time of the npu tasks each operator launched, µs)."""
        if not self.with_stack:
            _warn("Function export_stacks() requires with_stack=True.")
            return None
        if metric not in ("self_cpu_time_total", "self_npu_time_total"):
            _warn("Metric should be self_cpu_time_total or self_npu_time_total. "
                  "Here it is presumed to be self_cpu_time_total.")
            metric = "self_cpu_time_total"
        if metric == "self_cpu_time_total":
            return super().export_stacks(path, metric)
        device_us = defaultdict(float)  # stack -> time of the tasks launched under it
        for t in _analysis.link_tasks(self._finished_run()):
            stack = t.op.get("args", {}).get("Call stack") if t.op else None
            if stack:
                device_us[stack] += t.dur
        table = str.maketrans(" ;\t\n", "____")
        with open(path, "w") as f:
            for stack, us in device_us.items():
                if int(us) > 0:  # innermost frame first in the trace; outermost first here
                    frames = [frame.translate(table) for frame in reversed(stack.split(";")) if frame]
                    f.write(";".join(frames) + f" {int(us)}\n")
        return path

    def export_memory_timeline(self, output_path: str, device: Optional[str] = None) -> None:
        """torch's memory timeline of the last run (``.html``, ``.json``, ``.json.gz``, ``.raw.json.gz``)
        for ``device`` (default ``npu:0``, ``cpu`` without an npu). Needs record_shapes=True,
        profile_memory=True and with_stack=True or with_modules=True; without them it warns
        and writes nothing, as torch_npu."""
        if device is None:
            device = "npu:0" if torch.npu.is_available() else "cpu"
        missing = []
        if not self.record_shapes:
            missing.append("record_shapes=True")
        if not self.profile_memory:
            missing.append("profile_memory=True")
        if not (self.with_stack or self.with_modules):
            missing.append("with_stack=True or with_modules=True")
        if missing:
            _warn(f"{', '.join(missing)} required for memory profiling.")
            return
        super().export_memory_timeline(output_path, device=device)

    # Metadata is kept here, not handed to Kineto: Kineto writes values into its trace
    # unescaped, so a quote or backslash would make the whole trace unreadable. It goes
    # into profiler_metadata.json and, as top-level keys, into the exported traces.
    def add_metadata(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            _warn("add_metadata: key and value must be str, ignored.")
            return
        self._npu_metadata[key] = value

    def add_metadata_json(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            _warn("add_metadata_json: key and value must be str, ignored.")
            return
        try:
            self._npu_metadata[key] = json.loads(value)
        except ValueError:
            _warn(f"add_metadata_json: the value of {key!r} is not JSON, ignored.")

    @classmethod
    def enable_profiler_in_child_thread(cls, record_shapes: bool = False, profile_memory: bool = False,
                                        with_stack: bool = False, with_flops: bool = False,
                                        with_modules: bool = False):
        """Call in a thread that was running before the profile started (a worker pool):
        its host operators are recorded into the running profile until
        ``disable_profiler_in_child_thread``. (Device tasks of every thread are always
        recorded; the thread inherits the profile's own record_shapes/... settings.)"""
        for name, value in (("record_shapes", record_shapes), ("profile_memory", profile_memory),
                            ("with_stack", with_stack), ("with_flops", with_flops), ("with_modules", with_modules)):
            if not isinstance(value, bool):
                _warn(f"{name} in enable_profiler_in_child_thread is not bool, reset it to False.")
        from torch_npu import _C

        if not _C._npu_profilerEnableInChildThread():
            _warn("enable_profiler_in_child_thread: no profile is running; nothing is recorded.")

    @classmethod
    def disable_profiler_in_child_thread(cls):
        """Ends this thread's recording (see enable_profiler_in_child_thread), after its
        device work has run."""
        from torch_npu import _C

        if torch.npu.is_initialized():
            torch.npu.synchronize()
        _C._npu_profilerDisableInChildThread()

    def _set_step_num_offset_for_dynamic_prof(self, step: int):
        """dynamic_profile starts a profile in the middle of training: number its steps
        ProfilerStep#{step}, #{step + 1}, ... while its schedule still counts from 0."""
        base_schedule = self.schedule
        self.step_num = step
        self.schedule = lambda n: base_schedule(n - step)

    def npu_tasks(self):
        """The npu tasks of the last run: dicts of name, kind, device, stream, start_us,
        dur_us and the launching host operator's name (a simulator extension)."""
        raw = self._finished_run()
        return [{"name": t.name, "kind": t.kind, "type": t.type, "device": t.device, "stream": t.stream,
                 "start_us": t.start, "dur_us": t.dur, "op": t.op["name"] if t.op else None}
                for t in _analysis.link_tasks(raw)]


_KinetoProfile = profile


def _rank():
    """This process's rank (torch.distributed, else $RANK), or None."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


def _result_dir(dir_name: Optional[str], worker_name: Optional[str]) -> str:
    """A new ``{dir}/{worker}_{pid}_{time}_ascend_pt`` (see ProfPathCreator)."""
    return ProfPathCreator().create_prof_dir(dir_name, worker_name)


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
    ProfPathCreator().init(worker_name=worker_name, dir_name=dir_name)

    def handler_fn(prof) -> None:
        raw = prof._finished_run()
        path = _result_dir(dir_name, worker_name)
        _save_raw(raw, path)
        if analyse_flag:
            _analysis.write_results(raw, path, raw["with_cpu"], rank=raw.get("rank"))

    handler_fn._npu_trace_handler = True  # writes the result directory itself
    return handler_fn


def _save_raw(raw: dict, path: str) -> None:
    """Lays a run out as torch_npu does: the host side in ``FRAMEWORK/``, the device tasks
    in ``PROF_{n}_{time}_{id}/device_{d}/data/`` (msprof's directory; here the simulator's
    records), ``profiler_info.json`` and ``profiler_metadata.json``."""
    os.makedirs(os.path.join(path, "FRAMEWORK"), exist_ok=True)
    with open(os.path.join(path, _RAW), "w") as f:
        json.dump({k: v for k, v in raw.items() if k not in ("records", "gc")}, f)
    if raw.get("gc"):
        from ._profiler_gc_detect import ProfGCDetector

        with open(os.path.join(path, "FRAMEWORK", ProfGCDetector.SAVE_FILE), "wb") as f:
            f.write(ProfGCDetector.to_bytes(raw["gc"]))
    if raw.get("with_npu", True):
        stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
        prof_dir = os.path.join(path, f"PROF_000001_{stamp}_{''.join(random.choices(string.ascii_uppercase, k=16))}")
        by_device = defaultdict(list)
        for rec in raw["records"]:
            by_device[rec[2]].append(rec)  # (name, kind, device, ...): see _analysis.Task
        if not by_device and torch.npu.is_initialized():
            by_device[torch.npu.current_device()] = []
        os.makedirs(os.path.join(prof_dir, "host"), exist_ok=True)
        for device, records in by_device.items():
            data = os.path.join(prof_dir, f"device_{device}", "data")
            os.makedirs(data, exist_ok=True)
            with open(os.path.join(data, _TASKS), "w") as f:
                json.dump(records, f)
    _write_info(path, raw)


def _load_raw(path: str) -> dict:
    with open(os.path.join(path, _RAW)) as f:
        raw = json.load(f)
    gc_file = os.path.join(path, "FRAMEWORK", "torch.gc_record")  # (ProfGCDetector.SAVE_FILE)
    if os.path.isfile(gc_file):
        import struct

        from .analysis.prof_common_func._constant import Constant

        with open(gc_file, "rb") as f:
            raw["gc"] = [list(r) for r in struct.iter_unpack(Constant.GC_RECORD_FORMAT, f.read())]
    if "records" not in raw:
        raw["records"] = []
        for name in sorted(glob.glob(os.path.join(path, "PROF_*", "device_*", "data", _TASKS))):
            with open(name) as f:
                raw["records"].extend(json.load(f))
    return raw


def _write_info(path: str, raw: dict) -> None:
    import torch_npu

    info = {"config": {"common_config": raw["config"]}, "torch_npu_version": torch_npu.__version__,
            "cann_version": torch_npu.utils.get_cann_version(), "simulator": True}
    with open(os.path.join(path, "profiler_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    if raw.get("metadata"):
        with open(os.path.join(path, "profiler_metadata.json"), "w") as f:
            json.dump(raw["metadata"], f, indent=2)


def analyse(profiler_path: str, max_process_number: int = 320, export_type: Union[str, list, None] = None):
    """Parses result directories written with ``analyse_flag=False``: ``profiler_path`` is
    one ``*_ascend_pt`` directory or a directory holding several, parsed by up to
    ``max_process_number`` workers at a time (one directory each)."""
    if not isinstance(profiler_path, str) or not os.path.isdir(profiler_path):
        raise ValueError(f"analyse: profiler_path must be an existing directory, got {profiler_path!r}")
    targets = [profiler_path] if os.path.isfile(os.path.join(profiler_path, _RAW)) else [
        os.path.join(profiler_path, d) for d in sorted(os.listdir(profiler_path))
        if os.path.isfile(os.path.join(profiler_path, d, _RAW))]
    if not targets:
        raise ValueError(f"analyse: no torch_npu profiling data under {profiler_path!r}")
    if export_type is not None:
        types = [export_type] if isinstance(export_type, str) else export_type
        if not isinstance(types, (list, tuple)) or not types or any(t not in ("text", "db") for t in types):
            _warn(f"analyse: invalid export_type {export_type!r} (expected 'text', 'db' or a list of them), "
                  "using the profiled run's.")
            export_type = None
        else:
            export_type = list(types)
    if isinstance(max_process_number, bool) or not isinstance(max_process_number, int) or max_process_number < 1:
        raise ValueError(f"analyse: max_process_number must be a positive int, got {max_process_number!r}")

    def parse(path):
        raw = _load_raw(path)
        _analysis.write_results(raw, path, raw.get("with_cpu", True), export_type, raw.get("rank"))

    workers = min(max_process_number, len(targets))
    if workers == 1:
        for path in targets:
            parse(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="torch_npu_analyse") as pool:
        for future in [pool.submit(parse, path) for path in targets]:
            future.result()
