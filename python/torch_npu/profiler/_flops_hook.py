"""``FlopsHookManager``: while a profile with ``with_flops=True`` and mstx enabled records,
the operators that have a FLOPs formula (``_flops_registry``) are wrapped so that each call
is an mstx range named ``"{flops}-{op name}"`` in the domain ``mfu_flops`` (what torch_npu's
MFU analysis reads), as torch_npu does. The wrappers replace the target (``module:attr``)
and every other module attribute bound to the same function (``from torch_npu import
npu_fusion_attention`` elsewhere), and are removed when the profile stops. A formula that
fails is logged and the operator still runs; nested hooked calls count once (the outer).
"""
import functools
import importlib
import logging
import sys
import threading
from collections.abc import Callable
from typing import Optional

from torch_npu.npu.mstx import mstx

from ._flops_registry import get_flop_func, get_npu_flop_targets

__all__ = []

logger = logging.getLogger(__name__)

_FLOPS_DOMAIN = "mfu_flops"


def _resolve(target: str):
    """``"pkg.mod:a.b"`` -> (the object holding ``b``, ``"b"``), or (None, None)."""
    module_name, _, path = target.partition(":")
    if not path:
        logger.warning("Invalid FLOPs target format: %s", target)
        return None, None
    try:
        owner = importlib.import_module(module_name)
    except ImportError:
        logger.warning("Cannot import FLOPs target module: %s", module_name)
        return None, None
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name, None)
        if owner is None:
            logger.warning("Cannot resolve FLOPs target: %s", target)
            return None, None
    return owner, attr


def _default_targets() -> dict:
    importlib.import_module("torch_npu.profiler._flops_formulas")  # registers the defaults
    found = {}
    for op_name, target in get_npu_flop_targets().items():
        owner, attr = _resolve(target)
        if owner is not None:
            found[op_name] = (owner, attr)
    return found


class FlopsHookManager:
    _local = threading.local()
    _original_funcs: dict = {}
    _patched_targets: dict = {}
    _extra_refs: dict = {}
    _installed = False

    @classmethod
    def install(cls, target_ops: Optional[dict] = None) -> None:
        """Wraps the operators of ``target_ops`` (op name -> (owner, attr); default: every
        registered formula's target that exists in this build). Once until uninstall."""
        if cls._installed:
            return
        try:
            for op_name, (owner, attr) in (_default_targets() if target_ops is None else target_ops).items():
                original = getattr(owner, attr, None)
                if original is None:
                    logger.info("FLOPs target %s.%s is not in this build; not counted", owner, attr)
                    continue
                wrapper = cls._make_wrapper(op_name, original)
                setattr(owner, attr, wrapper)
                cls._original_funcs[op_name] = original
                cls._patched_targets[op_name] = (owner, attr)
                cls._extra_refs[op_name] = cls._rebind_aliases(original, wrapper, owner, attr)
        except Exception:
            cls._restore()
            raise
        cls._installed = bool(cls._patched_targets)

    @staticmethod
    def _rebind_aliases(original, wrapper, owner, attr) -> list:
        rebound = []
        for module in list(sys.modules.values()):
            if module is None or module is owner:
                continue
            try:
                if getattr(module, attr, None) is not original:
                    continue
                setattr(module, attr, wrapper)
            except Exception:  # noqa: BLE001  (lazy or read-only modules)
                continue
            rebound.append((module, attr))
        return rebound

    @classmethod
    def uninstall(cls) -> None:
        cls._restore()

    @classmethod
    def _restore(cls) -> None:
        for op_name, (owner, attr) in cls._patched_targets.items():
            original = cls._original_funcs[op_name]
            setattr(owner, attr, original)
            for module, name in cls._extra_refs.get(op_name, []):
                setattr(module, name, original)
        cls._original_funcs.clear()
        cls._patched_targets.clear()
        cls._extra_refs.clear()
        cls._installed = False

    @classmethod
    def is_installed(cls) -> bool:
        return cls._installed

    @classmethod
    def _make_wrapper(cls, op_name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if getattr(cls._local, "in_hook", False):
                return original(*args, **kwargs)
            cls._local.in_hook = True
            range_id = 0
            try:
                formula = get_flop_func(op_name)
                if formula is not None:
                    try:
                        flops = formula(*args, **kwargs)
                    except Exception:  # noqa: BLE001
                        logger.warning("Failed to calculate FLOPs for %s", op_name, exc_info=True)
                        flops = None
                    if flops is not None and flops >= 0:
                        range_id = mstx.range_start(f"{flops}-{op_name}", domain=_FLOPS_DOMAIN)
                return original(*args, **kwargs)
            finally:
                if isinstance(range_id, int) and range_id > 0:
                    mstx.range_end(range_id, domain=_FLOPS_DOMAIN)
                cls._local.in_hook = False

        return wrapper
