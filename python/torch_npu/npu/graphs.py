r"""NPU graphs: capture the work launched on a stream once, replay it many times.

``torch.npu.NPUGraph`` records what is launched on the capturing stream into a model
runtime instance of the (simulated) AscendCL runtime (``aclmdlRICaptureBegin`` /
``aclmdlRICaptureEnd``); :meth:`NPUGraph.replay` re-launches all of it with one
``aclmdlRIExecuteAsync``, on the same memory, without any Python or dispatcher work.
As with CUDA graphs, tensors allocated during the capture come from a private memory
pool of the caching allocator, inputs are fed by copying into the tensors the capture
used. Synchronising with a capturing stream (``.item()``, ``.cpu()``,
``torch.npu.synchronize()``) raises; unlike CUDA's, the capture goes on (Ascend's runtime
refuses the call without invalidating the capture).

``torch.ops.npu.print_npugraph_tensor`` and ``save_npugraph_tensor`` (also
``torch_npu.<name>``) print or save a tensor's values from inside a capture: at each replay,
the values the tensor has at that point of the graph.
"""

__all__ = [
    "is_current_stream_capturing",
    "graph_pool_handle",
    "graph_task_group_begin",
    "graph_task_group_end",
    "graph_task_update_begin",
    "graph_task_update_end",
    "super_kernel_scope_begin",
    "super_kernel_scope_end",
    "NPUGraph",
    "graph",
    "make_graphed_callables",
]

import collections
import ctypes
import datetime
import gc
import os
import threading
import typing

import torch
from torch.fx.node import has_side_effect

import torch_npu._C as _C
from torch_npu._composite_ops import _op
from torch_npu.npu._npugraph_handlers.npugraph_handler import _NPU_GRAPH_OP_HANDLERS

_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


def is_current_stream_capturing():
    r"""Return True if NPU graph capture is underway on the current NPU stream, False otherwise."""
    return bool(_C._npu_isCurrentStreamCapturing())


def graph_pool_handle():
    r"""Return an opaque token representing the id of a graph memory pool.

    Pass it as ``pool`` to several captures to let them share memory.
    """
    return _C._graph_pool_handle()


def _stream_args(stream, fn):
    if not isinstance(stream, torch.npu.Stream):
        raise TypeError(f"{fn}: argument 'stream' must be a torch.npu.Stream, got {type(stream).__name__}")
    return stream.stream_id, stream.device_index


def graph_task_group_begin(stream):
    r"""Start a task group on ``stream``, which captures a graph: the work launched on it until
    :func:`graph_task_group_end` can later be launched again with new parameters
    (:func:`graph_task_update_begin`)."""
    _C._graph_task_group_begin(*_stream_args(stream, "graph_task_group_begin"))


def graph_task_group_end(stream):
    r"""End the task group of ``stream``; returns its handle for :func:`graph_task_update_begin`."""
    return _C._graph_task_group_end(*_stream_args(stream, "graph_task_group_end"))


def graph_task_update_begin(stream, handle):
    r"""Start updating the captured task group ``handle`` from ``stream`` (a stream that does not
    capture): the work launched on ``stream`` until :func:`graph_task_update_end` is recorded,
    not run, as the group's new tasks. It must be the group's work with new host parameters
    (e.g. ``actual_seq_lengths``): as many tasks, of the same kinds."""
    if not isinstance(handle, _C._NPUTaskGroupHandle):
        raise TypeError("graph_task_update_begin: argument 'handle' must be what graph_task_group_end returned, "
                        f"got {type(handle).__name__}")
    _C._graph_task_update_begin(*_stream_args(stream, "graph_task_update_begin"), handle)


def graph_task_update_end(stream):
    r"""End the update ``stream`` records. The group's tasks are replaced when ``stream`` gets
    there: replays that must see the update wait for an event recorded on ``stream`` after
    this call (:class:`torch.npu.ExternalEvent`, waited for inside the capture)."""
    _C._graph_task_update_end(*_stream_args(stream, "graph_task_update_end"))


def _check_scope_name(scope_name, fn):
    if scope_name is not None and (not isinstance(scope_name, str) or not scope_name.strip()):
        raise RuntimeError(f"{fn}: scope_name should be None or a non-empty string, got {scope_name!r}")


