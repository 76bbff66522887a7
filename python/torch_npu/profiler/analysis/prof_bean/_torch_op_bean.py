"""``TorchOpBean``: one record of FRAMEWORK/torch.op_range (an operator's host range).

Body (little-endian, as the C++ reporter's OpRangeData writes it): ``start_ns, end_ns,
sequence_number`` (int64), ``process_id, start_thread_id, end_thread_id, forward_thread_id``
(uint64), ``scope`` (uint8), ``is_async`` (bool) -- ``CONSTANT_STRUCT`` -- then TLV text fields:
2 name, 3 input dtypes, 4 input shapes (``"2,3;4"``), 5 input tensors, 6 input tensor lists,
7 input scalars, 8 call stack (frames joined by ``;``), 9 module hierarchy, 10 extra args (flops).
Times are system-counter values, made local ns through ``ProfilerConfig``.
"""
import struct
from enum import Enum

from .._profiler_config import ProfilerConfig
from ..prof_common_func._constant import Constant

__all__ = []


class TorchOpEnum(Enum):
    START_NS = 0
    END_NS = 1
    SEQUENCE_NUMBER = 2
    PROCESS_ID = 3
    START_THREAD_ID = 4
    END_THREAD_ID = 5
    FORWARD_THREAD_ID = 6
    SCOPE = 7
    IS_ASYNC = 8


def _frames(text: str) -> str:
    # the ';'-joined lists are shown one item a line
    return text.replace(";", ";\r\n") if text else ""


class TorchOpBean:
    TLV_TYPE_DICT = {
        Constant.OP_NAME: 2,
        Constant.INPUT_DTYPES: 3,
        Constant.INPUT_SHAPES: 4,
        Constant.INPUT_TENSORS: 5,
        Constant.INPUT_TENSORLISTS: 6,
        Constant.INPUT_SCALARS: 7,
        Constant.CALL_STACK: 8,
        Constant.MODULE_HIERARCHY: 9,
        Constant.FLOPS: 10,
    }
    CONSTANT_STRUCT = "<3q4QB?"
    CONSTANT_UNPACKER = struct.Struct(CONSTANT_STRUCT)
    REPLACE_FIELDS = {Constant.INPUT_SHAPES, Constant.INPUT_DTYPES, Constant.CALL_STACK}
    SKIP_FIELDS = {Constant.OP_NAME, Constant.INPUT_TENSORS, Constant.INPUT_TENSORLISTS, Constant.INPUT_SCALARS}

    def __init__(self, data: dict):
        self._origin_data = data
        self._constant_data = self.CONSTANT_UNPACKER.unpack(data.get(Constant.CONSTANT_BYTES))
        self._kernel_list = []
        self._start_ns = None
        self._end_ns = None
        self._args = None
        self._inputs = None

    def _field(self, name: str, default=None):
        return self._origin_data.get(self.TLV_TYPE_DICT[name], default)

    def _const(self, index: TorchOpEnum):
        return self._constant_data[index.value]

    @property
    def pid(self) -> int:
        return self._const(TorchOpEnum.PROCESS_ID)

    @property
    def tid(self) -> int:
        return self._const(TorchOpEnum.START_THREAD_ID)

    @property
    def name(self) -> str:
        return str(self._field(Constant.OP_NAME, ""))

    @property
    def ts(self) -> int:
        if self._start_ns is None:
            self._init_timestamps()
        return self._start_ns

    @property
    def end_ns(self) -> int:
        if self._end_ns is None:
            self._init_timestamps()
        return self._end_ns

    @property
    def dur(self) -> int:
        return self.end_ns - self.ts

    @property
    def call_stack(self) -> str:
        return _frames(self._field(Constant.CALL_STACK, ""))

    @property
    def inputs(self) -> dict:
        if self._inputs is None:
            self._inputs = {name: self._field(name) for name in
                            (Constant.INPUT_TENSORS, Constant.INPUT_TENSORLISTS, Constant.INPUT_SCALARS)}
        return self._inputs

    @property
    def scope(self) -> int:
        return self._const(TorchOpEnum.SCOPE)

    @property
    def is_async(self) -> bool:
        return self._const(TorchOpEnum.IS_ASYNC)

    @property
    def args(self) -> dict:
        if self._args is None:
            self._args = self.get_args()
        return self._args

    @property
    def is_torch_op(self) -> bool:
        return True

    def _init_timestamps(self):
        config = ProfilerConfig()
        self._start_ns = config.get_local_time(
            config.get_timestamp_from_syscnt(self._const(TorchOpEnum.START_NS)))
        self._end_ns = config.get_local_time(
            config.get_timestamp_from_syscnt(self._const(TorchOpEnum.END_NS)))

    def get_args(self) -> dict:
        """Sequence number, forward thread id and the text fields shown as the op's args."""
        args = {Constant.SEQUENCE_NUMBER: self._const(TorchOpEnum.SEQUENCE_NUMBER),
                Constant.FORWARD_THREAD_ID: self._const(TorchOpEnum.FORWARD_THREAD_ID)}
        for name, tag in self.TLV_TYPE_DICT.items():
            if name in self.SKIP_FIELDS or tag not in self._origin_data:
                continue
            value = self._origin_data[tag]
            args[name] = _frames(value) if name in self.REPLACE_FIELDS else value
        return args
