// DeviceCachingAllocator's private pools: the memory of NPUGraph captures (CUDA's graph
// pools: allocations of the capturing streams, reused only by captures into the same pool)
// and of torch.npu.MemPool (use_on_oom, no_split, its own allocator).
#include "device_allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torch_npu::NPUCachingAllocator::detail {

void DeviceCachingAllocator::begin_allocate_to_pool(MempoolId_t id, std::function<bool(aclrtStream)> filter) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end()) {
    graph_pools_.emplace(id, std::make_unique<PrivatePool>(id));
  } else {
    it->second->use_count += 1;
  }
  captures_.emplace_back(id, std::move(filter));
}

void DeviceCachingAllocator::end_allocate_to_pool(MempoolId_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = captures_.begin(); it != captures_.end(); ++it) {
    if (it->first == id) {
      captures_.erase(it);
      break;
    }
  }
  if (!captures_.empty()) return;
  std::vector<Block*> deferred;
  deferred.swap(deferred_frees_);
  for (Block* block : deferred) {
    if (capture_touches(block)) {  // a stream still captures (its capture ends later)
      deferred_frees_.push_back(block);
      continue;
    }
    PrivatePool* owner = block->pool->owner;
    release_block_to_pool(block);
    if (owner != nullptr && owner->use_count == 0) release_unused_pool(owner);
  }
}

void DeviceCachingAllocator::release_pool(MempoolId_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graph_pools_.find(id);
  TORCH_CHECK(it != graph_pools_.end(), "NPU caching allocator: no graph memory pool (", id.first, ", ",
              id.second, ") on device ", static_cast<int>(device_));
  PrivatePool* pool = it->second.get();
  TORCH_INTERNAL_ASSERT(pool->use_count > 0);
  if (--pool->use_count == 0) release_unused_pool(pool);
}

std::pair<int, size_t> DeviceCachingAllocator::pool_info(MempoolId_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end()) return {-1, 0};
  return {it->second->use_count, it->second->segments};
}

void DeviceCachingAllocator::create_or_incref_pool(MempoolId_t id, bool use_on_oom, bool no_split,
                           std::shared_ptr<CustomAllocator> allocator) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graph_pools_.find(id);
  PrivatePool* pool = nullptr;
  if (it == graph_pools_.end()) {
    pool = graph_pools_.emplace(id, std::make_unique<PrivatePool>(id)).first->second.get();
  } else {
    pool = it->second.get();
    pool->use_count += 1;
  }
  pool->use_on_oom = pool->use_on_oom || use_on_oom;
  pool->no_split = pool->no_split || no_split;
  if (allocator) {
    TORCH_CHECK(pool->segments == 0 || pool->allocator == allocator,
                "MemPool: pool (", id.first, ", ", id.second, ") already holds memory of another allocator");
    pool->allocator = std::move(allocator);
  }
}

void DeviceCachingAllocator::empty_pool_cache(MempoolId_t id) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (graph_pools_.find(id) == graph_pools_.end()) return;
  wait_before_release(lock, true, [&](const Block* b) {
    return b->pool->owner != nullptr && b->pool->owner->id == id;
  });
  process_events();
  auto it = graph_pools_.find(id);  // looked up again: the lock was dropped
  if (it == graph_pools_.end()) return;
  release_blocks(it->second->large);
  release_blocks(it->second->small);
  prune_pools();
}

size_t DeviceCachingAllocator::graph_pool_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return graph_pools_.size();
}

bool DeviceCachingAllocator::get_free_block_of_oom_pools(AllocParams& p) {
  for (auto& [id, pool] : graph_pools_) {
    if (!pool->use_on_oom) continue;
    BlockPool* alt = p.size() <= kSmallSize ? &pool->small : &pool->large;
    AllocParams q(device_, p.size(), p.stream(), alt, p.alloc_size);
    q.stat_types = stat_types_for(*alt);
    q.on_worker = p.on_worker;
    if (get_free_block(q)) {
      p.pool = alt;
      p.search_key.pool = alt;
      p.stat_types = q.stat_types;
      p.block = q.block;
      return true;
    }
  }
  return false;
}

BlockPool* DeviceCachingAllocator::capture_pool(aclrtStream stream, size_t size) {
  for (auto& [id, filter] : captures_) {
    if (filter(stream)) {
      PrivatePool* pool = graph_pools_.at(id).get();
      return size <= kSmallSize ? &pool->small : &pool->large;
    }
  }
  return nullptr;
}

bool DeviceCachingAllocator::capture_touches(const Block* block) const {
  if (stream_capturing(block->stream)) return true;
  for (const StreamUse& u : block->stream_uses) {
    if (stream_capturing(u.stream)) return true;
  }
  return false;
}

void DeviceCachingAllocator::release_block_to_pool(Block* block) {
  mark_free(block);
  if (!block->stream_uses.empty()) {
    insert_events(block);
  } else {
    free_block(block);
  }
}

void DeviceCachingAllocator::release_unused_pool(PrivatePool* pool) {
  release_blocks(pool->large);
  release_blocks(pool->small);
  prune_pools();
}

void DeviceCachingAllocator::prune_pools() {
  for (auto it = graph_pools_.begin(); it != graph_pools_.end();) {
    if (it->second->use_count == 0 && it->second->segments == 0) {
      it = graph_pools_.erase(it);
    } else {
      ++it;
    }
  }
}
}  // namespace torch_npu::NPUCachingAllocator::detail
