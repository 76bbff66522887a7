"""``NpuModuleMemoryBean``: a row of msprof's npu_module_mem CSV (device memory per CANN
component), with ``Total Reserved(MB)`` added from ``Total Reserved(KB)``."""
from ..prof_common_func._constant import Constant
from ._common_bean import CommonBean

__all__ = []


class NpuModuleMemoryBean(CommonBean):
    SHOW_HEADERS = ["Device_id", "Component", "Timestamp(us)", "Total Reserved(MB)", "Device"]

    def __init__(self, data: dict):
        super().__init__(data)
        self._data["Total Reserved(MB)"] = str(float(data.get("Total Reserved(KB)", 0)) / Constant.KB_TO_MB)

    @property
    def row(self) -> list:
        return [self._data.get(name, "") for name in self.SHOW_HEADERS]

    @property
    def headers(self) -> list:
        return self.SHOW_HEADERS
