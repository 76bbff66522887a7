"""Compiles a Dynamo graph through IREE: AOTAutograd (ATen graphs, forward and backward)
-> torch-mlir's FX importer (bundled with iree-base-compiler) -> iree-compile (llvm-cpu,
host CPU) -> a .vmfb cached on disk -> run by iree.runtime on npu memory without copies
(see runtime.py).

Static and symbolic (dynamic) shapes: one module per graph serves all sizes. A graph IREE
cannot take (an op the importer or the compiler rejects, in the forward or the backward)
is compiled by the default backend instead, after one warning.
"""
import functools
import hashlib
import logging
import operator
import os
import platform
import re
import tempfile
import warnings

import torch

from . import runtime

log = logging.getLogger(__name__)

TARGET_BACKEND = "llvm-cpu"
# target-cpu=host makes the code non-portable, hence the CPU in the cache key. No data
# tiling (--iree-opt-data-tiling): weights are function arguments, so the packed layouts it
# gives matmuls would be recomputed from the weights on every call (an "__encoding" dispatch
# copying each weight matrix); IREE's plain tiled matmuls are faster here than that.
# Aggressive fusion puts a LayerNorm's two reductions and its elementwise epilogue into one
# dispatch (with _layer_norm below): one barrier and worker hand-off fewer per norm.
# -O2: iree-compile's default is -O0, which (among others) keeps floating-point reductions
# in source order: each row sum of a LayerNorm became a chain of scalar adds (latency-bound,
# ~1.35x the CPU time of the whole [2048, 1024] LayerNorm + GELU block). -O2 reassociates
# them into vector partial sums, as ATen's own reductions do.
COMPILE_FLAGS = (
    "--iree-llvmcpu-target-cpu=host",
    "--iree-opt-level=O2",
    "--iree-dispatch-creation-enable-aggressive-fusion",
)
# Calling convention of the compiled main() (part of the cache key): inputs, then output
# buffers the results are written into.
_ABI = "main(inputs, output buffers), graph(inputs) -> results; sizes as i64; v3"
# Extra iree-compile flags for experiments and tests (e.g. dumping dispatch sources).
EXTRA_FLAGS_ENV = "TORCH_NPU_MLIR_EXTRA_FLAGS"
# ATen ops kept out of the compiled code, as in Huawei's torch_npu: a comma-separated list
# ("aten.div,aten.add.Tensor": a packet names all its overloads), or "allfallback" (every op).
# Listed ops run as ATen calls on npu; the rest of the graph is compiled by IREE in pieces.
FALLBACK_LIST_ENV = "NPU_INDUCTOR_FALLBACK_LIST"
# Matmuls of at least this many multiply-adds (M*N*K, times the batch) run in torch_npu's
# op library, as Inductor's extern kernels and XLA:CPU's runtime calls do: IREE 3.13's
# llvm-cpu matmuls took 2-3x the op library's (MKL) time from 64x1024x256 up, ~1.15x even
# with operands pre-packed for its mmt4d ukernel (docs/BENCHMARKS.md). Smaller ones stay in
# IREE, fused with their epilogues. The environment variable overrides the default.
LIBRARY_MATMUL_ENV = "TORCH_NPU_MLIR_LIBRARY_MATMUL_MIN_MACS"
LIBRARY_MATMUL_MIN_MACS = 1 << 20

# Counters the tests and benchmarks read: graphs compiled by iree-compile, loaded from the
# disk cache, and sent to the default backend.
stats = {"compiled": 0, "cache_hits": 0, "fallbacks": 0}


class Unsupported(RuntimeError):
    """The graph cannot go through IREE (raised before trying the compiler)."""


def compile_graph(gm: torch.fx.GraphModule, example_inputs, config_patches=None):
    """torch.compile's Inductor entry with npu_backend="mlir": returns the compiled callable."""
    fallback_ops()  # a bad setting is the user's error, not a reason to fall back
    library_matmul_min_macs()
    try:
        return _compile_through_iree(gm, example_inputs)
    except Exception as err:  # noqa: BLE001 — any rejection means: use the default backend
        stats["fallbacks"] += 1
        warnings.warn(
            f"torch_npu: the MLIR backend (IREE) cannot compile this graph ({_reason(err)}); "
            f"falling back to the default backend (Inductor)", RuntimeWarning, stacklevel=2)
        log.debug("MLIR backend failure", exc_info=True)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches=config_patches)


