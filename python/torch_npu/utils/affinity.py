"""torch_npu.utils.set_thread_affinity / reset_thread_affinity: bind the calling thread's CPU cores.

As torch_npu's, the binding applies to the thread that calls (``sched_setaffinity`` on the
calling thread); core ids not below the number of online CPUs are dropped with a warning.
``reset_thread_affinity()`` (and ``set_thread_affinity(None)``) give the thread back the
cores the process was allowed when torch_npu was imported (torch_npu's per-device binding
from ``CPU_AFFINITY_CONF`` does not exist on the simulator; without it that is torch_npu's
default too)."""
import os
import warnings

__all__ = []

# The cores the process may use, as found at import (before any binding by the user).
_DEFAULT_CORES = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def _apply(cores):
    if not hasattr(os, "sched_setaffinity"):
        raise RuntimeError("set_thread_affinity: this platform has no sched_setaffinity")
    os.sched_setaffinity(0, cores)  # pid 0: the calling thread


def _set_thread_affinity(core_range: list[int] | list[list[int]] | None = None):
    """Set the calling thread's CPU affinity.

    Args:
        core_range: None (reset to the default affinity), ``[start, end]`` (cores start..end,
            inclusive) or ``[[start1, end1], [start2, end2], ...]`` (several ranges).
    """
    if core_range is None:
        _apply(_DEFAULT_CORES)
        return
    if isinstance(core_range, list) and len(core_range) == 2 and all(isinstance(x, int) for x in core_range):
        core_ranges = [core_range]
    elif isinstance(core_range, list) and core_range and all(isinstance(x, list) and len(x) == 2
                                                             for x in core_range):
        core_ranges = core_range
    else:
        raise ValueError(f"Invalid core range: {core_range}")
    for start, end in core_ranges:
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise ValueError(f"Invalid core range values: [{start}, {end}]")
    cores = sorted({core for start, end in core_ranges for core in range(start, end + 1)})
    online = os.cpu_count() or 1
    dropped = [c for c in cores if c >= online]
    if dropped:
        warnings.warn(f"core ids {dropped} >= core_nums {online}, they are ignored when setting thread affinity.")
    cores = [c for c in cores if c < online]
    if not cores:
        raise ValueError(f"set_thread_affinity: none of the cores of {core_range} exists (core_nums {online})")
    _apply(cores)


def _reset_thread_affinity():
    """Give the calling thread the default affinity back (the process's cores at import)."""
    _apply(_DEFAULT_CORES)
