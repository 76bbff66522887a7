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

Ordering: IREE runs on its own threads, outside the npu stream's task queue, so before
it reads npu memory the current stream is queried and, if it has pending work,
synchronized (work queued there may still be producing the inputs). The results are
complete when the call returns.
"""
import threading
from typing import List, NamedTuple, Sequence

import torch

_lock = threading.Lock()
_state = None  # (VmInstance, HalDevice, hal VmModule), created on first use
_DLPACK_CPU = 1  # kDLCPU


def _runtime():
    global _state
    with _lock:
        if _state is None:
            import iree.runtime as rt

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
            config = rt.Config("local-task")
            _state = (config.vm_instance, config.device, rt.create_hal_module(config.vm_instance, config.device))
        return _state


class Module(NamedTuple):
    context: object    # iree VmContext
    function: object   # VmFunction "main": results written into buffers passed after the inputs
    returning: object  # VmFunction "graph": the same computation, returning its results
    device: object     # HalDevice


def load(vmfb_path: str) -> Module:
    import iree.runtime as rt

    instance, device, hal = _runtime()
    vm_module = rt.VmModule.mmap(instance, vmfb_path)
    context = rt.VmContext(instance, modules=[hal, vm_module])
    return Module(context, vm_module.lookup_function("main"), vm_module.lookup_function("graph"), device)


class OutputPlan(NamedTuple):
    # Per graph output: ("none",), ("input", i) or ("result", j).
    sources: List[tuple]
    # Fake tensors of IREE's results (dtype/shape, for the npu outputs).
    results: Sequence[torch.Tensor]


def _to_iree(t: torch.Tensor):
    """A tensor IREE can import by DLPack: contiguous, on the CPU (an alias for npu)."""
    t = t.detach()  # parameters: the graph only reads their values
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type == "npu":
        import torch_npu

        t = torch_npu._C._npu_cpuAlias(t)
    return t


def make_callable(module: Module, plan: OutputPlan):
    import iree.runtime as rt

    context, function, returning, device = module
    n_results = len(plan.results)
    result_devices = [r.device for r in plan.results]  # as traced: npu for npu graphs
    writes_in_place = [True]

    def invoke(iree_args):
        """The results, computed by IREE: written into fresh tensors of the result devices."""
        results = [torch.empty(r.shape, dtype=r.dtype, device=d) for r, d in zip(plan.results, result_devices)]
        if writes_in_place[0]:
            arg_list = rt.VmVariantList(len(iree_args) + n_results)
            for a in iree_args + [_to_iree(r) for r in results]:
                arg_list.push_ref(device.from_dlpack_capsule(a.__dlpack__()))
            try:
                context.invoke(function, arg_list, rt.VmVariantList(0))
                return results
            except RuntimeError as err:
                # IREE fills a result that is a pure constant with a discard-write transfer,
                # which an imported buffer does not allow. Such graphs copy their results.
                if "PERMISSION_DENIED" not in str(err):
                    raise
                writes_in_place[0] = False
        arg_list = rt.VmVariantList(len(iree_args))
        for a in iree_args:
            arg_list.push_ref(device.from_dlpack_capsule(a.__dlpack__()))
        ret_list = rt.VmVariantList(n_results)
        context.invoke(returning, arg_list, ret_list)
        for j, out in enumerate(results):
            view = ret_list.get_as_object(j, rt.HalBufferView)
            out.copy_(torch.from_dlpack(device.create_dlpack_capsule(view, _DLPACK_CPU, 0)))
        return results

    def run(args):
        npu_device = next((t.device for t in list(args) + plan.results
                           if isinstance(t, torch.Tensor) and t.device.type == "npu"), None)
        iree_args = [_to_iree(a) for a in args]  # (may queue .contiguous() copies: before the sync)
        if npu_device is not None:  # the inputs may still be in the making on the stream
            stream = torch.npu.current_stream(npu_device)
            if not stream.query():  # (a query is ~20x cheaper than synchronizing an idle stream)
                stream.synchronize()
        results = invoke(iree_args)
        args_in = list(args)
        args.clear()  # boxed calling convention: the callee owns (and drops) the inputs
        outputs = []
        for src in plan.sources:
            if src[0] == "none":
                outputs.append(None)
            elif src[0] == "input":
                outputs.append(args_in[src[1]])
            else:
                outputs.append(results[src[1]])
        return outputs

    run._boxed_call = True
    return run