def _reason(err: Exception) -> str:
    """One line saying why: iree-compile's first "error:" diagnostic, else the message."""
    op = re.search(r'failed to legalize operation .*?name = "torch\.([^"]+)"', str(err))
    if op:  # an ATen op torch-mlir has no lowering for
        return f"{type(err).__name__}: no lowering for the operator {op.group(1)}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    first_error = next((line for line in lines if "error:" in line), lines[0] if lines else "")
    if "error:" in first_error:  # drop the "<stdin>:8:10: " location prefix
        first_error = first_error[first_error.index("error:"):]
    return f"{type(err).__name__}: {first_error[:400]}"


def _compile_through_iree(gm, example_inputs):
    for i, x in enumerate(example_inputs):
        if not isinstance(x, (torch.Tensor, torch.SymInt, int)):
            raise Unsupported(f"input {i} is a {type(x).__name__}, not a tensor or an integer size")
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import aot_module_simplified

    gm = _math_attention(gm)
    # The backward is compiled now, while tracing, not at its first call (AOTAutograd's
    # default): an IREE failure on it then surfaces here, and the whole graph falls back.
    with functorch_config.patch(force_non_lazy_backward_lowering=True):
        return aot_module_simplified(gm, example_inputs, fw_compiler=_compile_listed, bw_compiler=_compile_listed,
                                     decompositions=_decompositions())


def _compile_listed(gm: torch.fx.GraphModule, example_inputs):
    """_compile_aten, and the graph as it runs — ATen calls and the IREE-compiled kernels
    (``mlir_fused_<ops>_<n>``, as Inductor names its fused kernels) — given to Inductor's
    output-code hook (``torch._inductor.utils.run_and_get_code``, ``TORCH_LOGS=output_code``)."""
    listing = []
    compiled = _compile_aten(gm, example_inputs, listing)
    from torch._inductor.graph import GraphLowering, output_code_log

    code = "# torch_npu MLIR backend (IREE)\n" + "\n".join(listing)
    if GraphLowering.save_output_code is not None:
        GraphLowering.save_output_code(code)
    output_code_log.debug("Output code: \n%s", code)
    return compiled


def _kernel_name(gm: torch.fx.GraphModule, index: int) -> str:
    """``mlir_fused_<the graph's first ops>_<index>``."""
    ops = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            name = getattr(n.target, "__name__", str(n.target)).split(".")[0]
            if name not in ops:
                ops.append(name)
    return "_".join(["mlir_fused"] + ops[:4] + [str(index)])


def _sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]


def _math_attention(gm):
    """A copy of the graph whose F.scaled_dot_product_attention calls use the math kernel.

    On npu tensors, SDPA dispatches to the PrivateUse1 fused-attention op, which torch-mlir
    cannot lower (nor its backward); the math form traces to matmuls and a softmax, which
    IREE fuses. The caller's graph is left alone (the fallback compiles it as it was).
    """
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not any(n.op == "call_function" and n.target is sdpa for n in gm.graph.nodes):
        return gm
    import copy

    rewritten = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for n in rewritten.graph.nodes:
        if n.op == "call_function" and n.target is sdpa:
            n.target = _sdpa_math
    rewritten.recompile()
    return rewritten


_DECOMPOSITIONS = None


