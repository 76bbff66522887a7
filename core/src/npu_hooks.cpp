// PrivateUse1 hooks: what ATen asks of a backend outside of kernels (availability,
// generators, pinned host memory, storage resize, device of a pointer).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_generator.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

namespace torch_npu {
namespace {

// Page-locked host memory (aclrtMallocHost). Pinned pointers are tracked so that
// Tensor.is_pinned() answers truthfully. Also npu's at::HostAllocator (what
// torch.accelerator.memory.empty_host_cache() and the host memory statistics reach); it
// caches nothing, so emptying the cache is a no-op and a block is never reused early.
struct PinnedAllocator final : public at::HostAllocator {
  std::mutex mu;
  std::unordered_map<void*, size_t> live;  // pointer -> bytes
  at::HostStats stats;

  static void deleter(void* ptr);

  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) {
      NPU_CHECK(aclrtMallocHost(&p, n));
      std::lock_guard<std::mutex> g(mu);
      live.emplace(p, n);
      for (auto* stat : {&stats.active_requests, &stats.allocations}) stat->increase(1);
      for (auto* stat : {&stats.active_bytes, &stats.allocated_bytes}) stat->increase(n);
      ++stats.num_host_alloc;
    }
    return {p, p, &PinnedAllocator::deleter, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::deleter; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
  bool is_pinned(const void* p) {
    std::lock_guard<std::mutex> g(mu);
    return live.count(const_cast<void*>(p)) > 0;
  }

  bool record_event(void* ptr, void*, c10::Stream) override { return is_pinned(ptr); }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> g(mu);
    return stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> g(mu);
    for (auto* stat : {&stats.active_requests, &stats.allocations, &stats.active_bytes, &stats.allocated_bytes}) {
      stat->reset_accumulated();
    }
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
  if (!ptr) return;
  {
    auto& a = pinned();
    std::lock_guard<std::mutex> g(a.mu);
    auto it = a.live.find(ptr);
    if (it != a.live.end()) {
      for (auto* stat : {&a.stats.active_requests, &a.stats.allocations}) stat->decrease(1);
      for (auto* stat : {&a.stats.active_bytes, &a.stats.allocated_bytes}) stat->decrease(it->second);
      ++a.stats.num_host_free;
      a.live.erase(it);
    }
  }
  aclrtFreeHost(ptr);
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
