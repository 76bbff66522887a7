// DeviceCachingAllocator's memory history (a ring of trace entries, trace trackers) and
// snapshots (torch.npu.memory_snapshot, _snapshot: segments as mapped runs of blocks).
#include "device_allocator.h"

#include <c10/util/ApproximateClock.h>

#include <algorithm>

namespace torch_npu::NPUCachingAllocator::detail {

void DeviceCachingAllocator::record_history(bool enabled, size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  record_history_ = enabled;
  trace_max_ = std::max<size_t>(max_entries, 1);
  if (!enabled) {
    trace_.clear();
    trace_next_ = 0;
    auto drop = [](Block* b) {
      b->context_when_allocated.reset();
      b->context_when_segment_allocated.reset();
    };
    for (Block* b : active_blocks_) drop(b);
    for (BlockPool* pool : all_pools()) {
      for (Block* b : pool->blocks) drop(b);
    }
  } else {
    // Re-enabled, maybe with another size: the newest entries, oldest first.
    std::vector<TraceEntry> kept = ordered_trace();
    const size_t drop = kept.size() > trace_max_ ? kept.size() - trace_max_ : 0;
    trace_.assign(kept.begin() + static_cast<std::ptrdiff_t>(drop), kept.end());
    trace_next_ = 0;
  }
}

std::vector<TraceEntry> DeviceCachingAllocator::traces() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ordered_trace();
}

void DeviceCachingAllocator::snapshot(std::vector<SegmentInfo>* out, MempoolId_t only) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (record_history_ || trace_tracked()) {
    record_trace(TraceEntry::SNAPSHOT, nullptr, static_cast<size_t>(stats_.active_bytes[0].current),
                 nullptr, large_, nullptr);
  }
  const bool filter = only != MempoolId_t{0, 0};
  // A segment is a mapped run of blocks: a whole aclrtMalloc'ed segment, or a maximal
  // mapped range of an expandable segment (as CUDA reports them).
  auto is_head = [](const Block* b) { return b->prev == nullptr || !b->prev->mapped; };
  std::vector<const Block*> heads;
  for (const BlockPool* pool : all_pools()) {
    for (const Block* b : pool->blocks) {
      if (is_head(b)) heads.push_back(b);
    }
  }
  for (const Block* b : active_blocks_) {
    if (is_head(b)) heads.push_back(b);
  }
  std::sort(heads.begin(), heads.end(), [](const Block* a, const Block* b) {
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  });
  for (const Block* head : heads) {
    const PrivatePool* owner = head->pool->owner;
    if (filter && (owner == nullptr || owner->id != only)) continue;
    SegmentInfo seg;
    seg.device = device_;
    if (owner != nullptr) seg.owner_private_pool_id = owner->id;
    seg.context_when_allocated = head->context_when_segment_allocated;
    seg.address = reinterpret_cast<size_t>(head->ptr);
    seg.stream = head->stream;
    seg.is_large = !head->pool->is_small;
    seg.is_expandable = head->expandable != nullptr;
    for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
      BlockInfo bi;
      bi.size = b->size;
      bi.requested_size = b->requested_size;
      bi.allocated = b->allocated;
      bi.active = b->allocated || b->event_count > 0 || !b->stream_uses.empty();
      bi.gc_counter = static_cast<int32_t>(b->pool->gc_count(b));
      bi.context_when_allocated = b->context_when_allocated;
      seg.total_size += bi.size;
      if (bi.allocated) seg.allocated_size += bi.size;
      if (bi.active) {
        seg.active_size += bi.size;
        seg.requested_size += bi.requested_size;
      }
      seg.blocks.push_back(std::move(bi));
    }
    out->push_back(std::move(seg));
  }
}

void DeviceCachingAllocator::record_trace(TraceEntry::Action action, const void* addr, size_t size, aclrtStream stream,
                  const BlockPool& pool, std::shared_ptr<c10::GatheredContext> context) {
  const bool tracked = trace_tracked();
  if (!record_history_ && !tracked) return;
  TraceEntry entry(action, device_, reinterpret_cast<size_t>(addr), size, stream, pool_id(pool),
                   static_cast<c10::approx_time_t>(c10::getTime() / 1000), std::move(context));
  if (tracked) {
    auto& t = trace_trackers();
    std::lock_guard<std::mutex> lock(t.mu);
    for (const auto& callback : t.callbacks) callback(entry);
  }
  if (!record_history_) return;
  if (trace_.size() < trace_max_) {
    trace_.push_back(std::move(entry));
  } else {
    trace_[trace_next_] = std::move(entry);
    trace_next_ = (trace_next_ + 1) % trace_max_;
  }
}

std::vector<TraceEntry> DeviceCachingAllocator::ordered_trace() const {
  std::vector<TraceEntry> out;
  out.reserve(trace_.size());
  for (size_t i = 0; i < trace_.size(); ++i) out.push_back(trace_[(trace_next_ + i) % trace_.size()]);
  return out;
}
}  // namespace torch_npu::NPUCachingAllocator::detail
