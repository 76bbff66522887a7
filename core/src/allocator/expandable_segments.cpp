// DeviceCachingAllocator with expandable segments: finding room in a stream's reserved
// range, mapping the pages a block needs, unmapping the whole free pages of released
// blocks, and the stats of mapped memory.
#include "device_allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torch_npu::NPUCachingAllocator::detail {

bool DeviceCachingAllocator::alloc_expandable_block(AllocParams& p) {
  Block* c = find_expandable_block(p);
  if (c == nullptr) return false;
  if (!c->mapped && !map_block(c, std::min(c->size, p.size()))) {
    if (c->prev == nullptr && c->next == nullptr) release_segment(c);  // a new segment
    return false;
  }
  while (c->size < p.size()) {
    // c is free, merged with its free neighbours: what follows is unmapped.
    Block* next = c->next;
    TORCH_INTERNAL_ASSERT(next != nullptr && !next->mapped);
    if (!map_block(next, std::min(p.size() - c->size, next->size))) return false;
    c = next;  // it absorbed c
  }
  p.pool->blocks.erase(c);
  p.block = c;
  return true;
}

Block* DeviceCachingAllocator::find_expandable_block(const AllocParams& p) {
  // A kernel allocating at execution time only takes free blocks whose free marker
  // completed (see get_free_block).
  auto usable = [&](Block* b) {
    return b != nullptr && (!b->mapped || (b->is_free() && (!p.on_worker || exec_safe(b))));
  };
  auto has_room = [&](Block* b) {
    size_t bytes = 0;
    for (; bytes < p.size() && usable(b); b = b->next) bytes += b->size;
    return bytes >= p.size();
  };
  BlockPool& pool = *p.pool;
  Block key(p.device(), p.stream(), 0, &pool, nullptr);
  for (auto it = pool.unmapped.lower_bound(&key);
       it != pool.unmapped.end() && (*it)->stream == p.stream(); ++it) {
    Block* c = *it;
    // Mapping c merges it with a free block before it: start there, or skip c if
    // that block may not be used.
    if (c->prev != nullptr && c->prev->is_free()) {
      if (!usable(c->prev)) continue;
      c = c->prev;
    }
    if (has_room(c)) return c;
  }
  ExpandableSegment* segment = ExpandableSegment::create(
      device_, pool.is_small ? kSmallBuffer : config_->expandable_large_page(), &spare_pages_);
  if (segment == nullptr) return nullptr;
  Block* c = new Block(device_, p.stream(), segment->size(), &pool, segment->ptr());
  c->expandable = segment;
  c->mapped = false;
  pool.unmapped.insert(c);
  if (c->size < p.size()) {
    release_segment(c);
    return nullptr;
  }
  return c;
}

bool DeviceCachingAllocator::map_block(Block* block, size_t size) {
  ExpandableSegment* segment = block->expandable;
  const size_t bytes = segment->round_up(size);
  if (set_fraction_ && total_reserved_ + bytes > allowed_memory_maximum_) {
    if (config_->throw_on_npumalloc_oom) stats_.num_oom_rejections += 1;
    return false;
  }
  if (!segment->map(block->ptr, bytes)) return false;
  record_trace(TraceEntry::SEGMENT_MAP, block->ptr, bytes, block->stream, *block->pool, nullptr);
  BlockPool& pool = *block->pool;
  pool.unmapped.erase(block);
  if (bytes < block->size) {
    Block* rest = new Block(device_, block->stream, block->size - bytes, &pool,
                            block->ptr + bytes);
    rest->expandable = segment;
    rest->mapped = false;
    splice(rest, block, block->next);
    block->size = bytes;
    pool.unmapped.insert(rest);
  }
  const SplitShare neighbours = split_share({block->prev, block->next});
  account_mapping(block, bytes, /*mapped=*/true);
  block->mapped = true;
  insert_free_block(block, neighbours);
  return true;
}

size_t DeviceCachingAllocator::unmap_block(Block* b, bool keep_physical) {
  TORCH_INTERNAL_ASSERT(b->is_free() && b->free_event == nullptr);
  ExpandableSegment* segment = b->expandable;
  const auto [ptr, bytes] = segment->unmap(b->ptr, b->size, keep_physical);
  if (bytes == 0) return 0;
  record_trace(TraceEntry::SEGMENT_UNMAP, ptr, bytes, b->stream, *b->pool, nullptr);
  BlockPool& pool = *b->pool;
  const SplitShare before = split_share({b});
  pool.blocks.erase(b);
  Block* head = nullptr;
  Block* tail = nullptr;
  if (ptr > b->ptr) {
    head = new Block(device_, b->stream, static_cast<size_t>(ptr - b->ptr), &pool, b->ptr);
    head->expandable = segment;
    splice(head, b->prev, b);
  }
  if (ptr + bytes < b->ptr + b->size) {
    tail = new Block(device_, b->stream, static_cast<size_t>(b->ptr + b->size - ptr - bytes),
                     &pool, ptr + bytes);
    tail->expandable = segment;
    splice(tail, b, b->next);
  }
  b->ptr = ptr;
  b->size = bytes;
  b->mapped = false;
  account_mapping(b, bytes, /*mapped=*/false);
  for (Block* part : {head, tail}) {
    if (part != nullptr) pool.insert(part);
  }
  update_split_stats(pool, before, split_share({head, tail}));
  try_merge_blocks(b, b->prev, pool);
  try_merge_blocks(b, b->next, pool);
  if (b->prev == nullptr && b->next == nullptr) {
    release_segment(b);
  } else {
    pool.unmapped.insert(b);
  }
  return bytes;
}

void DeviceCachingAllocator::account_mapping(const Block* b, size_t bytes, bool mapped) {
  const int64_t runs = 1 - static_cast<int64_t>(b->prev != nullptr && b->prev->mapped) -
                       static_cast<int64_t>(b->next != nullptr && b->next->mapped);
  const int64_t segments = mapped ? runs : -runs;
  if (mapped) {
    total_reserved_ += bytes;
    stats_.num_device_alloc += 1;
  } else {
    total_reserved_ -= bytes;
    stats_.num_device_free += 1;
  }
  for_each_type(stat_types_for(*b->pool), [&](size_t t) {
    if (segments > 0) {
      stats_.segment[t].increase(static_cast<size_t>(segments));
    } else if (segments < 0) {
      stats_.segment[t].decrease(static_cast<size_t>(-segments));
    }
    if (mapped) {
      stats_.reserved_bytes[t].increase(bytes);
    } else {
      stats_.reserved_bytes[t].decrease(bytes);
    }
  });
}

void DeviceCachingAllocator::free_spare_pages() {
  for (auto& [size, handles] : spare_pages_) {
    for (aclrtDrvMemHandle h : handles) NPU_CHECK(aclrtFreePhysical(h));
    handles.clear();
  }
}

}  // namespace torch_npu::NPUCachingAllocator::detail
