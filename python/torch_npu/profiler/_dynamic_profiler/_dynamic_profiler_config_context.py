"""``ConfigContext``: one ``profiler_config.json``, validated, as torch_npu's.

A bad entry is reset to its default and logged (``DynamicProfilerUtils.out_log``), never
raised: a typo in the file must not stop training. The flags are attributes
(``record_shapes``, ``profile_memory``, ``with_stack``, ``with_flops``, ``with_modules``,
``experimental_config``, ``prof_path``, ``is_rank``), the rest methods (``activities()``,
``analyse()``, ``async_mode()``, ``active()``, ``warmup()``, ``start_step()``, ``start()``,
``meta_data()``, ``valid()``, ``is_dyno_monitor()``), as in torch_npu.
"""
import json

from ..experimental_config import AiCMetrics, ProfilerLevel, _ExperimentalConfig
from ..profiler import ProfilerActivity
from ._dynamic_profiler_utils import DynamicProfilerUtils

__all__ = []

_WARN = DynamicProfilerUtils.LoggerLevelEnum.WARNING


class ConfigContext:
    DEFAULT_ACTIVE_NUM = 1
    DEFAULT_START_STEP = 0
    INSTANT_START_STEP = -1  # start at the next step
    DEFAULT_WARMUP = 0
    DEADLINE_PROF_DIR = "./"

    def __init__(self, json_data: dict):
        if not isinstance(json_data, dict):
            DynamicProfilerUtils.out_log(f"the profiler config must be a JSON object, got {json_data!r}; "
                                         "using the defaults.", _WARN)
            json_data = {}
        self._rank_id = DynamicProfilerUtils.get_rank_id()
        self.parse(json_data)

    # -- parsing -------------------------------------------------------------------------
    def parse(self, data: dict) -> None:
        # dynolog's request to start its npu monitor, not a profiling run
        self._is_dyno_monitor = "NPU_MONITOR_START" in data
        names = data.get("activities", ["CPU", "NPU"])
        self.activity_set = []
        for name in names if isinstance(names, list) else []:
            activity = getattr(ProfilerActivity, str(name).upper(), None)
            if activity is None:
                DynamicProfilerUtils.out_log(f"activities: {name!r} is not CPU or NPU; ignored.", _WARN)
            elif activity not in self.activity_set:
                self.activity_set.append(activity)
        if not self.activity_set:
            self.activity_set = [ProfilerActivity.CPU, ProfilerActivity.NPU]
        self.prof_path = data.get("prof_dir", self.DEADLINE_PROF_DIR)
        if not isinstance(self.prof_path, str) or not self.prof_path:
            DynamicProfilerUtils.out_log(f"Invalid parameter prof_dir {self.prof_path!r}, reset it to "
                                         f"{self.DEADLINE_PROF_DIR!r}.", _WARN)
            self.prof_path = self.DEADLINE_PROF_DIR
        self._analyse = self._flag(data, "analyse")
        self._async_mode = self._flag(data, "async_mode")
        self.record_shapes = self._flag(data, "record_shapes")
        self.profile_memory = self._flag(data, "profile_memory")
        self.with_stack = self._flag(data, "with_stack")
        self.with_flops = self._flag(data, "with_flops")
        self.with_modules = self._flag(data, "with_modules")
        self._active = self._count(data, "active", 1, self.DEFAULT_ACTIVE_NUM)
        self._warmup = self._count(data, "warmup", 0, self.DEFAULT_WARMUP)
        self._start_step = self._count(data, "start_step", self.INSTANT_START_STEP, self.DEFAULT_START_STEP)
        metadata = data.get("metadata", {})
        self._meta_data = metadata if isinstance(metadata, dict) else {}
        self.is_rank = self._flag(data, "is_rank")
        ranks = data.get("rank_list", [])
        self._rank_set = {r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r >= 0} \
            if isinstance(ranks, list) else set()
        if self.is_rank and (not isinstance(ranks, list) or len(self._rank_set) != len(ranks)):
            DynamicProfilerUtils.out_log(f"Invalid parameter rank_list {ranks!r}: only ranks (ints >= 0) count.", _WARN)
        self.experimental_config = self._experimental(data.get("experimental_config"))

    @staticmethod
    def _flag(data: dict, key: str, default: bool = False) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            DynamicProfilerUtils.out_log(f"Invalid parameter {key} {value!r} (true or false), reset it to {default}.",
                                         _WARN)
            return default
        return value

    @staticmethod
    def _count(data: dict, key: str, low: int, default: int) -> int:
        value = data.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            DynamicProfilerUtils.out_log(f"Invalid parameter {key} {value!r} (an integer >= {low}), reset it to "
                                         f"{default}.", _WARN)
            return default
        return value

    @staticmethod
    def _experimental(cfg):
        if not isinstance(cfg, dict) or not cfg:
            return None
        # Names such as "Level1" / "PipeUtilization" as well as the values themselves; an
        # invalid value is reset by _ExperimentalConfig, with its warning.
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

    # -- reading -------------------------------------------------------------------------
    def activities(self) -> list:
        return list(self.activity_set)

    def analyse(self) -> bool:
        return self._analyse

    def async_mode(self) -> bool:
        return self._async_mode

    def active(self) -> int:
        return self._active

    def warmup(self) -> int:
        return self._warmup

    def start_step(self) -> int:
        return self._start_step

    def start(self) -> bool:
        """True when the run starts at the next step (start_step -1)."""
        return self._start_step == self.INSTANT_START_STEP

    def meta_data(self) -> dict:
        return self._meta_data

    def valid(self) -> bool:
        """Whether this process profiles: every rank, or with is_rank only those in rank_list."""
        if not self.is_rank or self._rank_id in self._rank_set:
            return True
        DynamicProfilerUtils.out_log(f"Rank {self._rank_id} not in valid rank_list {sorted(self._rank_set)}!", _WARN)
        return False

    def is_dyno_monitor(self) -> bool:
        """Whether the config is dynolog's NPU_MONITOR_START request (passed on to dynolog)."""
        return self._is_dyno_monitor

    @staticmethod
    def profiler_cfg_json_to_bytes(json_dict: dict) -> bytes:
        return json.dumps(json_dict).encode("utf-8")

    @staticmethod
    def bytes_to_profiler_cfg_json(bytes_cfg: bytes) -> dict:
        return json.loads(bytes_cfg.decode("utf-8"))
