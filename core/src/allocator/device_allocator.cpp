// DeviceCachingAllocator: malloc/free, best-fit search, splitting and merging blocks,
// record_stream events and free markers, releasing cached memory (empty_cache, the OOM
// retry, garbage collection), memory fraction, stats and the out-of-memory error.
#include "device_allocator.h"

#include <torch_npu/core/npu_error.h>
#include <torch_npu/core/npu_task_queue.h>
#include <torch_npu/core/npu_trace.h>

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace torch_npu::NPUCachingAllocator::detail {

Block* DeviceCachingAllocator::malloc(size_t orig_size, aclrtStream stream) {
  // Gathered before locking: it may wait for the GIL.
  auto context = maybe_gather_context(RecordContext::STATE);
  std::unique_lock<std::mutex> lock(mutex_);
  if (orig_size >= kMaxRequest) {
    stats_.num_ooms += 1;
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "NPU out of memory. Tried to allocate more than 1EB memory.");
  }
  process_events();

  const size_t size = round_size(orig_size);
  const bool on_worker = aclsimOnWorkerThread() != 0;
  // Kernels allocate at execution time: never from a graph pool (what they allocate
  // is theirs, freed when they finish).
  BlockPool* pool = captures_.empty() || on_worker ? nullptr : capture_pool(stream, size);
  if (pool == nullptr) pool = size <= kSmallSize ? &small_ : &large_;
  AllocParams params(device_, size, stream, pool, allocation_size(size));
  params.stat_types = stat_types_for(*pool);
  params.on_worker = on_worker;
  params.context = context;

  bool found = get_free_block(params);
  if (!found) {
    if (set_fraction_ && config_->garbage_collection_threshold > 0.0) {
      garbage_collect_cached_blocks(lock);
    }
    found = alloc_block(params, false) ||
            (release_available_cached_blocks(params, lock) && alloc_block(params, false)) ||
            (release_cached_blocks(lock) && alloc_block(params, true));
  }
  if (!found && pool->owner == nullptr) found = get_free_block_of_oom_pools(params);
  if (!found && !on_worker && !in_kernel() && captures_.empty()) {
    // Tensors the host has freed may still be held by kernels queued before the free
    // (a task keeps its operands' storages until the host collects it): let them run
    // and go, then try again.
    lock.unlock();
    wait_device(device_);
    collect_finished_kernels();
    lock.lock();
    process_events();
    // (Part of the same request: not another retry in the statistics.)
    found = get_free_block(params) || alloc_block(params, false) ||
            (release_cached_blocks(lock) && alloc_block(params, false));
  }
  if (!found) {
    raise_oom(params.alloc_size, stream, params.context);  // throws
  }
  TORCH_INTERNAL_ASSERT(params.block != nullptr && params.block->ptr != nullptr);
  Block* block = alloc_found_block(params, orig_size, should_split(params.block, params.size()));
  block->context_when_allocated = std::move(context);
  if (C10_UNLIKELY(record_history_ || trace_tracked())) {
    record_trace(TraceEntry::ALLOC, block->ptr, orig_size, block->stream, *block->pool,
                 record_context_at(RecordContext::ALLOC) ? block->context_when_allocated : nullptr);
  }
  return block;
}

void DeviceCachingAllocator::free(Block* block) {
  auto context = maybe_gather_context(RecordContext::ALL);
  std::lock_guard<std::mutex> lock(mutex_);
  if (C10_UNLIKELY(record_history_ || trace_tracked())) {
    record_trace(TraceEntry::FREE_REQUESTED, block->ptr, block->requested_size, block->stream,
                 *block->pool, context ? context : block->context_when_allocated);
  }
  block->context_when_allocated = std::move(context);
  block->allocated = false;
  const StatTypes types = stat_types_for(*block->pool);
  for_each_type(types, [&](size_t t) {
    stats_.allocation[t].decrease(1);
    stats_.allocated_bytes[t].decrease(block->size);
    stats_.requested_bytes[t].decrease(block->requested_size);
  });
  if (block->size >= config_->max_split_size) stats_.oversize_allocations.decrease(1);
  const auto size = block->size;
  const auto ptr = block->ptr;
  PrivatePool* owner = block->pool->owner;
  if (!captures_.empty() && capture_touches(block)) {
    if (owner != nullptr && block->stream_uses.empty() && stream_capturing(block->stream)) {
      free_block(block);  // reused by this capture's later allocations, in capture order
    } else {
      deferred_frees_.push_back(block);
    }
  } else {
    release_block_to_pool(block);
  }
  if (owner != nullptr && owner->use_count == 0) release_unused_pool(owner);
  c10::reportMemoryUsageToProfiler(
      ptr, -static_cast<int64_t>(size),
      static_cast<size_t>(stats_.allocated_bytes[0].current),
      static_cast<size_t>(stats_.reserved_bytes[0].current),
      c10::Device(c10::DeviceType::PrivateUse1, device_));
}

