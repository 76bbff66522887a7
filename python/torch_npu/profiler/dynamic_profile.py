"""``torch_npu.profiler.dynamic_profile``: profile a running job by editing a JSON file.

    from torch_npu.profiler import dynamic_profile as dp
    dp.init("./prof_cfg")            # creates ./prof_cfg/profiler_config.json (defaults)
    for batch in loader:
        train_step(batch)
        dp.step()                    # picks up edits of profiler_config.json

Editing ``profiler_config.json`` while the job runs (``start_step``, ``active``,
``warmup``, ``prof_dir``, ``activities``, ``analyse``, ``record_shapes``, ``profile_memory``,
``with_stack``, ``with_flops``, ``with_modules``, ``is_rank``/``rank_list``, ``metadata``,
``experimental_config``, as torch_npu's file) profiles ``warmup + active`` steps from
``start_step`` (``-1``: the next step) into ``prof_dir`` with
``tensorboard_trace_handler``. ``dp.start(config_path)`` starts such a run at once from a
given file. As in torch_npu, problems are logged (``{path}/log/``) and warned about, never
raised, so profiling cannot stop a training job.

As in torch_npu, one process of the job (the first to call ``init`` with the folder) runs the
monitor ``DynMonitorProc`` (a thread here), which looks at the file every poll interval
(2 s; from step ``RECORD_TIME_STEP + 1`` on, the step time measured between steps
``RECORD_TIME_STEP`` and ``RECORD_TIME_STEP + 1``, 1 to 50 s) and publishes a changed file
into the job's shared memory; each process's ``step()`` reads the shared memory (a few bytes
unless there is a new config). An edit thus takes effect within a poll interval. The parts
carry torch_npu's names: ``_dynamic_profiler.ConfigContext`` (the parsed file),
``DynamicProfilerShareMemory`` (the shared memory), ``DynamicProfilerMonitor`` (the monitor)
and ``DynamicProfilerUtils`` (logging, rank).
"""
import atexit
import functools
import json
import os
import time

from ._dynamic_profiler._dynamic_profiler_config_context import ConfigContext
from ._dynamic_profiler._dynamic_profiler_monitor import DynamicProfilerMonitor
from ._dynamic_profiler._dynamic_profiler_monitor_shm import DynamicProfilerShareMemory
from ._dynamic_profiler._dynamic_profiler_utils import DynamicProfilerUtils
from .profiler import profile, tensorboard_trace_handler
from ..npu import mstx  # noqa: E402  (torch_npu.npu is imported before torch_npu.profiler)
from .scheduler import Schedule

__all__ = ["init", "step", "start", "set_state"]

CONFIG_NAME = "profiler_config.json"

# profiler_config.json as torch_npu creates it.
DEFAULT_CONFIG = DynamicProfilerShareMemory.JSON_DATA

_LOG = DynamicProfilerUtils.LOGGER


def _rank() -> int:
    return DynamicProfilerUtils.get_rank_id()


def _problem(msg: str) -> None:
    """Something the user should fix: to the log and as a warning."""
    DynamicProfilerUtils.out_log(msg, DynamicProfilerUtils.LoggerLevelEnum.WARNING)