@_op("super_kernel_scope_begin(str? scope_name=None) -> ()", keys=("PrivateUse1", "CPU", "BackendSelect"))
def _super_kernel_scope_begin(scope_name=None):
    _check_scope_name(scope_name, "super_kernel_scope_begin")


@_op("super_kernel_scope_end(str? scope_name=None) -> ()", keys=("PrivateUse1", "CPU", "BackendSelect"))
def _super_kernel_scope_end(scope_name=None):
    _check_scope_name(scope_name, "super_kernel_scope_end")


def super_kernel_scope_begin(scope_name: typing.Optional[str] = None):
    r"""Open a super kernel scope (``scope_name``: None or a non-empty string) on the current
    stream: on Ascend, the kernels captured inside are fused into one super kernel by
    :meth:`NPUGraph.super_kernel_optimize`. The simulator has no super kernels: the scope is
    checked and the kernels run one by one, which gives the same results."""
    return torch.ops.npu.super_kernel_scope_begin(scope_name)


def super_kernel_scope_end(scope_name: typing.Optional[str] = None):
    r"""Close the super kernel scope opened by :func:`super_kernel_scope_begin`."""
    return torch.ops.npu.super_kernel_scope_end(scope_name)


# The options of NPUGraph.super_kernel_optimize: name -> type (a list: list of that type; a
# dict: its sub-options and their types).
_SUPER_KERNEL_OPTIONS = {
    "optimize_options": {
        "preload_code": int, "split_mode": int, "stream_fusion": int, "constant_codegen": int,
        "auto_op_parallel": int, "opt_extend": str, "dcci_before_kernel_start": [str],
        "dcci_after_kernel_end": [str], "dcci_disable_on_kernel": [str], "ubuf_lock_ignore_kernel": [str],
        "early_start": int,
        "aggressive_opt_strategies": {"event_breaker_bypass": int, "value_breaker_bypass": int,
                                      "task_breaker_bypass": int},
    },
    "debug_options": {
        "debug_sync_all": int, "debug_op_exec_trace": int, "debug_cross_core_sync_check": int,
        "debug_extend": str, "debug_per_op_max_core_num": int,
    },
}


def _check_option(where, value, expected):
    if isinstance(expected, dict):
        if not isinstance(value, dict):
            raise RuntimeError(f"{where} must be a dict, got {type(value).__name__}")
        for key, sub in value.items():
            if key not in expected:
                raise RuntimeError(f"{where}: invalid key {key!r} (valid: {', '.join(expected)})")
            _check_option(f"{where}[{key!r}]", sub, expected[key])
    elif isinstance(expected, list):
        if not isinstance(value, list):
            raise RuntimeError(f"{where} must be a list of {expected[0].__name__}, got {type(value).__name__}")
        for i, item in enumerate(value):
            _check_option(f"{where}[{i}]", item, expected[0])
    elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise RuntimeError(f"{where} must be {expected.__name__}, got {type(value).__name__}")


class _GraphDispatchRecord:
    r"""One captured call of an operator with a handler: its task group and what it was called with."""

    def __init__(self, event, handle, func, args, kwargs):
        self.event = event            # torch.npu.ExternalEvent the group waits for
        self.handle = handle          # of the task group
        self.op_cache_entry = func    # the operator overload captured
        self.args = list(args)
        self.kwargs = dict(kwargs)


