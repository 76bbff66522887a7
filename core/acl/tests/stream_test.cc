// Streams, events, kernels, callbacks, task errors, concurrency.
#include <stdint.h>

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.h"

static void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

static int SleepKernel(void* ms, char*, size_t) {
  SleepMs((int)(intptr_t)ms);
  return 0;
}

static int EmptyKernel(void*, char*, size_t) { return 0; }

// ---- ordering ----------------------------------------------------------------------
struct Append {
  std::vector<int>* out;
  int value;
};
static int AppendKernel(void* p, char*, size_t) {
  auto* a = static_cast<Append*>(p);
  a->out->push_back(a->value);
  return 0;
}

static void TestOrdering() {
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  REQUIRE(s);
  std::vector<int> out;
  std::vector<Append> args(1000);
  for (int i = 0; i < 1000; ++i) {
    args[i] = {&out, i};
    CHECK_OK(aclsimLaunchKernel(s, AppendKernel, &args[i], "append"));
  }
  CHECK_OK(aclrtSynchronizeStream(s));
  bool ordered = out.size() == 1000;
  for (int i = 0; ordered && i < 1000; ++i) ordered = out[i] == i;
  CHECK(ordered);
  CHECK_OK(aclrtDestroyStream(s));
}

// ---- async: query before / after -----------------------------------------------------
static void TestAsync() {
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  aclrtEvent ev = nullptr;
  CHECK_OK(aclrtCreateEvent(&ev));
  aclrtEventRecordedStatus es;
  CHECK_OK(aclrtQueryEventStatus(ev, &es));
  CHECK(es == ACL_EVENT_RECORDED_STATUS_COMPLETE);  // never recorded
  aclrtStreamStatus ss;
  CHECK_OK(aclrtStreamQuery(s, &ss));
  CHECK(ss == ACL_STREAM_STATUS_COMPLETE);

  CHECK_OK(aclsimLaunchKernel(s, SleepKernel, (void*)(intptr_t)200, "sleep"));
  CHECK_OK(aclrtRecordEvent(ev, s));
  CHECK_OK(aclrtStreamQuery(s, &ss));
  CHECK(ss == ACL_STREAM_STATUS_NOT_READY);
  CHECK_OK(aclrtQueryEventStatus(ev, &es));
  CHECK(es == ACL_EVENT_RECORDED_STATUS_NOT_READY);
  float ms = 0;
  CHECK_RC(aclrtEventElapsedTime(&ms, ev, ev), ACL_ERROR_RT_EVENT_NOT_RECORDED);  // not done
  CHECK_OK(aclrtSynchronizeEvent(ev));
  CHECK_OK(aclrtQueryEventStatus(ev, &es));
  CHECK(es == ACL_EVENT_RECORDED_STATUS_COMPLETE);
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_OK(aclrtStreamQuery(s, &ss));
  CHECK(ss == ACL_STREAM_STATUS_COMPLETE);

  // Re-recording: the new record is pending again until it runs.
  CHECK_OK(aclsimLaunchKernel(s, SleepKernel, (void*)(intptr_t)100, "sleep"));
  CHECK_OK(aclrtRecordEvent(ev, s));
  CHECK_OK(aclrtQueryEventStatus(ev, &es));
  CHECK(es == ACL_EVENT_RECORDED_STATUS_NOT_READY);
  CHECK_OK(aclrtSynchronizeEvent(ev));
  CHECK_OK(aclrtQueryEventStatus(ev, &es));
  CHECK(es == ACL_EVENT_RECORDED_STATUS_COMPLETE);
  CHECK_OK(aclrtDestroyEvent(ev));
  CHECK_OK(aclrtDestroyStream(s));
}

// ---- cross-stream wait --------------------------------------------------------------
struct Shared {
  std::atomic<int> value{0};
  int seen = -1;
};
static int SlowWrite(void* p, char*, size_t) {
  SleepMs(150);
  static_cast<Shared*>(p)->value.store(42);
  return 0;
}
static int ReadValue(void* p, char*, size_t) {
  auto* s = static_cast<Shared*>(p);
  s->seen = s->value.load();
  return 0;
}

