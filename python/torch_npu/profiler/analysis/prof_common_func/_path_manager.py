"""``ProfilerPathManager``: checks on the paths the profiler uses, as torch_npu's.

``check_path_permission(path)``: may torch_npu run or read what is at ``path`` (a tool such
as ``msprof``): it must belong to root or to this user, and others must not be able to
write it. ``get_fwk_path(profiler_path)``: the run's ``FRAMEWORK`` folder (host-side data), ``""`` if it
has none.
"""
import os
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
