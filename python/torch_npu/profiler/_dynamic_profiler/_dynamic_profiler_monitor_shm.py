"""``DynamicProfilerShareMemory``: the dynamic profiler's channel to ``profiler_config.json``.

torch_npu copies the file into a shared-memory segment from a monitor process and every
rank of the node reads the segment. Here every process reads the file itself when its
modification time changes (one ``stat`` per step), which gives each process the same
config without the extra process; the class keeps torch_npu's name and its defaults
(``JSON_DATA``, written when the file does not exist).
"""
import copy
import json
import os

from ._dynamic_profiler_config_context import ConfigContext
from ._dynamic_profiler_utils import DynamicProfilerUtils

__all__ = []


class DynamicProfilerShareMemory:
    # profiler_config.json as torch_npu creates it.
    JSON_DATA = {
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

    def __init__(self, path: str, config_path: str, rank_id: int):
        """``config_path`` (in the folder ``path``) is created with ``JSON_DATA`` if missing;
        only edits made after this count as new configs."""
        self.path = path
        self.config_path = config_path
        self.rank_id = rank_id
        if not os.path.exists(config_path):
            with open(config_path, "w") as f:
                json.dump(copy.deepcopy(self.JSON_DATA), f, indent=4)
        self._mtime = self._config_mtime()

    def _config_mtime(self):
        try:
            return os.stat(self.config_path).st_mtime_ns
        except OSError:
            return None  # deleted: wait for it to be written again

    def read_bytes(self):
        """The file's content if it changed since the last read, else None."""
        mtime = self._config_mtime()
        if mtime is None or mtime == self._mtime:
            return None
        self._mtime = mtime
        with open(self.config_path, "rb") as f:
            return f.read()

    def shm_to_prof_conf_context(self):
        """The edited config (a ConfigContext), or None: unchanged, unreadable (logged)."""
        try:
            data = self.read_bytes()
            if data is None:
                return None
            cfg = ConfigContext.bytes_to_profiler_cfg_json(data)
            if not isinstance(cfg, dict):
                raise ValueError("the file must hold a JSON object")
            return ConfigContext(cfg)
        except (OSError, ValueError) as err:
            DynamicProfilerUtils.out_log(f"cannot read the profiler config {self.config_path!r}: {err}",
                                         DynamicProfilerUtils.LoggerLevelEnum.WARNING)
            return None
