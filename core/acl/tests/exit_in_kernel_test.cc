// exit() called from inside a kernel: the exit handler runs on that worker thread; it
// must drain and join the other workers, not wait for (or join) itself.
#include <chrono>
#include <thread>

#include "check.h"

static std::atomic<int> g_ran{0};

static int Count(void*, char*, size_t) {
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  g_ran.fetch_add(1);
  return 0;
}
static int CallExit(void*, char*, size_t) { exit(0); }

static void AfterDrain() {
  CHECK(g_ran.load() == 100);  // the other stream was drained
  CHECK(aclsimOnWorkerThread() == 1);
  printf("%d passed, %d failed\n", g_passed.load(), g_failed.load());
  fflush(stdout);
  if (g_failed.load() != 0) _exit(1);
}

int main() {
  atexit(AfterDrain);
  aclrtStream a, b;
  REQUIRE(aclrtCreateStream(&a) == ACL_SUCCESS);
  REQUIRE(aclrtCreateStream(&b) == ACL_SUCCESS);
  for (int i = 0; i < 100; ++i) aclsimLaunchKernel(b, Count, nullptr, "count");
  aclsimLaunchKernel(a, CallExit, nullptr, "exit");
  aclrtSynchronizeStream(a);  // never returns: the kernel exits the process
  fprintf(stderr, "unreachable\n");
  return 1;
}
