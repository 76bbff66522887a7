"""``CANNAnalyzeParser``: ``msprof --analyze=on`` on the run's ``PROF_*`` folder (the
communication analysis, ``analyze/``), as torch_npu's: with ``--type=db`` for the db export,
without for text. A run without msprof data succeeds with nothing to do; without the
``msprof`` tool the parse fails; a failed analysis is a warning."""
import os
import shutil
import subprocess

from ..._profiler_config import ProfilerConfig
from ...prof_common_func._constant import Constant, print_error_msg, print_warn_msg
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
        def work():
            ProfilerConfig().load_info(self._profiler_path)
            if not os.path.isdir(self._cann_path):
                return
            if not self.msprof_path:
                print_error_msg("Export CANN Profiling data faile! msprof command not found!")
                raise RuntimeError("Export CANN Profiling data faile! msprof command not found!")
            if Constant.Db in self._export_type:
                self._analyze(["--type=db"], "DB")
            if Constant.Text in self._export_type:
                self._analyze([], "TEXT")

        return self._run_logged(work, "Failed to analyze CANN Profiling data",
                                on_error=lambda err: print_error_msg("Failed to analyze CANN Profiling data."))
