// Memory history (torch.npu.memory._record_memory_history) and trace trackers
// (attachAllocatorTraceTracker): the process-wide settings every device's allocator reads.
// The per-device ring of trace entries and the snapshot are in snapshot.cpp.
#pragma once

#include <torch_npu/core/npu_caching_allocator.h>

#include <acl/acl_rt.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace torch_npu::NPUCachingAllocator::detail {


// attachAllocatorTraceTracker: callbacks that see every trace entry of every device, with
// or without the memory history; called under the device allocator's lock.
struct TraceTrackers {
  std::mutex mu;
  std::vector<AllocatorTraceTracker> callbacks;
  std::atomic<bool> any{false};
};
inline TraceTrackers& trace_trackers() {
  static auto* t = new TraceTrackers();
  return *t;
}
inline bool trace_tracked() { return trace_trackers().any.load(std::memory_order_acquire); }

// ---------------------------------------------------------------------------------
// Memory history settings (recordHistory), shared by the devices
// ---------------------------------------------------------------------------------

struct HistorySettings {
  std::atomic<bool> enabled{false};
  std::atomic<CreateContextFn> recorder{nullptr};
  std::atomic<int> when{static_cast<int>(RecordContext::NEVER)};
};

inline HistorySettings& history() {
  static auto* h = new HistorySettings();  // leaked on purpose (used until exit)
  return *h;
}

// The context (stack) of the calling thread if history records contexts at `level`.
// Never on stream workers: they run kernels, not user code.
inline std::shared_ptr<c10::GatheredContext> maybe_gather_context(RecordContext level) {
  HistorySettings& h = history();
  if (!h.enabled.load(std::memory_order_relaxed) ||
      h.when.load(std::memory_order_relaxed) < static_cast<int>(level)) {
    return nullptr;
  }
  CreateContextFn recorder = h.recorder.load(std::memory_order_acquire);
  if (recorder == nullptr || aclsimOnWorkerThread()) return nullptr;
  return recorder();
}

inline bool record_context_at(RecordContext level) {
  return history().when.load(std::memory_order_relaxed) >= static_cast<int>(level);
}

}  // namespace torch_npu::NPUCachingAllocator::detail
