"""Dynamo backends replaying NPU graphs: ``npugraph_ex`` and ``npugraphs``.

``torch.compile(model, backend="npugraph_ex")``: AOTAutograd splits the Dynamo graph
into forward and backward ATen graphs; each is captured into a
:class:`torch.npu.NPUGraph` at its first call and replayed afterwards, one graph per
input signature (shapes, strides, dtypes). As PyTorch's cudagraphs backends do, inputs
with fixed addresses (parameters, buffers) are used in place and the other inputs are
copied into static tensors the capture read; outputs are cloned (``clone_outputs``
option, default True) so that a later replay cannot overwrite what a caller holds.
With ``clone_input=False`` the graph reads the caller's tensors in place instead, captured
once per set of input addresses. Before capture, ``npugraph_ex`` applies the pattern
replacements of ``torch.npu.npugraph_ex.register_replacement`` and records the
``torch.npu.npugraph_ex.scope`` attributes on the nodes (``torch.npu.npugraph_ex``).

``npugraphs`` does the same with each graph compiled by Inductor first (the ``npu``
backend's code generation), like ``backend="cudagraphs"`` with ``triton.cudagraphs``:
the generated wrapper launches its C++ kernels on the stream
(``torch_npu._inductor.runtime``), so they are recorded with the extern kernels; ints and
floats they take by value are fixed at capture, as on CUDA graphs.

Graphs that read or produce tensors off the npu (CPU work cannot be captured; 0-dim CPU
scalars aside), or whose capture fails (an operation synchronises with the stream or
cannot be recorded, e.g. a data-dependent op or ``.item()`` of an npu tensor), run without
graph capture, with one warning. Both names are in ``torch_npu.dynamo.BACKENDS``
(Dynamo loads this module when one is first used).
"""
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

__all__ = ["npugraph_ex_backend", "npugraphs_backend"]

_OPTIONS = {"clone_input", "clone_outputs"}


def _check_options(backend: str, options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    options = dict(options or {})
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"backend {backend!r}: unknown option(s) {sorted(unknown)}; supported: {sorted(_OPTIONS)}")
    for key in ("clone_input", "clone_outputs"):
        if not isinstance(options.get(key, True), bool):
            raise TypeError(f"backend {backend!r}: option {key!r} must be a bool")
    return options


def _prepare_graph(gm: torch.fx.GraphModule) -> None:
    """The ``npugraph_ex`` passes on an ATen graph, in place: the pattern replacements of
    ``torch.npu.npugraph_ex.register_replacement``, and the attributes of the
    ``torch.npu.npugraph_ex.scope`` scopes recorded on the nodes they cover."""
    from torch_npu.npu.npugraph_ex import _patterns

    _patterns.apply(gm)
    if any(node.op == "call_function" and getattr(node.target, "namespace", None) == "npugraph_ex"
           for node in gm.graph.nodes):
        from torch_npu.npu.npugraph_ex.scope import _ops

        _ops.annotate(gm)


def _is_static(t) -> bool:
    """Parameters and buffers keep their address between calls (Dynamo marks them)."""
    return isinstance(t, torch.nn.Parameter) or getattr(t, "_dynamo_static_input_type", None) is not None


def _off_npu(gm: torch.fx.GraphModule) -> Optional[str]:
    """A node of ``gm`` producing a tensor that is not on the npu (0-dim CPU scalars aside)."""
    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else (vals,):
            if isinstance(v, torch.Tensor) and v.device.type != "npu" and not (v.device.type == "cpu" and v.dim() == 0):
                return f"{node.format_node()} is on {v.device}"
    return None