class _GraphDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    r"""The dispatch mode of ``torch.npu.graph(..., auto_dispatch_capture=True)``.

    Each call of an operator with a handler (``_NPU_GRAPH_OP_HANDLERS``) is captured as a task
    group of its own that first waits for an :class:`ExternalEvent`; :meth:`update_capture_record`
    launches the recorded calls again with new arguments, as task group updates on one update
    stream shared by all graphs, each followed by a record of its event (so the next replay
    runs the updated group). A replay of such a graph waits for an update first.
    """

    update_stream = None  # shared by every graph

    def __init__(self):
        super().__init__()
        if _GraphDispatchMode.update_stream is None:
            _GraphDispatchMode.update_stream = torch.npu.Stream()
        self.graph_dispatch_records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _NPU_GRAPH_OP_HANDLERS.get(func.__name__)
        if handler is None:
            return func(*args, **kwargs)
        should_handle = getattr(handler, "should_handle", None)
        if should_handle is not None and not should_handle(func, args, kwargs):
            return func(*args, **kwargs)
        stream = torch.npu.current_stream()
        event = torch.npu.ExternalEvent()
        event.wait(stream)
        event.reset(stream)
        func, args, kwargs = handler.prepare_capture(func, args, kwargs)
        graph_task_group_begin(stream)
        result = func(*args, **kwargs)
        handle = graph_task_group_end(stream)
        tensor_params = [a.name for a in func._schema.arguments if "Tensor" in str(a.type)]
        kept = {key: handler.record_wrap_kwarg(key, value, tensor_params) for key, value in kwargs.items()}
        self.graph_dispatch_records.append(_GraphDispatchRecord(event, handle, func, args, kept))
        return handler.postprocess_result(result, kwargs)

    def update_capture_record(self, cpu_update_input):
        records = self.graph_dispatch_records
        if not isinstance(cpu_update_input, (list, tuple)) or not all(isinstance(u, dict) for u in cpu_update_input):
            raise TypeError("NPUGraph.update: cpu_update_input must be a list of dicts (one per captured operator, "
                            f"or one for all), got {cpu_update_input!r}")
        if not records:
            # (an operator computed by decomposition, as the ATB operators are here, reaches the
            # dispatch mode as the operators it is made of, which have no handler)
            raise RuntimeError("NPUGraph.update: the capture recorded no call of an operator with an update "
                               "handler, so there is nothing to update")
        if len(cpu_update_input) == 1:
            cpu_update_input = list(cpu_update_input) * len(records)
        if len(cpu_update_input) != len(records):
            raise RuntimeError(f"NPUGraph.update: the graph captured {len(records)} operators to update, "
                               f"cpu_update_input has {len(cpu_update_input)} elements")
        stream = self.update_stream
        with torch.npu.stream(stream):
            for record, update in zip(records, cpu_update_input):
                handler = _NPU_GRAPH_OP_HANDLERS.get(record.op_cache_entry.__name__)
                if handler is None:
                    raise RuntimeError(f"NPUGraph.update: no handler is registered for the captured operator "
                                       f"{record.op_cache_entry.__name__} any more")
                handler.update_args(record, update)
                graph_task_update_begin(stream, record.handle)
                try:
                    record.op_cache_entry(*record.args, **record.kwargs)
                finally:
                    graph_task_update_end(stream)
                record.event.record(stream)


def _check_pool(pool):
    if pool is None:
        return None
    if (not isinstance(pool, tuple) or len(pool) != 2
            or not all(isinstance(v, int) and v >= 0 for v in pool)):
        raise TypeError(
            "pool must be None, torch.npu.graph_pool_handle() or another NPUGraph's pool() "
            f"(a tuple of two non-negative ints), got {pool!r}")
    return pool


def _check_mode(capture_error_mode):
    if capture_error_mode not in _CAPTURE_ERROR_MODES:
        raise ValueError(
            "Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got "
            f"{capture_error_mode!r}")


