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

torch_npu watches the file from a monitor process and passes changes through shared
memory; here each process checks the file's modification time in ``step()`` (one
``stat``), which has the same effect without the extra process.
"""
import atexit
import functools
import json
import logging
import os
import socket
import warnings

import torch

from .experimental_config import AiCMetrics, ProfilerLevel, _ExperimentalConfig
from .profiler import ProfilerActivity, profile, tensorboard_trace_handler
from .scheduler import Schedule

__all__ = ["init", "step", "start", "set_state"]

CONFIG_NAME = "profiler_config.json"

# profiler_config.json as torch_npu creates it.
DEFAULT_CONFIG = {
    "activities": ["CPU", "NPU"],
    "prof_dir": "./",
    "analyse": False,
    "async_mode": False,
    "record_shapes": False,
    "profile_memory": False,
    "with_stack": False,
    "with_flops": False,
    "with_modules": False,
    "active": 1,
    "warmup": 0,
    "start_step": 0,
    "is_rank": False,
    "rank_list": [],
    "experimental_config": {
        "profiler_level": "Level0",
        "aic_metrics": "AiCoreNone",
        "l2_cache": False,
        "op_attr": False,
        "gc_detect_threshold": None,
        "data_simplification": True,
        "record_op_args": False,
        "export_type": ["text"],
        "msprof_tx": False,
        "mstx": False,
        "host_sys": [],
        "mstx_domain_include": [],
        "mstx_domain_exclude": [],
        "sys_io": False,
        "sys_interconnection": False,
    },
}

_LOG = logging.getLogger("torch_npu.profiler.dynamic_profile")


def _rank() -> int:
    rank = os.environ.get("RANK")
    if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    try:
        return int(rank)
    except (TypeError, ValueError):
        return -1


def _problem(msg: str) -> None:
    """Something the user should fix: to the log and as a warning."""
    _LOG.warning(msg)
    warnings.warn(f"[torch_npu.profiler.dynamic_profile] {msg}", stacklevel=3)


class _Config:
    """One profiler_config.json, validated: a bad entry is reset to its default (logged)."""

    def __init__(self, data: dict):
        def flag(key, default=False):
            value = data.get(key, default)
            if not isinstance(value, bool):
                _problem(f"{key} must be true or false, got {value!r}; using {default}.")
                return default
            return value

        def count(key, low, default):
            value = data.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                _problem(f"{key} must be an integer >= {low}, got {value!r}; using {default}.")
                return default
            return value

        names = data.get("activities", ["CPU", "NPU"])
        self.activities = []
        for name in names if isinstance(names, list) else []:
            activity = getattr(ProfilerActivity, str(name).upper(), None)
            if activity is None:
                _problem(f"activities: {name!r} is not CPU or NPU; ignored.")
            elif activity not in self.activities:
                self.activities.append(activity)
        if not self.activities:
            self.activities = [ProfilerActivity.CPU, ProfilerActivity.NPU]
        self.prof_dir = data.get("prof_dir", "./")
        if not isinstance(self.prof_dir, str) or not self.prof_dir:
            _problem(f"prof_dir must be a directory path, got {self.prof_dir!r}; using './'.")
            self.prof_dir = "./"
        self.analyse = flag("analyse")
        self.async_mode = flag("async_mode")
        self.record_shapes = flag("record_shapes")
        self.profile_memory = flag("profile_memory")
        self.with_stack = flag("with_stack")
        self.with_flops = flag("with_flops")
        self.with_modules = flag("with_modules")
        self.active = count("active", 1, 1)
        self.warmup = count("warmup", 0, 0)
        self.start_step = count("start_step", -1, 0)  # -1: start at the next step
        self.metadata = data.get("metadata", {}) if isinstance(data.get("metadata", {}), dict) else {}
        self.is_rank = flag("is_rank")
        ranks = data.get("rank_list", [])
        self.ranks = {r for r in ranks if isinstance(r, int) and r >= 0} if isinstance(ranks, list) else set()
        self.experimental_config = self._experimental(data.get("experimental_config"))

    @staticmethod
    def _experimental(cfg):
        if not isinstance(cfg, dict) or not cfg:
            return None
        # Names such as "Level1" / "PipeUtilization" as well as the values themselves.
        level = cfg.get("profiler_level", "Level0")
        metrics = cfg.get("aic_metrics", "AiCoreNone")
        return _ExperimentalConfig(
            profiler_level=getattr(ProfilerLevel, level, level) if isinstance(level, str) else level,
            aic_metrics=getattr(AiCMetrics, metrics, metrics) if isinstance(metrics, str) else metrics,
            l2_cache=cfg.get("l2_cache", False), op_attr=cfg.get("op_attr", False),
            gc_detect_threshold=cfg.get("gc_detect_threshold"),
            data_simplification=cfg.get("data_simplification", True),
            record_op_args=cfg.get("record_op_args", False), export_type=cfg.get("export_type", "text"),
            msprof_tx=cfg.get("msprof_tx", False), mstx=cfg.get("mstx", False), host_sys=cfg.get("host_sys"),
            mstx_domain_include=cfg.get("mstx_domain_include"), mstx_domain_exclude=cfg.get("mstx_domain_exclude"),
            sys_io=cfg.get("sys_io", False), sys_interconnection=cfg.get("sys_interconnection", False))

    def for_this_rank(self) -> bool:
        if not self.is_rank:
            return True
        if _rank() in self.ranks:
            return True
        _LOG.info("rank %s is not in rank_list %s: not profiling", _rank(), sorted(self.ranks))
        return False


def _read_config(path: str):
    """The parsed file, or None (logged) if it cannot be read."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("the file must hold a JSON object")
    except (OSError, ValueError) as err:
        _problem(f"cannot read the profiler config {path!r}: {err}")
        return None
    return _Config(data)