class _GraphRunner:
    """Boxed callable: captures ``fn`` per input signature, then replays the graph."""

    def __init__(self, fn: Callable, static_idxs: Sequence[int], clone_outputs: bool, boxed: bool,
                 clone_input: bool = True):
        # An instance attribute: wrappers (torch._dynamo.disable) copy the instance's __dict__.
        self._boxed_call = True
        self.fn = fn
        self.boxed = boxed  # fn takes the argument list (Inductor's compiled graphs) or *args
        self.static_idxs = set(static_idxs)
        self.clone_outputs = clone_outputs
        # False: the graph reads the caller's tensors where they are (one capture per set of
        # input addresses) instead of copies of them in static tensors.
        self.clone_input = clone_input
        self.entries: Dict[tuple, tuple] = {}
        self.uncapturable: Optional[str] = None  # why this graph runs without capture

    def _call(self, args: List[Any]):
        return self.fn(list(args)) if self.boxed else self.fn(*args)

    def _signature(self, args) -> tuple:
        return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) + (() if self.clone_input else (a.data_ptr(),))
                     if isinstance(a, torch.Tensor) else ("v", a) for a in args)

    def _capture(self, args: List[Any]):
        static = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and i not in self.static_idxs and self.clone_input:
                copy = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                copy.copy_(a)
                static.append(copy)
            else:
                static.append(a)
        # Warm up on the capture stream's side of things, then capture (nothing runs).
        stream = torch.npu.Stream()
        stream.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(stream):
            self._call(static)
        torch.npu.current_stream().wait_stream(stream)
        graph = torch.npu.NPUGraph()
        try:
            with torch.npu.graph(graph, stream=stream):
                outputs = self._call(static)
        except RuntimeError as e:
            # Something in the graph synchronises or cannot be recorded (the capture was
            # invalidated, nothing of it ran): run this graph as it is from now on.
            self.uncapturable = str(e).split("\n")[0]
            warnings.warn(f"NPU graph capture of a compiled graph failed; it runs without capture: "
                          f"{self.uncapturable}")
            return None
        return static, graph, outputs

    def __call__(self, *call_args):
        # Boxed (one list, which the callee clears) as AOTAutograd calls compiled graphs; its
        # backward wrapper may call unboxed (graph inputs are never lists).
        boxed = len(call_args) == 1 and isinstance(call_args[0], list)
        args = call_args[0] if boxed else list(call_args)
        if self.uncapturable or any(isinstance(a, torch.Tensor) and a.device.type != "npu" for a in args):
            return self._call(args)  # CPU inputs: nothing to capture
        key = self._signature(args)
        entry = self.entries.get(key)
        if entry is None:
            entry = self._capture(args)
            if entry is None:
                return self._call(args)
            self.entries[key] = entry
        static, graph, outputs = entry
        for i, (dst, src) in enumerate(zip(static, args)):
            if isinstance(dst, torch.Tensor) and i not in self.static_idxs and dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        if boxed:
            args.clear()  # the callee owns the argument list
        graph.replay()
        if isinstance(outputs, torch.Tensor):  # a graph returning one tensor (not an AOT graph)
            return outputs.clone() if self.clone_outputs else outputs
        if self.clone_outputs:
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]
        return list(outputs)


def _aot_backend(name: str, gm, example_inputs, options, compile_graph: Callable):
    """AOTAutograd with forward/backward compilers that wrap ``compile_graph(gm, inputs)``
    (returning ``(callable, boxed)``) into graph runners."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.cudagraphs import num_fw_fixed_arguments

    options = _check_options(name, options)
    clone = options.get("clone_outputs", True)
    clone_input = options.get("clone_input", True)
    reason = _off_npu(gm)
    if reason is not None:
        warnings.warn(f"backend {name!r}: running this graph without NPU graph capture: {reason}")
        return gm.forward
    dynamo_static = [i for i, x in enumerate(example_inputs) if _is_static(x)]

    def forward(aot_gm, aot_inputs):
        fixed = num_fw_fixed_arguments(len(example_inputs), len(aot_inputs))
        static = list(range(fixed)) + [fixed + i for i in dynamo_static]
        fn, boxed = compile_graph(aot_gm, aot_inputs, False)
        return _GraphRunner(fn, static, clone, boxed, clone_input)

    def backward(aot_gm, aot_inputs):
        fn, boxed = compile_graph(aot_gm, aot_inputs, True)
        return _GraphRunner(fn, (), clone, boxed, clone_input)

    return aot_autograd(fw_compiler=forward, bw_compiler=backward, inference_compiler=forward)(gm, example_inputs)


def npugraph_ex_backend(gm, example_inputs, options: Optional[Dict[str, Any]] = None):
    """``torch.compile(backend="npugraph_ex")``: the ATen graphs, captured and replayed."""
    def compile_graph(g, inputs, is_backward):
        _prepare_graph(g)
        return g.forward, False

    return _aot_backend("npugraph_ex", gm, example_inputs, options, compile_graph)


def npugraphs_backend(gm, example_inputs, options: Optional[Dict[str, Any]] = None):
    """``torch.compile(backend="npugraphs")``: Inductor-compiled graphs, captured and replayed."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table

    from torch_npu._inductor import register as register_inductor

    register_inductor()

    def compile_graph(g, inputs, is_backward):
        return compile_fx_inner(g, inputs, is_backward=is_backward), True

    from torch._dynamo.backends.common import aot_autograd  # noqa: F401  (decompositions below)

    with torch._inductor.config.patch({"triton.cudagraphs": False}):
        return _aot_backend_with_decomps("npugraphs", gm, example_inputs, options, compile_graph,
                                         select_decomp_table())


def _aot_backend_with_decomps(name, gm, example_inputs, options, compile_graph, decompositions):
    from torch._dynamo.backends import common

    original = common.aot_autograd

    def with_decomps(**kwargs):
        return original(decompositions=decompositions, **kwargs)

    common.aot_autograd = with_decomps
    try:
        return _aot_backend(name, gm, example_inputs, options, compile_graph)
    finally:
        common.aot_autograd = original
