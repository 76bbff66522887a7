"""``torch.npu.npugraph_ex``: the ``npugraph_ex`` backend's Python API.

* :func:`compile_fx`: compile an (AOTAutograd) ATen FX graph as the ``npugraph_ex`` backend
  does -- the registered pattern replacements, then NPU graph capture and replay -- for
  custom backends (``aot_module_simplified(gm, inputs, fw_compiler=...)``).
* :func:`register_replacement`: add a pattern replacement (Inductor's
  ``register_replacement``) to the graphs the ``npugraph_ex`` backend and :func:`compile_fx`
  compile.
* :mod:`.inference`: ``cache_compile`` / ``readable_cache``, the compile cache on disk.
* :mod:`.scope`: ``limit_core_num`` / ``deterministic`` scopes.
"""
__all__ = ["compile_fx", "register_replacement"]

from collections.abc import Iterable
from typing import Any, Callable, Match, Union

try:
    from torch._inductor.pattern_matcher import fwd_only, SearchFn, ReplaceFn, TraceFn, PatternExpr
except ImportError:  # older torch
    from torch._inductor.pattern_matcher import inference_graph as fwd_only
    from torch._inductor.pattern_matcher import PatternExpr
    SearchFn = ReplaceFn = TraceFn = Callable[..., Any]

from . import inference
from . import scope


def compile_fx(gm, example_inputs=None, options=None):
    r"""Compile the ATen graph ``gm`` for the npu: the registered pattern replacements are
    applied, then the graph is captured into an NPU graph at its first call (per input
    signature) and replayed. ``options`` are the ``npugraph_ex`` backend's
    (``clone_input``, ``clone_outputs``). Returns the callable (boxed, as AOTAutograd calls
    compiled graphs, or with positional arguments)."""
    import torch

    from torch_npu.dynamo import graphs

    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"compile_fx(): gm must be a torch.fx.GraphModule, got {type(gm).__name__}")
    if example_inputs is not None and not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"compile_fx(): example_inputs must be a list or tuple, got {type(example_inputs).__name__}")
    options = graphs._check_options("npugraph_ex", options)
    graphs._prepare_graph(gm)
    return graphs._GraphRunner(gm.forward, (), options.get("clone_outputs", True), False,
                               clone_input=options.get("clone_input", True))


def _return_true(match: Match):
    return True


def register_replacement(search_fn: SearchFn, replace_fn: ReplaceFn, example_inputs: Iterable[Any],
                         trace_fn: TraceFn = fwd_only, extra_check: Callable[[Match], bool] = _return_true,
                         search_fn_pattern: Union[PatternExpr, None] = None,
                         scalar_workaround: Union[dict[str, Union[float, int]], None] = None,
                         skip_duplicates: bool = False):
    r"""Replace what ``search_fn`` computes with ``replace_fn`` in the graphs the
    ``npugraph_ex`` backend compiles (Inductor's ``register_replacement`` on the pass of
    that path; ``example_inputs`` trace both functions, ``extra_check(match)`` must accept a
    match). Returns what Inductor's ``register_replacement`` returns: the pattern added
    (false for a duplicate skipped with ``skip_duplicates``)."""
    from torch._inductor import pattern_matcher

    from . import _patterns

    if not callable(search_fn):
        raise TypeError("register_replacement(): search_fn must be callable")
    if not callable(replace_fn):
        raise TypeError("register_replacement(): replace_fn must be callable")
    if not callable(extra_check):
        raise TypeError("register_replacement(): extra_check must be callable")
    return pattern_matcher.register_replacement(
        search_fn, replace_fn, list(example_inputs), trace_fn, _patterns.pattern_pass(),
        extra_check=extra_check, scalar_workaround=scalar_workaround,
        search_fn_pattern=search_fn_pattern, skip_duplicates=skip_duplicates)