class NPUGraph(_C._NPUGraph):
    r"""Wrapper around an NPU graph (a captured model runtime instance).

    Typically used through :class:`torch.npu.graph` or :func:`torch.npu.make_graphed_callables`.
    """

    def __new__(cls):
        graph = super().__new__(cls)
        graph.generators = []  # registered with register_generator_state
        graph.graph_dispatch_mode = _GraphDispatchMode()
        graph.auto_dispatch_capture = False
        return graph

    def update(self, cpu_update_input):
        r"""Launch the operators captured with ``torch.npu.graph(..., auto_dispatch_capture=True)``
        again with new host arguments, e.g. ``[{"actual_seq_lengths": [100]}]``: a list of one
        dict per captured operator, or of one dict for all (keys an operator does not take are
        ignored; see :class:`torch.npu.NpuGraphOpHandler`). The next replay runs the updated work.
        """
        if not self.auto_dispatch_capture:
            raise RuntimeError("NPUGraph.update: the graph was not captured with "
                               "torch.npu.graph(..., auto_dispatch_capture=True)")
        self.graph_dispatch_mode.update_capture_record(cpu_update_input)

    def super_kernel_optimize(self, optimize_options=None, debug_options=None):
        r"""Fuse the kernels of the captured super kernel scopes (see
        :func:`super_kernel_scope_begin`), with ``optimize_options`` / ``debug_options`` (dicts
        of torch_npu's option names, or None). The options are checked; the simulator has no
        super kernels, so the graph is left as captured and replays give the same results.
        """
        for name, options in (("optimize_options", optimize_options), ("debug_options", debug_options)):
            if options is not None:
                _check_option(name, options, _SUPER_KERNEL_OPTIONS[name])
        try:
            self.pool()  # raises without a captured graph
        except RuntimeError:
            raise RuntimeError("Called NPUGraph::super_kernel_optimize without a preceding successful capture.") \
                from None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        r"""Begin capturing NPU work on the current stream (which must not be the default stream).

        Arguments:
            pool (optional): token from :func:`graph_pool_handle` or another graph's
                :meth:`pool` to share that memory pool.
            capture_error_mode (str): ``"global"``, ``"thread_local"`` or ``"relaxed"``: which
                threads' unsafe calls (synchronous copies) fail during the capture.
        """
        _check_mode(capture_error_mode)
        super().capture_begin(pool=_check_pool(pool), capture_error_mode=capture_error_mode)

    def capture_end(self):
        r"""End the capture on the current stream; afterwards :meth:`replay` may be called."""
        super().capture_end()

    def replay(self):
        r"""Replay the NPU work captured by this graph on the current stream."""
        super().replay()

    def reset(self):
        r"""Delete the graph held by this instance and release its memory pool."""
        super().reset()

    def pool(self):
        r"""Return a token for this graph's memory pool, to share it with another capture."""
        return super().pool()

    def register_generator_state(self, generator):
        r"""Make ``generator`` (an npu ``torch.Generator``) advance with this graph's replays, as
        ``torch.cuda.CUDAGraph.register_generator_state`` does.

        Here every generator a capture uses already does: a captured random op draws, at each
        replay, from its generator's state as it is then (so each replay gives new numbers, and
        a replay after ``manual_seed(s)`` gives what eager execution after ``manual_seed(s)``
        gives). The call checks the generator and keeps it registered (:attr:`generators`).
        """
        if not isinstance(generator, torch.Generator) or generator.device.type != "npu":
            raise TypeError(f"register_generator_state: expected an npu torch.Generator, got {generator!r}")
        if not any(g is generator for g in self.generators):
            self.generators.append(generator)

    def enable_debug_mode(self):
        r"""Print the captured tasks when the capture ends."""
        super().enable_debug_mode()

    def debug_dump(self, debug_path):
        r"""Write the captured tasks as JSON to ``debug_path``, and their Chrome trace to
        ``<name>.aligned.json`` beside it (see ``torch_npu.npu._npugraph_utils``). Without a
        successful capture nothing is written (a warning says so). A trace that cannot be
        made is logged; the raw dump stays."""
        if not isinstance(debug_path, str) or not debug_path:
            raise TypeError(f"debug_path must be a non-empty str, got {debug_path!r}")
        before = _file_state(debug_path)
        super().debug_dump(debug_path)
        after = _file_state(debug_path)
        if after is None or after == before:  # not written: no trace of an older dump
            return
        from torch_npu.npu import _npugraph_utils
        try:
            _npugraph_utils.align_trace_json(debug_path, None)
        except Exception:  # the trace is an extra: the dump itself was written
            _npugraph_utils.log.warning("NPUGraph.debug_dump: no Chrome trace of %s", debug_path, exc_info=True)