def _decompositions():
    """ATen ops decomposed before import: those torch-mlir has no lowering for (mostly
    backward ops) and a few whose decomposition lets IREE fuse more. Deliberately not the
    whole core-ATen table: building that costs ~1 s per process, and torch-mlir lowers
    composite ops such as gelu or native_layer_norm directly."""
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        from torch._decomp import get_decompositions

        aten = torch.ops.aten
        _DECOMPOSITIONS = get_decompositions([
            aten.native_layer_norm_backward, aten.native_group_norm_backward, aten.gelu_backward,
            aten.embedding_dense_backward, aten.slice_backward, aten.select_backward,
            aten._safe_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data, aten.sigmoid_backward,
            aten.tanh_backward, aten.threshold_backward, aten.silu_backward,
            aten.native_dropout_backward, aten.native_batch_norm_backward,
            aten._native_batch_norm_legit_functional,
            aten.native_group_norm, aten.t, aten.addmm, aten.split.Tensor, aten.split_with_sizes,
            aten.unsafe_split.Tensor, aten.squeeze.dims, aten.masked_fill.Scalar, aten.masked_fill.Tensor,
            aten.full, aten._to_copy, aten.lift_fresh_copy, aten._unsafe_index.Tensor,
            aten._scaled_dot_product_flash_attention_for_cpu, aten.nll_loss_forward, aten.nll_loss_backward,
            # erf(x * M_SQRT1_2): torch-mlir's own lowering divides by sqrt(2) per element
            aten.gelu,
        ])
        # PyTorch's own decomposition of this one calls the mutating _native_batch_norm_legit.
        _DECOMPOSITIONS[aten._native_batch_norm_legit_no_training.default] = _batch_norm_inference
        _DECOMPOSITIONS[aten.native_layer_norm.default] = _layer_norm
    return _DECOMPOSITIONS


def _layer_norm(x, normalized_shape, weight, bias, eps):
    """native_layer_norm as two reductions IREE fuses without a stored intermediate.

    torch-mlir's lowering (and PyTorch's decomposition) use ``x - mean`` twice, for the
    variance and for the output; IREE then computes it once, in the mean's dispatch, and
    writes it to memory for the second dispatch to read: one more pass over an input-sized
    tensor. Here the variance squares ``mean - x`` (not CSE'd with ``x - mean``), so each
    difference has one use and is fused into its consumer: the same two-pass arithmetic,
    ~25% less time on a [2048, 1024] LayerNorm + GELU block. Outputs as ATen's: y, and mean
    and rstd with the normalized dimensions kept as size 1 (in the input's dtype, as on cpu).
    """
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    mean = xc.mean(dims, keepdim=True)
    deviation = mean - xc
    rstd = torch.rsqrt((deviation * deviation).mean(dims, keepdim=True) + eps)
    y = (xc - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def _batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """BatchNorm in eval mode from the running statistics (outputs as ATen's: y, and empty
    saved mean and rstd)."""
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - running_mean.view(shape)) * torch.rsqrt(running_var.view(shape) + eps)
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    empty = x.new_empty((0,))
    return y, empty, empty


