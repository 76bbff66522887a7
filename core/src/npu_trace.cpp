#include "torch_npu/core/npu_trace.h"

#include <acl/acl_rt.h>
#include "torch_npu/core/npu_task_queue.h"

namespace torch_npu {
namespace trace {
namespace detail {

std::atomic<Sink> g_sink{nullptr};

void emit(Sink sink, Kind kind, uintptr_t a, uintptr_t b) {
  if (in_kernel() || aclsimOnWorkerThread()) return;  // a kernel's own work, not the host's
  sink(kind, a, b);
}

}  // namespace detail

void set_sink(Sink sink) { detail::g_sink.store(sink, std::memory_order_relaxed); }

}  // namespace trace
}  // namespace torch_npu
