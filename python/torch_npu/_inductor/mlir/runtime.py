"""Runs compiled IREE modules on npu tensors.

Inputs and weights go to IREE without copies: an npu tensor cannot export DLPack
(``__dlpack_device__`` does not know "npu"), so each one is handed over as a zero-copy CPU
alias of its npu memory (``torch_npu._C._npu_cpuAlias``; npu memory is host memory in the
simulator), whose DLPack capsule IREE imports as a buffer over the same bytes.

Results are not copied either: the compiled ``main`` takes one buffer per result after
its inputs (see compiler._import_mlir), so the results are written straight into npu
tensors allocated here (their CPU aliases again). CPU tensors (a graph compiled for cpu)
are passed as they are. Exception: IREE cannot write a result that is a pure constant
into an imported buffer; such a graph uses the returning entry and copies its results.
With dynamic shapes the result buffers' shapes are computed per call from the inputs'
sizes (ResultShapes), and integer inputs (symbolic sizes) are passed as i64 values.

Ordering: IREE runs on its own threads, outside the npu stream's task queue, so before
it reads npu memory the current stream is queried and, if it has pending work,
synchronized (work queued there may still be producing the inputs). The results are
complete when the call returns.
"""
import atexit
import threading
import weakref
from typing import List, NamedTuple, Sequence

import torch

_lock = threading.Lock()
_instance = None  # the VmInstance, created on first use
_devices = {}  # driver name -> (HalDevice, hal VmModule), created on first use
_DLPACK_CPU = 1  # kDLCPU

# Graphs whose work (result elements plus matmul multiply-adds, compiler._work) is at most
# this run on IREE's local-sync driver, on the calling thread; larger ones on local-task's
# worker threads. Waking the workers costs more than it saves on small graphs: bias + GELU on
# [64, 4096] took 0.25 ms on the caller's thread against 0.32-0.42 ms with two workers
# ([64, 16]: 0.07 against 0.20-0.28 ms); at [128, 4096] the two were even, at [2048, 1024] the
# workers took 1.6-1.9 ms against 2.4-2.8. The small pieces between library matmuls (the
# MLP's bias + GELU) are such graphs.
SMALL_GRAPH_ELEMENTS = 1 << 18


def _runtime(driver: str):
    """(VmInstance, HalDevice, hal VmModule) of ``driver`` ("local-task" or "local-sync")."""
    global _instance
    with _lock:
        if driver not in _devices:
            import iree.runtime as rt

            if _instance is None:
                # IREE's default topology: one worker per physical core, pinned to it. Unpinned
                # workers (--task_topology_group_count) were slower: the [2048, 1024] LayerNorm
                # block took 2.4-2.8 ms at best instead of 1.2-1.5 ms, and no less in the median
                # under load; probably a woken worker starts on its waker's core (wake-affine
                # placement), so a short dispatch often ran both workers on one core. Pinned
                # workers still share their cores; IREE's work stealing lets the other one
                # take a busy worker's tiles. At most
                # torch.get_num_threads() workers (as the npu stream workers follow
                # torch.set_num_threads), read once, when the first module is loaded: ranks
                # sharing a host each get their share of its cores.
                rt.flags.parse_flags(f"--task_topology_max_group_count={max(1, torch.get_num_threads())}")
                _instance = rt.VmInstance()
            device = rt.get_device(driver)  # as rt.Config does (create_device_by_uri)
            _devices[driver] = (device, rt.create_hal_module(_instance, device))
        return (_instance, *_devices[driver])


def driver_for(work) -> str:
    """The IREE driver for a graph of ``work`` elements (compiler._work; None: unknown)."""
    small = work is not None and work <= SMALL_GRAPH_ELEMENTS
    return "local-sync" if small else "local-task"


class Module:
    """A loaded .vmfb: its VmContext, its two entry points and the HalDevice it runs on."""

    __slots__ = ("context", "function", "returning", "device", "__weakref__")

    def __init__(self, context, function, returning, device):
        self.context = context      # iree VmContext
        self.function = function    # VmFunction "main": results written into buffers passed after the inputs
        self.returning = returning  # VmFunction "graph": the same computation, returning its results
        self.device = device        # HalDevice

    def released(self) -> bool:
        return self.context is None


# Every loaded module, to release its IREE objects at interpreter exit (below).
_loaded = weakref.WeakSet()


@atexit.register
def _release_at_exit():
    """Drop every IREE object torch_npu holds while the interpreter is still whole.

    Compiled graphs live in Dynamo's caches (on code objects) until the very end of
    finalization, after IREE's nanobind module has torn down; nanobind then prints its
    "leaked instances" report (seen with a function compiled for two shapes). Releasing
    the contexts, functions and devices here frees them in order instead."""
    global _instance
    for module in list(_loaded):
        module.context = module.function = module.returning = module.device = None
    with _lock:
        _devices.clear()
        _instance = None


def load(vmfb_path: str, driver: str = "local-task") -> Module:
    import iree.runtime as rt

    instance, device, hal = _runtime(driver)
    vm_module = rt.VmModule.mmap(instance, vmfb_path)
    context = rt.VmContext(instance, modules=[hal, vm_module])
    module = Module(context, vm_module.lookup_function("main"), vm_module.lookup_function("graph"), device)
    _loaded.add(module)
    return module


class OutputPlan(NamedTuple):
    # Per graph output: ("none",), ("input", i), ("result", j) (IREE's j-th result) or
    # ("size", k) (an integer output, computed by ResultShapes).
    sources: List[tuple]
    # Fake tensors of IREE's results (dtype and device of the npu outputs).
    results: Sequence[torch.Tensor]
    # The results' shapes and the integer outputs for given inputs (ResultShapes).
    shapes: "ResultShapes"


