// NPU caching allocator: CUDA caching-allocator semantics on top of the simulator's
// aclrtMalloc/aclrtFree (or its virtual memory API with expandable segments). See
// npu_caching_allocator.h for the public contract.
//
// Structure (one DeviceCachingAllocator per device, each with its own mutex):
//  - A *segment* is one aclrtMalloc'ed range. It is carved into *blocks* kept in a
//    doubly linked list (prev/next) in address order. Free blocks live in one of two
//    pools (small: requests <= 1 MiB, 2 MiB segments; large: everything else), each an
//    ordered set keyed by (stream, size, address) so a best-fit lookup for a stream is a
//    lower_bound.
//  - Sizes are torch_npu's: a request is padded by 32 bytes and rounded up to 512 bytes
//    (or to its roundup_power2_divisions step), so a request is small up to 1 MiB - 32.
//  - malloc: process completed record_stream events, best-fit search, otherwise
//    aclrtMalloc a new segment; on failure release cached blocks (first only what is
//    needed among oversize blocks, then every unsplit cached segment) and retry, then
//    raise torch.OutOfMemoryError. A found block is split when the remainder is big
//    enough; frees coalesce with free neighbours.
//  - expandable_segments:True (CUDA's ExpandableSegment): instead of aclrtMalloc'ed
//    segments, each stream and pool gets a reserved virtual range (aclrtReserveMemAddress)
//    that grows by mapping pages of physical memory (2 MiB in the small pool, the large
//    segment size, 20 MiB by default, in the large one, as torch_npu; aclrtMallocPhysical +
//    aclrtMapMem) where the request needs them, merging them with the free blocks
//    around. Releasing cached memory (empty_cache, the OOM retry, gc) unmaps the whole
//    pages of free blocks, wherever they are, and a later request maps memory again at
//    the end of a range: free memory is never stranded between allocated segments.
//    Unmapped ranges are blocks too (mapped == false), in the pool's `unmapped` set.
//    Reserved bytes are mapped bytes; a "segment" (stats, snapshot) is a mapped run.
//  - record_stream: at free time an event is recorded on every other stream that used
//    the block; the block returns to its pool once all of them completed (checked
//    lazily at the next malloc, or waited for by empty_cache / the OOM path).
//  - Graph capture (CUDA's private pools): while a stream captures into an NPUGraph,
//    host allocations on the streams of that capture come from the graph's private pool
//    (its own small and large BlockPools, plain aclrtMalloc'ed segments), and blocks freed
//    there are reused only by captures into the same pool, in capture order. A pool lives
//    while a graph uses it (use_count); released, its free segments go back to the device
//    and the rest follows as the tensors holding them are freed. A block of a capturing
//    stream outside the pool, or used by a capturing stream, freed during a capture is
//    freed once the captures of the device ended (no event can be recorded on a
//    capturing stream, and it refuses queries).
//  - Free markers (no CUDA counterpart): a block freed while its stream still has queued
//    work gets an event recorded on that stream (unless a task of that stream frees it). The simulator's aclrtFree, unlike
//    cudaFree, does not synchronise (nor does aclrtUnmapMem), so memory is only
//    aclrtFree'd or unmapped once its markers completed (empty_cache / OOM / gc wait
//    for them). And since kernels here allocate at
//    *execution* time on stream workers, not at enqueue time like the host, a worker
//    allocation only reuses blocks whose marker completed (else a kernel queued before a
//    host free could be handed memory that later-queued kernels still read). Host
//    allocations reuse freed blocks at once, exactly as CUDA's allocator does.
//
// Files: this one holds the process-wide state (the devices' allocators, the map of
// allocated blocks, PYTORCH_NPU_ALLOC_CONF at first use), the c10::DeviceAllocator
// registered for PrivateUse1 and the public API of npu_caching_allocator.h. The rest is
// in allocator/, by concept:
//   config.h/.cpp           sizes and PYTORCH_NPU_ALLOC_CONF (torch_npu's NPUAllocatorConfig)
//   blocks.h                Block, BlockPool, PrivatePool, record_stream event pool
//   device_allocator.h/.cpp one device's allocator: malloc/free, split/merge, events and free
//                           markers, releasing cached memory, stats, OOM
//   graph_pools.cpp         private pools of NPUGraph captures and MemPools
//   expandable_segment.h, expandable_segments.cpp
//                           reserved ranges mapped page by page
//   history.h, snapshot.cpp memory history, trace trackers, snapshots
//   pluggable.h/.cpp        the user's allocator (change_current_allocator)
//
// Threading: the allocator is called from host threads and from the simulator's stream
// worker threads (kernels allocate their outputs). Nothing blocks while holding a device
// mutex: waiting for events drops the lock, and worker threads never wait (they only
// consume events that already completed) since the event they would wait for may sit
// behind the kernel they are running.
#include <torch_npu/core/npu_caching_allocator.h>
#include <torch_npu/core/npu_stream.h>
#include <torch_npu/core/npu_trace.h>

