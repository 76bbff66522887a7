"""How Dynamo traces calls of torch.npu's device functions inside a compiled function.

Dynamo knows ``torch.cuda.current_device()``, ``torch.cuda.is_available()``,
``torch.cuda.synchronize()`` ... by name (``torch._dynamo.trace_rules``); torch.npu's
functions are Python functions of torch_npu that end in ``torch_npu._C`` calls, which Dynamo
cannot trace, so each of them was a graph break (an error with ``fullgraph=True``).
torch_npu (as Huawei's does) adds them to Dynamo's rules:

* :data:`CONSTANT_FOLD`: evaluated while tracing and baked into the graph as constants
  (``torch.npu.current_device()`` with a guard on its value, like CUDA's), so
  ``torch.empty(..., device=torch.npu.current_device())`` or
  ``if torch.npu.is_available():`` compile into one graph.
* :data:`IN_GRAPH`: called as "torch functions": Dynamo runs them while tracing, and those
  that are not tensor operations (synchronize, cache and statistics resets) do not
  end up in the compiled graph, as with Huawei's torch_npu.
* :data:`KERNEL_MODULES`: files whose functions are operator kernels (``torch.ops.npu`` /
  ``torch.ops.atb`` written in Python): Dynamo skips them as it skips torch's own files. A
  kernel called from a compiled frame after a graph break runs as it is; traced, it saw fake
  tensors, which have no storage format (an ATB paged attention over a FRACTAL_NZ cache).
* :data:`SKIP`: a graph break, the call runs eagerly every time, as ``torch.cuda.manual_seed``'s
  rule: seeding run only while tracing would leave every later call of the compiled function
  unseeded. (``transfer_to_npu`` makes ``torch.cuda.manual_seed`` this very function, so the two
  rules must agree.)
"""
import functools

import torch

__all__ = ["CONSTANT_FOLD", "CONSTANT_FOLD_GUARDED", "IN_GRAPH", "KERNEL_MODULES", "SKIP", "register_trace_rules"]

# functions whose result is the same for the process (folded without a guard)
CONSTANT_FOLD = (
    "torch.npu.is_available",
    "torch.npu.device_count",
    "torch.npu.get_device_properties",
    "torch.npu.get_device_capability",
    "torch.npu.get_device_name",
    "torch.npu.is_bf16_supported",
)
# folded, and the compiled code is guarded on the value (another device -> recompile)
CONSTANT_FOLD_GUARDED = ("torch.npu.current_device",)

# run while tracing, like CUDA's counterparts in torch._dynamo.trace_rules
IN_GRAPH = (
    "torch.npu.current_stream",
    "torch.npu.default_stream",
    "torch.npu.stream",
    "torch.npu.set_stream",
    "torch.npu.synchronize",
    "torch.npu.graphs.graph_pool_handle",
    "torch.npu.mem_get_info",
    "torch.npu.memory.empty_cache",
    "torch.npu.memory._record_memory_history_impl",
    "torch.npu.memory._set_allocator_settings",
    "torch.npu.memory._dump_snapshot",
    "torch.npu.memory.reset_accumulated_memory_stats",
    "torch.npu.memory.reset_max_memory_allocated",
    "torch.npu.memory.reset_max_memory_cached",
    "torch.npu.memory.reset_peak_memory_stats",
    "torch.npu.memory.get_per_process_memory_fraction",
    "torch.npu.memory.set_per_process_memory_fraction",
    "torch.npu.memory._get_current_allocator",
    "torch.npu.random.seed",
    "torch.npu.random.seed_all",
    "torch.npu.set_sync_debug_mode",
    "torch.npu.is_initialized",
    "torch.npu.amp.autocast_mode.custom_fwd",
    "torch.npu.amp.autocast_mode.custom_bwd",
    "torch_npu._C._npu_getDefaultStream",
    "torch_npu._C._npu_getCurrentStream",
    "torch_npu._C._npu_setStream",
    "torch_npu._C._npu_synchronize",
    "torch_npu._C._npu_setDevice",
    "torch_npu._C._npu_getDevice",
    "torch_npu._C._npu_init",
    "torch_npu._C._npu_emptyCache",
    "torch_npu._C._npu_getAllocator",
    "torch_npu._C._npu_changeCurrentAllocator",
    "torch_npu._C._npu_npuCachingAllocator_set_allocator_settings",
    "torch_npu._C._npu_resetPeakMemoryStats",
    "torch_npu._C._npu_resetAccumulatedMemoryStats",
    "torch_npu._C._npu_setMemoryFraction",
)

