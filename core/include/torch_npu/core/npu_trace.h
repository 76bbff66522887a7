// The NPU trace: what the host asks of the runtime (events, stream and device
// synchronisations, allocations, record_stream), reported in call order to one sink.
// torch_npu.npu._sanitizer installs a sink (torch_npu._C._activate_npu_trace) to learn the
// happens-before order between streams and the host; with no sink, each trace point
// costs one relaxed atomic load.
//
// Only the host's own calls are reported: a kernel's internal allocations and waits (on a
// stream worker, or inline under TASK_QUEUE_ENABLE=0) are not, so the trace of a program
// is the same in both modes.
#pragma once

#include <atomic>
#include <cstdint>

namespace torch_npu {
namespace trace {

// The order is the index torch_npu.utils._npu_trace._KINDS names them by.
enum class Kind : int {
  EventCreation = 0,
  EventDeletion,
  EventRecord,            // (event, stream)
  EventWait,              // (event, stream)
  MemoryAllocation,       // (ptr)
  MemoryDeallocation,     // (ptr)
  StreamCreation,         // (stream)
  DeviceSynchronization,  // ()
  StreamSynchronization,  // (stream)
  EventSynchronization,   // (event)
  RecordStream,           // (ptr, stream)
  EraseStream,            // (ptr, stream)
  HostAllocation,         // (ptr): pinned host memory
  HostDeallocation,       // (ptr)
};

using Sink = void (*)(Kind kind, uintptr_t a, uintptr_t b);

// nullptr turns tracing off.
void set_sink(Sink sink);

namespace detail {
extern std::atomic<Sink> g_sink;
void emit(Sink sink, Kind kind, uintptr_t a, uintptr_t b);
}  // namespace detail

inline void emit(Kind kind, uintptr_t a = 0, uintptr_t b = 0) {
  Sink sink = detail::g_sink.load(std::memory_order_relaxed);
  if (__builtin_expect(sink != nullptr, 0)) detail::emit(sink, kind, a, b);
}

inline void emit(Kind kind, const void* a, const void* b = nullptr) {
  emit(kind, reinterpret_cast<uintptr_t>(a), reinterpret_cast<uintptr_t>(b));
}

}  // namespace trace
}  // namespace torch_npu
