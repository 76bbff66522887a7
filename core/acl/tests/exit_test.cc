// Process exit with work still queued on several streams (one of them waiting on an
// event): the exit handler drains and joins every worker. A check registered with
// atexit() before the first API call runs after the simulator's own handler, so it
// sees the drained state. "terminate called without an active exception" or a hang
// would fail the test.
#include <chrono>
#include <thread>

#include "check.h"

static std::atomic<int> g_ran{0};
static const int kExpected = 3 * 1000 + 2;

static int Count(void*, char*, size_t) {
  g_ran.fetch_add(1);
  return 0;
}
static int Slow(void*, char*, size_t) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  g_ran.fetch_add(1);
  return 0;
}

static void AfterDrain() {
  CHECK(g_ran.load() == kExpected);
  CHECK(aclsimOnWorkerThread() == 0);
  // The API still works after the drain: tasks then run inline, in order.
  std::atomic<int> before{g_ran.load()};
  CHECK(aclsimLaunchKernel(nullptr, Count, nullptr, "late") == ACL_SUCCESS);
  CHECK(aclrtSynchronizeStream(nullptr) == ACL_SUCCESS);
  CHECK(g_ran.load() == before + 1);
  fflush(stderr);
  printf("%d passed, %d failed\n", g_passed.load(), g_failed.load());
  fflush(stdout);
  if (g_failed.load() != 0) _exit(1);
}

int main() {
  atexit(AfterDrain);  // registered before the simulator initialises
  aclrtStream s[3];
  for (auto& x : s) CHECK(aclrtCreateStream(&x) == ACL_SUCCESS);
  aclrtEvent ev;
  CHECK(aclrtCreateEvent(&ev) == ACL_SUCCESS);
  CHECK(aclsimLaunchKernel(s[0], Slow, nullptr, "slow") == ACL_SUCCESS);
  CHECK(aclrtRecordEvent(ev, s[0]) == ACL_SUCCESS);
  CHECK(aclrtStreamWaitEvent(s[1], ev) == ACL_SUCCESS);
  CHECK(aclsimLaunchKernel(s[2], Slow, nullptr, "slow") == ACL_SUCCESS);
  for (int i = 0; i < 1000; ++i)
    for (auto& x : s) aclsimLaunchKernel(x, Count, nullptr, "count");
  CHECK(g_ran.load() < kExpected);  // still queued behind the slow kernels
  return 0;
}
