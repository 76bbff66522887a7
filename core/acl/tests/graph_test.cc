// Stream capture into model runtime instances (aclmdlRI*): record, replay, misuse.
#include <stdint.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "check.h"

static int AddKernel(void* p, char*, size_t) {
  auto* v = static_cast<std::vector<int>*>(p);
  v->push_back(static_cast<int>(v->size()));
  return 0;
}

static std::atomic<int> g_count{0};
static int CountKernel(void*, char*, size_t) {
  g_count.fetch_add(1);
  return 0;
}

static int FailKernel(void*, char* err, size_t len) {
  snprintf(err, len, "boom");
  return 1;
}

static aclrtStream NewStream() {
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  REQUIRE(s);
  return s;
}

static void TestCaptureReplay() {
  aclrtStream s = NewStream();
  std::vector<int> out;
  aclmdlRICaptureStatus st;
  aclmdlRI during = nullptr;
  CHECK_OK(aclmdlRICaptureGetInfo(s, &st, &during));
  CHECK(st == ACL_MODEL_RI_CAPTURE_STATUS_NONE && during == nullptr);
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  for (int i = 0; i < 5; ++i) CHECK_OK(aclsimLaunchKernel(s, AddKernel, &out, "add"));
  CHECK_OK(aclmdlRICaptureGetInfo(s, &st, &during));
  CHECK(st == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE && during != nullptr);
  CHECK(out.empty());  // nothing ran
  aclmdlRI model = nullptr;
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK(model == during);
  CHECK(out.empty());
  size_t n = 0;
  uint64_t id = 0;
  CHECK_OK(aclsimModelRIInfo(model, &n, &id));
  CHECK_EQ(n, 5u);
  CHECK(id > 0);
  CHECK_OK(aclmdlRICaptureGetInfo(s, &st, nullptr));
  CHECK(st == ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  // Replays on the capture stream and on another stream, in order.
  for (int r = 0; r < 3; ++r) CHECK_OK(aclmdlRIExecuteAsync(model, s));
  CHECK_OK(aclrtSynchronizeStream(s));
  aclrtStream other = NewStream();
  CHECK_OK(aclmdlRIExecuteAsync(model, other));
  CHECK_OK(aclrtSynchronizeStream(other));
  CHECK_EQ(out.size(), 20u);
  bool ordered = true;
  for (size_t i = 0; i < out.size(); ++i) ordered &= out[i] == static_cast<int>(i);
  CHECK(ordered);
  CHECK_OK(aclmdlRIExecute(model, -1));
  CHECK_EQ(out.size(), 25u);
  CHECK_RC(aclmdlRIExecute(model, 10), ACL_ERROR_INVALID_PARAM);
  // After the capture the stream runs its tasks again.
  CHECK_OK(aclsimLaunchKernel(s, AddKernel, &out, "add"));
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_EQ(out.size(), 26u);
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtDestroyStream(other));
  CHECK_OK(aclrtDestroyStream(s));
}

