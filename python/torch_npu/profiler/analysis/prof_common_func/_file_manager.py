"""``FileManager``: how the profiler's analysis writes and reads its files, as torch_npu's.

Writers (``create_csv_file``, ``create_json_file[_by_path]``, ``create_json_gz_file_by_path``,
``create_text_file_by_path``, ``create_bin_file_by_path``, ``create_empty_file``) create the
folders and the file (mode 0640, ``PathManager``) and write nothing for empty data. A trace
is written in two parts: ``create_prepare_trace_json_by_path`` writes a JSON list without its
closing ``]``, ``append_trace_json_by_path`` appends more events and closes it (and renames it).

Readers give an empty result for a missing or empty file and, with a warning, for one larger
than ``Constant.MAX_FILE_SIZE`` (``MAX_CSV_SIZE`` for CSV): ``file_read_all`` (text or bytes),
``read_csv_file(path, class_bean)`` (a ``class_bean(row_dict)`` per row), ``read_json_file``.
A file that cannot be read or written raises RuntimeError naming it.
"""
import csv
import gzip
import json
import os
from typing import Dict, Optional

from ....utils._path_manager import PathManager
from ._constant import Constant, print_warn_msg

__all__ = []


def _size_to_read(file_path: str, limit: int) -> int:
    """Size of ``file_path`` if it is worth reading (0 otherwise, with a warning when too large)."""
    if not os.path.isfile(file_path):
        return 0
    size = os.path.getsize(file_path)
    if size > limit:
        print_warn_msg(f"The file size exceeds the preset value, please check the file: {file_path}")
        return 0
    return max(size, 0)


def _prepare_output(file_path: str) -> None:
    PathManager.make_dir_safety(os.path.dirname(file_path) or ".")
    PathManager.create_file_safety(file_path)
    PathManager.check_directory_path_writeable(file_path)


class FileManager:
    @classmethod
    def file_read_all(cls, file_path: str, mode: str = "r"):
        if not isinstance(file_path, str):
            raise TypeError(f"file_read_all: file_path must be a str, got {file_path!r}")
        PathManager.check_directory_path_readable(file_path)
        if not _size_to_read(file_path, Constant.MAX_FILE_SIZE):
            return ""
        try:
            with open(file_path, mode) as f:
                return f.read()
        except Exception as err:
            raise RuntimeError(f"Can't read file: {file_path}") from err

    @classmethod
    def read_csv_file(cls, file_path: str, class_bean) -> list:
        PathManager.check_directory_path_readable(file_path)
        if not _size_to_read(file_path, Constant.MAX_CSV_SIZE):
            return []
        try:
            with open(file_path, newline="") as f:
                return [class_bean(row) for row in csv.DictReader(f)]
        except Exception as err:
            raise RuntimeError(f"Failed to read the file: {file_path}") from err

    @classmethod
    def read_json_file(cls, file_path: str) -> Optional[Dict]:
        if not _size_to_read(file_path, Constant.MAX_FILE_SIZE):
            return {}
        try:
            with open(file_path, encoding="utf-8") as f:
                return json.load(f)
        except Exception as err:
            raise RuntimeError(f"Failed to read the file: {file_path}") from err

    @classmethod
    def _write(cls, file_path: str, data, opener=open, mode: str = "w", **kwargs) -> None:
        _prepare_output(file_path)
        try:
            with opener(file_path, mode, **kwargs) as f:
                f.write(data)
        except Exception as err:
            raise RuntimeError(f"Can't create file: {file_path}") from err

    @classmethod
    def create_csv_file(cls, output_path: str, data: list, file_name: str, headers: list = None) -> None:
        if not data:
            return
        file_path = os.path.join(output_path, file_name)
        _prepare_output(file_path)
        try:
            with open(file_path, "w", newline="") as f:
                writer = csv.writer(f)
                if headers:
                    writer.writerow(headers)
                writer.writerows(data)
        except Exception as err:
            raise RuntimeError(f"Can't create file: {file_path}") from err

    @classmethod
    def create_json_file(cls, output_path: str, data, file_name: str) -> None:
        if data:
            cls.create_json_file_by_path(os.path.join(output_path, file_name), data)

    @classmethod
    def create_json_file_by_path(cls, output_path: str, data, indent: int = None) -> None:
        if data:
            cls._write(output_path, json.dumps(data, indent=indent, ensure_ascii=False, default=str))

    @classmethod
    def create_json_gz_file_by_path(cls, output_path: str, data) -> None:
        if data:
            cls._write(output_path, json.dumps(data, default=str), opener=gzip.open, mode="wt")

    @classmethod
    def create_text_file_by_path(cls, output_path: str, data: str) -> None:
        if data:
            cls._write(output_path, data)

    @classmethod
    def create_bin_file_by_path(cls, output_path: str, write_data: bytes) -> None:
        if write_data:
            cls._write(output_path, bytes(write_data), mode="wb")

    @classmethod
    def create_prepare_trace_json_by_path(cls, output_path: str, data) -> None:
        """The JSON text of ``data`` without its last character (a list's ``]``: more events follow)."""
        if data:
            cls._write(output_path, json.dumps(data, ensure_ascii=False)[:-1])

    @classmethod
    def append_trace_json_by_path(cls, output_path: str, data, new_name: str) -> None:
        """Appends ``data``'s elements (its JSON text after the opening bracket) and renames the file."""
        PathManager.check_directory_path_writeable(output_path)
        try:
            with open(output_path, "a") as f:
                f.write("," + json.dumps(data, ensure_ascii=False)[1:])
        except Exception as err:
            raise RuntimeError(f"Can't create file: {output_path}") from err
        if output_path != new_name:
            os.rename(output_path, new_name)

    @classmethod
    def create_empty_file(cls, output_path: str, file_name: str) -> None:
        file_path = os.path.join(output_path, file_name)
        PathManager.make_dir_safety(output_path)
        PathManager.check_directory_path_writeable(output_path)
        cls._write(file_path, "")

    @classmethod
    def check_db_file_vaild(cls, db_path: str) -> None:
        PathManager.check_input_file_path(db_path)
        size = os.path.getsize(db_path)
        if size < 0 or size > Constant.MAX_FILE_SIZE:
            raise RuntimeError(f"Invalid db file size, please check the db file: {db_path}")

    @classmethod
    def check_file_owner(cls, path) -> bool:
        """Owned by root or by this (effective) user."""
        uid = os.stat(path).st_uid
        return uid == 0 or uid == os.geteuid()

    @classmethod
    def check_file_writable(cls, path) -> bool:
        return os.access(path, os.W_OK)

    @classmethod
    def check_file_readable(cls, path) -> bool:
        return os.access(path, os.R_OK)
