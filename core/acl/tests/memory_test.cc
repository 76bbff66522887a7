// Sub-allocator on a small device (ASCEND_SIM_HBM_BYTES=64M): rounding, OOM at
// capacity with a useful message, coalescing, fragmentation, pages released on free,
// concurrent allocation.
#include <stdint.h>

#include <random>
#include <thread>
#include <vector>

#include "check.h"

static const size_t kMiB = size_t(1) << 20;

static size_t FreeBytes() {
  size_t f = 0, t = 0;
  aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
  return f;
}

static void TestCapacityAndOom() {
  CHECK(aclsimDeviceCapacity(0) == 64 * kMiB);
  CHECK(FreeBytes() == 64 * kMiB);
  void* one = nullptr;
  CHECK_OK(aclrtMalloc(&one, 1, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK(FreeBytes() == 62 * kMiB);  // rounded up to 2 MiB
  CHECK_OK(aclrtFree(one));

  std::vector<void*> blocks;
  for (int i = 0; i < 32; ++i) {
    void* p = nullptr;
    CHECK_OK(aclrtMalloc(&p, 2 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(((uintptr_t)p % (2 * kMiB)) == 0);
    blocks.push_back(p);
  }
  CHECK(FreeBytes() == 0);
  void* p = nullptr;
  CHECK_RC(aclrtMalloc(&p, 1000, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
  const char* msg = aclGetRecentErrMsg();
  CHECK(Contains(msg, "out of memory on device 0"));
  CHECK(Contains(msg, "1000 bytes"));
  CHECK(Contains(msg, "0 bytes free"));

  // Free every other block: 32 MiB free but no 4 MiB hole.
  for (int i = 0; i < 32; i += 2) CHECK_OK(aclrtFree(blocks[i]));
  CHECK(FreeBytes() == 32 * kMiB);
  CHECK_RC(aclrtMalloc(&p, 4 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK(Contains(aclGetRecentErrMsg(), "fragmented"));
  for (int i = 1; i < 32; i += 2) CHECK_OK(aclrtFree(blocks[i]));
  CHECK(FreeBytes() == 64 * kMiB);

  // Coalesced back into one range: the whole device in one allocation.
  void* all = nullptr;
  CHECK_OK(aclrtMalloc(&all, 64 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK(FreeBytes() == 0);
  CHECK_OK(aclrtFree(all));
  CHECK_RC(aclrtMalloc(&p, 64 * kMiB + 1, ACL_MEM_MALLOC_HUGE_FIRST),
           ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK_RC(aclrtMalloc(&p, SIZE_MAX, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);

  // Devices are independent.
  CHECK_OK(aclrtMalloc(&all, 64 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_OK(aclrtSetDevice(1));
  void* other = nullptr;
  CHECK_OK(aclrtMalloc(&other, 64 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK(aclsimPointerDevice(other) == 1);
  CHECK_RC(aclrtMalloc(&p, 1, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK(Contains(aclGetRecentErrMsg(), "device 1"));
  CHECK_OK(aclrtFree(other));  // freeing works regardless of the current device
  CHECK_OK(aclrtSetDevice(0));
  CHECK_OK(aclrtFree(all));
}

// aclrtMallocAlign32: aclrtMalloc of the size rounded up to 32 bytes; bad arguments refused.
static void TestMallocAlign32() {
  const size_t before = FreeBytes();
  void* p = nullptr;
  CHECK_OK(aclrtMallocAlign32(&p, 33, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK(p != nullptr && ((uintptr_t)p % 32) == 0);
  CHECK(FreeBytes() == before - 2 * kMiB);
  CHECK_OK(aclrtFree(p));
  CHECK(FreeBytes() == before);
  CHECK_RC(aclrtMallocAlign32(nullptr, 32, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "aclrtMallocAlign32: devPtr is null"));
  CHECK_RC(aclrtMallocAlign32(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
}

static void TestFreedPagesReadZero() {
  void* p = nullptr;
  CHECK_OK(aclrtMalloc(&p, 8 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  REQUIRE(p);
  memset(p, 0xab, 8 * kMiB);
  CHECK_OK(aclrtFree(p));
  void* q = nullptr;
  CHECK_OK(aclrtMalloc(&q, 8 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  REQUIRE(q);
  CHECK(q == p);  // best fit hands the same range back
  bool zero = true;
  for (size_t i = 0; i < 8 * kMiB; i += 4096) zero &= static_cast<unsigned char*>(q)[i] == 0;
  CHECK(zero);  // the hole punched on free gave the pages back
  CHECK_OK(aclrtFree(q));
}

static void TestConcurrent() {
  const int kThreads = 4, kIters = 2000;
  std::atomic<int> ooms{0}, corrupt{0}, errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      aclrtSetDevice(t % 2);
      std::mt19937 rng(t);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 3 && rng() % 2 == 0) {
          size_t size = 1 + rng() % (6 * kMiB);
          void* p = nullptr;
          aclError e = aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_FIRST);
          if (e == ACL_ERROR_RT_MEMORY_ALLOCATION) {
            ++ooms;
            continue;
          }
          if (e != ACL_SUCCESS) {
            ++errors;
            continue;
          }
          auto* c = static_cast<unsigned char*>(p);
          c[0] = c[size - 1] = (unsigned char)(t + 1);
          live.push_back({c, size});
        } else if (!live.empty()) {
          auto [c, size] = live.back();
          live.pop_back();
          if (c[0] != t + 1 || c[size - 1] != t + 1) ++corrupt;
          if (aclsimPointerDevice(c) != t % 2) ++corrupt;
          if (aclrtFree(c) != ACL_SUCCESS) ++errors;
        }
      }
      for (auto& [c, size] : live) {
        if (c[0] != t + 1 || c[size - 1] != t + 1) ++corrupt;
        if (aclrtFree(c) != ACL_SUCCESS) ++errors;
      }
    });
  }
  for (auto& th : ts) th.join();
  CHECK(corrupt == 0);
  CHECK(errors == 0);
  CHECK_OK(aclrtSetDevice(0));
  CHECK(FreeBytes() == 64 * kMiB);
  CHECK_OK(aclrtSetDevice(1));
  CHECK(FreeBytes() == 64 * kMiB);
  CHECK_OK(aclrtSetDevice(0));
  printf("concurrent: %d OOMs (a few are normal on a 64 MiB device)\n", ooms.load());
}

int main() {
  setenv("ASCEND_SIM_HBM_BYTES", "64M", 1);
  setenv("ASCEND_SIM_DEVICE_COUNT", "2", 1);
  unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  unsetenv("ASCEND_SIM_SOC");
  TestCapacityAndOom();
  TestMallocAlign32();
  TestFreedPagesReadZero();
  TestConcurrent();
  return Finish();
}
