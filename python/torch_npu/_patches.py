"""Every change torch_npu makes to ``torch`` beyond PyTorch's registration APIs.

PyTorch's PrivateUse1 registration (``rename_privateuse1_backend``,
``_register_device_module``, ``generate_methods_for_privateuse1_backend``) already
gives ``torch.npu``, ``Tensor.npu()``/``is_npu``, ``Module.npu()``,
``Storage.npu()``/``is_npu``, ``PackedSequence.npu()``, ``ProfilerActivity.NPU``
(2.13) and makes ``torch.autocast("npu")``, ``torch.amp.GradScaler("npu")``,
``torch.Stream("npu")``, ``torch.Event("npu")`` and ``torch.accelerator`` work.
What is left is listed in :data:`PATCHES`: each entry is a small function with a
docstring saying what it changes and why, applied once by :func:`apply` at import,
and each has a test in ``python/tests/test_import.py``.
"""

import sys
from typing import Callable, List

import torch

# Submodules of torch_npu.npu that must be reachable as torch.npu.<name>.
_NPU_SUBMODULES = ("utils", "streams", "memory", "random", "config", "amp",
                   "amp.autocast_mode", "amp.grad_scaler")


def _alias_torch_npu_submodules() -> None:
    """Register ``torch.npu.<sub>`` in ``sys.modules`` for every submodule of ``torch_npu.npu``.

    ``torch._register_device_module`` only maps ``torch.npu`` itself. Without the
    aliases, ``import torch.npu.amp`` (or ``from torch.npu.amp import autocast``) would
    import ``torch_npu/npu/amp`` a second time under another name, giving duplicate
    classes (``isinstance`` checks between the two copies fail).
    """
    import importlib

    for name in _NPU_SUBMODULES:
        module = importlib.import_module(f"torch_npu.npu.{name}")
        sys.modules.setdefault(f"torch.npu.{name}", module)


def _profiler_activity_npu() -> None:
    """Make ``torch.profiler.ProfilerActivity.NPU`` an alias of ``PrivateUse1``.

    ``rename_privateuse1_backend("npu")`` does it in torch 2.13+; this only fills it
    in for a torch that does not.
    """
    activity = torch._C._profiler.ProfilerActivity
    if not hasattr(activity, "NPU"):
        setattr(activity, "NPU", activity.PrivateUse1)


def _checkpoint_default_device() -> None:
    """Make ``torch.utils.checkpoint`` default to ``"npu"`` (as torch_npu does).

    Activation checkpointing stashes and restores the RNG state of the default device
    type when it cannot infer one from the inputs; with the stock ``"cuda"`` default,
    dropout inside checkpointed NPU regions would not be replayed identically.
    """
    from torch.utils.checkpoint import DefaultDeviceType

    DefaultDeviceType.set_device_type("npu")


#: The patches, in application order.
PATCHES: List[Callable[[], None]] = [
    _alias_torch_npu_submodules,
    _profiler_activity_npu,
    _checkpoint_default_device,
]

_applied = False


def apply() -> None:
    """Apply :data:`PATCHES` once per process."""
    global _applied
    if _applied:
        return
    for patch in PATCHES:
        patch()
    _applied = True
