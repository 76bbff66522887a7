"""Registration of npu with Dynamo and Inductor (private torch APIs; see ``__init__.py``).

Tested with torch 2.13.0 and 2.14.1 (the two pairs of this repository). Every private
name used here is fetched through :func:`_private`, so that a torch release that renamed
one fails with an error naming the missing hook and the torch version instead of an
AttributeError deep inside a compile.
"""
import functools
import importlib
import sys

import torch

DEVICE = "npu"
TESTED_TORCH = ("2.13", "2.14")


class MissingTorchHook(ImportError):
    """A private torch API torch_npu's Inductor integration needs is missing in this torch."""


def _private(module: str, name: str):
    """``module.name`` from torch's private API, or a clear error naming the torch version."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise MissingTorchHook(
            f"torch.compile on npu needs {module}.{name}, which torch {torch.__version__} does not "
            f"provide (torch_npu's Inductor integration is tested with torch "
            f"{' and '.join(TESTED_TORCH)}): {err}") from err


# ---- Dynamo ------------------------------------------------------------------------------
@functools.lru_cache(None)
def register_device_interface() -> None:
    """Dynamo's device interface of ``npu`` and ``npu:<i>`` (``get_interface_for_device``)."""
    register_interface_for_device = _private("torch._dynamo.device_interface",
                                             "register_interface_for_device")
    from torch_npu._inductor.device_interface import NpuInterface

    register_interface_for_device(DEVICE, NpuInterface)
    for index in range(torch.npu.device_count()):
        register_interface_for_device(f"{DEVICE}:{index}", NpuInterface)


@functools.lru_cache(None)
def register_dynamo() -> None:
    """The npu device interface and torch_npu's Dynamo backends (``torch.compile(backend=...)``)."""
    register_device_interface()

    from torch_npu import dynamo
    from torch_npu.dynamo.trace_rules import register_trace_rules

    dynamo._register_backends()
    register_trace_rules()
    _npu_rng_state_operators()
    transfer = sys.modules.get("torch_npu.contrib.transfer_to_npu")
    if transfer is not None and transfer._is_applied():
        transfer._patch_dynamo_cuda_interface()


def _npu_rng_state_operators() -> None:
    """``run_and_save_rng_state`` / ``run_with_rng_state`` for npu tensors.

    Activation checkpointing of random ops under torch.compile (``checkpoint(...,
    preserve_rng_state=True)`` with ``config.fallback_random``) and Inductor's fallbacks of
    these higher-order operators save and restore the generator's state around the op;
    torch implements them for cpu, cuda, hpu and xpu only (an AssertionError "Backend not
    supported for npu" while tracing). For npu the state is ``torch.npu``'s generator's.
    """
    rng_prims = importlib.import_module("torch._prims.rng_prims")
    save_op = _private("torch._prims.rng_prims", "run_and_save_rng_state")
    with_op = _private("torch._prims.rng_prims", "run_with_rng_state")
    if getattr(save_op, "_npu_rng_state", False):
        return
    from torch._C import DispatchKey
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, track_tensor_tree
    import torch.utils._pytree as pytree

    fake_fns = _private("torch._higher_order_ops.utils", "registered_hop_fake_fns")

    disable_modes = _private("torch.utils._python_dispatch", "_disable_current_modes")

    def save(op, *args, **kwargs):
        # a real state tensor also while tracing (the generator's get_state allocates it
        # through the dispatcher; CUDA's returns a real tensor under fake mode too)
        with disable_modes():
            state = torch.npu.get_rng_state()
        return state, op(*args, **kwargs)

    def restore(rng_state, op, *args, **kwargs):
        current = torch.npu.get_rng_state()
        torch.npu.set_rng_state(rng_state.cpu())
        try:
            return op(*args, **kwargs)
        finally:
            torch.npu.set_rng_state(current)

    def trace_save(mode, op, *args, **kwargs):  # torch's proxy-mode rule with the npu impl
        out = save(op, *args, **kwargs)
        proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, (op, *args))
        proxy_kwargs = pytree.tree_map(mode.tracer.unwrap_proxy, kwargs)
        proxy = mode.tracer.create_proxy("call_function", save_op, proxy_args, proxy_kwargs)
        return track_tensor_tree(out, proxy, constant=None, tracer=mode.tracer)

    def npu_first(table, key, npu_impl, skip):
        """table[key] runs npu_impl when the op's tensors (after ``skip`` arguments) are npu."""
        original = table[key]

        def handler(*args, **kwargs):
            if rng_prims.get_device(args[skip:], kwargs) == DEVICE:
                return npu_impl(*args, **kwargs)
            return original(*args, **kwargs)
        table[key] = handler

    save_op.py_impl(DispatchKey.PrivateUse1)(save)
    with_op.py_impl(DispatchKey.PrivateUse1)(restore)
    npu_first(save_op.py_kernels, DispatchKey.BackendSelect, save, 1)
    npu_first(with_op.py_kernels, DispatchKey.BackendSelect, restore, 2)
    npu_first(fake_fns, save_op, save, 1)
    npu_first(save_op.python_key_table, ProxyTorchDispatchMode, trace_save, 2)
    save_op._npu_rng_state = True


