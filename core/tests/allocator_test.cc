// Standalone test of the NPU caching allocator (plain main(), no test framework).
// Runs against the simulator with a small device (ASCEND_SIM_HBM_BYTES=4G, 2 devices)
// so that OOM paths are cheap to reach.
#include <torch_npu/core/npu_caching_allocator.h>
#include <torch_npu/core/npu_stream.h>

#include <acl/acl_rt.h>

#include "check.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace alloc = torch_npu::NPUCachingAllocator;

namespace {

// Runs `fn`, expecting an exception of type E whose message contains `needle`.
template <typename E>
bool throws_with(const std::function<void()>& fn, const std::string& needle,
                 std::string* msg_out = nullptr) {
  try {
    fn();
  } catch (const E& e) {
    std::string msg = e.what_without_backtrace();
    if (msg_out) *msg_out = msg;
    if (msg.find(needle) == std::string::npos) {
      std::fprintf(stderr, "  exception message lacks '%s': %s\n", needle.c_str(), msg.c_str());
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "  unexpected exception type: %s\n", e.what());
    return false;
  }
  std::fprintf(stderr, "  no exception thrown (expected '%s')\n", needle.c_str());
  return false;
}

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;
constexpr size_t kGiB = 1024 * kMiB;
// torch_npu pads every request by 32 bytes before rounding: a request of n - kPad bytes
// takes a block of exactly n bytes (n a multiple of 512).
constexpr size_t kPad = 32;
constexpr size_t AGG = 0, SMALL = 1, LARGE = 2;

alloc::DeviceStats stats(c10::DeviceIndex d = 0) { return alloc::getDeviceStats(d); }

char* A(size_t n) { return static_cast<char*>(alloc::raw_alloc(n)); }
void F(void* p) { alloc::raw_delete(p); }

// Everything freed and released: the allocator holds nothing on device 0.
void reset_all() {
  alloc::emptyCache();
  alloc::resetPeakStats(0);
  alloc::resetAccumulatedStats(0);
}

c10::Stream npu_stream(torch_npu::NPUStream s) { return s.unwrap(); }

// ---------------------------------------------------------------------------------

void test_env_conf_and_registration() {
  // PYTORCH_NPU_ALLOC_CONF was set in main() before first use.
  CHECK_EQ(stats().max_split_size, static_cast<int64_t>(1000 * kMiB));
  alloc::setAllocatorSettings("");
  CHECK_EQ(stats().max_split_size, -1);  // SIZE_MAX, as torch.cuda reports it

  CHECK(c10::GetAllocator(c10::DeviceType::PrivateUse1) == alloc::get());
  auto* dev_alloc = c10::getDeviceAllocator(c10::DeviceType::PrivateUse1);
  CHECK(dev_alloc == alloc::get());
  CHECK(dev_alloc->initialized());
}

void test_zero_and_dataptr() {
  reset_all();
  auto z = alloc::allocate(0, 1);
  CHECK(z.get() == nullptr);
  CHECK(z.device() == c10::Device(c10::DeviceType::PrivateUse1, 1));
  auto z2 = alloc::get()->allocate(0);
  CHECK(z2.get() == nullptr);
  CHECK(z2.device() == c10::Device(c10::DeviceType::PrivateUse1, 0));
  CHECK(alloc::raw_alloc(0) == nullptr);
  alloc::raw_delete(nullptr);  // no-op

  void* first = nullptr;
  {
    auto d = alloc::get()->allocate(1000);
    CHECK(d.get() != nullptr);
    CHECK(d.device() == c10::Device(c10::DeviceType::PrivateUse1, 0));
    // Tensor storages free like raw_allocate'd memory, with a free marker (queued kernels
    // borrow the memory they use), so the memory frees in stream order.
    CHECK(d.get_deleter() == alloc::get()->raw_deleter());
    CHECK(alloc::freesInStreamOrder(d));
    CHECK(aclsimPointerDevice(d.get()) == 0);
    std::memset(d.get(), 0x5a, 1000);  // device memory is host memory
    first = d.get();
    CHECK_EQ(stats().allocation[AGG].current, 1);
  }
  CHECK_EQ(stats().allocation[AGG].current, 0);
  {
    auto d = alloc::get()->allocate(700);
    CHECK(d.get() == first);  // the cached block is reused
  }
  // copy_data is a plain memcpy.
  char src[16] = "hello npu";
  auto d = alloc::get()->allocate(16);
  alloc::get()->copy_data(d.get(), src, sizeof(src));
  CHECK(std::memcmp(d.get(), src, sizeof(src)) == 0);
  auto cloned = alloc::get()->clone(d.get(), sizeof(src));
  CHECK(std::memcmp(cloned.get(), src, sizeof(src)) == 0);

  // A DataPtr on device 1.
  auto d1 = alloc::allocate(4096, 1);
  CHECK(d1.device() == c10::Device(c10::DeviceType::PrivateUse1, 1));
  CHECK(aclsimPointerDevice(d1.get()) == 1);
  CHECK_EQ(stats(1).allocation[AGG].current, 1);
  CHECK_EQ(stats(1).reserved_bytes[SMALL].current, static_cast<int64_t>(2 * kMiB));
}

void test_reuse_and_pools() {
  reset_all();
  char* p = A(1000);
  F(p);
  char* q = A(1000);
  CHECK(p == q);
  auto s = stats();
  CHECK_EQ(s.allocated_bytes[AGG].current, 1536);   // 1000 + 32 rounded up to 512
  CHECK_EQ(s.requested_bytes[AGG].current, 1000);
  CHECK_EQ(s.allocated_bytes[SMALL].current, 1536);
  CHECK_EQ(s.reserved_bytes[SMALL].current, static_cast<int64_t>(2 * kMiB));
  CHECK_EQ(s.segment[SMALL].current, 1);
  CHECK_EQ(s.num_device_alloc, 1);

  // 1 MiB - 32 is still small; 1 MiB - 31 is large (20 MiB segment).
  char* m = A(1 * kMiB - kPad);
  CHECK_EQ(stats().segment[SMALL].current, 1);  // carved from the same 2 MiB segment
  CHECK(m == q + 1536);
  char* l = A(1 * kMiB - kPad + 1);
  s = stats();
  CHECK_EQ(s.segment[LARGE].current, 1);
  CHECK_EQ(s.reserved_bytes[LARGE].current, static_cast<int64_t>(20 * kMiB));
  CHECK_EQ(s.allocated_bytes[LARGE].current, static_cast<int64_t>(kMiB + 512));
  // A 12 MiB request is carved from the 20 MiB segment's remainder.
  char* h12 = A(12 * kMiB + 1);
  CHECK(h12 == l + kMiB + 512);
  CHECK_EQ(stats().segment[LARGE].current, 1);
  // >= 10 MiB and no fit: the segment is the request rounded up to 2 MiB.
  char* h = A(20 * kMiB + 1);
  s = stats();
  CHECK_EQ(s.segment[LARGE].current, 2);
  CHECK_EQ(s.reserved_bytes[LARGE].current, static_cast<int64_t>(42 * kMiB));
  CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(44 * kMiB));
  CHECK_EQ(s.allocation[AGG].current, 5);
  CHECK_EQ(s.allocation[SMALL].current, 2);
  CHECK_EQ(s.allocation[LARGE].current, 3);
  for (char* x : {q, m, l, h12, h}) F(x);
  s = stats();
  CHECK_EQ(s.allocation[AGG].current, 0);
  CHECK_EQ(s.allocated_bytes[AGG].current, 0);
  CHECK_EQ(s.requested_bytes[AGG].current, 0);
  CHECK_EQ(s.active[AGG].current, 0);
  CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(44 * kMiB));  // cached

  // A block is only reused by the stream it was allocated on.
  auto other = torch_npu::getStreamFromPool(false, 0);
  char* o = static_cast<char*>(alloc::raw_alloc_with_stream(1000, npu_stream(other)));
  CHECK(o != p);  // the cached block at p belongs to the default stream
  F(o);
  char* again = static_cast<char*>(alloc::raw_alloc_with_stream(1000, npu_stream(other)));
  CHECK(again == o);
  F(again);
}

