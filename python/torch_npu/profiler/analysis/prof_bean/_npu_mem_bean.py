"""``NpuMemoryBean``: a row of msprof's npu_mem CSV; only ``APP`` rows (the process's device
memory) are shown, with memory in MB."""
from ..prof_common_func._constant import Constant

__all__ = []


class NpuMemoryBean:
    SHOW_HEADERS = ["event", "timestamp(us)", "allocated(KB)", "memory(KB)", "active", "stream_ptr", "Device_id"]

    def __init__(self, data: dict):
        self._data = data

    @property
    def row(self) -> list:
        if self._data.get("event") != Constant.APP:
            return []
        return [float(self._data.get(name, 0)) / Constant.KB_TO_MB if name == "memory(KB)"
                else self._data.get(name, "") for name in self.SHOW_HEADERS]