# ---- Inductor ----------------------------------------------------------------------------
def _treat_npu_as_cpu_in_scheduler() -> None:
    """``BaseSchedulerNode.is_cpu()`` also for npu nodes.

    The scheduler uses it to pick the CPU rules for fusing reductions with pointwise nodes
    (``_try_reindex_pointwise_for_reduction`` and the loop-order checks); with npu nodes
    taking the GPU rules, mixed reduction + pointwise graphs crash in the C++ backend.
    """
    node_cls = _private("torch._inductor.scheduler", "BaseSchedulerNode")
    if getattr(node_cls.is_cpu, "_npu_is_cpu_like", False):
        return

    def is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", DEVICE)

    is_cpu._npu_is_cpu_like = True
    node_cls.is_cpu = is_cpu


def _rebind(module: str, name: str, replacement) -> None:
    """Replace the function ``module.name`` everywhere torch._inductor imported it by name."""
    original = _private(module, name)
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("torch._inductor") and getattr(mod, name, None) is original:
            setattr(mod, name, replacement)


def _npu_uses_the_cpp_backend() -> None:
    """``get_current_backend()`` is "cpp" for npu.

    Inductor asks it while generating kernels (dtype propagation of ``masked``/index
    expressions, upcasts, asserts) and answers ``config.cuda_backend`` ("triton") for any
    device it does not know, which sends the C++ kernels of npu graphs down Triton's rules
    (e.g. the ``_safe_softmax`` of SDPA's math path failed with an AssertionError).
    """
    original = _private("torch._inductor.utils", "get_current_backend")
    if getattr(original, "_npu_cpp", False):
        return
    virtualized = _private("torch._inductor.virtualized", "V")

    def get_current_backend(device_type=None):
        if device_type is None:
            device_type = virtualized.graph.get_current_device_or_throw().type
        return "cpp" if device_type == DEVICE else original(device_type)

    get_current_backend._npu_cpp = True
    _rebind("torch._inductor.utils", "get_current_backend", get_current_backend)


def _npu_var_mean_takes_the_cpu_rule() -> None:
    """``lowering.use_two_step_variance`` answers for npu as for cpu.

    var_mean (LayerNorm, BatchNorm statistics) over a static reduction of at most
    ``config.cpp.use_two_step_variance_threshold`` elements is a sum, then a sum of squared
    differences, on cpu, and Welford's running update on other devices (their threshold is
    ``config.unroll_reductions_threshold``, 8). In a C++ kernel Welford's update costs more
    per element: the [2048, 1024] LayerNorm + GELU block's npu kernel took ~10% more CPU
    time than the cpu graph's, and compiled vs eager npu was 0.63-0.78 (seven runs) with the
    two-sum kernel, 0.67-1.03 (four) with Welford's (compile_bench ``compile_eval``, loaded host).
    """
    two_step = _private("torch._inductor.lowering", "use_two_step_variance")
    if getattr(two_step, "_npu_cpu_rule", False):
        return
    from torch._inductor import config

    def use_two_step_variance(x, axis, keepdim, input_dtype):
        device = x.get_device()
        if device is None or device.type != DEVICE:
            return two_step(x, axis, keepdim, input_dtype)
        # npu takes the branch of devices without a threshold of their own: give it cpu's.
        with config.patch(unroll_reductions_threshold=config.cpp.use_two_step_variance_threshold):
            return two_step(x, axis, keepdim, input_dtype)

    use_two_step_variance._npu_cpu_rule = True
    sys.modules["torch._inductor.lowering"].use_two_step_variance = use_two_step_variance


