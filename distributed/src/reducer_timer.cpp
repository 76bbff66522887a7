// DDP's timer for npu devices: torch's Reducer asks c10d::TimerRegistry for one per device
// type to fill the avg_*_time fields of DistributedDataParallel's logging data
// (model._get_ddp_logging_data()); without it torch warns "Time stats are currently only
// collected for CPU and CUDA devices" on every DDP run. Like torch's CUDA timer: the host time
// of each event plus a timing event recorded on the current stream, differences from the
// device's clock.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace torch_npu {
namespace {

class NpuTimer : public c10d::Timer {
 public:
  explicit NpuTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    c10d::Timer::record(event);  // the host-side timestamp torch's logger also reads
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::PrivateUse1);
    event_of(event).record(impl.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& first = event_of(start);
    c10::Event& last = event_of(end);
    // Not recorded in this iteration (e.g. a backward without communication).
    if (!first.was_marked_for_recording() || !last.was_marked_for_recording()) return std::nullopt;
    first.synchronize();
    last.synchronize();
    double ms = first.elapsedTime(last);
    // Events of one iteration recorded out of order (torch's CUDA timer drops those too).
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Event& event_of(Event event) {
    return events_[static_cast<size_t>(event)];
  }

  c10::Device device_;
  // BACKEND_DEFAULT: timing events (ACL_EVENT_TIME_LINE).
  c10::Event events_[5] = {
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
  };
};

}  // namespace
}  // namespace torch_npu

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torch_npu::NpuTimer);
}  // namespace c10d
