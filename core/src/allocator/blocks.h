// Blocks and block pools of the caching allocator: a Block is a range of a segment (its
// neighbours are prev/next), a BlockPool the free blocks of one size class ordered for
// best-fit lookup, a PrivatePool the pools of graph captures and MemPools. Also the
// helpers the allocator's files share (events for record_stream, device switching).
#pragma once

#include "config.h"

#include <torch_npu/core/npu_caching_allocator.h>
#include <torch_npu/core/npu_stream.h>

#include <acl/acl_rt.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <iomanip>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_npu::NPUCachingAllocator::detail {

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

inline std::string format_size(uint64_t size) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (size <= 1024) {
    os << size << " bytes";
  } else if (size <= 1048576) {
    os << (static_cast<double>(size) / 1024.0) << " KiB";
  } else if (size <= 1073741824ULL) {
    os << (static_cast<double>(size) / 1048576.0) << " MiB";
  } else {
    os << (static_cast<double>(size) / 1073741824.0) << " GiB";
  }
  return os.str();
}

// Makes `device` current on this thread for the scope (no-op if it already is).
class DeviceSwitch {
 public:
  explicit DeviceSwitch(c10::DeviceIndex device) {
    int32_t cur = -1;
    if (aclrtGetDevice(&cur) != ACL_SUCCESS) cur = -1;
    prev_ = cur;
    if (cur != device) {
      NPU_CHECK(aclrtSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceSwitch() {
    if (switched_ && prev_ >= 0) (void)aclrtSetDevice(prev_);
  }
  DeviceSwitch(const DeviceSwitch&) = delete;
  DeviceSwitch& operator=(const DeviceSwitch&) = delete;

 private:
  int32_t prev_ = -1;
  bool switched_ = false;
};

// Events used by record_stream, recycled per device (never destroyed: an event may be
// waited on with no allocator lock held).
class EventPool {
 public:
  aclrtEvent get(c10::DeviceIndex device) {
    aclrtEvent e = try_get(device);
    if (e == nullptr) {
      DeviceSwitch sw(device);
      NPU_CHECK(aclrtCreateEvent(&e));  // reports the simulator's error
    }
    return e;
  }
  // nullptr if no event could be created.
  aclrtEvent try_get(c10::DeviceIndex device) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto& v = free_[device];
      if (!v.empty()) {
        aclrtEvent e = v.back();
        v.pop_back();
        return e;
      }
    }
    int32_t prev = -1;
    if (aclrtGetDevice(&prev) != ACL_SUCCESS) prev = -1;
    if (prev != device && aclrtSetDevice(device) != ACL_SUCCESS) return nullptr;
    aclrtEvent e = nullptr;
    if (aclrtCreateEvent(&e) != ACL_SUCCESS) e = nullptr;
    if (prev != device && prev >= 0) (void)aclrtSetDevice(prev);
    return e;
  }
  void put(c10::DeviceIndex device, aclrtEvent e) {
    std::lock_guard<std::mutex> g(mu_);
    free_[device].push_back(e);
  }

 private:
  std::mutex mu_;
  std::unordered_map<c10::DeviceIndex, std::vector<aclrtEvent>> free_;
};

inline EventPool& event_pool() {
  static auto* p = new EventPool();  // leaked on purpose (used until process exit)
  return *p;
}

// A stream that used a block (record_stream), resolved to its simulator handle.
struct StreamUse {
  aclrtStream stream;
  c10::DeviceIndex device;
  bool operator==(const StreamUse& o) const { return stream == o.stream; }
};
// ---------------------------------------------------------------------------------
// Blocks and pools
// ---------------------------------------------------------------------------------

struct BlockPool;
struct PrivatePool;
class ExpandableSegment;

struct Block {
  c10::DeviceIndex device;
  aclrtStream stream;  // allocation stream (all blocks of a segment share it)
  size_t size;
  size_t requested_size = 0;
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  int event_count = 0;               // outstanding record_stream events
  // Free marker: recorded on `stream` when the block was freed while the stream still
  // had queued work. Until it completes, that work may still touch the memory, so the
  // block may be reused by host-side (enqueue-time) allocations only, not by kernels
  // allocating at execution time on a stream worker, and it may not be aclrtFree'd.
  // A merged block keeps the newest marker (markers of one stream complete in order).
  aclrtEvent free_event = nullptr;
  uint64_t free_event_seq = 0;
  std::vector<StreamUse> stream_uses;  // streams recorded since allocation
  int64_t gc_count_base = 0;         // pool's get_free_block count when it entered the pool
  // Blocks of an expandable segment cover its whole address range; the unmapped ranges
  // are blocks too (mapped == false), kept in the pool's `unmapped` set.
  ExpandableSegment* expandable = nullptr;
  bool mapped = true;
  // Memory history (recordHistory): the stack of the allocation (of the free once freed,
  // when contexts of frees are recorded), and on a segment's first block the stack of
  // the segment's allocation.
  std::shared_ptr<c10::GatheredContext> context_when_allocated;
  std::shared_ptr<c10::GatheredContext> context_when_segment_allocated;