def _no_layout_optimization_around_npu_convolutions() -> None:
    """Inductor keeps the layouts of npu convolutions' inputs and weights as they are.

    Its layout optimisation turns them channels_last, and the compiled graph then checks the
    output strides FakeTensor predicted. For a PrivateUse1 convolution (the "Overrideable"
    conv backend) FakeTensor predicts contiguous outputs, while torch_npu's convolution runs
    the CPU kernel, whose output is channels_last for channels_last operands: the stride
    assert after ``extern_kernels.convolution`` would fail.
    """
    graph_cls = _private("torch._inductor.graph", "GraphLowering")
    original = graph_cls.decide_layout_opt
    if getattr(original, "_npu_aware", False):
        return

    def on_npu(node) -> bool:
        val = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
        return isinstance(val, torch.Tensor) and val.device.type == DEVICE

    def decide_layout_opt(gm, *, is_inference):
        if any(n.target is torch.ops.aten.convolution.default and on_npu(n) for n in gm.graph.nodes):
            return False
        return original(gm, is_inference=is_inference)

    decide_layout_opt._npu_aware = True
    graph_cls.decide_layout_opt = staticmethod(decide_layout_opt)


def _flush_before_deviceless_extern_calls() -> None:
    """The C++ kernels Inductor holds back are written out before an extern call without a
    device (e.g. ``torch.npu.Event.record`` inside the graph, a stream operation).

    Inductor's scheduler flushes them only before extern calls on a device; the call then
    frees the buffers the held-back kernel still reads (``del arg0_1`` before its launch: an
    UnboundLocalError at run time).
    """
    scheduler_cls = _private("torch._inductor.scheduler", "Scheduler")
    original = scheduler_cls.codegen_extern_call
    if getattr(original, "_npu_flushes", False):
        return

    def codegen_extern_call(self, node):
        if node.get_device() is None:
            self.flush()
        return original(self, node)

    codegen_extern_call._npu_flushes = True
    scheduler_cls.codegen_extern_call = codegen_extern_call


def _philox_rand_calls_the_npu_kernel() -> None:
    """``rngprims::philox_rand`` on npu is lowered as a call of its npu kernel (torch's lowering
    generates Inductor's own Philox code, whose values are not the kernel's): compiled and
    eager draw the same values."""
    lowering = importlib.import_module("torch._inductor.lowering")
    packet = torch.ops.rngprims.philox_rand
    original = lowering.lowerings[packet]
    if getattr(original, "_npu_kernel_call", False):
        return

    def philox_rand(size, seed, offset, stride, device, dtype):
        if device is not None and torch.device(device).type == DEVICE:
            return lowering.fallback_handler(packet.default, add_to_fallback_set=False)(
                size, seed, offset, stride, device, dtype)
        return original(size, seed, offset, stride, device, dtype)

    philox_rand._npu_kernel_call = True
    lowering.lowerings[packet] = lowering.lowerings[packet.default] = philox_rand


def _npu_inductor_fallback_list() -> None:
    """NPU_INDUCTOR_FALLBACK_LIST (torch_npu's; read when a graph is lowered) for the default
    backend too: in a graph on npu, the listed ATen operators (every one: ``allfallback``) are
    lowered as calls of their npu kernels (Inductor's FallbackKernel) instead of being fused
    into generated C++ kernels. The MLIR backend reads the same list (mlir/compiler.py)."""
    graph_cls = _private("torch._inductor.graph", "GraphLowering")
    original = graph_cls.call_function
    if getattr(original, "_npu_fallback_list", False):
        return
    from torch_npu._inductor.mlir.compiler import fallback_ops, is_listed

    fallback_handler = _private("torch._inductor.lowering", "fallback_handler")

    def call_function(self, target, args, kwargs):
        if DEVICE in self.device_types and is_listed(target, fallback_ops()):
            return fallback_handler(target, add_to_fallback_set=False)(*args, **kwargs)
        return original(self, target, args, kwargs)

    call_function._npu_fallback_list = True
    graph_cls.call_function = call_function


