"""Memory management API of ``torch.npu``: the caching allocator's statistics and controls.

The allocator itself lives in C++ (block pools, splitting, stream-ordered reuse,
``PYTORCH_NPU_ALLOC_CONF``); these functions read and drive it through
``torch_npu._C`` and give the results the shapes of ``torch.cuda``'s memory API,
with torch_npu's names ("NPU reserved memory", "npuMalloc retries").
"""

import collections
import contextlib
import ctypes
import pickle
import sys
import warnings
from typing import Any, Dict, Optional, Tuple

import torch

from torch_npu import _C
from .utils import _valid_device_index, _lazy_init
from ..utils._error_code import ErrCode, pta_error

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "empty_cache",
    "empty_virt_addr_cache",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats",
    "host_empty_cache",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "memory_snapshot",
    "memory_summary",
    "get_allocator_backend",
    "NPUPluggableAllocator",
    "change_current_allocator",
    "MemPool",
    "use_mem_pool",
]

OutOfMemoryError = torch.OutOfMemoryError

from .utils import mem_get_info  # noqa: E402  (re-exported here, as torch.cuda.memory does)


def caching_allocator_alloc(size, device=None, stream=None):
    r"""Allocate ``size`` bytes from the NPU caching allocator and return the address.

    Args:
        size (int): number of bytes.
        device (torch.device or int, optional): the device; the current one if ``None``.
        stream (torch.npu.Stream or int, optional): the stream the memory is used on
            (an ``aclrtStream`` address if an int); the current stream of the device if
            ``None``.

    Free it with :func:`caching_allocator_delete`.
    """
    from .streams import StreamContext, current_stream

    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError("caching_allocator_alloc(): argument 'size' must be an int, "
                        f"got {type(size).__name__}")
    if size < 0:
        raise ValueError(f"caching_allocator_alloc(): argument 'size' must be >= 0, got {size}")
    _lazy_init()
    idx = _valid_device_index(device, fn="caching_allocator_alloc")
    if stream is None:
        stream = current_stream(idx)
    stream_obj = None
    if isinstance(stream, torch.Stream):
        if stream.device.type != "npu":
            raise ValueError("caching_allocator_alloc(): argument 'stream' must be a stream of "
                             f"an npu device, got one of {stream.device}")
        stream_obj = stream
        stream = int(_C._npu_streamRawHandle(stream.stream_id, stream.device_index))
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError("caching_allocator_alloc(): argument 'stream' must be a torch.npu.Stream "
                        f"or an int (an aclrtStream address), got {type(stream).__name__}")
    from .utils import device as _device

    # The block is tied to the current stream of the device: make the requested one current.
    with _device(idx), StreamContext(stream_obj):
        return int(_C._npu_cachingAllocator_raw_alloc(size, stream))


def caching_allocator_delete(mem_ptr):
    r"""Free memory obtained from :func:`caching_allocator_alloc`."""
    if isinstance(mem_ptr, bool) or not isinstance(mem_ptr, int):
        raise TypeError("caching_allocator_delete(): argument 'mem_ptr' must be an int, "
                        f"got {type(mem_ptr).__name__}")
    _C._npu_cachingAllocator_raw_delete(mem_ptr)


_memory_fraction: Dict[int, float] = {}


