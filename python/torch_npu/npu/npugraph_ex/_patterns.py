"""The pattern replacements of the ``npugraph_ex`` compile path.

:func:`torch_npu.npu.npugraph_ex.register_replacement` adds a replacement to :data:`PASS`
(an Inductor ``PatternMatcherPass``); :func:`apply` runs it on each ATen graph the
``npugraph_ex`` backend and :func:`~torch_npu.npu.npugraph_ex.compile_fx` compile, before
the graph is captured into an NPU graph.
"""
import torch

_PASS = None


def pattern_pass():
    global _PASS
    if _PASS is None:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        _PASS = PatternMatcherPass(pass_name="npugraph_ex_replacements")
    return _PASS


def apply(gm: torch.fx.GraphModule) -> int:
    """Replace the registered patterns in ``gm`` (in place); the number of replacements."""
    if _PASS is None or not _PASS.patterns:
        return 0
    count = _PASS.apply(gm.graph)
    if count:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return count