static void TestCrossStreamWait() {
  aclrtStream a = nullptr, b = nullptr;
  CHECK_OK(aclrtCreateStream(&a));
  CHECK_OK(aclrtSetDevice(1));
  CHECK_OK(aclrtCreateStream(&b));  // on another device: waits work across devices too
  CHECK_OK(aclrtSetDevice(0));
  aclrtEvent ev = nullptr;
  CHECK_OK(aclrtCreateEventWithFlag(&ev, ACL_EVENT_SYNC));
  Shared sh;
  CHECK_OK(aclsimLaunchKernel(a, SlowWrite, &sh, "slow_write"));
  CHECK_OK(aclrtRecordEvent(ev, a));
  CHECK_OK(aclrtStreamWaitEvent(b, ev));
  CHECK_OK(aclsimLaunchKernel(b, ReadValue, &sh, "read"));
  CHECK_OK(aclrtDestroyEvent(ev));  // destroying with a wait pending is safe
  CHECK_OK(aclrtSynchronizeStream(b));
  CHECK(sh.seen == 42);

  // Waiting on a never-recorded event does not block.
  aclrtEvent idle = nullptr;
  CHECK_OK(aclrtCreateEvent(&idle));
  sh.seen = -1;
  CHECK_OK(aclrtStreamWaitEvent(b, idle));
  CHECK_OK(aclsimLaunchKernel(b, ReadValue, &sh, "read"));
  CHECK_OK(aclrtSynchronizeStream(b));
  CHECK(sh.seen == 42);
  CHECK_OK(aclrtDestroyEvent(idle));
  CHECK_OK(aclrtDestroyStream(a));
  CHECK_OK(aclrtDestroyStream(b));
}

// ---- timing ------------------------------------------------------------------------
static void TestElapsed() {
  aclrtEvent e1 = nullptr, e2 = nullptr, untimed = nullptr;
  CHECK_OK(aclrtCreateEvent(&e1));
  CHECK_OK(aclrtCreateEvent(&e2));
  CHECK_OK(aclrtCreateEventWithFlag(&untimed, ACL_EVENT_SYNC));
  float ms = -1;
  CHECK_RC(aclrtEventElapsedTime(&ms, e1, e2), ACL_ERROR_RT_EVENT_NOT_RECORDED);
  CHECK(Contains(aclGetRecentErrMsg(), "never recorded"));
  CHECK_OK(aclrtRecordEvent(e1, nullptr));
  CHECK_OK(aclsimLaunchKernel(nullptr, SleepKernel, (void*)(intptr_t)50, "sleep"));
  CHECK_OK(aclrtRecordEvent(e2, nullptr));
  CHECK_OK(aclrtRecordEvent(untimed, nullptr));
  CHECK_OK(aclrtSynchronizeStream(nullptr));
  CHECK_OK(aclrtEventElapsedTime(&ms, e1, e2));
  CHECK(ms >= 50.0f);
  CHECK(ms < 5000.0f);
  float back = 0;
  CHECK_OK(aclrtEventElapsedTime(&back, e2, e1));
  CHECK(back <= -50.0f);
  CHECK_RC(aclrtEventElapsedTime(&ms, e1, untimed), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "ACL_EVENT_TIME_LINE"));
  // Timestamps are monotonic across records on one stream.
  float prev = 0;
  bool mono = true;
  for (int i = 0; i < 5; ++i) {
    CHECK_OK(aclrtRecordEvent(e2, nullptr));
    CHECK_OK(aclrtSynchronizeEvent(e2));
    CHECK_OK(aclrtEventElapsedTime(&ms, e1, e2));
    mono &= ms >= prev;
    prev = ms;
  }
  CHECK(mono);
  CHECK_OK(aclrtResetEvent(e2, nullptr));
  CHECK_OK(aclrtSynchronizeStream(nullptr));
  CHECK_RC(aclrtEventElapsedTime(&ms, e1, e2), ACL_ERROR_RT_EVENT_NOT_RECORDED);
  // Each device has its own clock: events recorded on two devices are not timed.
  CHECK_OK(aclrtSetDevice(1));
  CHECK_OK(aclrtRecordEvent(e2, nullptr));
  CHECK_OK(aclrtSynchronizeEvent(e2));
  CHECK_OK(aclrtSetDevice(0));
  CHECK_RC(aclrtEventElapsedTime(&ms, e1, e2), ACL_ERROR_RT_PARAM_INVALID);
  CHECK(Contains(aclGetRecentErrMsg(), "recorded on device 0 and the end event on device 1"));
  CHECK_OK(aclrtRecordEvent(e2, nullptr));
  CHECK_OK(aclrtSynchronizeEvent(e2));
  CHECK_OK(aclrtEventElapsedTime(&ms, e1, e2));
  CHECK_OK(aclrtDestroyEvent(e1));
  CHECK_OK(aclrtDestroyEvent(e2));
  CHECK_OK(aclrtDestroyEvent(untimed));
}