void test_split_and_coalesce() {
  reset_all();
  // Large pool: a 4 MiB request takes a 20 MiB segment and splits it.
  char* a = A(4 * kMiB - kPad);
  auto s = stats();
  CHECK_EQ(s.segment[LARGE].current, 1);
  CHECK_EQ(s.inactive_split[LARGE].current, 1);
  CHECK_EQ(s.inactive_split_bytes[LARGE].current, static_cast<int64_t>(16 * kMiB));
  char* b = A(4 * kMiB - kPad);
  CHECK(b == a + 4 * kMiB);  // carved from the remainder
  s = stats();
  CHECK_EQ(s.segment[LARGE].current, 1);
  CHECK_EQ(s.inactive_split[LARGE].current, 1);
  CHECK_EQ(s.inactive_split_bytes[LARGE].current, static_cast<int64_t>(12 * kMiB));
  F(a);
  s = stats();
  CHECK_EQ(s.inactive_split[LARGE].current, 2);
  CHECK_EQ(s.inactive_split_bytes[LARGE].current, static_cast<int64_t>(16 * kMiB));
  F(b);  // merges with both neighbours: the segment is whole again
  s = stats();
  CHECK_EQ(s.inactive_split[LARGE].current, 0);
  CHECK_EQ(s.inactive_split_bytes[LARGE].current, 0);
  auto snap = alloc::snapshot();
  size_t segs = 0;
  for (const auto& seg : snap) {
    if (seg.device != 0) continue;
    ++segs;
    CHECK_EQ(seg.blocks.size(), 1u);
    CHECK_EQ(seg.total_size, 20 * kMiB);
    CHECK(seg.is_large);
  }
  CHECK_EQ(segs, 1u);
  // An 18 MiB request fits only because the segment coalesced.
  char* c = A(18 * kMiB - kPad);
  CHECK(c == a);
  CHECK_EQ(stats().segment[LARGE].current, 1);
  CHECK_EQ(stats().num_device_alloc, 1);
  // The 2 MiB remainder is > 1 MiB, so it was split off.
  CHECK_EQ(stats().inactive_split_bytes[LARGE].current, static_cast<int64_t>(2 * kMiB));
  // A 19.5 MiB request in a 20 MiB segment leaves 0.5 MiB: not split.
  F(c);
  char* d = A(19 * kMiB + 512 * kKiB - kPad);
  CHECK(d == a);
  CHECK_EQ(stats().inactive_split[LARGE].current, 0);
  CHECK_EQ(stats().allocated_bytes[LARGE].current, static_cast<int64_t>(20 * kMiB));
  CHECK_EQ(stats().requested_bytes[LARGE].current, static_cast<int64_t>(19 * kMiB + 512 * kKiB - kPad));
  F(d);

  // Small pool: 512-byte blocks are packed back to back.
  char* x = A(1);
  char* y = A(512 - kPad);
  char* z = A(513 - kPad);
  CHECK(y == x + 512);
  CHECK(z == y + 512);
  CHECK_EQ(stats().allocated_bytes[SMALL].current, 2048);
  F(y);
  CHECK_EQ(stats().inactive_split[SMALL].current, 2);  // y's hole and the tail
  char* y2 = A(300);
  CHECK(y2 == y);  // best fit: the 512-byte hole, not the big tail
  F(x);
  F(y2);
  F(z);
  s = stats();
  CHECK_EQ(s.inactive_split[SMALL].current, 0);
  CHECK_EQ(s.segment[SMALL].current, 1);

  // Snapshot of a split segment.
  char* p1 = A(4 * kMiB - kPad);
  char* p2 = A(2 * kMiB - kPad);
  F(p1);
  snap = alloc::snapshot();
  bool found = false;
  for (const auto& seg : snap) {
    if (seg.device != 0 || !seg.is_large) continue;
    found = true;
    CHECK_EQ(seg.address, reinterpret_cast<size_t>(p1));
    CHECK_EQ(seg.blocks.size(), 3u);
    CHECK(!seg.blocks[0].allocated && !seg.blocks[0].active);
    CHECK(seg.blocks[1].allocated && seg.blocks[1].active);
    CHECK_EQ(seg.blocks[1].size, 2 * kMiB);
    CHECK_EQ(seg.blocks[1].requested_size, 2 * kMiB - kPad);
    CHECK_EQ(seg.allocated_size, 2 * kMiB);
    CHECK_EQ(seg.active_size, 2 * kMiB);
    CHECK(seg.stream == aclsimDefaultStream(0));
  }
  CHECK(found);
  // getBaseAllocation: interior pointers map to the block.
  size_t sz = 0;
  CHECK(alloc::getBaseAllocation(p2 + 12345, &sz) == p2);
  CHECK_EQ(sz, 2 * kMiB);
  CHECK(alloc::getBaseAllocation(p2, nullptr) == p2);
  CHECK(alloc::getBaseAllocation(p1, &sz) == nullptr);  // freed
  F(p2);
}