def _compile_aten(gm: torch.fx.GraphModule, example_inputs, listing=None):
    """An ATen graph (functional; static or symbolic shapes) -> a boxed callable running it
    with IREE. Symbolic sizes become dynamic dimensions (``!torch.vtensor<[?,64],f32>``) and
    integer inputs (the sizes AOTAutograd passes, e.g. ``s0``) i64 arguments: one module
    serves all sizes. ``listing`` (a list) gets the code of the graph as it runs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        if not isinstance(n.meta.get("val"), (torch.Tensor, torch.SymInt, int)):
            raise Unsupported(f"graph input {n.name} is a {type(n.meta.get('val')).__name__}, "
                              f"not a tensor or an integer size")
    in_library = _library_nodes(gm)
    if in_library:
        return _compile_around(gm, in_library, listing)
    if listing is not None:
        listing.append(f"# {_kernel_name(gm, 0)}: the whole graph, one IREE module\n{gm.code.strip()}")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    _devices_to_cpu(gm)
    plan = _split_outputs(gm, placeholders)
    with unset_fake_temporarily():  # AOTAutograd calls us in fake mode; constants are real
        vmfb = _vmfb_for(gm, placeholders)
    module = runtime.load(vmfb, runtime.driver_for(_work(gm, plan.results)))
    return runtime.make_callable(module, plan)


def _hint(n):
    """An int, or a SymInt at its hint; None without a hint."""
    if isinstance(n, torch.SymInt):
        return n.node.hint if n.node.has_hint() else None
    return int(n)


def _work(gm, results):
    """What the graph computes, for the choice of IREE driver: its results' elements plus its
    matmuls' multiply-adds (symbolic sizes at their hints); None if unknown (a convolution,
    a size without a hint)."""
    total = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _MATMULS:
            total += _macs(n)
        elif n.op == "call_function" and n.target in _CONVOLUTIONS:
            return None
    for r in results:
        elements = _hint(r.numel())
        if elements is None:
            return None
        total += elements
    return total


def fallback_ops():
    """The ops of NPU_INDUCTOR_FALLBACK_LIST (read at compile time): None if unset, "all",
    or a frozenset of OpOverloadPackets and OpOverloads."""
    return _parse_fallback_list(os.environ.get(FALLBACK_LIST_ENV, "").strip())


@functools.lru_cache(None)
def _parse_fallback_list(value: str):
    """fallback_ops() of one value (parsed once: Inductor asks for every node it lowers)."""
    if not value:
        return None
    if value == "allfallback":
        return "all"
    ops = set()
    for name in filter(None, (part.strip() for part in value.split(","))):
        parts = name.split(".")
        op = None
        if len(parts) in (2, 3) and hasattr(torch.ops, parts[0]):
            namespace = getattr(torch.ops, parts[0])
            try:
                op = getattr(namespace, parts[1])
                if len(parts) == 3:
                    op = getattr(op, parts[2])
            except (AttributeError, RuntimeError):
                op = None
        if op is None:
            raise ValueError(f"{FALLBACK_LIST_ENV}: cannot resolve the operator {name!r}: expected names "
                             f"such as 'aten.div' or 'aten.add.Tensor', separated by commas, or 'allfallback'")
        ops.add(op)
    return frozenset(ops)


def is_listed(target, listed) -> bool:
    """Whether operator ``target`` is among ``listed`` (what fallback_ops() returns)."""
    if listed is None or not isinstance(target, torch._ops.OpOverload):
        return False
    return listed == "all" or target in listed or target.overloadpacket in listed


def _is_listed(node, listed) -> bool:
    return node.op == "call_function" and is_listed(node.target, listed)


def library_matmul_min_macs() -> int:
    """TORCH_NPU_MLIR_LIBRARY_MATMUL_MIN_MACS (read at compile time), else the default."""
    value = os.environ.get(LIBRARY_MATMUL_ENV, "").strip()
    if not value:
        return LIBRARY_MATMUL_MIN_MACS
    try:
        macs = int(value)
    except ValueError:
        macs = -1
    if macs < 0:
        raise ValueError(f"{LIBRARY_MATMUL_ENV}: expected a number of multiply-adds (an integer >= 0; "
                         f"0 sends every matmul to the op library), got {value!r}")
    return macs


_MATMULS = {  # op -> indices of its two matrix (or batch of matrices) operands
    torch.ops.aten.mm.default: (0, 1), torch.ops.aten.bmm.default: (0, 1),
    torch.ops.aten.addmm.default: (1, 2), torch.ops.aten.baddbmm.default: (1, 2),
}
_CONVOLUTIONS = {torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default}
# Ops that only re-view their input: kept next to a library matmul they feed, so that a
# transposed weight reaches it as a view, not as a copy IREE made.
_VIEWS = {torch.ops.aten.permute.default, torch.ops.aten.t.default, torch.ops.aten.transpose.int,
          torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.expand.default,
          torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim, torch.ops.aten.alias.default}


def _macs(node) -> int:
    """Multiply-adds of a matmul node (symbolic sizes at their hints)."""
    a, b = (node.args[i].meta.get("val") for i in _MATMULS[node.target])
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return 0
    macs = 1
    for d in (*a.shape, b.shape[-1]):
        d = _hint(d)
        if d is None:
            return 1 << 62  # unknown: assume large
        macs *= d
    return macs


def _library_nodes(gm) -> set:
    """The nodes that run as ATen calls on npu (torch_npu's op library) instead of in IREE:
    those NPU_INDUCTOR_FALLBACK_LIST names, matmuls from library_matmul_min_macs() up, and
    views whose every user is one of them."""
    listed = fallback_ops()
    min_macs = library_matmul_min_macs()
    chosen = set()
    for n in gm.graph.nodes:
        if listed is not None and _is_listed(n, listed):
            chosen.add(n)
        elif n.op == "call_function" and n.target in _MATMULS and _macs(n) >= min_macs:
            chosen.add(n)
    if chosen:
        for n in reversed(gm.graph.nodes):
            if n.op == "call_function" and n.target in _VIEWS and n.users and all(u in chosen for u in n.users):
                chosen.add(n)
    return chosen


def _compile_around(gm, in_library: set, listing=None):
    """The graph with the ``in_library`` nodes run as ATen calls and each maximal group of
    other ops compiled by IREE (torch.fx's capability-based partitioner); the rest runs as Python."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            if node.op != "call_function" or node in in_library:
                return False
            if node.target is operator.getitem:  # an element of a supported op's result
                return self.is_node_supported(submodules, node.args[0])
            return True

    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    if partitions:
        gm = partitioner.fuse_partitions(partitions, prefix="iree_piece_")
        pieces = [n for n in gm.graph.nodes if n.op == "call_module" and n.target.startswith("iree_piece_")]
        for index, n in enumerate(pieces):
            piece = getattr(gm, n.target)
            out = next(o for o in piece.graph.nodes if o.op == "output")
            single = not isinstance(out.args[0], (tuple, list))
            delattr(gm, n.target)
            n.target = _kernel_name(piece, index)
            if listing is not None:
                listing.append(f"# {n.target}: one IREE module\n{piece.code.strip()}")
            setattr(gm, n.target, _Piece(_compile_aten(piece, None), single))
        gm.recompile()
    if listing is not None:
        listing.append(f"# the graph: ATen calls on npu and the IREE modules above\n{gm.code.strip()}")
    return make_boxed_func(gm)


class _Piece(torch.nn.Module):
    """An IREE-compiled piece of a partitioned graph, called like the submodule it replaces."""

    def __init__(self, run, single: bool):
        super().__init__()
        self.run, self.single = run, single

    def forward(self, *args):
        outputs = self.run(list(args))
        return outputs[0] if self.single else tuple(outputs)


def _size_expr(d):
    """An int, or the sympy expression of a symbolic size."""
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else expr
    return int(d)


def _symbol_sources(placeholders):
    """{symbol: (input index, dim)} for each symbol that is a size of a tensor input, or
    (input index, None) for an integer input: where a call's value of the symbol is read."""
    import sympy

    sources = {}
    for i, n in enumerate(placeholders):
        v = n.meta["val"]
        dims = [(None, v)] if isinstance(v, torch.SymInt) else (
            list(enumerate(v.shape)) if isinstance(v, torch.Tensor) else [])
        for d, size in dims:
            expr = _size_expr(size)
            if isinstance(expr, sympy.Symbol) and expr not in sources:
                sources[expr] = (i, d)
    return sources


def _devices_to_cpu(gm) -> None:
    """Factory ops (ones, scalar_tensor, ...) name the npu device; to IREE all memory is
    host memory, and torch-mlir only lowers those ops for devices it knows (cpu)."""
    from torch.utils._pytree import tree_map

    def to_cpu(a):
        return torch.device("cpu") if isinstance(a, torch.device) and a.type == "npu" else a

    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.args = tree_map(to_cpu, n.args)
            n.kwargs = tree_map(to_cpu, n.kwargs)


def _split_outputs(gm, placeholders):
    """Keep only outputs IREE computes; others are returned by Python (runtime.OutputPlan).

    AOTAutograd graphs return a flat tuple whose entries may be None (no gradient), a graph
    input returned as is, a repeated value, or an integer (with dynamic shapes, a training
    forward returns the sizes its backward needs); IREE's ABI wants distinct computed tensors.
    """
    graph = gm.graph
    out_node = next(n for n in graph.nodes if n.op == "output")
    values = out_node.args[0]
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    computed = []  # distinct fx nodes IREE returns
    sizes = []     # integer outputs, as ints or sympy expressions
    sources = []   # per output: ("none",), ("input", i), ("result", j), ("size", k)
    for v in values:
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
        if v is None:
            sources.append(("none",))
        elif isinstance(v, torch.fx.Node) and v.op == "placeholder":
            sources.append(("input", placeholders.index(v)))
        elif isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            sources.append(("size", len(sizes)))
            sizes.append(_size_expr(val))
        elif not isinstance(v, torch.fx.Node) or not isinstance(val, torch.Tensor):
            raise Unsupported(f"graph output {v} is not a tensor")
        else:
            if v not in computed:
                computed.append(v)
            sources.append(("result", computed.index(v)))
    out_node.args = (tuple(computed),)
    graph.eliminate_dead_code()  # the integer outputs' computations, now unused
    graph.lint()
    gm.recompile()
    results = [n.meta["val"] for n in computed]
    shapes = runtime.ResultShapes([[_size_expr(d) for d in r.shape] for r in results], sizes,
                                  _symbol_sources(placeholders))
    return runtime.OutputPlan(sources, results, shapes)


def _graph_key(gm, placeholders) -> str:
    """Everything the compiled module depends on: graph, input types, constants, compiler."""
    h = hashlib.sha256()
    h.update(gm.code.encode())
    for n in placeholders:  # types, with symbolic sizes by name ("s0"): same symbols, same dims
        v = n.meta["val"]
        if isinstance(v, torch.Tensor):
            h.update(f"{n.name}:{v.dtype}:{[str(_size_expr(d)) for d in v.shape]};".encode())
        else:
            h.update(f"{n.name}:int:{_size_expr(v)};".encode())
    for n in gm.graph.nodes:  # constants the graph holds (get_attr): their bytes matter
        if n.op == "get_attr":
            t = getattr(gm, n.target)
            if isinstance(t, torch.Tensor):
                h.update(f"{n.target}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    h.update(repr((_ABI, TARGET_BACKEND, _compile_flags(), _host_cpu(), torch.__version__,
                   _iree_version())).encode())
    return h.hexdigest()[:40]


