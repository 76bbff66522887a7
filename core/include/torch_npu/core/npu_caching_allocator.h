// Caching allocator for NPU memory, CUDA-semantics with torch_npu's sizes (a request is
// padded by 32 bytes, then rounded): block pools (small <= 1 MiB in 2 MiB segments,
// large otherwise), block splitting and coalescing, stream-ordered
// reuse, record_stream (events delay reuse), stats with torch.cuda's keys, OOM
// handling (free cached blocks, retry, then torch.OutOfMemoryError with a summary),
// PYTORCH_NPU_ALLOC_CONF (max_split_size_mb, max_non_split_rounding_mb,
// large_segment_size_mb, segment_size_mb, garbage_collection_threshold,
// expandable_segments, roundup_power2_divisions, ...), set_per_process_memory_fraction.
// Segments come from the simulator's aclrtMalloc; with expandable_segments:True they are
// reserved virtual ranges that grow and shrink by mapping pages (2 MiB in the small pool,
// the large segment size in the large one; aclrtReserveMemAddress / aclrtMallocPhysical /
// aclrtMapMem).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <acl/acl_rt.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch_npu::NPUCachingAllocator {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;

// The process-wide allocator (registered for kPrivateUse1 by REGISTER_ALLOCATOR).
c10::DeviceAllocator* get();

// Raw API (torch.npu.caching_allocator_alloc/delete, kernels' workspaces).
void* raw_alloc(size_t nbytes);  // current device, current stream
void* raw_alloc_with_stream(size_t nbytes, c10::Stream stream);
void raw_delete(void* ptr);
// Allocates on `device` as a DataPtr tagged with the npu device.
c10::DataPtr allocate(size_t nbytes, c10::DeviceIndex device);

void recordStream(const c10::DataPtr& ptr, c10::Stream stream);
// True for memory of the caching allocator (not a pluggable allocator's, not from_blob's):
// freed while queued work still uses it, a block is reused at once by later work of its
// own stream only (stream order protects it), by other streams after that work (its free
// marker and record_stream events), and never returned to the device before. A queued
// kernel may therefore borrow such memory instead of keeping its storage alive.
bool freesInStreamOrder(const c10::DataPtr& ptr);
// torch_npu.erase_stream: undoes recordStream(ptr, stream) (the memory no longer waits
// for `stream` when it is freed).
void eraseStream(const c10::DataPtr& ptr, c10::Stream stream);
void emptyCache();
// Unmaps the cached free pages of expandable segments, keeping their physical memory for
// the next mappings (emptyCache frees it); refused without expandable_segments:True.
void emptyVirtAddrCache();
DeviceStats getDeviceStats(c10::DeviceIndex device);
void resetAccumulatedStats(c10::DeviceIndex device);
void resetPeakStats(c10::DeviceIndex device);
std::vector<SegmentInfo> snapshot();  // every device's segments
void setMemoryFraction(double fraction, c10::DeviceIndex device);
// (free, total) of the device as the simulator reports it.
std::pair<size_t, size_t> memGetInfo(c10::DeviceIndex device);
// The block (base pointer of the allocation) containing ptr, or nullptr.
void* getBaseAllocation(void* ptr, size_t* size);
// Re-reads PYTORCH_NPU_ALLOC_CONF (called once at init; exposed for tests).
void setAllocatorSettings(const std::string& conf);

// Data safety after a device fault, as torch_npu.npu._recovery: markAllBlockUnsafe marks
// every block allocated on `device`; a block is safe again once freed or written by a
// copy (updateBlockToSafe). Memory of no block of this allocator is safe. While the
// unsafe-check flag is set, operators refuse inputs in unsafe blocks.
bool checkBlockIsSafe(const c10::DataPtr& ptr);
void markAllBlockUnsafe(c10::DeviceIndex device);
void updateBlockToSafe(const c10::DataPtr& ptr);
bool getNpuDataUnsafeFlag();
void setNpuDataUnsafeFlag(bool flag);
// The pinned-host keys of PYTORCH_NPU_ALLOC_CONF (bytes; SIZE_MAX when not set), for the
// pinned-host allocator, and pin_memory_expandable_segments (NPUGraph capture refuses it).
struct PinnedConfig {
  size_t max_cached_size;
  size_t max_round_threshold;
  bool expandable_segments;
};
PinnedConfig pinnedConfig();

