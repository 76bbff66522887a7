"""``OpSummaryBean``: a row of msprof's op_summary CSV. ``OpSummaryBean.headers`` (class
attribute) selects and orders the columns of ``row``; empty: all columns as read."""
from ..prof_common_func._csv_headers import CsvHeaders
from ._common_bean import CommonBean

__all__ = []


class OpSummaryBean(CommonBean):
    headers = []

    def __init__(self, data: dict):
        super().__init__(data)

    @property
    def row(self) -> list:
        names = OpSummaryBean.headers or self._data.keys()
        return [self._data.get(name, "") for name in names]

    @property
    def ts(self) -> str:
        """Task start time, us text."""
        return self._data.get(CsvHeaders.TASK_START_TIME, "0")

    @property
    def all_headers(self) -> list:
        return list(self._data.keys())
