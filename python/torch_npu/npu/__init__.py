r"""``torch.npu``: the device module of Ascend NPUs (registered as ``torch.npu``).

Mirrors ``torch.cuda``'s API with torch_npu's names: device selection and
properties (:mod:`.utils`), streams and events (:mod:`.streams`), the caching
allocator (:mod:`.memory`), random number generators (:mod:`.random`), mixed
precision (:mod:`.amp`) and runtime options (:mod:`.config`).
"""

import atexit
import glob
import os
import threading
import traceback
import warnings
from typing import Callable, List, Tuple, Union

import torch

from torch_npu import _C

from . import _acl_init
from . import utils
from .utils import (
    _get_device_index,
    _sleep,
    can_device_access_peer,
    current_blas_handle,
    current_device,
    device,
    device_count,
    device_of,
    get_cann_version,
    get_device_capability,
    get_device_name,
    get_device_properties,
    get_soc_version,
    is_available,
    is_bf16_supported,
    is_support_inf_nan,
    mem_get_info,
    set_device,
    synchronize,
    utilization,
)
from . import streams
from .streams import (
    _launch_host_func,
    _launch_host_func_pending,
    _subscribe_report,
    _unsubscribe_report,
    Event,
    ExternalEvent,
    ExternalStream,
    Stream,
    StreamContext,
    SyncLaunchStream,
    current_stream,
    default_stream,
    get_sync_debug_mode,
    set_stream,
    set_sync_debug_mode,
    stream,
)
from . import memory
from .memory import (
    MemPool,
    NPUPluggableAllocator,
    OutOfMemoryError,
    caching_allocator_alloc,
    change_current_allocator,
    caching_allocator_delete,
    empty_cache,
    empty_virt_addr_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_empty_cache,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    use_mem_pool,
)
from . import random
from .random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from . import config
from .config import (
    conv,
    get_mm_bmm_format_nd,
    get_option,
    is_jit_compile_false,
    matmul,
    set_compile_mode,
    set_mm_bmm_format_nd,
    set_option,
)
from . import amp
from . import autocast_utils
from .autocast_utils import (get_amp_supported_dtype, is_autocast_enabled, set_autocast_enabled,
                             get_autocast_dtype, set_autocast_dtype)
from . import op_support
from .op_support import get_cpu_fallback, is_op_supported, set_cpu_fallback
from . import graphs
from . import comm
from .graphs import (NPUGraph, graph, graph_pool_handle, graph_task_group_begin, graph_task_group_end,
                     graph_task_update_begin, graph_task_update_end, is_current_stream_capturing,
                     make_graphed_callables, super_kernel_scope_begin, super_kernel_scope_end)
from ._npugraph_handlers import NpuGraphOpHandler, register_npu_graph_handler
from . import _tensor_types
from . import aclnn, backends, deterministic
from .backends import (enable_flash_sdp, enable_math_sdp, enable_mem_efficient_sdp, flash_sdp_enabled,
                       math_sdp_enabled, mem_efficient_sdp_enabled, preferred_linalg_library, sdp_kernel)
from .deterministic import disable_deterministic_with_backward, enable_deterministic_with_backward
from ._tensor_types import (  # noqa: F401  (torch.npu.FloatTensor, ... legacy types)
    BFloat16Tensor, BoolTensor, ByteTensor, CharTensor, ComplexDoubleTensor, ComplexFloatTensor,
    DoubleTensor, FloatTensor, HalfTensor, IntTensor, LongTensor, ShortTensor)
from . import _storage_types
from ._storage_types import (  # noqa: F401  (torch.npu.FloatStorage, ... legacy typed storages)
    BFloat16Storage, BoolStorage, ByteStorage, CharStorage, ComplexDoubleStorage, ComplexFloatStorage,
    DoubleStorage, FloatStorage, HalfStorage, IntStorage, LongStorage, ShortStorage)