void test_stats_peak_reset() {
  reset_all();
  char* a = A(3 * kMiB - kPad);
  char* b = A(5 * kMiB - kPad);
  F(a);
  auto s = stats();
  CHECK_EQ(s.allocated_bytes[AGG].current, static_cast<int64_t>(5 * kMiB));
  CHECK_EQ(s.allocated_bytes[AGG].peak, static_cast<int64_t>(8 * kMiB));
  CHECK_EQ(s.allocated_bytes[AGG].allocated, static_cast<int64_t>(8 * kMiB));
  CHECK_EQ(s.allocated_bytes[AGG].freed, static_cast<int64_t>(3 * kMiB));
  CHECK_EQ(s.allocation[AGG].allocated, 2);
  CHECK_EQ(s.allocation[AGG].freed, 1);
  CHECK_EQ(s.active_bytes[AGG].current, static_cast<int64_t>(5 * kMiB));
  CHECK_EQ(s.reserved_bytes[AGG].peak, static_cast<int64_t>(20 * kMiB));
  alloc::resetPeakStats(0);
  s = stats();
  CHECK_EQ(s.allocated_bytes[AGG].peak, static_cast<int64_t>(5 * kMiB));
  CHECK_EQ(s.allocated_bytes[AGG].allocated, static_cast<int64_t>(8 * kMiB));  // kept
  alloc::resetAccumulatedStats(0);
  s = stats();
  CHECK_EQ(s.allocated_bytes[AGG].allocated, 0);
  CHECK_EQ(s.allocated_bytes[AGG].freed, 0);
  CHECK_EQ(s.allocated_bytes[AGG].current, static_cast<int64_t>(5 * kMiB));
  CHECK_EQ(s.num_device_alloc, 0);
  F(b);
  s = stats();
  CHECK_EQ(s.allocated_bytes[AGG].freed, static_cast<int64_t>(5 * kMiB));
  CHECK_EQ(s.allocated_bytes[AGG].peak, static_cast<int64_t>(5 * kMiB));
  // The DeviceAllocator interface reaches the same numbers.
  auto s2 = alloc::get()->getDeviceStats(0);
  CHECK_EQ(s2.allocated_bytes[AGG].freed, s.allocated_bytes[AGG].freed);
}

void test_empty_cache_and_mem_info() {
  reset_all();
  auto [free0, total] = alloc::memGetInfo(0);
  CHECK_EQ(total, 4 * kGiB);
  char* a = A(100 * kMiB - kPad);
  char* b = A(1000);
  auto [free1, total1] = alloc::memGetInfo(0);
  CHECK_EQ(free0 - free1, 102 * kMiB);
  CHECK_EQ(total1, total);
  F(a);
  alloc::emptyCache();  // b's segment is still in use
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(2 * kMiB));
  F(b);
  alloc::get()->emptyCache();
  auto s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, 0);
  CHECK_EQ(s.segment[AGG].current, 0);
  CHECK_EQ(s.num_device_free, s.num_device_alloc);
  CHECK_EQ(alloc::memGetInfo(0).first, free0);
  auto info = alloc::get()->getMemoryInfo(0);
  CHECK_EQ(info.first, free0);
  CHECK_EQ(info.second, total);
  size_t segs = 0;
  for (const auto& seg : alloc::snapshot()) segs += seg.device == 0;
  CHECK_EQ(segs, 0u);
}

void test_oom_and_recovery() {
  reset_all();
  // Larger than the device: OOM after one retry.
  std::string msg;
  CHECK(throws_with<c10::OutOfMemoryError>([] { A(5 * kGiB); }, "NPU out of memory", &msg));
  CHECK(msg.find("Tried to allocate 5.00 GiB") != std::string::npos);
  CHECK(msg.find("(NPU 0; 4.00 GiB total capacity;") != std::string::npos);
  CHECK(msg.find("PYTORCH_NPU_ALLOC_CONF") != std::string::npos);
  CHECK(msg.find("torch.npu.empty_cache()") != std::string::npos);
  auto s = stats();
  CHECK_EQ(s.num_ooms, 1);
  CHECK_EQ(s.num_alloc_retries, 1);
  // The allocator is still usable.
  char* p = A(1000);
  CHECK(p != nullptr);
  F(p);

  // Cached memory is released to satisfy a request: 3 GiB cached on another stream
  // cannot be reused by the default stream, so it is freed and the malloc retried.
  auto other = torch_npu::getStreamFromPool(false, 0);
  void* big = alloc::raw_alloc_with_stream(3 * kGiB - kPad, npu_stream(other));
  F(big);
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(3 * kGiB + 2 * kMiB));
  char* q = A(2 * kGiB - kPad);
  s = stats();
  CHECK_EQ(s.num_alloc_retries, 2);
  CHECK_EQ(s.num_ooms, 1);
  CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(2 * kGiB));
  // Now truly out of memory while 2 GiB are allocated.
  CHECK(throws_with<c10::OutOfMemoryError>([] { A(3 * kGiB); }, "2.00 GiB already allocated", &msg));
  CHECK_EQ(stats().num_ooms, 2);
  F(q);
  char* r = A(3 * kGiB);  // recovers once memory is free
  CHECK(r != nullptr);
  F(r);
  // An absurd request is an OOM, not an overflow.
  CHECK(throws_with<c10::OutOfMemoryError>([] { A(~size_t{0} - 10); }, "NPU out of memory"));
  alloc::emptyCache();
}

void test_memory_fraction() {
  reset_all();
  alloc::setMemoryFraction(0.25, 0);  // 1 GiB allowed
  char* a = A(900 * kMiB);
  std::string msg;
  CHECK(throws_with<c10::OutOfMemoryError>([] { A(200 * kMiB); }, "NPU out of memory", &msg));
  CHECK(msg.find("1024.00 MiB allowed; ") != std::string::npos);
  char* b = A(100 * kMiB);  // 900 + 100 <= 1024 MiB
  CHECK(b != nullptr);
  F(a);
  F(b);
  // The cached 900 MiB + 100 MiB segments are released to make room.
  char* c = A(1000 * kMiB);
  CHECK(c != nullptr);
  F(c);
  CHECK(throws_with<c10::Error>([] { alloc::setMemoryFraction(1.5, 0); }, "invalid fraction"));
  alloc::setMemoryFraction(1.0, 0);
  char* d = A(2 * kGiB);
  CHECK(d != nullptr);
  F(d);
  alloc::emptyCache();
}

struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> entered{false};
};