def _file_state(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class graph:
    r"""Context manager capturing NPU work into a :class:`torch.npu.NPUGraph` for later replay.

    Arguments:
        npu_graph (torch.npu.NPUGraph): graph object used for the capture.
        pool (optional): memory pool token to share (see :func:`graph_pool_handle`).
        stream (torch.npu.Stream, optional): stream to capture on; by default a side stream
            shared by all captures.
        auto_dispatch_capture (bool, optional): capture each call of an operator that has an
            update handler as a task group of its own, so that :meth:`NPUGraph.update` can
            give it new host arguments (see :class:`torch.npu.NpuGraphOpHandler`).
        capture_error_mode (str, optional): see :meth:`NPUGraph.capture_begin`.
    """

    default_capture_stream: typing.Optional["torch.npu.Stream"] = None

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
                 capture_error_mode: str = "global"):
        if not isinstance(npu_graph, NPUGraph):
            raise TypeError(f"npu_graph must be a torch.npu.NPUGraph, got {type(npu_graph).__name__}")
        _check_mode(capture_error_mode)
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch.npu.Stream()
        self.pool = () if pool is None else (_check_pool(pool),)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch.npu.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        npu_graph.auto_dispatch_capture = bool(auto_dispatch_capture)

    def __enter__(self):
        # Free what the capture could otherwise not reuse, and start from a quiet device.
        torch.npu.synchronize()
        gc.collect()
        torch.npu.empty_cache()
        self.stream_ctx.__enter__()
        try:
            self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise
        if self.npu_graph.auto_dispatch_capture:
            self.npu_graph.graph_dispatch_mode.graph_dispatch_records.clear()
            self.npu_graph.graph_dispatch_mode.__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        if self.npu_graph.auto_dispatch_capture:
            self.npu_graph.graph_dispatch_mode.__exit__(exc_type, exc_value, traceback)
        try:
            if exc_type is None:
                self.npu_graph.capture_end()
            else:
                # The error raised inside the block says more than a failed capture_end.
                try:
                    self.npu_graph.capture_end()
                except RuntimeError:
                    pass
        finally:
            self.stream_ctx.__exit__(exc_type, exc_value, traceback)


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    r"""Accept callables (functions or :class:`torch.nn.Module`\ s) and return graphed versions.

    Each graphed callable runs its forward work as one NPU graph replay inside a single
    autograd node, whose backward replays a graph of the backward work. Same contract as
    :func:`torch.cuda.make_graphed_callables`: ``sample_args`` hold only tensors, with the
    ``requires_grad`` of the real inputs; modules must have no hooks and only parameters
    may require grad; arguments are passed in the same order and format.
    """
    if torch.is_autocast_enabled("npu") and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables does not support the autocast caching. Please set `cache_enabled=False`.")

    just_one_callable = False
    if not isinstance(callables, tuple):
        just_one_callable = True
        callables = (callables,)
        sample_args = (sample_args,)

    flatten_sample_args = []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if len(c._backward_hooks) > 0 or len(c._forward_hooks) > 0 or len(c._forward_pre_hooks) > 0:
                raise RuntimeError(
                    "Modules must not have hooks registered at the time they are passed. However, registering "
                    "hooks on modules after passing them through make_graphed_callables is allowed.")
            if any(b.requires_grad for b in c.buffers()):
                raise RuntimeError(
                    "In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, only parameters "
                    "may be trainable. All buffers must have ``requires_grad=False``.")
        flatten_arg = torch.utils._pytree.arg_tree_leaves(*args)
        if not all(isinstance(arg, torch.Tensor) for arg in flatten_arg):
            raise TypeError(
                "In the beta API, sample_args for each callable must contain only Tensors. Other types are not "
                "allowed.")
        flatten_sample_args.append(tuple(flatten_arg))

    # A module's graph reads the args the user passes AND its parameters.
    per_callable_len_user_args = [len(args) for args in flatten_sample_args]
    per_callable_module_params = [
        tuple(c.parameters()) if isinstance(c, torch.nn.Module) else () for c in callables
    ]
    per_callable_static_input_surfaces = [
        flatten_sample_args[i] + per_callable_module_params[i] for i in range(len(callables))
    ]

    fwd_graphs = [NPUGraph() for _ in range(len(callables))]
    bwd_graphs = [NPUGraph() for _ in range(len(callables))]
    mempool = graph_pool_handle() if pool is None else _check_pool(pool)

    # Warm up on a side stream: lazy initialisation must not end up in the captures.
    torch.npu.synchronize()
    with torch.npu.stream(torch.npu.Stream()):
        for func, args, static_input_surface in zip(callables, sample_args, per_callable_static_input_surfaces):
            grad_inputs, outputs, outputs_grad = None, None, None
            for _ in range(num_warmup_iters):
                outputs = torch.utils._pytree.tree_leaves(func(*args))
                outputs_grad = tuple(o for o in outputs if o.requires_grad)
                if len(outputs_grad) > 0:
                    grad_inputs = torch.autograd.grad(
                        outputs=outputs_grad,
                        inputs=tuple(i for i in static_input_surface if i.requires_grad),
                        grad_outputs=tuple(torch.empty_like(o) for o in outputs if o.requires_grad),
                        only_inputs=True,
                        allow_unused=allow_unused_input,
                    )
            del grad_inputs, outputs, outputs_grad
    torch.npu.synchronize()

    # All captures share one pool: capture them in the order they run (fwd 1..N, then
    # bwd N..1) so that replays in that order never overwrite memory still needed.
    per_callable_static_outputs = []
    per_callable_output_unflatten_spec = []
    for func, args, fwd_graph in zip(callables, sample_args, fwd_graphs):
        with graph(fwd_graph, pool=mempool):
            outputs = func(*args)
        flatten_outputs, spec = torch.utils._pytree.tree_flatten(outputs)
        per_callable_static_outputs.append(tuple(flatten_outputs))
        per_callable_output_unflatten_spec.append(spec)

    per_callable_static_grad_outputs = []
    per_callable_static_grad_inputs = []
    for static_input_surface, static_outputs, bwd_graph in zip(
        reversed(per_callable_static_input_surfaces),
        reversed(per_callable_static_outputs),
        reversed(bwd_graphs),
    ):
        static_grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in static_outputs)
        outputs_grad = tuple(o for o in static_outputs if o.requires_grad)
        grad_inputs = None
        if len(outputs_grad) > 0:
            with graph(bwd_graph, pool=mempool):
                grad_inputs = torch.autograd.grad(
                    outputs=outputs_grad,
                    inputs=tuple(i for i in static_input_surface if i.requires_grad),
                    grad_outputs=tuple(o for o in static_grad_outputs if o is not None),
                    only_inputs=True,
                    allow_unused=allow_unused_input,
                )
        # One gradient slot per input surface entry (None where no grad is needed).
        static_grad_inputs = []
        grad_idx = 0
        for arg in static_input_surface:
            if arg.requires_grad and grad_inputs is not None:
                static_grad_inputs.append(grad_inputs[grad_idx])
                grad_idx += 1
            else:
                static_grad_inputs.append(None)
        per_callable_static_grad_outputs.append(static_grad_outputs)
        per_callable_static_grad_inputs.append(tuple(static_grad_inputs))
    per_callable_static_grad_outputs.reverse()
    per_callable_static_grad_inputs.reverse()

    def make_graphed_autograd_function(fwd_graph, bwd_graph, module_params, len_user_args, output_unflatten_spec,
                                       static_input_surface, static_outputs, static_grad_outputs,
                                       static_grad_inputs):
        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                # Only the user args can be new tensors: feed them into the captured ones.
                for i in range(len_user_args):
                    if static_input_surface[i].data_ptr() != inputs[i].data_ptr():
                        static_input_surface[i].copy_(inputs[i])
                fwd_graph.replay()
                return tuple(o.detach() for o in static_outputs)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, *grads):
                for g, grad in zip(static_grad_outputs, grads):
                    if g is not None and grad is not None and g.data_ptr() != grad.data_ptr():
                        g.copy_(grad)
                bwd_graph.replay()
                return tuple(b.detach() if b is not None else b for b in static_grad_inputs)

        def functionalized(*user_args):
            # Module parameters are inputs too (assumed not to change since the capture).
            flatten_user_args = torch.utils._pytree.arg_tree_leaves(*user_args)
            out = Graphed.apply(*(tuple(flatten_user_args) + module_params))
            return torch.utils._pytree.tree_unflatten(out, output_unflatten_spec)

        return functionalized

    ret = []
    for i, func in enumerate(callables):
        graphed = make_graphed_autograd_function(
            fwd_graphs[i], bwd_graphs[i], per_callable_module_params[i], per_callable_len_user_args[i],
            per_callable_output_unflatten_spec[i], per_callable_static_input_surfaces[i],
            per_callable_static_outputs[i], per_callable_static_grad_outputs[i],
            per_callable_static_grad_inputs[i])
        if isinstance(func, torch.nn.Module):
            def make_graphed_forward(func, graph_training_state, graphed, orig_fwd):
                def new_fwd(*user_args):
                    # The graph holds the training (or eval) behaviour it was captured with.
                    if func.training == graph_training_state:
                        return graphed(*user_args)
                    return orig_fwd(*user_args)
                return new_fwd
            func.forward = make_graphed_forward(func, func.training, graphed, func.forward)
            ret.append(func)
        else:
            ret.append(graphed)

    if just_one_callable:
        return ret[0]
    return tuple(ret)


