"""Registry of FLOPs formulas for operators the profiler counts (torch_npu's ``_flops_registry``).

A formula takes the operator's arguments and returns its floating-point operations. It is
registered for an operator name with the function it applies to (``target``,
``"module:attr.path"``), either as torch_npu's default (``is_default=True``, the formulas of
``_flops_formulas``) or as the user's, which takes precedence over the default of the same
name (a second user registration of a name replaces the first, logged as an error). A user
formula without a target applies to the default's target.

    @register_npu_flop(target="my_pkg.ops:fused_mlp")
    def fused_mlp_flops(x, w1, w2, **kwargs):
        return 2 * x.numel() // x.shape[-1] * w1.shape[0] * w1.shape[1] * 2
"""
import logging
from collections.abc import Callable
from typing import Optional

__all__ = []

logger = logging.getLogger(__name__)

# op name -> (formula, target or None)
_default_npu_flop_registry: dict = {}
_npu_flop_registry: dict = {}


def _op_name(func: Callable, target: Optional[str], op_name: Optional[str]) -> str:
    if op_name is not None:
        return op_name
    if target is not None and ":" in target:
        return target.split(":", 1)[1]
    return func.__name__


def register_npu_flop(target: Optional[str] = None, op_name: Optional[str] = None, *, is_default: bool = False):
    """Decorator registering a FLOPs formula (see the module docstring); returns the formula."""
    def decorator(func: Callable) -> Callable:
        name = _op_name(func, target, op_name)
        if is_default:
            _default_npu_flop_registry[name] = (func, target)
        else:
            if name in _npu_flop_registry:
                logger.error("Duplicate external FLOPs registration for %s. The later registration takes "
                             "precedence.", name)
            _npu_flop_registry[name] = (func, target)
        return func

    return decorator


def get_flop_func(op_name: str) -> Optional[Callable]:
    """The formula counted for op_name: the user's, else the default, else None."""
    for registry in (_npu_flop_registry, _default_npu_flop_registry):
        if op_name in registry:
            return registry[op_name][0]
    return None


def get_npu_flop_targets() -> dict:
    """op name -> the target its formula applies to (the user's target where given)."""
    targets = {name: target for name, (_, target) in _default_npu_flop_registry.items() if target is not None}
    targets.update({name: target for name, (_, target) in _npu_flop_registry.items() if target is not None})
    return targets
