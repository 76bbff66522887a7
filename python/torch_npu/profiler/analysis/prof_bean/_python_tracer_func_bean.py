"""``PythonTracerFuncBean``: one record of FRAMEWORK/torch.python_tracer_func (a Python call or
return seen by the with_stack tracer): ``start_ns, thread_id, process_id, hash_key`` (uint64) and
``trace_tag`` (uint8), fixed size, no TLV header (read with ``BinaryDecoder``). The hash key
names a function in torch.python_tracer_hash."""
import struct
from enum import Enum

from .._profiler_config import ProfilerConfig

__all__ = []


class PythonTracerFuncEnum(Enum):
    START_NS = 0
    THREAD_ID = 1
    PROCESS_ID = 2
    HASH_KEY = 3
    TRACE_TAG = 4


class PythonTracerFuncBean:
    CONSTANT_STRUCT = "<4QB"

    def __init__(self, data):
        fields = struct.unpack(self.CONSTANT_STRUCT, data)
        self._constant_data = fields
        config = ProfilerConfig()
        self._start_ns = config.get_local_time(
            config.get_timestamp_from_syscnt(fields[PythonTracerFuncEnum.START_NS.value]))
        self._tid = int(fields[PythonTracerFuncEnum.THREAD_ID.value])
        self._pid = int(fields[PythonTracerFuncEnum.PROCESS_ID.value])
        self._key = int(fields[PythonTracerFuncEnum.HASH_KEY.value])
        self._trace_tag = int(fields[PythonTracerFuncEnum.TRACE_TAG.value])

    @property
    def start_ns(self) -> int:
        return self._start_ns

    @property
    def tid(self) -> int:
        return self._tid

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def trace_tag(self) -> int:
        return self._trace_tag

    @property
    def key(self) -> int:
        return self._key
