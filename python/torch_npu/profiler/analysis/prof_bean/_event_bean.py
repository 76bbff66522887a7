"""``EventBean``: one event of a Chrome-trace JSON (msprof's msprof_*.json): ``ts`` in us
(text such as ``"168.320\\t"`` or a number) read as integer ns, ``dur`` in us as given."""
from typing import Union

from ..prof_common_func._constant import Constant, convert_us2ns

__all__ = []


class EventBean:
    def __init__(self, data: dict):
        self._origin_data = data
        self.device_id = -1

    @property
    def ts(self) -> int:
        return convert_us2ns(self._origin_data.get("ts", 0))

    @property
    def pid(self) -> str:
        return self._origin_data.get("pid", "")

    @property
    def tid(self) -> int:
        return self._origin_data.get("tid", 0)

    @property
    def dur(self) -> Union[float, str]:
        return self._origin_data.get("dur", 0)

    @property
    def end_ns(self) -> int:
        """Start plus duration, in ns (the duration's sub-ns part is dropped)."""
        return int(self.ts + int(self._origin_data.get("dur", 0) * 1000))

    @property
    def name(self) -> str:
        return self._origin_data.get("name", "")

    @property
    def id(self):
        return self._origin_data.get("id")

    @property
    def unique_id(self) -> str:
        return f"{self.pid}-{self.tid}-{self.ts}"

    @property
    def is_ai_core(self) -> bool:
        args = self._origin_data.get("args")
        return bool(args) and args.get("Task Type") == Constant.AI_CORE
