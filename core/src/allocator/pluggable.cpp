// The pluggable allocator's state (see pluggable.h).
#include "pluggable.h"

#include "blocks.h"

#include <torch_npu/core/npu_trace.h>

#include <c10/util/Exception.h>

namespace torch_npu::NPUCachingAllocator::detail {

void* CustomState::malloc(size_t size, c10::DeviceIndex device, aclrtStream stream) {
  used.store(true);
  void* ptr = nullptr;
  {
    // The user's function allocates on the thread's current device (aclrtMalloc).
    DeviceSwitch sw(device);
    ptr = fns->alloc_fn(size, device, stream);
  }
  TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "NPU out of memory: the pluggable allocator returned ",
                   "nullptr for ", format_size(size), " on NPU ", static_cast<int>(device));
  {
    std::lock_guard<std::mutex> g(mu);
    metadata[ptr] = Allocation{size, device, stream};
  }
  trace::emit(trace::Kind::MemoryAllocation, ptr);
  return ptr;
}

void CustomState::free(void* ptr) {
  if (ptr == nullptr) return;
  Allocation a;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = metadata.find(ptr);
    TORCH_CHECK(it != metadata.end(), "NPUPluggableAllocator: trying to free a pointer not allocated here: ", ptr);
    a = it->second;
    metadata.erase(it);
  }
  trace::emit(trace::Kind::MemoryDeallocation, ptr);
  DeviceSwitch sw(a.device);
  fns->free_fn(ptr, a.size, a.device, a.stream);
}

bool CustomState::owns(void* ptr, size_t* size) {
  std::lock_guard<std::mutex> g(mu);
  auto it = metadata.find(ptr);
  if (it == metadata.end()) return false;
  if (size) *size = it->second.size;
  return true;
}

std::atomic<CustomState*> g_custom{nullptr};

void custom_delete(void* ptr) { custom()->free(ptr); }

void warn_custom_unsupported(const char* what) {
  TORCH_WARN_ONCE("NPUPluggableAllocator: ", what, " is not set or not supported by the pluggable allocator; ",
                  "set it with the allocator's set_", what, " (see torch_npu.npu.memory.NPUPluggableAllocator)");
}


}  // namespace torch_npu::NPUCachingAllocator::detail
