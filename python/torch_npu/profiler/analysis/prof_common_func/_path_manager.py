"""``ProfilerPathManager``: where the parts of a profiling result are, as torch_npu's.

A result directory (``*_ascend_pt``) holds ``FRAMEWORK/`` (the host side's records,
``get_fwk_path``), ``profiler_info[_{rank}].json`` (``get_info_file_path``) and, with NPU
activity, msprof's ``PROF_<n>_<time>_<id>/`` (``get_cann_path``). In that:
``host/`` (``get_host_path``; ``info.json``, ``host_start.log`` and ``start_info``, see
``get_info_path`` / ``get_host_start_log_path`` / ``get_start_info_path``), one
``device_<id>/`` per device (``get_device_path``, ``get_device_id``; a device's
``start_info.<id>`` when the host has none), ``mindstudio_profiler_output/`` (msprof's
exported CSV / JSON files, ``get_output_all_file_list_by_type``), ``analyze/``
(``get_analyze_all_file``) and msprof's databases (``get_database_all_file``). A finder
gives ``""`` or ``[]`` when the part is missing, also when the folder itself is.

``get_profiler_path_list(path)``: the result directories at or directly under ``path``.
``get_realpath`` (warns about a symbolic link), ``get_all_subdir(path, max_depth)``,
``walk_with_depth`` (``os.walk`` down to a depth), ``check_path_permission(path)`` (may
torch_npu run what is there: owned by root or this user, not writable by others).
"""
import os
import re
import stat
import warnings

from ._constant import Constant

__all__ = []

_CANN_DIR = re.compile(r"^PROF_\d+_\d+_[0-9a-zA-Z]+")
_DEVICE_DIR = re.compile(r"^device_\d")
_INFO_FILE = re.compile(r"^profiler_info_\d+\.json")


def _entries(path) -> list:
    """The names in folder ``path`` (its real path), [] when it is no folder."""
    if not isinstance(path, str) or not path or not os.path.isdir(path):
        return []
    return os.listdir(os.path.realpath(path))


def _first_dir(parent: str, pattern) -> str:
    """The first sub-folder of ``parent`` whose name matches ``pattern``, else ``""``."""
    for name in _entries(parent):
        path = os.path.join(parent, name)
        if pattern.match(name) and os.path.isdir(path):
            return path
    return ""


def _existing(path: str) -> str:
    return path if os.path.exists(path) else ""