__all__ = [
    "get_cpu_fallback", "is_op_supported", "set_cpu_fallback",
    # device
    "is_available", "device_count", "set_device", "current_device", "synchronize", "device",
    "device_of", "get_device_name", "get_device_properties", "get_device_capability",
    "can_device_access_peer", "utilization", "mem_get_info", "is_initialized", "init", "npurt",
    "get_soc_version", "is_support_inf_nan", "current_blas_handle", "get_cann_version",
    "obfuscation_initialize", "obfuscation_finalize", "obfuscation_calculate",
    # streams / events
    "Stream", "Event", "ExternalEvent", "ExternalStream", "SyncLaunchStream", "StreamContext", "stream", "set_stream",
    "current_stream", "default_stream", "set_sync_debug_mode", "get_sync_debug_mode",
    # memory
    "caching_allocator_alloc", "caching_allocator_delete", "empty_cache", "empty_virt_addr_cache", "ipc_collect",
    "memory_stats", "memory_stats_as_nested_dict", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "host_empty_cache", "reset_accumulated_memory_stats",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "memory_snapshot", "memory_summary",
    "set_per_process_memory_fraction", "get_per_process_memory_fraction", "get_allocator_backend",
    "MemPool", "use_mem_pool", "NPUPluggableAllocator", "change_current_allocator",
    # random
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "initial_seed", "default_generators",
    # amp
    "amp", "get_amp_supported_dtype", "is_bf16_supported", "is_autocast_enabled",
    "set_autocast_enabled", "get_autocast_dtype", "set_autocast_dtype",
    # config
    "config", "matmul", "conv", "set_option", "get_option", "set_compile_mode",
    "is_jit_compile_false", "set_mm_bmm_format_nd", "get_mm_bmm_format_nd",
    # graphs
    "NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
    "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end",
    "super_kernel_scope_begin", "super_kernel_scope_end", "NpuGraphOpHandler", "register_npu_graph_handler",
    # backends
    "aclnn", "preferred_linalg_library", "enable_deterministic_with_backward",
    "disable_deterministic_with_backward",
] + _tensor_types.__all__ + _storage_types.__all__ + backends.__all__
# as torch_npu's: the complex tensor types and OutOfMemoryError (torch's) are attributes only
__all__ = [name for name in __all__ if name not in ("ComplexFloatTensor", "ComplexDoubleTensor")]

# ----------------------------------------------------------------------------------
# Initialisation. _lazy_init() runs once per process, on the first npu tensor or torch.npu
# call: it checks the environment, calls _C._npu_init() (torch_npu's name; the hooks
# `import torch_npu` installed with _C._npu_install_hooks(), idempotent), takes each device's
# default generator, and then runs the calls queued
# before it (e.g. torch.npu.manual_seed at import time of a user module).

#: Default generator of each device (filled by :func:`_lazy_init`).
default_generators: Tuple[torch.Generator, ...] = ()

_initialized = False
_original_pid = None
_tls = threading.local()
_initialization_lock = threading.Lock()
_queued_calls: List[Tuple[Callable[[], None], List[str]]] = []
_queued_seed = None
_queued_seed_all = None


class _DeferredNpuCallError(Exception):
    pass


def is_initialized():
    r"""Return whether the NPU runtime of this process has been initialised."""
    return _initialized and not _is_in_bad_fork()


def _is_in_bad_fork() -> bool:
    return bool(_C._npu_isInBadFork())


def _lazy_call(cb: Callable[[], None], seed: bool = False, seed_all: bool = False) -> None:
    global _queued_seed, _queued_seed_all
    if is_initialized():
        cb()
        return
    stack = traceback.format_stack()
    # Only the last seeding call matters; keep it in its own slot.
    if seed_all:
        _queued_seed_all = (cb, stack)
    elif seed:
        _queued_seed = (cb, stack)
    else:
        _queued_calls.append((cb, stack))


def _get_generator(device: Union[int, str, torch.device]) -> torch._C.Generator:
    """The default generator of npu ``device`` (the current device when it has no index)."""
    return random._generator(device, "_get_generator")


def _set_rng_state_offset(offset: int, device: Union[int, str, torch.device] = "npu") -> None:
    """Sets the offset (in the Philox counter) of an npu device's default generator."""
    _lazy_call(lambda: random._generator(device, "_set_rng_state_offset").set_offset(offset))


def _get_rng_state_offset(device: Union[int, str, torch.device] = "npu") -> int:
    """The offset (in the Philox counter) of an npu device's default generator."""
    return random._generator(device, "_get_rng_state_offset").get_offset()


def init():
    r"""Initialise the NPU runtime of this process (done on demand by every NPU API)."""
    _lazy_init()


