"""``torch_npu.jit``: TorchScript graph rewrites onto npu fused operators.

``optimize(jit_mod)`` rewrites a traced or scripted function or module in place; see
:mod:`torch_npu.jit.register_fusion_pattern`.
"""
from .register_fusion_pattern import optimize

__all__ = ["optimize"]