class _DynamicProfile:
    """The process's dynamic profiler: the config it watches and the run in progress.
    One per process: ``_DynamicProfile()`` returns it (as torch_npu's singleton)."""

    _the = None

    def __new__(cls):
        if cls._the is None:
            cls._the = super().__new__(cls)
            cls._the._setup()
        return cls._the

    def _setup(self):
        self.config_path = None
        self.prof = None  # the profile of the run in progress
        self.pending = None  # a config waiting for its start_step
        self.cur_step = 0
        self.steps_left = 0
        self._mtime = None
        self.repeat_init = False

    def init(self, path: str) -> None:
        if self.repeat_init:
            _problem("init was called again; the first call's config stays in use.")
            return
        if not isinstance(path, str) or not path:
            _problem(f"init: path must be a directory path, got {path!r}; dynamic profiling is off.")
            return
        path = os.path.abspath(path)
        try:
            os.makedirs(os.path.join(path, "log"), exist_ok=True)
            self.config_path = os.path.join(path, CONFIG_NAME)
            if not os.path.exists(self.config_path):
                with open(self.config_path, "w") as f:
                    json.dump(DEFAULT_CONFIG, f, indent=4)
        except OSError as err:
            _problem(f"init: cannot use {path!r} ({err}); dynamic profiling is off.")
            self.config_path = None
            return
        log_name = f"dp_{socket.gethostname()}_{os.getpid()}_rank_{_rank()}.log"
        handler = logging.FileHandler(os.path.join(path, "log", log_name))
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] [%(process)d] %(message)s"))
        _LOG.addHandler(handler)
        _LOG.setLevel(logging.INFO)
        self._mtime = self._config_mtime()  # only later edits start a run
        self.repeat_init = True
        atexit.register(self._at_exit)
        _LOG.info("watching %s", self.config_path)

    def _config_mtime(self):
        try:
            return os.stat(self.config_path).st_mtime_ns
        except OSError:
            return None  # deleted: wait for it to be written again

    def _poll(self):
        """A config edited since the last look, or None."""
        if self.config_path is None:
            return None
        mtime = self._config_mtime()
        if mtime is None or mtime == self._mtime:
            return None
        self._mtime = mtime
        cfg = _read_config(self.config_path)
        if cfg is not None:
            _LOG.info("config changed: start_step=%s warmup=%s active=%s", cfg.start_step, cfg.warmup, cfg.active)
        return cfg if cfg is not None and cfg.for_this_rank() else None

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

    def step(self) -> None:
        self.cur_step += 1
        cfg = self._poll()
        if cfg is not None:
            self.pending = cfg  # (applied once a run in progress has ended)
        if self.prof is not None:
            self.prof.step()
            self.steps_left -= 1
            if self.steps_left == 0:
                self._stop()
        elif self.pending is not None:
            start = self.pending.start_step
            if start == -1 or self.cur_step == start:
                self._start(self.pending)
                self.pending = None
            elif self.cur_step > start:
                _problem(f"start_step={start} has passed (current step {self.cur_step}); the config is ignored.")
                self.pending = None

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

    def _start(self, cfg: _Config) -> None:
        self.steps_left = cfg.warmup + cfg.active
        self.prof = profile(
            activities=cfg.activities,
            schedule=Schedule(wait=0, warmup=cfg.warmup, active=cfg.active, repeat=1, skip_first=0),
            on_trace_ready=tensorboard_trace_handler(cfg.prof_dir, analyse_flag=cfg.analyse,
                                                     async_mode=cfg.async_mode),
            record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory, with_stack=cfg.with_stack,
            with_flops=cfg.with_flops, with_modules=cfg.with_modules,
            experimental_config=cfg.experimental_config)
        self.prof._set_step_num_offset_for_dynamic_prof(self.cur_step)
        self.prof.start()
        for key, value in cfg.metadata.items():
            self.prof.add_metadata_json(str(key), json.dumps(value))
        _LOG.info("started profiling at step %d for %d steps into %s", self.cur_step, self.steps_left, cfg.prof_dir)

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
