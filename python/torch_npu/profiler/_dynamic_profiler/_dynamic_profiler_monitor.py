"""``DynamicProfilerMonitor``: watches ``profiler_config.json`` for the processes of a job, as
torch_npu's.

The process that created the job's shared memory (``DynamicProfilerShareMemory``) runs the
monitor, a thread named ``DynMonitorProc``: every ``poll_interval`` seconds (2, then the step
time measured by ``dynamic_profile``, 1 to 50 s) it looks at the file's mtime and, when the
file changed, publishes its content into the shared memory. Each process's
``shm_to_prof_conf_context()`` returns a newly published config (a ``ConfigContext``) once,
if it is meant for the process's rank. With the dynolog model the monitor asks dynolog
(``IPCMonitor``) instead of the file.
"""
import json
import os
import struct
import threading
import time

from ._dynamic_monitor_proxy import PyDynamicMonitorProxySingleton
from ._dynamic_profiler_config_context import ConfigContext
from ._dynamic_profiler_monitor_shm import DynamicProfilerShareMemory
from ._dynamic_profiler_utils import DynamicProfilerUtils

__all__ = []

_LEVEL = DynamicProfilerUtils.LoggerLevelEnum
MONITOR_THREAD_NAME = "DynMonitorProc"


class _Value:
    """A value shared with the monitor thread (torch_npu: a multiprocessing.Value)."""

    def __init__(self, value):
        self.value = value


class _LoopFlag:
    """The monitor runs while ``value`` is True; setting it False wakes the monitor at once."""

    def __init__(self):
        self._stop = threading.Event()

    @property
    def value(self) -> bool:
        return not self._stop.is_set()

    @value.setter
    def value(self, running: bool) -> None:
        if running:
            self._stop.clear()
        else:
            self._stop.set()

    def wait(self, seconds: float) -> None:
        self._stop.wait(seconds)


