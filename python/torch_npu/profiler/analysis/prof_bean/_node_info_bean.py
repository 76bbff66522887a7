"""``NodeInfoBean``: the device kernels of one host op (objects with ``ts`` in ns, ``dur`` in
us and ``is_ai_core``): their summed duration (us; all, and AI Core only), first start and last
end (ns)."""
from typing import List

from ..prof_common_func._constant import convert_us2ns

__all__ = []


class NodeInfoBean:
    def __init__(self, kernel_list: list):
        if not kernel_list:
            raise ValueError("NodeInfoBean: kernel_list must hold at least one kernel")
        self._kernel_list = kernel_list
        self._device_dur = sum(float(k.dur) for k in kernel_list)
        self._device_dur_with_ai_core = sum(float(k.dur) for k in kernel_list if k.is_ai_core)
        self._min_start = min(k.ts for k in kernel_list)
        self._max_end = max(k.ts + convert_us2ns(k.dur) for k in kernel_list)

    @property
    def kernel_list(self) -> List:
        return self._kernel_list

    @property
    def device_dur(self) -> float:
        return self._device_dur

    @property
    def device_dur_with_ai_core(self) -> float:
        return self._device_dur_with_ai_core

    @property
    def min_start(self) -> int:
        return self._min_start

    @property
    def max_end(self) -> int:
        return self._max_end
