"""``NicBean``: a row of msprof's nic CSV."""
from ._common_bean import _RowBean

__all__ = []


class NicBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