def _iree_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iree-base-compiler") + "/" + version("iree-base-runtime")
    except PackageNotFoundError:
        return "unknown"


def _host_cpu() -> str:
    """target-cpu=host output is not portable: key on the CPU model and its features."""
    model, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model + "|" + hashlib.sha256(flags.encode()).hexdigest()[:16]


def _compile_flags():
    extra = os.environ.get(EXTRA_FLAGS_ENV, "").split()
    return list(COMPILE_FLAGS) + extra


def cache_dir() -> str:
    """<TORCHINDUCTOR_CACHE_DIR or Inductor's default>/npu_mlir."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    path = os.path.join(inductor_cache_dir(), "npu_mlir")
    os.makedirs(path, exist_ok=True)
    return path


def _vmfb_for(gm, placeholders) -> str:
    """Path of the compiled module: from the disk cache, or compiled now and stored."""
    path = os.path.join(cache_dir(), _graph_key(gm, placeholders) + ".vmfb")
    rejected = path[:-len(".vmfb")] + ".rejected"
    if os.path.exists(path):
        stats["cache_hits"] += 1
        log.debug("MLIR backend: cache hit %s", path)
        return path
    if os.path.exists(rejected):  # IREE failed on this graph before: don't pay again
        with open(rejected) as f:
            raise Unsupported(f.read())
    mlir = _import_mlir(gm)
    try:
        vmfb = _iree_compile(mlir)
    except Exception as err:
        import iree.compiler

        if isinstance(err, iree.compiler.CompilerToolError):  # the graph's fault, not ours
            _write_atomically(rejected, _reason(err).encode())
        raise
    _write_atomically(path, vmfb)
    stats["compiled"] += 1
    return path


def _write_atomically(path: str, data: bytes) -> None:
    """A concurrent process never sees a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _import_mlir(gm) -> str:
    """The torch-dialect MLIR of an ATen graph (constants become literals), called as
    ``main(inputs..., outputs...)``: the graph's results are written into caller-provided
    buffers (``torch.overwrite.tensor.contents`` into mutable ``!torch.tensor`` arguments,
    which IREE turns into result storage), so they can be npu memory and need no copy.
    """
    from iree.compiler import ir
    from iree.compiler.extras.fx_importer import FxImporter

    importer = FxImporter()
    # "graph" stays public: an entry that returns IREE-allocated results, for the rare
    # graph whose results IREE cannot write into imported buffers (runtime.make_callable).
    if _set_symbol_ranges(importer, gm):
        try:
            importer.import_graph_module(gm, func_name="graph", import_symbolic_shape_expressions=True)
        except NotImplementedError:  # a size with no affine form (FloorDiv: pooling, strides)
            log.debug("MLIR backend: importing without symbolic size expressions", exc_info=True)
            importer = FxImporter()
            importer.import_graph_module(gm, func_name="graph")
    else:
        importer.import_graph_module(gm, func_name="graph")
    module = importer.module_op
    graph_func = next(op for op in module.regions[0].blocks[0].operations
                      if op.operation.name == "func.func"
                      and ir.StringAttr(op.attributes["sym_name"]).value == "graph")
    ftype = ir.FunctionType(ir.TypeAttr(graph_func.attributes["function_type"]).value)
    ins, outs = [str(t) for t in ftype.inputs], [str(t) for t in ftype.results]
    storage = [t.replace("!torch.vtensor<", "!torch.tensor<", 1) for t in outs]
    params = [f"%in{i}: {t}" for i, t in enumerate(ins)] + [f"%out{j}: {t}" for j, t in enumerate(storage)]
    lines = [f"  func.func @main({', '.join(params)}) {{"]
    call = f"call @graph({', '.join(f'%in{i}' for i in range(len(ins)))}) : ({', '.join(ins)}) -> ({', '.join(outs)})"
    if outs:
        lines.append(f"    %r:{len(outs)} = {call}" if len(outs) > 1 else f"    %r = {call}")
    for j, (value_type, storage_type) in enumerate(zip(outs, storage)):
        result = f"%r#{j}" if len(outs) > 1 else "%r"
        lines.append(f"    torch.overwrite.tensor.contents {result} overwrites %out{j} : {value_type}, {storage_type}")
    lines += ["    return", "  }"]
    text = str(module)
    # The module's closing brace, before the "{-# dialect_resources ... #-}" of literals.
    end = text.rfind("}", 0, text.find("\n{-#") if "\n{-#" in text else len(text))
    return text[:end] + "\n".join(lines) + "\n" + text[end:]


