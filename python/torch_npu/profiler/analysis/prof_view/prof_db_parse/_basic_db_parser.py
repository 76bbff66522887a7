"""``BasicDbParser``: the base of the db export (``TorchDb``, ascend_pytorch_profiler*.db), as
torch_npu's: msprof's database of the run (``msprof_<n>.db`` in the ``PROF_*`` folder or its
mindstudio_profiler_output/), moved into place when there is one, then the tables
RANK_DEVICE_MAP (the run's rank with each device), HOST_INFO, and META_DATA (the environment
variables torch_npu records, profiler_metadata.json's entries)."""
import json
import os
import re
import shutil

from ..._profiler_config import ProfilerConfig
from ...prof_common_func._constant import Constant, DbConstant, TableColumnsManager
from ...prof_common_func._db_manager import TorchDb
from ...prof_common_func._file_manager import FileManager
from ...prof_common_func._host_info import get_host_info
from ...prof_common_func._log import ProfilerLogger
from ...prof_common_func._path_manager import ProfilerPathManager
from ...prof_common_func._utils import collect_env_vars
from .._base_parser import BaseParser

__all__ = []

_CANN_DB = r"^msprof_\d+\.db$"


def _create_table(table: str) -> None:
    TorchDb().create_table_with_headers(table, TableColumnsManager.TableColumns.get(table))


class BasicDbParser(BaseParser):
    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._cann_path = ProfilerPathManager.get_cann_path(self._profiler_path)
        ProfilerLogger.init(self._profiler_path, "BasicDbParser")
        self.logger = ProfilerLogger.get_instance()

    def run(self, deps_data: dict):
        def work():
            cann_db_path = self.get_cann_db_path()
            if cann_db_path:
                shutil.move(cann_db_path, TorchDb().get_db_path())
            self.create_ascend_db()
            self.save_rank_info_to_db()
            self.save_host_info_to_db()
            self.save_env_vars_info_to_db()
            self.save_profiler_metadata_to_db()
            return ""

        return self._run_logged(work, "Failed to generate basic db file", fail_output="")

    def _valid_db_in(self, folder: str) -> str:
        for file_name in os.listdir(folder):
            file_path = os.path.join(folder, file_name)
            if not re.match(_CANN_DB, file_name):
                continue
            try:
                FileManager.check_db_file_vaild(file_path)
            except RuntimeError:
                self.logger.warning("Invalid CANN db file. File name: %s", file_name)
                continue
            return file_path
        return ""

    def get_cann_db_path(self) -> str:
        """msprof's database of the run: in the PROF_* folder, else in its
        mindstudio_profiler_output/ (where CANN versions that export db by default put it)."""
        if not self._cann_path:
            return ""
        found = self._valid_db_in(self._cann_path)
        if found:
            return found
        output_path = os.path.join(self._cann_path, Constant.MINDSTUDIO_PROFILER_OUTPUT)
        return self._valid_db_in(output_path) if os.path.exists(output_path) else ""

    def create_ascend_db(self) -> None:
        if not TorchDb().create_connect_db():
            raise RuntimeError(f"Failed to connect to db file: {TorchDb().get_db_path()}")

    def save_rank_info_to_db(self) -> None:
        _create_table(DbConstant.TABLE_RANK_DEVICE_MAP)
        TorchDb().clear_table_data(DbConstant.TABLE_RANK_DEVICE_MAP)  # msprof's rows are replaced
        rank_id = ProfilerConfig().rank_id
        device_ids = ProfilerPathManager.get_device_id(self._cann_path) or [Constant.INVALID_VALUE]
        TorchDb().insert_data_into_table(DbConstant.TABLE_RANK_DEVICE_MAP,
                                         [[rank_id, device_id] for device_id in device_ids])

    def save_host_info_to_db(self) -> None:
        if TorchDb().judge_table_exist(DbConstant.TABLE_HOST_INFO):
            return
        host_info = get_host_info()
        _create_table(DbConstant.TABLE_HOST_INFO)
        TorchDb().insert_data_into_table(DbConstant.TABLE_HOST_INFO,
                                         [[host_info.get("host_uid"), host_info.get("host_name")]])

    def save_env_vars_info_to_db(self) -> None:
        _create_table(DbConstant.TABLE_META_DATA)
        TorchDb().insert_data_into_table(DbConstant.TABLE_META_DATA, [
            ["ENV_VARIABLES", json.dumps(collect_env_vars().get("ENV_VARIABLES"))]])

    def save_profiler_metadata_to_db(self) -> None:
        metadata_path = os.path.join(self._profiler_path, Constant.PROFILER_META_DATA)
        if not os.path.exists(metadata_path):
            self.logger.warning("Cannot find profiler_metadata.json. Path: %s", metadata_path)
            return
        try:
            metadata = json.loads(FileManager.file_read_all(metadata_path))
        except json.JSONDecodeError:
            self.logger.warning("Failed to parse profiler_metadata.json.")
            return
        _create_table(DbConstant.TABLE_META_DATA)
        TorchDb().insert_data_into_table(DbConstant.TABLE_META_DATA,
                                         [[str(key), json.dumps(value)] for key, value in metadata.items()])
