"""NPU runtime options: ``torch.npu.set_option``, compile mode, HF32 and internal-format switches.

On Ascend hardware these options steer CANN (precision mode, operator compilation,
HF32 matmul/conv, private storage formats). The simulator computes on the CPU in
the requested dtypes, so the options are validated and recorded here, readable
back through :func:`get_option` and the attributes below, and do not change
numerical results. The option functions (``set_option``, ``set_compile_mode``, ...) are
defined in :mod:`torch_npu.npu.npu_config`, as in torch_npu, and imported here.

* ``torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16", ...})``
* ``torch.npu.set_compile_mode(jit_compile=False)``
* ``torch.npu.matmul.allow_hf32`` (default ``False``), ``torch.npu.conv.allow_hf32``
  (default ``True``)
* ``torch_npu.npu.config.allow_internal_format`` (default ``False``)
"""

import sys
import types
from typing import Optional

# set_option, set_compile_mode, ... are defined in torch_npu.npu.npu_config, as in torch_npu
from .npu_config import (_options, _options_lock as _lock, get_mm_bmm_format_nd,  # noqa: F401
                         is_jit_compile_false, set_compile_mode, set_mm_bmm_format_nd, set_option)

__all__ = [
    "get_option",
    "allow_internal_format",
]

# ``allow_internal_format``: whether operators may create tensors in private NPU formats
# (NC1HWC0, FRACTAL_NZ, ...) on their own, e.g. ``torch_npu.unsafe_empty_with_format`` without
# ``keep_format`` (default ``False``). It is the option ALLOW_INTERNAL_FORMAT: assigning it
# sets the option, as torch_npu's ``torch.npu.config`` does, and reading it reads the option.


class _ConfigModule(types.ModuleType):
    def __getattr__(self, name):
        if name == "allow_internal_format":
            with _lock:
                return _options.get("ALLOW_INTERNAL_FORMAT") == "enable"
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name == "allow_internal_format":
            # A bool, or the option's own value as torch_npu._C._npu_getOption returns it (bytes,
            # None when never set): the save-and-restore idiom of torch_npu's tests.
            if isinstance(value, bytes):
                value = value.decode()
            if value is None or value in ("enable", "disable"):
                value = value == "enable"
            if not isinstance(value, bool):
                raise TypeError("torch.npu.config.allow_internal_format must be a bool (or the option's value "
                                f"'enable' / 'disable' / None), got {value!r}")
            set_option({"ALLOW_INTERNAL_FORMAT": "enable" if value else "disable"})
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ConfigModule


def get_option(name: str) -> Optional[str]:
    r"""Return the value last given to :func:`set_option` for ``name`` (``None`` if never set)."""
    if not isinstance(name, str):
        raise TypeError(f"get_option(): argument 'name' must be a str, got {type(name).__name__}")
    with _lock:
        return _options.get(name)


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