def _vectorized_rand_in_npu_kernels() -> None:
    """``CppVecOverrides.rand`` emits :func:`codegen.vectorized_rand` in npu graphs' kernels.

    Same numbers as the stock per-lane ``normalized_rand_cpu`` loop, several times faster
    (dropout-bound graphs); cpu graphs keep the stock code.
    """
    overrides = _private("torch._inductor.codegen.cpp", "CppVecOverrides")
    original = overrides.rand
    if getattr(original, "_npu_vectorized", False):
        return
    virtualized = _private("torch._inductor.virtualized", "V")
    from torch_npu._inductor.codegen import vectorized_rand

    def rand(seed, offset):
        if virtualized.graph.get_current_device_or_throw().type == DEVICE:
            return vectorized_rand(seed, offset)
        return original(seed, offset)

    rand._npu_vectorized = True
    overrides.rand = staticmethod(rand)


def _flex_attention_lowers_as_on_cpu() -> None:
    """FlexAttention in npu graphs takes Inductor's C++ template, as on cpu.

    Inductor's flex_attention lowering picks the C++ template for "cpu", Metal for "mps"
    and the Triton templates for every other device: a compiled flex_attention on npu
    tensors (transformers' ``attn_implementation="flex_attention"``) failed with "Torch not
    compiled with CUDA enabled". The C++ template is inference-only: a graph that needs the
    backward (or the logsumexp) never reaches it on npu (_flex_attention_trains_dense).
    """
    lowerings = _private("torch._inductor.lowering", "lowerings")
    hop = torch.ops.higher_order
    forward = lowerings[hop.flex_attention]
    if getattr(forward, "_npu_cpu_template", False):
        return
    lower_cpu = _private("torch._inductor.kernel.flex.flex_cpu", "lower_cpu")

    def flex_attention(query, *args, **kwargs):
        if query.get_device().type == DEVICE:
            return lower_cpu(query, *args, **kwargs)
        return forward(query, *args, **kwargs)

    flex_attention._npu_cpu_template = True
    lowerings[hop.flex_attention] = flex_attention


def _flex_attention_dense(*args):
    """The flex_attention operator's dense form (torch's eager implementation, in aten ops)."""
    from torch._higher_order_ops.flex_attention import sdpa_dense

    return sdpa_dense(*args)


def _flex_attention_trains_dense() -> None:
    """A compiled flex_attention on npu that must train takes its dense form.

    Inductor's C++ template (the one a cpu or npu graph gets) computes the forward only:
    one that needs the backward or the logsumexp (``kernel_options["OUTPUT_LOGSUMEXP"]``,
    which flex_attention sets for inputs requiring grad) failed with "torch.compile on CPU
    only supports inference" (transformers' ``test_flex_attention_with_grads``). A pre-grad
    pass, before AOTAutograd, calls torch's eager implementation (score_mod and mask_mod
    vmapped over the scores) in place of the operator in npu graphs that need it: AOTAutograd
    traces it into aten ops, so the backward is derived as for any composition and Inductor
    compiles both (the scores are materialised: memory O(L * S) per head, as eager's).
    Inference graphs keep the C++ template. The pass joins ``config.pre_grad_custom_pass``;
    a program that sets that option afterwards replaces it.
    """
    config = importlib.import_module("torch._inductor.config")
    custom = importlib.import_module("torch._inductor.custom_graph_pass")
    current = custom.get_custom_graph_passes(config.pre_grad_custom_pass)
    if any(getattr(p, "_npu_flex_dense", False) for p in current):
        return

    class FlexAttentionDenseOnNpu(custom.CustomGraphPass):
        _npu_flex_dense = True

        def __call__(self, graph: torch.fx.Graph) -> None:
            for node in graph.nodes:
                if node.op != "call_function" or node.target is not torch.ops.higher_order.flex_attention:
                    continue
                query = node.args[0].meta.get("example_value", node.args[0].meta.get("val"))
                kernel_options = node.args[6] if len(node.args) > 6 else {}
                if (isinstance(query, torch.Tensor) and query.device.type == DEVICE
                        and kernel_options.get("OUTPUT_LOGSUMEXP")):
                    node.target = _flex_attention_dense

        def uuid(self):
            return custom.get_hash_for_files((__file__,))

    passes = [*current, FlexAttentionDenseOnNpu()]
    config.pre_grad_custom_pass = passes[0] if len(passes) == 1 else passes


