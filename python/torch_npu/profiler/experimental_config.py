"""``torch_npu.profiler._ExperimentalConfig`` and its enumerations, as in torch_npu.

The simulator has no AI Core counters, L2 cache or host-system samplers: the levels and
metrics are accepted (and validated, with torch_npu's warnings) so that profiling code
written for Ascend runs; what the simulator can record is recorded at every level.
``gc_detect_threshold`` (ms) records Python's garbage collections at least that long as "GC"
ranges (with ProfilerActivity.CPU; see _profiler_gc_detect.py). Calling a config returns
its native form, ``torch_npu._C._profiler._ExperimentalConfig``.
"""
import warnings
from typing import Optional, Union

__all__ = ["_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"]


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Db = "db"
    Text = "text"


class HostSystem:
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def supported_profiler_level():
    return {ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2, ProfilerLevel.Level_none}


def supported_ai_core_metrics():
    return {AiCMetrics.AiCoreNone, AiCMetrics.PipeUtilization, AiCMetrics.ArithmeticUtilization,
            AiCMetrics.Memory, AiCMetrics.MemoryL0, AiCMetrics.MemoryUB, AiCMetrics.ResourceConflictRatio,
            AiCMetrics.L2Cache, AiCMetrics.MemoryAccess}


def supported_export_type():
    return {ExportType.Db, ExportType.Text}


def _one_of(value, options) -> bool:
    return isinstance(value, str) and value in options


def _warn(msg: str) -> None:
    warnings.warn(f"[torch_npu.profiler] {msg}", stacklevel=3)