#include "allocator/blocks.h"
#include "allocator/config.h"
#include "allocator/device_allocator.h"
#include "allocator/history.h"
#include "allocator/pluggable.h"

#include <acl/acl_rt.h>

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace torch_npu::NPUCachingAllocator {

using namespace detail;

namespace {

// ---------------------------------------------------------------------------------
// Process-wide state
// ---------------------------------------------------------------------------------

void local_raw_delete(void* ptr);

class State {
 public:
  // Lazily creates the per-device allocators and parses PYTORCH_NPU_ALLOC_CONF.
  void ensure_init() {
    // Checked first: std::call_once costs two thread-local writes and a pthread_once
    // call on every allocation and free.
    if (initialized_.load(std::memory_order_acquire)) return;
    std::call_once(init_flag_, [this] {
      const char* env = std::getenv(kConfEnv);
      Config c = parse_config(env ? env : "");
      const auto n = torch_npu::device_count();
      install_config(std::move(c));
      devices_.reserve(static_cast<size_t>(n));
      for (const auto d : c10::irange(n)) {
        devices_.push_back(std::make_unique<DeviceCachingAllocator>(
            static_cast<c10::DeviceIndex>(d), &config_));
      }
      apply_memory_fraction();
      initialized_.store(true);
    });
  }

  bool initialized() const { return initialized_.load(); }
  // Served an allocation (a custom allocator can no longer replace it).
  bool used() const { return used_.load(); }

  DeviceCachingAllocator& device(c10::DeviceIndex d) {
    ensure_init();
    torch_npu::check_device_index(d);
    TORCH_CHECK(d >= 0 && static_cast<size_t>(d) < devices_.size(),
                "Invalid NPU device index ", static_cast<int>(d), ": ", devices_.size(),
                " NPU device(s) available");
    return *devices_[static_cast<size_t>(d)];
  }

  size_t num_devices() {
    ensure_init();
    return devices_.size();
  }

  PinnedConfig pinned_config() {
    ensure_init();
    return {pinned_max_cached_size_.load(std::memory_order_relaxed),
            pinned_max_round_threshold_.load(std::memory_order_relaxed),
            pin_memory_expandable_segments_.load(std::memory_order_relaxed)};
  }

  void set_settings(const std::string& conf) {
    ensure_init();
    Config c = parse_config(conf, &config_);  // validate before touching anything
    {
      std::vector<std::unique_lock<std::mutex>> locks;
      for (auto& d : devices_) locks.emplace_back(d->mutex());
      install_config(std::move(c));
    }
    apply_memory_fraction();  // takes each device's lock itself
  }

  void* malloc(c10::DeviceIndex dev, size_t size, aclrtStream stream) {
    if (size == 0) return nullptr;
    if (C10_UNLIKELY(!used_.load(std::memory_order_relaxed))) used_.store(true);
    Block* block = device(dev).malloc(size, stream);
    {
      std::lock_guard<std::mutex> g(blocks_mutex_);
      allocated_blocks_.emplace(block->ptr, block);
    }
    trace::emit(trace::Kind::MemoryAllocation, block->ptr);
    return block->ptr;
  }

  void free(void* ptr) {
    if (!ptr) return;
    Block* block = nullptr;
    {
      std::lock_guard<std::mutex> g(blocks_mutex_);
      auto it = allocated_blocks_.find(static_cast<char*>(ptr));
      TORCH_CHECK(it != allocated_blocks_.end(),
                  "NPU caching allocator: invalid device pointer ", ptr,
                  " (not allocated by this allocator, or already freed)");
      block = it->second;
      allocated_blocks_.erase(it);
      if (!unsafe_.empty()) unsafe_.erase(block->ptr);  // memory allocated again is safe
    }
    trace::emit(trace::Kind::MemoryDeallocation, ptr);
    devices_[static_cast<size_t>(block->device)]->free(block);
  }

  Block* find_allocated(void* ptr) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    auto it = allocated_blocks_.find(static_cast<char*>(ptr));
    return it == allocated_blocks_.end() ? nullptr : it->second;
  }

  // Data safety after a device fault (torch_npu.npu._recovery). The blocks allocated on
  // `device` now are marked unsafe; a block leaves the set when freed (its next user gets
  // memory it wrote itself) or when a copy writes it (updateBlockToSafe).
  void mark_all_unsafe(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    for (const auto& [ptr, block] : allocated_blocks_)
      if (block->device == device) unsafe_.insert(ptr);
  }
  // Memory of no block of this allocator (from_blob, IPC imports) counts as safe.
  bool is_safe(void* ptr) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    return unsafe_.count(static_cast<char*>(ptr)) == 0;
  }
  void set_safe(void* ptr) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    unsafe_.erase(static_cast<char*>(ptr));
  }

  // The allocated block whose range contains `ptr` (interior pointers included).
  Block* find_containing(void* ptr, void** base, size_t* size) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    auto it = allocated_blocks_.upper_bound(static_cast<char*>(ptr));
    if (it == allocated_blocks_.begin()) return nullptr;
    --it;
    Block* b = it->second;
    // The block stays allocated while it is in the map (the map entry is removed
    // before the block is freed), so its ptr/size are stable here.
    if (static_cast<char*>(ptr) >= b->ptr + b->size) return nullptr;
    *base = b->ptr;
    if (size) *size = b->size;
    return b;
  }

 private:
  void install_config(Config c) {
    pinned_max_cached_size_.store(c.pinned_max_cached_size, std::memory_order_relaxed);
    pinned_max_round_threshold_.store(c.pinned_max_round_threshold, std::memory_order_relaxed);
    pin_memory_expandable_segments_.store(c.pin_memory_expandable_segments,
                                          std::memory_order_relaxed);
    config_ = std::move(c);
  }

  // Copies of config_'s pinned keys that the pinned-host allocator reads without the
  // devices' locks (which guard config_).
  std::atomic<size_t> pinned_max_cached_size_{0}, pinned_max_round_threshold_{0};
  std::atomic<bool> pin_memory_expandable_segments_{false};
  void apply_memory_fraction() {
    if (config_.memory_fraction < 0) return;
    for (auto& d : devices_) d->set_memory_fraction(config_.memory_fraction);
  }

  std::once_flag init_flag_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> used_{false};
  Config config_;
  std::vector<std::unique_ptr<DeviceCachingAllocator>> devices_;
  std::mutex blocks_mutex_;
  std::map<char*, Block*> allocated_blocks_;
  std::unordered_set<char*> unsafe_;  // allocated blocks marked unsafe (guarded by blocks_mutex_)
};

