#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/core/npu_error.h"
#include "torch_npu/core/npu_trace.h"
#include "torch_npu/csrc/core/npu/register/OptionsManager.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace torch_npu {
namespace {

thread_local int tls_kernel_depth = 0;
BlockingHook g_blocking_hook = nullptr;

// What a kernel sees of the thread that launched it, as if it ran there: the dispatch
// keys included and excluded (a kernel launched from an npu op runs below autograd and
// autocast, so the ops it calls must too), grad and inference mode, and the intra-op
// thread count (torch.set_num_threads: OpenMP and MKL keep it per thread, so the worker
// would otherwise use every core whatever the user chose, and ranks sharing a host would
// oversubscribe it). Python state (dispatch modes, hooks) stays behind: workers never
// take the GIL.
c10::impl::LocalDispatchKeySet launch_keys() {
  // Keys whose kernels need Python state of the launching thread (torch.compile's Python
  // dispatcher, dispatch modes, functorch layers) never apply to a worker.
  static const c10::DispatchKeySet python_keys{
      c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::PythonDispatcher,
      c10::DispatchKey::PreDispatch, c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
      c10::DispatchKey::FuncTorchDynamicLayerBackMode};
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.included_ = keys.included_ - python_keys;
  return keys;
}

struct LaunchState {
  c10::impl::LocalDispatchKeySet keys = launch_keys();
  c10::AutogradState autograd = c10::AutogradState::get_tls_state();
  int threads = at::get_num_threads();
};

struct Task {
  std::function<void()> fn;
  c10::Stream stream;
  LaunchState state;
  Task* next = nullptr;
};

// Runs a task's function in its launcher's state, restoring the worker's afterwards.
void run_in_launch_state(const Task& task) {
  c10::impl::ForceDispatchKeyGuard keys(task.state.keys);
  const c10::AutogradState worker_autograd = c10::AutogradState::get_tls_state();
  c10::AutogradState::set_tls_state(task.state.autograd);
  struct Restore {
    c10::AutogradState autograd;
    ~Restore() { c10::AutogradState::set_tls_state(autograd); }
  } restore{worker_autograd};
  task.fn();
}

// Sets the worker's intra-op thread count to the launcher's when it differs.
void adopt_threads(int threads) {
  thread_local int current = 0;
  if (threads != current && threads > 0) {
    at::set_num_threads(threads);
    current = threads;
  }
}

// Finished tasks are destroyed by the host thread, not the worker: what a kernel
// captured (CPU aliases, storages, small buffers) was allocated on the host, and
// freeing it there avoids cross-thread frees contending with the host's next launch.
std::atomic<Task*> g_finished{nullptr};

void retire(Task* task) {
  Task* head = g_finished.load(std::memory_order_relaxed);
  do {
    task->next = head;
  } while (!g_finished.compare_exchange_weak(head, task, std::memory_order_release, std::memory_order_relaxed));
}

std::array<std::atomic<bool>, 64> g_stopped{};  // by device (stop_device)

[[noreturn]] void force_stop() { TORCH_CHECK(false, "FORCE STOP.", pta_error(ErrCode::ACL)); }

int run_fn(Task* task, char* err, size_t err_len) {
  if (C10_UNLIKELY(g_stopped[task->stream.device_index()].load(std::memory_order_relaxed))) {
    std::snprintf(err, err_len, "FORCE STOP");
    return ACL_ERROR_RT_DEVICE_TASK_ABORT;
  }
  try {
    NPUStream s(task->stream);
    aclrtSetDevice(s.device_index());
    setCurrentNPUStream(s);
    adopt_threads(task->state.threads);
    ++tls_kernel_depth;
    run_in_launch_state(*task);
    --tls_kernel_depth;
    return 0;
  } catch (const c10::OutOfMemoryError& e) {  // raised again as torch.OutOfMemoryError (check_acl)
    --tls_kernel_depth;
    std::snprintf(err, err_len, "%s", e.what_without_backtrace());
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  } catch (const c10::Error& e) {
    --tls_kernel_depth;
    std::snprintf(err, err_len, "%s", e.what_without_backtrace());
  } catch (const std::exception& e) {
    --tls_kernel_depth;
    std::snprintf(err, err_len, "%s", e.what());
  }
  return 1;
}

int run_task(void* user, char* err, size_t err_len) {
  struct Retire {
    Task* task;
    ~Retire() { retire(task); }
  } retire_after{static_cast<Task*>(user)};
  return run_fn(retire_after.task, err, err_len);
}

// A task recorded into a graph: run by every replay, owned by the graph's model (freed
// by its destroy callback once the model and its queued replays are gone, or once a task
// update replaced it and no replay runs).
int run_captured_task(void* user, char* err, size_t err_len) {
  return run_fn(static_cast<Task*>(user), err, err_len);
}

void delete_task(void* user) { delete static_cast<Task*>(user); }

void call_blocking(void (*fn)(void*), void* arg) {
  if (g_blocking_hook && !in_kernel()) {
    g_blocking_hook(fn, arg);
  } else {
    fn(arg);
  }
}

}  // namespace