void DeviceCachingAllocator::record_stream(Block* block, StreamUse use) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (use.stream == block->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), use) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(use);
  }
}

void DeviceCachingAllocator::erase_stream(Block* block, StreamUse use) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& uses = block->stream_uses;
  uses.erase(std::remove(uses.begin(), uses.end(), use), uses.end());
}

void DeviceCachingAllocator::empty_cache() {
  std::unique_lock<std::mutex> lock(mutex_);
  release_cached_blocks(lock);
}

void DeviceCachingAllocator::empty_virt_addr_cache() {
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(config_->expandable_segments,
              "Unsupported config for empty_virt_addr_cache, please enable expandable_segments.",
              pta_error(ErrCode::NOT_SUPPORT));
  release_cached_blocks(lock, /*keep_physical=*/true);
}

DeviceStats DeviceCachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceStats s = stats_;
  s.max_split_size = static_cast<int64_t>(config_->max_split_size);
  return s;
}

void DeviceCachingAllocator::reset_accumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (StatArray* a : stat_arrays()) {
    for (auto& s : *a) s.reset_accumulated();
  }
  stats_.oversize_allocations.reset_accumulated();
  stats_.oversize_segments.reset_accumulated();
  stats_.num_alloc_retries = 0;
  stats_.num_ooms = 0;
  stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = 0;
  stats_.num_device_free = 0;
  stats_.num_oom_rejections = 0;
}

void DeviceCachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (StatArray* a : stat_arrays()) {
    for (auto& s : *a) s.reset_peak();
  }
  stats_.oversize_allocations.reset_peak();
  stats_.oversize_segments.reset_peak();
}

void DeviceCachingAllocator::set_memory_fraction(double fraction) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t total = aclsimDeviceCapacity(device_);
  allowed_memory_maximum_ =
      static_cast<size_t>(fraction * static_cast<double>(total));
  set_fraction_ = true;
}

const std::shared_ptr<CustomAllocator>& DeviceCachingAllocator::pool_allocator(const BlockPool& pool) {
  static const std::shared_ptr<CustomAllocator> none;
  return pool.owner != nullptr ? pool.owner->allocator : none;
}

MempoolId_t DeviceCachingAllocator::pool_id(const BlockPool& pool) {
  return pool.owner != nullptr ? pool.owner->id : MempoolId_t{0, 0};
}

std::vector<BlockPool*> DeviceCachingAllocator::all_pools() {
  std::vector<BlockPool*> pools{&large_, &small_};
  for (auto& [id, pool] : graph_pools_) {
    pools.push_back(&pool->large);
    pools.push_back(&pool->small);
  }
  return pools;
}

StatTypes DeviceCachingAllocator::stat_types_for(const BlockPool& pool) {
  StatTypes t = {false};
  t[static_cast<size_t>(StatType::AGGREGATE)] = true;
  t[static_cast<size_t>(pool.is_small ? StatType::SMALL_POOL : StatType::LARGE_POOL)] = true;
  return t;
}

std::vector<StatArray*> DeviceCachingAllocator::stat_arrays() {
  return {&stats_.allocation,     &stats_.segment,         &stats_.active,
          &stats_.inactive_split, &stats_.allocated_bytes, &stats_.reserved_bytes,
          &stats_.active_bytes,   &stats_.inactive_split_bytes,
          &stats_.requested_bytes};
}

