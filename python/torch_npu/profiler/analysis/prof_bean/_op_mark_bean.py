"""``OpMarkBean``: one record of FRAMEWORK/torch.op_mark (task queue enqueue / dequeue marks).

Body (OpMarkData): ``time_ns`` (int64), ``category, correlation_id, thread_id, process_id``
(uint64) -- ``CONSTANT_STRUCT`` -- then TLV field 1: the op's name. Category 0/1 are the start
and end of an enqueue, 2/3 of a dequeue; dequeue marks are named ``Dequeue@<op>``, enqueue ones
``Enqueue``. ``ts`` and ``dur`` are set by the parser that pairs start and end marks.
"""
import struct
from enum import Enum

from .._profiler_config import ProfilerConfig
from ..prof_common_func._constant import Constant

__all__ = []


class OpMarkEnum(Enum):
    TIME_NS = 0
    CATEGORY = 1
    CORRELATION_ID = 2
    THREAD_ID = 3
    PROCESS_ID = 4


class _OpMarkCategoryEnum(Enum):
    ENQUEUE_START = 0
    ENQUEUE_END = 1
    DEQUEUE_START = 2
    DEQUEUE_END = 3


class OpMarkBean:
    TLV_TYPE_DICT = {Constant.NAME: 1}
    CONSTANT_STRUCT = "<q4Q"
    CONSTANT_UNPACKER = struct.Struct(CONSTANT_STRUCT)

    def __init__(self, data: dict):
        self._origin_data = data
        self._constant_data = self.CONSTANT_UNPACKER.unpack(data.get(Constant.CONSTANT_BYTES))
        category = self._constant_data[OpMarkEnum.CATEGORY.value]
        try:
            self._category = _OpMarkCategoryEnum(category)
        except ValueError:
            raise ValueError(f"OpMarkBean: category must be 0-3 (enqueue/dequeue start/end), got {category}") \
                from None
        self._time_ns = None
        self._ts = None
        self._dur = None

    @property
    def pid(self) -> int:
        return self._constant_data[OpMarkEnum.PROCESS_ID.value]

    @property
    def tid(self) -> int:
        return self._constant_data[OpMarkEnum.THREAD_ID.value]

    @property
    def time_ns(self) -> int:
        if self._time_ns is None:
            config = ProfilerConfig()
            self._time_ns = config.get_local_time(
                config.get_timestamp_from_syscnt(self._constant_data[OpMarkEnum.TIME_NS.value]))
        return self._time_ns

    @property
    def corr_id(self) -> int:
        return self._constant_data[OpMarkEnum.CORRELATION_ID.value]

    @property
    def origin_name(self) -> str:
        return self._origin_data.get(self.TLV_TYPE_DICT[Constant.NAME], "")

    @property
    def name(self) -> str:
        return "Dequeue@" + self.origin_name if self.is_dequeue else "Enqueue"

    @property
    def args(self) -> dict:
        return {"correlation_id": self.corr_id}

    @property
    def is_enqueue_start(self) -> bool:
        return self._category is _OpMarkCategoryEnum.ENQUEUE_START

    @property
    def is_enqueue_end(self) -> bool:
        return self._category is _OpMarkCategoryEnum.ENQUEUE_END

    @property
    def is_dequeue_start(self) -> bool:
        return self._category is _OpMarkCategoryEnum.DEQUEUE_START

    @property
    def is_dequeue_end(self) -> bool:
        return self._category is _OpMarkCategoryEnum.DEQUEUE_END

    @property
    def is_dequeue(self) -> bool:
        return self.is_dequeue_start or self.is_dequeue_end

    @property
    def is_enqueue(self) -> bool:
        return self.is_enqueue_start or self.is_enqueue_end

    @property
    def is_torch_op(self) -> bool:
        return False

    @property
    def ts(self) -> int:
        return self._ts

    @ts.setter
    def ts(self, ts: int):
        self._ts = ts

    @property
    def dur(self) -> int:
        return self._dur

    @dur.setter
    def dur(self, dur: int):
        self._dur = dur
