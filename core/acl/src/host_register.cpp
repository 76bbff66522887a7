// Host memory mapped into a device: aclrtHostRegister / aclrtHostUnregister.
//
// Device memory is host memory here, so mapping host memory into a device is only a
// matter of bookkeeping: a registered range keeps its address as its device address and
// is entered in a registry that FindDevice consults, so copies, memsets and kernels accept
// it as memory of the device it was registered to. Nothing is allocated on the device.
#include <atomic>
#include <cinttypes>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "internal.h"

using namespace aclsim;

namespace {

struct Registration {
  size_t size;
  int device;
};

struct Registry {
  std::shared_mutex mu;
  std::map<uintptr_t, Registration> ranges;  // by start address
  std::atomic<int> count{0};
};

Registry& Reg() {
  static Registry* r = new Registry();  // never destroyed: used until process exit
  return *r;
}

}  // namespace

namespace aclsim {

int HostRegisteredDevice(const void* p, size_t len) {
  Registry& r = Reg();
  if (r.count.load(std::memory_order_acquire) == 0) return -1;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> lk(r.mu);
  auto it = r.ranges.upper_bound(a);
  if (it == r.ranges.begin()) return -1;
  --it;
  const size_t off = a - it->first;
  if (off >= it->second.size || len > it->second.size - off) return -1;
  return it->second.device;
}

}  // namespace aclsim

extern "C" {

aclError aclrtHostRegister(void* ptr, uint64_t size, aclrtHostRegisterType type, void** devPtr) {
  const char* api = "aclrtHostRegister";
  if (ptr == nullptr || devPtr == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %s is null", api, ptr == nullptr ? "ptr" : "devPtr");
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "%s: size 0 is invalid", api);
  if (type != ACL_HOST_REGISTER_MAPPED)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid type %d (expected ACL_HOST_REGISTER_MAPPED)", api,
                static_cast<int>(type));
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (size > UINTPTR_MAX - a) return Fail(ACL_ERROR_INVALID_PARAM, "%s: [%p, +%" PRIu64 ") wraps around", api, ptr, size);
  aclError err = ACL_SUCCESS;
  Device* dev = DeviceOrFail(CurrentDevice(), api, &err);
  if (dev == nullptr) return err;
  // Device memory (and reserved device address space) is not host memory.
  for (auto& d : RT().devices)
    if (d->arena.InMapping(ptr))
      return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is device memory, not host memory", api, ptr);
  if (VmmReserved(ptr) || IpcDevice(ptr, 0) >= 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is device memory, not host memory", api, ptr);
  Registry& r = Reg();
  std::unique_lock<std::shared_mutex> lk(r.mu);
  auto next = r.ranges.lower_bound(a);
  if (next != r.ranges.end() && next->first - a < size)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: [%p, +%" PRIu64 ") overlaps the registered range at %p", api, ptr,
                size, reinterpret_cast<void*>(next->first));
  if (next != r.ranges.begin()) {
    auto prev = std::prev(next);
    if (a - prev->first < prev->second.size)
      return Fail(ACL_ERROR_INVALID_PARAM, "%s: [%p, +%" PRIu64 ") overlaps the registered range at %p", api, ptr,
                  size, reinterpret_cast<void*>(prev->first));
  }
  r.ranges.emplace(a, Registration{static_cast<size_t>(size), dev->id});
  r.count.fetch_add(1, std::memory_order_release);
  *devPtr = ptr;
  return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void* ptr) {
  const char* api = "aclrtHostUnregister";
  if (ptr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: ptr is null", api);
  Registry& r = Reg();
  std::unique_lock<std::shared_mutex> lk(r.mu);
  auto it = r.ranges.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.ranges.end())
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %p is not the start of a range registered by aclrtHostRegister", api,
                ptr);
  r.ranges.erase(it);
  r.count.fetch_sub(1, std::memory_order_release);
  return ACL_SUCCESS;
}

}  // extern "C"