# ---- printing and saving tensors from inside NPU graphs -----------------------------------

# Host tensors in the data of torch.npu._launch_host_func_pending, as torch_npu passes them: a
# "ptr" spec (address, byte count, shape, dtype) names host memory; the call receives instead a
# "buffer" spec (bytes, shape, dtype) holding the bytes as they were when the stream got there.
_NPUGRAPH_TENSOR_PTR_SPEC_MARKER = "host_tensor_ptr"
_NPUGRAPH_TENSOR_BUFFER_SPEC_MARKER = "host_tensor_buffer"


def _make_npugraph_tensor_ptr_spec(tensor):
    r"""The ptr spec of a contiguous host tensor: where its bytes are, not what they are now
    (nor a reference: the caller keeps the tensor alive)."""
    return (_NPUGRAPH_TENSOR_PTR_SPEC_MARKER, tensor.data_ptr(), tensor.numel() * tensor.element_size(),
            tuple(tensor.shape), tensor.dtype)


def _is_ptr_spec(obj):
    return (isinstance(obj, tuple) and len(obj) == 5 and isinstance(obj[0], str)
            and obj[0] == _NPUGRAPH_TENSOR_PTR_SPEC_MARKER)


def _holds_npugraph_tensor_ptr_spec(data):
    r"""Whether ``data`` is a ptr spec or holds one (in tuples and lists)."""
    if _is_ptr_spec(data):
        return True
    return isinstance(data, (tuple, list)) and any(_holds_npugraph_tensor_ptr_spec(d) for d in data)


