"""``ProfilerLogger``: the analysis's log file, as torch_npu's: ``init(output_dir, custom_name)``
creates ``<output_dir>/logs/profiler_<YYYYmmddHHMMSS>_<pid>[_<custom_name>].log`` (rotated at
10 MB, 3 backups) behind the logger ``AscendProfiler[_<custom_name>]`` (INFO, not propagated);
once per process (a forked child makes its own). ``get_instance()`` (RuntimeError before
``init``), ``set_level(level)`` (the logger and its handlers), ``destroy()``.
``get_logger()``: the parse's logger, or before ``init`` the (unconfigured) logger of that name."""
import logging
import os
from datetime import datetime, timezone
from logging.handlers import RotatingFileHandler
from typing import Optional

from torch_npu.utils._path_manager import PathManager

__all__ = []


class ProfilerLogger:
    LOG_FORMAT = "[%(asctime)s.%(msecs)03d] [%(levelname)s] [%(name)s:%(lineno)d] %(message)s"
    DATE_FORMAT = "%Y-%m-%d-%H:%M:%S"
    DEFAULT_LOGGER_NAME = "AscendProfiler"
    DEFAULT_LOG_LEVEL = logging.INFO
    DEFAULT_LOG_DIR = "logs"
    MAX_BYTES = 10 * 1024 * 1024
    BACKUP_COUNT = 3
    _instance = None
    _pid = None

    @classmethod
    def get_instance(cls) -> logging.Logger:
        if cls._instance is None:
            raise RuntimeError("Logger not initialized. Call init first.")
        return cls._instance

    @classmethod
    def init(cls, output_dir: str, custom_name: Optional[str] = None) -> None:
        if cls._instance is not None and cls._pid == os.getpid():
            return
        if not isinstance(output_dir, str) or not output_dir:
            raise ValueError(f"ProfilerLogger.init: output_dir must be a non-empty str, got {output_dir!r}")
        log_dir = os.path.join(output_dir, cls.DEFAULT_LOG_DIR)
        PathManager.make_dir_safety(log_dir)
        suffix = f"_{custom_name}" if custom_name else ""
        logger = logging.getLogger(cls.DEFAULT_LOGGER_NAME + suffix)
        logger.setLevel(cls.DEFAULT_LOG_LEVEL)
        logger.propagate = False
        stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S")
        log_file = os.path.join(log_dir, f"profiler_{stamp}_{os.getpid()}{suffix}.log")
        handler = RotatingFileHandler(filename=log_file, maxBytes=cls.MAX_BYTES, backupCount=cls.BACKUP_COUNT,
                                      encoding="utf-8")
        handler.setFormatter(logging.Formatter(fmt=cls.LOG_FORMAT, datefmt=cls.DATE_FORMAT))
        handler.setLevel(cls.DEFAULT_LOG_LEVEL)
        logger.addHandler(handler)
        cls._instance = logger
        cls._pid = os.getpid()
        logger.info("Profiler logger initialized at: %s", log_file)

    @classmethod
    def set_level(cls, level: int) -> None:
        logger = cls.get_instance()
        logger.setLevel(level)
        for handler in logger.handlers:
            handler.setLevel(level)

    @classmethod
    def destroy(cls) -> None:
        """Closes the handlers (only in the process that made them: a forked child's copy of its
        parent's logger is dropped, not closed) and forgets the logger."""
        if cls._instance is not None:
            for handler in list(cls._instance.handlers):
                cls._instance.removeHandler(handler)
                handler.close()
            cls._instance = None


def get_logger() -> logging.Logger:
    """The parse's logger once ``ProfilerLogger.init`` ran, else ``logging.getLogger("AscendProfiler")``
    (for the parsers' helpers that are called outside a parse)."""
    return ProfilerLogger._instance or logging.getLogger(ProfilerLogger.DEFAULT_LOGGER_NAME)