int gate_kernel(void* ud, char*, size_t) {
  auto* g = static_cast<Gate*>(ud);
  g->entered = true;
  while (!g->open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return 0;
}

void test_record_stream() {
  reset_all();
  auto side = torch_npu::getStreamFromPool(false, 0);
  Gate gate;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate, "gate"));

  void* first = nullptr;
  {
    auto d = alloc::get()->allocate(4096 - kPad);
    first = d.get();
    alloc::recordStream(d, npu_stream(side));
    // Recording the allocation stream itself is a no-op.
    alloc::get()->recordStream(d, npu_stream(torch_npu::getDefaultNPUStream(0)));
  }
  // Freed, but the side stream may still use it: not reusable yet, still active.
  auto s = stats();
  CHECK_EQ(s.allocation[AGG].current, 0);
  CHECK_EQ(s.active[AGG].current, 1);
  CHECK_EQ(s.active_bytes[AGG].current, 4096);
  bool pending_seen = false;
  for (const auto& seg : alloc::snapshot()) {
    for (const auto& blk : seg.blocks) {
      if (!blk.allocated && blk.active) pending_seen = true;
    }
  }
  CHECK(pending_seen);
  char* p = A(4096);
  CHECK(p != first);
  F(p);

  gate.open = true;
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  char* q = A(4096);  // events are processed lazily at the next malloc
  CHECK(q == first);
  s = stats();
  CHECK_EQ(s.active[AGG].current, 1);
  F(q);
  CHECK_EQ(stats().active[AGG].current, 0);

  // empty_cache waits for pending events before releasing.
  Gate gate2;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate2, "gate2"));
  {
    auto d = alloc::get()->allocate(8 * kMiB);
    alloc::recordStream(d, npu_stream(side));
  }
  CHECK_EQ(stats().active[LARGE].current, 1);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate2.open = true;
  });
  alloc::emptyCache();
  opener.join();
  s = stats();
  CHECK_EQ(s.active[AGG].current, 0);
  CHECK_EQ(s.reserved_bytes[AGG].current, 0);

  // recordStream on memory the allocator does not own is ignored.
  char host[8];
  c10::DataPtr foreign(host, c10::Device(c10::DeviceType::PrivateUse1, 0));
  alloc::recordStream(foreign, npu_stream(side));
  alloc::recordStream(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, 0)),
                      npu_stream(side));
}

struct KernelAlloc {
  c10::Stream stream;
  size_t size;
  void* got = nullptr;
};

int kernel_alloc(void* ud, char*, size_t) {
  auto* k = static_cast<KernelAlloc*>(ud);
  k->got = alloc::raw_alloc_with_stream(k->size, k->stream);
  return 0;
}

// Memory freed while its stream still has queued work is neither returned to the
// device nor handed to kernels allocating at execution time until that work ran.
void test_free_markers() {
  reset_all();
  auto side = torch_npu::getStreamFromPool(false, 0);
  c10::Stream ss = side.unwrap();

  // 1. empty_cache waits for queued work before aclrtFree'ing a freed block's segment.
  Gate gate;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate, "gate"));
  void* x = alloc::raw_alloc_with_stream(8 * kMiB, ss);
  F(x);  // the side stream is busy: x may still be used by queued work
  std::atomic<bool> emptied{false};
  std::thread t([&] {
    alloc::emptyCache();
    emptied = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!emptied.load());
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(20 * kMiB));
  gate.open = true;
  t.join();
  CHECK(emptied.load());
  CHECK_EQ(stats().reserved_bytes[AGG].current, 0);

  // 2. A kernel allocating at execution time does not get a block freed (on the host)
  //    after the kernel was queued; a host allocation does (stream order).
  Gate gate2;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate2, "gate2"));
  void* y = alloc::raw_alloc_with_stream(4096, ss);
  KernelAlloc k{ss, 4096};
  NPU_CHECK(aclsimLaunchKernel(side.stream(), kernel_alloc, &k, "kernel_alloc"));
  F(y);  // queued after kernel_alloc: kernel_alloc runs "before" this free
  gate2.open = true;
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  CHECK(k.got != nullptr);
  CHECK(k.got != y);
  F(k.got);
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));

  // 2b. Splitting a block with a pending marker: the remainder keeps the marker.
  alloc::emptyCache();
  Gate gate4;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate4, "gate4"));
  KernelAlloc k4{ss, 4096};
  NPU_CHECK(aclsimLaunchKernel(side.stream(), kernel_alloc, &k4, "kernel_alloc"));
  char* w = static_cast<char*>(alloc::raw_alloc_with_stream(8192, ss));
  F(w);  // the whole 2 MiB segment is free again, with a marker behind kernel_alloc
  char* w2 = static_cast<char*>(alloc::raw_alloc_with_stream(512, ss));
  CHECK(w2 == w);
  gate4.open = true;
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  CHECK(k4.got != nullptr);
  CHECK(static_cast<char*>(k4.got) != w + 512);  // not the split-off remainder
  CHECK_EQ(stats().segment[SMALL].current, 2);
  F(w2);
  F(k4.got);
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));

  Gate gate3;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate3, "gate3"));
  void* z = alloc::raw_alloc_with_stream(4096, ss);
  F(z);
  void* z2 = alloc::raw_alloc_with_stream(4096, ss);
  CHECK(z2 == z);  // host-side reuse is immediate, as with CUDA
  F(z2);
  gate3.open = true;
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  // Once the stream ran past the free, kernels may reuse the block too.
  KernelAlloc k2{ss, 4096};
  NPU_CHECK(aclsimLaunchKernel(side.stream(), kernel_alloc, &k2, "kernel_alloc"));
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  CHECK(k2.got == z);
  F(k2.got);
  alloc::emptyCache();
  CHECK_EQ(stats().reserved_bytes[AGG].current, 0);
}

void test_max_split_size() {
  reset_all();
  alloc::setAllocatorSettings("max_split_size_mb:40");
  CHECK_EQ(stats().max_split_size, static_cast<int64_t>(40 * kMiB));
  char* big = A(70 * kMiB - kPad);
  auto s = stats();
  CHECK_EQ(s.oversize_allocations.current, 1);
  CHECK_EQ(s.oversize_segments.current, 1);
  F(big);
  CHECK_EQ(stats().oversize_allocations.current, 0);
  CHECK_EQ(stats().oversize_segments.current, 1);
  // A request below max_split_size never takes an oversize block.
  char* mid = A(30 * kMiB);
  CHECK(mid != big);
  CHECK_EQ(stats().segment[LARGE].current, 2);
  F(mid);
  // An oversize request does not take a block 20 MiB or more larger than itself...
  char* big3 = A(45 * kMiB);  // 70 >= 45 + 20: new 46 MiB segment
  CHECK(big3 != big);
  CHECK_EQ(stats().segment[LARGE].current, 3);
  F(big3);
  // ...but reuses a closer oversize block whole, without splitting it.
  char* big2 = A(55 * kMiB - kPad);
  CHECK(big2 == big);
  s = stats();
  CHECK_EQ(s.allocated_bytes[LARGE].current, static_cast<int64_t>(70 * kMiB));
  CHECK_EQ(s.requested_bytes[LARGE].current, static_cast<int64_t>(55 * kMiB - kPad));
  CHECK_EQ(s.inactive_split[LARGE].current, 0);
  CHECK_EQ(s.oversize_allocations.current, 1);
  CHECK_EQ(s.oversize_segments.current, 2);
  F(big2);
  // Under memory pressure, cached oversize blocks are released one by one.
  alloc::emptyCache();
  alloc::resetAccumulatedStats(0);
  std::vector<char*> blocks;
  for (int i = 0; i < 7; ++i) blocks.push_back(A(512 * kMiB));  // 3.5 GiB
  for (char* b : blocks) F(b);
  char* huge = A(1536 * kMiB);  // needs 3 of them released
  CHECK(huge != nullptr);
  s = stats();
  CHECK_EQ(s.num_alloc_retries, 0);  // satisfied without flushing the whole cache
  CHECK_EQ(s.num_device_free, 3);
  F(huge);
  alloc::emptyCache();
  alloc::setAllocatorSettings("");
  CHECK_EQ(stats().max_split_size, -1);
}

