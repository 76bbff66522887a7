"""``DynamicProfilerUtils``: logging and rank of the dynamic profiler, as torch_npu's.

Messages go to ``{init path}/log/dp_{host}_{pid}_rank_{rank}.log`` (``init_logger``) and,
when they are warnings or errors, to the user as a warning as well. With the dynolog model
(``DYNAMIC_PROFILER_MODEL = DYNO_CONFIG``) they go to ``stdout_log`` instead.
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

    DYNAMIC_PROFILER_MODEL = DynamicProfilerConfigModel.CFG_CONFIG
    LOGGER = logging.getLogger("torch_npu.profiler.dynamic_profile")
    _LEVELS = {LoggerLevelEnum.INFO: logging.INFO, LoggerLevelEnum.WARNING: logging.WARNING,
               LoggerLevelEnum.ERROR: logging.ERROR}

    @classmethod
    def init_logger(cls, log_path: str) -> str:
        """Log to ``{log_path}/log/dp_{host}_{pid}_rank_{rank}.log``; returns the file's path."""
        folder = os.path.join(log_path, "log")
        os.makedirs(folder, exist_ok=True)
        name = os.path.join(folder, f"dp_{socket.gethostname()}_{os.getpid()}_rank_{cls.get_rank_id()}.log")
        handler = logging.FileHandler(name)
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] [%(process)d] %(message)s"))
        cls.LOGGER.addHandler(handler)
        cls.LOGGER.setLevel(logging.INFO)
        return name

    @classmethod
    def is_dyno_model(cls) -> bool:
        return cls.DYNAMIC_PROFILER_MODEL == cls.DynamicProfilerConfigModel.DYNO_CONFIG

    @classmethod
    def out_log(cls, message: str, level: "DynamicProfilerUtils.LoggerLevelEnum" = LoggerLevelEnum.INFO) -> None:
        if cls.is_dyno_model():
            cls.stdout_log(message, level)
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
