// The allocator API of torch_npu's C++ headers (core/sdk/torch_npu/csrc/core/npu/
// NPUCachingAllocator.h, namespace c10_npu::NPUCachingAllocator) over this allocator.
#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"

#include <torch_npu/core/npu_caching_allocator.h>

#include <utility>

namespace c10_npu::NPUCachingAllocator {

namespace impl = torch_npu::NPUCachingAllocator;

void* raw_alloc(size_t nbytes) { return impl::raw_alloc(nbytes); }
void raw_delete(void* ptr) { impl::raw_delete(ptr); }
void emptyCache(bool /*check_error*/) { impl::emptyCache(); }
DeviceStats getDeviceStats(c10::DeviceIndex device) { return impl::getDeviceStats(device); }
void resetAccumulatedStats(c10::DeviceIndex device) { impl::resetAccumulatedStats(device); }
void resetPeakStats(c10::DeviceIndex device) { impl::resetPeakStats(device); }
bool isHistoryEnabled() { return impl::isHistoryEnabled(); }
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) { impl::attachAllocatorTraceTracker(std::move(tracker)); }

}  // namespace c10_npu::NPUCachingAllocator
