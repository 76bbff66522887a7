# Type stub of the extension module torch_npu._C (built from python/csrc/).
# This is the whole interface between the Python package and the C++ layers.
from typing import Any, Dict, List, Tuple
import torch

# ---- build facts -------------------------------------------------------------------
__torch_version__: str        # torch version the extension was compiled against
__cann_version__: str         # simulated CANN level of the pair, e.g. "8.5.0"

# ---- devices -------------------------------------------------------------------------
def _npu_init() -> None: ...                     # idempotent; registers hooks/allocator
def _npu_getDeviceCount() -> int: ...
def _npu_setDevice(device: int) -> None: ...     # raises on an invalid ordinal
def _npu_getDevice() -> int: ...
def _npu_synchronize(device: int) -> None: ...   # releases the GIL; raises kernel errors
def _npu_getDeviceName(device: int) -> str: ...  # SoC name, e.g. "Ascend910B1"
def _npu_getDeviceTotalMemory(device: int) -> int: ...
def _npu_isInBadFork() -> bool: ...

# ---- streams (ids as in torch.Stream: (stream_id, device_index, device_type)) -------------
def _npu_getCurrentStream(device: int) -> Tuple[int, int, int]: ...
def _npu_getDefaultStream(device: int) -> Tuple[int, int, int]: ...
def _npu_setStream(stream_id: int, device_index: int, device_type: int) -> None: ...
def _npu_streamRawHandle(stream_id: int, device_index: int) -> int: ...  # aclrtStream address

# ---- memory (same shapes as torch._C._cuda_* results) --------------------------------
def _npu_memoryStats(device: int) -> Dict[str, Any]: ...  # nested: {"allocated_bytes": {"all": {"current",...}}, ..., "num_ooms": n}
def _npu_resetAccumulatedMemoryStats(device: int) -> None: ...
def _npu_resetPeakMemoryStats(device: int) -> None: ...
def _npu_emptyCache() -> None: ...
def _npu_memorySnapshot() -> Dict[str, Any]: ...  # {"segments": [ {device, address, total_size, allocated_size, active_size, requested_size, stream, segment_type "small"|"large", blocks: [{address,size,requested_size,state "active_allocated"|"active_pending_free"|"inactive"}]} ], "device_traces": []}
def _npu_setMemoryFraction(fraction: float, device: int) -> None: ...
def _npu_getMemInfo(device: int) -> Tuple[int, int]: ...   # (free, total)
def _npu_cachingAllocator_raw_alloc(size: int, stream: int) -> int: ...
def _npu_cachingAllocator_raw_delete(ptr: int) -> None: ...
def _npu_setAllocatorSettings(conf: str) -> None: ...

# ---- random --------------------------------------------------------------------------
def _npu_getDefaultGenerator(device: int) -> torch.Generator: ...

# ---- simulator introspection (tests) -----------------------------------------------
def _npu_copiedBytes(kind: int) -> int: ...   # kind: 1 H2D, 2 D2H, 3 D2D
def _npu_taskQueueEnabled() -> bool: ...       # TASK_QUEUE_ENABLE (default 1)
def _npu_getCpuFallback() -> bool: ...         # unsupported ops run on the CPU (TORCH_NPU_CPU_FALLBACK)
def _npu_setCpuFallback(enabled: bool) -> None: ...
def _npu_cpuAlias(tensor: torch.Tensor) -> torch.Tensor: ...  # CPU tensor over the npu bytes (zero-copy, no sync)

# ---- events ------------------------------------------------------------------------
# torch.Event.elapsed_time() only accepts an exact torch.Event (a Py_TYPE check), so
# torch.npu.Event times through this. Ids are torch.Event.event_id (the aclrtEvent); ms.
def _npu_eventElapsedTime(start_event: int, end_event: int, device_index: int) -> float: ...

# Not provided by the simulator (the Python side raises a clear RuntimeError):
# _npu_getStreamFromExternal (ExternalStream: pool-indexed stream ids cannot name a foreign
# aclrtStream) and _npu_getDeviceUtilizationRate (the simulator keeps no busy-time samples).

# ---- hccl (distributed/src/python_bindings.cpp) -----------------------------------------
# Submodule _distributed_c10d: ProcessGroupHCCL(store, rank, size, timeout=timedelta(minutes=30))
# or (store, rank, size, options), a torch._C._distributed_c10d.Backend; and
# ProcessGroupHCCL.Options(is_high_priority_stream=False), a Backend.Options with op_timeout
# (timedelta), is_high_priority_stream, hccl_config (dict of str -> int | str), group_id.
# torch_npu.distributed registers it as the "hccl" backend and as dist.ProcessGroupHCCL.
_distributed_c10d: Any