size_t DeviceCachingAllocator::round_size(size_t size) const {
  size += kPadSize;
  if (size < kMinBlockSize) return kMinBlockSize;
  const size_t divisions = config_->roundup_divisions(size);
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    return roundup_power2_next_division(size, divisions);
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

size_t DeviceCachingAllocator::roundup_power2_next_division(size_t size, size_t divisions) {
  if (is_pow2(size)) return size;
  size_t floor2 = size_t{1} << (63 - __builtin_clzll(size));
  const size_t step = floor2 >> (63 - __builtin_clzll(divisions));
  if (step == 0) return floor2 << 1;
  const size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

size_t DeviceCachingAllocator::allocation_size(size_t size) const {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return config_->large_segment_size;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

bool DeviceCachingAllocator::should_split(const Block* block, size_t size) const {
  const size_t remaining = block->size - size;
  if (block->pool->owner != nullptr && block->pool->owner->no_split) return false;
  // An expandable segment's remainder is never stranded: its pages can be unmapped
  // and mapped where they are needed, so it is split like a small block (as CUDA's).
  if (block->pool->is_small || block->expandable) return remaining >= kMinBlockSize;
  return size < config_->max_split_size && remaining > kSmallSize;
}

bool DeviceCachingAllocator::get_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (set_fraction_ && config_->garbage_collection_threshold > 0.0) {
    ++pool.get_free_blocks_call_count;  // ages cached blocks for the gc
  }
  const size_t max_split = config_->max_split_size;
  // Best fit among this stream's blocks. An allocation made by a kernel at execution
  // time skips blocks whose free marker is pending (bounded scan).
  int scanned = 0;
  for (auto it = pool.blocks.lower_bound(&p.search_key);
       it != pool.blocks.end() && (*it)->stream == p.stream(); ++it) {
    Block* b = *it;
    // Don't hand an oversize block to a small request, nor a much bigger oversize
    // block to an oversize request (larger candidates only get worse).
    if (p.size() < max_split && b->size >= max_split) return false;
    if (p.size() >= max_split && b->size - p.size() >= config_->max_non_split_rounding_size) {
      return false;
    }
    if (p.on_worker && !exec_safe(b)) {
      if (++scanned >= kMaxWorkerScan) return false;
      continue;
    }
    p.block = b;  // a pending marker is dropped by alloc_found_block
    pool.blocks.erase(it);
    return true;
  }
  return false;
}

void DeviceCachingAllocator::mark_free(Block* block) noexcept {
  // A task of the block's own stream frees what it allocated while running: queued
  // kernels borrow (do not hold) stream-ordered storages, so nothing queued after this
  // task can touch the block. A marker here would complete only after the whole queue,
  // and the task's next temporaries would take fresh segments instead (a training loop
  // reserved 2.4 GiB for a 16 MiB working set).
  if (aclsimOnWorkerOf(block->stream)) return;
  aclrtStreamStatus st = ACL_STREAM_STATUS_COMPLETE;
  if (aclrtStreamQuery(block->stream, &st) == ACL_SUCCESS &&
      st == ACL_STREAM_STATUS_COMPLETE) {
    return;  // nothing queued can still use it
  }
  aclrtEvent ev = event_pool().try_get(device_);
  if (ev == nullptr) return;
  if (aclrtRecordEvent(ev, block->stream) != ACL_SUCCESS) {
    event_pool().put(device_, ev);
    return;
  }
  drop_marker(block);
  block->free_event = ev;
  block->free_event_seq = ++marker_seq_;
}

void DeviceCachingAllocator::drop_marker(Block* block) {
  if (block->free_event) {
    event_pool().put(device_, block->free_event);
    block->free_event = nullptr;
    block->free_event_seq = 0;
  }
}

bool DeviceCachingAllocator::exec_safe(Block* block) {
  if (!block->free_event) return true;
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
  NPU_CHECK(aclrtQueryEventStatus(block->free_event, &status));
  if (status != ACL_EVENT_RECORDED_STATUS_COMPLETE) return false;
  drop_marker(block);
  return true;
}

void DeviceCachingAllocator::merge_marker(Block* dst, Block* src) {
  if (!src->free_event) return;
  if (!dst->free_event || src->free_event_seq > dst->free_event_seq) {
    drop_marker(dst);
    dst->free_event = src->free_event;
    dst->free_event_seq = src->free_event_seq;
    src->free_event = nullptr;
  } else {
    drop_marker(src);
  }
}

bool DeviceCachingAllocator::alloc_block(AllocParams& p, bool is_retry) {
  if (is_retry) stats_.num_alloc_retries += 1;
  // Graph pools use plain segments: their blocks must keep their addresses.
  if (config_->expandable_segments && p.pool->owner == nullptr) return alloc_expandable_block(p);
  const size_t size = p.alloc_size;
  if (set_fraction_ && total_reserved_ + size > allowed_memory_maximum_) {
    if (config_->throw_on_npumalloc_oom) stats_.num_oom_rejections += 1;
    return false;
  }
  void* ptr = nullptr;
  aclError err;
  {
    DeviceSwitch sw(device_);
    if (const auto& custom = pool_allocator(*p.pool)) {
      ptr = custom->alloc_fn(size, device_, p.stream());  // nullptr: out of memory
      err = ptr != nullptr ? ACL_SUCCESS : ACL_ERROR_RT_MEMORY_ALLOCATION;
    } else {
      err = aclrtMalloc(&ptr, size, ACL_MEM_MALLOC_HUGE_FIRST);
    }
  }
  if (err == ACL_ERROR_RT_MEMORY_ALLOCATION) return false;
  NPU_CHECK(err);
  total_reserved_ += size;
  if (p.pool->owner != nullptr) p.pool->owner->segments += 1;
  p.block = new Block(device_, p.stream(), size, p.pool, static_cast<char*>(ptr));
  p.block->context_when_segment_allocated = p.context;
  record_trace(TraceEntry::SEGMENT_ALLOC, ptr, size, p.stream(), *p.pool, p.context);
  for_each_type(p.stat_types, [&](size_t t) {
    stats_.segment[t].increase(1);
    stats_.reserved_bytes[t].increase(size);
  });
  if (size >= config_->max_split_size) stats_.oversize_segments.increase(1);
  stats_.num_device_alloc += 1;
  return true;
}

void DeviceCachingAllocator::release_segment(Block* whole) {
  TORCH_INTERNAL_ASSERT(!whole->mapped && whole->prev == nullptr && whole->next == nullptr);
  whole->pool->unmapped.erase(whole);
  delete whole->expandable;
  delete whole;
}

void DeviceCachingAllocator::splice(Block* b, Block* prev, Block* next) {
  b->prev = prev;
  b->next = next;
  if (prev) prev->next = b;
  if (next) next->prev = b;
}

Block* DeviceCachingAllocator::alloc_found_block(AllocParams& p, size_t orig_size, bool split_remainder) {
  const size_t size = p.size();
  BlockPool* pool = p.pool;
  Block* block = p.block;
  const bool already_split = block->is_split();
  if (split_remainder) {
    Block* remaining = block;
    block = new Block(device_, p.stream(), size, pool, remaining->ptr);
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += size;
    remaining->size -= size;
    pool->insert(remaining);
    if (already_split) {
      // An inactive split block shrinks by `size`.
      for_each_type(p.stat_types,
                    [&](size_t t) { stats_.inactive_split_bytes[t].decrease(size); });
    } else {
      // A whole block becomes split: its remainder is a new inactive split block.
      for_each_type(p.stat_types, [&](size_t t) {
        stats_.inactive_split_bytes[t].increase(remaining->size);
        stats_.inactive_split[t].increase(1);
      });
    }
  } else if (already_split) {
    // An inactive split block becomes active as a whole.
    for_each_type(p.stat_types, [&](size_t t) {
      stats_.inactive_split_bytes[t].decrease(block->size);
      stats_.inactive_split[t].decrease(1);
    });
  }
  // The allocated part needs no free marker (a host allocation is ordered after the
  // work it guarded; a worker only got here with a completed one); a split-off
  // remainder keeps it.
  drop_marker(block);
  block->allocated = true;
  block->requested_size = orig_size;
  active_blocks_.insert(block);
  for_each_type(p.stat_types, [&](size_t t) {
    stats_.allocation[t].increase(1);
    stats_.allocated_bytes[t].increase(block->size);
    stats_.active[t].increase(1);
    stats_.active_bytes[t].increase(block->size);
    stats_.requested_bytes[t].increase(block->requested_size);
  });
  if (block->size >= config_->max_split_size) stats_.oversize_allocations.increase(1);
  c10::reportMemoryUsageToProfiler(
      block->ptr, static_cast<int64_t>(block->size),
      static_cast<size_t>(stats_.allocated_bytes[0].current),
      static_cast<size_t>(stats_.reserved_bytes[0].current),
      c10::Device(c10::DeviceType::PrivateUse1, device_));
  return block;
}

void DeviceCachingAllocator::free_block(Block* block) {
  TORCH_INTERNAL_ASSERT(!block->allocated && block->event_count == 0 &&
                        block->stream_uses.empty());
  const size_t original_size = block->size;
  record_trace(TraceEntry::FREE_COMPLETED, block->ptr, block->requested_size, block->stream, *block->pool,
               block->context_when_allocated);
  const SplitShare neighbours = split_share({block->prev, block->next});
  active_blocks_.erase(block);
  insert_free_block(block, neighbours);
  for_each_type(stat_types_for(*block->pool), [&](size_t t) {
    stats_.active[t].decrease(1);
    stats_.active_bytes[t].decrease(original_size);
  });
}

DeviceCachingAllocator::SplitShare DeviceCachingAllocator::split_share(std::initializer_list<const Block*> blocks) {
  SplitShare share;
  for (const Block* b : blocks) {
    if (b != nullptr && b->is_free() && b->is_split()) {
      share.blocks += 1;
      share.bytes += static_cast<int64_t>(b->size);
    }
  }
  return share;
}

void DeviceCachingAllocator::update_split_stats(const BlockPool& pool, SplitShare before, SplitShare after) {
  const int64_t blocks = after.blocks - before.blocks;
  const int64_t bytes = after.bytes - before.bytes;
  for_each_type(stat_types_for(pool), [&](size_t t) {
    if (blocks > 0) {
      stats_.inactive_split[t].increase(static_cast<size_t>(blocks));
    } else if (blocks < 0) {
      stats_.inactive_split[t].decrease(static_cast<size_t>(-blocks));
    }
    if (bytes > 0) {
      stats_.inactive_split_bytes[t].increase(static_cast<size_t>(bytes));
    } else if (bytes < 0) {
      stats_.inactive_split_bytes[t].decrease(static_cast<size_t>(-bytes));
    }
  });
}

void DeviceCachingAllocator::insert_free_block(Block* block, SplitShare neighbours) {
  BlockPool& pool = *block->pool;
  for (Block* candidate : {block->prev, block->next}) {
    try_merge_blocks(block, candidate, pool);
  }
  pool.insert(block);
  update_split_stats(pool, neighbours, split_share({block}));
}

void DeviceCachingAllocator::try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
  if (!src || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
      src->mapped != dst->mapped) {
    return;
  }
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  merge_marker(dst, src);
  dst->size += src->size;
  if (src->mapped) {
    pool.blocks.erase(src);
  } else {
    pool.unmapped.erase(src);
  }
  delete src;
}

void DeviceCachingAllocator::insert_events(Block* block) {
  std::vector<StreamUse> uses;
  uses.swap(block->stream_uses);
  for (const StreamUse& u : uses) {
    aclrtEvent ev = event_pool().get(u.device);
    {
      DeviceSwitch sw(u.device);
      NPU_CHECK(aclrtRecordEvent(ev, u.stream));
    }
    block->event_count += 1;
    events_[u.stream].emplace_back(ev, PendingEvent{u.device, block});
  }
}

void DeviceCachingAllocator::process_events() {
  for (auto it = events_.begin(); it != events_.end();) {
    auto& q = it->second;
    while (!q.empty()) {
      auto& [ev, pending] = q.front();
      aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
      NPU_CHECK(aclrtQueryEventStatus(ev, &status));
      if (status != ACL_EVENT_RECORDED_STATUS_COMPLETE) break;
      event_pool().put(pending.device, ev);
      Block* block = pending.block;
      q.pop_front();
      if (--block->event_count == 0) free_block(block);
    }
    it = q.empty() ? events_.erase(it) : std::next(it);
  }
}

bool DeviceCachingAllocator::release_available_cached_blocks(const AllocParams& p,
                                     std::unique_lock<std::mutex>& lock) {
  const size_t max_split = config_->max_split_size;
  if (max_split == std::numeric_limits<size_t>::max()) return false;
  BlockPool& pool = *p.pool;
  wait_before_release(lock, false, [&](const Block* b) {
    return b->pool == &pool && b->stream == p.stream() && b->size >= max_split;
  });
  Block key(p.device(), p.stream(), std::max(p.size(), max_split), &pool, nullptr);
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream()) {
    if (it == pool.blocks.begin()) return false;
    size_t released = 0;
    --it;  // largest block of a stream <= this one
    while (released < key.size && (*it)->size >= max_split &&
           (*it)->stream == p.stream()) {
      auto cur = it;
      const bool first = cur == pool.blocks.begin();
      if (!first) --it;
      Block* b = *cur;
      if (releasable(b) && exec_safe(b)) released += release_free_block(b);
      if (first) break;
    }
    return released >= key.size;
  }
  if (!releasable(*it) || !exec_safe(*it)) return false;
  release_free_block(*it);
  return true;
}

