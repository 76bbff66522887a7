"""``GCRecordBean``: one record of FRAMEWORK/torch.gc_record (a Python garbage collection seen
by ``ProfGCDetector``): ``pid, start, end`` (uint64 system-counter values, ``Constant.GC_RECORD_FORMAT``),
fixed size (read with ``BinaryDecoder``). Shown as a ``GC`` event of the process."""
import struct
from enum import Enum

from .._profiler_config import ProfilerConfig
from ..prof_common_func._constant import Constant

__all__ = []


class GCRecordEnum(Enum):
    PID = 0
    STRAT_NS = 1
    END_NS = 2


class GCRecordBean:
    def __init__(self, data):
        fields = struct.unpack(Constant.GC_RECORD_FORMAT, data)
        self._constant_data = fields
        config = ProfilerConfig()
        self._start_ns = config.get_local_time(config.get_timestamp_from_syscnt(fields[GCRecordEnum.STRAT_NS.value]))
        self._end_ns = config.get_local_time(config.get_timestamp_from_syscnt(fields[GCRecordEnum.END_NS.value]))
        self._pid = int(fields[GCRecordEnum.PID.value])
        self._tid = self._pid  # the collection runs on the process's main thread

    @property
    def ts(self) -> int:
        return self._start_ns

    @property
    def name(self) -> str:
        return "GC"

    @property
    def pid(self) -> int:
        return self._pid

    @pid.setter
    def pid(self, pid: int):
        self._pid = pid

    @property
    def tid(self) -> int:
        return self._tid

    @property
    def args(self) -> dict:
        return {}

    @property
    def dur(self) -> int:
        return self._end_ns - self._start_ns
