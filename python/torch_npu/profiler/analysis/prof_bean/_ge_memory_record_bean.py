"""``GeMemoryRecordBean``: a row of msprof's memory_record CSV of the GE component (KB),
written into torch_npu's memory_record.csv (MB) as a ``GE`` row."""
from ..prof_common_func._constant import Constant, convert_ns2us_str, convert_us2ns
from ._common_bean import CommonBean

__all__ = []


class GeMemoryRecordBean(CommonBean):
    def __init__(self, data: dict):
        super().__init__(data)

    @property
    def row(self) -> list:
        return [Constant.GE, convert_ns2us_str(self.time_ns, "\t"), self.total_allocated,
                self.total_reserved, None, None, self.device_tag]

    @property
    def component(self) -> str:
        return self._data.get("Component")

    @property
    def time_ns(self) -> int:
        return convert_us2ns(self._data.get("Timestamp(us)"))

    @property
    def total_allocated(self) -> float:
        return float(self._data.get("Total Allocated(KB)", 0)) / Constant.KB_TO_MB

    @property
    def total_reserved(self) -> float:
        return float(self._data.get("Total Reserved(KB)", 0)) / Constant.KB_TO_MB

    @property
    def total_active(self) -> float:
        return 0

    @property
    def stream_ptr(self):
        return None

    @property
    def device_tag(self) -> str:
        return self._data.get("Device", "")
