// DeviceGuardImplInterface for npu: devices, streams and events for c10/ATen
// (torch.Stream, torch.Event, torch.accelerator, autograd's device switching).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "torch_npu/core/npu_stream.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/core/npu_trace.h"

namespace torch_npu {
namespace {

struct NPUGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kType);
    auto old = current_device();
    if (old != d.index()) set_device(d.index());
    return c10::Device(kType, old);
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kType);
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { aclrtSetDevice(d.index()); }

  c10::Stream getStream(c10::Device d) const override { return getCurrentNPUStream(d.index()).unwrap(); }
  c10::Stream getDefaultStream(c10::Device d) const override { return getDefaultNPUStream(d.index()).unwrap(); }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return getStreamFromPool(priority, d.index()).unwrap();
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    return getStreamFromPool(isHighPriority, d.index()).unwrap();
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    NPUStream stream(s);
    auto old = getCurrentNPUStream(s.device_index());
    setCurrentNPUStream(stream);
    return old.unwrap();
  }
  void* getStreamNativeHandle(const c10::Stream s) const override { return NPUStream(s).stream(); }

  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  }

  // ---- events ----
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == s.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(s.device_index()), ".");
    NPUStream stream(s);
    if (*event == nullptr) {
      // PYTORCH_DEFAULT = no timing (torch.Event(enable_timing=False)).
      uint32_t f = flag == c10::EventFlag::BACKEND_DEFAULT ? (ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE) : ACL_EVENT_SYNC;
      aclrtEvent e = nullptr;
      NPU_CHECK(aclrtCreateEventWithFlag(&e, f));
      *event = e;
      trace::emit(trace::Kind::EventCreation, e);
    }
    NPU_CHECK(aclrtRecordEvent(static_cast<aclrtEvent>(*event), stream.stream()));
    trace::emit(trace::Kind::EventRecord, *event, stream.stream());
  }
  void block(void* event, const c10::Stream& s) const override {
    if (!event) return;
    NPU_CHECK(aclrtStreamWaitEvent(NPUStream(s).stream(), static_cast<aclrtEvent>(event)));
    trace::emit(trace::Kind::EventWait, event, NPUStream(s).stream());
  }
  bool queryEvent(void* event) const override {
    if (!event) return true;
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    NPU_CHECK(aclrtQueryEventStatus(static_cast<aclrtEvent>(event), &st));
    return st == ACL_EVENT_RECORDED_STATUS_COMPLETE;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (!event) return;
    trace::emit(trace::Kind::EventDeletion, event);
    aclrtDestroyEvent(static_cast<aclrtEvent>(event));
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    NPU_CHECK(wait_event(static_cast<aclrtEvent>(event)));
    trace::emit(trace::Kind::EventSynchronization, event);
  }
  double elapsedTime(void* e1, void* e2, const c10::DeviceIndex) const override {
    TORCH_CHECK(e1 && e2, "Both events must be recorded before calculating elapsed time.");
    // As torch_npu's NPUEvent::elapsed_time: wait for both events (CUDA's requires them done).
    NPU_CHECK(wait_event(static_cast<aclrtEvent>(e1)));
    NPU_CHECK(wait_event(static_cast<aclrtEvent>(e2)));
    float ms = 0;
    NPU_CHECK(aclrtEventElapsedTime(&ms, static_cast<aclrtEvent>(e1), static_cast<aclrtEvent>(e2)));
    return ms;
  }

  // ---- synchronisation ----
  // An external stream is the program's to track, as in torch_npu (which refuses these).
  bool queryStream(const c10::Stream& s) const override {
    NPUStream stream(s);
    TORCH_CHECK(!stream.is_external(), "Cannot query external NPU stream status: the program that created it "
                "tracks its completion (record an event on it and query that)");
    return stream.query();
  }
  void synchronizeStream(const c10::Stream& s) const override {
    NPUStream stream(s);
    TORCH_CHECK(!stream.is_external(), "External NPU stream is not supported in NPUStream::synchronize: the "
                "program that created it synchronises it (record an event on it and synchronize that)");
    c10_npu::warn_or_error_on_sync();
    stream.synchronize();
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    synchronize_device(device_index < 0 ? current_device() : device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& s) const override;
};

}  // namespace
}  // namespace torch_npu

#include "torch_npu/core/npu_caching_allocator.h"

namespace torch_npu {
namespace {
void NPUGuardImpl::recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& s) const {
  NPUCachingAllocator::recordStream(data_ptr, s);
}
}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NPUGuardImpl);

}  // namespace torch_npu