// ---- kernel errors -----------------------------------------------------------------
static int FailingKernel(void*, char* err, size_t len) {
  snprintf(err, len, "bad shape [2, 3] vs [4]");
  return 1;
}
static int SilentFail(void*, char*, size_t) { return 7; }
static int OutOfMemoryKernel(void*, char* err, size_t n) {
  snprintf(err, n, "NPU out of memory. Tried to allocate 2.00 MiB");
  return ACL_ERROR_RT_MEMORY_ALLOCATION;
}
static int Throwing(void*, char*, size_t) { throw std::runtime_error("boom"); }
static int Count(void* p, char*, size_t) {
  ++*static_cast<std::atomic<int>*>(p);
  return 0;
}

static void TestKernelErrors() {
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  std::atomic<int> n{0};
  CHECK_OK(aclsimLaunchKernel(s, FailingKernel, nullptr, "my_op"));
  CHECK_OK(aclsimLaunchKernel(s, Count, &n, "count"));
  CHECK_RC(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
  CHECK(strcmp(aclGetRecentErrMsg(), "my_op: bad shape [2, 3] vs [4]") == 0);
  CHECK(n == 1);                          // later tasks still ran
  CHECK_OK(aclrtSynchronizeStream(s));    // reported once
  CHECK_OK(aclsimLaunchKernel(s, Count, &n, "count"));
  CHECK_OK(aclrtSynchronizeStream(s));    // stream still usable
  CHECK(n == 2);

  CHECK_OK(aclsimLaunchKernel(s, SilentFail, nullptr, "silent"));
  CHECK_OK(aclsimLaunchKernel(s, Throwing, nullptr, "thrower"));
  CHECK_RC(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
  CHECK(Contains(aclGetRecentErrMsg(), "silent: failed with code 7"));
  CHECK(Contains(aclGetRecentErrMsg(), "1 more failed task"));
  CHECK_OK(aclrtSynchronizeStream(s));

  CHECK_OK(aclsimLaunchKernel(s, Throwing, nullptr, "thrower"));
  CHECK_RC(aclrtSynchronizeDevice(), ACL_ERROR_RT_AICORE_EXCEPTION);  // device sync sees it
  CHECK(strcmp(aclGetRecentErrMsg(), "thrower: unhandled C++ exception: boom") == 0);
  CHECK_OK(aclrtSynchronizeDevice());
  CHECK_OK(aclrtSynchronizeStream(s));

  // A kernel that ran out of device memory: its code is passed on (stream, device and a
  // destroyed stream's error alike); the first failure's code wins.
  CHECK_OK(aclsimLaunchKernel(s, OutOfMemoryKernel, nullptr, "attention_grad"));
  CHECK_RC(aclrtSynchronizeStream(s), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK(strcmp(aclGetRecentErrMsg(), "attention_grad: NPU out of memory. Tried to allocate 2.00 MiB") == 0);
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_OK(aclsimLaunchKernel(s, OutOfMemoryKernel, nullptr, "attention_grad"));
  CHECK_RC(aclrtSynchronizeDevice(), ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK_OK(aclsimLaunchKernel(s, SilentFail, nullptr, "silent"));
  CHECK_OK(aclsimLaunchKernel(s, OutOfMemoryKernel, nullptr, "attention_grad"));
  CHECK_RC(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
  {
    aclrtStream t = nullptr;
    CHECK_OK(aclrtCreateStream(&t));
    CHECK_OK(aclsimLaunchKernel(t, OutOfMemoryKernel, nullptr, "lost_oom"));
    CHECK_OK(aclrtDestroyStream(t));
    CHECK_RC(aclrtSynchronizeDevice(), ACL_ERROR_RT_MEMORY_ALLOCATION);
    CHECK(Contains(aclGetRecentErrMsg(), "lost_oom: NPU out of memory"));
  }

  // An error left on a destroyed stream is reported by the next device sync.
  CHECK_OK(aclsimLaunchKernel(s, FailingKernel, nullptr, "lost_op"));
  CHECK_OK(aclrtDestroyStream(s));
  CHECK_RC(aclrtSynchronizeDevice(), ACL_ERROR_RT_AICORE_EXCEPTION);
  CHECK(Contains(aclGetRecentErrMsg(), "lost_op: bad shape"));
  CHECK_OK(aclrtSynchronizeDevice());

  // Default stream errors too.
  CHECK_OK(aclsimLaunchKernel(nullptr, FailingKernel, nullptr, nullptr));
  CHECK_RC(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_EXCEPTION);
  CHECK(Contains(aclGetRecentErrMsg(), "kernel: bad shape"));
}

// ---- callbacks, memcpy/memset async, kernels using the API ---------------------------
static void CountCb(void* p) { ++*static_cast<std::atomic<int>*>(p); }

struct WorkerProbe {
  int on_worker = -1;
  int device = -1;
  int alloc_device = -2;
  aclError self_sync = 0;
  aclError other_enqueue = -1;
  aclrtStream other = nullptr;
  std::atomic<int>* counter = nullptr;
};
static int ProbeKernel(void* p, char*, size_t) {
  auto* w = static_cast<WorkerProbe*>(p);
  w->on_worker = aclsimOnWorkerThread();
  aclrtGetDevice(&w->device);
  void* m = nullptr;
  if (aclrtMalloc(&m, 4096, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS) {
    w->alloc_device = aclsimPointerDevice(m);
    aclrtFree(m);
  }
  w->self_sync = aclrtSynchronizeStream(nullptr);  // own default stream: refused
  w->other_enqueue = aclsimLaunchKernel(w->other, Count, w->counter, "from_kernel");
  return 0;
}

static void TestWorkerSide() {
  std::atomic<int> n{0};
  CHECK_OK(aclrtLaunchCallback(CountCb, &n, ACL_CALLBACK_BLOCK, nullptr));
  CHECK_OK(aclrtLaunchCallback(CountCb, &n, ACL_CALLBACK_NO_BLOCK, nullptr));
  CHECK_OK(aclrtSynchronizeStream(nullptr));
  CHECK(n == 2);

  aclrtStream other = nullptr;
  CHECK_OK(aclrtCreateStream(&other));
  WorkerProbe w;
  w.other = other;
  w.counter = &n;
  CHECK_OK(aclsimLaunchKernel(aclsimDefaultStream(1), ProbeKernel, &w, "probe"));
  CHECK_OK(aclrtSetDevice(1));
  CHECK_OK(aclrtSynchronizeDevice());
  CHECK_OK(aclrtSetDevice(0));
  CHECK_OK(aclrtSynchronizeStream(other));
  CHECK(w.on_worker == 1);
  CHECK(w.device == 1);        // a worker's current device is its stream's device
  CHECK(w.alloc_device == 1);
  CHECK(w.self_sync == ACL_ERROR_RT_STREAM_CONTEXT);
  CHECK(w.other_enqueue == ACL_SUCCESS);
  CHECK(n == 3);
  CHECK(aclsimOnWorkerThread() == 0);

  // Async memset + copies, in stream order.
  void* d = nullptr;
  CHECK_OK(aclrtMalloc(&d, 1 << 20, ACL_MEM_MALLOC_HUGE_FIRST));
  std::vector<unsigned char> host(1 << 20, 0), back(1 << 20, 1);
  uint64_t h2d = aclsimCopiedBytes(ACL_MEMCPY_HOST_TO_DEVICE);
  uint64_t d2h = aclsimCopiedBytes(ACL_MEMCPY_DEVICE_TO_HOST);
  CHECK_OK(aclsimLaunchKernel(other, SleepKernel, (void*)(intptr_t)30, "sleep"));
  CHECK_OK(aclrtMemsetAsync(d, 1 << 20, 0x11, 1 << 20, other));
  for (size_t i = 0; i < host.size(); ++i) host[i] = (unsigned char)(i * 7);
  CHECK_OK(aclrtMemcpyAsync(d, 1 << 20, host.data(), 4096, ACL_MEMCPY_HOST_TO_DEVICE, other));
  CHECK_OK(aclrtMemcpyAsync(back.data(), back.size(), d, 1 << 20, ACL_MEMCPY_DEVICE_TO_HOST, other));
  aclrtStreamStatus st;
  CHECK_OK(aclrtStreamQuery(other, &st));
  CHECK(st == ACL_STREAM_STATUS_NOT_READY);  // the sleep is still ahead of the copies
  CHECK_OK(aclrtSynchronizeStream(other));
  bool ok = true;
  for (size_t i = 0; i < 4096; ++i) ok &= back[i] == (unsigned char)(i * 7);
  for (size_t i = 4096; i < back.size(); ++i) ok &= back[i] == 0x11;
  CHECK(ok);
  CHECK(aclsimCopiedBytes(ACL_MEMCPY_HOST_TO_DEVICE) - h2d == 4096);
  CHECK(aclsimCopiedBytes(ACL_MEMCPY_DEVICE_TO_HOST) - d2h == (1 << 20));
  CHECK_RC(aclrtMemcpyAsync(host.data(), 16, back.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE, other),
           ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtFree(d));

  CHECK_RC(aclrtDestroyStream(nullptr), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtDestroyStream(aclsimDefaultStream(0)), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclsimLaunchKernel(other, nullptr, nullptr, "x"), ACL_ERROR_INVALID_PARAM);

  // Destroy drains the queue first.
  std::atomic<int> m{0};
  for (int i = 0; i < 20; ++i) {
    CHECK_OK(aclsimLaunchKernel(other, SleepKernel, (void*)(intptr_t)2, "sleep"));
    CHECK_OK(aclsimLaunchKernel(other, Count, &m, "count"));
  }
  CHECK_OK(aclrtDestroyStream(other));
  CHECK(m == 20);
}

// ---- aclFinalize joins the workers; streams keep working afterwards -------------------
static void TestFinalizeRestart() {
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  std::atomic<int> n{0};
  CHECK_OK(aclsimLaunchKernel(s, SleepKernel, (void*)(intptr_t)50, "sleep"));
  CHECK_OK(aclsimLaunchKernel(s, Count, &n, "count"));
  CHECK_OK(aclFinalize());  // drains
  CHECK(n == 1);
  CHECK_OK(aclsimLaunchKernel(s, Count, &n, "count"));  // a new worker starts
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK(n == 2);
  CHECK_OK(aclrtDestroyStream(s));
}

// ---- concurrency ---------------------------------------------------------------------
static void TestConcurrent() {
  const int kThreads = 4, kKernels = 10000;
  std::atomic<int> total{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      if (aclrtSetDevice(t % 2) != ACL_SUCCESS) ++failures;
      aclrtStream s[2] = {nullptr, nullptr};
      for (auto& x : s)
        if (aclrtCreateStream(&x) != ACL_SUCCESS) ++failures;
      std::atomic<int> mine{0};
      std::vector<void*> live;
      for (int i = 0; i < kKernels; ++i) {
        if (aclsimLaunchKernel(s[i % 2], Count, &mine, "count") != ACL_SUCCESS) ++failures;
        if (i % 500 == 0) {
          aclrtEvent ev;
          aclrtCreateEvent(&ev);
          aclrtRecordEvent(ev, s[0]);
          aclrtStreamWaitEvent(s[1], ev);
          aclrtDestroyEvent(ev);
        }
        if (i % 50 == 0) {
          void* p = nullptr;
          if (aclrtMalloc(&p, 1 + (i % 7) * 1000000, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS)
            ++failures;
          else
            live.push_back(p);
          if (live.size() > 4) {
            if (aclrtFree(live.front()) != ACL_SUCCESS) ++failures;
            live.erase(live.begin());
          }
        }
      }
      for (auto& x : s) {
        if (aclrtSynchronizeStream(x) != ACL_SUCCESS) ++failures;
        if (aclrtDestroyStream(x) != ACL_SUCCESS) ++failures;
      }
      for (void* p : live)
        if (aclrtFree(p) != ACL_SUCCESS) ++failures;
      if (mine != kKernels) ++failures;
      total += mine;
    });
  }
  for (auto& th : ts) th.join();
  CHECK(failures == 0);
  CHECK(total == kThreads * kKernels);
  size_t f = 0, tot = 0;
  CHECK_OK(aclrtGetMemInfo(ACL_HBM_MEM, &f, &tot));
  CHECK(f == tot);
}

// Profiling: tasks launched while recording are recorded when they have run (launch <=
// start <= end, the launching thread's tag), with their stream's id; nothing otherwise.
static void TestProfiler() {
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  CHECK_EQ(aclsimProfilerDrain(nullptr, 0, nullptr), 0u);
  CHECK_OK(aclsimLaunchKernel(s, EmptyKernel, nullptr, "before"));  // not recorded
  CHECK_OK(aclsimProfilerEnable(1));
  aclsimProfilerSetLaunchTag(42);
  CHECK_OK(aclsimLaunchKernel(s, SleepKernel, (void*)(intptr_t)20, "sleep"));
  char buf[64] = {};
  CHECK_OK(aclrtMemcpyAsync(buf, 32, buf + 32, 32, ACL_MEMCPY_HOST_TO_HOST, s));
  CHECK_OK(aclsimProfilerRecord("inline", 0, aclsimStreamId(s), aclsimNowNs(), aclsimNowNs()));
  aclsimProfilerSetLaunchTag(0);
  CHECK_OK(aclsimProfilerEnable(0));
  CHECK_OK(aclsimLaunchKernel(s, EmptyKernel, nullptr, "after"));  // not recorded
  CHECK_OK(aclrtSynchronizeStream(s));
  aclsimProfRecord r[8];
  uint64_t dropped = 7;
  const size_t n = aclsimProfilerDrain(r, 8, &dropped);
  CHECK_EQ(n, 3u);
  CHECK_EQ(dropped, 0u);
  CHECK(strcmp(r[0].name, "inline") == 0 && r[0].kind == ACLSIM_PROF_KERNEL && r[0].host_op == 42);
  const aclsimProfRecord& k = r[1].kind == ACLSIM_PROF_KERNEL ? r[1] : r[2];
  const aclsimProfRecord& c = r[1].kind == ACLSIM_PROF_KERNEL ? r[2] : r[1];
  CHECK(strcmp(k.name, "sleep") == 0 && k.host_op == 42 && k.stream == aclsimStreamId(s));
  CHECK(k.launch_ns <= k.start_ns && k.end_ns - k.start_ns >= 20 * 1000000);
  CHECK(c.kind == ACLSIM_PROF_MEMCPY && c.bytes == 32 && c.start_ns >= k.end_ns);
  CHECK(k.correlation != 0 && c.correlation != k.correlation);
  CHECK_EQ(aclsimProfilerDrain(nullptr, 0, nullptr), 0u);  // drained
  CHECK_OK(aclrtDestroyStream(s));
}

int main() {
  TestOrdering();
  TestAsync();
  TestCrossStreamWait();
  TestElapsed();
  TestKernelErrors();
  TestWorkerSide();
  TestFinalizeRestart();
  TestConcurrent();
  TestProfiler();
  // Leave some work queued: the process must still exit cleanly.
  for (int i = 0; i < 100; ++i) aclsimLaunchKernel(nullptr, EmptyKernel, nullptr, "tail");
  return Finish();
}