def _copy_npugraph_tensor_ptr_specs(data):
    r"""``data`` with each ptr spec in it (also in tuples and lists) replaced by the buffer spec
    of a copy of the bytes it points to at the time of the call."""
    if _is_ptr_spec(data):
        _, address, nbytes, shape, dtype = data
        buffer = bytearray(nbytes)
        if nbytes:
            ctypes.memmove((ctypes.c_char * nbytes).from_buffer(buffer), address, nbytes)
        return (_NPUGRAPH_TENSOR_BUFFER_SPEC_MARKER, buffer, shape, dtype)
    if isinstance(data, (tuple, list)):
        copied = [_copy_npugraph_tensor_ptr_specs(d) for d in data]
        return copied if isinstance(data, list) else tuple(copied)
    return data


def _materialize_npugraph_tensor_arg(tensor_arg):
    r"""The cpu tensor of a buffer spec (a list of specs: the list of tensors); anything else
    is returned as it is."""
    if isinstance(tensor_arg, list):
        return [_materialize_npugraph_tensor_arg(arg) for arg in tensor_arg]
    if (isinstance(tensor_arg, tuple) and len(tensor_arg) == 4 and isinstance(tensor_arg[0], str)
            and tensor_arg[0] == _NPUGRAPH_TENSOR_BUFFER_SPEC_MARKER):
        _, buffer, shape, dtype = tensor_arg
        if len(buffer) == 0:  # torch.frombuffer refuses an empty buffer
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)
    return tensor_arg


def _on_host_with_values(tensors, fn):
    r"""Queue on the current stream of the device of ``tensors`` (a list of npu tensors) a call
    ``fn(values)``, ``values`` cpu tensors holding the tensors' values as they are when the
    stream gets there: at each replay, when the stream captures a graph.

    The tensors are copied (non-blocking) into pinned host memory that ``fn`` reads, and the
    stream waits for ``fn``: when ``torch.npu.synchronize()`` returns, its output is complete
    (the print is done, the file written), at the cost of the stream waiting for it. (torch_npu
    hands it to the interpreter's pending calls, which the main thread runs almost at once; a
    pending host function here runs on a thread of its own, maybe after the program has gone
    on to read the file.) The host function holds the pinned tensors, which keeps their memory
    as long as a graph recording the call exists; ``values`` are only valid during the call (a
    replay overwrites them).
    """
    stream = torch.npu.current_stream(tensors[0].device)
    # made contiguous on the device: a copy to the host from strided memory would synchronize
    host = [t.detach().contiguous().to("cpu", non_blocking=True) for t in tensors]
    torch.npu._launch_host_func(stream, fn, host)


def _print_tensor(tensor, tensor_name):
    text = str(tensor) if tensor_name is None else f"{tensor_name}={tensor}"
    print(f"{text}, shape={tuple(tensor.shape)}, dtype={tensor.dtype}", flush=True)


_save_counters = {}  # path without the counter -> number of calls that saved there
_save_counters_lock = threading.Lock()