def npurt():
    r"""The NPU runtime API module ``torch_npu._C._npurt`` (after initialising the runtime):
    ``npuHostRegister(ptr, size, flags)``, ``npuHostUnregister(ptr)``,
    ``npuStreamCreate(stream_p)`` and ``npuStreamDestroy(stream)``, each returning the runtime's
    error code (0: success). See torch_npu/_npurt.py for what the simulator does."""
    _lazy_init()
    return _C._npurt


def _lazy_init() -> None:
    global _initialized, _original_pid, default_generators, _queued_seed, _queued_seed_all
    if _initialized or hasattr(_tls, "is_initializing"):
        return
    with _initialization_lock:
        if _initialized:
            return
        if _is_in_bad_fork():
            raise RuntimeError("Cannot re-initialize NPU in forked subprocess. To use NPU with "
                               "multiprocessing, you must use the 'spawn' start method")
        _acl_init.check_environment()  # TORCH_ACL_INIT_CONFIG_PATH, ACL_OP_INIT_MODE
        _C._npu_init()
        default_generators = tuple(_C._npu_getDefaultGenerator(i)
                                   for i in range(device_count()))
        _original_pid = os.getpid()
        _tls.is_initializing = True
        try:
            calls = [c for c in (_queued_seed_all, _queued_seed) if c is not None]
            calls += _queued_calls
            for cb, stack in calls:
                try:
                    cb()
                except Exception as err:
                    raise _DeferredNpuCallError(
                        f"NPU call failed lazily at initialization with error: {err}\n\n"
                        f"NPU call was originally invoked at:\n\n{''.join(stack)}") from err
            _queued_calls.clear()
            _queued_seed = _queued_seed_all = None
        finally:
            delattr(_tls, "is_initializing")
        _initialized = True


def _drain_autograd_threads_at_exit() -> None:
    """Lets PyTorch's autograd worker thread of each used npu finish before Python shuts down.

    backward() returns as soon as the graph is done, while the npu worker thread may still
    hold the last reference to the finished GraphTask. Destroying it there releases the
    Python objects its thread-local state captured (torch.autograd stashes a contextvars
    context for every backward), which takes the GIL. If the interpreter is finalizing by
    then, Python ends that thread with pthread_exit, whose unwinding through libtorch's
    noexcept frames aborts the process ("terminate called without an active exception").

    A tiny backward queued on each used device is picked up by its worker only after the
    previous GraphTask is released. It calls the engine directly, without the stashed
    context, so releasing its own GraphTask needs no GIL and cannot race finalization.
    """
    if not _initialized or _is_in_bad_fork() or os.getpid() != _original_pid:
        return
    try:
        # PyTorch names its worker threads "pt_autograd_<device>"; without them (no backward
        # ran) there is nothing to wait for, and a backward here would start them at exit.
        names = []
        for path in glob.glob("/proc/self/task/*/comm"):
            with open(path) as f:
                names.append(f.read())
        if not any(name.startswith("pt_autograd_") for name in names):
            return
        engine = torch.autograd.Variable._execution_engine
        for index in range(device_count()):
            if memory.max_memory_allocated(index) == 0:
                continue  # never ran anything, so no autograd worker thread either
            x = torch.zeros((), device=torch.device("npu", index), requires_grad=True)
            y = x * 1
            engine.run_backward((y,), (torch.ones_like(y),), False, False, (), True, True)
    except Exception:  # nothing to save at exit: the process is ending either way
        pass


def _npu_shutdown():
    """Drains every device's streams before the interpreter finalizes (torch_npu's exit hook):
    a kernel still queued would otherwise run while Python tears down."""
    if is_initialized():
        _C._npu_shutdown_synchronize()


# atexit runs the last registered first: the autograd drain (which queues work) before this.
atexit.register(_npu_shutdown)
atexit.register(_drain_autograd_threads_at_exit)


def _after_fork_in_child() -> None:
    global _initialized
    if _initialized and _original_pid != os.getpid():
        _initialized = False
        _C._npu_markBadFork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ----------------------------------------------------------------------------------
# AMP hooks used by torch.autocast("npu") and torch.npu.amp.


def ipc_collect():
    """Frees the npu memory this process sent to others (torch.multiprocessing) that no
    receiving process uses any more (torch.cuda.ipc_collect's counterpart)."""
    from torch_npu.multiprocessing.reductions import ipc_collect as collect

    collect()


