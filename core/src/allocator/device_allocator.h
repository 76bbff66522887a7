// The caching allocator of one device (torch_npu's DeviceCachingAllocator). Its methods
// are defined by concept: device_allocator.cpp (malloc/free, splitting and merging,
// record_stream events and free markers, releasing cached memory, stats, OOM),
// graph_pools.cpp (private pools of NPUGraph captures and MemPools),
// expandable_segments.cpp (mapping and unmapping pages of expandable segments) and
// snapshot.cpp (memory history and snapshots).
#pragma once

#include "blocks.h"
#include "config.h"
#include "expandable_segment.h"
#include "history.h"

#include <torch_npu/core/npu_caching_allocator.h>
#include <torch_npu/core/npu_task_queue.h>

#include <acl/acl_rt.h>

#include <c10/util/irange.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace torch_npu::NPUCachingAllocator::detail {

// ---------------------------------------------------------------------------------
// Per-device allocator
// ---------------------------------------------------------------------------------

class DeviceCachingAllocator {
 public:
  DeviceCachingAllocator(c10::DeviceIndex device, const Config* config)
      : device_(device), config_(config), large_(false), small_(true) {}

  std::mutex& mutex() { return mutex_; }

  Block* malloc(size_t orig_size, aclrtStream stream);

  // Every free records a free marker when the block's stream has queued work (see the
  // header comment): queued kernels borrow the memory of the storages they use
  // (NPUCachingAllocator::freesInStreamOrder), so a block may be freed while they can
  // still touch it.
  void free(Block* block);

  // ---- graph pools (NPUGraph capture) ----------------------------------------------

  void begin_allocate_to_pool(MempoolId_t id, std::function<bool(aclrtStream)> filter);

  void end_allocate_to_pool(MempoolId_t id);

  void release_pool(MempoolId_t id);

  // (use_count, segments) of a graph pool, for tests; (-1, 0) when it does not exist.
  std::pair<int, size_t> pool_info(MempoolId_t id);

  // torch.npu.MemPool: a private pool that exists as long as the MemPool holds it.
  void create_or_incref_pool(MempoolId_t id, bool use_on_oom, bool no_split,
                             std::shared_ptr<CustomAllocator> allocator);

  // Returns the free cached segments of pool `id` to the device (memory tensors still
  // hold stays in the pool).
  void empty_pool_cache(MempoolId_t id);

  // ---- memory history ----------------------------------------------------------------

  void record_history(bool enabled, size_t max_entries);

  // The recorded entries, oldest first.
  std::vector<TraceEntry> traces();

  void record_stream(Block* block, StreamUse use);

  // torch_npu.erase_stream: forget a record_stream use of an allocated block, so that
  // freeing it does not wait for `use`'s stream.
  void erase_stream(Block* block, StreamUse use);

  void empty_cache();

  // torch_npu.npu.empty_virt_addr_cache: as empty_cache, but the physical pages of the
  // expandable segments' unmapped ranges are kept (spare_pages_) for the next mappings;
  // a later empty_cache frees them.
  void empty_virt_addr_cache();

  size_t graph_pool_count();

  DeviceStats stats();

  void reset_accumulated();

  void reset_peak();

  void set_memory_fraction(double fraction);

  // Segments of every pool, or only of pool `only` unless it is {0, 0}.
  void snapshot(std::vector<SegmentInfo>* out, MempoolId_t only = {0, 0});

 private:
  static const std::shared_ptr<CustomAllocator>& pool_allocator(const BlockPool& pool);

  static MempoolId_t pool_id(const BlockPool& pool);

  // Appends to the history (a ring of trace_max_ entries). Time: microseconds since the
  // epoch (the snapshot's "time_us").
  void record_trace(TraceEntry::Action action, const void* addr, size_t size, aclrtStream stream,
                    const BlockPool& pool, std::shared_ptr<c10::GatheredContext> context);

  std::vector<TraceEntry> ordered_trace() const;

  // MemPool(use_on_oom=True): a free block of such a pool for a request about to fail.
  bool get_free_block_of_oom_pools(AllocParams& p);

  // The pool of the capture `stream` takes part in, or nullptr.
  BlockPool* capture_pool(aclrtStream stream, size_t size);