void collect_finished_kernels() {
  Task* t = g_finished.exchange(nullptr, std::memory_order_acquire);
  while (t) {
    Task* next = t->next;
    delete t;
    t = next;
  }
}

bool task_queue_enabled() {
  static const bool enabled = c10_npu::option::OptionsManager::GetTaskQueueEnable() != 0;
  return enabled;
}

bool in_kernel() { return tls_kernel_depth > 0; }

void set_blocking_hook(BlockingHook hook) { g_blocking_hook = hook; }

static std::atomic<bool>& inline_enabled() {
  static std::atomic<bool> enabled{[] {
    const char* v = std::getenv("ASCEND_SIM_INLINE");
    return v == nullptr || std::string(v) != "0";
  }()};
  return enabled;
}

bool set_runs_on_caller(bool on) { return inline_enabled().exchange(on); }

bool runs_on_caller(const NPUStream& stream, int64_t work_numel) {
  if (work_numel < 0 || !inline_enabled().load(std::memory_order_relaxed)) return false;
  return work_numel > kInlineNumel || stream.query();
}

void launch(const NPUStream& stream, const char* name, std::function<void()> fn, int64_t work_numel) {
  if (C10_UNLIKELY(device_stopped(stream.device_index()))) force_stop();
  if (!in_kernel()) {
    // A capturing stream records the task (whatever TASK_QUEUE_ENABLE says); nothing runs.
    aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    aclmdlRI model = nullptr;
    NPU_CHECK(aclmdlRICaptureGetInfo(stream.stream(), &status, &model));
    // A stream recording a task group update records it too, as the group's new task.
    if (status == ACL_MODEL_RI_CAPTURE_STATUS_NONE) NPU_CHECK(aclsimStreamTaskUpdateModel(stream.stream(), &model));
    if (status != ACL_MODEL_RI_CAPTURE_STATUS_NONE || model != nullptr) {
      auto* task = new Task{std::move(fn), stream.unwrap()};
      aclError err = aclsimLaunchKernel(stream.stream(), run_captured_task, task, name);
      if (err != ACL_SUCCESS) {
        delete task;
        NPU_CHECK(err);
      }
      NPU_CHECK(aclsimModelRIAddDestroyCallback(model, delete_task, task));
      return;
    }
  }
  if (!task_queue_enabled() || in_kernel() || stream.is_sync_launch() || runs_on_caller(stream, work_numel)) {
    // Inline: a kernel launching a kernel (e.g. a composite run on the worker) runs it
    // right away on the same thread, which keeps stream order; so do sync-launch streams
    // and the kernels runs_on_caller keeps here.
    if (!in_kernel()) wait_stream(stream);
    InlineKernelRecord record(name, stream);
    c10::DeviceIndex prev = current_device();
    NPUStream prev_stream = getCurrentNPUStream(stream.device_index());
    if (prev != stream.device_index()) NPU_CHECK(aclrtSetDevice(stream.device_index()));
    setCurrentNPUStream(stream);
    ++tls_kernel_depth;
    struct Restore {
      c10::DeviceIndex prev;
      NPUStream prev_stream;
      ~Restore() {
        --tls_kernel_depth;
        setCurrentNPUStream(prev_stream);
        aclrtSetDevice(prev);
      }
    } restore{prev, prev_stream};
    fn();
    return;
  }
  collect_finished_kernels();
  auto* task = new Task{std::move(fn), stream.unwrap()};
  aclError err = aclsimLaunchKernel(stream.stream(), run_task, task, name);
  if (err != ACL_SUCCESS) {
    delete task;
    NPU_CHECK(err);
  }
}

void sleep_on_stream(const NPUStream& stream, int64_t cycles) {
  TORCH_CHECK(cycles >= 0, "torch.npu._sleep(): argument 'cycles' must be a non-negative number of cycles, got ",
              cycles);
  constexpr double kAICoreGHz = 1.8;
  const auto ns = static_cast<uintptr_t>(static_cast<double>(cycles) / kAICoreGHz);
  auto sleep = [](void* user, char*, size_t) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(reinterpret_cast<uintptr_t>(user)));
    return 0;
  };
  NPU_CHECK(aclsimLaunchKernel(stream.stream(), sleep, reinterpret_cast<void*>(ns), "aclnnSleep"));
}

