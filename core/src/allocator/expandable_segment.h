// An expandable segment (expandable_segments:True): a reserved virtual range mapped page by
// page. How the allocator grows and shrinks them is in expandable_segments.cpp.
#pragma once

#include <torch_npu/core/npu_stream.h>

#include <acl/acl_rt.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace torch_npu::NPUCachingAllocator::detail {

// ---------------------------------------------------------------------------------
// Expandable segments (expandable_segments:True)
// ---------------------------------------------------------------------------------

inline aclrtPhysicalMemProp physical_prop(c10::DeviceIndex device) {
  aclrtPhysicalMemProp prop = {};
  prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
  prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
  prop.memAttr = ACL_HBM_MEM_HUGE;
  prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<uint32_t>(device);
  return prop;
}

// Physical pages that empty_virt_addr_cache unmapped but kept, by page size: the next page
// of that size mapped anywhere takes one instead of new physical memory; empty_cache (and
// the OOM path) frees them.
using SparePages = std::map<size_t, std::vector<aclrtDrvMemHandle>>;

// A virtual address range reserved for one stream and pool, backed on demand page by
// page. As torch_npu's, a page of the small pool is 2 MiB and one of the large pool the
// large segment size (20 MiB unless large_segment_size_mb or segment_size_mb say
// otherwise), rounded up to aclrtMemGetAllocationGranularity. Each page has its own physical handle
// so that any free page can be unmapped on its own and its memory mapped again
// wherever it is needed. The range is 1 1/8 of the device's capacity (as CUDA's), so a
// segment can keep growing at its end after pages in its middle were unmapped.
class ExpandableSegment {
 public:
  // nullptr when the address space cannot be reserved.
  static ExpandableSegment* create(c10::DeviceIndex device, size_t page_size, SparePages* spares) {
    aclrtPhysicalMemProp prop = physical_prop(device);
    size_t granularity = 0;
    NPU_CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM,
                                               &granularity));
    const size_t page = (std::max(page_size, granularity) + granularity - 1) / granularity * granularity;
    const size_t capacity = aclsimDeviceCapacity(device);
    const size_t pages = (capacity + capacity / 8 + page - 1) / page;
    void* ptr = nullptr;
    if (aclrtReserveMemAddress(&ptr, pages * page, 0, nullptr, 0) != ACL_SUCCESS) {
      return nullptr;
    }
    return new ExpandableSegment(device, static_cast<char*>(ptr), page, pages, spares);
  }

  ~ExpandableSegment() { (void)aclrtReleaseMemAddress(ptr_); }  // everything is unmapped

  char* ptr() const { return ptr_; }
  size_t size() const { return handles_.size() * page_; }
  size_t round_up(size_t size) const { return (size + page_ - 1) / page_ * page_; }

  // Maps the pages covering [p, p + size) (p page aligned, all unmapped). False (nothing
  // mapped) when the device is out of memory.
  bool map(char* p, size_t size) {
    const size_t first = page_index(p), last = page_index(p + round_up(size));
    for (size_t i = first; i < last; ++i) {
      const aclError err = map_page(i);
      if (err != ACL_SUCCESS) {
        for (size_t j = first; j < i; ++j) unmap_page(j);
        if (err == ACL_ERROR_RT_MEMORY_ALLOCATION) return false;
        NPU_CHECK(err);
      }
    }
    return true;
  }

  // The pages entirely inside [p, p + size): {first byte, bytes} (bytes 0: none).
  std::pair<char*, size_t> whole_pages(char* p, size_t size) const {
    const size_t first = page_index(p + page_ - 1), last = page_index(p + size);
    return {ptr_ + first * page_, last > first ? (last - first) * page_ : 0};
  }

  // Unmaps whole_pages(p, size) and frees their memory (keep_physical: keeps it among the
  // spare pages); returns that range.
  std::pair<char*, size_t> unmap(char* p, size_t size, bool keep_physical) {
    const auto range = whole_pages(p, size);
    for (size_t i = page_index(range.first); i < page_index(range.first + range.second); ++i) {
      unmap_page(i, keep_physical);
    }
    return range;
  }

 private:
  ExpandableSegment(c10::DeviceIndex device, char* ptr, size_t page, size_t pages, SparePages* spares)
      : device_(device), ptr_(ptr), page_(page), handles_(pages, nullptr), spares_(spares) {}

  size_t page_index(const char* p) const { return static_cast<size_t>(p - ptr_) / page_; }

  aclError map_page(size_t i) {
    const aclrtPhysicalMemProp prop = physical_prop(device_);
    aclrtDrvMemHandle h = nullptr;
    aclError err = ACL_SUCCESS;
    auto& spare = (*spares_)[page_];
    if (!spare.empty()) {
      h = spare.back();
      spare.pop_back();
    } else {
      err = aclrtMallocPhysical(&h, page_, &prop, 0);
      if (err != ACL_SUCCESS) return err;
    }
    err = aclrtMapMem(ptr_ + i * page_, page_, 0, h, 0);
    if (err != ACL_SUCCESS) {
      (void)aclrtFreePhysical(h);
      return err;
    }
    handles_[i] = h;
    return ACL_SUCCESS;
  }

  // Like aclrtFree, unmapping does not synchronise: callers only unmap memory no queued
  // work can touch any more (see the free markers).
  void unmap_page(size_t i, bool keep_physical = false) {
    NPU_CHECK(aclrtUnmapMem(ptr_ + i * page_));
    if (keep_physical) {
      (*spares_)[page_].push_back(handles_[i]);
    } else {
      NPU_CHECK(aclrtFreePhysical(handles_[i]));
    }
    handles_[i] = nullptr;
  }

  const c10::DeviceIndex device_;
  char* const ptr_;
  const size_t page_;
  std::vector<aclrtDrvMemHandle> handles_;  // one per page, nullptr while unmapped
  SparePages* const spares_;                // the allocator's
};

}  // namespace torch_npu::NPUCachingAllocator::detail
