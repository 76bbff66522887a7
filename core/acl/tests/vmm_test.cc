// Virtual memory API on small devices (ASCEND_SIM_HBM_BYTES=64M, 2 devices): reserve,
// physical memory, map / unmap, copies through mappings, capacity accounting, errors.
#include <stdint.h>

#include <thread>
#include <vector>

#include "check.h"

static const size_t kMiB = size_t(1) << 20;

static size_t FreeBytes() {
  size_t f = 0, t = 0;
  aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
  return f;
}

// An enum holding a value outside its enumerators (as C callers may pass).
template <typename E>
static E Invalid(int v) {
  E e;
  memcpy(&e, &v, sizeof e);
  return e;
}

static aclrtPhysicalMemProp Prop(int device) {
  aclrtPhysicalMemProp prop = {};
  prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
  prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
  prop.memAttr = ACL_HBM_MEM_HUGE;
  prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<uint32_t>(device);
  return prop;
}

static aclrtDrvMemHandle Physical(size_t size, int device = 0) {
  aclrtPhysicalMemProp prop = Prop(device);
  aclrtDrvMemHandle h = nullptr;
  CHECK_OK(aclrtMallocPhysical(&h, size, &prop, 0));
  return h;
}

static void TestGranularity() {
  aclrtPhysicalMemProp prop = Prop(0);
  size_t g = 0;
  CHECK_OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
  CHECK_EQ(g, 2 * kMiB);
  g = 0;
  CHECK_OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g));
  CHECK_EQ(g, 2 * kMiB);
  CHECK_RC(aclrtMemGetAllocationGranularity(nullptr, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g),
           ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, nullptr),
           ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMemGetAllocationGranularity(&prop, Invalid<aclrtMemGranularityOptions>(7), &g),
           ACL_ERROR_INVALID_PARAM);
}

