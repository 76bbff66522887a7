// Enqueue cost of aclsimLaunchKernel and the sync round trip. Not a test (timings are
// never asserted); run: bazel run //core/acl:launch_bench [-- N]
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "check.h"

using Clock = std::chrono::steady_clock;

static double NsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

static int Empty(void*, char*, size_t) { return 0; }

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
};
static int WaitGate(void* p, char*, size_t) {
  auto* g = static_cast<Gate*>(p);
  std::unique_lock<std::mutex> lk(g->mu);
  g->cv.wait(lk, [&] { return g->open; });
  return 0;
}

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  aclrtStream s;
  if (aclrtCreateStream(&s) != ACL_SUCCESS) return 1;
  aclsimLaunchKernel(s, Empty, nullptr, "warmup");
  aclrtSynchronizeStream(s);

  // 1. Worker busy (blocked in a kernel): pure enqueue cost. The first burst also pays
  //    for fresh queue memory (page faults); the second reuses it.
  double busy[2], drain = 0;
  for (int rep = 0; rep < 2; ++rep) {
    Gate gate;
    aclsimLaunchKernel(s, WaitGate, &gate, "gate");
    auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) aclsimLaunchKernel(s, Empty, nullptr, "empty");
    busy[rep] = NsSince(t0) / n;
    auto t1 = Clock::now();
    {
      std::lock_guard<std::mutex> lk(gate.mu);
      gate.open = true;
    }
    gate.cv.notify_all();
    aclrtSynchronizeStream(s);
    drain = NsSince(t1) / n;
  }
  auto t0 = Clock::now();

  // 2. Free running: worker consumes while the host enqueues.
  t0 = Clock::now();
  for (long i = 0; i < n; ++i) aclsimLaunchKernel(s, Empty, nullptr, "empty");
  double free_enq = NsSince(t0) / n;
  aclrtSynchronizeStream(s);
  double free_total = NsSince(t0) / n;

  // 3. Round trip: launch one empty kernel and synchronise, from an idle worker.
  long m = n / 100 > 1000 ? n / 100 : 1000;
  t0 = Clock::now();
  for (long i = 0; i < m; ++i) {
    aclsimLaunchKernel(s, Empty, nullptr, "empty");
    aclrtSynchronizeStream(s);
  }
  double rt = NsSince(t0) / m;

  // 4. Worker asleep at each launch (host busy ~5 us between launches): each launch
  //    has to wake the worker.
  long k = m;
  double asleep = 0;
  for (long i = 0; i < k; ++i) {
    auto w = Clock::now();
    while (NsSince(w) < 5000) {
    }
    auto a = Clock::now();
    aclsimLaunchKernel(s, Empty, nullptr, "empty");
    asleep += NsSince(a);
  }
  aclrtSynchronizeStream(s);
  asleep /= k;

  // 5. Sync of an already idle stream.
  t0 = Clock::now();
  for (long i = 0; i < m; ++i) aclrtSynchronizeStream(s);
  double idle = NsSince(t0) / m;

  printf("launches: %ld\n", n);
  printf("enqueue, worker busy:        %8.1f ns/launch (first burst: %.1f)\n", busy[1],
         busy[0]);
  printf("worker drain (empty kernel): %8.1f ns/task\n", drain);
  printf("enqueue, worker running:     %8.1f ns/launch (%.1f ns incl. final sync)\n", free_enq,
         free_total);
  printf("launch + sync round trip:    %8.1f ns (%ld iterations)\n", rt, m);
  printf("enqueue, worker asleep:      %8.1f ns/launch (wakes it; host works 5 us between)\n",
         asleep);
  printf("sync of an idle stream:      %8.1f ns\n", idle);
  aclrtDestroyStream(s);
  return 0;
}
