"""Id tables of the ``export_type="db"`` export, as torch_npu's (singletons, so every parser of a
run shares them):

* ``Str2IdManager``: each distinct string gets the next id (from ``set_start_id``), the empty
  string ``DbConstant.DB_INVALID_VALUE``; ``get_all_string_2_id_data()`` hands over the
  ``[id, string]`` rows of the STRING_IDS table and empties the table;
* ``ConnectionIdManager``: an id per list of connection ids (``[DB_INVALID_CONNECTION_ID]`` for
  an unknown id);
* ``CallChainIdManager``: an id per call stack (frames joined by ``";\\r\\n"``), stored as
  ``[string id of the frame, depth]`` rows.
"""
from ._constant import DbConstant
from ._singleton import Singleton

__all__ = []


@Singleton
class Str2IdManager:
    def __init__(self) -> None:
        self._str_id_map = {}
        self._curr_id = 0

    def set_start_id(self, start_id: int):
        self._curr_id = start_id

    def get_id_from_str(self, string: str) -> int:
        if not string:
            return DbConstant.DB_INVALID_VALUE
        found = self._str_id_map.get(string)
        if found is not None:
            return found
        self._str_id_map[string] = new_id = self._curr_id
        self._curr_id += 1
        return new_id

    def get_all_string_2_id_data(self) -> list:
        rows = [[string_id, string] for string, string_id in self._str_id_map.items()]
        self._str_id_map.clear()
        return rows


@Singleton
class ConnectionIdManager:
    def __init__(self) -> None:
        self._connecion_id_map = {}
        self._curr_id = 0

    def get_id_from_connection_ids(self, connection_ids: list) -> int:
        new_id = self._curr_id
        self._connecion_id_map[new_id] = connection_ids
        self._curr_id += 1
        return new_id

    def get_all_connection_ids(self) -> dict:
        return self._connecion_id_map

    def get_connection_ids_from_id(self, source_id: int) -> list:
        return self._connecion_id_map.get(source_id, [DbConstant.DB_INVALID_CONNECTION_ID])


@Singleton
class CallChainIdManager:
    def __init__(self) -> None:
        self._callchain_id_map = {}
        self._curr_id = 0

    def get_callchain_id_from_callstack(self, callstack: str) -> int:
        new_id = self._curr_id
        strings = Str2IdManager()
        self._callchain_id_map[new_id] = [[strings.get_id_from_str(frame), depth]
                                          for depth, frame in enumerate(callstack.split(";\r\n"))]
        self._curr_id += 1
        return new_id

    def get_all_callchain_id(self) -> dict:
        return self._callchain_id_map
