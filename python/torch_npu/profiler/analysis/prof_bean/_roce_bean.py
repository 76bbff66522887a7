"""``RoCEBean``: a row of msprof's roce CSV."""
from ._common_bean import _RowBean

__all__ = []


class RoCEBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
