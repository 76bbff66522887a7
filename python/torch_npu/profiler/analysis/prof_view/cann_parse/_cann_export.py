"""``CANNExportParser`` and ``CANNTimelineParser``, as torch_npu's.

``CANNExportParser``: ``msprof --export=on`` on the run's ``PROF_*`` folder, which writes
msprof's summary CSV and timeline JSON into ``mindstudio_profiler_output/`` (text) or its
``msprof_*.db`` (``--type=db``). Before that it checks the tool: ``msprof`` on PATH (else the
parse fails), owned by root or this user, with its ``msprof.py`` next to it (a warning
otherwise), and warns when the raw data is large (the export takes long). A run without
msprof data succeeds with nothing to do.

``CANNTimelineParser``: waits until the export has written its first CSV (text) or database
(db), for the parsers that read them; the task manager does not wait for it.
"""
import os
import pwd
import re
import shutil
import subprocess
import time
from datetime import datetime, timezone

from ..._profiler_config import ProfilerConfig
from ...prof_common_func._constant import Constant, print_error_msg, print_info_msg, print_warn_msg
from ...prof_common_func._file_manager import FileManager
from ...prof_common_func._log import ProfilerLogger
from ...prof_common_func._path_manager import ProfilerPathManager
from .._base_parser import BaseParser

__all__ = []


def _size_of(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, files in ProfilerPathManager.walk_with_depth(folder) for name in files)


class CANNExportParser(BaseParser):
    COMMAND_SUCCESS = 0
    error_msg = ("Export CANN Profiling data failed, please verify that the ascend-toolkit is installed and "
                 "set_env.sh is sourced. or you can execute the command to confirm the CANN Profiling "
                 "export result: msprof --export=on")
    _MSPROF_PY_PATH = "tools/profiler/profiler_tool/analysis/msprof/msprof.py"

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._cann_path = ProfilerPathManager.get_cann_path(self._profiler_path)
        self.msprof_path = shutil.which("msprof")

    def _export(self, type_args: list, kind: str) -> None:
        command = [self.msprof_path, "--export=on", *type_args, f"--output={self._cann_path}"]
        if subprocess.run(command, capture_output=True, shell=False).returncode != self.COMMAND_SUCCESS:
            raise RuntimeError(f"Failed to export CANN {kind} Profiling data.")

    def run(self, deps_data: dict):
        def work():
            ProfilerConfig().load_info(self._profiler_path)
            if not os.path.isdir(self._cann_path):
                return
            self._check_msprof_environment()
            self._check_prof_data_size()
            start_time = datetime.now(tz=timezone.utc).astimezone()
            if Constant.Db in self._export_type:
                self._export(["--type=db"], "DB")
            if Constant.Text in self._export_type:
                self._export([], "TEXT")  # no --type: older msprof versions do not know it
            print_info_msg(f"CANN profiling data parsed in a total time of "
                           f"{datetime.now(tz=timezone.utc).astimezone() - start_time}")

        return self._run_logged(work, "Failed to export CANN Profiling data", on_error=lambda err: print_error_msg(
            f"Failed to export CANN Profiling data. Error msg: {err}"))

    def _check_msprof_environment(self) -> None:
        self._check_msprof_profile_path_is_valid()
        self._check_msprof_path()

    def _check_msprof_profile_path_is_valid(self) -> None:
        self._check_profiler_path_parent_dir_invalid(ProfilerPathManager.get_all_subdir(self._cann_path))

    def _check_profiler_path_parent_dir_invalid(self, paths: list) -> bool:
        if any(not FileManager.check_file_owner(path) for path in paths):
            self.logger.warning("The owner of path '%s' is neither root nor the current user. "
                                "Please run: chown -R $(id -un) '%s'.", self._cann_path, self._cann_path)
        return False

    def _owner_hint(self, path: str, levels_up: str) -> str:
        return (f"The '{path}' path and current owner have inconsistent permissions."
                f"please execute 'chown -R {pwd.getpwuid(os.getuid()).pw_name} "
                f"{os.path.normpath(os.path.join(path, levels_up))}'\n")

    def _check_msprof_path(self) -> None:
        if not self.msprof_path:
            raise RuntimeError("Export CANN Profiling data failed! 'msprof' command not found!"
                               "Please re-source the CANN package to fix this error.\n")
        problems = ""
        if not ProfilerPathManager.check_path_permission(self.msprof_path):
            problems += self._owner_hint(self.msprof_path, "../../..")
        script_path = self._get_msprof_script_path(self._MSPROF_PY_PATH)
        if not script_path:
            raise RuntimeError(problems + f"Failed to find msprof.py path in {self.msprof_path}. "
                                          "Please check the CANN environment.\n")
        if not ProfilerPathManager.check_path_permission(script_path):
            problems += self._owner_hint(script_path, "../../../../../../..")  # the ascend-toolkit folder
        if problems:
            self.logger.warning(problems)

    def _get_msprof_script_path(self, script_path: str) -> str:
        """``<toolkit>/tools/profiler/.../msprof.py`` of the toolkit ``msprof`` belongs to, else ``""``."""
        toolkit = os.path.realpath(self.msprof_path.strip()).split("tools")[0]
        full_path = os.path.join(toolkit, script_path)
        return full_path if os.path.exists(full_path) else ""

    def _check_prof_data_size(self) -> None:
        if not self._cann_path:
            return
        device_paths = ProfilerPathManager.get_device_path(self._cann_path)
        data_size = _size_of(os.path.join(self._cann_path, "host", "data"))
        for device_path in device_paths:
            data_size += _size_of(os.path.join(device_path, "data"))
            if data_size >= Constant.PROF_WARN_SIZE:
                break
        if data_size >= Constant.PROF_WARN_SIZE:
            print_warn_msg("The parsing time is expected to exceed 30 minutes, "
                           "and you can choose to stop the process and use offline parsing.")


class CANNTimelineParser(BaseParser):
    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._cann_path = ProfilerPathManager.get_cann_path(self._profiler_path)

    def _exported(self) -> bool:
        if Constant.Text in self._export_type:
            output_path = os.path.join(self._cann_path, Constant.MINDSTUDIO_PROFILER_OUTPUT)
            return os.path.exists(output_path) and any(name.endswith(".csv") for name in os.listdir(output_path))
        return any(re.match(r"^msprof_\d+\.db$", name) and os.path.isfile(os.path.join(self._cann_path, name))
                   for name in os.listdir(self._cann_path))

    def run(self, deps_data: dict):
        ProfilerLogger.init(self._profiler_path, "CANNTimelineParser")
        self.logger = ProfilerLogger.get_instance()
        self.logger.info("CANNTimelineParser start.")
        if not os.path.isdir(self._cann_path):
            return Constant.SUCCESS, None
        ProfilerConfig().load_info(self._profiler_path)
        while not self._exported():
            try:
                time.sleep(Constant.SLEEP_TIME)
            except InterruptedError:  # the task manager stopped it
                return Constant.FAIL, None
        self.logger.info("CANNTimelineParser finish.")
        return Constant.SUCCESS, None