def _read_config(path: str):
    """The parsed file (a ConfigContext), or None (logged) if it cannot be read."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("the file must hold a JSON object")
    except (OSError, ValueError) as err:
        _problem(f"cannot read the profiler config {path!r}: {err}")
        return None
    return ConfigContext(data)


class _DynamicProfile:
    """The process's dynamic profiler: the config it watches and the run in progress.
    One per process: ``_DynamicProfile()`` returns it (as torch_npu's singleton)."""

    RECORD_TIME_STEP = 10  # the step time measured between this step and the next sets the poll interval
    _the = None

    def __new__(cls):
        if cls._the is None:
            cls._the = super().__new__(cls)
            cls._the._setup()
        return cls._the

    def _setup(self):
        self.config_path = None
        self._dynamic_monitor = None  # the DynamicProfilerMonitor of init's folder
        self.prof = None  # the profile of the run in progress
        self.pending = None  # a config waiting for its start_step
        self.cur_step = 0
        self.steps_left = 0
        self.repeat_init = False
        self._step_mstx_range_id = 0  # the mstx range "step {n}" of the step running
        self._step_record_time = None  # time.time() at step RECORD_TIME_STEP
        self._step_time = 0  # seconds of one step (0: not measured yet)
        self._min_poll_interval = 1
        self._max_poll_interval = 50

    def init(self, path: str = None) -> None:
        if self.repeat_init:
            _problem("init was called again; the first call's config stays in use.")
            return
        if DynamicProfilerUtils.is_dyno_model():
            self._dynamic_monitor = DynamicProfilerMonitor()
        else:
            if not isinstance(path, str) or not path:
                _problem(f"init: path must be a directory path, got {path!r}; dynamic profiling is off.")
                return
            path = os.path.abspath(path)
            try:
                os.makedirs(path, exist_ok=True)
                DynamicProfilerUtils.CFG_CONFIG_PATH = path
                DynamicProfilerUtils.init_logger(log_path=path)
                # creates profiler_config.json if missing; only later edits start a run
                self._dynamic_monitor = DynamicProfilerMonitor()
            except (OSError, RuntimeError) as err:
                _problem(f"init: cannot use {path!r} ({err}); dynamic profiling is off.")
                return
            self.config_path = os.path.join(path, CONFIG_NAME)
        self.repeat_init = True
        atexit.register(self._dynamic_monitor.clean_resource)  # (atexit runs the last registered first)
        atexit.register(self._at_exit)
        _LOG.info("watching %s", self.config_path or "dynolog")

    def _poll(self):
        """A config published since the last look (for this rank), or None."""
        if self._dynamic_monitor is None:
            return None
        cfg = self._dynamic_monitor.shm_to_prof_conf_context()
        if cfg is not None:
            _LOG.info("config changed: start_step=%s warmup=%s active=%s", cfg.start_step(), cfg.warmup(),
                      cfg.active())
        return cfg

    def _measure_step_time(self) -> None:
        """The monitor polls once per step time (1 to 50 s), measured once, after RECORD_TIME_STEP."""
        if self.cur_step == self.RECORD_TIME_STEP:
            self._step_record_time = time.time()
        elif self.cur_step == self.RECORD_TIME_STEP + 1 and self._step_record_time is not None:
            self._step_time = min(self._max_poll_interval,
                                  max(self._min_poll_interval, int(time.time() - self._step_record_time)))
            if self._dynamic_monitor is not None:
                self._dynamic_monitor.modify_step_time(self._step_time)

    def _status(self, status=None, **steps) -> None:
        """What the monitor reports to dynolog: the profiler's status and steps."""
        if self._dynamic_monitor is None:
            return
        for flag, value in steps.items():
            self._dynamic_monitor.update_step_info(value, getattr(DynamicProfilerUtils, flag.upper()))
        if status is not None:
            self._dynamic_monitor.update_profiler_status(status)

    def set_state(self, state_step) -> None:
        """Resumed training: continue the step count from ``state_step["cur_step"]``."""
        if not isinstance(state_step, dict):
            _problem(f"set_state: state_step must be a dict like {{'cur_step': 100}}, got {state_step!r}")
            return
        cur = state_step.get("cur_step", 0)
        if not isinstance(cur, int) or isinstance(cur, bool) or cur < 0:
            _problem(f"set_state: cur_step must be an integer >= 0, got {cur!r}")
            return
        self.cur_step = cur

    def _mark_step(self) -> None:
        """As torch_npu: each step is an mstx range "step {n}" (on the current stream), seen by
        a profile with mstx enabled (nothing is recorded otherwise)."""
        import torch_npu

        if self._step_mstx_range_id:
            mstx.range_end(self._step_mstx_range_id)
        stream = torch_npu.npu.current_stream() if torch_npu.npu.is_initialized() else None
        self._step_mstx_range_id = mstx.range_start(f"step {self.cur_step}", stream)

    def step(self) -> None:
        self.cur_step += 1
        self._measure_step_time()
        self._mark_step()
        cfg = self._poll()
        if cfg is not None:
            self.pending = cfg  # (applied once a run in progress has ended)
        status = DynamicProfilerUtils.ProfilerStatus
        if self.prof is not None:
            self.prof.step()
            self.steps_left -= 1
            if self.steps_left == 0:
                self._stop()
                self._status(status.IDLE)
        elif self.pending is not None:
            start = self.pending.start_step()
            steps = self.pending.warmup() + self.pending.active()
            if self.pending.start() or self.cur_step == start:
                self._status(status.RUNNING, start_step=self.cur_step, stop_step=self.cur_step + steps)
                self._start(self.pending)
                self.pending = None
            elif self.cur_step > start:
                _problem(f"start_step={start} has passed (current step {self.cur_step}); the config is ignored.")
                self._status(status.IDLE)
                self.pending = None
            else:
                self._status(status.READY, start_step=start, stop_step=start + steps)
        self._status(current_step=self.cur_step)
        if self._dynamic_monitor is not None:
            self._dynamic_monitor.report_profiler_status()

    def start(self, config_path=None) -> None:
        if self.prof is not None:
            _problem("start: the profiler is already running; finish that run first.")
            return
        path = config_path or self.config_path
        if not path:
            _problem("start: pass config_path (a profiler_config.json), or call init first.")
            return
        cfg = _read_config(path)
        if cfg is not None:
            self._start(cfg)

    def _start(self, cfg: ConfigContext) -> None:
        self.steps_left = cfg.warmup() + cfg.active()
        self.prof = profile(
            activities=cfg.activities(),
            schedule=Schedule(wait=0, warmup=cfg.warmup(), active=cfg.active(), repeat=1, skip_first=0),
            on_trace_ready=tensorboard_trace_handler(cfg.prof_path, analyse_flag=cfg.analyse(),
                                                     async_mode=cfg.async_mode()),
            record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory, with_stack=cfg.with_stack,
            with_flops=cfg.with_flops, with_modules=cfg.with_modules,
            experimental_config=cfg.experimental_config)
        self.prof._set_step_num_offset_for_dynamic_prof(self.cur_step)
        self.prof.start()
        for key, value in cfg.meta_data().items():
            self.prof.add_metadata_json(str(key), json.dumps(value))
        _LOG.info("started profiling at step %d for %d steps into %s", self.cur_step, self.steps_left, cfg.prof_path)

    def _stop(self) -> None:
        self.prof.stop()
        self.prof = None
        _LOG.info("stopped profiling at step %d", self.cur_step)

    def _at_exit(self) -> None:
        if self.prof is not None:
            _problem("the process ends while profiling (fewer steps ran than warmup + active); saving what ran.")
            self._stop()


_instance = _DynamicProfile()  # (also what _DynamicProfile() returns)


def _guarded(fn):
    """As torch_npu: a failure of the profiler is logged, never raised into training."""
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            _problem(f"{fn.__name__} failed: {type(err).__name__}: {err}")
            return None
    return functools.wraps(fn)(wrapper)


@_guarded
def init(path: str):
    """Watch ``{path}/profiler_config.json`` (created with the defaults if missing)."""
    _instance.init(path)


@_guarded
def step():
    """Call once per training step: advances the step count and starts/stops runs."""
    _instance.step()


@_guarded
def start(config_path: str = None):
    """Profile from now, with ``config_path`` (default: init's profiler_config.json)."""
    _instance.start(config_path)


@_guarded
def set_state(state_step: dict):
    """Continue the step count of a resumed job: ``set_state({"cur_step": 1000})``."""
    _instance.set_state(state_step)
