"""``GeOpMemoryBean``: a row of msprof's operator_memory CSV (a GE allocation), written into
torch_npu's operator_memory.csv as ``cann::<name>`` (sizes in KB there, totals in MB)."""
from typing import Optional, Union

from ..prof_common_func._constant import Constant, convert_ns2us_str, convert_us2ns
from ._common_bean import CommonBean

__all__ = []


def _kb_to_mb(value):
    return float(value) / Constant.KB_TO_MB if value else None


class GeOpMemoryBean(CommonBean):
    def __init__(self, data: dict):
        super().__init__(data)

    @property
    def row(self) -> list:
        return [self.name, self.size, self.allocation_time, self.release_time, None,
                self.dur, None, self.allocation_total_allocated, self.allocation_total_reserved, None,
                self.release_total_allocated, self.release_total_reserved, None, None, self.device]

    @property
    def name(self) -> str:
        return "cann::" + self._data.get("Name")

    @property
    def size(self):
        return self._data.get("Size(KB)")

    @property
    def allocation_time(self) -> Union[float, str]:
        return self._data.get("Allocation Time(us)")

    @property
    def dur(self) -> Union[float, str]:
        return self._data.get("Duration(us)")

    @property
    def release_time(self) -> Optional[str]:
        """Allocation time plus duration, as us text (None without both)."""
        if not (self.allocation_time and self.dur):
            return None
        return convert_ns2us_str(convert_us2ns(self.allocation_time) + convert_us2ns(self.dur), "\t")

    @property
    def allocation_total_allocated(self):
        return _kb_to_mb(self._data.get("Allocation Total Allocated(KB)"))

    @property
    def allocation_total_reserved(self):
        return _kb_to_mb(self._data.get("Allocation Total Reserved(KB)"))

    @property
    def release_total_allocated(self):
        return _kb_to_mb(self._data.get("Release Total Allocated(KB)"))

    @property
    def release_total_reserved(self):
        return _kb_to_mb(self._data.get("Release Total Reserved(KB)"))

    @property
    def device(self):
        return self._data.get("Device")