bool DeviceCachingAllocator::release_cached_blocks(std::unique_lock<std::mutex>& lock, bool keep_physical) {
  stats_.num_sync_all_streams += 1;
  // As torch_npu's (npuSynchronizeDevice before the release; cudaFree synchronises on CUDA):
  // a cached block may still be read by work queued on a stream that does not own it (used
  // there without record_stream), which must not see it returned to the device.
  if (!aclsimOnWorkerThread() && captures_.empty()) {
    lock.unlock();
    wait_device(device_);
    lock.lock();
  }
  wait_before_release(lock, true, [](const Block*) { return true; });
  process_events();
  release_blocks(large_, keep_physical);
  release_blocks(small_, keep_physical);
  // Graph pools only once no graph uses them (their cached blocks are the graphs').
  for (auto& [id, pool] : graph_pools_) {
    if (pool->use_count == 0) {
      release_blocks(pool->large, keep_physical);
      release_blocks(pool->small, keep_physical);
    }
  }
  prune_pools();
  if (!keep_physical) free_spare_pages();
  return true;
}

void DeviceCachingAllocator::release_blocks(BlockPool& pool, bool keep_physical) {
  // Unmapping may add blocks (the partial pages around what it unmaps) to the pool;
  // they are not releasable, so visiting them is harmless.
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = *it;
    ++it;
    if (releasable(b) && exec_safe(b)) release_free_block(b, keep_physical);
  }
}

