// The task queue: how the torch side runs work "on the device". With
// TASK_QUEUE_ENABLE=1 (the default, as in torch_npu) a kernel is enqueued on the
// stream and the call returns at once; with TASK_QUEUE_ENABLE=0 it runs inline on
// the calling thread after the stream has drained.
#pragma once

#include <functional>

#include "torch_npu/core/npu_stream.h"

namespace torch_npu {

bool task_queue_enabled();

// Runs `fn` in `stream` order. `name` must outlive the task (e.g. an operator name);
// an exception thrown by fn surfaces at the next synchronisation of the stream as
// an error naming it. While fn runs, the executing thread's current device and
// current stream are the stream's.
void launch(const NPUStream& stream, const char* name, std::function<void()> fn);

// Queues a task keeping `stream` busy for `cycles` AI Core cycles (at the simulated
// 910B's 1.8 GHz), whatever TASK_QUEUE_ENABLE says: torch.npu._sleep, which tests use
// to have work queued behind a running task.
void sleep_on_stream(const NPUStream& stream, int64_t cycles);

// Waits for `stream`, releasing the Python GIL if the caller holds it (the hook is
// installed by the bindings; core itself has no Python dependency).
// These are the runtime's own waits; what the host program asks for (NPUStream::synchronize,
// synchronize_device, blocking copies) also reports the synchronisation to the NPU trace.
void wait_stream(const NPUStream& stream);
// Waits for `event` the same way (the GIL released), returning ACL's status. Every wait of
// the host goes through these: a task dropping the last C++ reference to a tensor that has
// a Python object takes the GIL, so a host waiting with it held would deadlock.
aclError wait_event(aclrtEvent event);
void wait_device(c10::DeviceIndex device);
void synchronize_device(c10::DeviceIndex device);
using BlockingHook = void (*)(void (*fn)(void*), void* arg);
void set_blocking_hook(BlockingHook hook);

// Destroys kernels that finished running (what they captured is released on the
// calling host thread). Launches and waits do this; memory queries call it too.
void collect_finished_kernels();

// True while the calling thread executes an npu kernel (stream worker or inline).
bool in_kernel();

// Put around a kernel that runs on the calling thread instead of a stream's worker:
// while torch_npu.profiler records, it becomes a task of `stream` on the profile's device
// timeline, as queued kernels are (nested kernels and worker threads are not recorded
// here: the stream records what its worker runs).
// While on, every thread's launches are tagged with the RecordFunction (host operator)
// it is inside, which torch.profiler's trace names "Record function id".
void track_host_ops(bool on);

class InlineKernelRecord {
 public:
  InlineKernelRecord(const char* name, const NPUStream& stream);
  ~InlineKernelRecord();
  InlineKernelRecord(const InlineKernelRecord&) = delete;
  InlineKernelRecord& operator=(const InlineKernelRecord&) = delete;

 private:
  const char* name_;
  aclrtStream stream_;
  c10::DeviceIndex device_;
  int64_t start_ = -1;  // -1: not recording
};

}  // namespace torch_npu
