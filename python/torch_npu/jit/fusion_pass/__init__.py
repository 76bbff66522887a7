"""Graph rewrites of :func:`torch_npu.jit.optimize`, one per module."""
__all__ = []