static void TestMisuse() {
  aclrtStream s = NewStream();
  CHECK_RC(aclmdlRICaptureBegin(nullptr, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclmdlRICaptureBegin(s, static_cast<aclmdlRICaptureMode>(7)), ACL_ERROR_INVALID_PARAM);
  aclmdlRI model = nullptr;
  CHECK_RC(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_RC(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_RT_STREAM_CAPTURED);
  CHECK_RC(aclrtDestroyStream(s), ACL_ERROR_RT_STREAM_CAPTURED);  // refused, the capture goes on
  CHECK(strstr(aclGetRecentErrMsg(), "aclrtDestroyStream") != nullptr);
  CHECK_RC(aclsimCaptureInvalidate(s, "test"), ACL_SUCCESS);
  CHECK_RC(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  CHECK(model == nullptr);
  // Bad model handles.
  CHECK_RC(aclmdlRIExecuteAsync(nullptr, s), ACL_ERROR_INVALID_PARAM);
  int junk[16] = {0};
  CHECK_RC(aclmdlRIExecuteAsync(junk, s), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclmdlRIDestroy(nullptr), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclmdlRIDebugPrint(junk), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclsimLaunchKernel(s, CountKernel, nullptr, "count"));
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_RC(aclmdlRIDestroy(model), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclmdlRIExecuteAsync(model, s), ACL_ERROR_INVALID_PARAM);
  // The default stream cannot capture.
  CHECK_RC(aclmdlRICaptureBegin(aclsimDefaultStream(0), ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_INVALID_PARAM);
  aclmdlRICaptureMode mode = static_cast<aclmdlRICaptureMode>(9);
  CHECK_RC(aclmdlRICaptureThreadExchangeMode(&mode), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtDestroyStream(s));
}

// Synchronising a capturing stream or its device fails, and the capture goes on (as
// Ascend's runtime; CUDA's would be invalidated).
static void TestSyncRefused() {
  aclrtStream s = NewStream();
  aclmdlRI model = nullptr;
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclsimLaunchKernel(s, CountKernel, nullptr, "count"));
  CHECK_RC(aclrtSynchronizeStream(s), ACL_ERROR_RT_STREAM_CAPTURED);
  CHECK(strstr(aclGetRecentErrMsg(), "operation not permitted when stream is capturing") != nullptr);
  aclmdlRICaptureStatus st;
  CHECK_OK(aclmdlRICaptureGetInfo(s, &st, nullptr));
  CHECK(st == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  CHECK_OK(aclsimLaunchKernel(s, CountKernel, nullptr, "count"));
  aclrtStreamStatus ss;
  CHECK_RC(aclrtStreamQuery(s, &ss), ACL_ERROR_RT_STREAM_CAPTURED);
  CHECK_RC(aclrtSynchronizeDevice(), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  g_count = 0;
  CHECK_OK(aclmdlRIExecuteAsync(model, s));
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK(g_count == 2);  // both captured kernels, none lost to the refused calls
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtSynchronizeDevice());  // fine again
  CHECK_RC(aclsimCaptureInvalidate(s, "x"), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclsimCaptureInvalidate(s, "layer above: op X cannot be captured"));
  CHECK_RC(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  CHECK(strstr(aclGetRecentErrMsg(), "op X cannot be captured") != nullptr);
  CHECK_OK(aclrtDestroyStream(s));
}

// Unsafe (synchronous) copies: judged by the capture mode and the thread's mode.
static void TestCaptureModes() {
  aclrtStream s = NewStream();
  void* dev = nullptr;
  CHECK_OK(aclrtMalloc(&dev, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
  char host[64] = {1};
  aclmdlRI model = nullptr;
  auto copy_on_thread = [&] {
    aclError rc;
    std::thread t([&] { rc = aclrtMemcpy(dev, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE); });
    t.join();
    return rc;
  };
  // GLOBAL: fails on any thread.
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_RC(copy_on_thread(), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  CHECK_RC(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  // A thread in RELAXED mode may.
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
  CHECK_OK(aclmdlRICaptureThreadExchangeMode(&mode));
  CHECK(mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL);
  CHECK_OK(aclrtMemcpy(dev, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE));
  CHECK_OK(aclmdlRICaptureThreadExchangeMode(&mode));
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK_OK(aclmdlRIDestroy(model));
  // THREAD_LOCAL: only the capturing thread is restricted.
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL));
  CHECK_OK(copy_on_thread());
  CHECK_RC(aclrtMemset(dev, 64, 0, 64), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  CHECK_RC(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  // RELAXED: allowed everywhere.
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
  CHECK_OK(aclrtMemset(dev, 64, 0, 64));
  CHECK_OK(copy_on_thread());
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtFree(dev));
  CHECK_OK(aclrtDestroyStream(s));
}

// Async copies and memsets are recorded; replays repeat them.
static void TestCopiesAndEvents() {
  aclrtStream s = NewStream();
  void* dev = nullptr;
  CHECK_OK(aclrtMalloc(&dev, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
  char* d = static_cast<char*>(dev);
  aclrtEvent start = nullptr, end = nullptr;
  CHECK_OK(aclrtCreateEvent(&start));
  CHECK_OK(aclrtCreateEvent(&end));
  aclmdlRI model = nullptr;
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclrtRecordEvent(start, s));
  CHECK_OK(aclrtMemsetAsync(d, 64, 7, 64, s));
  CHECK_OK(aclrtMemcpyAsync(d + 64, 64, d, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
  CHECK_OK(aclrtRecordEvent(end, s));
  aclrtEventRecordedStatus es;
  CHECK_RC(aclrtQueryEventStatus(end, &es), ACL_ERROR_RT_EVENT_CAPTURED);  // refused
  CHECK_OK(aclsimCaptureInvalidate(s, "test"));
  CHECK_RC(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);

  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclrtRecordEvent(start, s));
  CHECK_OK(aclrtMemsetAsync(d, 64, 7, 64, s));
  CHECK_OK(aclrtMemcpyAsync(d + 64, 64, d, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
  CHECK_OK(aclsimLaunchKernel(s, CountKernel, nullptr, "count"));
  CHECK_OK(aclrtRecordEvent(end, s));
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK(d[64] != 7);  // nothing ran
  for (int r = 0; r < 2; ++r) {
    memset(d, 0, 128);
    g_count = 0;
    CHECK_OK(aclmdlRIExecuteAsync(model, s));
    CHECK_OK(aclrtSynchronizeEvent(end));  // the replay's record, known at enqueue time
    CHECK_EQ(d[64], 7);
    CHECK_EQ(d[127], 7);
    CHECK_EQ(g_count.load(), 1);
    float ms = -1;
    CHECK_OK(aclrtEventElapsedTime(&ms, start, end));
    CHECK(ms >= 0);
  }
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtDestroyEvent(start));
  CHECK_OK(aclrtDestroyEvent(end));
  CHECK_OK(aclrtFree(dev));
  CHECK_OK(aclrtDestroyStream(s));
}

// A stream waiting for an event recorded in the capture joins it; its tasks replay in
// host order with the origin's.
static void TestForkJoin() {
  aclrtStream s1 = NewStream(), s2 = NewStream();
  aclrtEvent fork = nullptr, join = nullptr;
  CHECK_OK(aclrtCreateEvent(&fork));
  CHECK_OK(aclrtCreateEvent(&join));
  std::vector<int> out;
  aclmdlRI model = nullptr;
  CHECK_OK(aclmdlRICaptureBegin(s1, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclsimLaunchKernel(s1, AddKernel, &out, "a"));
  CHECK_OK(aclrtRecordEvent(fork, s1));
  CHECK_OK(aclrtStreamWaitEvent(s2, fork));
  aclmdlRICaptureStatus st;
  aclmdlRI m1 = nullptr, m2 = nullptr;
  CHECK_OK(aclmdlRICaptureGetInfo(s1, &st, &m1));
  CHECK_OK(aclmdlRICaptureGetInfo(s2, &st, &m2));
  CHECK(st == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE && m1 == m2);
  CHECK_OK(aclsimLaunchKernel(s2, AddKernel, &out, "b"));
  CHECK_OK(aclrtRecordEvent(join, s2));
  CHECK_OK(aclrtStreamWaitEvent(s1, join));
  CHECK_OK(aclsimLaunchKernel(s1, AddKernel, &out, "c"));
  CHECK_RC(aclmdlRICaptureEnd(s2, &model), ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED);
  CHECK_OK(aclmdlRICaptureEnd(s1, &model));
  CHECK_OK(aclmdlRICaptureGetInfo(s2, &st, nullptr));
  CHECK(st == ACL_MODEL_RI_CAPTURE_STATUS_NONE);  // left with the origin
  size_t n = 0;
  CHECK_OK(aclsimModelRIInfo(model, &n, nullptr));
  CHECK_EQ(n, 5u);  // a, record, b, record, c
  CHECK(out.empty());
  CHECK_OK(aclmdlRIExecuteAsync(model, s2));
  CHECK_OK(aclrtSynchronizeStream(s2));
  CHECK_EQ(out.size(), 3u);
  // The default stream cannot join a capture.
  CHECK_OK(aclmdlRICaptureBegin(s1, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclrtRecordEvent(fork, s1));
  CHECK_RC(aclrtStreamWaitEvent(nullptr, fork), ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT);
  aclmdlRI invalid = nullptr;
  CHECK_RC(aclmdlRICaptureEnd(s1, &invalid), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  // A capturing stream cannot wait for unfinished work outside the capture.
  CHECK_OK(aclsimLaunchKernel(s2, [](void*, char*, size_t) {
             std::this_thread::sleep_for(std::chrono::milliseconds(200));
             return 0;
           }, nullptr, "sleep"));
  CHECK_OK(aclrtRecordEvent(fork, s2));
  aclmdlRI bad = nullptr;
  CHECK_OK(aclmdlRICaptureBegin(s1, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_RC(aclrtStreamWaitEvent(s1, fork), ACL_ERROR_RT_CAPTURE_DEPENDENCY);
  CHECK_RC(aclmdlRICaptureEnd(s1, &bad), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  CHECK_OK(aclrtSynchronizeStream(s2));
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtDestroyEvent(fork));
  CHECK_OK(aclrtDestroyEvent(join));
  CHECK_OK(aclrtDestroyStream(s1));
  CHECK_OK(aclrtDestroyStream(s2));
}

// Destroy callbacks run once the handle is gone and queued executions finished; a
// failing recorded kernel fails the replaying stream's synchronisation.
static std::atomic<int> g_destroyed{0};
static void OnDestroy(void* p) { g_destroyed.fetch_add(*static_cast<int*>(p)); }

static void TestLifetimeAndErrors() {
  aclrtStream s = NewStream();
  aclmdlRI model = nullptr;
  int weight = 1;
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclsimLaunchKernel(s, [](void*, char*, size_t) {
             std::this_thread::sleep_for(std::chrono::milliseconds(100));
             return 0;
           }, nullptr, "sleep"));
  aclmdlRI capturing = nullptr;
  aclmdlRICaptureStatus st;
  CHECK_OK(aclmdlRICaptureGetInfo(s, &st, &capturing));
  CHECK_OK(aclsimModelRIAddDestroyCallback(capturing, OnDestroy, &weight));
  CHECK_RC(aclmdlRIDestroy(capturing), ACL_ERROR_INVALID_PARAM);  // still capturing
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK_OK(aclmdlRIExecuteAsync(model, s));
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_EQ(g_destroyed.load(), 0);  // the queued execution still holds it
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_EQ(g_destroyed.load(), 1);

  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  CHECK_OK(aclsimLaunchKernel(s, FailKernel, nullptr, "failing_op"));
  CHECK_OK(aclmdlRICaptureEnd(s, &model));
  CHECK_OK(aclmdlRIExecuteAsync(model, s));
  CHECK_RC(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
  CHECK(strstr(aclGetRecentErrMsg(), "failing_op: boom") != nullptr);
  CHECK_OK(aclrtSynchronizeStream(s));
  char path[] = "/tmp/graph_test_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  CHECK_OK(aclmdlRIDebugJsonPrint(model, path, 0));
  FILE* f = fopen(path, "r");
  char buf[512] = {0};
  size_t got = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
  if (f) fclose(f);
  unlink(path);
  CHECK(got > 0 && strstr(buf, "failing_op") != nullptr);
  CHECK_RC(aclmdlRIDebugJsonPrint(model, "", 0), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtDestroyStream(s));
}

// A kernel writing its parameter (userData: a Param) to a slot: what an update replaces.
struct Param {
  int* slot;
  int value;
};
static int WriteParam(void* p, char*, size_t) {
  auto* param = static_cast<Param*>(p);
  *param->slot = param->value;
  return 0;
}
static std::atomic<int> g_released{0};
static void ReleaseParam(void* p) {
  g_released.fetch_add(1);
  delete static_cast<Param*>(p);
}

// Task groups, their updates, and external events ordering a replay after an update.
static void TestTaskUpdate() {
  aclrtStream s = NewStream();
  aclrtStream upd = NewStream();
  aclrtEvent ext = nullptr;
  CHECK_OK(aclrtCreateEventWithFlag(&ext, ACL_EVENT_EXTERNAL));
  int slot = 0, before = 0;
  aclrtTaskGrp group = nullptr;
  CHECK_RC(aclmdlRICaptureTaskGrpBegin(s), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  CHECK_OK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  aclmdlRI capturing = nullptr;
  aclmdlRICaptureStatus st;
  CHECK_OK(aclmdlRICaptureGetInfo(s, &st, &capturing));
  auto* p0 = new Param{&before, 1};
  CHECK_OK(aclsimLaunchKernel(s, WriteParam, p0, "outside_group"));
  CHECK_OK(aclsimModelRIAddDestroyCallback(capturing, ReleaseParam, p0));
  CHECK_OK(aclrtStreamWaitEvent(s, ext));  // recorded: waits at each replay
  CHECK_OK(aclrtResetEvent(ext, s));
  CHECK_RC(aclmdlRICaptureTaskGrpEnd(s, &group), ACL_ERROR_INVALID_PARAM);  // none open
  CHECK_OK(aclmdlRICaptureTaskGrpBegin(s));
  CHECK_RC(aclmdlRICaptureTaskGrpBegin(s), ACL_ERROR_INVALID_PARAM);  // no nesting
  auto* p1 = new Param{&slot, 10};
  CHECK_OK(aclsimLaunchKernel(s, WriteParam, p1, "grouped"));
  CHECK_OK(aclsimModelRIAddDestroyCallback(capturing, ReleaseParam, p1));
  CHECK_RC(aclmdlRICaptureTaskUpdateBegin(upd, capturing), ACL_ERROR_INVALID_PARAM);  // not a group
  CHECK_OK(aclmdlRICaptureTaskGrpEnd(s, &group));
  CHECK(group != nullptr);
  CHECK_RC(aclmdlRICaptureTaskUpdateBegin(upd, group), ACL_ERROR_INVALID_PARAM);  // still capturing
  aclmdlRI model = nullptr;
  CHECK_OK(aclmdlRICaptureEnd(s, &model));

  // A replay waits for the flag: nothing runs before the event is recorded.
  CHECK_OK(aclmdlRIExecuteAsync(model, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_EQ(slot, 0);  // the group waits behind the external event
  CHECK_OK(aclrtRecordEvent(ext, upd));
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_EQ(before, 1);
  CHECK_EQ(slot, 10);

  // An update: the group's kernel with a new parameter, applied in the update stream's order.
  CHECK_OK(aclmdlRICaptureTaskUpdateBegin(upd, group));
  aclmdlRI updating = nullptr;
  CHECK_OK(aclsimStreamTaskUpdateModel(upd, &updating));
  CHECK(updating == model);
  CHECK_RC(aclrtRecordEvent(ext, upd), ACL_ERROR_INVALID_PARAM);  // event tasks refused...
  CHECK_RC(aclmdlRICaptureTaskUpdateBegin(upd, group), ACL_ERROR_INVALID_PARAM);  // already updating
  CHECK_RC(aclmdlRICaptureTaskUpdateEnd(upd), ACL_ERROR_INVALID_PARAM);  // ...and fail the update
  CHECK_EQ(g_released.load(), 0);
  CHECK_OK(aclmdlRICaptureTaskUpdateBegin(upd, group));
  auto* p2 = new Param{&slot, 20};
  CHECK_OK(aclsimLaunchKernel(upd, WriteParam, p2, "grouped"));
  CHECK_OK(aclsimModelRIAddDestroyCallback(model, ReleaseParam, p2));
  CHECK_OK(aclmdlRICaptureTaskUpdateEnd(upd));
  CHECK_OK(aclsimStreamTaskUpdateModel(upd, &updating));
  CHECK(updating == nullptr);
  CHECK_OK(aclrtRecordEvent(ext, upd));
  CHECK_OK(aclmdlRIExecuteAsync(model, s));
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_EQ(slot, 20);
  CHECK_EQ(g_released.load(), 1);  // the replaced kernel's parameter (no execution runs)

  // An update must launch as many tasks, of the same kinds, as the group holds.
  CHECK_OK(aclmdlRICaptureTaskUpdateBegin(upd, group));
  auto* p3 = new Param{&slot, 30};
  auto* p4 = new Param{&slot, 40};
  CHECK_OK(aclsimLaunchKernel(upd, WriteParam, p3, "grouped"));
  CHECK_OK(aclsimModelRIAddDestroyCallback(model, ReleaseParam, p3));
  CHECK_OK(aclsimLaunchKernel(upd, WriteParam, p4, "grouped"));
  CHECK_OK(aclsimModelRIAddDestroyCallback(model, ReleaseParam, p4));
  CHECK_RC(aclmdlRICaptureTaskUpdateEnd(upd), ACL_ERROR_INVALID_PARAM);
  CHECK(strstr(aclGetRecentErrMsg(), "recorded 2 tasks, the task group has 1") != nullptr);
  CHECK_EQ(g_released.load(), 3);  // the refused update's parameters
  CHECK_RC(aclmdlRICaptureTaskUpdateEnd(upd), ACL_ERROR_INVALID_PARAM);  // not updating
  CHECK_OK(aclrtRecordEvent(ext, upd));
  CHECK_OK(aclmdlRIExecuteAsync(model, s));
  CHECK_OK(aclrtSynchronizeStream(s));
  CHECK_EQ(slot, 20);  // unchanged

  CHECK_OK(aclmdlRIDestroy(model));
  CHECK_OK(aclrtSynchronizeStream(upd));
  CHECK_EQ(g_released.load(), 5);  // p0 and p2 with the model
  CHECK_RC(aclmdlRICaptureTaskUpdateBegin(upd, group), ACL_ERROR_INVALID_PARAM);  // stale handle
  CHECK_OK(aclrtDestroyEvent(ext));
  CHECK_OK(aclrtDestroyStream(upd));
  CHECK_OK(aclrtDestroyStream(s));
}

int main() {
  TestCaptureReplay();
  TestMisuse();
  TestSyncRefused();
  TestCaptureModes();
  TestCopiesAndEvents();
  TestForkJoin();
  TestLifetimeAndErrors();
  TestTaskUpdate();
  return Finish();
}