// Graph capture (NPUGraph): private memory pools, CUDA's API. While active, host
// allocations on a stream for which `filter` returns true come from the pool
// `mempool_id` (created on first use; each begin takes a reference).
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;
void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                         std::function<bool(aclrtStream)> filter);
void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id);
// Drops a reference; at zero the pool's memory returns to the device as it is freed.
void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id);
// (use_count, segments) of a pool, (-1, 0) when it does not exist (tests).
std::pair<int, size_t> graphPoolInfo(c10::DeviceIndex device, MempoolId_t mempool_id);

struct CustomAllocator;
// torch.npu.MemPool: creates the private pool `mempool_id` (use_count 1) or takes one more
// reference. `use_on_oom`: an allocation outside the pool that would raise an OOM first
// looks for a free block of this pool; `no_split`: the pool's blocks are never split;
// `allocator` (optional): the pool's segments come from its alloc/free functions.
void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom = false,
                        bool no_split = false, std::shared_ptr<CustomAllocator> allocator = nullptr);
// use_count of the pool, 0 when it does not exist.
int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id);
// Returns the free cached segments of one pool to the device ({0, 0}: every pool).
void emptyCache(MempoolId_t mempool_id);

// ---- memory history (torch.npu.memory._record_memory_history / _snapshot) ----------
using c10::CachingDeviceAllocator::CreateContextFn;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
// While enabled every device keeps its last `max_entries` TraceEntries (alloc,
// free_requested, free_completed, segment_alloc/free/map/unmap, oom, snapshot) and blocks
// keep the context of their allocation; `recorder` gathers a context (stack) when `when`
// asks for it. Disabling clears the history.
void recordHistory(bool enabled, CreateContextFn recorder, size_t max_entries, RecordContext when);
bool isHistoryEnabled();
// Calls `tracker` with every trace entry of every device from now on (segment allocs and
// frees included), whether the history is recorded or not; trackers stay for the process.
using c10::CachingDeviceAllocator::AllocatorTraceTracker;
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker);
struct SnapshotInfo {
  std::vector<SegmentInfo> segments;
  std::vector<std::vector<TraceEntry>> device_traces;  // one list per device
};
// Segments of every device (only those of pool `mempool_id` unless it is {0, 0}) and the
// recorded traces; records a "snapshot" trace entry while history is on.
SnapshotInfo snapshotWithTraces(MempoolId_t mempool_id = {0, 0});

// ---- pluggable allocator (torch.npu.memory.NPUPluggableAllocator) ----------------------
// The user's functions, with torch_npu's signatures. Installed by changeCurrentAllocator
// before the caching allocator served anything, it then serves every npu allocation
// (tensors, raw allocations, kernels' outputs); the caching allocator stays unused.
struct CustomAllocator {
  std::function<void*(size_t, int, aclrtStream)> alloc_fn;
  std::function<void(void*, size_t, int, aclrtStream)> free_fn;
  std::function<void(int)> init_fn;               // called with the device count when installed
  std::function<void(bool)> reset_fn;             // emptyCache
  std::function<void(double, int)> memory_fraction_fn;
  std::function<void*(void*, size_t*)> base_alloc_fn;
  std::function<void(void*, aclrtStream)> record_stream_fn;
  std::function<void(void*, aclrtStream)> erase_stream_fn;
  std::function<DeviceStats(c10::DeviceIndex)> get_device_stats_fn;
  std::function<void(c10::DeviceIndex)> reset_peak_status_fn;
};
// Fails ("Can't swap an already initialized allocator") once any npu memory was
// allocated by the current allocator.
void changeCurrentAllocator(std::shared_ptr<CustomAllocator> allocator);
// The installed custom allocator, or nullptr (the caching allocator is in use).
std::shared_ptr<CustomAllocator> currentCustomAllocator();

}  // namespace torch_npu::NPUCachingAllocator
