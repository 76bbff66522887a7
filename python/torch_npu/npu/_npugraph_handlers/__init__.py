"""Operator handlers of NPU graph task updates (``torch.npu.graph(..., auto_dispatch_capture=True)``).

While a graph captures with ``auto_dispatch_capture=True``, each call of an operator that
has a handler is captured as a task group of its own; ``NPUGraph.update(cpu_update_input)``
then launches the operator again with the new host arguments (e.g. ``actual_seq_lengths``)
as the group's new tasks. :class:`NpuGraphOpHandler` says how (see npugraph_handler.py);
the built-in handlers (fused infer attention, paged attention, MLA) are registered here.
"""
from .npugraph_handler import NpuGraphOpHandler, register_npu_graph_handler
from . import attention_handlers  # noqa: F401  (registers the built-in handlers)

__all__ = ["NpuGraphOpHandler", "register_npu_graph_handler"]