def _set_symbol_ranges(importer, gm) -> bool:
    """Give the importer the graph's size symbols and their ranges, if it has any.

    With them it emits ``torch.symbolic_int`` (a symbol with its range) and
    ``torch.bind_symbolic_shape`` (a value's sizes as affine expressions of the symbols):
    IREE then knows which dynamic dimensions are equal (e.g. both operands of an add have
    ``s0`` rows) instead of checking or broadcasting at run time. ``import_frozen_program``
    reads the ranges from an ExportedProgram; for a graph module they come from the
    ShapeEnv that traced it.
    """
    import sympy
    from iree.compiler.extras.fx_importer import RangeConstraint

    symbols, shape_env = set(), None
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        for d in (v.shape if isinstance(v, torch.Tensor) else [v] if isinstance(v, torch.SymInt) else []):
            if isinstance(d, torch.SymInt):
                symbols |= d.node.expr.free_symbols
                shape_env = d.node.shape_env
    if not symbols:
        return False
    int64 = torch.iinfo(torch.int64)

    def bound(value, default):
        return int(value) if isinstance(value, (int, sympy.Integer)) else default  # (int_oo: unbounded)

    ranges = {}
    for sym in sorted(symbols, key=str):
        r = shape_env.var_to_range.get(sym)
        ranges[str(sym)] = RangeConstraint(bound(r.lower, int64.min) if r else int64.min,
                                           bound(r.upper, int64.max) if r else int64.max)
    importer._cc._symbolic_guards = ranges  # (what set_symbolic_guards fills from a program)
    return True


def _iree_compile(mlir: str) -> bytes:
    import iree.compiler

    return iree.compiler.compile_str(mlir, target_backends=[TARGET_BACKEND], input_type="torch",
                                     extra_args=_compile_flags())