  // Freeing `block` now would record an event on, or query, a capturing stream.
  bool capture_touches(const Block* block) const;

  // The usual end of a free: marker, record_stream events, back to the pool.
  void release_block_to_pool(Block* block);

  // A pool no graph uses any more: its free segments go back to the device; the pool is
  // deleted once it holds none.
  void release_unused_pool(PrivatePool* pool);

  void prune_pools();

  std::vector<BlockPool*> all_pools();

  template <typename F>
  static void for_each_type(const StatTypes& types, F f) {
    for (const auto t : c10::irange(types.size())) {
      if (types[t]) f(t);
    }
  }

  static StatTypes stat_types_for(const BlockPool& pool);

  std::vector<StatArray*> stat_arrays();

  // torch_npu's round_size: the request plus kPadSize, then 512 B multiples, or the next
  // of roundup_power2_divisions steps of its power-of-two interval.
  size_t round_size(size_t size) const;

  // Rounds up to the next of `divisions` equal steps between two powers of two.
  static size_t roundup_power2_next_division(size_t size, size_t divisions);

  size_t allocation_size(size_t size) const;

  bool should_split(const Block* block, size_t size) const;

  bool get_free_block(AllocParams& p);

  // ---- free markers --------------------------------------------------------------

  // Called on every free (any thread); never throws: it runs inside DataPtr deleters.
  void mark_free(Block* block) noexcept;

  void drop_marker(Block* block);

  // True when no queued work can touch the block any more (its marker completed).
  bool exec_safe(Block* block);

  // dst absorbs src's marker if it is newer than its own.
  void merge_marker(Block* dst, Block* src);

  // Before returning cached memory to the device: waits (lock dropped) for pending
  // record_stream events if `stream_events`, and for the free markers of releasable
  // cached blocks selected by `pred`. Stream workers never wait (what they would wait
  // for may be queued behind the kernel they run); they release only what is safe.
  template <typename Pred>
  void wait_before_release(std::unique_lock<std::mutex>& lock, bool stream_events,
                           Pred pred) {
    if (aclsimOnWorkerThread()) return;
    std::vector<aclrtEvent> waits;
    if (stream_events) {
      for (const auto& [stream, q] : events_) {
        for (const auto& [ev, pending] : q) {
          waits.push_back(ev);
          if (pending.block->free_event) waits.push_back(pending.block->free_event);
        }
      }
    }
    for (BlockPool* pool : all_pools()) {
      for (Block* b : pool->blocks) {
        if (b->free_event && releasable(b) && pred(b)) waits.push_back(b->free_event);
      }
    }
    if (waits.empty()) return;
    // The events stay valid while unlocked: pooled events are never destroyed, and a
    // reused one only makes the wait longer.
    lock.unlock();
    for (aclrtEvent ev : waits) {
      // A failed kernel still completes the event; its error is reported by the
      // stream's own synchronisation, not here.
      (void)wait_event(ev);
    }
    lock.lock();
  }

  bool alloc_block(AllocParams& p, bool is_retry);

  // ---- expandable segments -----------------------------------------------------------

  // Finds p.size() bytes of address space in one of the stream's expandable segments of
  // the pool (a new segment if none has room) and maps what is unmapped there. Newly
  // mapped pages merge with the free blocks around them, so a request can use memory
  // that separate segments would leave fragmented. False when out of memory.
  bool alloc_expandable_block(AllocParams& p);

  // The first of a run of usable blocks (unmapped, or free) of p.size() bytes in an
  // expandable segment of the stream's pool, lowest address first; else a new segment.
  Block* find_expandable_block(const AllocParams& p);

  // Maps the pages of unmapped `block` that cover its first `size` bytes. The mapped
  // part becomes a free block merged with its free neighbours; the rest stays unmapped.
  bool map_block(Block* block, size_t size);

  // Unmaps the whole pages inside free block `b` of an expandable segment (its free
  // marker, if any, completed). The partial pages at its ends stay mapped as free
  // blocks; a segment left with nothing mapped is released. Returns the bytes unmapped.
  size_t unmap_block(Block* b, bool keep_physical = false);

  // Frees the physical pages empty_virt_addr_cache kept.
  void free_spare_pages();

