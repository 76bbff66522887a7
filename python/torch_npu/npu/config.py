"""NPU runtime options: ``torch.npu.set_option``, compile mode, HF32 and internal-format switches.

On Ascend hardware these options steer CANN (precision mode, operator compilation,
HF32 matmul/conv, private storage formats). The simulator computes on the CPU in
the requested dtypes, so the options are validated and recorded here, readable
back through :func:`get_option` and the attributes below, and do not change
numerical results.

* ``torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16", ...})``
* ``torch.npu.set_compile_mode(jit_compile=False)``
* ``torch.npu.matmul.allow_hf32`` (default ``False``), ``torch.npu.conv.allow_hf32``
  (default ``True``)
* ``torch_npu.npu.config.allow_internal_format`` (default ``False``)
"""

import threading
from typing import Dict, Optional

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = [
    "set_option",
    "get_option",
    "set_compile_mode",
    "is_jit_compile_false",
    "set_mm_bmm_format_nd",
    "get_mm_bmm_format_nd",
    "allow_internal_format",
]

#: Whether operators may keep tensors in private NPU formats (NC1HWC0, FRACTAL_NZ, ...).
allow_internal_format = False

_lock = threading.Lock()
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
    with _lock:
        _options.update(checked)
        if "MM_BMM_ND_ENABLE" in checked:
            _mm_bmm_nd = checked["MM_BMM_ND_ENABLE"] == "enable"


def get_option(name: str) -> Optional[str]:
    r"""Return the value last given to :func:`set_option` for ``name`` (``None`` if never set)."""
    if not isinstance(name, str):
        raise TypeError(f"get_option(): argument 'name' must be a str, got {type(name).__name__}")
    with _lock:
        return _options.get(name)


def set_compile_mode(jit_compile=False):
    r"""Choose online operator compilation (``True``) or precompiled binary kernels (``False``)."""
    if not isinstance(jit_compile, bool):
        raise TypeError("set_compile_mode(): argument 'jit_compile' must be a bool, got "
                        f"{type(jit_compile).__name__}")
    with _lock:
        _options["jitCompile"] = "enable" if jit_compile else "disable"


def is_jit_compile_false() -> bool:
    r"""Return whether operators use precompiled kernels (the default of CANN 8.x)."""
    with _lock:
        return _options.get("jitCompile", "disable") == "disable"


_mm_bmm_nd = True


def set_mm_bmm_format_nd(is_nd=True):
    r"""Make ``mm``/``bmm`` in ``Linear`` keep the ND format (default ``True``)."""
    global _mm_bmm_nd
    _mm_bmm_nd = bool(is_nd)


def get_mm_bmm_format_nd():
    r"""Return the value set by :func:`set_mm_bmm_format_nd`."""
    return _mm_bmm_nd


class _HF32Switch:
    """``torch.npu.matmul`` / ``torch.npu.conv``: holds the ``allow_hf32`` flag."""

    __slots__ = ("_what", "_option", "_default")

    def __init__(self, what: str, option: str, default: bool):
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_option", option)
        object.__setattr__(self, "_default", default)

    @property
    def allow_hf32(self) -> bool:
        with _lock:
            value = _options.get(self._option)
        return self._default if value is None else value == "enable"

    @allow_hf32.setter
    def allow_hf32(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"torch.npu.{self._what}.allow_hf32 must be a bool, got "
                            f"{type(value).__name__}")
        with _lock:
            _options[self._option] = "enable" if value else "disable"

    def __setattr__(self, name, value):
        if name != "allow_hf32":
            raise AttributeError(f"torch.npu.{self._what} has no option {name!r} "
                                 "(only 'allow_hf32')")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return f"torch.npu.{self._what}(allow_hf32={self.allow_hf32})"


matmul = _HF32Switch("matmul", "ALLOW_MATMUL_HF32", False)
conv = _HF32Switch("conv", "ALLOW_CONV_HF32", True)