namespace {

thread_local std::vector<uint64_t> tls_host_ops;  // handles of the RecordFunctions entered
at::CallbackHandle g_host_ops_callback = 0;
std::mutex g_host_ops_mu;

std::unique_ptr<at::ObserverContext> enter_host_op(const at::RecordFunction& fn) {
  tls_host_ops.push_back(fn.handle());
  aclsimProfilerSetLaunchTag(fn.handle());
  return nullptr;
}

void exit_host_op(const at::RecordFunction& fn, at::ObserverContext*) {
  if (!tls_host_ops.empty() && tls_host_ops.back() == fn.handle()) tls_host_ops.pop_back();
  aclsimProfilerSetLaunchTag(tls_host_ops.empty() ? 0 : tls_host_ops.back());
}

}  // namespace

void track_host_ops(bool on) {
  std::lock_guard<std::mutex> lock(g_host_ops_mu);
  if (on && g_host_ops_callback == 0) {
    g_host_ops_callback = at::addGlobalCallback(at::RecordFunctionCallback(enter_host_op, exit_host_op)
                                                    .needsIds(true)
                                                    .scopes({at::RecordScope::FUNCTION,
                                                             at::RecordScope::BACKWARD_FUNCTION,
                                                             at::RecordScope::USER_SCOPE}));
  } else if (!on && g_host_ops_callback != 0) {
    at::removeCallback(g_host_ops_callback);
    g_host_ops_callback = 0;
  }
}

InlineKernelRecord::InlineKernelRecord(const char* name, const NPUStream& stream)
    : name_(name), stream_(stream.stream()), device_(stream.device_index()) {
  if (!in_kernel() && !aclsimOnWorkerThread()) start_ = aclsimNowNs();
}

InlineKernelRecord::~InlineKernelRecord() {
  if (start_ < 0) return;
  const int64_t end = aclsimNowNs();
  aclsimDeviceAddBusyNs(device_, end - start_);  // torch.npu.utilization counts it
  if (name_ != nullptr && aclsimProfilerEnabled()) aclsimProfilerRecord(name_, device_, aclsimStreamId(stream_), start_, end);
}

void wait_stream(const NPUStream& stream) {
  struct Arg {
    aclrtStream s;
    aclError err;
  } arg{stream.stream(), ACL_SUCCESS};
  call_blocking([](void* p) {
    auto* a = static_cast<Arg*>(p);
    a->err = aclrtSynchronizeStream(a->s);
  }, &arg);
  if (!in_kernel()) collect_finished_kernels();
  if (C10_UNLIKELY(device_stopped(stream.device_index()))) force_stop();
  NPU_CHECK(arg.err);
}

aclError wait_event(aclrtEvent event) {
  struct Arg {
    aclrtEvent e;
    aclError err;
  } arg{event, ACL_SUCCESS};
  call_blocking([](void* p) {
    auto* a = static_cast<Arg*>(p);
    a->err = aclrtSynchronizeEvent(a->e);
  }, &arg);
  return arg.err;
}

// aclrtSynchronizeDevice on `device` through the blocking hook (the GIL released).
static aclError sync_device(c10::DeviceIndex device) {
  struct Arg {
    int32_t device;
    aclError err;
  } arg{device, ACL_SUCCESS};
  call_blocking([](void* p) {
    auto* a = static_cast<Arg*>(p);
    int32_t prev = 0;
    aclrtGetDevice(&prev);
    aclrtSetDevice(a->device);
    a->err = aclrtSynchronizeDevice();
    aclrtSetDevice(prev);
  }, &arg);
  if (!in_kernel()) collect_finished_kernels();
  return arg.err;
}

void wait_device(c10::DeviceIndex device) {
  check_device_index(device);
  const aclError err = sync_device(device);
  if (C10_UNLIKELY(device_stopped(device))) force_stop();
  NPU_CHECK(err);
}

bool device_stopped(c10::DeviceIndex device) {
  return device >= 0 && g_stopped[device].load(std::memory_order_relaxed);
}

void recover_streams(c10::DeviceIndex device) {
  check_device_index(device);
  (void)sync_device(device);  // returns (and so drops) the errors of the failed tasks
}

void stop_device(c10::DeviceIndex device) {
  check_device_index(device);
  g_stopped[device].store(true);
  recover_streams(device);  // the queued kernels are dropped as their turn comes
}

void restart_device(c10::DeviceIndex device) {
  check_device_index(device);
  g_stopped[device].store(false);
  recover_streams(device);
}

}  // namespace torch_npu

namespace torch_npu {

void synchronize_device(c10::DeviceIndex device) {
  wait_device(device);
  trace::emit(trace::Kind::DeviceSynchronization);
}

void NPUStream::synchronize() const {
  wait_stream(*this);
  trace::emit(trace::Kind::StreamSynchronization, stream());
}

}  // namespace torch_npu
