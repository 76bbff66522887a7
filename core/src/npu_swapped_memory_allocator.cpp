// See npu_swapped_memory_allocator.h.
#include <torch_npu/core/npu_swapped_memory_allocator.h>

#include <torch_npu/core/npu_stream.h>
#include <torch_npu/core/npu_task_queue.h>

#include <acl/acl_rt.h>

#include <unistd.h>

#include <mutex>
#include <unordered_map>

namespace torch_npu::NPUSwappedMemoryAllocator {
namespace {

struct Registration {
  void* host;
  size_t size;
  c10::DeviceIndex device;
};

std::mutex& mu() {
  static std::mutex m;
  return m;
}

// Device address -> registration.
std::unordered_map<void*, Registration>& blocks() {
  static auto* b = new std::unordered_map<void*, Registration>();  // used until exit
  return *b;
}

size_t page_size() {
  static const size_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

void release(const Registration& reg) {
  NPU_CHECK(aclrtHostUnregister(reg.host));
  NPU_CHECK(aclrtFreeHost(reg.host));
}

void svm_deleter(void* ptr) {
  if (ptr == nullptr) return;
  Registration reg{};
  {
    std::lock_guard<std::mutex> g(mu());
    auto it = blocks().find(ptr);
    if (it == blocks().end()) return;
    reg = it->second;
  }
  // Queued work may still use the memory: wait for the device first (as torch_npu). A
  // kernel dropping the last reference cannot wait for its own device; the work it is part
  // of is what used the memory.
  if (!in_kernel()) synchronize_device(reg.device);
  std::lock_guard<std::mutex> g(mu());
  auto it = blocks().find(ptr);
  if (it == blocks().end()) return;
  blocks().erase(it);
  release(reg);
}

class SwappedMemoryAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device d(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) return {nullptr, nullptr, &svm_deleter, d};
    const size_t page = page_size();
    TORCH_CHECK(nbytes <= SIZE_MAX - page, "empty_with_swapped_memory: ", nbytes, " bytes is too large");
    const size_t size = (nbytes + page - 1) / page * page;
    void* host = nullptr;
    const aclError err = aclrtMallocHost(&host, size);
    TORCH_CHECK_WITH(OutOfMemoryError, err == ACL_SUCCESS, "empty_with_swapped_memory: cannot allocate ", size,
                     " bytes of host memory: ", aclGetRecentErrMsg());
    void* dev_ptr = nullptr;
    if (aclrtHostRegister(host, size, ACL_HOST_REGISTER_MAPPED, &dev_ptr) != ACL_SUCCESS) {
      const std::string msg = aclGetRecentErrMsg();
      (void)aclrtFreeHost(host);
      TORCH_CHECK(false, "AclrtHostRegister failed. ", msg);
    }
    {
      std::lock_guard<std::mutex> g(mu());
      blocks().emplace(dev_ptr, Registration{host, size, device});
    }
    return {dev_ptr, dev_ptr, &svm_deleter, d};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &svm_deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const final {
    NPU_CHECK(aclrtMemcpy(dest, count, src, count, ACL_MEMCPY_DEVICE_TO_DEVICE));
  }
};

SwappedMemoryAllocator& instance() {
  static SwappedMemoryAllocator a;
  return a;
}

}  // namespace

c10::Allocator* get() { return &instance(); }

}  // namespace torch_npu::NPUSwappedMemoryAllocator