// Reserve, map two handles side by side, write and read through the mapping (also
// across the boundary of the two handles), map one handle twice, unmap, release.
static void TestMapReadWrite() {
  const size_t free0 = FreeBytes();
  void* va = nullptr;
  CHECK_OK(aclrtReserveMemAddress(&va, 15 * kMiB, 0, nullptr, 0));  // rounded to 16 MiB
  REQUIRE(va != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(va) % (2 * kMiB) == 0);
  CHECK_EQ(FreeBytes(), free0);  // address space only
  CHECK_EQ(aclsimPointerDevice(va), -1);

  aclrtDrvMemHandle a = Physical(4 * kMiB), b = Physical(3 * kMiB);  // b: rounded to 4 MiB
  CHECK_EQ(FreeBytes(), free0 - 8 * kMiB);
  char* p = static_cast<char*>(va);
  CHECK_OK(aclrtMapMem(p, 4 * kMiB, 0, a, 0));
  CHECK_OK(aclrtMapMem(p + 4 * kMiB, 3 * kMiB, 0, b, 0));  // the handle's size, as given
  CHECK_EQ(aclsimPointerDevice(p), 0);
  CHECK_EQ(aclsimPointerDevice(p + 8 * kMiB - 1), 0);
  CHECK_EQ(aclsimPointerDevice(p + 8 * kMiB), -1);  // reserved, not mapped

  // Fresh physical memory reads zero; a copy may span the two handles.
  CHECK(p[0] == 0 && p[8 * kMiB - 1] == 0);
  std::vector<char> src(6 * kMiB), dst(6 * kMiB);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
  CHECK_OK(aclrtMemcpy(p + kMiB, 7 * kMiB, src.data(), src.size(), ACL_MEMCPY_HOST_TO_DEVICE));
  CHECK_OK(aclrtMemcpy(dst.data(), dst.size(), p + kMiB, dst.size(), ACL_MEMCPY_DEVICE_TO_HOST));
  CHECK(memcmp(src.data(), dst.data(), src.size()) == 0);
  CHECK_OK(aclrtMemcpyAsync(p, 8 * kMiB, src.data(), kMiB, ACL_MEMCPY_HOST_TO_DEVICE, nullptr));
  CHECK_OK(aclrtSynchronizeStream(nullptr));
  CHECK(memcmp(p, src.data(), kMiB) == 0);
  CHECK_OK(aclrtMemset(p + 7 * kMiB, kMiB, 0x5a, kMiB));
  CHECK(p[8 * kMiB - 1] == 0x5a);
  // Copies and memsets reaching unmapped addresses are refused.
  CHECK_RC(aclrtMemcpy(p + 7 * kMiB, 2 * kMiB, src.data(), 2 * kMiB, ACL_MEMCPY_HOST_TO_DEVICE),
           ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "not entirely mapped"));
  CHECK_RC(aclrtMemset(p + 8 * kMiB, kMiB, 0, kMiB), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtFree(p), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "reserved virtual memory"));

  // The same handle mapped a second time (another reservation) shows the same bytes.
  void* va2 = nullptr;
  CHECK_OK(aclrtReserveMemAddress(&va2, 4 * kMiB, 0, nullptr, 1));
  char* q = static_cast<char*>(va2);
  CHECK_OK(aclrtMapMem(q, 4 * kMiB, 0, a, 0));
  CHECK_EQ(FreeBytes(), free0 - 8 * kMiB);  // no new memory
  CHECK(memcmp(q, src.data(), kMiB) == 0);
  q[123] = 42;
  CHECK(p[123] == 42);
  CHECK_OK(aclrtMemcpy(p + 4 * kMiB, kMiB, q, kMiB, ACL_MEMCPY_DEVICE_TO_DEVICE));
  CHECK(p[4 * kMiB + 123] == 42);

  // Unmap: the addresses stop being device memory; the other mapping keeps the data.
  CHECK_OK(aclrtUnmapMem(p));
  CHECK_EQ(aclsimPointerDevice(p), -1);
  CHECK_EQ(aclsimPointerDevice(q), 0);
  CHECK(q[123] == 42);
  CHECK_RC(aclrtMemcpy(dst.data(), kMiB, p, kMiB, ACL_MEMCPY_DEVICE_TO_HOST),
           ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtUnmapMem(p), ACL_ERROR_INVALID_PARAM);  // twice
  CHECK_RC(aclrtFreePhysical(a), ACL_ERROR_INVALID_PARAM);  // still mapped at q
  CHECK(Contains(aclGetRecentErrMsg(), "still mapped"));
  CHECK_OK(aclrtUnmapMem(q));
  CHECK_OK(aclrtFreePhysical(a));
  CHECK_EQ(FreeBytes(), free0 - 4 * kMiB);
  CHECK_RC(aclrtFreePhysical(a), ACL_ERROR_INVALID_PARAM);  // double free
  CHECK_RC(aclrtReleaseMemAddress(va), ACL_ERROR_INVALID_PARAM);  // b is still mapped
  CHECK(Contains(aclGetRecentErrMsg(), "1 mapping"));

  // Remapping b elsewhere in the range: its bytes follow it.
  CHECK_OK(aclrtUnmapMem(p + 4 * kMiB));
  CHECK_OK(aclrtMapMem(p + 12 * kMiB, 4 * kMiB, 0, b, 0));
  CHECK(p[12 * kMiB + 123] == 42);
  CHECK_OK(aclrtUnmapMem(p + 12 * kMiB));
  CHECK_OK(aclrtFreePhysical(b));
  CHECK_OK(aclrtReleaseMemAddress(va));
  CHECK_OK(aclrtReleaseMemAddress(va2));
  CHECK_RC(aclrtReleaseMemAddress(va2), ACL_ERROR_INVALID_PARAM);
  CHECK_EQ(FreeBytes(), free0);

  // Freed physical memory is given back: a new handle reads zeros.
  void* vb = nullptr;
  CHECK_OK(aclrtReserveMemAddress(&vb, 2 * kMiB, 0, nullptr, 0));
  aclrtDrvMemHandle c = Physical(2 * kMiB);
  CHECK_OK(aclrtMapMem(vb, 2 * kMiB, 0, c, 0));
  bool zero = true;
  for (size_t i = 0; i < 2 * kMiB; i += 4096) zero &= static_cast<char*>(vb)[i] == 0;
  CHECK(zero);
  CHECK_OK(aclrtUnmapMem(vb));
  CHECK_OK(aclrtFreePhysical(c));
  CHECK_OK(aclrtReleaseMemAddress(vb));
}