bool DeviceCachingAllocator::releasable(const Block* b) const {
  if (b->expandable) return b->expandable->whole_pages(b->ptr, b->size).second > 0;
  return !b->is_split();
}

size_t DeviceCachingAllocator::release_free_block(Block* b, bool keep_physical) {
  if (b->expandable) return unmap_block(b, keep_physical);
  const size_t size = b->size;
  release_block(b);
  return size;
}

void DeviceCachingAllocator::release_block(Block* block) {
  TORCH_INTERNAL_ASSERT(!block->expandable && !block->is_split() &&
                        block->free_event == nullptr);
  {
    DeviceSwitch sw(device_);
    if (const auto& custom = pool_allocator(*block->pool)) {
      custom->free_fn(block->ptr, block->size, device_, block->stream);
    } else {
      NPU_CHECK(aclrtFree(block->ptr));
    }
  }
  record_trace(TraceEntry::SEGMENT_FREE, block->ptr, block->size, block->stream, *block->pool, nullptr);
  total_reserved_ -= block->size;
  const StatTypes types = stat_types_for(*block->pool);
  for_each_type(types, [&](size_t t) {
    stats_.segment[t].decrease(1);
    stats_.reserved_bytes[t].decrease(block->size);
  });
  if (block->size >= config_->max_split_size) stats_.oversize_segments.decrease(1);
  stats_.num_device_free += 1;
  if (block->pool->owner != nullptr) block->pool->owner->segments -= 1;  // pruned later
  block->pool->blocks.erase(block);
  delete block;
}