State& state() {
  static auto* s = new State();  // leaked on purpose: DataPtrs may die after main()
  return *s;
}

void local_raw_delete(void* ptr) { state().free(ptr); }

aclrtStream acl_stream_of(c10::Stream stream) {
  return torch_npu::NPUStream(stream).stream();
}

// ---------------------------------------------------------------------------------
// The c10::DeviceAllocator registered for PrivateUse1
// ---------------------------------------------------------------------------------

class NPUCachingAllocatorImpl final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return NPUCachingAllocator::allocate(nbytes, torch_npu::current_device());
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return custom() != nullptr ? &custom_delete : &local_raw_delete;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);  // device memory is host memory
  }

  bool initialized() override { return custom() != nullptr ? custom()->used.load() : state().initialized(); }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    NPUCachingAllocator::emptyCache();
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    NPUCachingAllocator::recordStream(ptr, stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return NPUCachingAllocator::getDeviceStats(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    NPUCachingAllocator::resetAccumulatedStats(device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    NPUCachingAllocator::resetPeakStats(device);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return NPUCachingAllocator::memGetInfo(device);
  }
};

c10::DeviceIndex resolve_device(c10::DeviceIndex device) {
  return device < 0 ? torch_npu::current_device() : device;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------

c10::DeviceAllocator* get() {
  static auto* instance = new NPUCachingAllocatorImpl();  // leaked on purpose
  return instance;
}

void* raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const auto device = torch_npu::current_device();
  const auto stream = torch_npu::getCurrentNPUStream(device);
  if (CustomState* c = custom()) return c->malloc(nbytes, device, stream.stream());
  return state().malloc(device, nbytes, stream.stream());
}

void* raw_alloc_with_stream(size_t nbytes, c10::Stream stream) {
  if (nbytes == 0) return nullptr;
  if (CustomState* c = custom()) return c->malloc(nbytes, stream.device_index(), acl_stream_of(stream));
  return state().malloc(stream.device_index(), nbytes, acl_stream_of(stream));
}

void raw_delete(void* ptr) {
  if (CustomState* c = custom(); c != nullptr && ptr != nullptr && c->owns(ptr, nullptr)) {
    c->free(ptr);
    return;
  }
  state().free(ptr);
}

c10::DataPtr allocate(size_t nbytes, c10::DeviceIndex device) {
  device = resolve_device(device);
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, dev);
  }
  const auto stream = torch_npu::getCurrentNPUStream(device);
  if (CustomState* c = custom()) {
    void* ptr = c->malloc(nbytes, device, stream.stream());
    return c10::DataPtr(ptr, ptr, &custom_delete, dev);
  }
  void* ptr = state().malloc(device, nbytes, stream.stream());
  return c10::DataPtr(ptr, ptr, &local_raw_delete, dev);
}

void recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (!ptr.get()) return;
  trace::emit(trace::Kind::RecordStream, ptr.get(), acl_stream_of(stream));
  if (ptr.get_deleter() == &custom_delete) {
    if (custom()->fns->record_stream_fn) custom()->fns->record_stream_fn(ptr.get(), acl_stream_of(stream));
    return;
  }
  // Memory not from this allocator (e.g. from_blob) has nothing to delay.
  if (ptr.get_deleter() != &local_raw_delete) return;
  Block* block = state().find_allocated(ptr.get_context());
  TORCH_CHECK(block != nullptr, "recordStream: no allocated NPU block found for pointer ",
              ptr.get_context());
  StreamUse use{acl_stream_of(stream), stream.device_index()};
  state().device(block->device).record_stream(block, use);
}

bool freesInStreamOrder(const c10::DataPtr& ptr) {
  return ptr.get() != nullptr &&
         ptr.get_deleter() == &local_raw_delete;
}

void eraseStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (!ptr.get()) return;
  trace::emit(trace::Kind::EraseStream, ptr.get(), acl_stream_of(stream));
  if (ptr.get_deleter() == &custom_delete) {
    if (custom()->fns->erase_stream_fn) custom()->fns->erase_stream_fn(ptr.get(), acl_stream_of(stream));
    return;
  }
  if (ptr.get_deleter() != &local_raw_delete) return;
  Block* block = state().find_allocated(ptr.get_context());
  TORCH_CHECK(block != nullptr, "erase_stream: no allocated NPU block found for pointer ",
              ptr.get_context());
  StreamUse use{acl_stream_of(stream), stream.device_index()};
  state().device(block->device).erase_stream(block, use);
}

void emptyCache() {
  if (CustomState* c = custom(); c != nullptr && c->fns->reset_fn) c->fns->reset_fn(false);
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).empty_cache();
  }
}

void emptyVirtAddrCache() {
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).empty_virt_addr_cache();
  }
}

DeviceStats getDeviceStats(c10::DeviceIndex device) {
  if (CustomState* c = custom()) {
    if (c->fns->get_device_stats_fn) return c->fns->get_device_stats_fn(resolve_device(device));
    warn_custom_unsupported("get_device_stats_fn");
    return DeviceStats();
  }
  return state().device(resolve_device(device)).stats();
}

void resetAccumulatedStats(c10::DeviceIndex device) {
  if (custom() != nullptr) return warn_custom_unsupported("reset_accumulated_stats_fn");
  state().device(resolve_device(device)).reset_accumulated();
}

void resetPeakStats(c10::DeviceIndex device) {
  if (CustomState* c = custom()) {
    if (c->fns->reset_peak_status_fn) return c->fns->reset_peak_status_fn(resolve_device(device));
    return warn_custom_unsupported("reset_peak_status_fn");
  }
  state().device(resolve_device(device)).reset_peak();
}

std::vector<SegmentInfo> snapshot() {
  std::vector<SegmentInfo> out;
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).snapshot(&out);
  }
  return out;
}

void setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "invalid fraction:", fraction,
              ". Please set within [0, 1].");
  if (CustomState* c = custom(); c != nullptr && c->fns->memory_fraction_fn) {
    c->fns->memory_fraction_fn(fraction, resolve_device(device));
  }
  state().device(resolve_device(device)).set_memory_fraction(fraction);
}

