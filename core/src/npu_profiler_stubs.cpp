// The npu's methods for torch's legacy profiler (torch::profiler::impl::ProfilerStubs of
// PrivateUse1), as torch_npu registers them: torch.autograd.profiler.profile(use_device="npu")
// records an npu event on the current stream when each operator starts and ends, and its
// device time is the time between the two events. Without them torch's profiler fails every
// operator with "PrivateUse1 used in profiler but not enabled" and reports garbage times.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

#include "torch_npu/core/npu_stream.h"

namespace torch_npu {
namespace {

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

const c10::impl::DeviceGuardImplInterface* npu_impl() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

struct NPUProfilerMethods : public ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const auto stream = getCurrentNPUStream();
    if (device) *device = stream.device_index();
    void* raw = nullptr;
    // BACKEND_DEFAULT: an event that records its time (torch.npu.Event(enable_timing=True)).
    npu_impl()->record(&raw, stream.unwrap(), stream.device_index(), c10::EventFlag::BACKEND_DEFAULT);
    const auto index = stream.device_index();
    *event = std::shared_ptr<void>(raw, [index](void* e) { npu_impl()->destroyEvent(e, index); });
    if (cpu_ns) *cpu_ns = c10::getTime();
  }

  // Microseconds from event1 to event2 (both waited for).
  float elapsed(const ProfilerVoidEventStub* event1, const ProfilerVoidEventStub* event2) const override {
    const double ms = npu_impl()->elapsedTime(event1->get(), event2->get(), current_device());
    return static_cast<float>(ms * 1000.0);
  }

  void onEachDevice(std::function<void(int)> op) const override {
    // As torch_npu: the current device only (the profiler records its events there).
    op(static_cast<int>(current_device()));
  }

  void synchronize() const override { npu_impl()->synchronizeDevice(current_device()); }

  bool enabled() const override { return true; }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
};

struct RegisterNPUProfilerMethods {
  RegisterNPUProfilerMethods() {
    static NPUProfilerMethods methods;
    torch::profiler::impl::registerPrivateUse1Methods(&methods);
  }
};
RegisterNPUProfilerMethods register_npu_profiler_methods;

}  // namespace
}  // namespace torch_npu
