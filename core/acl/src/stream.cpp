// Streams (ordered task queue + one worker thread each), events, shutdown.
//
// Enqueue: lock the stream mutex, copy a small POD Task into the tail chunk of the
// queue, bump a counter, and notify the worker only if it is asleep. The worker takes
// the whole chain of chunks under the lock and runs it without holding the lock;
// emptied chunks go back to a per-stream free list (no allocation in steady state, no
// copying on bursts). Completion is a counter; host waiters block on a condition
// variable that the worker signals only when the count a waiter sleeps for is reached.
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>

#include <unistd.h>

#include "internal.h"

namespace aclsim {

namespace {
thread_local Stream* tl_worker_stream = nullptr;
std::atomic<int> g_stream_serial{0};
// Emptied queue chunks kept per stream (256 tasks each) beyond which they are freed.
constexpr int kKeepBlocks = 16;

// How long an idle worker polls its queue before sleeping. A host launching small
// kernels back to back would otherwise pay a futex wake-up (2-5 us) per launch.
// ASCEND_SIM_WORKER_SPIN_US overrides it (0: sleep at once).
std::chrono::microseconds WorkerSpin() {
  static const std::chrono::microseconds spin = [] {
    const char* s = getenv("ASCEND_SIM_WORKER_SPIN_US");
    return std::chrono::microseconds(s && *s ? atol(s) : 50);
  }();
  return spin;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

Stream* CurrentWorkerStream() { return tl_worker_stream; }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- Stream ------------------------------------------------------------------------------
bool Stream::IsCurrentWorker() const { return tl_worker_stream == this; }

bool Stream::Orphaned() const {
  if (!RT().forked_child) return false;
  const int pid = worker_pid_.load(std::memory_order_relaxed);
  return pid != 0 && pid != getpid();
}

aclError Stream::Enqueue(const Task& t) {
  if (capture.load(std::memory_order_acquire) != nullptr) return CaptureTask(this, t);
  if (update.load(std::memory_order_acquire) != nullptr) return UpdateTask(this, t);
  if (Orphaned()) return ForkedChildFail("launching a task");
  std::unique_lock<std::mutex> lk(mu_);
  if (inline_) {
    // Process exit: the worker is gone; run in the caller (after anything still queued).
    lk.unlock();
    WaitIdle();
    enqueued_.fetch_add(1, std::memory_order_seq_cst);
    Task copy = t;
    char errbuf[1024];
    Run(copy, errbuf, sizeof(errbuf));
    MarkDone();
    return ACL_SUCCESS;
  }
  if (!started_) {
    if (aclError e = StartWorkerLocked(); e != ACL_SUCCESS) return e;
  }
  TaskBlock* b = tail_;
  if (b == nullptr || b->count == TaskBlock::kTasks) {
    if (free_) {
      b = free_;
      free_ = b->next;
      --free_count_;
      b->count = 0;
      b->next = nullptr;
    } else {
      b = new (std::nothrow) TaskBlock;  // tasks left uninitialised
      if (b == nullptr)
        return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                    "out of host memory growing the task queue of a stream on device %d",
                    device);
    }
    if (tail_)
      tail_->next = b;
    else
      head_ = b;
    tail_ = b;
  }
  Task& queued = b->tasks[b->count++];
  queued = t;
  queued.correlation = 0;
  if (ProfilerOn()) ProfilerStampLaunch(queued);
  enqueued_.store(enqueued_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  bool wake = sleeping_;
  sleeping_ = false;  // one notification per sleep
  lk.unlock();
  if (wake) work_cv_.notify_one();
  return ACL_SUCCESS;
}

aclError Stream::StartWorkerLocked() {
  try {
    worker_pid_.store(getpid(), std::memory_order_relaxed);
    worker_ = std::thread([this] { WorkerMain(); });
  } catch (const std::exception& e) {
    return Fail(ACL_ERROR_RT_INTERNAL_ERROR,
                "cannot start the worker thread of a stream on device %d: %s", device,
                e.what());
  }
  worker_id_ = worker_.get_id();
  started_ = true;
  return ACL_SUCCESS;
}

void Stream::WorkerMain() {
  tl_worker_stream = this;
  CurrentDevice() = device;
  {
    char tname[16];
    snprintf(tname, sizeof(tname), "npu%d-s%d", device, Serial());
    pthread_setname_np(pthread_self(), tname);
  }
  char errbuf[1024];
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (head_ == nullptr && !stop_ && WorkerSpin().count() > 0) {
      const uint64_t seen = enqueued_.load(std::memory_order_acquire);
      lk.unlock();
      const auto deadline = std::chrono::steady_clock::now() + WorkerSpin();
      for (int i = 1; enqueued_.load(std::memory_order_acquire) == seen; ++i) {
        CpuRelax();
        if ((i & 63) == 0 && std::chrono::steady_clock::now() >= deadline) break;
      }
      lk.lock();
    }
    while (head_ == nullptr && !stop_) {
      sleeping_ = true;
      work_cv_.wait(lk);
    }
    sleeping_ = false;
    if (head_ == nullptr) break;  // stop requested and drained
    TaskBlock* chain = head_;
    head_ = tail_ = nullptr;
    lk.unlock();
    for (TaskBlock* b = chain; b; b = b->next) {
      for (int i = 0; i < b->count; ++i) {
        // An event record completes its event before MarkDone counts the task: until then
        // Idle() waits, so whoever saw the event complete sees the stream past it too.
        if (b->tasks[i].kind == kTaskEventRecord) settling_.store(true, std::memory_order_seq_cst);
        Run(b->tasks[i], errbuf, sizeof(errbuf));
        MarkDone();
      }
    }
    // Recycle the chunks; free those beyond the keep limit (outside the lock).
    TaskBlock* excess = nullptr;
    lk.lock();
    while (chain && free_count_ < kKeepBlocks) {
      TaskBlock* n = chain->next;
      chain->next = free_;
      free_ = chain;
      ++free_count_;
      chain = n;
    }
    excess = chain;
    if (excess) {
      lk.unlock();
      while (excess) {
        TaskBlock* n = excess->next;
        delete excess;
        excess = n;
      }
      lk.lock();
    }
  }
}

Stream::~Stream() {
  DropTaskUpdate(this);
  for (TaskBlock* b : {head_, free_}) {
    while (b) {
      TaskBlock* n = b->next;
      delete b;
      b = n;
    }
  }
}

void Stream::MarkDone() {
  const uint64_t done = completed_.fetch_add(1, std::memory_order_seq_cst) + 1;
  settling_.store(false, std::memory_order_seq_cst);
  if (done >= wake_at_.load(std::memory_order_seq_cst)) {
    {
      std::lock_guard<std::mutex> g(done_mu_);
      wake_at_.store(UINT64_MAX, std::memory_order_seq_cst);  // woken waiters re-register
    }
    done_cv_.notify_all();
  }
}

void Stream::WaitIdle() {
  const uint64_t target = enqueued_.load(std::memory_order_acquire);
  if (completed_.load(std::memory_order_acquire) >= target) return;
  std::unique_lock<std::mutex> lk(done_mu_);
  for (;;) {
    uint64_t at = wake_at_.load(std::memory_order_seq_cst);
    while (target < at && !wake_at_.compare_exchange_weak(at, target, std::memory_order_seq_cst)) {
    }
    if (completed_.load(std::memory_order_seq_cst) >= target) return;
    done_cv_.wait(lk);
  }
}

void Stream::RecordError(const char* name, const char* msg, int rc) {
  std::lock_guard<std::mutex> g(err_mu_);
  if (error_count_++ == 0) {
    error_rc_ = rc;
    error_ = name;
    error_ += ": ";
    if (msg && *msg) {
      error_ += msg;
    } else {
      char buf[64];
      snprintf(buf, sizeof(buf), "failed with code %d", rc);
      error_ += buf;
    }
  }
  has_error_.store(true, std::memory_order_release);
}

bool Stream::TakeError(std::string* msg, int* rc) {
  if (!has_error_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> g(err_mu_);
  if (error_count_ == 0) return false;
  *msg = std::move(error_);
  if (rc) *rc = error_rc_;
  if (error_count_ > 1) {
    char buf[96];
    snprintf(buf, sizeof(buf), " (and %d more failed task%s on this stream)",
             error_count_ - 1, error_count_ == 2 ? "" : "s");
    *msg += buf;
  }
  error_.clear();
  error_count_ = 0;
  has_error_.store(false, std::memory_order_release);
  return true;
}

void Stream::Run(Task& t, char* errbuf, size_t errlen) {
  // Busy time: work tasks (not event records/waits/resets), top level only (a graph
  // replay's tasks run inside its task).
  thread_local int depth = 0;
  const bool work = t.kind == kTaskKernel || t.kind == kTaskCallback || t.kind == kTaskMemcpy ||
                    t.kind == kTaskMemset || t.kind == kTaskModel;
  const int64_t start = NowNs();
  ++depth;
  Execute(t, errbuf, errlen);
  --depth;
  const int64_t end = NowNs();
  auto& devices = RT().devices;
  if (work && depth == 0 && device >= 0 && device < static_cast<int>(devices.size())) {
    devices[device]->AddBusy(end - start);
  }
  if (t.correlation != 0) ProfilerRecordTask(t, device, Serial(), start, end);
}

int Stream::Serial() {
  int s = serial_.load(std::memory_order_acquire);
  if (s >= 0) return s;
  const int mine = g_stream_serial.fetch_add(1, std::memory_order_relaxed);
  return serial_.compare_exchange_strong(s, mine, std::memory_order_acq_rel) ? mine : s;
}

void Stream::Execute(Task& t, char* errbuf, size_t errlen) {
  switch (t.kind) {
    case kTaskKernel: {
      errbuf[0] = '\0';
      int rc;
      try {
        rc = reinterpret_cast<aclsimKernelFn>(t.fn)(t.a, errbuf, errlen);
      } catch (const std::exception& e) {
        rc = -1;
        snprintf(errbuf, errlen, "unhandled C++ exception: %s", e.what());
      } catch (...) {
        rc = -1;
        snprintf(errbuf, errlen, "unhandled C++ exception");
      }
      if (rc != 0) {
        errbuf[errlen - 1] = '\0';
        RecordError(t.name, errbuf, rc);
      }
      break;
    }
    case kTaskCallback:
      try {
        reinterpret_cast<aclrtCallback>(t.fn)(t.a);
      } catch (const std::exception& e) {
        snprintf(errbuf, errlen, "unhandled C++ exception: %s", e.what());
        RecordError("aclrtLaunchCallback", errbuf, -1);
      } catch (...) {
        RecordError("aclrtLaunchCallback", "unhandled C++ exception", -1);
      }
      break;
    case kTaskMemcpy:
      memmove(t.a, t.b, t.n);
      break;
    case kTaskMemset:
      memset(t.a, t.value, t.n);
      break;
    case kTaskEventRecord: {
      auto* ev = static_cast<Event*>(t.a);
      ev->Complete(t.n);
      ev->Unref();
      break;
    }
    case kTaskEventWait: {
      auto* ev = static_cast<Event*>(t.a);
      if (ev->flags & ACL_EVENT_EXTERNAL)
        ev->WaitForFlag();
      else
        ev->WaitFor(t.n);
      ev->Unref();
      break;
    }
    case kTaskEventReset: {
      auto* ev = static_cast<Event*>(t.a);
      ev->Reset();
      ev->Unref();
      break;
    }
    case kTaskModel:
      RunModelExecution(this, t.a, errbuf, errlen);
      break;
  }
}

void Stream::Shutdown(bool restartable) {
  if (!IsCurrentWorker()) WaitIdle();
  std::thread th;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!restartable) inline_ = true;
    if (!started_) return;
    if (worker_id_ == std::this_thread::get_id()) {
      // Called from our own worker (exit() inside a kernel): cannot join ourselves.
      worker_.detach();
      started_ = false;
      return;
    }
    stop_ = true;
    th = std::move(worker_);
  }
  work_cv_.notify_one();
  th.join();
  std::lock_guard<std::mutex> lk(mu_);
  stop_ = false;
  started_ = false;
  // Restartable: a task enqueued between the worker's exit and this point found
  // started_ still set; give it a worker now rather than stranding it. (Inline mode
  // queues nothing once inline_ is set.)
  if (!inline_ && head_ != nullptr) StartWorkerLocked();
}

// ---- Event ---------------------------------------------------------------------------------
void Event::Complete(uint64_t gen) {
  if (ipc != nullptr) {  // shared with other processes: no lock of ours covers them
    uint64_t cur = completed.load(std::memory_order_acquire);
    while (gen > cur && !completed.compare_exchange_weak(cur, gen, std::memory_order_acq_rel)) {
    }
    ipc->wake.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&ipc->wake), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> g(mu);
    if (gen > completed.load(std::memory_order_relaxed)) {
      stamp_ns.store(NowNs(), std::memory_order_relaxed);
      completed.store(gen, std::memory_order_seq_cst);
    }
  }
  if (waiters.load(std::memory_order_seq_cst) > 0) cv.notify_all();
}