def _empty_tensors_keep_their_size_when_moved_to_npu() -> None:
    """``torch.empty(...).npu()`` in a graph is an empty npu buffer of the right size.

    Inductor lowers ``empty`` to a buffer whose loop ranges are zero (nothing to compute)
    and whose layout has the size, and moves a buffer that reads no graph input to another
    device by recomputing its loops there (``DeviceCopy.create`` -> ``constant_to_device``),
    which keeps the zero ranges and loses the size: the compiled
    ``torch.empty(8, 64).npu().uniform_()`` returned a [0, 0] tensor. Such a buffer is now
    created empty on the target device with its size, stride and dtype.
    """
    ir = importlib.import_module("torch._inductor.ir")
    device_copy = _private("torch._inductor.ir", "DeviceCopy")
    original = device_copy.create.__func__
    if getattr(original, "_npu_keeps_empty_size", False):
        return
    empty_strided = _private("torch._inductor.lowering", "empty_strided")
    virtualized = _private("torch._inductor.virtualized", "V")

    def uninitialized(x) -> bool:
        buffer = x
        while isinstance(buffer, (ir.TensorBox, ir.StorageBox)):
            buffer = buffer.data
        loops = getattr(buffer, "data", None)
        return (isinstance(buffer, ir.ComputedBuffer) and isinstance(loops, ir.Loops)
                and len(loops.ranges) > 0 and all(r == 0 for r in loops.ranges)
                and buffer.get_numel() != 0
                and ir.try_get_name(x) not in virtualized.graph.mutated_buffers)

    def create(cls, x, device, non_blocking):
        if DEVICE in (device.type, x.get_device().type) and uninitialized(x):
            return empty_strided(list(x.get_size()), list(x.get_stride()), dtype=x.get_dtype(),
                                 device=device).data.data
        return original(cls, x, device, non_blocking)

    create._npu_keeps_empty_size = True
    device_copy.create = classmethod(create)


def register_codecache() -> None:
    """Inductor's cache system info (``CacheBase.get_system()``, the key of its local cache
    folder) names the npu device and the CANN version, as torch's names CUDA's: caches of
    different devices or CANN releases do not mix."""
    codecache = importlib.import_module("torch._inductor.codecache")
    cache_base = _private("torch._inductor.codecache", "CacheBase")
    original = cache_base.get_system
    if getattr(original, "_npu_device", False):
        return
    key_strategy = _private("torch._inductor.codecache", "SYSTEM_CACHE_KEY_STRATEGY")

    @functools.cache
    def get_system():
        system = original()
        if "device" in system or not torch.npu.is_available():
            return system  # a GPU's (torch's), or no npu
        device = {"name": torch.npu.get_device_properties(torch.npu.current_device()).name}
        version = {"triton": codecache.triton_key(), "cann": getattr(torch.version, "cann", None)}
        return {"device": device, "version": version,
                "hash": key_strategy.key_from_json({"device": device, "version": version})}

    get_system._npu_device = True
    cache_base.get_system = staticmethod(get_system)
    cache_base.get_local_cache_path.cache_clear()


@functools.lru_cache(None)
def register_inductor() -> None:
    """Inductor's C++ code generator for npu tensors, and where Inductor must treat npu as cpu."""
    register_dynamo()  # Inductor asks the device interface too (device count, properties)
    from torch_npu._inductor import codegen

    _private("torch._inductor.codegen.common", "register_backend_for_device")(
        DEVICE,
        codegen.NpuCppScheduling,
        codegen.NpuPythonWrapperCodegen,
        codegen.NpuCppWrapperUnsupported,
        _private("torch._inductor.codegen.wrapper_fxir", "WrapperFxCodegen"),
        codegen.NpuCodegenKey())
    cpu_overrides = _private("torch._inductor.codegen.cpu_device_op_overrides", "CpuDeviceOpOverrides")
    _private("torch._inductor.codegen.common", "register_device_op_overrides")(DEVICE, cpu_overrides())
    _treat_npu_as_cpu_in_scheduler()
    _npu_uses_the_cpp_backend()
    _npu_var_mean_takes_the_cpu_rule()
    _no_layout_optimization_around_npu_convolutions()
    _vectorized_rand_in_npu_kernels()
    _npu_inductor_fallback_list()
    _flush_before_deviceless_extern_calls()
    _philox_rand_calls_the_npu_kernel()
    _empty_tensors_keep_their_size_when_moved_to_npu()
    _flex_attention_lowers_as_on_cpu()
    _flex_attention_trains_dense()
