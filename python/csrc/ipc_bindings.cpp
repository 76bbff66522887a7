// torch_npu._C bindings for sharing npu storages between processes (torch.multiprocessing),
// used by torch_npu/multiprocessing/reductions.py:
//   _npu_ipc_share(tensor)  -> (device, handle, offset): the producer names the caching
//                              allocator's allocation holding the tensor's storage;
//   _npu_ipc_open(device, handle, nbytes, offset, counter) -> uint8 npu tensor over the
//                              same memory in the consumer.
// The handle is the allocation's aclrtIpcMemGetExportKey key. A consumer maps each
// allocation once (cached per handle) and closes it when its last storage is gone. The
// producer keeps the storage alive while `counter` (an int64 in shared CPU memory, one per
// send) is above zero; the consumer's storage decrements it when freed, after the work
// queued on the device's stream is done.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "acl/acl_rt.h"
#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

namespace py = pybind11;

namespace torch_npu {

namespace {

std::tuple<int, py::bytes, int64_t> ipc_share(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().type() == c10::DeviceType::PrivateUse1, "_share_npu_: only available on NPU, got a ",
              tensor.device().type(), " storage");
  const c10::Storage& storage = tensor.storage();
  TORCH_CHECK(!storage.unsafeGetStorageImpl()->received_cuda(),
              "Supported to send NPU tensor received from another process; other is not currently supported. "
              "Consider cloning before sending.");
  void* ptr = storage.mutable_data();
  TORCH_CHECK(ptr != nullptr, "_share_npu_: the storage has no memory");
  const c10::DeviceIndex device = tensor.device().index();
  // The consumer reads the memory as soon as it has the handle: the producer's queued work
  // on it must be done (torch_npu records an IPC event instead; waiting is simpler).
  getCurrentNPUStream(device).synchronize();
  size_t base_size = 0;
  void* base = NPUCachingAllocator::getBaseAllocation(ptr, &base_size);
  TORCH_CHECK(base != nullptr,
              "_share_npu_: the storage's memory was not allocated by the NPU caching allocator "
              "(only its memory can be shared with other processes)");
  char key[ACL_IPC_HANDLE_SIZE] = {0};
  const c10::DeviceGuard guard(tensor.device());  // the caller's current device stays as it was
  aclError rc = aclrtIpcMemGetExportKey(base, base_size, key, sizeof(key),
                                        ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION);
  TORCH_CHECK(rc == ACL_SUCCESS, "_share_npu_: cannot share this storage (error ", rc, "): ", aclGetRecentErrMsg(),
              rc == ACL_ERROR_INVALID_PARAM ? " (memory of expandable segments cannot be shared)" : "");
  return {device, py::bytes(key), static_cast<char*>(ptr) - static_cast<char*>(base)};
}

// Imported allocations of this process, by handle (one mapping per allocation).
std::mutex g_imports_mu;
std::map<std::string, std::weak_ptr<void>> g_imports;

std::shared_ptr<void> import_allocation(int device, const std::string& handle) {
  std::lock_guard<std::mutex> lk(g_imports_mu);
  auto it = g_imports.find(handle);
  if (it != g_imports.end())
    if (auto alive = it->second.lock()) return alive;
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  void* ptr = nullptr;
  NPU_CHECK(aclrtIpcMemImportByKey(&ptr, handle.c_str(), ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS));
  std::shared_ptr<void> mapping(ptr, [handle](void*) {
    {
      std::lock_guard<std::mutex> lk(g_imports_mu);
      auto it = g_imports.find(handle);
      if (it != g_imports.end() && it->second.expired()) g_imports.erase(it);
    }
    aclrtIpcMemClose(handle.c_str());  // best effort at teardown
  });
  g_imports[handle] = mapping;
  return mapping;
}

struct Received {
  std::shared_ptr<void> mapping;
  at::Tensor counter;  // int64 in shared CPU memory, decremented when this storage goes
  int64_t counter_offset;
  c10::DeviceIndex device;
};

void check_counter(const at::Tensor& counter, int64_t offset, const char* api) {
  TORCH_CHECK(counter.device().is_cpu() && counter.scalar_type() == at::kLong && counter.is_contiguous() &&
                  offset >= 0 && offset < counter.numel(),
              api, ": the reference counter must be a contiguous cpu int64 tensor holding index ", offset);
}

void release_counter(const at::Tensor& counter, int64_t offset) {
  check_counter(counter, offset, "_release_ipc_counter_npu");
  __atomic_fetch_sub(counter.data_ptr<int64_t>() + offset, 1, __ATOMIC_ACQ_REL);
}

void release_received(void* ctx) {
  std::unique_ptr<Received> r(static_cast<Received*>(ctx));
  // Kernels queued before the storage died may still read it; a kernel dropping the last
  // reference itself runs on the worker, where everything queued before it is done.
  if (!in_kernel()) {
    try {
      getCurrentNPUStream(r->device).synchronize();
    } catch (const c10::Error&) {
      // the stream reported an earlier failure: nothing left to wait for
    }
  }
  r->mapping.reset();
  release_counter(r->counter, r->counter_offset);
}

at::Tensor ipc_open(int device, const std::string& handle, int64_t nbytes, int64_t offset, const at::Tensor& counter,
                    int64_t counter_offset) {
  TORCH_CHECK(nbytes > 0 && offset >= 0, "_new_shared_npu: invalid storage_size_bytes ", nbytes,
              " or storage_offset_bytes ", offset);
  check_counter(counter, counter_offset, "_new_shared_npu");
  auto received = std::make_unique<Received>();
  received->mapping = import_allocation(device, handle);
  received->counter = counter;
  received->counter_offset = counter_offset;
  received->device = static_cast<c10::DeviceIndex>(device);
  void* data = static_cast<char*>(received->mapping.get()) + offset;
  const c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  at::Tensor t = at::for_blob(data, {nbytes})
                     .context(received.release(), &release_received)
                     .target_device(where)
                     .options(at::TensorOptions().dtype(at::kByte).device(where))
                     .make_tensor();
  t.storage().unsafeGetStorageImpl()->set_received_cuda(true);  // c10's flag for memory from another process
  return t;
}

// torch.npu.Event(interprocess=True): an ACL_EVENT_IPC event, created on first record or
// ipc_handle() (on the device of the current stream then), or opened from another process's
// handle (from_ipc_handle).
class IpcEvent {
 public:
  IpcEvent() = default;
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;
  ~IpcEvent() {
    if (event_ != nullptr) aclrtDestroyEvent(event_);  // queued records/waits keep it until they ran
  }