std::pair<size_t, size_t> memGetInfo(c10::DeviceIndex device) {
  device = resolve_device(device);
  torch_npu::check_device_index(device);
  size_t free_bytes = 0, total_bytes = 0;
  DeviceSwitch sw(device);
  NPU_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

void* getBaseAllocation(void* ptr, size_t* size) {
  if (!ptr) return nullptr;
  if (CustomState* c = custom(); c != nullptr && (c->fns->base_alloc_fn || c->owns(ptr, size))) {
    return c->fns->base_alloc_fn ? c->fns->base_alloc_fn(ptr, size) : ptr;
  }
  void* base = nullptr;
  if (state().find_containing(ptr, &base, size) == nullptr) return nullptr;
  return base;
}

void setAllocatorSettings(const std::string& conf) { state().set_settings(conf); }

bool checkBlockIsSafe(const c10::DataPtr& ptr) {
  if (!ptr.get() || ptr.get_deleter() != &local_raw_delete) return true;
  return state().is_safe(ptr.get_context());
}

void markAllBlockUnsafe(c10::DeviceIndex device) {
  if (custom() != nullptr) return;  // a pluggable allocator's blocks are its own
  state().mark_all_unsafe(device);
}

void updateBlockToSafe(const c10::DataPtr& ptr) {
  if (!ptr.get() || ptr.get_deleter() != &local_raw_delete) return;
  state().set_safe(ptr.get_context());
}

namespace {
std::atomic<bool> npu_data_unsafe_flag{false};
}  // namespace

bool getNpuDataUnsafeFlag() { return npu_data_unsafe_flag.load(std::memory_order_relaxed); }
void setNpuDataUnsafeFlag(bool flag) { npu_data_unsafe_flag.store(flag, std::memory_order_relaxed); }

PinnedConfig pinnedConfig() { return state().pinned_config(); }

void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                         std::function<bool(aclrtStream)> filter) {
  state().device(resolve_device(device)).begin_allocate_to_pool(mempool_id, std::move(filter));
}

void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  state().device(resolve_device(device)).end_allocate_to_pool(mempool_id);
}

void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  state().device(resolve_device(device)).release_pool(mempool_id);
}

std::pair<int, size_t> graphPoolInfo(c10::DeviceIndex device, MempoolId_t mempool_id) {
  return state().device(resolve_device(device)).pool_info(mempool_id);
}

void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom, bool no_split,
                        std::shared_ptr<CustomAllocator> allocator) {
  TORCH_CHECK(!allocator || (allocator->alloc_fn && allocator->free_fn),
              "MemPool: expected an allocator with alloc and free functions");
  state().device(resolve_device(device))
      .create_or_incref_pool(mempool_id, use_on_oom, no_split, std::move(allocator));
}

int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) {
  return std::max(0, state().device(resolve_device(device)).pool_info(mempool_id).first);
}

void emptyCache(MempoolId_t mempool_id) {
  if (mempool_id == MempoolId_t{0, 0}) return emptyCache();
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).empty_pool_cache(mempool_id);
  }
}

void recordHistory(bool enabled, CreateContextFn recorder, size_t max_entries, RecordContext when) {
  TORCH_CHECK(!enabled || when == RecordContext::NEVER || recorder != nullptr,
              "recordHistory: recording contexts needs a context recorder");
  HistorySettings& h = history();
  h.recorder.store(enabled ? recorder : nullptr);
  h.when.store(static_cast<int>(enabled ? when : RecordContext::NEVER));
  h.enabled.store(enabled);
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).record_history(enabled, max_entries);
  }
}

bool isHistoryEnabled() { return history().enabled.load(); }

void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
  TORCH_CHECK(tracker, "attachAllocatorTraceTracker: tracker must be a callable, got an empty function");
  auto& t = trace_trackers();
  std::lock_guard<std::mutex> lock(t.mu);
  t.callbacks.push_back(std::move(tracker));
  t.any.store(true, std::memory_order_release);
}

SnapshotInfo snapshotWithTraces(MempoolId_t mempool_id) {
  SnapshotInfo out;
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    auto& dev = s.device(static_cast<c10::DeviceIndex>(d));
    dev.snapshot(&out.segments, mempool_id);
    out.device_traces.push_back(dev.traces());
  }
  return out;
}

void changeCurrentAllocator(std::shared_ptr<CustomAllocator> allocator) {
  TORCH_CHECK(allocator && allocator->alloc_fn && allocator->free_fn,
              "change_current_allocator: expected an allocator with alloc and free functions");
  CustomState* current = custom();
  const bool used = current != nullptr ? current->used.load() : state().used();
  TORCH_CHECK(!used, "Can't swap an already initialized allocator");
  if (allocator->init_fn) allocator->init_fn(static_cast<int>(torch_npu::device_count()));
  g_custom.store(new CustomState(std::move(allocator)), std::memory_order_release);  // never deleted
}

std::shared_ptr<CustomAllocator> currentCustomAllocator() {
  CustomState* c = custom();
  return c != nullptr ? c->fns : nullptr;
}

}  // namespace torch_npu::NPUCachingAllocator

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, torch_npu::NPUCachingAllocator::get());
