"""``ApiStatisticBean``: a row of msprof's api_statistic CSV."""
from ._common_bean import _RowBean

__all__ = []


class ApiStatisticBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
