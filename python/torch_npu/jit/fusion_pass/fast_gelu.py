"""``aten::gelu(x, approximate='none')`` -> ``npu::fast_gelu(x)``."""
import torch

_GELU = """
    graph(%x):
        %approximate = prim::Constant[value='none']()
        %y = aten::gelu(%x, %approximate)
        return (%y)
"""
_FAST_GELU = """
    graph(%x):
        %y = npu::fast_gelu(%x)
        return (%y)
"""


def fast_gelu_pass(jit_mod):
    """Rewrites the exact GELUs of ``jit_mod`` (a TorchScript function or module, or a
    ``torch.Graph``) into torch_npu's ``npu::fast_gelu``, in place. The tanh-approximated GELU
    is left alone."""
    graph = jit_mod if isinstance(jit_mod, torch.Graph) else jit_mod.graph
    torch._C._jit_pass_custom_pattern_based_rewrite_graph(_GELU, _FAST_GELU, graph)
