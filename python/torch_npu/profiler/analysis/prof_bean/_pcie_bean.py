"""``PcieBean``: a row of msprof's pcie CSV."""
from ._common_bean import _RowBean

__all__ = []


class PcieBean(_RowBean):
    def __init__(self, data: dict):
        super().__init__(data)
