"""``TaskTimeBean``: a row of msprof's task_time CSV."""
from ._common_bean import _RowBean

__all__ = []


class TaskTimeBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