class DynamicProfilerMonitor:
    def __init__(self):
        self._path = DynamicProfilerUtils.CFG_CONFIG_PATH
        self._rank_id = DynamicProfilerUtils.get_rank_id()
        self._buffer_size = DynamicProfilerUtils.CFG_BUFFER_SIZE
        self._process = None  # the monitor thread, in the process that created the shared memory
        self.prof_cfg_context = None
        self._shared_loop_flag = _LoopFlag()
        self._step_time = _Value(DynamicProfilerUtils.POLL_INTERVAL)
        self._profiler_status = {
            DynamicProfilerUtils.PROFILER_STATUS: str(DynamicProfilerUtils.ProfilerStatus.IDLE.value),
            DynamicProfilerUtils.CURRENT_STEP: "-1",
            DynamicProfilerUtils.START_STEP: "-1",
            DynamicProfilerUtils.STOP_STEP: "-1",
        }
        self._last_report_time = 0.0
        self._is_dyno = DynamicProfilerUtils.is_dyno_model()
        self._config_path = None if self._is_dyno else os.path.join(self._path, "profiler_config.json")
        self._shm_obj = DynamicProfilerShareMemory(self._path, self._config_path, self._rank_id)
        self._seen = self._current_seq()  # configs published before this process started are not its
        self._create_process()

    def _current_seq(self):
        if self._shm_obj.shm is None:
            return None
        return struct.unpack("<Q", self._shm_obj.read_bytes(read_time=True))[0]

    def shm_to_prof_conf_context(self):
        """The config published since the last call, for this rank, or None."""
        if self._shm_obj is None:
            DynamicProfilerUtils.out_log(f"Rank {self._rank_id} shared memory is None !", _LEVEL.ERROR)
            return None
        if self._shm_obj.shm is None:
            return None  # a launcher: no configs
        try:
            seq = struct.unpack("<Q", self._shm_obj.read_bytes(read_time=True))[0]
        except Exception as ex:  # noqa: BLE001
            DynamicProfilerUtils.out_log(f"Share memory read error: {ex}", _LEVEL.WARNING)
            return None
        if seq == self._seen or seq % 2:
            return None
        try:
            seq, _, payload = self._shm_obj.read_snapshot()
            self._seen = seq
            json_data = ConfigContext.bytes_to_profiler_cfg_json(payload)
        except Exception as ex:  # noqa: BLE001
            DynamicProfilerUtils.out_log(f"Share memory bytes to json error: {ex}", _LEVEL.ERROR)
            return None
        self.prof_cfg_context = ConfigContext(json_data)
        if not self.prof_cfg_context.valid():
            return None
        if self.prof_cfg_context.is_dyno_monitor():
            self._call_dyno_monitor(json_data)
            return None
        return self.prof_cfg_context

    def clean_resource(self) -> None:
        """Stop the monitor (if this process runs it) and leave the shared memory."""
        if self._process is not None:
            self._shared_loop_flag.value = False
            self._process.join()
        if self._shm_obj is not None:
            self._shm_obj.clean_resource()

    def modify_step_time(self, poll_interval_time: int) -> None:
        self._step_time.value = poll_interval_time
        DynamicProfilerUtils.out_log(
            f"Dynamic profiling monitor process poll interval time change to {poll_interval_time}s")

    def update_profiler_status(self, status: "DynamicProfilerUtils.ProfilerStatus") -> None:
        self._profiler_status[DynamicProfilerUtils.PROFILER_STATUS] = str(status.value)

    def update_step_info(self, step: int, flag: str) -> None:
        if flag in self._profiler_status:
            self._profiler_status[flag] = str(step)

    def report_profiler_status(self) -> None:
        """To dynolog (when it is there), at most every REPORT_INTERVAL seconds, by the monitor's process."""
        if not self._shm_obj.is_create_process:
            return
        now = time.time()
        if now - self._last_report_time < DynamicProfilerUtils.REPORT_INTERVAL:
            return
        proxy = PyDynamicMonitorProxySingleton().get_proxy()
        if not proxy or not hasattr(proxy, "update_profiler_status"):
            return
        proxy.update_profiler_status(self._profiler_status)
        self._last_report_time = now

    def _monitor_process_params(self) -> dict:
        return {
            "loop_flag": self._shared_loop_flag,
            "poll_interval": self._step_time,
            "shm": self._shm_obj,
            "cfg_path": self._shm_obj.config_path,
            "max_size": self._buffer_size,
            "file_stat_time": self._shm_obj.cur_mtime,
            "rank_id": self._rank_id,
            "dynamic_profiler_utils": DynamicProfilerUtils,
        }

    def _create_process(self) -> None:
        """The monitor thread, in the process that created the shared memory only."""
        if not self._shm_obj.is_create_process:
            self._process = None
            DynamicProfilerUtils.out_log(f"Rank {self._rank_id} no need to create process.")
            return
        self._process = threading.Thread(target=worker_dyno_func if self._is_dyno else worker_func,
                                         args=(self._monitor_process_params(),), name=MONITOR_THREAD_NAME,
                                         daemon=True)
        self._process.start()
        DynamicProfilerUtils.out_log(f"Dynamic monitor process has been created by rank {self._rank_id}.")

    def _call_dyno_monitor(self, json_data: dict) -> None:
        json_data = {key: str(value) for key, value in json_data.items()}
        proxy = PyDynamicMonitorProxySingleton().get_proxy()
        if proxy:
            proxy.enable_dyno_npu_monitor(json_data)


def _set_thread_name() -> None:
    import torch.multiprocessing as mp

    mp._set_thread_name(MONITOR_THREAD_NAME)  # what `ps -eT` shows