void Event::Reset() {
  std::lock_guard<std::mutex> g(mu);
  stamp_ns.store(-1, std::memory_order_relaxed);
  cleared.store(completed.load(std::memory_order_relaxed), std::memory_order_seq_cst);
}

void Event::WaitForFlag() {
  auto set = [&] { return completed.load(std::memory_order_seq_cst) > cleared.load(std::memory_order_seq_cst); };
  if (set()) return;
  waiters.fetch_add(1, std::memory_order_seq_cst);
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, set);
  }
  waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void Event::WaitFor(uint64_t gen) {
  if (Done(gen)) return;
  if (ipc != nullptr) {
    // The record may complete in another process: sleep on the shared futex word (the
    // timeout bounds a wake-up lost to a process that died between its two steps).
    while (true) {
      const uint32_t w = ipc->wake.load(std::memory_order_seq_cst);
      if (Done(gen)) return;
      struct timespec ts = {0, 50 * 1000 * 1000};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&ipc->wake), FUTEX_WAIT, w, &ts, nullptr, 0);
    }
  }
  waiters.fetch_add(1, std::memory_order_seq_cst);
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return completed.load(std::memory_order_seq_cst) >= gen; });
  }
  waiters.fetch_sub(1, std::memory_order_seq_cst);
}

// ---- shutdown -----------------------------------------------------------------------------
void ShutdownAllStreams(bool exiting) {
  Runtime& rt = RT();
  if (exiting) rt.exiting.store(true);
  std::vector<std::shared_ptr<Stream>> all;
  for (auto& d : rt.devices) {
    auto s = d->Snapshot();
    all.insert(all.end(), s.begin(), s.end());
  }
  // Drain everything first (a stream may wait on an event recorded on another), then
  // stop and join each worker.
  for (auto& s : all)
    if (!s->IsCurrentWorker()) s->WaitIdle();
  for (auto& s : all) s->Shutdown(!exiting);
}

}  // namespace aclsim
