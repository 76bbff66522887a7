"""``L2CacheBean``: a row of msprof's l2_cache CSV."""
from ._common_bean import _RowBean

__all__ = []


class L2CacheBean(_RowBean):
    HEADERS = ["Stream Id", "Task Id", "Hit Rate", "Victim Rate", "Op Name"]

    def __init__(self, data: dict):
        super().__init__(data)
