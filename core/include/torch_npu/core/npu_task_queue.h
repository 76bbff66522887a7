// The task queue: how the torch side runs work "on the device". With
// TASK_QUEUE_ENABLE=1 (the default, as in torch_npu) a kernel is enqueued on the
// stream and the call returns at once; with TASK_QUEUE_ENABLE=0 it runs inline on
// the calling thread after the stream has drained.
#pragma once

#include <functional>

#include "torch_npu/core/npu_stream.h"

namespace torch_npu {

bool task_queue_enabled();

// Tensors up to this many elements are processed by one thread (ATen's grain size).
constexpr int64_t kInlineNumel = 32768;

// Whether a kernel the task queue could take (touching at most `work_numel` elements; < 0:
// unknown) runs on the calling thread instead, in stream order, after the stream drained:
//  - up to kInlineNumel elements, when nothing is queued on `stream`: its worker would start
//    it at once, and the hand-off costs more than the kernel;
//  - more, always: ATen splits such a kernel across an OpenMP team, and a worker's team beside
//    the host's makes libgomp throttle the spin-waits of every team (its threads then outnumber
//    the cores), so that each parallel region of the process pays futex wake-ups, the host's
//    own CPU work included. Run here, the kernel uses the host's team, the only one.
// ASCEND_SIM_INLINE=0: never (every kernel the task queue can take is queued; async_fuzz.py
// runs programs so too).
bool runs_on_caller(const NPUStream& stream, int64_t work_numel);
// Turns that off (false) or on again at run time; returns the previous setting.
bool set_runs_on_caller(bool on);

// Runs `fn` in `stream` order. `name` must outlive the task (e.g. an operator name);
// an exception thrown by fn surfaces at the next synchronisation of the stream as
// an error naming it. While fn runs, the executing thread's current device and
// current stream are the stream's. A kernel touching `work_numel` elements (< 0: unknown)
// runs on the calling thread where runs_on_caller says so; it then throws at the call.
void launch(const NPUStream& stream, const char* name, std::function<void()> fn, int64_t work_numel = -1);

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

// torch_npu.npu.stop_device / restart_device (fault recovery, torch_npu's FORCE STOP): while a
// device is stopped, kernels queued on its streams are dropped when their turn comes (their
// stream's error: ACL_ERROR_RT_DEVICE_TASK_ABORT), and launches and host synchronisations on
// the device raise "FORCE STOP". stop_device returns once the queued kernels are dropped;
// restart_device lifts the stop. Both then recover_streams: wait for every stream of the
// device and drop the errors of its failed tasks.
void stop_device(c10::DeviceIndex device);
void restart_device(c10::DeviceIndex device);
bool device_stopped(c10::DeviceIndex device);
void recover_streams(c10::DeviceIndex device);

// Destroys kernels that finished running (what they captured is released on the
// calling host thread). Launches and waits do this; memory queries call it too.
void collect_finished_kernels();

// True while the calling thread executes an npu kernel (stream worker or inline).
bool in_kernel();

// Put around a kernel that runs on the calling thread instead of a stream's worker: its time
// counts in the device's busy time (torch.npu.utilization), and while torch_npu.profiler
// records, it becomes a task of `stream` on the profile's device timeline, as queued kernels
// are (nested kernels and worker threads are not recorded here: the stream records what its
// worker runs).
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
