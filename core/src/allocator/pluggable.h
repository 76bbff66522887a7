// The pluggable allocator (torch.npu.memory.change_current_allocator): the user's
// alloc/free functions replace the caching allocator for the whole process. CustomState
// keeps the size, device and stream of each of its allocations, as free_fn needs them.
#pragma once

#include <torch_npu/core/npu_caching_allocator.h>

#include <acl/acl_rt.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_npu::NPUCachingAllocator::detail {

class CustomState {
 public:
  explicit CustomState(std::shared_ptr<CustomAllocator> fns) : fns(std::move(fns)) {}

  // Calls alloc_fn on `device` (an OutOfMemoryError when it returns nullptr).
  void* malloc(size_t size, c10::DeviceIndex device, aclrtStream stream);
  // Calls free_fn with the allocation's size, device and stream; `ptr` must be ours.
  void free(void* ptr);
  // Whether `ptr` is one of its allocations (and its size).
  bool owns(void* ptr, size_t* size);

  const std::shared_ptr<CustomAllocator> fns;
  std::atomic<bool> used{false};

 private:
  struct Allocation {
    size_t size = 0;
    c10::DeviceIndex device = 0;
    aclrtStream stream = nullptr;
  };
  std::mutex mu;
  std::unordered_map<void*, Allocation> metadata;
};

// The installed custom allocator (nullptr: the caching allocator). Installed states are
// never deleted: DataPtrs they made may outlive a later swap.
extern std::atomic<CustomState*> g_custom;

inline CustomState* custom() { return g_custom.load(std::memory_order_acquire); }

// The DataPtr deleter of the custom allocator's memory.
void custom_delete(void* ptr);

// Warns once that the pluggable allocator does not provide `what` (e.g. "record_stream").
void warn_custom_unsupported(const char* what);

}  // namespace torch_npu::NPUCachingAllocator::detail
