// PrivateUse1 hooks: what ATen asks of a backend outside of kernels (availability,
// generators, pinned host memory, storage resize, device of a pointer).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_generator.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/core/npu_trace.h"

namespace torch_npu {
namespace {

// Page-locked host memory (aclrtMallocHost), cached as CUDA's pinned-host allocator does:
// requests are rounded up to a power of two (up to pinned_max_round_threshold_mb), and a
// freed block of at most pinned_max_cached_size_mb is kept for the next request of its
// size. A block is freed when its storage dies, which a copy queued on a stream delays
// (the task holds the storage) until the copy has run: a cached block is never handed
// out while a copy still reads or writes it. Pinned pointers are tracked so that
// Tensor.is_pinned() answers truthfully. Also npu's at::HostAllocator (what
// torch.accelerator.memory.empty_host_cache() and torch.npu.host_memory_stats() reach).
struct PinnedAllocator final : public at::HostAllocator {
  std::mutex mu;
  std::unordered_map<void*, size_t> live;              // handed out: pointer -> block size
  std::unordered_map<size_t, std::vector<void*>> free;  // cached: block size -> pointers
  at::HostStats stats;

  static void deleter(void* ptr);

  static size_t block_size(size_t n) {
    const auto conf = NPUCachingAllocator::pinnedConfig();
    if (n > conf.max_round_threshold || n > conf.max_cached_size) return n;
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
  }

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &PinnedAllocator::deleter, c10::Device(c10::DeviceType::CPU)};
    const size_t size = block_size(n);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = free.find(size);
      if (it != free.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    const bool fresh = p == nullptr;
    std::chrono::microseconds alloc_time{0};
    if (fresh) {
      const auto start = std::chrono::steady_clock::now();
      NPU_CHECK(aclrtMallocHost(&p, size));
      alloc_time = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
    }
    std::unique_lock<std::mutex> g(mu);
    if (fresh) {
      stats.allocations.increase(1);
      stats.allocated_bytes.increase(size);
      stats.host_alloc_time.increase(alloc_time.count());
      ++stats.num_host_alloc;
    }
    live.emplace(p, size);
    stats.active_requests.increase(1);
    stats.active_bytes.increase(size);
    g.unlock();
    trace::emit(trace::Kind::HostAllocation, p);  // the sanitizer follows host reads and writes of pinned memory
    return {p, p, &PinnedAllocator::deleter, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::deleter; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
  bool is_pinned(const void* p) {
    std::lock_guard<std::mutex> g(mu);
    return live.count(const_cast<void*>(p)) > 0;
  }

  // Takes a block back from its storage's deleter: cached, or returned to the host.
  void release(void* ptr) {
    if (!is_pinned(ptr)) return;
    trace::emit(trace::Kind::HostDeallocation, ptr);  // outside the lock: the sink may take the GIL
    size_t size = 0;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = live.find(ptr);
      if (it == live.end()) return;
      size = it->second;
      live.erase(it);
      stats.active_requests.decrease(1);
      stats.active_bytes.decrease(size);
      if (size <= NPUCachingAllocator::pinnedConfig().max_cached_size) {
        free[size].push_back(ptr);
        return;
      }
    }
    free_to_host(ptr, size);
  }

  void free_to_host(void* ptr, size_t size) {
    const auto start = std::chrono::steady_clock::now();
    aclrtFreeHost(ptr);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
    std::lock_guard<std::mutex> g(mu);
    stats.allocations.decrease(1);
    stats.allocated_bytes.decrease(size);
    stats.host_free_time.increase(us.count());
    ++stats.num_host_free;
  }

  // Copies that use a pinned block hold its storage until they have run (see above).
  bool record_event(void* ptr, void*, c10::Stream) override { return is_pinned(ptr); }
  void empty_cache() override {
    std::unordered_map<size_t, std::vector<void*>> cached;
    {
      std::lock_guard<std::mutex> g(mu);
      cached.swap(free);
    }
    for (const auto& [size, ptrs] : cached) {
      for (void* p : ptrs) free_to_host(p, size);
    }
  }
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> g(mu);
    return stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> g(mu);
    for (auto* stat : {&stats.active_requests, &stats.allocations, &stats.active_bytes, &stats.allocated_bytes}) {
      stat->reset_accumulated();
    }
    stats.host_alloc_time = {};
    stats.host_free_time = {};
    stats.num_host_alloc = stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> g(mu);
    for (auto* stat : {&stats.active_requests, &stats.allocations, &stats.active_bytes, &stats.allocated_bytes}) {
      stat->reset_peak();
    }
  }
};

PinnedAllocator& pinned() {
  static PinnedAllocator* a = new PinnedAllocator();  // leaked: used at exit
  return *a;
}

void PinnedAllocator::deleter(void* ptr) {
  if (ptr) pinned().release(ptr);
}

struct NPUHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return getDefaultNPUGenerator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return createNPUGenerator(device); }

  at::Device getDeviceFromPtr(void* data) const override {
    int32_t d = aclsimPointerDevice(data);
    TORCH_CHECK(d >= 0, "pointer ", data, " is not NPU memory");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override { return pinned().is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned(); }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    if (d >= 0 && d != old) set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }

  // Storage.resize_ (e.g. untyped_storage().resize_(n)): new memory, old bytes kept.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    const auto device = impl->device().index();
    NPUStream stream = getCurrentNPUStream(device);
    wait_stream(stream);  // the old bytes must be final before we copy them
    c10::DataPtr fresh = NPUCachingAllocator::allocate(newsize, device);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

const bool registered = [] {
  at::RegisterPrivateUse1HooksInterface(new NPUHooks());
  at::setHostAllocator(c10::DeviceType::PrivateUse1, &pinned());
  return true;
}();

}  // namespace
}  // namespace torch_npu
