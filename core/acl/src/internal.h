// Internal declarations of the NPU simulator driver (not installed, not a public API).
//
// Layout:
//   device.cpp  - device profiles and environment, runtime singleton, per-device memory
//                 arena and sub-allocator, pinned host memory, error messages.
//   vmm.cpp     - virtual memory: reserved ranges, physical memory handles, mappings.
//   stream.cpp  - streams (task queue + worker thread), events, shutdown.
//   api.cpp     - the C functions of acl/acl_rt.h: argument checks and dispatch.
//   mdl_ri.cpp  - stream capture into model runtime instances (aclmdlRI*), replay.
//   smi.cpp     - the shared-memory registry of device usage per process (npu-smi).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "acl/acl_rt.h"

namespace aclsim {

// Allocation granularity and alignment of aclrtMalloc.
constexpr size_t kGranule = size_t(2) << 20;

// ---- errors ------------------------------------------------------------------------
// Sets the calling thread's recent error message (printf-style) and returns `code`.
aclError Fail(aclError code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void SetRecentError(const std::string& msg);
const char* RecentError();
// "1.50 GiB" style rendering for messages.
std::string FormatBytes(size_t bytes);

// ---- memory arena ----------------------------------------------------------------
// One per device: a memfd of the device capacity mapped MAP_SHARED|MAP_NORESERVE,
// created at the first allocation. Allocations are 2 MiB aligned and rounded up to
// 2 MiB; free ranges are kept in two indexes (by offset, for coalescing; by size, for
// best fit). Physical memory of aclrtMallocPhysical comes from the same arena (so it
// counts in the capacity) but is only reachable through aclrtMapMem: its arena
// addresses are not device pointers.
// True when this thread's last device allocation was refused because the host could not
// back it; `available` is what the host could still back then.
bool HostRefusedLastAllocation(size_t* available);

class Arena {
 public:
  void Init(int device, int physical, size_t capacity);
  // aclrtMalloc (physical = false) or aclrtMallocPhysical memory. Sets the recent error
  // on failure.
  aclError Allocate(size_t size, bool physical, void** out);
  aclError Free(void* ptr, bool physical);  // ptr must start an allocation of that kind
  // Maps the arena if not yet done. Returns ACL_SUCCESS or an allocation error.
  aclError EnsureMapped();
  // Cheap range check against the mapping (no lock).
  bool InMapping(const void* p) const {
    const char* b = base_.load(std::memory_order_acquire);
    return b != nullptr && static_cast<const char*>(p) >= b &&
           static_cast<const char*>(p) < b + map_size_;
  }
  // True when [p, p+len) lies inside one live aclrtMalloc allocation (len 0 = just p).
  bool InAllocation(const void* p, size_t len) const;
  size_t Used() const;
  char* base() const { return base_.load(std::memory_order_acquire); }
  size_t map_size() const { return map_size_; }
  int fd() const { return fd_; }

 private:
  void InsertFree(size_t off, size_t len);  // with coalescing; mu_ held
  void EraseFree(std::map<size_t, size_t>::iterator it);

  int device_ = 0;
  int physical_ = 0;  // the id npu-smi shows
  size_t capacity_ = 0;  // reported capacity
  size_t map_size_ = 0;  // capacity rounded down to the granule
  std::atomic<char*> base_{nullptr};
  int fd_ = -1;
  std::mutex create_mu_;
  mutable std::shared_mutex mu_;
  std::map<size_t, size_t> free_by_off_;               // offset -> length
  std::set<std::pair<size_t, size_t>> free_by_size_;   // (length, offset)
  struct Alloc {
    size_t len;  // rounded
    bool physical;
  };
  std::map<size_t, Alloc> allocs_;  // by offset
  size_t used_ = 0;
};

// ---- tasks, streams, events ---------------------------------------------------------
enum TaskKind : uint8_t {
  kTaskKernel,
  kTaskCallback,
  kTaskMemcpy,
  kTaskMemset,
  kTaskEventRecord,
  kTaskEventWait,
  kTaskEventReset,
  kTaskModel,  // one execution of a captured model (a: the execution)
};

constexpr size_t kTaskNameLen = 56;

// Small POD task; stored by value in the stream's queue (no allocation per task).
struct Task {
  uint8_t kind;
  int32_t value;     // memset byte
  void* fn;          // aclsimKernelFn / aclrtCallback
  void* a;           // userData / dst / Event*
  const void* b;     // src
  uint64_t n;        // byte count / event generation
  char name[kTaskNameLen];  // kernel name (copied, truncated)
  // Set at enqueue while the profiler records (profiler.cpp), else correlation 0.
  uint64_t correlation = 0;
  int64_t launch_ns = 0;
  int32_t launch_tid = 0;
  uint64_t launch_tag = 0;
};

// ---- profiler (profiler.cpp) ----------------------------------------------------------------
bool ProfilerOn();
// Stamps a task being enqueued (correlation id, launch time and thread) if recording.
void ProfilerStampLaunch(Task& t);
// Records a finished task that was stamped at launch.
void ProfilerRecordTask(const Task& t, int device, int stream, int64_t start_ns, int64_t end_ns);

// Fixed-size chunk of a stream's queue. Chunks are chained; the worker takes the whole
// chain at once and hands emptied chunks back to a small per-stream free list, so a
// steady stream of launches allocates nothing and a burst never copies queued tasks.
struct TaskBlock {
  static constexpr int kTasks = 256;
  int count = 0;
  TaskBlock* next = nullptr;
  Task tasks[kTasks];
};

struct Event;
struct ModelRI;
struct TaskGroup;
struct TaskUpdate;

struct Stream {
  static constexpr uint32_t kMagic = 0x5354524dU;  // "STRM"
  std::atomic<uint32_t> magic{kMagic};
  int device = 0;
  bool is_default = false;
  uint32_t priority = 0, flags = 0;
  // The capture this stream records into (it began it or joined it), or nullptr.
  std::atomic<ModelRI*> capture{nullptr};
  // Capturing: the task group open on this stream (guarded by the model's mutex).
  TaskGroup* group = nullptr;
  // The task group update this stream records (aclmdlRICaptureTaskUpdateBegin), or nullptr.
  std::atomic<TaskUpdate*> update{nullptr};

  // Enqueue a task (recorded instead when the stream captures); starts the worker on first use. Never blocks on task execution.
  aclError Enqueue(const Task& t);
  // Blocks until every task enqueued before the call has run (condvar, no spinning).
  void WaitIdle();
  bool Idle() const {
    if (completed_.load(std::memory_order_seq_cst) >= enqueued_.load(std::memory_order_seq_cst)) return true;
    while (settling_.load(std::memory_order_seq_cst)) std::this_thread::yield();  // see WorkerMain
    return completed_.load(std::memory_order_seq_cst) >= enqueued_.load(std::memory_order_seq_cst);
  }
  // Pending task error ("<name>: <msg>"), consumed by the caller. False if none. `rc`
  // (optional) receives the code the first failed task returned.
  bool TakeError(std::string* msg, int* rc = nullptr);
  // Drains, stops and joins the worker. If `restartable` (aclFinalize), later enqueues
  // start a new worker; otherwise (stream destruction, process exit) later tasks run
  // inline on the calling thread, after anything still queued.
  void Shutdown(bool restartable);
  bool IsCurrentWorker() const;
  // In a child forked after its worker started: the worker does not exist here, so the
  // stream's tasks would never run (ForkedChildFail instead of waiting for them).
  bool Orphaned() const;
  // Runs one task on the calling thread (the worker; also for a model's tasks).
  void Run(Task& t, char* errbuf, size_t errlen);
  // A small number naming the stream (in its worker's name npu<device>-s<serial>, and in
  // profiles), assigned on first use.
  int Serial();
  ~Stream();

 private:
  void Execute(Task& t, char* errbuf, size_t errlen);
  std::atomic<int> serial_{-1};
  aclError StartWorkerLocked();  // mu_ held
  void WorkerMain();
  void MarkDone();
  void RecordError(const char* name, const char* msg, int rc);

  std::mutex mu_;  // guards the queue, free list, sleeping_, stop_, started_, worker_
  std::condition_variable work_cv_;
  TaskBlock* head_ = nullptr;  // queued tasks, oldest first
  TaskBlock* tail_ = nullptr;
  TaskBlock* free_ = nullptr;  // emptied blocks kept for reuse
  int free_count_ = 0;
  bool sleeping_ = false;
  bool stop_ = false;
  bool started_ = false;
  bool inline_ = false;  // worker gone for good (process exit)
  std::thread worker_;
  std::thread::id worker_id_;
  std::atomic<int> worker_pid_{0};  // the process that started the worker

  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<bool> settling_{false};  // the worker runs an event record not yet counted done
  // The smallest completion count a host waiter sleeps for (UINT64_MAX: nobody waits).
  // The worker wakes waiters only when it reaches it, not after every task: a waiter
  // woken per task steals a core from the kernel's threads.
  std::atomic<uint64_t> wake_at_{UINT64_MAX};
  std::mutex done_mu_;
  std::condition_variable done_cv_;

  std::atomic<bool> has_error_{false};
  std::mutex err_mu_;
  std::string error_;
  int error_rc_ = 0;  // the first failed task's code
  int error_count_ = 0;
};

// The counters an ACL_EVENT_IPC event shares with the processes that opened it: a page of
// a memfd (ipc.cpp), mapped MAP_SHARED by each of them.
struct IpcEventShared {
  std::atomic<uint64_t> recorded;
  std::atomic<uint64_t> completed;
  std::atomic<uint32_t> wake;  // futex word: bumped (and woken) at each completion
};

struct Event {
  static constexpr uint32_t kMagic = 0x45564e54U;  // "EVNT"
  Event() = default;
  // An ACL_EVENT_IPC event: its counters live in `shared` (mapped, `fd` the memfd or -1).
  Event(IpcEventShared* shared, int fd)
      : recorded(shared->recorded), completed(shared->completed), ipc(shared), ipc_fd(fd) {}
  ~Event();
  std::atomic<uint32_t> magic{kMagic};
  uint32_t flags = 0;
  std::atomic<int> refs{1};                 // handle + queued tasks
 private:
  std::atomic<uint64_t> own_recorded{0}, own_completed{0};
 public:
  std::atomic<uint64_t>& recorded{own_recorded};    // generation of the latest record call
  std::atomic<uint64_t>& completed{own_completed};  // latest generation executed
  IpcEventShared* ipc = nullptr;  // an IPC event's shared counters (any process may record)
  int ipc_fd = -1;                // the exporter's memfd of them
  std::atomic<int64_t> stamp_ns{-1};        // steady clock at the latest completion
  std::atomic<uint64_t> capture_id{0};      // capture holding the latest record (0: none)
  std::atomic<int> record_pid{0};           // the process of the latest record call
  std::atomic<int> record_device{-1};       // the device of the stream of the latest record call
  // ACL_EVENT_EXTERNAL: the flag is set while completed > cleared (Reset sets cleared).
  std::atomic<uint64_t> cleared{0};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> waiters{0};

  void Ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void Complete(uint64_t gen);  // run by a worker
  void Reset();                 // run by a worker
  void WaitFor(uint64_t gen);   // blocks (condvar) until completed >= gen
  void WaitForFlag();           // ACL_EVENT_EXTERNAL: blocks until a record after the last reset ran
  bool Done(uint64_t gen) const {
    return completed.load(std::memory_order_acquire) >= gen;
  }
};

int64_t NowNs();
// aclrtCreateEventWithFlag(ACL_EVENT_IPC) (ipc.cpp).
aclError CreateIpcEvent(aclrtEvent* event);

// ---- devices and runtime ---------------------------------------------------------------
struct Device {
  int id = 0;        // logical (visible) id
  int physical = 0;  // physical id before ASCEND_RT_VISIBLE_DEVICES renumbering
  size_t capacity = 0;
  Arena arena;

  std::atomic<Stream*> default_stream{nullptr};
  std::mutex mu;  // guards streams, orphan_*
  std::vector<std::shared_ptr<Stream>> streams;  // includes the default stream
  std::string orphan_error;  // errors left by destroyed streams
  int orphan_rc = 0;         // the code of the first of them
  int orphan_count = 0;
  // Time its streams' workers spent running tasks, summed over streams (aclsimDeviceBusyNs).
  std::atomic<int64_t> busy_ns{0};
  void AddBusy(int64_t ns);  // and to the npu-smi registry

  Stream* DefaultStream();  // created on first use
  std::vector<std::shared_ptr<Stream>> Snapshot();
};

struct Runtime {
  std::string soc;
  size_t capacity = 0;
  int physical_count = 0;
  std::vector<std::unique_ptr<Device>> devices;
  std::atomic<uint64_t> copied[4] = {};
  std::mutex host_mu;
  std::unordered_map<void*, size_t> host_allocs;
  std::atomic<bool> explicit_init{false};
  std::atomic<bool> exiting{false};
  bool forked_child = false;

  int count() const { return static_cast<int>(devices.size()); }
};

// ---- npu-smi registry (smi.cpp) ------------------------------------------------------
// This process's HBM in use on a physical device (claims its registry slot on first use).
void SmiPublishMemory(int physical, size_t used);
// Time this process's streams ran tasks on a physical device (once it holds a slot).
void SmiAddBusy(int physical, int64_t ns);
// Frees this process's slot (at exit).
void SmiRelease();
// In a forked child (pthread_atfork): the slot is the parent's, not this process's.
void SmiForgetAfterFork();

// Initialises on first use (reads the environment once).
Runtime& RT();
// Whether RT() has been created; the visible device count without creating it (see
// aclsimVisibleDeviceCount).
bool RuntimeStarted();
int VisibleCountNow();
// The error of a call that needs stream workers in a child forked after initialisation.
aclError ForkedChildFail(const char* api);
// Per-thread current device (default 0; stream workers: their stream's device).
int& CurrentDevice();
// nullptr and sets an ACL_ERROR_RT_INVALID_DEVICEID message when invalid.
Device* DeviceOrFail(int id, const char* api, aclError* err);
// Device owning [ptr, ptr+len) (inside a live allocation, or mapped virtual memory), or
// nullptr. O(#devices + log n) (+ the mappings the range spans).
Device* FindDevice(const void* ptr, size_t len);
// Stream of the calling worker thread, or nullptr on a host thread.
Stream* CurrentWorkerStream();
// Drain and join every worker. `exiting`: the process is ending (no restart).
void ShutdownAllStreams(bool exiting);

// ---- stream capture (mdl_ri.cpp) ------------------------------------------------------
// Records `t` into the capture of `s` (kernels, callbacks, copies, memsets).
aclError CaptureTask(Stream* s, const Task& t);
// Records `t` into the task group update of `s` (aclmdlRICaptureTaskUpdateBegin).
aclError UpdateTask(Stream* s, const Task& t);
// Abandons the task group update `s` records, if any (the stream is being destroyed).
void DropTaskUpdate(Stream* s);
// Record / reset / wait of event `e` on capturing stream `s` (or, for a wait, a stream
// that joins the capture holding e's record). *handled false: not a capture matter.
aclError CaptureEventRecord(Stream* s, Event* e);
aclError CaptureEventReset(Stream* s, Event* e);
aclError CaptureEventWait(Stream* s, Event* e, bool* handled);
// Synchronising (or querying) a capturing stream, its device, or an event recorded in
// an active capture is not permitted: these invalidate the capture and fail.
aclError CheckStreamNotCapturing(Stream* s, const char* api);
aclError CheckDeviceNotCapturing(Device* d, const char* api);
aclError CheckEventNotCaptured(Event* e, const char* api);
// Synchronous copies and memsets, judged by the capture modes (worker threads: allowed).
aclError CheckUnsafeCall(const char* api);
// Runs one queued model execution (Task::a of a kTaskModel task) on stream `s`.
void RunModelExecution(Stream* s, void* execution, char* errbuf, size_t errlen);

// ---- virtual memory (vmm.cpp) -----------------------------------------------------------
// Device whose physical memory is mapped over all of [p, p+len) (len 0 = just p), or -1.
// Lock-free when nothing was ever reserved.
int VmmDevice(const void* p, size_t len);
// True when p lies in a reserved virtual range (mapped or not).
bool VmmReserved(const void* p);

// ---- inter-process sharing (ipc.cpp) ----------------------------------------------------
// Device of the imported memory (aclrtIpcMemImportByKey) spanning all of [p, p+len), or -1.
// Lock-free when nothing was ever imported.
int IpcDevice(const void* p, size_t len);

// ---- host memory registered to a device (host_register.cpp) ----------------------------
// Device that host memory spanning all of [p, p+len) is registered to, or -1.
// Lock-free when nothing was ever registered.
int HostRegisteredDevice(const void* p, size_t len);

}  // namespace aclsim
