"""``FileManager``: how the profiler writes and reads its files, as torch_npu's (the folders
are created as needed). ``file_read_all(path, mode)`` reads a whole file: ``''`` for a missing
or empty file, and (with a warning) for one larger than ``Constant.MAX_FILE_SIZE``."""
import json
import os

__all__ = []


class FileManager:
    @classmethod
    def create_bin_file_by_path(cls, output_path: str, write_data: bytes) -> None:
        if not write_data:
            return
        os.makedirs(os.path.dirname(os.path.realpath(output_path)), exist_ok=True)
        with open(output_path, "wb") as f:
            f.write(write_data)

    @classmethod
    def create_json_file_by_path(cls, output_path: str, data, indent=None) -> None:
        os.makedirs(os.path.dirname(os.path.realpath(output_path)), exist_ok=True)
        with open(output_path, "w") as f:
            json.dump(data, f, indent=indent, default=str)

    @classmethod
    def read_json_file(cls, file_path: str):
        if not os.path.isfile(file_path):
            raise RuntimeError(f"The file does not exist: {file_path}")
        with open(file_path) as f:
            return json.load(f)

    @classmethod
    def file_read_all(cls, file_path: str, mode: str = "r"):
        from ._constant import Constant, print_warn_msg

        if not isinstance(file_path, str):
            raise TypeError(f"file_read_all: file_path must be a str, got {file_path!r}")
        if not os.path.isfile(file_path):
            return ""
        size = os.path.getsize(file_path)
        if size <= 0:
            return ""
        if size > Constant.MAX_FILE_SIZE:
            print_warn_msg(f"The file size exceeds the preset value, please check the file: {file_path}")
            return ""
        try:
            with open(file_path, mode) as f:
                return f.read()
        except Exception as err:
            raise RuntimeError(f"Can't read file: {file_path}") from err
