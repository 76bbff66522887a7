// Swapped memory (torch_npu.empty_with_swapped_memory): host memory mapped into the
// device, as torch_npu's NPUSwappedMemoryAllocator. Each allocation is page-rounded host
// memory from aclrtMallocHost registered to the current device with aclrtHostRegister;
// its device address is the DataPtr. Device work reads and writes it like device memory,
// but it is not device memory: the caching allocator's statistics and the device's free
// memory do not count it. Freeing waits for the device, then unregisters and frees it.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>

namespace torch_npu::NPUSwappedMemoryAllocator {

// The allocator (allocates on the current device).
c10::Allocator* get();

}  // namespace torch_npu::NPUSwappedMemoryAllocator
