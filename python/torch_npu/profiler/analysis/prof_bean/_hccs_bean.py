"""``HccsBean``: a row of msprof's hccs CSV (HCCS link bandwidth)."""
from ._common_bean import _RowBean

__all__ = []


class HccsBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
