"""``torch_npu.npu.npu_config``: runtime options, core limits, operator dump and AOE settings.

The option functions (``set_option``, ``set_compile_mode``, ...) are defined here, as in
torch_npu; :mod:`torch_npu.npu.config` reads the options back (``get_option``, the HF32
switches). Core limits (``set_device_limit``/``set_stream_limit``) are recorded per device /
per stream and reported back by the getters; the simulator runs every kernel on the
host CPU, so a limit does not change how many cores a kernel uses (README: "APIs whose behaviour
needs real hardware"). Likewise the dump configuration and the AOE path are validated and kept,
but no operator data is dumped and no tuning runs.
"""

import json
import os
import threading
from typing import Dict

import torch

import torch_npu

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["set_option", "set_compile_mode", "is_jit_compile_false", "set_mm_bmm_format_nd",
           "get_mm_bmm_format_nd", "set_aoe", "set_dump", "init_dump", "finalize_dump",
           "set_device_limit", "get_device_limit", "set_stream_limit", "get_stream_limit",
           "reset_stream_limit"]

_options_lock = threading.Lock()  # the options (set_option, get_option, ...)
_options: Dict[str, str] = {}


def _aicore_num(value: str) -> bool:
    return value.isdigit() and 1 <= int(value) <= 32


# Allowed values of the options CANN validates (None: any string).
_OPTION_VALUES = {
    "ACL_PRECISION_MODE": ("allow_fp32_to_fp16", "must_keep_origin_dtype"),
    "ACL_OP_SELECT_IMPL_MODE": ("high_performance", "high_precision"),
    "ACL_AICORE_NUM": _aicore_num,
    "ACL_OPTYPELIST_FOR_IMPLMODE": None,
    "ACL_OP_DEBUG_LEVEL": ("0", "1", "2", "3", "4"),
    "ACL_DEBUG_DIR": None,
    "ACL_OP_COMPILER_CACHE_MODE": ("disable", "enable", "force"),
    "ACL_OP_COMPILER_CACHE_DIR": None,
    "ACL_OP_DEBUG_OPTION": None,
    "MM_BMM_ND_ENABLE": ("enable", "disable"),
    "NPU_FUZZY_COMPILE_BLACKLIST": None,
}
#: Every option name torch_npu's runtime knows (others are rejected, as there).
_OPTION_NAMES = frozenset(_OPTION_VALUES) | {
    "ALLOW_CONV_HF32", "ALLOW_INTERNAL_FORMAT", "ALLOW_MATMUL_HF32", "CUBE_MATH_TYPE",
    "FORCE_ACLNN_OP_LIST", "OP_HOOK_ENABLE", "STRONG_CONSISTENCY",
    "TORCH_NPU_USE_COMPATIBLE_IMPL", "autotune", "autotunegraphdumppath", "bmmv2_enable",
    "jitCompile", "jitCompileInit", "mdldumpconfigpath", "mdldumpswitch",
}


def set_option(option):
    r"""Set NPU runtime options, e.g. ``{"ACL_PRECISION_MODE": "must_keep_origin_dtype"}``.

    Values are converted to ``str``; the options CANN validates must have one of
    their allowed values (``ValueError`` otherwise); an unknown option name is a
    ``RuntimeError``. The error texts are torch_npu's, with the argument named.
    """
    if not isinstance(option, dict):
        raise TypeError(f"npu option must be a dict (set_option(): argument 'option'), got "
                        f"{type(option).__name__}" + pta_error(ErrCode.PARAM))
    checked = {}
    for name, value in option.items():
        if not isinstance(name, str):
            raise TypeError(f"set_option(): option names must be str, got {type(name).__name__}")
        if name not in _OPTION_NAMES:
            raise RuntimeError(f"invalid npu option name:{name} (set_option(): known options are "
                               f"{sorted(_OPTION_NAMES)})" + pta_error(ErrCode.PARAM))
        text = str(value)
        allowed = _OPTION_VALUES.get(name)
        if callable(allowed):
            if not allowed(text):
                raise ValueError(f"set_option(): value of {name} should be an integer in [1, 32] "
                                 f"but got {value}" + pta_error(ErrCode.PARAM))
        elif allowed is not None and text not in allowed:
            raise ValueError(f"set_option(): value of {name} should be in {list(allowed)} "
                             f"but got {value}" + pta_error(ErrCode.PARAM))
        checked[name] = text
    global _mm_bmm_nd
    with _options_lock:
        _options.update(checked)
        if "MM_BMM_ND_ENABLE" in checked:
            _mm_bmm_nd = checked["MM_BMM_ND_ENABLE"] == "enable"
        if "ALLOW_INTERNAL_FORMAT" in checked:
            torch_npu._C._npu_set_allow_internal_format(checked["ALLOW_INTERNAL_FORMAT"] == "enable")


def set_compile_mode(jit_compile=False):
    r"""Choose online operator compilation (``True``) or precompiled binary kernels (``False``)."""
    if not isinstance(jit_compile, bool):
        raise TypeError("set_compile_mode(): argument 'jit_compile' must be a bool, got "
                        f"{type(jit_compile).__name__}")
    with _options_lock:
        _options["jitCompile"] = "enable" if jit_compile else "disable"


def is_jit_compile_false() -> bool:
    r"""Return whether operators use precompiled kernels (the default of CANN 8.x)."""
    with _options_lock:
        return _options.get("jitCompile", "disable") == "disable"


_mm_bmm_nd = True


def set_mm_bmm_format_nd(is_nd=True):
    r"""Make ``mm``/``bmm`` in ``Linear`` keep the ND format (default ``True``)."""
    global _mm_bmm_nd
    _mm_bmm_nd = bool(is_nd)


def get_mm_bmm_format_nd():
    r"""Return the value set by :func:`set_mm_bmm_format_nd`."""
    return _mm_bmm_nd


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