# graph breaks, run eagerly at every call (CUDA's counterparts are SkipFunctionVariable)
SKIP = (
    "torch.npu.random.manual_seed",
    "torch.npu.random.manual_seed_all",
)

KERNEL_MODULES = ("torch_npu._composite_ops", "torch_npu._atb_ops", "torch_npu._attention_ops", "torch_npu._ffn_ops",
                  "torch_npu._gmm_quant_ops", "torch_npu._obfuscation_ops", "torch_npu._quant_ops", "torch_npu._afd._ops",
                  "torch_npu._afd._worker_ops")


def _resolve(name: str):
    """The object ``name`` names, or None if this build of torch_npu lacks it."""
    module, _, attr = name.partition(".")
    obj = {"torch": torch, "torch_npu": __import__("torch_npu")}[module]
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def register_trace_rules() -> None:
    """Add torch.npu's functions to Dynamo's trace rules (idempotent)."""
    from torch._dynamo import trace_rules
    from torch._dynamo.utils import common_constant_types
    from torch._dynamo.variables import SkipFunctionVariable, TorchInGraphFunctionVariable
    from torch._dynamo.variables import torch as torch_variables

    names = [n for n in CONSTANT_FOLD + CONSTANT_FOLD_GUARDED + IN_GRAPH if _resolve(n) is not None]
    rules = dict.fromkeys(names, TorchInGraphFunctionVariable)
    rules.update(dict.fromkeys((n for n in SKIP if _resolve(n) is not None), SkipFunctionVariable))
    if not any(rule == rules for rule in trace_rules.torch_name_rule_map):
        trace_rules.torch_name_rule_map.append(rules)
        trace_rules.clear_lru_cache()  # the object -> rule map is cached
    import importlib.util

    for module in KERNEL_MODULES:
        origin = importlib.util.find_spec(module).origin
        if origin not in trace_rules.SKIP_DIRS:
            trace_rules.add(module)
    for name in CONSTANT_FOLD + CONSTANT_FOLD_GUARDED:
        fn = _resolve(name)
        if fn is not None:
            torch_variables.constant_fold_functions[fn] = None
    for name in CONSTANT_FOLD_GUARDED:
        torch_variables.constant_fold_functions_need_guards[_resolve(name)] = None
    # get_device_properties' result is a constant (its attributes are read while tracing)
    from torch_npu.npu.utils import _NPUDeviceProperties

    common_constant_types.add(_NPUDeviceProperties)
    _add_stream_support()


def _add_stream_support() -> None:
    """torch.npu.Stream / Event built inside a compiled function become graph objects, as
    torch.cuda's: Dynamo lists those classes by name (UserDefinedClassVariable._in_graph_classes),
    and inlining our Python ``__new__`` would break the graph at torch.Stream's C ``__new__``."""
    from torch._dynamo.variables.user_defined import UserDefinedClassVariable

    original = UserDefinedClassVariable._in_graph_classes
    if getattr(original, "_npu_classes", False):
        return
    classes = frozenset({torch.npu.Stream, torch.npu.Event})

    def _in_graph_classes():
        return original() | classes

    _in_graph_classes._npu_classes = True
    UserDefinedClassVariable._in_graph_classes = staticmethod(_in_graph_classes)

    # torch.npu.current_stream() reads Dynamo's symbolic current stream, as torch.cuda's does
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    handlers = TorchInGraphFunctionVariable._get_handlers
    if not getattr(handlers, "_npu_handlers", False):
        def _get_handlers():
            table = handlers()
            table.setdefault(torch.npu.current_stream, table[torch.accelerator.current_stream])
            return table

        _get_handlers._npu_handlers = True
        TorchInGraphFunctionVariable._get_handlers = staticmethod(functools.cache(_get_handlers))
