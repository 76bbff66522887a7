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
def register_dynamo() -> None:
    """The npu device interface and torch_npu's Dynamo backends (``torch.compile(backend=...)``)."""
    register_interface_for_device = _private("torch._dynamo.device_interface",
                                             "register_interface_for_device")
    from torch_npu._inductor.device_interface import NpuInterface

    register_interface_for_device(DEVICE, NpuInterface)
    for index in range(torch.npu.device_count()):
        register_interface_for_device(f"{DEVICE}:{index}", NpuInterface)

    from torch_npu import dynamo

    dynamo._register_backends()


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
