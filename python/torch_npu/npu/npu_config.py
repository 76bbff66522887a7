"""``torch_npu.npu.npu_config``: runtime options, core limits, operator dump and AOE settings.

The option functions live in :mod:`torch_npu.npu.config` (re-exported here, as torch_npu keeps
them in this module). Core limits (``set_device_limit``/``set_stream_limit``) are recorded per
device / per stream and reported back by the getters; the simulator runs every kernel on the
host CPU, so a limit does not change how many cores a kernel uses (README: "APIs whose behaviour
needs real hardware"). Likewise the dump configuration and the AOE path are validated and kept,
but no operator data is dumped and no tuning runs.
"""

import json
import os
import threading

import torch

from .config import (get_mm_bmm_format_nd, get_option, is_jit_compile_false, set_compile_mode,
                     set_mm_bmm_format_nd, set_option)

__all__ = ["set_option", "set_compile_mode", "is_jit_compile_false", "set_mm_bmm_format_nd",
           "get_mm_bmm_format_nd", "set_aoe", "set_dump", "init_dump", "finalize_dump",
           "set_device_limit", "get_device_limit", "set_stream_limit", "get_stream_limit",
           "reset_stream_limit"]

_lock = threading.Lock()
_device_limits = {}     # device index -> {"cube_core_num": n, "vector_core_num": n}
_stream_limits = {}     # (device index, stream id) -> {"cube_core_num": n, "vector_core_num": n}
_dump_state = {"initialized": False, "config": None}


def set_aoe(dump_path):
    r"""Enable AOE (operator auto-tuning) with ``dump_path`` for its graphs; the directory is
    created (mode 0o750) and the options ``autotune`` ("enable") and
    ``autotunegraphdumppath`` (the directory) recorded, as torch_npu sets them."""
    if not isinstance(dump_path, str) or not dump_path:
        raise TypeError("set_aoe(): dump_path must be a non-empty str")
    os.makedirs(dump_path, mode=0o750, exist_ok=True)
    set_option({"autotune": "enable", "autotunegraphdumppath": os.path.realpath(dump_path)})


def init_dump():
    r"""Start an operator-dump session (``aclmdlInitDump``); ``set_dump`` then configures it."""
    with _lock:
        _dump_state["initialized"] = True
        _dump_state["config"] = None


def set_dump(cfg_file):
    r"""Configure the operator dump from the JSON file ``cfg_file`` (its ``"dump"`` section,
    as ``aclmdlSetDump``); the file must exist and be valid JSON."""
    if not isinstance(cfg_file, str):
        raise TypeError("set_dump(): cfg_file must be a str")
    path = os.path.realpath(cfg_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"set_dump(): {cfg_file} does not exist")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    with _lock:
        _dump_state["initialized"] = True
        _dump_state["config"] = config


def finalize_dump():
    r"""End the operator-dump session started by :func:`init_dump`."""
    with _lock:
        _dump_state["initialized"] = False
        _dump_state["config"] = None


def _device_cores(device):
    from .utils import get_device_properties
    props = get_device_properties(device)
    return props.cube_core_num, props.vector_core_num


def _check_device(device, fn):
    from .utils import device_count
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"{fn}(): device must be an int, but got {type(device).__name__}")
    if device < 0 or device >= device_count():
        raise AssertionError(f"{fn}(): invalid device id {device}")


def _check_num(value, name, maximum, fn):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}(): {name} must be an int, but got {type(value).__name__}")
    if value != -1 and not 0 < value <= maximum:
        raise ValueError(f"{fn}(): {name} must be -1 (no limit) or in [1, {maximum}], got {value}")


def _set_device_limit(device, cube_num=-1, vector_num=-1):
    _check_device(device, "set_device_limit")
    cube_max, vector_max = _device_cores(device)
    _check_num(cube_num, "cube_num", cube_max, "set_device_limit")
    _check_num(vector_num, "vector_num", vector_max, "set_device_limit")
    with _lock:
        limit = _device_limits.setdefault(device, {})
        if cube_num != -1:
            limit["cube_core_num"] = cube_num
        if vector_num != -1:
            limit["vector_core_num"] = vector_num


def set_device_limit(*args, **kwargs):
    r"""set_device_limit(device, cube_num=-1, vector_num=-1): limit the cube / vector cores the
    operators of ``device`` may use (-1 leaves a limit unchanged)."""
    return _set_device_limit(*args, **kwargs)


def get_device_limit(device):
    r"""The core limits of ``device``: ``{"cube_core_num": n, "vector_core_num": n}`` (the
    device's core counts where no limit was set)."""
    _check_device(device, "get_device_limit")
    cube, vector = _device_cores(device)
    with _lock:
        limit = dict(_device_limits.get(device, {}))
    return {"cube_core_num": limit.get("cube_core_num", cube),
            "vector_core_num": limit.get("vector_core_num", vector)}


def _stream_key(stream, fn):
    if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
        raise TypeError(f"{fn}(): stream must be a torch.npu.Stream, got {type(stream).__name__}")
    return stream.device_index, stream.stream_id


def set_stream_limit(stream, cube_num=-1, vector_num=-1):
    r"""Limit the cube / vector cores the operators launched on ``stream`` may use (-1: the
    device's limit)."""
    key = _stream_key(stream, "set_stream_limit")
    cube_max, vector_max = _device_cores(key[0])
    _check_num(cube_num, "cube_num", cube_max, "set_stream_limit")
    _check_num(vector_num, "vector_num", vector_max, "set_stream_limit")
    with _lock:
        limit = _stream_limits.setdefault(key, {})
        if cube_num != -1:
            limit["cube_core_num"] = cube_num
        if vector_num != -1:
            limit["vector_core_num"] = vector_num


def get_stream_limit(stream):
    r"""The core limits of ``stream`` (its device's where none was set)."""
    key = _stream_key(stream, "get_stream_limit")
    device_limit = get_device_limit(key[0])
    with _lock:
        limit = dict(_stream_limits.get(key, {}))
    return {k: limit.get(k, v) for k, v in device_limit.items()}


def reset_stream_limit(stream):
    r"""Drop the core limits of ``stream``: it follows its device's again."""
    key = _stream_key(stream, "reset_stream_limit")
    with _lock:
        _stream_limits.pop(key, None)
