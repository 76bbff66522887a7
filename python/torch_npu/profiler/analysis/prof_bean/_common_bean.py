"""``CommonBean``: a record held as the dict of one row (column -> value)."""

__all__ = []


class CommonBean:
    def __init__(self, data: dict):
        self._data = data


class _RowBean(CommonBean):
    """A row written back as it was read: ``row`` its values, ``headers`` its columns."""

    @property
    def row(self) -> list:
        return list(self._data.values())

    @property
    def headers(self) -> list:
        return list(self._data.keys())