void test_roundup_power2() {
  reset_all();
  alloc::setAllocatorSettings("roundup_power2_divisions:4");
  char* a = A(1200 * kKiB);  // between 1 MiB and 2 MiB in steps of 256 KiB
  CHECK_EQ(stats().allocated_bytes[AGG].current, static_cast<int64_t>(1280 * kKiB));
  F(a);
  char* b = A(4 * kMiB - kPad);  // a power of two stays as is
  CHECK_EQ(stats().allocated_bytes[AGG].current, static_cast<int64_t>(4 * kMiB));
  F(b);
  // Per power-of-two interval (interval i: [2^i, 2^(i+1)) MiB): [1:1,4:2,>:8] gives 1 to
  // the 1 MiB interval and below, 2 to [4, 8) MiB, 8 from 8 MiB; [2, 4) MiB keeps 0.
  alloc::setAllocatorSettings("roundup_power2_divisions:[1:1,4:2,>:8]");
  char* c = A(3 * kMiB + 1);  // [2, 4) MiB: 512-byte rounding
  CHECK_EQ(stats().allocated_bytes[AGG].current, static_cast<int64_t>(3 * kMiB + 512));
  F(c);
  char* d = A(5 * kMiB);  // [4, 8) MiB in 2 steps -> 6 MiB
  CHECK_EQ(stats().allocated_bytes[AGG].current, static_cast<int64_t>(6 * kMiB));
  F(d);
  char* e = A(9 * kMiB);  // [8, 16) MiB in 8 steps -> 10 MiB
  CHECK_EQ(stats().allocated_bytes[AGG].current, static_cast<int64_t>(10 * kMiB));
  F(e);
  alloc::setAllocatorSettings("");
  char* f = A(1200 * kKiB);
  CHECK_EQ(stats().allocated_bytes[AGG].current, static_cast<int64_t>(1200 * kKiB + 512));
  F(f);
  alloc::emptyCache();
}

void test_garbage_collection() {
  reset_all();
  alloc::setAllocatorSettings("garbage_collection_threshold:0.5");
  alloc::setMemoryFraction(0.5, 0);  // 2 GiB allowed; gc above 1 GiB reserved
  auto other = torch_npu::getStreamFromPool(false, 0);
  std::vector<char*> v;
  for (int i = 0; i < 3; ++i) v.push_back(A(500 * kMiB - kPad));
  for (char* p : v) F(p);
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(1500 * kMiB));
  // No cached block fits this stream: gc runs first and frees old cached blocks.
  void* p = alloc::raw_alloc_with_stream(100 * kMiB, npu_stream(other));
  auto s = stats();
  CHECK(s.num_device_free >= 1);
  CHECK(s.reserved_bytes[AGG].current <= static_cast<int64_t>(1024 * kMiB + 100 * kMiB));
  CHECK_EQ(s.num_alloc_retries, 0);
  F(p);
  alloc::setAllocatorSettings("");
  alloc::setMemoryFraction(1.0, 0);
  alloc::emptyCache();
}

void test_bad_conf() {
  using c10::Error;
  alloc::setAllocatorSettings("max_split_size_mb:64");
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("foo:1"); }, "'foo'"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("foo:1"); }, "max_split_size_mb"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("max_split_size_mb:abc"); },
                           "max_split_size_mb"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("max_split_size_mb:10"); },
                           "CachingAllocator option max_split_size_mb too small, must be >= 20"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("large_segment_size_mb:10"); },
                           "CachingAllocator option large_segment_size_mb must be > 10 MB"));
  CHECK(throws_with<Error>(
      [] { alloc::setAllocatorSettings("large_segment_size_mb:40,max_non_split_rounding_mb:30"); },
      "CachingAllocator option max_non_split_rounding_mb too small, must be >= 40"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("segment_size_mb:600"); },
                           "CachingAllocator option segment_size_mb error, must be [20, 512], dtype is int"));
  CHECK(throws_with<Error>(
      [] { alloc::setAllocatorSettings("garbage_collection_threshold:1.5"); },
      "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("expandable_segments:maybe"); },
                           "True or False"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("roundup_power2_divisions:3"); },
                           "power of 2"));
  CHECK(throws_with<Error>(
      [] { alloc::setAllocatorSettings("roundup_power2_divisions:[3:1]"); },
      "For roundups, the intervals have to be power of 2"));
  CHECK(throws_with<Error>([] { alloc::setAllocatorSettings("max_split_size_mb"); },
                           "key:value"));
  // A rejected setting leaves the previous configuration in place.
  CHECK_EQ(stats().max_split_size, static_cast<int64_t>(64 * kMiB));
  // Accepted forms.
  alloc::setAllocatorSettings(
      " max_split_size_mb:128 , garbage_collection_threshold:0.6,"
      "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:False,"
      "base_addr_aligned_kb:16");
  CHECK_EQ(stats().max_split_size, static_cast<int64_t>(128 * kMiB));
  alloc::setAllocatorSettings("expandable_segments:True");
  char* p = A(1000);
  CHECK(p != nullptr);
  F(p);
  alloc::setAllocatorSettings("");
}

int worker_alloc_kernel(void* ud, char* err, size_t errlen) {
  // A kernel on a worker thread allocating its output/workspace on its own stream.
  auto* s = static_cast<c10::Stream*>(ud);
  try {
    for (int i = 0; i < 50; ++i) {
      void* p = alloc::raw_alloc_with_stream(64 * kKiB + i, *s);
      std::memset(p, 1, 64 * kKiB);
      alloc::raw_delete(p);
    }
    alloc::emptyCache();  // must not wait on its own stream
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return 1;
  }
  return 0;
}

