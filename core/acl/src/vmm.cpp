// Virtual memory: aclrtReserveMemAddress / aclrtMallocPhysical / aclrtMapMem and their
// inverses (the C functions live here, next to the registry they share).
//
// A reservation is an anonymous PROT_NONE, MAP_NORESERVE mapping: address space only.
// Physical memory is a granule-rounded range of the device's arena memfd, so it counts
// in the device's capacity exactly like aclrtMalloc (and goes back to the OS with the
// same hole punch when freed). Mapping = mmap(MAP_SHARED|MAP_FIXED) of that memfd range
// over reserved addresses, so every mapping of one handle sees the same bytes; unmapping
// puts a PROT_NONE mapping back. Handles and ranges are looked up in a registry before
// use: stale or garbage arguments are errors, never dereferenced.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "internal.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

using namespace aclsim;

namespace {

struct PhysMem {
  int device;
  char* arena_ptr;  // where the range starts in the device's arena
  size_t size;      // rounded to the granule
  int maps;         // live mappings
};

struct Mapping {
  size_t size;
  PhysMem* mem;
};

struct Reservation {
  size_t size;
  uint64_t id;                     // unique in the process (addresses are reused)
  int device;                      // device of the mapped memory, -1 while none is
  std::map<size_t, Mapping> maps;  // by offset in the reservation
};

struct Vmm {
  std::shared_mutex mu;
  std::map<uintptr_t, Reservation> reservations;  // by start address
  std::unordered_map<void*, std::unique_ptr<PhysMem>> handles;
  std::atomic<size_t> count{0};  // reservations: lookups skip the lock while there are none
  uint64_t next_id = 1;           // mu held

  // The reservation containing p (its start in *start), or nullptr. mu held.
  Reservation* Find(const void* p, uintptr_t* start) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = reservations.upper_bound(a);
    if (it == reservations.begin()) return nullptr;
    --it;
    if (a - it->first >= it->second.size) return nullptr;
    *start = it->first;
    return &it->second;
  }

  PhysMem* Handle(aclrtDrvMemHandle h) {
    auto it = handles.find(h);
    return it == handles.end() ? nullptr : it->second.get();
  }
};

Vmm& V() {
  static Vmm* v = new Vmm();  // never destroyed: usable from any static destructor
  return *v;
}

size_t RoundUp(size_t n) { return (n + kGranule - 1) / kGranule * kGranule; }

// Makes [p, p+len) reserved-but-inaccessible again (unmap, or after a failed map).
bool Protect(void* p, size_t len) {
  return mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
              0) != MAP_FAILED;
}

// An enum argument as the integer the caller passed (C callers may pass any value; reading
// an out-of-range enumeration in C++ is undefined).
template <typename E>
int AsInt(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "enums are ints in this API");
  int v;
  memcpy(&v, &e, sizeof v);
  return v;
}

aclError BadHandle(const char* api, aclrtDrvMemHandle h) {
  return Fail(ACL_ERROR_INVALID_PARAM,
              "%s: %p is not a live physical memory handle (freed, or not from "
              "aclrtMallocPhysical)",
              api, h);
}

}  // namespace

namespace aclsim {

int VmmDevice(const void* p, size_t len) {
  Vmm& v = V();
  if (v.count.load(std::memory_order_acquire) == 0) return -1;
  std::shared_lock<std::shared_mutex> r(v.mu);
  uintptr_t start = 0;
  Reservation* res = v.Find(p, &start);
  if (res == nullptr) return -1;
  const size_t off = reinterpret_cast<uintptr_t>(p) - start;
  if (len > res->size - off) return -1;
  const size_t end = off + (len ? len : 1);
  // The mapping containing off, then adjacent ones until the range is covered.
  auto it = res->maps.upper_bound(off);
  if (it == res->maps.begin()) return -1;
  --it;
  size_t covered = it->first + it->second.size;
  if (off >= covered) return -1;
  while (covered < end) {
    ++it;
    if (it == res->maps.end() || it->first != covered) return -1;
    covered += it->second.size;
  }
  return res->device;
}

bool VmmReserved(const void* p) {
  Vmm& v = V();
  if (v.count.load(std::memory_order_acquire) == 0) return false;
  std::shared_lock<std::shared_mutex> r(v.mu);
  uintptr_t start = 0;
  return v.Find(p, &start) != nullptr;
}

}  // namespace aclsim

extern "C" {

aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp* prop,
                                          aclrtMemGranularityOptions option,
                                          size_t* granularity) {
  if (prop == nullptr || granularity == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemGetAllocationGranularity: %s is null",
                prop ? "granularity" : "prop");
  const int opt = AsInt(option);
  if (opt != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM &&
      opt != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemGetAllocationGranularity: invalid option %d",
                opt);
  *granularity = kGranule;
  return ACL_SUCCESS;
}