  Block(c10::DeviceIndex d, aclrtStream s, size_t sz, BlockPool* p, char* pt)
      : device(d), stream(s), size(sz), pool(p), ptr(pt) {}

  // Shares its mapped range (what the snapshot reports as a segment) with other blocks.
  bool is_split() const { return (prev && prev->mapped) || (next && next->mapped); }
  // In the pool, free for reuse or merging.
  bool is_free() const {
    return mapped && !allocated && event_count == 0 && stream_uses.empty();
  }
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    const auto sa = reinterpret_cast<uintptr_t>(a->stream);
    const auto sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

// Unmapped blocks by stream, then address.
struct BlockAddressLess {
  bool operator()(const Block* a, const Block* b) const {
    const auto sa = reinterpret_cast<uintptr_t>(a->stream);
    const auto sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BlockLess> blocks;
  std::set<Block*, BlockAddressLess> unmapped;  // of expandable segments
  const bool is_small;
  PrivatePool* owner = nullptr;  // the graph pool it belongs to, or nullptr
  int64_t get_free_blocks_call_count = 0;

  void insert(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    blocks.insert(b);
  }
  int64_t gc_count(const Block* b) const { return get_free_blocks_call_count - b->gc_count_base; }
};

// The memory of one or more NPUGraph captures (see the header comment).
struct PrivatePool {
  explicit PrivatePool(MempoolId_t id) : id(id), large(false), small(true) {
    large.owner = this;
    small.owner = this;
  }
  MempoolId_t id;
  BlockPool large;
  BlockPool small;
  int use_count = 1;    // graphs, MemPools (and captures under way) using it
  size_t segments = 0;  // aclrtMalloc'ed segments it holds
  bool use_on_oom = false;  // MemPool(use_on_oom=True): a last resort of other allocations
  bool no_split = false;    // MemPool(no_split=True): blocks are handed out whole
  std::shared_ptr<CustomAllocator> allocator;  // MemPool(allocator=...): serves its segments
};
// True while `stream` takes part in a capture (it then refuses queries).
inline bool stream_capturing(aclrtStream stream) {
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  return aclmdlRICaptureGetInfo(stream, &status, nullptr) == ACL_SUCCESS &&
         status != ACL_MODEL_RI_CAPTURE_STATUS_NONE;
}

struct AllocParams {
  AllocParams(c10::DeviceIndex device, size_t size, aclrtStream stream, BlockPool* pool,
              size_t alloc_size)
      : search_key(device, stream, size, pool, nullptr), pool(pool), alloc_size(alloc_size) {}
  c10::DeviceIndex device() const { return search_key.device; }
  aclrtStream stream() const { return search_key.stream; }
  size_t size() const { return search_key.size; }

  Block search_key;
  BlockPool* pool;
  size_t alloc_size;
  Block* block = nullptr;
  StatTypes stat_types = {false};
  bool on_worker = false;  // allocating at execution time from a stream worker
  std::shared_ptr<c10::GatheredContext> context;  // memory history
};

}  // namespace torch_npu::NPUCachingAllocator::detail
