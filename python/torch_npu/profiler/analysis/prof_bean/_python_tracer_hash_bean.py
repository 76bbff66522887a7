"""``PythonTracerHashBean``: one record of FRAMEWORK/torch.python_tracer_hash: the hash key
(uint64) and, in TLV field 1, the function it stands for (``file(line): name``)."""
import struct
from enum import Enum

from ..prof_common_func._constant import Constant

__all__ = []


class PythonTracerHashEnum(Enum):
    KEY = 0


class PythonTracerHashBean:
    CONSTANT_STRUCT = "<Q"
    TLV_TYPE_DICT = {Constant.VALUE: 1}

    def __init__(self, data: dict):
        self._origin_data = data
        self._constant_data = struct.unpack(self.CONSTANT_STRUCT, data.get(Constant.CONSTANT_BYTES))
        self._key = int(self._constant_data[PythonTracerHashEnum.KEY.value])
        self._value = data.get(self.TLV_TYPE_DICT[Constant.VALUE], "")

    @property
    def key(self) -> int:
        return self._key

    @property
    def value(self) -> str:
        return self._value