def _npugraph_tensor_save_path(save_path, device_index, overwrite):
    r"""The file a call saves to: ``save_path`` (default: ``tensor_<timestamp>.pt`` in the
    working directory; ``.pt`` when it has no suffix) with ``_device_<index>`` (npu tensors)
    and, unless ``overwrite``, ``_<n>`` before the suffix, ``n`` counting the earlier calls
    for the same path (each captured call keeps its file at every replay)."""
    if save_path is None:
        save_path = f"tensor_{datetime.datetime.now().strftime('%Y%m%d_%H%M%S_%f')}.pt"
    directory, filename = os.path.split(save_path)
    stem, suffix = os.path.splitext(filename)
    if not stem:
        raise ValueError(f"save_npugraph_tensor: save_path must end with a file name, got {save_path!r}")
    if directory and not os.path.isdir(directory):
        raise ValueError(f"save_npugraph_tensor: the directory of save_path does not exist: {directory!r}")
    if device_index is not None:
        stem = f"{stem}_device_{device_index}"
    suffix = suffix or ".pt"
    if not overwrite:
        key = os.path.join(directory, stem + suffix)
        with _save_counters_lock:
            count = _save_counters.get(key, 0)
            _save_counters[key] = count + 1
        stem = f"{stem}_{count}"
    return os.path.join(directory, stem + suffix)


def _check_tensor_list(input):
    if len(input) == 0:
        raise ValueError("save_npugraph_tensor: input must not be an empty list")
    devices = {t.device for t in input}
    if len(devices) > 1:
        raise ValueError(f"save_npugraph_tensor: the tensors of input must be on one device, got "
                         f"{sorted(map(str, devices))}")


# npu tensors go through the stream (captured in graphs); cpu tensors are printed or saved now.
_DFX_KEYS = ("PrivateUse1", "CPU")


@_op("print_npugraph_tensor(Tensor input, *, str? tensor_name=None) -> ()", keys=_DFX_KEYS)
def _print_npugraph_tensor(input, *, tensor_name=None):
    r"""Print ``input`` as ``[tensor_name=]tensor(...), shape=(...), dtype=...``: an npu tensor
    when the stream gets there (at each replay when captured)."""
    if input.device.type == "cpu":
        _print_tensor(input, tensor_name)
    else:
        _on_host_with_values([input], lambda values: _print_tensor(values[0], tensor_name))


@_op("save_npugraph_tensor(Tensor input, *, str? save_path=None, bool overwrite=False) -> ()", keys=_DFX_KEYS)
def _save_npugraph_tensor(input, *, save_path=None, overwrite=False):
    r"""``torch.save`` ``input`` to ``save_path`` (see :func:`_npugraph_tensor_save_path`); an
    npu tensor when the stream gets there (at each replay when captured)."""
    _save_npugraph_tensors(input, [input], save_path, overwrite)


@_op("save_npugraph_tensor.tensor_list(Tensor[] input, *, str? save_path=None, bool overwrite=False) -> ()",
     keys=_DFX_KEYS)
def _save_npugraph_tensor_list(input, *, save_path=None, overwrite=False):
    r"""As ``save_npugraph_tensor`` for a list of tensors on one device, saved as a list."""
    _check_tensor_list(input)
    _save_npugraph_tensors(list(input), input, save_path, overwrite)


def _save_npugraph_tensors(obj, tensors, save_path, overwrite):
    device = tensors[0].device
    if device.type == "cpu":
        torch.save(obj, _npugraph_tensor_save_path(save_path, None, overwrite))
        return
    path = _npugraph_tensor_save_path(save_path, device.index, overwrite)
    single = isinstance(obj, torch.Tensor)
    _on_host_with_values(tensors, lambda values: torch.save(values[0] if single else values, path))


# No outputs: keep the calls in torch.compile graphs (dead code elimination would drop them).
for _overload in (torch.ops.npu.print_npugraph_tensor.default, torch.ops.npu.save_npugraph_tensor.default,
                  torch.ops.npu.save_npugraph_tensor.tensor_list, torch.ops.npu.super_kernel_scope_begin.default,
                  torch.ops.npu.super_kernel_scope_end.default):
    has_side_effect(_overload)


@torch.library.register_fake("npu::print_npugraph_tensor")
def _print_npugraph_tensor_fake(input, *, tensor_name=None):
    return None


@torch.library.register_fake("npu::save_npugraph_tensor")
def _save_npugraph_tensor_fake(input, *, save_path=None, overwrite=False):
    return None


@torch.library.register_fake("npu::save_npugraph_tensor.tensor_list")
def _save_npugraph_tensor_list_fake(input, *, save_path=None, overwrite=False):
    return None