def set_per_process_memory_fraction(fraction, device=None) -> None:
    r"""Limit the caching allocator of ``device`` to ``fraction`` of its memory.

    Allocations beyond the limit raise :class:`OutOfMemoryError`.

    Args:
        fraction (float): in ``[0, 1]``.
        device (torch.device or int, optional): the device; the current one if ``None``.
    """
    # Only a float, as torch_npu and torch.cuda accept (an int 1 is rejected too).
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`: "
                        "set_per_process_memory_fraction(): argument 'fraction' must be a float, "
                        f"got {type(fraction).__name__}" + pta_error(ErrCode.TYPE))
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1 "
                         f"(set_per_process_memory_fraction(): argument 'fraction')"
                         + pta_error(ErrCode.VALUE))
    _lazy_init()
    idx = _valid_device_index(device, fn="set_per_process_memory_fraction")
    _C._npu_setMemoryFraction(fraction, idx)
    _memory_fraction[idx] = fraction


def get_per_process_memory_fraction(device=None) -> float:
    r"""Return the fraction set by :func:`set_per_process_memory_fraction` (1.0 by default)."""
    idx = _valid_device_index(device, fn="get_per_process_memory_fraction")
    return _memory_fraction.get(idx, 1.0)


def get_allocator_backend() -> str:
    r"""The allocator serving npu memory: ``"native"`` (the caching allocator) or
    ``"pluggable"`` (an :class:`NPUPluggableAllocator` installed by
    :func:`change_current_allocator`)."""
    return _C._npu_getAllocatorBackend()


def _set_allocator_settings(settings: str) -> None:
    r"""Change caching allocator options at run time, in ``PYTORCH_NPU_ALLOC_CONF`` syntax
    (e.g. ``"max_split_size_mb:50,garbage_collection_threshold:0.8"``)."""
    if not isinstance(settings, str):
        raise TypeError("_set_allocator_settings(): argument 'settings' must be a str, "
                        f"got {type(settings).__name__}")
    _lazy_init()
    _C._npu_setAllocatorSettings(settings)


def empty_cache():
    r"""Release the cached, unused blocks of the caching allocator back to the device.

    Memory held by tensors is not freed; ``memory_reserved()`` drops to what is in use.
    """
    from . import is_initialized

    if is_initialized():
        _C._npu_emptyCache()


def empty_virt_addr_cache():
    r"""A lighter :func:`empty_cache` for ``expandable_segments:True``: the cached free pages of
    the expandable segments are unmapped (``memory_reserved()`` drops as with ``empty_cache``),
    but their physical memory is kept for the next pages mapped, saving its allocation then;
    ``empty_cache()`` frees it. Raises without expandable segments.
    """
    from . import is_initialized

    if is_initialized():
        _C._npu_emptyVirtAddrCache()


def memory_stats_as_nested_dict(device=None):
    r"""Return :func:`memory_stats` as a nested dictionary."""
    _lazy_init()
    idx = _valid_device_index(device, fn="memory_stats")
    return _C._npu_memoryStats(idx)


def memory_stats(device=None):
    r"""Return the caching allocator statistics of an NPU, as a flat, sorted dict.

    Keys are ``"<stat>.<pool>.<metric>"`` as in ``torch.cuda.memory_stats``:
    stats ``allocated_bytes``, ``reserved_bytes``, ``active_bytes``,
    ``inactive_split_bytes``, ``requested_bytes``, ``allocation``, ``segment``,
    ``active``, ``inactive_split``; pools ``all``, ``large_pool``, ``small_pool``;
    metrics ``current``, ``peak``, ``allocated``, ``freed``. Plus event counters
    such as ``num_alloc_retries`` and ``num_ooms``.

    Args:
        device (torch.device or int, optional): the device; the current one if ``None``.
    """
    return _flat_sorted(memory_stats_as_nested_dict(device))


def _flat_sorted(nested) -> "collections.OrderedDict":
    flat = []

    def flatten(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                flatten(f"{prefix}.{key}" if prefix else str(key), sub)
        else:
            flat.append((prefix, value))

    flatten("", nested)
    flat.sort()
    return collections.OrderedDict(flat)


def host_memory_stats_as_nested_dict():
    r"""Return :func:`host_memory_stats` as a nested dictionary."""
    _lazy_init()
    return _C._npu_hostMemoryStats()


def host_memory_stats():
    r"""Return the pinned-host allocator's statistics (``pin_memory()``, pinned ``empty``), as a
    flat, sorted dict with ``torch.cuda.host_memory_stats``'s keys: ``allocations`` /
    ``allocated_bytes`` (blocks held, in use or cached), ``active_requests`` / ``active_bytes``
    (in use), each ``.{current,peak,allocated,freed}``; ``num_host_alloc`` / ``num_host_free``
    (blocks taken from / returned to the host) and ``host_alloc_time`` / ``host_free_time``
    (microseconds, ``.{total,max,min,count,avg}``).

    Requests are rounded up to a power of two (up to ``pinned_max_round_threshold_mb`` of
    ``PYTORCH_NPU_ALLOC_CONF``); a freed block of at most ``pinned_max_cached_size_mb`` is
    cached for reuse, once every copy that uses it has run.
    """
    return _flat_sorted(host_memory_stats_as_nested_dict())


def reset_accumulated_host_memory_stats():
    r"""Reset the accumulated (``allocated``/``freed``, counts and times) host memory statistics."""
    _lazy_init()
    _C._npu_resetAccumulatedHostMemoryStats()


def reset_peak_host_memory_stats():
    r"""Reset the ``peak`` values of the host memory statistics to their current values."""
    _lazy_init()
    _C._npu_resetPeakHostMemoryStats()


def host_empty_cache():
    r"""Return the cached pinned-host blocks to the host (those in use stay)."""
    _lazy_init()
    _C._npu_hostEmptyCache()


def reset_accumulated_memory_stats(device=None):
    r"""Reset the accumulated ("allocated"/"freed", retry and OOM) counters of :func:`memory_stats`."""
    _lazy_init()
    _C._npu_resetAccumulatedMemoryStats(_valid_device_index(device, fn="reset_accumulated_memory_stats"))


def reset_peak_memory_stats(device=None):
    r"""Reset the "peak" values of :func:`memory_stats` to the current ones."""
    _lazy_init()
    _C._npu_resetPeakMemoryStats(_valid_device_index(device, fn="reset_peak_memory_stats"))


def reset_max_memory_allocated(device=None):
    r"""Deprecated: calls :func:`reset_peak_memory_stats`, which resets all peaks."""
    warnings.warn("torch.npu.reset_max_memory_allocated now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None):
    r"""Deprecated: calls :func:`reset_peak_memory_stats`, which resets all peaks."""
    warnings.warn("torch.npu.reset_max_memory_cached now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning)
    reset_peak_memory_stats(device)


def memory_allocated(device=None):
    r"""Return the bytes of device memory occupied by tensors (rounded allocation sizes)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    r"""Return the peak of :func:`memory_allocated` since start or the last peak reset."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    r"""Return the bytes of device memory held by the caching allocator."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    r"""Return the peak of :func:`memory_reserved` since start or the last peak reset."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device=None):
    r"""Deprecated name of :func:`memory_reserved`."""
    warnings.warn("torch.npu.memory_cached has been renamed to torch.npu.memory_reserved",
                  FutureWarning)
    return memory_reserved(device)


def max_memory_cached(device=None):
    r"""Deprecated name of :func:`max_memory_reserved`."""
    warnings.warn("torch.npu.max_memory_cached has been renamed to torch.npu.max_memory_reserved",
                  FutureWarning)
    return max_memory_reserved(device)


def _check_pool_id(mempool_id, fn: str):
    if (not isinstance(mempool_id, tuple) or len(mempool_id) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in mempool_id)):
        raise TypeError(f"{fn}(): argument 'mempool_id' must be None or a pool id (a tuple of two "
                        f"non-negative ints, e.g. MemPool().id), got {mempool_id!r}")
    return mempool_id


def memory_snapshot(mempool_id=None) -> list:
    r"""Return the segments of the caching allocator, on all devices.

    Each segment is a dict with ``device``, ``address``, ``total_size``,
    ``allocated_size``, ``active_size``, ``requested_size``, ``stream``,
    ``segment_type`` (``"small"``/``"large"``), ``segment_pool_id``, ``is_expandable``,
    ``frames`` and ``blocks`` (each with ``address``, ``size``, ``requested_size``,
    ``state`` and ``frames``), like ``torch.cuda.memory_snapshot()``.

    Args:
        mempool_id (Tuple[int, int], optional): only the segments of this memory pool
            (:attr:`MemPool.id`, a graph's ``pool()``); all segments if ``None``.
    """
    _lazy_init()
    if mempool_id is not None:
        mempool_id = _check_pool_id(mempool_id, "memory_snapshot")
    return _C._npu_memorySnapshot(mempool_id)["segments"]


# ----------------------------------------------------------------------------------
# Memory history: _record_memory_history / _snapshot / _dump_snapshot, in the format of
# torch.cuda.memory._snapshot (readable by torch.cuda._memory_viz and pytorch.org/memory_viz).

def _record_memory_history(enabled: Optional[str] = "all", *args, **kwargs) -> None:
    r"""Start (or stop) recording the history of the caching allocator and the stack traces
    of allocations, shown by :func:`_snapshot`.

    Args:
        enabled (``None``, ``"state"`` or ``"all"``): ``None`` stops recording (and drops the
            history); ``"state"`` keeps the stacks of the memory allocated now; ``"all"``
            also keeps the history of alloc/free calls. Defaults to ``"all"``.
        context (``None``, ``"state"``, ``"alloc"`` or ``"all"``): which stacks to keep:
            none, those of live allocations, also of every alloc in the history, also of
            frees. Defaults to ``"all"``.
        stacks (``"python"`` or ``"all"``): Python (and TorchScript) frames only, or C++
            frames too. Defaults to ``"all"``.
        max_entries (int): keep at most this many history entries per device (the oldest
            are dropped).
        device: accepted for torch.cuda's signature; recording covers every npu device.
    """
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(enabled: Optional[str] = "all", context: Optional[str] = "all",
                                stacks: str = "all", max_entries: int = sys.maxsize,
                                device=None) -> None:
    for name, value, allowed in (("enabled", enabled, (None, "state", "all")),
                                 ("context", context, (None, "state", "alloc", "all")),
                                 ("stacks", stacks, ("python", "all"))):
        if value not in allowed:
            raise ValueError(f"_record_memory_history(): argument '{name}' must be one of "
                             f"{', '.join(repr(a) for a in allowed)}, got {value!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError("_record_memory_history(): argument 'max_entries' must be a positive int, "
                         f"got {max_entries!r}")
    _lazy_init()
    if device is not None:
        _valid_device_index(device, fn="_record_memory_history")
    _C._npu_record_memory_history(enabled, context, stacks, min(max_entries, 2**63 - 1))


def _snapshot(device=None, augment_with_fx_traces: bool = False) -> Dict[str, Any]:
    r"""Return the state of the caching allocator and its recorded history.

    ``{"segments": [...], "device_traces": [[...], ...]}`` as ``torch.cuda.memory._snapshot``:
    segments as :func:`memory_snapshot` (each block's ``frames`` is the stack of its
    allocation while :func:`_record_memory_history` records stacks), and one list per
    device of trace entries ``{"action", "addr" ("device_free" for "oom"), "size",
    "stream", "pool_id", "time_us", "frames"}`` with actions ``alloc``,
    ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
    ``segment_map``, ``segment_unmap``, ``oom`` and ``snapshot``.

    Args:
        device: accepted for torch.cuda's signature; the snapshot covers every npu device.
        augment_with_fx_traces (bool): add FX debug information to frames of FX-generated
            code (``torch._utils._augment_memory_snapshot_stack_traces``).
    """
    _lazy_init()
    if device is not None:
        _valid_device_index(device, fn="_snapshot")
    s = _C._npu_memorySnapshot(None)
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        s = _augment_memory_snapshot_stack_traces(s)
    return s


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    r"""Pickle :func:`_snapshot` into ``filename`` (open it at pytorch.org/memory_viz, or with
    ``python -m torch.cuda._memory_viz trace_plot <filename>``)."""
    s = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(s, f)


def _save_segment_usage(filename: str = "output.svg", snapshot=None) -> None:
    r"""Write an SVG of the segments of ``snapshot`` (:func:`_snapshot` if ``None``)."""
    from ._memory_viz import segments as _segments

    with open(filename, "w") as f:
        f.write(_segments(_snapshot() if snapshot is None else snapshot))


def _save_memory_usage(filename: str = "output.svg", snapshot=None) -> None:
    r"""Write an SVG of the memory use over the history of ``snapshot``."""
    from ._memory_viz import memory as _memory

    with open(filename, "w") as f:
        f.write(_memory(_snapshot() if snapshot is None else snapshot))


# ----------------------------------------------------------------------------------
# Pluggable allocator

class _NPUAllocator:
    r"""Wrapper over an npu memory allocator (``torch_npu._C._npu_NPUAllocator``)."""

    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class NPUPluggableAllocator(_NPUAllocator):
    r"""An npu memory allocator made of functions of a shared library.

    Args:
        path_to_so_file (str): the ``.so`` file, loaded with ``ctypes``.
        alloc_fn_name (str): its function
            ``void* alloc_fn_name(size_t size, int device, aclrtStream stream)``.
        free_fn_name (str): its function
            ``void free_fn_name(void* ptr, size_t size, int device, aclrtStream stream)``.

    Install it with :func:`change_current_allocator` before any npu memory is allocated;
    every npu allocation then calls these functions (the caching allocator's statistics,
    snapshot and pools do not apply). ``allocator()`` has torch_npu's optional setters
    (``set_get_device_stats_fn``, ``set_reset_peak_status_fn``, ``set_reset_fn``,
    ``set_record_stream_fn``, ...) taking function addresses.
    """

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str):
        for name, value in (("path_to_so_file", path_to_so_file), ("alloc_fn_name", alloc_fn_name),
                            ("free_fn_name", free_fn_name)):
            if not isinstance(value, str):
                raise TypeError(f"NPUPluggableAllocator(): argument '{name}' must be a str, "
                                f"got {type(value).__name__}")
        lib = ctypes.CDLL(path_to_so_file)
        fns = []
        for name in (alloc_fn_name, free_fn_name):
            try:
                fns.append(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
            except AttributeError:
                raise RuntimeError(f"NPUPluggableAllocator(): no function '{name}' in "
                                   f"{path_to_so_file}") from None
        self._lib = lib  # keeps the library loaded while the allocator can be used
        super().__init__(_C._npu_customAllocator(*fns))


def change_current_allocator(allocator: _NPUAllocator) -> None:
    r"""Make ``allocator`` (an :class:`NPUPluggableAllocator`) serve all npu memory.

    Raises ``RuntimeError`` once the current allocator has allocated npu memory.
    """
    if not isinstance(allocator, _NPUAllocator):
        raise TypeError("change_current_allocator(): argument 'allocator' must be an "
                        f"NPUPluggableAllocator, got {type(allocator).__name__}")
    _C._npu_changeCurrentAllocator(allocator.allocator())


def _get_current_allocator() -> _NPUAllocator:
    r"""The allocator in use (its ``allocator()`` is the installed pluggable one, if any)."""
    return _NPUAllocator(_C._npu_getAllocator())


# ----------------------------------------------------------------------------------
# Memory pools

class MemPool(_C._MemPool):
    r"""A private memory pool of the caching allocator, on the current device.

    Allocations made inside :func:`use_mem_pool` come from the pool's own segments, and
    memory freed there goes back to the pool (reused only by allocations routed to it).
    The pool's cached memory returns to the device once the pool is deleted and its
    tensors are freed. Its ``id`` can also be passed as ``pool`` to an NPU graph capture.

    Args:
        allocator (optional): an :class:`NPUPluggableAllocator`'s ``allocator()`` whose
            alloc/free functions serve the pool's segments; ``None`` (default): the device
            memory of the caching allocator.
        use_on_oom (bool): allocations outside the pool that would run out of memory may
            take free blocks of this pool.
        no_split (bool): the pool's blocks are handed out whole, never split.
    """

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        for name, value in (("use_on_oom", use_on_oom), ("no_split", no_split)):
            if not isinstance(value, bool):
                raise TypeError(f"MemPool(): argument '{name}' must be a bool, got {type(value).__name__}")
        _lazy_init()
        super().__init__(allocator, True, use_on_oom, no_split)

    @property
    def id(self) -> Tuple[int, int]:
        r"""The pool's id, a tuple of two ints."""
        return super().id

    def use_count(self) -> int:  # pylint: disable=useless-parent-delegation
        r"""The number of holders of the pool (this object, active :func:`use_mem_pool`
        contexts, graphs captured into it)."""
        return super().use_count()

    def snapshot(self) -> list:
        r"""The segments of this pool, as :func:`memory_snapshot`."""
        return memory_snapshot(self.id)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device=None):
    r"""Route the npu allocations of the calling thread to ``pool`` inside the context.

    Args:
        pool (MemPool): the pool.
        device (torch.device or int, optional): the device whose allocations are routed
            (the current one if ``None``); it must be the pool's device.

    Only the calling thread's allocations are routed (like torch.cuda's): kernels that
    allocate their outputs on a stream's worker thread do so from the default pools.
    """
    if not isinstance(pool, _C._MemPool):
        raise TypeError(f"use_mem_pool(): argument 'pool' must be a torch.npu.MemPool, "
                        f"got {type(pool).__name__}")
    _lazy_init()
    idx = _valid_device_index(device, fn="use_mem_pool")
    if idx != pool.device:
        raise ValueError(f"use_mem_pool(): the pool was created on npu:{pool.device}, "
                         f"got device npu:{idx}")
    _C._npu_beginAllocateCurrentThreadToPool(idx, pool.id)
    try:
        yield
    finally:
        _C._npu_endAllocateToPool(idx, pool.id)
        _C._npu_releasePool(idx, pool.id)  # the reference begin took


# ----------------------------------------------------------------------------------
# memory_summary: the table of torch.cuda.memory_summary with torch_npu's labels.

_SUMMARY_WIDTH = 75


def _format_size(size: int, pref: int) -> str:
    units = ["B ", "KB", "MB", "GB", "TB", "PB"]
    unit = units[0]
    for bigger in units[1:]:
        if pref < 768 * 1024:
            break
        unit = bigger
        size //= 1024
        pref /= 1024
    return f"{size:7d} {unit}"


def _format_count(count: int, pref: int) -> str:
    units = [" ", "K", "M"]
    unit = units[0]
    for bigger in units[1:]:
        if pref < 750 * 1000:
            break
        unit = bigger
        count //= 1000
        pref /= 1000
    return f"{count:7d} {unit} "


_SUMMARY_ROWS = [
    ("allocated_bytes", "Allocated memory", _format_size),
    ("active_bytes", "Active memory", _format_size),
    ("requested_bytes", "Requested memory", _format_size),
    ("reserved_bytes", "NPU reserved memory", _format_size),
    ("inactive_split_bytes", "Non-releasable memory", _format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "NPU reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
]

_OVERSIZE_ROWS = [
    ("oversize_allocations", "Oversize allocations", _format_count),
    ("oversize_segments", "Oversize NPU segments", _format_count),
]


def memory_summary(device=None, abbreviated=False):
    r"""Return a human-readable table of the caching allocator statistics of an NPU.

    Useful to print periodically during training or after an out-of-memory error.

    Args:
        device (torch.device or int, optional): the device; the current one if ``None``.
        abbreviated (bool, optional): only the "all pools" rows (default ``False``).
    """
    _lazy_init()
    idx = _valid_device_index(device, fn="memory_summary")
    stats = memory_stats(idx)

    def stat(key: str) -> int:
        return int(stats.get(key, 0))

    bar = "=" * _SUMMARY_WIDTH
    rule = "-" * _SUMMARY_WIDTH
    lines = [
        bar,
        " {:16} PyTorch NPU memory summary, device ID {:<18d} ".format("", idx),
        rule,
        "  {:9} NPU OOMs: {:<13d} | {:6} npuMalloc retries: {:<9d}  ".format(
            "", stat("num_ooms"), "", stat("num_alloc_retries")),
        bar,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    metrics = ("current", "peak", "allocated", "freed")
    for key, label, fmt in _SUMMARY_ROWS:
        if not any(k.startswith(key + ".") for k in stats) and key == "requested_bytes":
            continue  # an allocator without requested-size tracking
        lines.append(rule)
        pools = [("all", label)]
        if not abbreviated:
            pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        prefs = None
        for pool, name in pools:
            values = [stat(f"{key}.{pool}.{m}") for m in metrics]
            if prefs is None:
                prefs = values  # units are chosen by the "all" row, as torch.cuda does
            cells = " | ".join(fmt(v, p) for v, p in zip(values, prefs))
            lines.append(f" {name:<21} | {cells} ")
    for key, label, fmt in _OVERSIZE_ROWS:
        if not any(k.startswith(key + ".") for k in stats):
            continue
        lines.append(rule)
        values = [stat(f"{key}.{m}") for m in metrics]
        cells = " | ".join(fmt(v, v) for v in values)
        lines.append(f" {label:<21} | {cells} ")
    lines.append(bar)
    return "|" + "|\n|".join(lines) + "|\n"
