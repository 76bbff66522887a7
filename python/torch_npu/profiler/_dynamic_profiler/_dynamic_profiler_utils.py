"""``DynamicProfilerUtils``: logging, rank and constants of the dynamic profiler, as torch_npu's.

Messages go to ``{init path}/log/dp_{host}_{pid}_rank_{rank}.log`` (``init_logger``) and,
when they are warnings or errors, to the user as a warning as well. The monitor thread
(``DynMonitorProc``) logs to ``{init path}/log/monitor_dp_{host}_{pid}_rank_{rank}.log``
(``init_logger(is_monitor_process=True, ...)``, ``out_log(..., is_monitor_process=True)``),
only to that file. With the dynolog model (``DYNAMIC_PROFILER_MODEL = DYNO_CONFIG``)
messages go to ``stdout_log`` instead.
"""
import logging
import os
import socket
import warnings
from enum import Enum

import torch

__all__ = []


class DynamicProfilerUtils:
    class DynamicProfilerConfigModel(Enum):
        CFG_CONFIG = 0  # profiler_config.json (PROF_CONFIG_PATH / dynamic_profile.init)
        DYNO_CONFIG = 1  # the dynolog daemon

    class LoggerLevelEnum(Enum):
        INFO = 0
        WARNING = 1
        ERROR = 2

    class ProfilerStatus(Enum):
        """What the dynamic profiler reports to dynolog."""
        UNINITIALIZED = -1
        IDLE = 0
        RUNNING = 1
        READY = 2

    DYNAMIC_PROFILER_MODEL = DynamicProfilerConfigModel.CFG_CONFIG
    LOGGER = logging.getLogger("torch_npu.profiler.dynamic_profile")
    LOGGER_MONITOR = logging.getLogger("torch_npu.profiler.dynamic_profile.monitor")
    LOGGER_MONITOR.propagate = False  # its own file only
    _LEVELS = {LoggerLevelEnum.INFO: logging.INFO, LoggerLevelEnum.WARNING: logging.WARNING,
               LoggerLevelEnum.ERROR: logging.ERROR}

    CFG_CONFIG_PATH = None  # the folder given to dynamic_profile.init (absolute)
    CFG_BUFFER_SIZE = 1024 * 1024  # bytes of the shared-memory segment
    POLL_INTERVAL = 2  # seconds between two looks of the monitor at profiler_config.json

    # the profiler status reported to dynolog
    PROFILER_STATUS = "profiler_status"
    CURRENT_STEP = "current_step"
    START_STEP = "start_step"
    STOP_STEP = "stop_step"
    REPORT_INTERVAL = 1.0  # seconds

    @classmethod
    def init_logger(cls, is_monitor_process: bool = False, log_path: str = None) -> str:
        """Log to ``{log_path}/log/[monitor_]dp_{host}_{pid}_rank_{rank}.log``; returns the file's path."""
        if log_path is None:
            raise ValueError("init_logger: log_path must be a folder path, got None")
        logger = cls.LOGGER_MONITOR if is_monitor_process else cls.LOGGER
        folder = os.path.join(log_path, "log")
        os.makedirs(folder, exist_ok=True)
        name = f"dp_{socket.gethostname()}_{os.getpid()}_rank_{cls.get_rank_id()}.log"
        if is_monitor_process:
            name = "monitor_" + name
        name = os.path.abspath(os.path.join(folder, name))
        if not any(getattr(h, "baseFilename", None) == name for h in logger.handlers):
            handler = logging.FileHandler(name)
            handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] [%(process)d] %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        return name

    @classmethod
    def is_dyno_model(cls) -> bool:
        return cls.DYNAMIC_PROFILER_MODEL == cls.DynamicProfilerConfigModel.DYNO_CONFIG

    @classmethod
    def out_log(cls, message: str, level: "DynamicProfilerUtils.LoggerLevelEnum" = LoggerLevelEnum.INFO,
                is_monitor_process: bool = False) -> None:
        if cls.is_dyno_model():
            cls.stdout_log(message, level)
            return
        if is_monitor_process:
            cls.LOGGER_MONITOR.log(cls._LEVELS.get(level, logging.INFO), message)
            return
        cls.LOGGER.log(cls._LEVELS.get(level, logging.INFO), message)
        if level in (cls.LoggerLevelEnum.WARNING, cls.LoggerLevelEnum.ERROR):
            warnings.warn(f"[torch_npu.profiler.dynamic_profile] {message}", stacklevel=3)

    @classmethod
    def stdout_log(cls, message: str, level: "DynamicProfilerUtils.LoggerLevelEnum" = LoggerLevelEnum.INFO) -> None:
        print(f"[{level.name}] [{os.getpid()}] dynamic_profile: {message}", flush=True)

    @staticmethod
    def get_rank_id() -> int:
        """$RANK, else torch.distributed's rank, else -1."""
        rank = os.environ.get("RANK")
        if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        try:
            return int(rank)
        except (TypeError, ValueError):
            return -1

    @staticmethod
    def dyno_str_to_json(res) -> dict:
        """dynolog's answer (``KEY=value`` lines) as a dict of strings."""
        out = {}
        for line in str(res).split("\n"):
            parts = line.split("=")
            if len(parts) == 2:
                out[parts[0].strip()] = parts[1].strip()
        return out

    @staticmethod
    def parse_str_params_to_list(params) -> list:
        """``"a, b"`` -> ``["a", "b"]``; None or ``"None"`` -> ``[]``."""
        if params is None or params == "None":
            return []
        return [item.strip() for item in str(params).split(",")]