_deterministic_level = 0


def set_deterministic_level(level):
    r"""Deterministic computation level: 0 off, 1 deterministic operators, 2 deterministic
    operators and collective communication. Levels >= 1 turn on
    ``torch.use_deterministic_algorithms`` (0 turns it off), with torch_npu's warnings. The
    simulator's kernels (ATen CPU kernels run in order) and its hccl reductions (rank order)
    are deterministic at every level."""
    global _deterministic_level
    if isinstance(level, bool) or not isinstance(level, int) or level not in (0, 1, 2):
        raise ValueError(f"set_deterministic_level(): level must be 0, 1 or 2, got {level!r}")
    enabled = torch.are_deterministic_algorithms_enabled()
    if level == 0 and enabled:
        warnings.warn("The current configuration value of 'torch_npu.npu.set_deterministic_level' "
                      "conflicts with 'torch.use_deterministic_algorithms'. "
                      "'torch.use_deterministic_algorithms' has been configured to 'False'.")
        torch.use_deterministic_algorithms(False)
    elif level >= 1 and not enabled:
        warnings.warn("The current configuration value of 'torch_npu.npu.set_deterministic_level' "
                      "conflicts with 'torch.use_deterministic_algorithms'. "
                      "'torch.use_deterministic_algorithms' has been configured to 'True'.")
        torch.use_deterministic_algorithms(True)
    _deterministic_level = level
    warnings.warn("After using 'torch_npu.npu.set_deterministic_level', please do not use "
                  "'torch.use_deterministic_algorithms' anymore, as it may cause unknown errors.")


def _get_deterministic_level():
    r"""The level :func:`set_deterministic_level` set last (0 at start)."""
    return _deterministic_level


def use_compatible_impl(is_enable):
    r"""Prefer the operator implementations that match PyTorch's CUDA results over the faster
    NPU-specific ones (option ``TORCH_NPU_USE_COMPATIBLE_IMPL``). The simulator's kernels are
    ATen's, so both choices compute the same; the option is recorded."""
    set_option({"TORCH_NPU_USE_COMPATIBLE_IMPL": "1" if is_enable else "0"})


def are_compatible_impl_enabled():
    r"""Whether :func:`use_compatible_impl` is on."""
    return get_option("TORCH_NPU_USE_COMPATIBLE_IMPL") == "1"


from . import npu_config  # noqa: E402
from .npu_config import (set_aoe, set_dump, init_dump, finalize_dump, set_device_limit,  # noqa: E402
                         get_device_limit, set_stream_limit, get_stream_limit, reset_stream_limit)
from . import mstx as _mstx_module  # noqa: E402,F401
from .mstx import mstx  # noqa: E402
from .utils import (get_npu_overflow_flag, clear_npu_overflow_flag,  # noqa: E402
                    stress_detect, check_uce_in_memory, set_op_timeout_ms,
                    obfuscation_initialize, obfuscation_finalize, obfuscation_calculate)
from ._recovery import restart_device, stop_device  # noqa: E402

# torch_npu.npu.utils also carries the stream, sync-debug, ipc and dump functions.
for _name in ("current_stream", "default_stream", "set_stream", "stream", "StreamContext",
              "set_sync_debug_mode", "get_sync_debug_mode"):
    setattr(utils, _name, getattr(streams, _name))
for _name in ("set_dump", "init_dump", "finalize_dump"):
    setattr(utils, _name, getattr(npu_config, _name))
utils.ipc_collect = ipc_collect
del _name

__all__ += ["set_deterministic_level", "use_compatible_impl", "are_compatible_impl_enabled",
            "set_aoe", "set_dump", "init_dump", "finalize_dump", "set_device_limit",
            "get_device_limit", "set_stream_limit", "get_stream_limit", "reset_stream_limit",
            "mstx", "get_npu_overflow_flag", "clear_npu_overflow_flag", "stress_detect",
            "check_uce_in_memory", "set_op_timeout_ms", "autocast_utils", "restart_device", "stop_device"]


def __getattr__(name):
    # torch.npu.npugraph_ex is imported on first use (it imports Inductor's pattern matcher).
    if name == "npugraph_ex":
        import importlib

        return importlib.import_module("torch_npu.npu.npugraph_ex")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
