"""``torch_npu.profiler._ExperimentalConfig`` and its enumerations, as in torch_npu.

The simulator has no AI Core counters, L2 cache or host-system samplers: the levels and
metrics are accepted (and validated, with torch_npu's warnings) so that profiling code
written for Ascend runs; what the simulator can record is recorded at every level.
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


def _warn(msg: str) -> None:
    warnings.warn(f"[torch_npu.profiler] {msg}", stacklevel=3)


class _ExperimentalConfig:
    """Settings beyond torch.profiler's (``experimental_config=`` of ``profile``).

    Invalid values are reset to their defaults with a warning, as torch_npu does.
    """

    def __init__(self, profiler_level: str = ProfilerLevel.Level0,
                 aic_metrics: str = AiCMetrics.PipeUtilization, l2_cache: bool = False,
                 msprof_tx: bool = False, mstx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False,
                 gc_detect_threshold: Optional[float] = None,
                 export_type: Union[str, list] = ExportType.Text, host_sys: Optional[list] = None,
                 mstx_domain_include: Optional[list] = None, mstx_domain_exclude: Optional[list] = None,
                 sys_io: bool = False, sys_interconnection: bool = False):
        self._profiler_level = profiler_level
        self._aic_metrics = aic_metrics
        self._l2_cache = l2_cache
        self._msprof_tx = msprof_tx
        self._mstx = mstx
        self._data_simplification = data_simplification
        self.record_op_args = record_op_args
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._export_type = [export_type] if isinstance(export_type, str) else list(export_type or [])
        self._host_sys = list(host_sys) if host_sys else []
        self._mstx_domain_include = list(mstx_domain_include) if mstx_domain_include else []
        self._mstx_domain_exclude = list(mstx_domain_exclude) if mstx_domain_exclude else []
        self._sys_io = sys_io
        self._sys_interconnection = sys_interconnection
        self._check_params()

    def _check_params(self) -> None:
        if self._profiler_level not in supported_profiler_level():
            _warn(f"Invalid parameter profiler_level {self._profiler_level!r}, reset it to Level0.")
            self._profiler_level = ProfilerLevel.Level0
        if self._aic_metrics not in supported_ai_core_metrics():
            _warn(f"Invalid parameter aic_metrics {self._aic_metrics!r}, reset it to default.")
            self._aic_metrics = (AiCMetrics.AiCoreNone if self._profiler_level == ProfilerLevel.Level0
                                 else AiCMetrics.PipeUtilization)
        for name in ("_l2_cache", "_msprof_tx", "_mstx", "_data_simplification", "record_op_args", "_op_attr",
                     "_sys_io", "_sys_interconnection"):
            if not isinstance(getattr(self, name), bool):
                _warn(f"Invalid parameter {name.lstrip('_')}, which must be of boolean type, reset it to False.")
                setattr(self, name, name == "_data_simplification")
        bad = [t for t in self._export_type if t not in supported_export_type()]
        if bad or not self._export_type:
            _warn(f"Invalid parameter export_type {bad or self._export_type!r}, reset it to text.")
            self._export_type = [ExportType.Text]
        if self._gc_detect_threshold is not None and (
                not isinstance(self._gc_detect_threshold, (int, float)) or self._gc_detect_threshold < 0):
            _warn("Parameter gc_detect_threshold must be a non-negative number, reset it to None.")
            self._gc_detect_threshold = None
        valid_hosts = {HostSystem.CPU, HostSystem.MEM, HostSystem.DISK, HostSystem.NETWORK, HostSystem.OSRT,
                       HostSystem.NUMA}
        if any(h not in valid_hosts for h in self._host_sys):
            _warn(f"Invalid parameter host_sys {self._host_sys!r}, reset it to [].")
            self._host_sys = []

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

    def _to_dict(self) -> dict:
        return {"profiler_level": self._profiler_level, "aic_metrics": self._aic_metrics, "l2_cache": self._l2_cache,
                "msprof_tx": self._msprof_tx, "mstx": self._mstx, "data_simplification": self._data_simplification,
                "record_op_args": self.record_op_args, "op_attr": self._op_attr, "export_type": self._export_type,
                "host_sys": self._host_sys}
