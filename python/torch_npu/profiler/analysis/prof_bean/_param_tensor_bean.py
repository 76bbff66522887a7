"""``ParamTensorBean``: one record of FRAMEWORK/torch.param_tensor_info: a module's or an
optimizer's key (uint64) and, in TLV field 1 (module) or 2 (optimizer), its parameters, one
``}``-separated item per parameter."""
import struct
from dataclasses import dataclass
from typing import List, Optional

from ..prof_common_func._constant import Constant

__all__ = []


@dataclass
class KeyAndParam:
    key: int
    module_params: Optional[List[str]]
    optimizer_params: Optional[List[str]]


class ParamTensorBean:
    TLV_TYPE_DICT = {
        Constant.MODULE_PARAM: 1,
        Constant.OPTIMIZER_PARAM: 2,
    }
    CONSTANT_STRUCT = "<Q"

    def __init__(self, data: dict):
        self._origin_data = data
        self._constant_data = struct.unpack(self.CONSTANT_STRUCT, data.get(Constant.CONSTANT_BYTES))
        self._key = self._constant_data[0]
        self._module_params = self._split(Constant.MODULE_PARAM)
        self._optimizer_params = self._split(Constant.OPTIMIZER_PARAM)

    def _split(self, name: str):
        text = self._origin_data.get(self.TLV_TYPE_DICT[name])
        return None if text is None else text.split("}")

    @property
    def key(self) -> int:
        return self._key

    @property
    def params(self) -> KeyAndParam:
        return KeyAndParam(self._key, self._module_params, self._optimizer_params)