void test_threads() {
  reset_all();
  constexpr int kThreads = 4;
  std::vector<std::thread> ts;
  std::atomic<int> errors{0};
  // Blocks allocated on one thread and freed on another.
  std::vector<std::vector<void*>> handoff(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([t, &errors, &handoff] {
      try {
        std::vector<void*> mine;
        for (int i = 0; i < 400; ++i) {
          size_t n = (i % 7 == 0) ? (3 * kMiB + i * 512) : (1 + (i * 977) % 200000);
          void* p = alloc::raw_alloc(n);
          std::memset(p, t, std::min<size_t>(n, 4096));
          if (i % 3 == 0) {
            mine.push_back(p);
          } else {
            alloc::raw_delete(p);
          }
          if (i % 100 == 0) alloc::emptyCache();
        }
        handoff[t] = std::move(mine);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread error: %s\n", e.what());
        ++errors;
      }
    });
  }
  for (auto& th : ts) th.join();
  ts.clear();
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([t, &handoff] {
      for (void* p : handoff[(t + 1) % kThreads]) alloc::raw_delete(p);
    });
  }
  // Meanwhile, kernels on stream workers allocate too.
  auto w1 = torch_npu::getStreamFromPool(false, 0);
  auto w2 = torch_npu::getStreamFromPool(true, 0);
  c10::Stream s1 = w1.unwrap(), s2 = w2.unwrap();
  NPU_CHECK(aclsimLaunchKernel(w1.stream(), worker_alloc_kernel, &s1, "worker_alloc"));
  NPU_CHECK(aclsimLaunchKernel(w2.stream(), worker_alloc_kernel, &s2, "worker_alloc"));
  for (auto& th : ts) th.join();
  CHECK_EQ(aclrtSynchronizeStream(w1.stream()), ACL_SUCCESS);
  CHECK_EQ(aclrtSynchronizeStream(w2.stream()), ACL_SUCCESS);
  CHECK_EQ(errors.load(), 0);
  auto s = stats();
  CHECK_EQ(s.allocation[AGG].current, 0);
  CHECK_EQ(s.allocated_bytes[AGG].current, 0);
  CHECK_EQ(s.active[AGG].current, 0);
  CHECK_EQ(s.inactive_split[AGG].current, 0);
  CHECK_EQ(s.requested_bytes[AGG].current, 0);
  alloc::emptyCache();
  CHECK_EQ(stats().reserved_bytes[AGG].current, 0);
}

// ---- expandable segments -----------------------------------------------------------

// Device 0's snapshot agrees with its stats: reserved = mapped bytes, one segment per
// mapped run, inactive split blocks = free blocks sharing a segment.
void check_snapshot_matches_stats() {
  size_t total = 0, allocated = 0, segments = 0, split = 0, split_bytes = 0;
  for (const auto& seg : alloc::snapshot()) {
    if (seg.device != 0) continue;
    ++segments;
    total += seg.total_size;
    allocated += seg.allocated_size;
    for (const auto& b : seg.blocks) {
      if (!b.allocated && !b.active && seg.blocks.size() > 1) {
        ++split;
        split_bytes += b.size;
      }
    }
  }
  auto s = stats();
  CHECK_EQ(total, static_cast<size_t>(s.reserved_bytes[AGG].current));
  CHECK_EQ(allocated, static_cast<size_t>(s.allocated_bytes[AGG].current));
  CHECK_EQ(segments, static_cast<size_t>(s.segment[AGG].current));
  CHECK_EQ(split, static_cast<size_t>(s.inactive_split[AGG].current));
  CHECK_EQ(split_bytes, static_cast<size_t>(s.inactive_split_bytes[AGG].current));
}

size_t expandable_segments_on_device0() {
  size_t n = 0;
  for (const auto& seg : alloc::snapshot()) n += seg.device == 0 && seg.is_expandable;
  return n;
}

void test_expandable_growth_and_reuse() {
  reset_all();
  const size_t free0 = alloc::memGetInfo(0).first;
  alloc::setAllocatorSettings("expandable_segments:True");
  // Large pool: 20 MiB pages (torch_npu's large segment size) are mapped as needed, not a
  // segment per request.
  char* a = A(40 * kMiB - kPad);
  auto s = stats();
  CHECK_EQ(s.reserved_bytes[LARGE].current, static_cast<int64_t>(40 * kMiB));
  CHECK_EQ(s.segment[LARGE].current, 1);
  CHECK_EQ(s.num_device_alloc, 1);
  CHECK_EQ(alloc::memGetInfo(0).first, free0 - 40 * kMiB);
  CHECK_EQ(aclsimPointerDevice(a + 40 * kMiB - 1), 0);
  CHECK_EQ(aclsimPointerDevice(a + 40 * kMiB), -1);  // reserved, not mapped
  // The segment grows in place.
  char* b = A(60 * kMiB + 1);  // 60 MiB + 512 bytes: 4 more pages
  CHECK(b == a + 40 * kMiB);
  s = stats();
  CHECK_EQ(s.reserved_bytes[LARGE].current, static_cast<int64_t>(120 * kMiB));
  CHECK_EQ(s.segment[LARGE].current, 1);
  CHECK_EQ(s.num_device_alloc, 2);
  CHECK_EQ(s.inactive_split[LARGE].current, 1);  // the rest of the last page
  CHECK_EQ(s.inactive_split_bytes[LARGE].current, static_cast<int64_t>(20 * kMiB - 512));
  std::memset(a, 1, 100 * kMiB + 1);  // one contiguous range of device memory
  char* c = A(15 * kMiB);  // fits the rest: nothing mapped
  CHECK(c == b + 60 * kMiB + 512);
  CHECK_EQ(stats().num_device_alloc, 2);
  size_t segs = 0;
  for (const auto& seg : alloc::snapshot()) {
    if (seg.device != 0) continue;
    ++segs;
    CHECK(seg.is_expandable);
    CHECK(seg.is_large);
    CHECK_EQ(seg.address, reinterpret_cast<size_t>(a));
    CHECK_EQ(seg.total_size, 120 * kMiB);
    CHECK_EQ(seg.blocks.size(), 4u);
    CHECK(seg.blocks[2].allocated && !seg.blocks[3].allocated);
  }
  CHECK_EQ(segs, 1u);
  check_snapshot_matches_stats();
  // Reuse: a freed block is handed out again, blocks merge when freed.
  F(b);
  char* d = A(50 * kMiB);
  CHECK(d == b);
  for (char* x : {d, a, c}) F(x);
  s = stats();
  CHECK_EQ(s.allocated_bytes[AGG].current, 0);
  CHECK_EQ(s.inactive_split[AGG].current, 0);  // one free block, alone in its segment
  CHECK_EQ(s.reserved_bytes[LARGE].current, static_cast<int64_t>(120 * kMiB));  // cached
  char* e = A(120 * kMiB - kPad);
  CHECK(e == a);
  CHECK_EQ(stats().num_device_alloc, 2);
  F(e);
  check_snapshot_matches_stats();

  // Small pool: 2 MiB pages; a block may straddle two pages.
  char* x = A(1000);
  CHECK_EQ(stats().reserved_bytes[SMALL].current, static_cast<int64_t>(2 * kMiB));
  char* y = A(1 * kMiB - kPad);
  CHECK(y == x + 1536);
  char* z = A(1 * kMiB - kPad);
  CHECK(z == y + 1 * kMiB);
  s = stats();
  CHECK_EQ(s.reserved_bytes[SMALL].current, static_cast<int64_t>(4 * kMiB));
  CHECK_EQ(s.segment[SMALL].current, 1);
  CHECK_EQ(expandable_segments_on_device0(), 2u);
  check_snapshot_matches_stats();
  for (char* p : {x, y, z}) F(p);

  alloc::emptyCache();
  s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, 0);
  CHECK_EQ(s.segment[AGG].current, 0);
  CHECK_EQ(expandable_segments_on_device0(), 0u);
  CHECK_EQ(alloc::memGetInfo(0).first, free0);
  CHECK_EQ(aclsimPointerDevice(a), -1);

  // large_segment_size_mb sets the large pool's page.
  alloc::setAllocatorSettings("expandable_segments:True,large_segment_size_mb:32");
  char* f = A(5 * kMiB);
  CHECK_EQ(stats().reserved_bytes[LARGE].current, static_cast<int64_t>(32 * kMiB));
  F(f);
  alloc::emptyCache();
  alloc::setAllocatorSettings("large_segment_size_mb:20");
  alloc::setAllocatorSettings("");
}

