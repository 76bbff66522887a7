// Profiling: while enabled, tasks are stamped when enqueued (a correlation id, the
// launching thread and time) and recorded when a stream has run them (start, end), so a
// profiler above can put every kernel and copy on a device timeline and link it to the
// host operator that launched it, as CANN's msprof does for a real device. Kernels run
// inline on the calling thread (TASK_QUEUE_ENABLE=0) are recorded by the layer that runs
// them (aclsimProfilerRecord).
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "internal.h"

using namespace aclsim;

namespace {

// Records beyond this many are dropped (and counted): ~100 bytes each.
constexpr size_t kMaxRecords = size_t(1) << 20;

struct Recorder {
  std::atomic<bool> on{false};
  std::atomic<uint64_t> next_correlation{1};
  std::mutex mu;
  std::vector<aclsimProfRecord> records;
  uint64_t dropped = 0;

  void Add(const aclsimProfRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (records.size() >= kMaxRecords) {
      ++dropped;
      return;
    }
    records.push_back(r);
  }
};

Recorder& R() {
  static Recorder* r = new Recorder();  // never destroyed: usable from exiting workers
  return *r;
}

thread_local uint64_t tls_launch_tag = 0;

int32_t ThreadId() {
  thread_local const int32_t tid = static_cast<int32_t>(syscall(SYS_gettid));
  return tid;
}

bool Recorded(uint8_t kind) {
  return kind == kTaskKernel || kind == kTaskMemcpy || kind == kTaskMemset || kind == kTaskModel ||
         kind == kTaskCallback;
}

}  // namespace

namespace aclsim {

bool ProfilerOn() { return R().on.load(std::memory_order_relaxed); }

void ProfilerStampLaunch(Task& t) {
  if (!Recorded(t.kind)) return;
  t.correlation = R().next_correlation.fetch_add(1, std::memory_order_relaxed);
  t.launch_ns = NowNs();
  t.launch_tid = ThreadId();
  t.launch_tag = tls_launch_tag;
}

void ProfilerRecordTask(const Task& t, int device, int stream, int64_t start_ns, int64_t end_ns) {
  aclsimProfRecord r{};
  if (t.kind == kTaskKernel || t.kind == kTaskModel) std::memcpy(r.name, t.name, sizeof(r.name));
  r.name[sizeof(r.name) - 1] = '\0';
  r.kind = t.kind == kTaskKernel ? ACLSIM_PROF_KERNEL
           : t.kind == kTaskMemcpy ? ACLSIM_PROF_MEMCPY
           : t.kind == kTaskMemset ? ACLSIM_PROF_MEMSET
           : t.kind == kTaskModel ? ACLSIM_PROF_GRAPH
                                  : ACLSIM_PROF_CALLBACK;
  r.device = device;
  r.stream = stream;
  r.correlation = t.correlation;
  r.launch_tid = t.launch_tid;
  r.launch_ns = t.launch_ns;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.bytes = (t.kind == kTaskMemcpy || t.kind == kTaskMemset) ? t.n : 0;
  r.host_op = t.launch_tag;
  R().Add(r);
}

}  // namespace aclsim

extern "C" {

aclError aclsimProfilerEnable(int enable) {
  R().on.store(enable != 0, std::memory_order_relaxed);
  return ACL_SUCCESS;
}

int aclsimProfilerEnabled(void) { return ProfilerOn() ? 1 : 0; }

void aclsimProfilerSetLaunchTag(uint64_t tag) { tls_launch_tag = tag; }

int64_t aclsimNowNs(void) { return NowNs(); }

aclError aclsimProfilerRecord(const char* name, int32_t deviceId, int32_t stream, int64_t startNs,
                              int64_t endNs) {
  if (name == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclsimProfilerRecord: name is null");
  if (!ProfilerOn()) return ACL_SUCCESS;
  aclsimProfRecord r{};
  std::strncpy(r.name, name, sizeof(r.name) - 1);
  r.kind = ACLSIM_PROF_KERNEL;
  r.device = deviceId;
  r.stream = stream;
  r.correlation = R().next_correlation.fetch_add(1, std::memory_order_relaxed);
  r.launch_tid = ThreadId();
  r.launch_ns = startNs;
  r.start_ns = startNs;
  r.end_ns = endNs;
  r.host_op = tls_launch_tag;
  R().Add(r);
  return ACL_SUCCESS;
}

size_t aclsimProfilerDrain(aclsimProfRecord* out, size_t max, uint64_t* dropped) {
  Recorder& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  if (dropped) {
    *dropped = r.dropped;
    r.dropped = 0;
  }
  if (out == nullptr) return r.records.size();
  const size_t n = std::min(max, r.records.size());
  std::memcpy(out, r.records.data(), n * sizeof(aclsimProfRecord));
  r.records.erase(r.records.begin(), r.records.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

}  // extern "C"