class ResultShapes:
    """The results' shapes (and integer outputs) for one call's inputs.

    A graph traced with dynamic shapes has symbolic sizes (sympy expressions over the
    ShapeEnv's symbols, e.g. ``s0`` or ``2*s0``); each symbol is read from the input that
    carries it (an integer input, or a size of a tensor input), and the expressions are
    evaluated for those values, once per distinct set of sizes. A result whose size has a
    symbol no input carries (a data-dependent size) makes the shapes unknown (None): IREE
    then allocates the results itself (make_callable). ``sizes`` are the graph's integer
    outputs (a training forward returns the sizes its backward needs), computed likewise.
    """

    _MAX_CACHED = 256  # distinct size sets remembered

    def __init__(self, shapes, sizes, symbol_sources):
        # shapes: per result, a tuple of ints and sympy expressions; sizes: ints and sympy
        # expressions; symbol_sources: {symbol: (input index, dim, or None for an integer input)}.
        self._symbols = list(symbol_sources)
        self._sources = [symbol_sources[s] for s in self._symbols]
        self._shapes = [tuple(shape) for shape in shapes]
        self._sizes = list(sizes)
        known = set(self._symbols)

        def computable(d):
            return isinstance(d, int) or d.free_symbols <= known

        if not all(map(computable, self._sizes)):
            raise ValueError(f"integer outputs {self._sizes} depend on sizes no input carries")
        dims = [d for shape in self._shapes for d in shape]
        self._unknown = not all(map(computable, dims))
        self.static = all(isinstance(d, int) for d in dims + self._sizes)
        self._cache = {}

    def __call__(self, args):
        """(result shapes or None if unknown, integer outputs)."""
        if self.static:
            return self._shapes, self._sizes
        key = tuple(args[i] if d is None else args[i].shape[d] for i, d in self._sources)
        found = self._cache.get(key)
        if found is None:
            values = dict(zip(self._symbols, key))

            def evaluate(d):
                return d if isinstance(d, int) else int(d.xreplace(values))

            shapes = None if self._unknown else [tuple(map(evaluate, shape)) for shape in self._shapes]
            found = (shapes, [evaluate(d) for d in self._sizes])
            if len(self._cache) >= self._MAX_CACHED:
                self._cache.clear()
            self._cache[key] = found
        return found


def _to_iree(t):
    """A tensor IREE can import by DLPack: contiguous, on the CPU (an alias for npu).
    Integers (symbolic sizes) are passed as they are."""
    if not isinstance(t, torch.Tensor):
        return int(t)
    t = t.detach()  # parameters: the graph only reads their values
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type == "npu":
        import torch_npu

        t = torch_npu._C._npu_cpuAlias(t)
    return t


def make_callable(module: Module, plan: OutputPlan):
    import iree.runtime as rt

    n_results = len(plan.results)
    result_types = [(r.dtype, r.device) for r in plan.results]  # device as traced: npu for npu graphs
    writes_in_place = [True]

    def push(arg_list, iree_args):
        device = module.device
        for a in iree_args:
            if isinstance(a, int):  # a symbolic size: an i64 argument
                arg_list.push_int(a)
            else:
                arg_list.push_ref(device.from_dlpack_capsule(a.__dlpack__()))

    def invoke(iree_args, shapes):
        """The results, computed by IREE: written into fresh tensors of the result devices."""
        if writes_in_place[0] and shapes is not None:
            results = [torch.empty(shape, dtype=dtype, device=dev)
                       for shape, (dtype, dev) in zip(shapes, result_types)]
            arg_list = rt.VmVariantList(len(iree_args) + n_results)
            push(arg_list, iree_args + [_to_iree(r) for r in results])
            try:
                module.context.invoke(module.function, arg_list, rt.VmVariantList(0))
                return results
            except RuntimeError as err:
                # IREE fills a result that is a pure constant with a discard-write transfer,
                # which an imported buffer does not allow. Such graphs copy their results.
                if "PERMISSION_DENIED" not in str(err):
                    raise
                writes_in_place[0] = False
        arg_list = rt.VmVariantList(len(iree_args))
        push(arg_list, iree_args)
        ret_list = rt.VmVariantList(n_results)
        module.context.invoke(module.returning, arg_list, ret_list)
        results = []
        for j, (dtype, dev) in enumerate(result_types):
            view = ret_list.get_as_object(j, rt.HalBufferView)
            value = torch.from_dlpack(module.device.create_dlpack_capsule(view, _DLPACK_CPU, 0))
            results.append(torch.empty(value.shape, dtype=dtype, device=dev).copy_(value))
        return results

    def run(args):
        if module.released():
            raise RuntimeError("torch_npu: the MLIR backend's IREE runtime was released at interpreter exit; "
                               "compiled graphs cannot run after that")
        npu_device = next((t.device for t in list(args) + plan.results
                           if isinstance(t, torch.Tensor) and t.device.type == "npu"), None)
        shapes, sizes = plan.shapes(args)
        iree_args = [_to_iree(a) for a in args]  # (may queue .contiguous() copies: before the sync)
        if npu_device is not None:  # the inputs may still be in the making on the stream
            stream = torch.npu.current_stream(npu_device)
            if not stream.query():  # (a query is ~20x cheaper than synchronizing an idle stream)
                stream.synchronize()
        results = invoke(iree_args, shapes)
        args_in = list(args)
        args.clear()  # boxed calling convention: the callee owns (and drops) the inputs
        outputs = []
        for src in plan.sources:
            if src[0] == "none":
                outputs.append(None)
            elif src[0] == "input":
                outputs.append(args_in[src[1]])
            elif src[0] == "size":
                outputs.append(sizes[src[1]])
            else:
                outputs.append(results[src[1]])
        return outputs

    run._boxed_call = True
    return run