// Physical memory counts in the device's capacity, like aclrtMalloc.
static void TestCapacity() {
  CHECK_EQ(FreeBytes(), 64 * kMiB);
  void* dev = nullptr;
  CHECK_OK(aclrtMalloc(&dev, 16 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  std::vector<aclrtDrvMemHandle> pages;
  for (int i = 0; i < 24; ++i) pages.push_back(Physical(2 * kMiB));
  CHECK_EQ(FreeBytes(), 0u);
  aclrtPhysicalMemProp prop = Prop(0);
  aclrtDrvMemHandle h = nullptr;
  CHECK_RC(aclrtMallocPhysical(&h, 2 * kMiB, &prop, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK(Contains(aclGetRecentErrMsg(), "aclrtMallocPhysical: out of memory on device 0"));
  void* more = nullptr;
  CHECK_RC(aclrtMalloc(&more, 1, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
  // Device 1 is independent.
  aclrtDrvMemHandle other = Physical(64 * kMiB, 1);
  CHECK_OK(aclrtSetDevice(1));
  CHECK_EQ(FreeBytes(), 0u);
  CHECK_OK(aclrtSetDevice(0));
  // Pages of a full device, mapped back to back in one range larger than the device.
  void* va = nullptr;
  CHECK_OK(aclrtReserveMemAddress(&va, 192 * kMiB, 0, nullptr, 0));
  char* p = static_cast<char*>(va);
  for (size_t i = 0; i < pages.size(); ++i)
    CHECK_OK(aclrtMapMem(p + (i + 10) * 2 * kMiB, 2 * kMiB, 0, pages[i], 0));
  memset(p + 20 * kMiB, 1, 48 * kMiB);
  CHECK_EQ(aclsimPointerDevice(p + 67 * kMiB), 0);
  CHECK_OK(aclrtMemcpy(p + 20 * kMiB, 48 * kMiB, p + 20 * kMiB, 48 * kMiB,
                       ACL_MEMCPY_DEVICE_TO_DEVICE));
  // A device-1 handle cannot join a range that maps device-0 memory.
  CHECK_RC(aclrtMapMem(p + 128 * kMiB, 64 * kMiB, 0, other, 0), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "maps memory of device 0"));
  for (size_t i = 0; i < pages.size(); ++i) {
    CHECK_OK(aclrtUnmapMem(p + (i + 10) * 2 * kMiB));
    CHECK_OK(aclrtFreePhysical(pages[i]));
  }
  CHECK_EQ(FreeBytes(), 48 * kMiB);
  CHECK_OK(aclrtMapMem(p, 64 * kMiB, 0, other, 0));  // nothing of device 0 left in it
  CHECK_EQ(aclsimPointerDevice(p + 5), 1);
  CHECK_OK(aclrtUnmapMem(p));
  CHECK_OK(aclrtFreePhysical(other));
  CHECK_OK(aclrtReleaseMemAddress(va));
  CHECK_OK(aclrtFree(dev));
  CHECK_EQ(FreeBytes(), 64 * kMiB);
}

static void TestErrors() {
  aclrtPhysicalMemProp prop = Prop(0);
  aclrtDrvMemHandle h = nullptr;
  void* va = nullptr;
  // Reserve.
  CHECK_RC(aclrtReserveMemAddress(nullptr, kMiB, 0, nullptr, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtReserveMemAddress(&va, 0, 0, nullptr, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtReserveMemAddress(&va, kMiB, 3, nullptr, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtReserveMemAddress(&va, kMiB, 0, nullptr, 2), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtReserveMemAddress(&va, SIZE_MAX, 0, nullptr, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK_RC(aclrtReserveMemAddress(&va, kMiB, 0, reinterpret_cast<void*>(4096), 0),
           ACL_ERROR_RT_PARAM_INVALID);
  // A requested address: honoured when free, refused when taken.
  CHECK_OK(aclrtReserveMemAddress(&va, 8 * kMiB, 0, nullptr, 0));
  void* want = static_cast<char*>(va) + 2 * kMiB;
  void* got = nullptr;
  CHECK_RC(aclrtReserveMemAddress(&got, 2 * kMiB, 0, want, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK_OK(aclrtReleaseMemAddress(va));
  CHECK_OK(aclrtReserveMemAddress(&got, 2 * kMiB, 0, want, 0));
  CHECK(got == want);
  CHECK_OK(aclrtReleaseMemAddress(got));
  // An alignment larger than the granularity.
  CHECK_OK(aclrtReserveMemAddress(&va, 2 * kMiB, 64 * kMiB, nullptr, 0));
  CHECK(reinterpret_cast<uintptr_t>(va) % (64 * kMiB) == 0);
  CHECK_OK(aclrtReleaseMemAddress(va));

  // Physical memory.
  CHECK_RC(aclrtMallocPhysical(nullptr, kMiB, &prop, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMallocPhysical(&h, kMiB, nullptr, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMallocPhysical(&h, 0, &prop, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMallocPhysical(&h, kMiB, &prop, 1), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMallocPhysical(&h, 65 * kMiB, &prop, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK_RC(aclrtMallocPhysical(&h, SIZE_MAX, &prop, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);
  aclrtPhysicalMemProp bad = prop;
  bad.location.id = 2;
  CHECK_RC(aclrtMallocPhysical(&h, kMiB, &bad, 0), ACL_ERROR_RT_INVALID_DEVICEID);
  bad = prop;
  bad.location.type = ACL_MEM_LOCATION_TYPE_HOST;
  CHECK_RC(aclrtMallocPhysical(&h, kMiB, &bad, 0), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  bad = prop;
  bad.memAttr = Invalid<aclrtMemAttr>(99);
  CHECK_RC(aclrtMallocPhysical(&h, kMiB, &bad, 0), ACL_ERROR_INVALID_PARAM);
  int garbage = 0;
  CHECK_RC(aclrtFreePhysical(&garbage), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtFreePhysical(nullptr), ACL_ERROR_INVALID_PARAM);

  // Map / unmap.
  CHECK_OK(aclrtReserveMemAddress(&va, 8 * kMiB, 0, nullptr, 0));
  char* p = static_cast<char*>(va);
  aclrtDrvMemHandle a = Physical(4 * kMiB);
  CHECK_RC(aclrtMapMem(nullptr, 4 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMapMem(p, 4 * kMiB, 0, &garbage, 0), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "not a live physical memory handle"));
  CHECK_RC(aclrtMapMem(p, 2 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);  // size mismatch
  CHECK_RC(aclrtMapMem(p, 6 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMapMem(p, 4 * kMiB, 2 * kMiB, a, 0), ACL_ERROR_INVALID_PARAM);  // offset
  CHECK_RC(aclrtMapMem(p, 4 * kMiB, 0, a, 1), ACL_ERROR_INVALID_PARAM);         // flags
  CHECK_RC(aclrtMapMem(p + 4096, 4 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);  // misaligned
  CHECK_RC(aclrtMapMem(p + 6 * kMiB, 4 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);  // past end
  CHECK(Contains(aclGetRecentErrMsg(), "past the end"));
  CHECK_RC(aclrtMapMem(&garbage, 4 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);  // not reserved
  CHECK_OK(aclrtMapMem(p + 2 * kMiB, 4 * kMiB, 0, a, 0));
  aclrtDrvMemHandle b = Physical(4 * kMiB);
  CHECK_RC(aclrtMapMem(p + 2 * kMiB, 4 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);  // double
  CHECK_RC(aclrtMapMem(p, 4 * kMiB, 0, b, 0), ACL_ERROR_INVALID_PARAM);   // overlaps the end
  CHECK_RC(aclrtMapMem(p + 4 * kMiB, 4 * kMiB, 0, b, 0), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "overlaps"));
  CHECK_EQ(aclsimPointerDevice(p), -1);  // failed maps left the reservation as it was
  CHECK_RC(aclrtUnmapMem(p + 4 * kMiB), ACL_ERROR_INVALID_PARAM);  // inside a mapping
  CHECK_RC(aclrtUnmapMem(p), ACL_ERROR_INVALID_PARAM);             // nothing mapped there
  CHECK_RC(aclrtUnmapMem(&garbage), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtUnmapMem(nullptr), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtReleaseMemAddress(p + 2 * kMiB), ACL_ERROR_INVALID_PARAM);  // not the start
  CHECK_RC(aclrtReleaseMemAddress(nullptr), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtUnmapMem(p + 2 * kMiB));
  CHECK_OK(aclrtFreePhysical(a));
  CHECK_RC(aclrtMapMem(p, 4 * kMiB, 0, a, 0), ACL_ERROR_INVALID_PARAM);  // freed handle
  CHECK_OK(aclrtFreePhysical(b));
  CHECK_OK(aclrtReleaseMemAddress(va));
  CHECK_EQ(aclsimPointerDevice(p), -1);
  CHECK_EQ(FreeBytes(), 64 * kMiB);
}

// Threads mapping, copying through, and unmapping their own ranges while others look
// pointers up.
static void TestConcurrent() {
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([t, &errors] {
      aclrtPhysicalMemProp prop = Prop(t % 2);
      for (int i = 0; i < 200; ++i) {
        void* va = nullptr;
        aclrtDrvMemHandle h = nullptr;
        if (aclrtReserveMemAddress(&va, 4 * kMiB, 0, nullptr, 0) != ACL_SUCCESS) {
          ++errors;
          continue;
        }
        char* p = static_cast<char*>(va);
        if (aclrtMallocPhysical(&h, 2 * kMiB, &prop, 0) == ACL_SUCCESS) {
          if (aclrtMapMem(p + 2 * kMiB, 2 * kMiB, 0, h, 0) != ACL_SUCCESS) ++errors;
          char v = static_cast<char>(t + i);
          if (aclrtMemcpy(p + 3 * kMiB, 1, &v, 1, ACL_MEMCPY_HOST_TO_DEVICE) != ACL_SUCCESS ||
              p[3 * kMiB] != v || aclsimPointerDevice(p + 2 * kMiB) != t % 2 ||
              aclsimPointerDevice(p) != -1)
            ++errors;
          if (aclrtUnmapMem(p + 2 * kMiB) != ACL_SUCCESS) ++errors;
          if (aclrtFreePhysical(h) != ACL_SUCCESS) ++errors;
        }
        if (aclrtReleaseMemAddress(va) != ACL_SUCCESS) ++errors;
      }
    });
  }
  for (auto& th : ts) th.join();
  CHECK_EQ(errors.load(), 0);
  CHECK_EQ(FreeBytes(), 64 * kMiB);
}

// aclsimVmmLookup: the reservation of an address, and the arena (memfd) offset of mapped
// bytes, through which another process maps the same pages (hccl does).
static void TestLookup() {
  void* base = nullptr;
  size_t arena_size = 0;
  int fd = -1;
  CHECK_OK(aclsimDeviceArena(1, &base, &arena_size, &fd));
  void* va = nullptr;
  CHECK_OK(aclrtReserveMemAddress(&va, 8 * kMiB, 0, nullptr, 0));
  char* p = static_cast<char*>(va);
  void* start = nullptr;
  size_t size = 0;
  uint64_t id = 0, id2 = 0, off = 0;
  int32_t device = 7;
  CHECK_OK(aclsimVmmLookup(p + 5, &start, &size, &id, &device, nullptr));  // reserved only
  CHECK(start == va && size == 8 * kMiB && id != 0 && device == -1);
  CHECK_RC(aclsimVmmLookup(p, nullptr, nullptr, nullptr, nullptr, &off), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "not mapped"));
  // Two handles mapped in the reverse of their arena order.
  aclrtDrvMemHandle a = Physical(2 * kMiB, 1), b = Physical(2 * kMiB, 1);
  CHECK_OK(aclrtMapMem(p, 2 * kMiB, 0, b, 0));
  CHECK_OK(aclrtMapMem(p + 2 * kMiB, 2 * kMiB, 0, a, 0));
  p[100] = 11;
  p[2 * kMiB + 100] = 22;
  uint64_t off_b = 0, off_a = 0;
  CHECK_OK(aclsimVmmLookup(p + 100, nullptr, nullptr, &id2, &device, &off_b));
  CHECK_OK(aclsimVmmLookup(p + 2 * kMiB + 100, nullptr, nullptr, nullptr, nullptr, &off_a));
  CHECK(id2 == id && device == 1);
  CHECK(off_a < arena_size && off_b < arena_size && off_a != off_b);
  const char* arena = static_cast<const char*>(base);
  CHECK(arena[off_b] == 11 && arena[off_a] == 22);
  CHECK_RC(aclsimVmmLookup(base, nullptr, nullptr, nullptr, nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtUnmapMem(p));
  CHECK_OK(aclrtUnmapMem(p + 2 * kMiB));
  CHECK_OK(aclrtFreePhysical(a));
  CHECK_OK(aclrtFreePhysical(b));
  CHECK_OK(aclrtReleaseMemAddress(va));
  // A new reservation, even at the same address, has a new id.
  CHECK_OK(aclrtReserveMemAddress(&va, 8 * kMiB, 0, nullptr, 0));
  CHECK_OK(aclsimVmmLookup(va, nullptr, nullptr, &id2, nullptr, nullptr));
  CHECK(id2 != id);
  CHECK_OK(aclrtReleaseMemAddress(va));
}

int main() {
  setenv("ASCEND_SIM_HBM_BYTES", "64M", 1);
  setenv("ASCEND_SIM_DEVICE_COUNT", "2", 1);
  unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  unsetenv("ASCEND_SIM_SOC");
  TestGranularity();
  TestMapReadWrite();
  TestCapacity();
  TestErrors();
  TestLookup();
  TestConcurrent();
  return Finish();
}
