// torch_npu's C++ allocator API for C++ extensions (shipped in the wheel as
// torch_npu/include/torch_npu/csrc/core/npu/NPUCachingAllocator.h, torch_npu's path and
// namespace c10_npu::NPUCachingAllocator). The types are PyTorch's (c10's caching-allocator
// stats and trace entries, as torch_npu's); the functions are defined in torch_npu/_C.so,
// reached through torch_npu/lib/libtorch_npu.so (link with -ltorch_npu).
//
// A pluggable allocator (torch.npu.memory.NPUPluggableAllocator) written against it returns
// DeviceStats from its get_device_stats function; a trace tracker sees every trace entry of
// every device (segment allocations and frees included), with or without
// torch.npu.memory._record_memory_history.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>

#if __has_include("third_party/acl/inc/acl/acl_rt.h")
#include "third_party/acl/inc/acl/acl_rt.h"
#else
#include <acl/acl_rt.h>
#endif

#include <cstddef>
#include <functional>
#include <string>

namespace c10_npu {
namespace NPUCachingAllocator {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;
using c10::CachingDeviceAllocator::AllocatorTraceTracker;
using c10::CachingDeviceAllocator::RecordContext;

// Device memory of the caching allocator on the current device and stream.
void* raw_alloc(size_t nbytes);
void raw_delete(void* ptr);
// Returns the cached free segments to the device (check_error is accepted for torch_npu's
// signature; errors always raise).
void emptyCache(bool check_error = true);
DeviceStats getDeviceStats(c10::DeviceIndex device);
void resetAccumulatedStats(c10::DeviceIndex device);
void resetPeakStats(c10::DeviceIndex device);
bool isHistoryEnabled();
// Calls `tracker` with every trace entry of every device from now on; kept for the process.
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker);

}  // namespace NPUCachingAllocator
}  // namespace c10_npu
