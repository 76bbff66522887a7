"""The fusion passes :func:`optimize` applies."""
import torch

from .fusion_pass.fast_gelu import fast_gelu_pass

__all__ = ["optimize"]

_PASSES = (fast_gelu_pass,)


def optimize(jit_mod):
    """Rewrites ``jit_mod`` (a ``torch.jit.ScriptFunction`` or ``ScriptModule``, e.g. from
    ``torch.jit.trace``) in place for npu inference: its graphs (a module's and its submodules'
    ``forward``) use torch_npu's fused operators, e.g. ``npu::fast_gelu`` for exact GELU. A
    module is switched to eval mode, as the rewrite targets inference. TorchScript keeps the
    execution plan of a graph after its first call, so optimize before running it (a saved and
    loaded copy runs the rewritten graph in any case)."""
    if isinstance(jit_mod, torch.jit.ScriptModule):
        jit_mod.eval()
        graphs = [m.graph for m in jit_mod.modules() if m._c._has_method("forward")]
    elif isinstance(jit_mod, torch.jit.ScriptFunction):
        graphs = [jit_mod.graph]
    else:
        raise TypeError("torch_npu.jit.optimize(): argument 'jit_mod' must be a torch.jit.ScriptModule or "
                        f"ScriptFunction (from torch.jit.trace / torch.jit.script), got {type(jit_mod).__name__}")
    for graph in graphs:
        for rewrite in _PASSES:
            rewrite(graph)
