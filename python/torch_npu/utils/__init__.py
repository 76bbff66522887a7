"""Small utilities of torch_npu: CANN version queries."""

import re
from typing import Tuple

__all__ = ["get_cann_version", "npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid"]

# The CANN components torch_npu can be asked about. The simulator is one package
# at one CANN level, so all of them report that level.
_CANN_MODULES = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL", "DRIVER")


def _simulated_cann_version() -> str:
    import torch_npu

    c_ext = getattr(torch_npu, "_C", None)
    version = getattr(c_ext, "__cann_version__", None)
    if version:
        return str(version)
    from torch_npu import version as build

    return str(build.cann_version)


def get_cann_version(module='CANN'):
    r"""Return the version of a CANN component, e.g. ``"8.5.0"``.

    Args:
        module (str): one of ``"CANN"`` (default), ``"RUNTIME"``, ``"COMPILER"``,
            ``"HCCL"``, ``"TOOLKIT"``, ``"OPP"``, ``"OPP_KERNEL"``, ``"DRIVER"``. The
            simulated CANN is a single package, so all components have its version.
    """
    if not isinstance(module, str):
        raise TypeError(f"get_cann_version(): argument 'module' must be a str, got "
                        f"{type(module).__name__}")
    if module.upper() not in _CANN_MODULES:
        raise ValueError(f"get_cann_version(): argument 'module' must be one of "
                         f"{list(_CANN_MODULES)}, got {module!r}")
    return _simulated_cann_version()


def _version_key(version: str) -> Tuple:
    """Order CANN versions: "8.0.RC2" < "8.0.0" < "8.1.RC1" < "8.5.0" < "9.1.0"."""
    parts = []
    for piece in re.split(r"[.\-]", version.strip()):
        match = re.fullmatch(r"(?i)(rc|alpha|beta|t)?(\d+)", piece)
        if match is None:
            raise ValueError(f"not a CANN version: {version!r}")
        tag, number = match.group(1), int(match.group(2))
        # A release candidate sorts below the final release of the same minor version.
        rank = {"alpha": 0, "beta": 1, "t": 1, "rc": 2}.get((tag or "").lower(), 3)
        parts.append((rank, number))
    return tuple(parts)


def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    r"""Return whether the CANN component ``module`` is at least ``version``."""
    return _version_key(get_cann_version(module)) >= _version_key(version)


from .combine_tensors import (  # noqa: E402  (torch_npu.optim's combined buffers)
    get_part_combined_tensor, is_combined_tensor_valid, npu_combine_tensors)

import torch as _torch  # noqa: E402

_torch.version.cann = get_cann_version()  # as torch_npu sets it (torch_npu.utils.collect_env)


def _add_tensor_methods() -> None:
    """Patch ``torch.Tensor`` for npu, as ``import torch_npu`` does (idempotent).

    ``Tensor.npu()``/``is_npu`` come from PyTorch's PrivateUse1 registration at import;
    the remaining changes are :mod:`torch_npu._patches`, applied once.
    """
    from torch_npu import _patches

    _patches.apply()
    if not hasattr(_torch.Tensor, "is_npu"):
        raise RuntimeError("torch.Tensor has no npu methods: import torch_npu completely first")


def _apply_module_patch() -> None:
    """Patch ``torch.nn.Module`` for npu, as ``import torch_npu`` does (idempotent).

    ``Module.npu()`` comes from PyTorch's PrivateUse1 registration at import; lazy modules
    and the other changes are :mod:`torch_npu._patches`, applied once.
    """
    from torch_npu import _patches

    _patches.apply()
    if not hasattr(_torch.nn.Module, "npu"):
        raise RuntimeError("torch.nn.Module has no npu method: import torch_npu completely first")



# torch_npu.utils' other public names (their modules are imported on first use).
_LAZY = {
    "FlopsCounter": ("flops_count", "_FlopsCounter"),
    "save_async": ("serialization", "save_async"),
    "set_thread_affinity": ("affinity", "_set_thread_affinity"),
    "reset_thread_affinity": ("affinity", "_reset_thread_affinity"),
}
__all__ += list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
