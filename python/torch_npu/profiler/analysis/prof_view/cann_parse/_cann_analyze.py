"""``CANNAnalyzeParser``: ``msprof --analyze=on`` on the run's ``PROF_*`` folder (the
communication analysis, ``analyze/``), as torch_npu's: with ``--type=db`` for the db export,
without for text. A run without msprof data succeeds with nothing to do; without the
``msprof`` tool the parse fails; a failed analysis is a warning."""
import os
import shutil
import subprocess

from ..._profiler_config import ProfilerConfig
from ...prof_common_func._constant import Constant, print_error_msg, print_warn_msg
from ...prof_common_func._log import ProfilerLogger
from ...prof_common_func._path_manager import ProfilerPathManager
from .._base_parser import BaseParser

__all__ = []


class CANNAnalyzeParser(BaseParser):
    COMMAND_SUCCESS = 0

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._cann_path = ProfilerPathManager.get_cann_path(self._profiler_path)
        self.msprof_path = shutil.which("msprof")

    def _analyze(self, type_args: list, kind: str) -> None:
        command = [self.msprof_path, "--analyze=on", *type_args, f"--output={self._cann_path}"]
        if subprocess.run(command, capture_output=True, shell=False).returncode != self.COMMAND_SUCCESS:
            print_warn_msg(f"Failed to analyze CANN {kind} Profiling data.")

    def run(self, deps_data: dict):
        ProfilerLogger.init(self._profiler_path, "CANNAnalyzeParser")
        self.logger = ProfilerLogger.get_instance()
        self.logger.info("CANNAnalyzeParser start.")
        try:
            ProfilerConfig().load_info(self._profiler_path)
            if not os.path.isdir(self._cann_path):
                return Constant.SUCCESS, None
            if not self.msprof_path:
                err_msg = "Export CANN Profiling data faile! msprof command not found!"
                print_error_msg(err_msg)
                raise RuntimeError(err_msg)
            if Constant.Db in self._export_type:
                self._analyze(["--type=db"], "DB")
            if Constant.Text in self._export_type:
                self._analyze([], "TEXT")
        except Exception as err:
            print_error_msg("Failed to analyze CANN Profiling data.")
            self.logger.error("Failed to analyze CANN Profiling data, error: %s", str(err), exc_info=True)
            return Constant.FAIL, None
        self.logger.info("CANNAnalyzeParser finish.")
        return Constant.SUCCESS, None
