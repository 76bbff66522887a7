"""``torch_npu.utils._path_manager.PathManager``: torch_npu's checked file-system helpers.

Paths that are symbolic links, over-long, or with unusual characters only warn (as in
torch_npu); what cannot be done raises RuntimeError with torch_npu's error code. Directories
are created ``0o750`` and files ``0o640``.
"""
import os
import re
import shutil
import warnings

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["PathManager"]

_USUAL_PATH = re.compile(r"[\s.~/_\-0-9a-zA-Z\u4e00-\u9fa5]+")  # letters, digits, CJK, ./_-~ and spaces


class PathManager:
    MAX_PATH_LENGTH = 4096
    MAX_FILE_NAME_LENGTH = 255
    DATA_FILE_AUTHORITY = 0o640
    DATA_DIR_AUTHORITY = 0o750

    @classmethod
    def _warn_if_link(cls, path: str, msg: str) -> None:
        if os.path.islink(path):
            warnings.warn(msg)

    @classmethod
    def _input_path_common_check(cls, path: str) -> None:
        """Warns about an over-long path or name, a symbolic link, unusual characters."""
        if not isinstance(path, str):
            raise TypeError(f"path must be a str, got {type(path).__name__}" + pta_error(ErrCode.TYPE))
        if len(path) > cls.MAX_PATH_LENGTH or any(len(name) > cls.MAX_FILE_NAME_LENGTH for name in path.split("/")):
            warnings.warn("Length of input path exceeds the limit.")
        cls._warn_if_link(path, f"Invalid input path is a symbolic link: {path}")
        if not _USUAL_PATH.fullmatch(path):
            warnings.warn(f"Invalid input path: {path}")

    @classmethod
    def check_input_directory_path(cls, path: str) -> None:
        """Checks a directory path (which need not exist): raises if it is a file."""
        cls._input_path_common_check(path)
        if os.path.isfile(path):
            raise RuntimeError(f"Invalid input path is a file path: {path}" + pta_error(ErrCode.PARAM))

    @classmethod
    def check_input_file_path(cls, path: str) -> None:
        """Checks a file path (which need not exist): raises if it is a directory."""
        cls._input_path_common_check(path)
        if os.path.isdir(path):
            raise RuntimeError(f"Invalid input path is a directory path: {path}" + pta_error(ErrCode.PARAM))

    @classmethod
    def _check_access(cls, path: str, mode: int) -> None:
        if not os.path.exists(path):
            raise RuntimeError(f"The path does not exist: {path}" + pta_error(ErrCode.NOT_FOUND))
        cls._warn_if_link(path, f"Invalid path is a symbolic link: {path}")
        if not os.access(path, mode):
            warnings.warn(f"The path permission check failed: {path}")

    @classmethod
    def check_directory_path_writeable(cls, path: str) -> None:
        """Raises if ``path`` does not exist; warns if it is a link or not writable."""
        cls._check_access(path, os.W_OK)

    @classmethod
    def check_directory_path_readable(cls, path: str) -> None:
        """Raises if ``path`` does not exist; warns if it is a link or not readable."""
        cls._check_access(path, os.R_OK)

    @classmethod
    def check_path_is_readable(cls, path: str) -> bool:
        return os.access(path, os.R_OK)

    @classmethod
    def check_path_is_writeable(cls, path: str) -> bool:
        return os.access(path, os.W_OK)

    @classmethod
    def _remove(cls, path: str, remove, what: str) -> None:
        msg = f"Failed to remove {what}: {path}"
        cls._warn_if_link(path, msg)
        try:
            remove(path)
        except FileNotFoundError:  # already gone (also by a concurrent remover)
            return
        except Exception as err:
            raise RuntimeError(msg + pta_error(ErrCode.SYSCALL)) from err

    @classmethod
    def remove_path_safety(cls, path: str) -> None:
        """Removes the directory tree ``path``, if it exists."""
        cls._remove(path, shutil.rmtree, "path")

    @classmethod
    def remove_file_safety(cls, file: str) -> None:
        """Removes the file ``file``, if it exists."""
        cls._remove(file, os.remove, "file")

    @classmethod
    def make_dir_safety(cls, path: str) -> None:
        """Creates the directory ``path`` (and its parents) unless it exists."""
        msg = f"Failed to make directory: {path}"
        cls._warn_if_link(path, msg)
        if os.path.exists(path):
            return
        try:
            os.makedirs(path, mode=cls.DATA_DIR_AUTHORITY, exist_ok=True)
        except Exception as err:
            raise RuntimeError(msg + pta_error(ErrCode.SYSCALL)) from err

    @classmethod
    def create_file_safety(cls, path: str) -> None:
        """Creates the empty file ``path`` unless it exists."""
        msg = f"Failed to create file: {path}"
        cls._warn_if_link(path, msg)
        if os.path.exists(path):
            return
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, cls.DATA_FILE_AUTHORITY))
        except Exception as err:
            raise RuntimeError(msg + pta_error(ErrCode.SYSCALL)) from err
