"""``SocPmuBean``: a row of msprof's soc_pmu CSV."""
from ._common_bean import _RowBean

__all__ = []


class SocPmuBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
