"""``MemoryUseBean``: one record of FRAMEWORK/torch.memory_usage (a caching-allocator event).

Body (MemoryData): ``ptr, time_ns, alloc_size, total_allocated, total_reserved, total_active,
stream_ptr`` (int64, bytes), ``device_type, device_index`` (int8; device type 20 is the NPU),
``component_type, data_type, allocator_type`` (uint8), ``thread_id, process_id`` (uint64).
Sizes are given in KB (``alloc_size``) / MB (totals), the ``*_for_db`` ones in bytes.
"""
import struct
from enum import Enum

from .._profiler_config import ProfilerConfig
from ..prof_common_func._constant import Constant, convert_ns2us_str
from ._common_bean import CommonBean

__all__ = []


class MemoryEnum(Enum):
    PTR = 0
    TIME_NS = 1
    ALLOC_SIZE = 2
    TOTAL_ALLOCATED = 3
    TOTAL_RESERVED = 4
    TOTAL_ACTIVE = 5
    STREAM_PTR = 6
    DEVICE_TYPE = 7
    DEVICE_INDEX = 8
    COMPONENT_TYPE = 9
    DATA_TYPE = 10
    ALLOCATOR_TYPE = 11
    THREAD_ID = 12
    PROCESS_ID = 13


class MemoryUseBean(CommonBean):
    CONSTANT_STRUCT = "<7q2b3B2Q"
    CONSTANT_UNPACKER = struct.Struct(CONSTANT_STRUCT)
    NPU_ID = 20
    CPU_ID = 0
    INNER_ALLOCATOR = 0

    def __init__(self, data: dict):
        super().__init__(data)
        fields = self.CONSTANT_UNPACKER.unpack(data.get(Constant.CONSTANT_BYTES))
        self._constant_data = fields
        config = ProfilerConfig()
        self._time_ns = config.get_local_time(config.get_timestamp_from_syscnt(fields[MemoryEnum.TIME_NS.value]))
        self._device_index = -1  # set by the parser when the record's device is known otherwise

    def _const(self, index: MemoryEnum):
        return self._constant_data[index.value]

    @property
    def ptr(self) -> int:
        return self._const(MemoryEnum.PTR)

    @property
    def stream_ptr(self) -> int:
        return self._const(MemoryEnum.STREAM_PTR)

    @property
    def time_ns(self) -> int:
        return self._time_ns

    @property
    def alloc_size(self) -> float:
        return self._const(MemoryEnum.ALLOC_SIZE) / Constant.B_TO_KB

    @property
    def alloc_size_for_db(self) -> int:
        return self._const(MemoryEnum.ALLOC_SIZE)

    @property
    def total_allocated(self) -> float:
        return self._const(MemoryEnum.TOTAL_ALLOCATED) / Constant.B_TO_MB

    @property
    def total_allocated_for_db(self) -> int:
        return self._const(MemoryEnum.TOTAL_ALLOCATED)

    @property
    def total_reserved(self) -> float:
        return self._const(MemoryEnum.TOTAL_RESERVED) / Constant.B_TO_MB

    @property
    def total_reserved_for_db(self) -> int:
        return self._const(MemoryEnum.TOTAL_RESERVED)

    @property
    def total_active(self) -> float:
        return self._const(MemoryEnum.TOTAL_ACTIVE) / Constant.B_TO_MB

    @property
    def total_active_for_db(self) -> int:
        return self._const(MemoryEnum.TOTAL_ACTIVE)

    @property
    def device_type(self) -> int:
        return self._const(MemoryEnum.DEVICE_TYPE)

    @property
    def device_index(self) -> int:
        if self._device_index != -1:
            return self._device_index
        return int(self._const(MemoryEnum.DEVICE_INDEX))

    @device_index.setter
    def device_index(self, value: int) -> None:
        self._device_index = value

    @property
    def component_type(self) -> int:
        return self._const(MemoryEnum.COMPONENT_TYPE)

    @property
    def data_type(self) -> int:
        return self._const(MemoryEnum.DATA_TYPE)

    @property
    def allocator_type(self) -> int:
        return self._const(MemoryEnum.ALLOCATOR_TYPE)

    @property
    def tid(self) -> int:
        return self._const(MemoryEnum.THREAD_ID)

    @property
    def pid(self) -> int:
        return self._const(MemoryEnum.PROCESS_ID)

    def is_npu(self) -> bool:
        return self.device_type == self.NPU_ID

    def is_inner_allocator(self) -> bool:
        return self.allocator_type == self.INNER_ALLOCATOR

    @property
    def device_tag(self) -> str:
        return f"NPU:{self.device_index}" if self.is_npu() else "CPU"

    @property
    def row(self) -> list:
        """A memory_record.csv row: component, timestamp (us text), totals (MB), stream, device."""
        return [Constant.PTA, convert_ns2us_str(self.time_ns, tail="\t"), self.total_allocated,
                self.total_reserved, self.total_active, self.stream_ptr, self.device_tag]
