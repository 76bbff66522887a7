"""``OpStatisticBean``: a row of msprof's op_statistic CSV."""
from ._common_bean import _RowBean

__all__ = []


class OpStatisticBean(_RowBean):
    HEADERS = ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
               "Max Time(us)", "Ratio(%)"]

    def __init__(self, data: dict):
        super().__init__(data)