def worker_func(params: dict) -> None:
    """The monitor: publish profiler_config.json into the shared memory whenever it changes."""
    _set_thread_name()
    loop_flag, poll_interval = params["loop_flag"], params["poll_interval"]
    shm, cfg_path, max_size = params["shm"], params["cfg_path"], params["max_size"]
    utils = params["dynamic_profiler_utils"]
    utils.init_logger(is_monitor_process=True, log_path=os.path.dirname(cfg_path))
    log = utils.out_log
    last_mtime = params["file_stat_time"]
    missing_logged = False
    while loop_flag.value:
        try:
            mtime = os.stat(cfg_path).st_mtime_ns
            missing_logged = False
        except FileNotFoundError:
            mtime = None
            if not missing_logged:
                log("Dynamic profiler cfg json not exists", _LEVEL.ERROR, is_monitor_process=True)
                missing_logged = True
        except OSError as ex:
            mtime = None
            log(f"Dynamic profiler process get json modify time failed, {ex} has occur!", _LEVEL.ERROR,
                is_monitor_process=True)
        if mtime is not None and mtime != last_mtime:
            last_mtime = mtime
            _publish(shm, cfg_path, mtime, max_size, log)
        loop_flag.wait(poll_interval.value)
    log("Dynamic profiler process done", _LEVEL.INFO, is_monitor_process=True)


def _publish(shm, cfg_path: str, mtime: int, max_size: int, log) -> None:
    try:
        with open(cfg_path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("the file must hold a JSON object")
    except (OSError, ValueError) as ex:
        log(f"Dynamic profiler process load json failed, {ex} has occur!", _LEVEL.ERROR, is_monitor_process=True)
        return
    payload = ConfigContext.profiler_cfg_json_to_bytes(data)
    if len(payload) + DynamicProfilerShareMemory.HEADER.size > max_size:
        log(f"Load json failed, because cfg bytes size over {max_size} bytes", _LEVEL.WARNING,
            is_monitor_process=True)
        return
    try:
        shm.write_config(payload, mtime)
        log("Dynamic profiler process load json success", _LEVEL.INFO, is_monitor_process=True)
    except Exception as ex:  # noqa: BLE001
        log(f"Dynamic profiler cfg bytes write failed, {ex} has occur!", _LEVEL.ERROR, is_monitor_process=True)


def worker_dyno_func(params: dict) -> None:
    """The monitor of the dynolog model: publish what dynolog asks for."""
    _set_thread_name()
    loop_flag, poll_interval = params["loop_flag"], params["poll_interval"]
    shm, max_size, utils = params["shm"], params["max_size"], params["dynamic_profiler_utils"]
    proxy = PyDynamicMonitorProxySingleton().get_proxy()
    if not proxy:
        utils.out_log("dynolog's IPCMonitor is not installed: the dynamic profiler gets no configs.",
                      _LEVEL.WARNING)
        return
    if not proxy.init_dyno(params["rank_id"]):
        utils.out_log("Init dynolog failed !", _LEVEL.WARNING)
        return
    utils.out_log("Init dynolog success !")
    while loop_flag.value:
        loop_flag.wait(poll_interval.value)
        data = DynamicProfilerUtils.dyno_str_to_json(proxy.poll_dyno())
        if not data:
            continue
        payload = ConfigContext.profiler_cfg_json_to_bytes(data)
        if len(payload) + DynamicProfilerShareMemory.HEADER.size > max_size:
            utils.out_log(f"Load json failed, because cfg bytes size over {max_size} bytes")
            continue
        try:
            shm.write_config(payload, time.time_ns())
        except Exception as ex:  # noqa: BLE001
            utils.out_log(f"Dynamic profiler cfg bytes write failed, {ex} has occur!", _LEVEL.ERROR)
    if hasattr(proxy, "update_profiler_status"):
        proxy.update_profiler_status({
            DynamicProfilerUtils.PROFILER_STATUS: str(DynamicProfilerUtils.ProfilerStatus.UNINITIALIZED.value),
            DynamicProfilerUtils.CURRENT_STEP: "-1",
            DynamicProfilerUtils.START_STEP: "-1",
            DynamicProfilerUtils.STOP_STEP: "-1",
        })
    utils.out_log("Dynolog profiler process done")