// empty_cache unmaps the whole pages of free blocks, wherever they are; a later request
// maps memory again where its range needs it.
void test_expandable_empty_cache() {
  reset_all();
  const size_t free0 = alloc::memGetInfo(0).first;
  alloc::setAllocatorSettings("expandable_segments:True");
  char* p = A(30 * kMiB - kPad);
  char* q = A(30 * kMiB - kPad);  // maps one more page, merged with the free 10 MiB after p
  CHECK(q == p + 30 * kMiB);
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(60 * kMiB));
  F(p);
  alloc::emptyCache();  // p's first page goes; its second page is shared with q
  auto s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(40 * kMiB));
  CHECK_EQ(s.segment[AGG].current, 1);
  CHECK_EQ(alloc::memGetInfo(0).first, free0 - 40 * kMiB);
  CHECK_EQ(aclsimPointerDevice(p), -1);
  CHECK_EQ(aclsimPointerDevice(p + 20 * kMiB), 0);
  for (const auto& seg : alloc::snapshot()) {
    if (seg.device != 0) continue;
    CHECK_EQ(seg.address, reinterpret_cast<size_t>(p + 20 * kMiB));
    CHECK_EQ(seg.total_size, 40 * kMiB);
    CHECK_EQ(seg.blocks.size(), 2u);
    CHECK(!seg.blocks[0].allocated && seg.blocks[1].allocated);
  }
  check_snapshot_matches_stats();
  char* r = A(40 * kMiB - kPad);  // the hole before q is too small: mapped after q
  CHECK(r == p + 60 * kMiB);
  F(q);
  // The hole is mapped again and joins the free block after it (q's, merged).
  char* t = A(50 * kMiB - kPad);
  CHECK(t == p);
  s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(100 * kMiB));
  CHECK_EQ(s.segment[AGG].current, 1);
  check_snapshot_matches_stats();
  // A free block between two allocated ones: its whole pages go, the segment (the
  // mapped run) splits in two.
  char* w = A(40 * kMiB - kPad);
  CHECK(w == p + 100 * kMiB);
  F(r);  // merged with the free 10 MiB after t: [p + 50 MiB, p + 100 MiB)
  alloc::emptyCache();
  s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(100 * kMiB));
  CHECK_EQ(s.segment[AGG].current, 2);
  CHECK_EQ(aclsimPointerDevice(p + 50 * kMiB), 0);  // shares a page with t
  CHECK_EQ(aclsimPointerDevice(p + 60 * kMiB), -1);
  check_snapshot_matches_stats();
  F(t);
  F(w);
  alloc::emptyCache();
  s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, 0);
  CHECK_EQ(s.segment[AGG].current, 0);
  CHECK_EQ(s.inactive_split_bytes[AGG].current, 0);
  CHECK_EQ(alloc::memGetInfo(0).first, free0);
  alloc::setAllocatorSettings("");
}

// Free memory between allocated blocks is unmapped and mapped again where a large
// request needs it; fixed segments leave it stranded.
void test_expandable_fragmentation() {
  auto run = [](bool expandable) {
    reset_all();
    alloc::setAllocatorSettings(expandable ? "expandable_segments:True" : "");
    std::vector<char*> v;
    for (int i = 0; i < 15; ++i) v.push_back(A(240 * kMiB - kPad));  // 3.5 of the 4 GiB
    for (int i = 0; i < 15; i += 2) F(v[i]);  // 1.875 GiB free, in 240 MiB pieces
    bool ok = true;
    try {
      char* big = A(1500 * kMiB - kPad);
      big[0] = big[1500 * kMiB - 1] = 7;  // one range of device memory
      auto s = stats();
      CHECK_EQ(s.reserved_bytes[AGG].current, static_cast<int64_t>(7 * 240 * kMiB + 1500 * kMiB));
      CHECK_EQ(s.num_alloc_retries, 1);
      CHECK_EQ(alloc::memGetInfo(0).first,
               4 * kGiB - static_cast<size_t>(s.reserved_bytes[AGG].current));
      check_snapshot_matches_stats();
      F(big);
    } catch (const c10::OutOfMemoryError&) {
      ok = false;
    }
    for (int i = 1; i < 15; i += 2) F(v[i]);
    alloc::emptyCache();
    CHECK_EQ(stats().reserved_bytes[AGG].current, 0);
    return ok;
  };
  CHECK(!run(false));
  CHECK(run(true));
  alloc::setAllocatorSettings("");
}

void test_expandable_memory_fraction() {
  reset_all();
  alloc::setAllocatorSettings("expandable_segments:True");
  alloc::setMemoryFraction(0.25, 0);  // 1 GiB allowed: counts mapped bytes
  char* a = A(900 * kMiB - kPad);
  std::string msg;
  CHECK(throws_with<c10::OutOfMemoryError>([] { A(200 * kMiB); }, "1024.00 MiB allowed", &msg));
  char* b = A(100 * kMiB - kPad);
  CHECK(b == a + 900 * kMiB);
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(1000 * kMiB));
  F(a);
  F(b);
  alloc::setMemoryFraction(1.0, 0);
  alloc::emptyCache();
  alloc::setAllocatorSettings("");
}

