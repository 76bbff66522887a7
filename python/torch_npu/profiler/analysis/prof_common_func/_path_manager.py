"""``ProfilerPathManager``: checks on the paths the profiler uses, as torch_npu's.

``check_path_permission(path)``: may torch_npu run or read what is at ``path`` (a tool such
as ``msprof``): it must belong to root or to this user, and others must not be able to
write it. ``get_fwk_path(profiler_path)``: the run's ``FRAMEWORK`` folder (host-side data), ``""`` if it
has none. ``get_cann_path``: its msprof ``PROF_*`` folder; ``get_info_file_path``: its
``profiler_info.json`` (``profiler_info_{rank}.json``); ``get_info_path`` / ``get_host_start_log_path``:
msprof's ``host/info.json`` and ``host/host_start.log`` (CPU frequency, start counter). Each is
``""`` when the run has none.
"""
import os
import re
import stat

__all__ = []


class ProfilerPathManager:
    @classmethod
    def check_path_permission(cls, path: str) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        return st.st_uid in (0, os.getuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)

    @classmethod
    def get_fwk_path(cls, profiler_path: str) -> str:
        """``{profiler_path}/FRAMEWORK`` if that folder exists, else ``""``."""
        from ._constant import Constant

        fwk_path = os.path.join(profiler_path, Constant.FRAMEWORK_DIR)
        return fwk_path if os.path.isdir(fwk_path) else ""

    @classmethod
    def get_cann_path(cls, profiler_path: str) -> str:
        """The first ``PROF_<digits>_<digits>_<id>`` folder of ``profiler_path`` (msprof's output), else ``""``."""
        if not os.path.isdir(profiler_path):
            return ""
        for name in sorted(os.listdir(os.path.realpath(profiler_path))):
            path = os.path.join(profiler_path, name)
            if re.match(r"^PROF_\d+_\d+_[0-9a-zA-Z]+", name) and os.path.isdir(path):
                return path
        return ""

    @classmethod
    def get_info_file_path(cls, profiler_path: str) -> str:
        """``profiler_info.json`` or ``profiler_info_<rank>.json`` of the run, else ``""``."""
        if not os.path.isdir(profiler_path):
            return ""
        for name in sorted(os.listdir(profiler_path)):
            if name == "profiler_info.json" or re.match(r"^profiler_info_\d+\.json", name):
                return os.path.join(profiler_path, name)
        return ""

    @classmethod
    def _cann_host_file(cls, profiler_path: str, name: str) -> str:
        cann_path = cls.get_cann_path(profiler_path)
        path = os.path.join(cann_path, "host", name)
        return path if cann_path and os.path.exists(path) else ""

    @classmethod
    def get_info_path(cls, profiler_path: str) -> str:
        """msprof's ``PROF_*/host/info.json``, else ``""``."""
        return cls._cann_host_file(profiler_path, "info.json")

    @classmethod
    def get_host_start_log_path(cls, profiler_path: str) -> str:
        """msprof's ``PROF_*/host/host_start.log``, else ``""``."""
        return cls._cann_host_file(profiler_path, "host_start.log")