aclError aclrtReserveMemAddress(void** virPtr, size_t size, size_t alignment, void* expectPtr,
                                uint64_t flags) {
  const char* api = "aclrtReserveMemAddress";
  if (virPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: virPtr is null", api);
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "%s: size 0 is invalid", api);
  if (flags > 1)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: flags must be 0 or 1, got %llu", api,
                static_cast<unsigned long long>(flags));
  if ((alignment & (alignment - 1)) != 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: alignment %zu is not 0 or a power of two", api,
                alignment);
  const size_t align = alignment > kGranule ? alignment : kGranule;
  if (size > (SIZE_MAX >> 2) || align > (SIZE_MAX >> 2))
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: cannot reserve %zu bytes", api, size);
  const size_t len = RoundUp(size);
  RT();  // the runtime exists before anything is registered
  void* p = MAP_FAILED;
  if (expectPtr != nullptr) {
    if (reinterpret_cast<uintptr_t>(expectPtr) % align != 0)
      return Fail(ACL_ERROR_RT_PARAM_INVALID, "%s: expectPtr %p is not aligned to %s", api,
                  expectPtr, FormatBytes(align).c_str());
    p = mmap(expectPtr, len, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && p != expectPtr) {  // old kernels take the flag as a hint
      munmap(p, len);
      p = MAP_FAILED;
    }
    if (p == MAP_FAILED)
      return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: [%p, +%s) is not free", api, expectPtr,
                  FormatBytes(len).c_str());
  } else {
    // Reserve with room to align, then give the slack back.
    void* raw = mmap(nullptr, len + align, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
      return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: cannot reserve %s of address space: %s",
                  api, FormatBytes(len).c_str(), strerror(errno));
    const auto r = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t a = (r + align - 1) / align * align;
    if (a > r) munmap(raw, a - r);
    if (r + align > a) munmap(reinterpret_cast<void*>(a + len), r + align - a);
    p = reinterpret_cast<void*>(a);
  }
  Vmm& v = V();
  {
    std::unique_lock<std::shared_mutex> w(v.mu);
    v.reservations.emplace(reinterpret_cast<uintptr_t>(p), Reservation{len, v.next_id++, -1, {}});
    v.count.fetch_add(1, std::memory_order_release);
  }
  *virPtr = p;
  return ACL_SUCCESS;
}

aclError aclsimVmmLookup(const void* ptr, void** resStart, size_t* resSize, uint64_t* resId,
                         int32_t* deviceId, uint64_t* arenaOffset) {
  const char* api = "aclsimVmmLookup";
  Vmm& v = V();
  std::shared_lock<std::shared_mutex> r(v.mu);
  uintptr_t start = 0;
  Reservation* res = v.Find(ptr, &start);
  if (res == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not in a reserved range", api, ptr);
  if (arenaOffset) {
    const size_t off = reinterpret_cast<uintptr_t>(ptr) - start;
    auto it = res->maps.upper_bound(off);
    if (it == res->maps.begin() || off - std::prev(it)->first >= std::prev(it)->second.size)
      return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is reserved but not mapped", api, ptr);
    --it;
    const PhysMem* mem = it->second.mem;
    *arenaOffset = static_cast<uint64_t>(mem->arena_ptr - RT().devices[mem->device]->arena.base()) +
                   (off - it->first);
  }
  if (resStart) *resStart = reinterpret_cast<void*>(start);
  if (resSize) *resSize = res->size;
  if (resId) *resId = res->id;
  if (deviceId) *deviceId = res->device;
  return ACL_SUCCESS;
}

aclError aclrtReleaseMemAddress(void* virPtr) {
  const char* api = "aclrtReleaseMemAddress";
  if (virPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: virPtr is null", api);
  Vmm& v = V();
  std::unique_lock<std::shared_mutex> w(v.mu);
  auto it = v.reservations.find(reinterpret_cast<uintptr_t>(virPtr));
  if (it == v.reservations.end())
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: %p is not the start of a reserved range (released already?)", api, virPtr);
  if (!it->second.maps.empty())
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p still has %zu mapping(s); aclrtUnmapMem first",
                api, virPtr, it->second.maps.size());
  munmap(virPtr, it->second.size);  // under the lock: the range cannot be reused meanwhile
  v.reservations.erase(it);
  v.count.fetch_sub(1, std::memory_order_release);
  return ACL_SUCCESS;
}

aclError aclrtMallocPhysical(aclrtDrvMemHandle* handle, size_t size,
                             const aclrtPhysicalMemProp* prop, uint64_t flags) {
  const char* api = "aclrtMallocPhysical";
  if (handle == nullptr || prop == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %s is null", api, handle ? "prop" : "handle");
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "%s: size 0 is invalid", api);
  if (flags != 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: flags must be 0, got %llu", api,
                static_cast<unsigned long long>(flags));
  const int handle_type = AsInt(prop->handleType), alloc_type = AsInt(prop->allocationType),
            attr = AsInt(prop->memAttr), location = AsInt(prop->location.type);
  if (handle_type != ACL_MEM_HANDLE_TYPE_NONE || alloc_type != ACL_MEM_ALLOCATION_TYPE_PINNED ||
      attr < ACL_DDR_MEM || attr > ACL_HBM_MEM_P2P_HUGE1G)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: invalid prop (handleType %d, allocationType %d, memAttr %d)", api,
                handle_type, alloc_type, attr);
  if (location == ACL_MEM_LOCATION_TYPE_HOST)
    return Fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "%s: host physical memory is not simulated (use ACL_MEM_LOCATION_TYPE_DEVICE)",
                api);
  if (location != ACL_MEM_LOCATION_TYPE_DEVICE)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid location type %d", api, location);
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(static_cast<int>(prop->location.id), api, &err);
  if (d == nullptr) return err;
  void* p = nullptr;
  if ((err = d->arena.Allocate(size, /*physical=*/true, &p)) != ACL_SUCCESS) return err;
  auto mem = std::make_unique<PhysMem>(PhysMem{d->id, static_cast<char*>(p), RoundUp(size), 0});
  Vmm& v = V();
  std::unique_lock<std::shared_mutex> w(v.mu);
  *handle = mem.get();
  v.handles.emplace(mem.get(), std::move(mem));
  return ACL_SUCCESS;
}

aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
  const char* api = "aclrtFreePhysical";
  Vmm& v = V();
  std::unique_ptr<PhysMem> mem;
  {
    std::unique_lock<std::shared_mutex> w(v.mu);
    auto it = v.handles.find(handle);
    if (it == v.handles.end()) return BadHandle(api, handle);
    if (it->second->maps > 0)
      return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is still mapped %d time(s); aclrtUnmapMem first",
                  api, handle, it->second->maps);
    mem = std::move(it->second);
    v.handles.erase(it);
  }
  return RT().devices[mem->device]->arena.Free(mem->arena_ptr, /*physical=*/true);
}

aclError aclrtMapMem(void* virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle,
                     uint64_t flags) {
  const char* api = "aclrtMapMem";
  if (virPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: virPtr is null", api);
  if (offset != 0 || flags != 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: offset and flags must be 0 (got %zu, %llu)", api,
                offset, static_cast<unsigned long long>(flags));
  Vmm& v = V();
  std::unique_lock<std::shared_mutex> w(v.mu);
  PhysMem* mem = v.Handle(handle);
  if (mem == nullptr) return BadHandle(api, handle);
  if (size == 0 || size > mem->size || RoundUp(size) != mem->size)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: size %zu does not match the handle's %zu bytes",
                api, size, mem->size);
  uintptr_t start = 0;
  Reservation* res = v.Find(virPtr, &start);
  if (res == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not in a reserved range", api, virPtr);
  const size_t off = reinterpret_cast<uintptr_t>(virPtr) - start;
  if (off % kGranule != 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not aligned to the %s granularity", api,
                virPtr, FormatBytes(kGranule).c_str());
  if (mem->size > res->size - off)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: [%p, +%s) runs past the end of its reservation",
                api, virPtr, FormatBytes(mem->size).c_str());
  auto next = res->maps.lower_bound(off);
  bool overlaps = next != res->maps.end() && next->first < off + mem->size;
  if (next != res->maps.begin()) {
    auto prev = std::prev(next);
    overlaps |= prev->first + prev->second.size > off;
  }
  if (overlaps)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: [%p, +%s) overlaps memory mapped already", api,
                virPtr, FormatBytes(mem->size).c_str());
  if (res->device >= 0 && res->device != mem->device)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: the reservation maps memory of device %d; %p is memory of device %d", api,
                res->device, handle, mem->device);
  Arena& arena = RT().devices[mem->device]->arena;
  const auto file_off = static_cast<off_t>(mem->arena_ptr - arena.base());
  if (mmap(virPtr, mem->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, arena.fd(),
           file_off) == MAP_FAILED) {
    const int e = errno;
    Protect(virPtr, mem->size);  // a failed MAP_FIXED may have dropped the reservation there
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: mapping %s at %p failed: %s", api,
                FormatBytes(mem->size).c_str(), virPtr, strerror(e));
  }
  res->maps.emplace(off, Mapping{mem->size, mem});
  res->device = mem->device;
  ++mem->maps;
  return ACL_SUCCESS;
}

aclError aclrtUnmapMem(void* virPtr) {
  const char* api = "aclrtUnmapMem";
  if (virPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: virPtr is null", api);
  Vmm& v = V();
  std::unique_lock<std::shared_mutex> w(v.mu);
  uintptr_t start = 0;
  Reservation* res = v.Find(virPtr, &start);
  std::map<size_t, Mapping>::iterator it;
  if (res == nullptr ||
      (it = res->maps.find(reinterpret_cast<uintptr_t>(virPtr) - start)) == res->maps.end())
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not the start of a mapping", api, virPtr);
  if (!Protect(virPtr, it->second.size))
    return Fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: unmapping %p failed: %s", api, virPtr,
                strerror(errno));
  --it->second.mem->maps;
  res->maps.erase(it);
  if (res->maps.empty()) res->device = -1;
  return ACL_SUCCESS;
}

}  // extern "C"
