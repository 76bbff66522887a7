"""torch_npu.profiler.profiler_interface: the activities this profiler can record, and
``_ProfInterface``, torch_npu's step-by-step profiling session over ``torch_npu._C._profiler``.

    prof_if = _ProfInterface(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], record_shapes=True)
    prof_if.init_trace()       # a result directory (ProfPathCreator) and a trace id
    prof_if.warmup_trace()     # optional
    prof_if.start_trace()
    ... work ...
    prof_if.stop_trace()
    prof_if.finalize_trace()   # raw data, profiler_info.json, profiler_metadata.json
    prof_if.analyse()          # ASCEND_PROFILER_OUTPUT/ of the directory

``ProfActionController`` (``_profiler_action_controller``) drives it from schedule actions.
``start_trace`` also times ``torch_npu.npu.Event``'s methods as host ranges ``Event::record``,
... (``_enable_event_record``) and, with ``gc_detect_threshold``, Python's garbage collections
(``ProfGCDetector``) until ``stop_trace``.
"""
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Optional

import torch

from torch_npu._C._profiler import (NpuProfilerConfig, ProfilerActivity, _finalize_profiler, _get_freq,
                                    _get_monotonic, _get_syscnt, _get_syscnt_enable, _init_profiler,
                                    _start_profiler, _stop_profiler, _supported_npu_activities, _warmup_profiler)

from ._flops_hook import FlopsHookManager
from ._profiler_gc_detect import ProfGCDetector
from ._profiler_path_creator import ProfPathCreator
from .analysis._npu_profiler import NpuProfiler
from .analysis.prof_common_func._constant import Constant, print_warn_msg
from .analysis.prof_common_func._utils import check_msprof_env, collect_env_vars, no_exception_func
from .experimental_config import _ExperimentalConfig
from .scheduler import ProfilerAction

__all__ = ["supported_activities"]

_EVENT_METHODS = ("record", "wait", "query", "elapsed_time", "synchronize")