class ProfilerPathManager:
    @classmethod
    def get_fwk_path(cls, profiler_path: str) -> str:
        """``{profiler_path}/FRAMEWORK`` if that folder exists, else ``""``."""
        if not isinstance(profiler_path, str):
            return ""
        fwk_path = os.path.join(profiler_path, Constant.FRAMEWORK_DIR)
        return fwk_path if os.path.isdir(fwk_path) else ""

    @classmethod
    def get_cann_path(cls, profiler_path: str) -> str:
        """The ``PROF_<digits>_<digits>_<id>`` folder of ``profiler_path`` (msprof's output), else ``""``."""
        return _first_dir(profiler_path, _CANN_DIR)

    @classmethod
    def get_info_file_path(cls, profiler_path: str) -> str:
        """``profiler_info.json`` or ``profiler_info_<rank>.json`` of the run, else ``""``."""
        for name in _entries(profiler_path):
            if name == "profiler_info.json" or _INFO_FILE.match(name):
                return os.path.join(profiler_path, name)
        return ""

    @classmethod
    def get_info_path(cls, profiler_path: str) -> str:
        """msprof's ``PROF_*/host/info.json``, else ``""``."""
        cann_path = cls.get_cann_path(profiler_path)
        return _existing(os.path.join(cann_path, "host", "info.json")) if cann_path else ""

    @classmethod
    def get_host_start_log_path(cls, profiler_path: str) -> str:
        """msprof's ``PROF_*/host/host_start.log``, else ``""``."""
        cann_path = cls.get_cann_path(profiler_path)
        return _existing(os.path.join(cann_path, "host", "host_start.log")) if cann_path else ""

    @classmethod
    def get_host_path(cls, cann_path: str) -> str:
        """``{cann_path}/host``, else ``""``."""
        return _existing(os.path.join(cann_path, "host")) if cann_path else ""

    @classmethod
    def get_device_path(cls, cann_path: str) -> list:
        """The ``device_<id>`` folders of a ``PROF_*`` folder."""
        return [os.path.join(cann_path, name) for name in _entries(cann_path)
                if _DEVICE_DIR.match(name) and os.path.isdir(os.path.join(cann_path, name))]

    @classmethod
    def get_device_id(cls, cann_path: str) -> list:
        """The ids of the ``device_<id>`` folders; [] when one is named otherwise (``device_1_3``)."""
        ids = []
        for device_path in cls.get_device_path(cann_path) if cann_path else []:
            parts = os.path.basename(device_path).split("_")
            if len(parts) != 2 or not parts[1].isdigit():
                return []
            ids.append(int(parts[1]))
        return ids

    @classmethod
    def get_start_info_path(cls, cann_path: str) -> str:
        """msprof's record of when collection started: ``host/start_info``, else the first
        device's ``device_<id>/start_info.<id>``, else ``""``."""
        if not cann_path:
            return ""
        host_file = os.path.join(cann_path, "host", "start_info")
        if os.path.exists(host_file):
            return host_file
        device_paths = cls.get_device_path(cann_path)
        if not device_paths:
            return ""
        parts = os.path.basename(device_paths[0]).split("_")
        if len(parts) != 2:
            return ""
        return _existing(os.path.join(device_paths[0], f"start_info.{parts[1]}"))

    @classmethod
    def get_plt_dir_path(cls, profiler_path: str) -> str:
        """The ``PLATFORM_<n>`` folder of the run, else ``""``."""
        return _first_dir(profiler_path, re.compile(Constant.PLATFORM_ANALYSIS_DIR + r"_\d{1,20}"))

    @classmethod
    def _is_result_dir(cls, path: str) -> bool:
        return bool(cls.get_fwk_path(path) or cls.get_cann_path(path))

    @classmethod
    def get_profiler_path_list(cls, input_path: str) -> list:
        """``[input_path]`` when it is a result directory (it has FRAMEWORK/ or PROF_*/), else
        its sub-folders that are."""
        if not isinstance(input_path, str) or not os.path.isdir(input_path):
            return []
        if cls._is_result_dir(input_path):
            return [input_path]
        return [os.path.join(input_path, name) for name in _entries(input_path)
                if os.path.isdir(os.path.join(input_path, name)) and cls._is_result_dir(os.path.join(input_path, name))]

    @classmethod
    def _files_in(cls, folder: str) -> list:
        return [os.path.join(folder, name) for name in _entries(folder)]

    @classmethod
    def get_output_all_file_list_by_type(cls, profiler_path: str, mindstudio_profiler_output: str) -> list:
        """The paths in ``{profiler_path}/{mindstudio_profiler_output}``."""
        return cls._files_in(os.path.join(profiler_path, mindstudio_profiler_output))

    @classmethod
    def get_analyze_all_file(cls, profiler_path: str, analyze: str) -> list:
        """The paths in ``{profiler_path}/{analyze}``."""
        return cls._files_in(os.path.join(profiler_path, analyze))

    @classmethod
    def get_database_all_file(cls, profiler_path: str) -> list:
        """The paths in ``profiler_path`` (msprof writes its ``msprof_*.db`` there)."""
        return cls._files_in(profiler_path)

    @classmethod
    def get_realpath(cls, path: str) -> str:
        if not isinstance(path, str) or not path:
            raise RuntimeError("Input path is empty, please check.")
        path = os.path.expanduser(path)
        if os.path.islink(path):
            warnings.warn(f"Invalid input path is a symbolic link: {path}")
        return os.path.realpath(path)

    @classmethod
    def get_all_subdir(cls, path: str, max_depth: int = 4, cur_depth: int = 0) -> list:
        """Every folder below ``path`` down to ``max_depth`` levels under its children."""
        if cur_depth > max_depth:
            return []
        found = []
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir():
                    found.append(entry.path)
                    found += cls.get_all_subdir(entry.path, max_depth, cur_depth + 1)
        return found

    @classmethod
    def check_path_permission(cls, path: str) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        return st.st_uid in (0, os.getuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)

    @classmethod
    def walk_with_depth(cls, path: str, max_depth: int = 10, *args, **kwargs):
        """``os.walk(path)``, not below ``max_depth`` levels."""
        if not isinstance(path, str):
            return
        base_depth = path.rstrip(os.sep).count(os.sep)
        for root, dirs, files in os.walk(path, *args, **kwargs):
            if root.count(os.sep) - base_depth > max_depth:
                dirs.clear()
                continue
            yield root, dirs, files
