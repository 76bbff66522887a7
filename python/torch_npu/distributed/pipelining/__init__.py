"""torch_npu's ``pipeline``: torch.distributed.pipelining.pipeline with a choice of tracer.

``mode=None`` or ``"export"`` is torch's pipeline (torch.export tracing). ``mode="fx"``
traces with torch.fx and keeps the modules named in ``atomic_units`` whole: each stays one
call inside one stage, and no split point can fall inside it. Either way the result is a
``torch.distributed.pipelining.Pipe``; ``pipe.build_stage(stage_index, device)`` gives the
stage to run with torch's pipeline schedules.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed.pipelining as _torch_pipelining

from ._fx_split import pipeline_fx as _pipeline_fx

__all__ = ["pipeline"]

_MODES = (None, "export", "fx")


def pipeline(
    module: torch.nn.Module,
    mb_args: tuple[Any, ...],
    mb_kwargs: Optional[dict[str, Any]] = None,
    split_spec=None,
    split_policy=None,
    mode: Optional[str] = None,
    atomic_units: Optional[list[str]] = None,
):
    """Split ``module`` into pipeline stages.

    Args:
        module: the model to split.
        mb_args: example positional inputs of one microbatch (a tuple).
        mb_kwargs: example keyword inputs of one microbatch.
        split_spec: ``{submodule name: SplitPoint.BEGINNING or SplitPoint.END}``, a stage
            boundary before or after each call of that submodule.
        split_policy: a function taking the traced ``torch.fx.GraphModule`` and returning it
            with split markers inserted (not together with ``split_spec``).
        mode: ``None`` or ``"export"`` (torch.export tracing, torch's pipeline) or ``"fx"``
            (torch.fx tracing). With ``"fx"``, tensor arguments of ``forward`` are the
            pipeline's inputs and non-tensor ones (``None``, flags) are fixed to their
            example values.
        atomic_units: with ``mode="fx"``, names of submodules never split nor traced into.

    Returns:
        A ``torch.distributed.pipelining.Pipe``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"pipeline: module must be a torch.nn.Module, got {type(module).__name__}")
    if mode not in _MODES:
        raise ValueError(f"pipeline: mode must be None, 'export' or 'fx', got {mode!r}")
    if atomic_units is not None and mode != "fx":
        raise ValueError(f"pipeline: atomic_units is only used with mode='fx' (mode={mode!r})")
    if split_spec is not None and split_policy is not None:
        raise ValueError("pipeline: give split_spec or split_policy, not both")
    if isinstance(mb_args, list):
        mb_args = tuple(mb_args)
    if not isinstance(mb_args, tuple):
        raise TypeError(f"pipeline: mb_args must be a tuple of example positional inputs, got "
                        f"{type(mb_args).__name__}")
    if mb_kwargs is not None and not isinstance(mb_kwargs, dict):
        raise TypeError(f"pipeline: mb_kwargs must be a dict or None, got {type(mb_kwargs).__name__}")
    if mode == "fx":
        return _pipeline_fx(module, mb_args, mb_kwargs or {}, split_spec, split_policy, atomic_units)
    return _torch_pipelining.pipeline(module, mb_args, mb_kwargs, split_spec=split_spec,
                                      split_policy=split_policy)


# Marks the variant with mode/atomic_units (torch's own pipeline has neither).
pipeline._torch_npu_pipelining_patch_applied = True