  // Stats of mapping (or unmapping) `bytes` as block `b`. Segments are mapped runs (as
  // in the snapshot): a run is created, extended or joined (split, shortened or removed).
  void account_mapping(const Block* b, size_t bytes, bool mapped);

  // Releases an expandable segment with nothing mapped; `whole` is its only block.
  void release_segment(Block* whole);

  // Links `b` between `prev` and `next`.
  static void splice(Block* b, Block* prev, Block* next);

  Block* alloc_found_block(AllocParams& p, size_t orig_size, bool split_remainder);

  // Returns `block` (no longer allocated, no pending events) to its pool, merging it
  // with free neighbours.
  void free_block(Block* block);

  // What free blocks contribute to the inactive-split stats.
  struct SplitShare {
    int64_t blocks = 0;
    int64_t bytes = 0;
  };

  static SplitShare split_share(std::initializer_list<const Block*> blocks);

  void update_split_stats(const BlockPool& pool, SplitShare before, SplitShare after);

  // Puts free `block` into its pool, merged with its free neighbours, whose split share
  // before `block` became free (or mapped) is `neighbours`.
  void insert_free_block(Block* block, SplitShare neighbours);

  // Merges neighbour `src` into `dst` if it is free (or both are unmapped).
  void try_merge_blocks(Block* dst, Block* src, BlockPool& pool);

  void insert_events(Block* block);

  struct PendingEvent {
    c10::DeviceIndex device;
    Block* block;
  };

  // Consumes completed record_stream events (in order per stream); a block whose
  // last event completed returns to its pool.
  void process_events();

  // Frees enough oversize cached blocks (>= max_split_size) of this stream to fit the
  // request: the smallest single one that is big enough, else the largest ones.
  bool release_available_cached_blocks(const AllocParams& p,
                                       std::unique_lock<std::mutex>& lock);

  // Returns every releasable cached block to the device (after waiting for
  // record_stream events). Always returns true (as CUDA's does).
  // keep_physical: empty_virt_addr_cache's (unmapped pages kept as spare pages); else the
  // spare pages are freed too.
  bool release_cached_blocks(std::unique_lock<std::mutex>& lock, bool keep_physical = false);

  void release_blocks(BlockPool& pool, bool keep_physical = false);

  // Whether returning free block `b` to the device frees memory: a whole aclrtMalloc'ed
  // segment, or whole pages of an expandable segment.
  bool releasable(const Block* b) const;

  // Returns releasable `b` to the device; returns the bytes released.
  size_t release_free_block(Block* b, bool keep_physical = false);

  void release_block(Block* block);

  // Frees the least recently reused releasable large blocks until reserved memory is
  // back under garbage_collection_threshold * allowed memory.
  void garbage_collect_cached_blocks(std::unique_lock<std::mutex>& lock);

  [[noreturn]] void raise_oom(size_t alloc_size, aclrtStream stream,
                              std::shared_ptr<c10::GatheredContext> context);

  const c10::DeviceIndex device_;
  const Config* config_;  // owned by the global state; read under mutex_
  std::mutex mutex_;
  DeviceStats stats_;
  BlockPool large_;
  BlockPool small_;
  SparePages spare_pages_;
  std::unordered_set<Block*> active_blocks_;  // allocated or waiting for events
  std::unordered_map<aclrtStream, std::deque<std::pair<aclrtEvent, PendingEvent>>> events_;
  size_t total_reserved_ = 0;
  uint64_t marker_seq_ = 0;
  size_t allowed_memory_maximum_ = 0;
  bool set_fraction_ = false;
  std::map<MempoolId_t, std::unique_ptr<PrivatePool>> graph_pools_;
  // Captures under way on this device: their pool and which streams allocate into it.
  std::vector<std::pair<MempoolId_t, std::function<bool(aclrtStream)>>> captures_;
  std::vector<Block*> deferred_frees_;  // freed during a capture they touch, see free()
  // Memory history (recordHistory): a ring of the last trace_max_ entries.
  bool record_history_ = false;
  std::vector<TraceEntry> trace_;
  size_t trace_next_ = 0;  // oldest entry once the ring is full
  size_t trace_max_ = 1;
};

}  // namespace torch_npu::NPUCachingAllocator::detail