def _enable_event_record() -> None:
    """Each call of torch_npu.npu.Event's record / wait / query / elapsed_time / synchronize
    becomes a host range ``Event::{name}``."""
    from torch_npu.npu import Event

    def timed(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with torch.profiler.record_function(f"Event::{func.__name__}"):
                return func(*args, **kwargs)

        wrapper.origin_func = func
        return wrapper

    for name in _EVENT_METHODS:
        method = getattr(Event, name)
        if not hasattr(method, "origin_func"):
            setattr(Event, name, timed(method))


def _disable_event_record() -> None:
    from torch_npu.npu import Event

    for name in _EVENT_METHODS:
        method = getattr(Event, name)
        setattr(Event, name, getattr(method, "origin_func", method))


class _ProfInterface:
    PARALLEL_GROUP_KEY = "parallel_group_info"
    TRACE_ID_KEY = "trace_id"
    MAX_TRACE_ID_LEN = 1024

    def __init__(self, activities: Optional[Iterable[ProfilerActivity]] = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, schedule: Optional[Callable[[int], ProfilerAction]] = None,
                 metadata: Optional[dict] = None, experimental_config: Optional[_ExperimentalConfig] = None,
                 custom_trace_id_callback: Optional[Callable[[], str]] = None) -> None:
        self._is_env_valid = check_msprof_env()
        self.prof_path = ""
        self.syscnt_enable = False
        self.freq = 100
        self.start_cnt = 0
        self.start_monotonic = 0
        self.activities = set(activities) if activities else supported_activities()
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.with_modules = with_modules
        self.experimental_config = _ExperimentalConfig() if experimental_config is None else experimental_config
        self.schedule = schedule
        self.metadata = {} if metadata is None else metadata
        self.custom_trace_id_callback = custom_trace_id_callback
        self.trace_id = ""
        self.gc_detector = None
        self._check_params()

    def _npu_config(self) -> NpuProfilerConfig:
        return NpuProfilerConfig(self.prof_path, self.record_shapes, self.profile_memory, self.with_stack,
                                 self.with_flops, self.with_modules, self.experimental_config())

    def init_trace(self) -> None:
        if not self._is_env_valid:
            return
        self.prof_path = ProfPathCreator().create_prof_dir()
        _init_profiler(self.prof_path, self.activities)
        self.trace_id = self.create_trace_id()

    def warmup_trace(self) -> None:
        if not self._is_env_valid:
            return
        _warmup_profiler(self._npu_config(), self.activities)

    def start_trace(self) -> None:
        if not self._is_env_valid:
            return
        npu_prof_config = self._npu_config()
        self.syscnt_enable = _get_syscnt_enable()
        if self.syscnt_enable:
            self.freq = _get_freq()
            self.start_cnt = _get_syscnt()
        self.start_monotonic = _get_monotonic()
        _enable_event_record()
        _start_profiler(npu_prof_config, self.activities)
        if self.with_flops and self.experimental_config.tx_enabled:
            FlopsHookManager.install()
        self.start_gc_detect()

    def stop_trace(self) -> None:
        if not self._is_env_valid:
            return
        if ProfilerActivity.NPU in self.activities and torch.npu.is_initialized():
            torch.npu.synchronize()
        if self.with_flops and self.experimental_config.tx_enabled:
            FlopsHookManager.uninstall()
        _stop_profiler()
        self.stop_gc_detect()
        _disable_event_record()

    def finalize_trace(self) -> None:
        if not self._is_env_valid:
            return
        _finalize_profiler()
        self._dump_profiler_info()
        self._dump_metadata()
        ProfPathCreator().is_prof_inited = False

    def delete_prof_dir(self) -> None:
        if not self._is_env_valid:
            return
        ProfPathCreator().delete_prof_dir()

    def analyse(self, analysis_type: str = Constant.TENSORBOARD_TRACE_HANDLER, output_path: Optional[str] = None,
                **kwargs) -> None:
        if not self._is_env_valid:
            return
        kwargs.setdefault("export_type", self.experimental_config.export_type)
        try:
            NpuProfiler.analyse(self.prof_path, analysis_type, output_path, **kwargs)
        except Exception as e:  # noqa: BLE001  (as torch_npu: a parse failure does not stop training)
            print_warn_msg(f"Profiling data parsing failed, error: {e}")

    def check_gc_detect_enable(self) -> bool:
        return ProfilerActivity.CPU in self.activities and self.experimental_config.with_gc

    def start_gc_detect(self) -> None:
        """Record Python garbage collections of at least gc_detect_threshold ms (ProfGCDetector)."""
        if self.check_gc_detect_enable():
            self.gc_detector = ProfGCDetector(self.experimental_config.gc_detect_threshold)
            self.gc_detector.start()

    def stop_gc_detect(self) -> None:
        """Into the result directory's FRAMEWORK/torch.gc_record."""
        if self.gc_detector is not None:
            self.gc_detector.stop()
            self.gc_detector = None

    @staticmethod
    def default_trace_id() -> str:
        return f"{uuid.uuid4().int:032X}"

    def create_trace_id(self) -> str:
        """custom_trace_id_callback's id (a str of at most MAX_TRACE_ID_LEN characters), else
        (with a warning if the callback misbehaves) 32 hex digits."""
        if not self.custom_trace_id_callback:
            return self.default_trace_id()
        if not callable(self.custom_trace_id_callback):
            print_warn_msg("Parameter custom_trace_id_callback is not callable, reset it to default.")
            return self.default_trace_id()
        try:
            trace_id = self.custom_trace_id_callback()
            if isinstance(trace_id, str) and len(trace_id) <= self.MAX_TRACE_ID_LEN:
                return trace_id
            print_warn_msg(f"Parameter custom_trace_id_callback should return str(max length: "
                           f"{self.MAX_TRACE_ID_LEN}), reset it to default.")
        except Exception as e:  # noqa: BLE001
            print_warn_msg(f"Parameter custom_trace_id_callback raised an exception: {e}, reset it to default.")
        return self.default_trace_id()

    def _check_params(self) -> None:
        if any(a not in supported_activities() for a in self.activities):
            print_warn_msg("Invalid activities, only CPU and NPU are supported, reset it to default.")
            self.activities = supported_activities()
        for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
            if not isinstance(getattr(self, name), bool):
                print_warn_msg(f"Parameter {name} is of boolean type, reset it to False.")
                setattr(self, name, False)
        if not isinstance(self.experimental_config, _ExperimentalConfig):
            print_warn_msg("Parameter experimental_config is an instance of _ExperimentalConfig, reset it to default.")
            self.experimental_config = _ExperimentalConfig()
        if not isinstance(self.metadata, dict):
            print_warn_msg("Parameter metadata is a dict, reset it to {}.")
            self.metadata = {}
        if ProfilerActivity.NPU not in self.activities:
            print_warn_msg("Experimental config will not be used while ProfilerActivity.NPU is not set.")

    def _dump_profiler_info(self) -> None:
        """profiler_info.json (profiler_info_{rank}.json with a rank): the config, the start
        counters and the end times, the versions."""
        import json

        from torch_npu.utils.collect_env import get_cann_version, get_torch_npu_version

        def attrs(obj):
            return dict(getattr(obj, "__dict__", {})) if obj else None

        common_config = {"activities": sorted(str(a) for a in self.activities), "schedule": attrs(self.schedule),
                         "record_shapes": self.record_shapes, "profile_memory": self.profile_memory,
                         "with_stack": self.with_stack, "with_flops": self.with_flops,
                         "with_modules": self.with_modules}
        info = {
            Constant.CONFIG: {Constant.COMMON_CONFIG: common_config,
                              Constant.EXPERIMENTAL_CONFIG: self.experimental_config._to_dict()},
            Constant.START_INFO: {Constant.SyscntEable: self.syscnt_enable, Constant.SysCntFreq: self.freq,
                                  Constant.StartCnt: self.start_cnt, Constant.StartMonotonic: self.start_monotonic},
            Constant.END_INFO: {Constant.FWK_END_TIME: time.time_ns(), Constant.FWK_END_MONOTONIC: time.monotonic_ns()},
            Constant.TORCH_NPU_VERSION: str(get_torch_npu_version()).replace("'", "").replace(" ", ""),
            Constant.CANN_VERSION: get_cann_version(),
        }
        rank_id = os.environ.get("RANK")
        if rank_id is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank_id = torch.distributed.get_rank()
        name = "profiler_info.json" if rank_id is None else f"profiler_info_{rank_id}.json"
        if rank_id is not None:
            info["rank_id"] = rank_id
        with open(os.path.join(os.path.realpath(self.prof_path), name), "w") as f:
            json.dump(info, f, indent=4, default=str)

    def _dump_metadata(self) -> None:
        """profiler_metadata.json: the metadata, the environment (text export), the trace id
        and the process groups."""
        import json

        if Constant.Text in self.experimental_config.export_type:
            self.metadata.update(collect_env_vars())
        self._add_group_info_to_metadata()
        self.metadata[self.TRACE_ID_KEY] = self.trace_id
        if not ProfPathCreator().is_prof_inited:
            print_warn_msg("Profiler is not initialized. Skip this metadata.")
            return
        with open(os.path.join(self.prof_path, Constant.PROFILER_META_DATA), "w") as f:
            json.dump(self.metadata, f, default=str)
        self.metadata.clear()

    def _add_group_info_to_metadata(self) -> None:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        try:
            from torch.distributed.distributed_c10d import _world

            groups = {}
            rank = torch.distributed.get_rank()
            for group, config in _world.pg_map.items():
                if str(config[0]).lower() != "hccl" or rank not in torch.distributed.get_process_group_ranks(group):
                    continue
                name = "default_group" if group is torch.distributed.distributed_c10d._get_default_group() else \
                    torch.distributed.distributed_c10d._get_group_tag(group) or str(group.group_name)
                groups[str(group.group_name)] = {"group_name": name,
                                                 "group_rank": torch.distributed.get_group_rank(group, rank),
                                                 "global_ranks": torch.distributed.get_process_group_ranks(group)}
            if groups:
                self.metadata[self.PARALLEL_GROUP_KEY] = groups
        except Exception as err:  # noqa: BLE001
            print_warn_msg(f"Failed to get parallel group info, Exception: {err}.")


@no_exception_func(set())
def supported_activities():
    return _supported_npu_activities()
