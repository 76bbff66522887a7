"""``FileManager``: how the profiler writes and reads its files, as torch_npu's (the folders
are created as needed)."""
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
