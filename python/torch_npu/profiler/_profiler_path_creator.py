"""``ProfPathCreator``: where a profiling run's result directory goes, as in torch_npu.

One per process (``ProfPathCreator()`` is always the same object). ``tensorboard_trace_handler``
sets the folder and worker name; every finished run that keeps its raw data gets its own
directory ``{dir}/{worker_name or host}_{pid}_{time}_ascend_pt``, where ``{dir}`` is the handler's
``dir_name``, else ``$ASCEND_WORK_PATH/profiling_data``, else the working directory;
``get_prof_dir()`` names the last one.
"""
import os
import shutil
import socket
import warnings
from datetime import datetime, timezone
from typing import Optional

__all__ = []

MAX_WORKER_NAME_LENGTH = 226  # torch_npu's limit (the directory name must fit in 255 bytes)


def _warn(msg: str) -> None:
    warnings.warn(f"[torch_npu.profiler] {msg}", stacklevel=3)


def _valid_worker_name(worker_name) -> bool:
    return isinstance(worker_name, str) and 0 < len(worker_name) < MAX_WORKER_NAME_LENGTH


class ProfPathCreator:
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._reset()
        return cls._instance

    def _reset(self) -> None:
        self._prof_path = None
        self._worker_name = None
        self._dir_path = None
        self._export_only_mode = False
        self.is_prof_inited = False

    def init(self, worker_name: Optional[str] = None, dir_name: Optional[str] = None,
             export_only_mode: bool = False) -> None:
        """Folder and worker name of the next result directories (an invalid one is reset to
        the default with a warning). export_only_mode: the run keeps no raw data (a profile
        without ``on_trace_ready``)."""
        self._export_only_mode = bool(export_only_mode)
        if worker_name is None or _valid_worker_name(worker_name):
            self._worker_name = worker_name
        else:
            _warn("Invalid parameter worker_name, reset it to default.")
            self._worker_name = None
        if dir_name is None or (isinstance(dir_name, str) and dir_name):
            self._dir_path = os.path.realpath(dir_name) if dir_name else None
        else:
            _warn("Invalid parameter dir_name, reset it to default.")
            self._dir_path = None

    def create_prof_dir(self, dir_name: Optional[str] = None, worker_name: Optional[str] = None) -> str:
        """Creates the next result directory (``dir_name`` / ``worker_name`` override init's)
        and returns its path."""
        folder = os.path.realpath(dir_name) if dir_name else self._dir_path
        if not folder:
            work = os.getenv("ASCEND_WORK_PATH")
            folder = os.path.join(os.path.abspath(work), "profiling_data") if work else os.getcwd()
        worker = f"{worker_name or self._worker_name or socket.gethostname()}_{os.getpid()}"
        stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
        path = os.path.join(folder, f"{worker}_{stamp}_ascend_pt")
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(f"torch_npu.profiler: the result directory {path} is not writable")
        self._prof_path = path
        self.is_prof_inited = True
        return path

    def get_prof_dir(self) -> Optional[str]:
        return self._prof_path

    def delete_prof_dir(self) -> None:
        if self._prof_path and os.path.isdir(self._prof_path):
            try:
                shutil.rmtree(self._prof_path)
            except OSError:
                _warn("Remove temporary profiling data saving path failed.")
