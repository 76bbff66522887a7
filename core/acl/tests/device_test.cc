// Default profile (no env overrides): devices, current device, lazy arenas, pointer
// lookup, host memory, synchronous copies and their validation.
#include <stdint.h>

#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "check.h"

static const size_t kGiB = size_t(1) << 30;
static const size_t kMiB = size_t(1) << 20;

static std::string Maps() {
  std::ifstream f("/proc/self/maps");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static void TestDevices() {
  uint32_t n = 0;
  CHECK_OK(aclrtGetDeviceCount(&n));
  CHECK(n == 8);
  CHECK(strcmp(aclrtGetSocName(), "Ascend910B1") == 0);
  CHECK(aclsimDeviceCapacity(0) == 64 * kGiB);
  CHECK(aclsimDeviceCapacity(7) == 64 * kGiB);
  CHECK(aclsimDeviceCapacity(8) == 0);

  int32_t d = -1;
  CHECK_OK(aclrtGetDevice(&d));
  CHECK(d == 0);
  CHECK_OK(aclrtSetDevice(3));
  CHECK_OK(aclrtGetDevice(&d));
  CHECK(d == 3);
  int32_t other = -1;
  std::thread([&] { aclrtGetDevice(&other); }).join();
  CHECK(other == 0);  // current device is per thread

  CHECK_RC(aclrtSetDevice(8), ACL_ERROR_RT_INVALID_DEVICEID);
  CHECK(Contains(aclGetRecentErrMsg(), "invalid device id 8"));
  CHECK_RC(aclrtSetDevice(-1), ACL_ERROR_RT_INVALID_DEVICEID);
  CHECK_OK(aclrtGetDevice(&d));
  CHECK(d == 3);  // unchanged by failed calls
  std::string msg_other = "x";
  std::thread([&] { msg_other = aclGetRecentErrMsg(); }).join();
  CHECK(msg_other.empty());  // recent error is per thread

  size_t free_b = 0, total = 0;
  CHECK_OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
  CHECK(total == 64 * kGiB && free_b == 64 * kGiB);
  CHECK_OK(aclrtGetMemInfo(ACL_DDR_MEM, &free_b, &total));
  CHECK(total > 0);

  aclrtStream s0 = aclsimDefaultStream(0);
  CHECK(s0 != nullptr);
  CHECK(aclsimDefaultStream(0) == s0);
  CHECK(aclsimDefaultStream(3) != s0);
  CHECK(aclsimDefaultStream(99) == nullptr);
  CHECK(aclsimStreamDevice(nullptr) == 3);
  CHECK(aclsimStreamDevice(s0) == 0);
  CHECK(aclsimOnWorkerThread() == 0);

  CHECK_RC(aclInit(nullptr), ACL_SUCCESS);
  CHECK_RC(aclInit(nullptr), ACL_ERROR_REPEAT_INITIALIZE);
  CHECK_OK(aclFinalize());
  CHECK_OK(aclInit(nullptr));
  CHECK_OK(aclrtSetDevice(0));
}

static void TestLazyArena() {
  // Nothing allocated yet: no arena exists.
  CHECK(Maps().find("ascend_sim_dev") == std::string::npos);
  CHECK_OK(aclrtSetDevice(0));
  size_t rss0 = RssBytes();
  void* p = nullptr;
  CHECK_OK(aclrtMalloc(&p, kGiB, ACL_MEM_MALLOC_HUGE_FIRST));
  REQUIRE(p != nullptr);
  CHECK(((uintptr_t)p % (2 * kMiB)) == 0);
  static_cast<char*>(p)[0] = 1;  // touch one page
  size_t rss1 = RssBytes();
  CHECK(rss1 < rss0 + 4 * kMiB);  // 1 GiB reserved, only touched pages count
  std::string maps = Maps();
  CHECK(maps.find("ascend_sim_dev0") != std::string::npos);
  CHECK(maps.find("ascend_sim_dev1") == std::string::npos);  // other devices stay lazy

  size_t free_b = 0, total = 0;
  CHECK_OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
  CHECK(free_b == 63 * kGiB);

  // Touch 64 MiB: RSS grows; aclrtFree punches the pages out again.
  memset(p, 0x5a, 64 * kMiB);
  size_t rss2 = RssBytes();
  CHECK(rss2 > rss0 + 60 * kMiB);
  CHECK_OK(aclrtFree(p));
  size_t rss3 = RssBytes();
  CHECK(rss3 < rss0 + 4 * kMiB);
  CHECK_OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
  CHECK(free_b == 64 * kGiB);

  void* base = nullptr;
  size_t size = 0;
  int fd = -1;
  CHECK_OK(aclsimDeviceArena(2, &base, &size, &fd));  // maps device 2 on request
  CHECK(base != nullptr && size == 64 * kGiB && fd >= 0);
  CHECK_RC(aclsimDeviceArena(9, &base, &size, &fd), ACL_ERROR_RT_INVALID_DEVICEID);
}

static void TestPointerDevice() {
  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(aclrtSetDevice(0));
  CHECK_OK(aclrtMalloc(&a, 3 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_OK(aclrtSetDevice(5));
  CHECK_OK(aclrtMalloc(&b, 100, ACL_MEM_MALLOC_NORMAL_ONLY));
  REQUIRE(a && b);
  CHECK(aclsimPointerDevice(a) == 0);
  CHECK(aclsimPointerDevice(static_cast<char*>(a) + 3 * kMiB - 1) == 0);
  CHECK(aclsimPointerDevice(static_cast<char*>(a) + 4 * kMiB - 1) == 0);  // rounded to 2 MiB
  CHECK(aclsimPointerDevice(b) == 5);
  CHECK(aclsimPointerDevice(static_cast<char*>(b) + 50) == 5);
  int on_stack = 0;
  std::vector<char> heap(100);
  CHECK(aclsimPointerDevice(&on_stack) == -1);
  CHECK(aclsimPointerDevice(heap.data()) == -1);
  CHECK(aclsimPointerDevice(nullptr) == -1);
  CHECK_OK(aclrtFree(b));
  CHECK(aclsimPointerDevice(b) == -1);  // inside the arena but not allocated
  CHECK_RC(aclrtFree(b), ACL_ERROR_INVALID_PARAM);  // double free
  CHECK_RC(aclrtFree(heap.data()), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtFree(static_cast<char*>(a) + 64), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMalloc(&b, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtFree(a));
  CHECK_OK(aclrtSetDevice(0));
}

static void TestHostMemoryAndCopies() {
  void* h = nullptr;
  CHECK_OK(aclrtMallocHost(&h, 1000));
  REQUIRE(h != nullptr);
  CHECK(((uintptr_t)h % 64) == 0);
  CHECK(aclsimPointerDevice(h) == -1);
  std::vector<char> plain(16);
  CHECK_RC(aclrtFreeHost(plain.data()), ACL_ERROR_INVALID_PARAM);

  void* d = nullptr;
  CHECK_OK(aclrtMalloc(&d, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
  REQUIRE(d != nullptr);
  uint64_t h2d0 = aclsimCopiedBytes(ACL_MEMCPY_HOST_TO_DEVICE);
  uint64_t d2h0 = aclsimCopiedBytes(ACL_MEMCPY_DEVICE_TO_HOST);
  uint64_t d2d0 = aclsimCopiedBytes(ACL_MEMCPY_DEVICE_TO_DEVICE);
  for (int i = 0; i < 1000; ++i) static_cast<char*>(h)[i] = (char)i;
  CHECK_OK(aclrtMemcpy(d, 4096, h, 1000, ACL_MEMCPY_HOST_TO_DEVICE));
  CHECK_OK(aclrtMemcpy(static_cast<char*>(d) + 2000, 2000, d, 1000, ACL_MEMCPY_DEVICE_TO_DEVICE));
  memset(h, 0, 1000);
  CHECK_OK(aclrtMemcpy(h, 1000, static_cast<char*>(d) + 2000, 1000, ACL_MEMCPY_DEVICE_TO_HOST));
  bool same = true;
  for (int i = 0; i < 1000; ++i) same &= static_cast<char*>(h)[i] == (char)i;
  CHECK(same);
  CHECK(aclsimCopiedBytes(ACL_MEMCPY_HOST_TO_DEVICE) - h2d0 == 1000);
  CHECK(aclsimCopiedBytes(ACL_MEMCPY_DEVICE_TO_HOST) - d2h0 == 1000);
  CHECK(aclsimCopiedBytes(ACL_MEMCPY_DEVICE_TO_DEVICE) - d2d0 == 1000);

  CHECK_OK(aclrtMemset(d, 4096, 0x7f, 4096));
  CHECK(static_cast<unsigned char*>(d)[4095] == 0x7f);

  // Validation.
  CHECK_RC(aclrtMemcpy(plain.data(), 16, h, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "not device memory"));
  CHECK_RC(aclrtMemcpy(h, 1000, plain.data(), 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMemcpy(d, 10, h, 100, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "destMax"));
  // Runs past the end of the (2 MiB rounded) allocation.
  CHECK_RC(aclrtMemcpy(static_cast<char*>(d) + 2 * kMiB - 8, 16, h, 16, ACL_MEMCPY_HOST_TO_DEVICE),
           ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "past the end"));
  CHECK_RC(aclrtMemcpy(d, 16, h, 16, (aclrtMemcpyKind)7), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMemcpy(nullptr, 16, h, 16, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtMemcpy(plain.data(), 16, h, 16, ACL_MEMCPY_HOST_TO_HOST));
  CHECK_RC(aclrtMemset(d, 8, 0, 16), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtMemset(static_cast<char*>(d) + 2 * kMiB - 8, 16, 0, 16), ACL_ERROR_INVALID_PARAM);
  uint64_t h2d1 = aclsimCopiedBytes(ACL_MEMCPY_HOST_TO_DEVICE);
  CHECK(h2d1 - h2d0 == 1000);  // failed copies are not counted

  CHECK_OK(aclrtFree(d));
  CHECK_RC(aclrtMemcpy(d, 16, h, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "not in a live allocation"));
  CHECK_OK(aclrtFreeHost(h));
  CHECK_RC(aclrtFreeHost(h), ACL_ERROR_INVALID_PARAM);
}

int main() {
  unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  unsetenv("ASCEND_SIM_DEVICE_COUNT");
  unsetenv("ASCEND_SIM_HBM_BYTES");
  unsetenv("ASCEND_SIM_SOC");
  TestLazyArena();  // first: checks that no arena exists before the first allocation
  TestDevices();
  TestPointerDevice();
  TestHostMemoryAndCopies();
  return Finish();
}