class _ExperimentalConfig:
    """Settings beyond torch.profiler's (``experimental_config=`` of ``profile``).

    Invalid values are reset to their defaults with a warning, as torch_npu does.
    """

    def __init__(self, profiler_level: int = ProfilerLevel.Level0,
                 aic_metrics: int = AiCMetrics.PipeUtilization, l2_cache: bool = False,
                 msprof_tx: bool = False, mstx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False,
                 gc_detect_threshold: Optional[float] = None,
                 export_type: Union[str, list] = ExportType.Text, host_sys: Optional[list] = None,
                 mstx_domain_include: Optional[list] = None, mstx_domain_exclude: Optional[list] = None,
                 sys_io: bool = False, sys_interconnection: bool = False):
        self._profiler_level = profiler_level
        # PipeUtilization (the default) applies from Level1 on; at Level0 it is dropped silently,
        # other metrics asked for at Level0 with a warning.
        self._aic_metrics_given = aic_metrics is not None and aic_metrics != AiCMetrics.PipeUtilization
        self._aic_metrics = AiCMetrics.PipeUtilization if aic_metrics is None else aic_metrics
        self._l2_cache = l2_cache
        self._msprof_tx = msprof_tx
        self._mstx = mstx
        self._data_simplification = data_simplification
        self.record_op_args = record_op_args
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._export_type = [export_type] if isinstance(export_type, str) else (
            list(export_type) if isinstance(export_type, (list, tuple, set)) else [])
        self._host_sys = host_sys if host_sys else []
        self._mstx_domain_include = mstx_domain_include if mstx_domain_include else []
        self._mstx_domain_exclude = mstx_domain_exclude if mstx_domain_exclude else []
        self._sys_io = sys_io
        self._sys_interconnection = sys_interconnection
        self._check_params()

    def _check_params(self) -> None:
        if not _one_of(self._profiler_level, supported_profiler_level()):
            _warn(f"Invalid parameter profiler_level {self._profiler_level!r}, reset it to Level0.")
            self._profiler_level = ProfilerLevel.Level0
        if not _one_of(self._aic_metrics, supported_ai_core_metrics()):
            _warn(f"Invalid parameter aic_metrics {self._aic_metrics!r}, reset it to default.")
            self._aic_metrics = AiCMetrics.PipeUtilization
        if self._profiler_level in (ProfilerLevel.Level0, ProfilerLevel.Level_none) and \
                self._aic_metrics != AiCMetrics.AiCoreNone:
            # AI Core counters are collected from Level1 on (torch_npu): an explicit metric at
            # Level0 -- including the PipeUtilization default -- is dropped.
            if self._aic_metrics_given:
                _warn("Please use level1 or level2 if you want to collect aic metrics, reset aic metrics to None!")
            self._aic_metrics = AiCMetrics.AiCoreNone
        for name in ("_l2_cache", "_msprof_tx", "_mstx", "record_op_args", "_op_attr", "_sys_io",
                     "_sys_interconnection"):
            if not isinstance(getattr(self, name), bool):
                _warn(f"Invalid parameter {name.lstrip('_')}, which must be of boolean type, reset it to False.")
                setattr(self, name, False)
        if self._data_simplification is not None and not isinstance(self._data_simplification, bool):
            _warn("Invalid parameter data_simplification, which must be of boolean type, reset it to True.")
            self._data_simplification = True
        if self._msprof_tx:
            _warn("The parameter msprof_tx will be deprecated. Please use the new parameter mstx instead.")
        if self._profiler_level == ProfilerLevel.Level_none and not self.tx_enabled:
            _warn("Parameter mstx or msprof_tx must be True if profiler_level is set to Level_none; set mstx=True.")
            self._mstx = True
        bad = [t for t in self._export_type if not _one_of(t, supported_export_type())]
        if bad or not self._export_type:
            _warn(f"Invalid parameter export_type {bad or self._export_type!r}, reset it to text.")
            self._export_type = [ExportType.Text]
        self._export_type = sorted(set(self._export_type))
        if self._op_attr and ExportType.Db not in self._export_type:
            _warn("op_attr switch is invalid with export type set as text.")
            self._op_attr = False
        if self._gc_detect_threshold is not None and (
                not isinstance(self._gc_detect_threshold, (int, float)) or self._gc_detect_threshold < 0):
            _warn("Parameter gc_detect_threshold must be a non-negative number, reset it to None.")
            self._gc_detect_threshold = None
        valid_hosts = {HostSystem.CPU, HostSystem.MEM, HostSystem.DISK, HostSystem.NETWORK, HostSystem.OSRT,
                       HostSystem.NUMA}
        if not isinstance(self._host_sys, list) or any(not _one_of(h, valid_hosts) for h in self._host_sys):
            _warn(f"Invalid parameter host_sys {self._host_sys!r}, reset it to [].")
            self._host_sys = []
        self._host_sys = sorted(set(self._host_sys))
        self._check_mstx_domains()

    def _check_mstx_domains(self) -> None:
        """mstx_domain_include / _exclude: lists of domain names, only with mstx (or msprof_tx),
        and not both (include wins)."""
        if not self.tx_enabled:
            if self._mstx_domain_include or self._mstx_domain_exclude:
                _warn("mstx_domain_include and mstx_domain_exclude are valid when msprof_tx or mstx is True.")
            self._mstx_domain_include, self._mstx_domain_exclude = [], []
            return
        for name in ("_mstx_domain_include", "_mstx_domain_exclude"):
            value = getattr(self, name)
            if not isinstance(value, list) or any(not isinstance(d, str) for d in value):
                _warn(f"Invalid parameter {name.lstrip('_')} {value!r}: expected a list of str, reset it to [].")
                setattr(self, name, [])
            else:
                setattr(self, name, sorted(set(value)))
        if self._mstx_domain_include and self._mstx_domain_exclude:
            _warn("Parameter mstx_domain_include and mstx_domain_exclude can not be both set, "
                  "only mstx_domain_include will work.")
            self._mstx_domain_exclude = []

    @property
    def export_type(self) -> list:
        return list(self._export_type)

    @property
    def profiler_level(self) -> str:
        return self._profiler_level

    @property
    def aic_metrics(self) -> str:
        return self._aic_metrics

    @property
    def with_gc(self) -> bool:
        return self._gc_detect_threshold is not None

    @property
    def gc_detect_threshold(self):
        return self._gc_detect_threshold

    @property
    def tx_enabled(self) -> bool:
        return self._msprof_tx or self._mstx

    def __call__(self):
        """The native form (``torch_npu._C._profiler._ExperimentalConfig``) of this config."""
        from ._c_profiler import _ExperimentalConfig as _Native

        return _Native(trace_level=self._profiler_level, metrics=self._aic_metrics, l2_cache=self._l2_cache,
                       record_op_args=self.record_op_args, msprof_tx=self._msprof_tx or self._mstx,
                       op_attr=self._op_attr, host_sys=list(self._host_sys),
                       mstx_domain_include=list(self._mstx_domain_include),
                       mstx_domain_exclude=list(self._mstx_domain_exclude), sys_io=self._sys_io,
                       sys_interconnection=self._sys_interconnection)

    def _to_dict(self) -> dict:
        return {"profiler_level": self._profiler_level, "aic_metrics": self._aic_metrics, "l2_cache": self._l2_cache,
                "msprof_tx": self._msprof_tx, "mstx": self._mstx, "data_simplification": self._data_simplification,
                "record_op_args": self.record_op_args, "op_attr": self._op_attr, "export_type": self._export_type,
                "host_sys": self._host_sys}