// Memory freed while its stream has queued work is not unmapped, nor merged into a
// kernel's allocation, before that work ran.
void test_expandable_free_markers() {
  reset_all();
  alloc::setAllocatorSettings("expandable_segments:True");
  auto side = torch_npu::getStreamFromPool(false, 0);
  c10::Stream ss = side.unwrap();
  Gate gate;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate, "gate"));
  void* x = alloc::raw_alloc_with_stream(8 * kMiB, ss);
  F(x);
  std::atomic<bool> emptied{false};
  std::thread t([&] {
    alloc::emptyCache();
    emptied = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!emptied.load());
  CHECK_EQ(stats().reserved_bytes[AGG].current, static_cast<int64_t>(20 * kMiB));  // one page
  gate.open = true;
  t.join();
  CHECK_EQ(stats().reserved_bytes[AGG].current, 0);

  Gate gate2;
  NPU_CHECK(aclsimLaunchKernel(side.stream(), gate_kernel, &gate2, "gate2"));
  char* y = static_cast<char*>(alloc::raw_alloc_with_stream(4 * kMiB, ss));
  KernelAlloc k{ss, 6 * kMiB};
  NPU_CHECK(aclsimLaunchKernel(side.stream(), kernel_alloc, &k, "kernel_alloc"));
  F(y);  // after kernel_alloc in stream order
  gate2.open = true;
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  auto* got = static_cast<char*>(k.got);
  CHECK(got != nullptr);
  CHECK(got >= y + 4 * kMiB || got + 6 * kMiB <= y);  // y's range was not merged in
  F(k.got);
  NPU_CHECK(aclrtSynchronizeStream(side.stream()));
  alloc::emptyCache();
  CHECK_EQ(stats().reserved_bytes[AGG].current, 0);
  alloc::setAllocatorSettings("");
}

// Random allocations, frees and cache releases on two streams: blocks never overlap,
// and the stats agree with the snapshot and the device.
void test_expandable_random() {
  reset_all();
  alloc::setAllocatorSettings("expandable_segments:True");
  const c10::Stream streams[] = {torch_npu::getDefaultNPUStream(0).unwrap(),
                                 torch_npu::getStreamFromPool(false, 0).unwrap()};
  std::mt19937_64 rng(12345);
  struct Live {
    uint64_t* p;
    size_t words;
    uint64_t tag;
  };
  std::vector<Live> live;
  int ooms = 0, corrupt = 0;
  auto check_tags = [&](const Live& l) {
    corrupt += l.p[0] != l.tag || l.p[l.words - 1] != l.tag;
  };
  for (int i = 0; i < 3000; ++i) {
    const auto op = rng() % 16;
    if ((op < 8 && live.size() < 64) || live.empty()) {
      const auto kind = rng() % 8;
      size_t n = kind < 4 ? 8 + rng() % kMiB : kind < 7 ? 8 + rng() % (24 * kMiB)
                                                         : 64 * kMiB + rng() % (768 * kMiB);
      n &= ~size_t{7};
      try {
        auto* p = static_cast<uint64_t*>(alloc::raw_alloc_with_stream(n, streams[rng() % 2]));
        Live l{p, n / 8, rng()};
        p[0] = p[l.words - 1] = l.tag;
        live.push_back(l);
      } catch (const c10::OutOfMemoryError&) {
        ++ooms;
      }
    } else if (op < 15) {
      const size_t k = rng() % live.size();
      check_tags(live[k]);
      F(live[k].p);
      live[k] = live.back();
      live.pop_back();
    } else {
      alloc::emptyCache();
    }
    if (i % 100 == 0) {
      for (const Live& l : live) check_tags(l);
      check_snapshot_matches_stats();
      CHECK_EQ(alloc::memGetInfo(0).first,
               4 * kGiB - static_cast<size_t>(stats().reserved_bytes[AGG].current));
    }
  }
  CHECK_EQ(corrupt, 0);
  std::printf("  expandable_random: %d OOMs\n", ooms);
  for (const Live& l : live) F(l.p);
  alloc::emptyCache();
  auto s = stats();
  CHECK_EQ(s.reserved_bytes[AGG].current, 0);
  CHECK_EQ(s.segment[AGG].current, 0);
  CHECK_EQ(s.inactive_split[AGG].current, 0);
  CHECK_EQ(expandable_segments_on_device0(), 0u);
  alloc::setAllocatorSettings("");
}

void test_expandable_threads() {
  alloc::setAllocatorSettings("expandable_segments:True");
  test_threads();
  alloc::setAllocatorSettings("");
}

void test_invalid() {
  CHECK(throws_with<c10::Error>([] { alloc::getDeviceStats(7); }, "device"));
  int x = 0;
  CHECK(throws_with<c10::Error>([&] { alloc::raw_delete(&x); }, "invalid device pointer"));
}

}  // namespace

int main() {
  setenv("ASCEND_SIM_HBM_BYTES", "4G", 1);
  setenv("ASCEND_SIM_DEVICE_COUNT", "2", 1);
  setenv("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:1000", 1);

  const std::pair<const char*, void (*)()> tests[] = {
      {"env_conf_and_registration", test_env_conf_and_registration},
      {"zero_and_dataptr", test_zero_and_dataptr},
      {"reuse_and_pools", test_reuse_and_pools},
      {"split_and_coalesce", test_split_and_coalesce},
      {"stats_peak_reset", test_stats_peak_reset},
      {"empty_cache_and_mem_info", test_empty_cache_and_mem_info},
      {"oom_and_recovery", test_oom_and_recovery},
      {"memory_fraction", test_memory_fraction},
      {"record_stream", test_record_stream},
      {"free_markers", test_free_markers},
      {"max_split_size", test_max_split_size},
      {"roundup_power2", test_roundup_power2},
      {"garbage_collection", test_garbage_collection},
      {"bad_conf", test_bad_conf},
      {"threads", test_threads},
      {"expandable_growth_and_reuse", test_expandable_growth_and_reuse},
      {"expandable_empty_cache", test_expandable_empty_cache},
      {"expandable_fragmentation", test_expandable_fragmentation},
      {"expandable_memory_fraction", test_expandable_memory_fraction},
      {"expandable_free_markers", test_expandable_free_markers},
      {"expandable_random", test_expandable_random},
      {"expandable_threads", test_expandable_threads},
      {"invalid", test_invalid},
  };
  for (const auto& [name, fn] : tests) {
    const int failed_before = g_failed.load();
    try {
      fn();
    } catch (const std::exception& e) {
      ++g_failed;
      std::fprintf(stderr, "%s: unexpected exception: %s\n", name, e.what());
    }
    std::printf("%-28s %s\n", name, g_failed == failed_before ? "ok" : "FAILED");
  }
  return Finish();
}