void DeviceCachingAllocator::garbage_collect_cached_blocks(std::unique_lock<std::mutex>& lock) {
  const size_t threshold = static_cast<size_t>(
      config_->garbage_collection_threshold * static_cast<double>(allowed_memory_maximum_));
  if (total_reserved_ <= threshold) return;
  wait_before_release(lock, false, [this](const Block* b) { return b->pool == &large_; });
  if (total_reserved_ <= threshold) return;
  const size_t target = total_reserved_ - threshold;
  double total_age = 0.0;
  int64_t freeable = 0;
  for (const Block* b : large_.blocks) {
    if (releasable(b)) {
      total_age += static_cast<double>(large_.gc_count(b));
      ++freeable;
    }
  }
  if (freeable == 0) return;
  size_t reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double age_threshold = total_age / static_cast<double>(freeable);
    freed = false;
    for (auto it = large_.blocks.begin(); it != large_.blocks.end();) {
      Block* b = *it;
      ++it;
      if (releasable(b) && static_cast<double>(large_.gc_count(b)) >= age_threshold &&
          exec_safe(b)) {
        freed = true;
        total_age -= static_cast<double>(large_.gc_count(b));
        --freeable;
        reclaimed += release_free_block(b);
      }
    }
  }
}

void DeviceCachingAllocator::raise_oom(size_t alloc_size, aclrtStream stream,
                            std::shared_ptr<c10::GatheredContext> context) {
  size_t device_free = 0, device_total = 0;
  {
    DeviceSwitch sw(device_);
    if (aclrtGetMemInfo(ACL_HBM_MEM, &device_free, &device_total) != ACL_SUCCESS) {
      device_total = aclsimDeviceCapacity(device_);
      device_free = device_total >= total_reserved_ ? device_total - total_reserved_ : 0;
    }
  }
  std::string allowed_info;
  if (set_fraction_) allowed_info = format_size(allowed_memory_maximum_) + " allowed; ";
  std::string host_info;
  size_t host_available = 0;
  if (aclsimHostRefusedLastAllocation(&host_available)) {
    host_info = " The host ran out of memory before the device did: the simulator's device memory is host "
                "memory, and only " + format_size(host_available) +
                " more of it could be backed for this process (ASCEND_SIM_HOST_MEMORY_LIMIT sets that budget; 0 "
                "turns the check off).";
  }
  stats_.num_ooms += 1;
  // The trace entry's address is the device's free memory (as CUDA's).
  record_trace(TraceEntry::OOM, reinterpret_cast<void*>(device_free), alloc_size, stream, large_,
               std::move(context));
  const auto allocated = static_cast<size_t>(stats_.allocated_bytes[0].current);
  const auto reserved = static_cast<size_t>(stats_.reserved_bytes[0].current);
  c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(alloc_size), allocated, reserved,
                                   c10::Device(c10::DeviceType::PrivateUse1, device_));
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "NPU out of memory. Tried to allocate ",
      format_size(alloc_size), " (NPU ", static_cast<int>(device_), "; ",
      format_size(device_total), " total capacity; ", format_size(allocated),
      " already allocated; ", format_size(device_free), " free; ", allowed_info,
      format_size(reserved),
      " reserved in total by PyTorch) If reserved memory is >> allocated memory try "
      "setting max_split_size_mb to avoid fragmentation. See documentation for Memory "
      "Management and PYTORCH_NPU_ALLOC_CONF. Cached blocks were already released for "
      "this request; torch.npu.empty_cache() returns memory cached by this process "
      "to the device.", host_info);
}
}  // namespace torch_npu::NPUCachingAllocator::detail