  static std::unique_ptr<IpcEvent> open(int64_t device, const std::string& handle) {
    TORCH_CHECK(handle.size() == sizeof(aclrtIpcEventHandle), "aclrtIpcEventHandle expects byte-like object of size ",
                sizeof(aclrtIpcEventHandle), ", but got ", handle.size());
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
    aclrtIpcEventHandle h{};
    std::memcpy(&h, handle.data(), handle.size());
    auto e = std::make_unique<IpcEvent>();
    NPU_CHECK(aclrtIpcOpenEventHandle(h, &e->event_));
    e->device_ = static_cast<c10::DeviceIndex>(device);
    return e;
  }

  void record(int64_t stream_id, int64_t device) {
    NPUStream s = stream_of(stream_id, device);
    if (event_ == nullptr) create(s.device_index());
    TORCH_CHECK(device_ == s.device_index(), "Event device ", static_cast<int>(device_),
                " does not match recording stream's device ", static_cast<int>(s.device_index()), ".");
    NPU_CHECK(aclrtRecordEvent(event_, s.stream()));
  }
  void wait(int64_t stream_id, int64_t device) {
    if (event_ == nullptr) return;  // never recorded: nothing to wait for
    NPUStream s = stream_of(stream_id, device);
    NPU_CHECK(aclrtStreamWaitEvent(s.stream(), event_));
  }
  bool query() {
    if (event_ == nullptr) return true;
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    NPU_CHECK(aclrtQueryEventStatus(event_, &st));
    return st == ACL_EVENT_RECORDED_STATUS_COMPLETE;
  }
  void synchronize() {
    if (event_ == nullptr) return;
    NPU_CHECK(aclrtSynchronizeEvent(event_));
  }
  py::bytes ipc_handle() {
    if (event_ == nullptr) create(current_device());
    aclrtIpcEventHandle h{};
    NPU_CHECK(aclrtIpcGetEventHandle(event_, &h));
    return py::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  int device() const { return device_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(event_); }

 private:
  static NPUStream stream_of(int64_t stream_id, int64_t device) {
    NPUStream s(c10::Stream(c10::Stream::UNSAFE,
                            c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)), stream_id));
    s.stream();  // validates the id
    return s;
  }
  void create(c10::DeviceIndex device) {
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
    NPU_CHECK(aclrtCreateEventWithFlag(&event_, ACL_EVENT_IPC));
    device_ = device;
  }
  aclrtEvent event_ = nullptr;
  c10::DeviceIndex device_ = -1;
};

}  // namespace

void init_ipc_bindings(py::module& m) {
  py::class_<IpcEvent>(m, "_NPUIpcEvent")
      .def(py::init<>())
      .def_static("from_ipc_handle", &IpcEvent::open, py::arg("device"), py::arg("handle"))
      .def("record", &IpcEvent::record)
      .def("wait", &IpcEvent::wait)
      .def("query", &IpcEvent::query)
      .def("synchronize", &IpcEvent::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("ipc_handle", &IpcEvent::ipc_handle)
      .def_property_readonly("device", &IpcEvent::device)
      .def_property_readonly("npu_event", &IpcEvent::address);
  m.def("_npu_ipc_share", &ipc_share, py::arg("tensor"));
  m.def("_npu_ipc_open", &ipc_open, py::arg("device"), py::arg("handle"), py::arg("nbytes"), py::arg("offset"),
        py::arg("counter"), py::arg("counter_offset"));
  m.def("_npu_ipc_release_counter", &release_counter, py::arg("counter"), py::arg("counter_offset"));
}

}  // namespace torch_npu
