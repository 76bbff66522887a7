// Stream capture into model runtime instances (AscendCL's aclmdlRI* capture API).
//
// A capture is a ModelRI: while a stream captures (Stream::capture set), every task
// enqueued on it is appended to the model instead of the queue. Streams that wait for an
// event recorded inside the capture join it; their tasks are appended too. Appending in
// host enqueue order linearises the captured streams: every dependency (stream order, an
// event wait after its record) points from an earlier append to a later one, so running
// the tasks in append order on one stream is a valid schedule, and waits on events
// recorded inside the capture need no task at all.
//
// Replay (aclmdlRIExecuteAsync) enqueues a single task that runs the model's tasks on the
// stream's worker. Event records inside a model get their generation at enqueue time (so
// the host can wait for them right after the call), one per execution.
//
// Task groups (aclmdlRICaptureTaskGrpBegin/End) name the tasks one stream recorded in
// between, by their indexes in the model. A task update (aclmdlRICaptureTaskUpdateBegin/
// End) records the tasks launched on a stream as the group's new ones and, in that
// stream's order, writes them over the old ones. Executions of a model with groups read
// each task under the model's lock as they reach it, so an update that lands while an
// execution runs affects the tasks that execution has not reached yet. The userData of a
// replaced kernel is released (its destroy callbacks) once no execution runs.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "internal.h"

namespace aclsim {

struct TaskGroup {
  static constexpr uint32_t kMagic = 0x54475250U;  // "TGRP"
  uint32_t magic = kMagic;
  ModelRI* model = nullptr;     // owns the group
  Stream* stream = nullptr;     // that recorded it
  std::vector<size_t> indexes;  // of its tasks in the model
  bool open = true;
};

struct TaskUpdate {
  TaskGroup* group = nullptr;
  ModelRI* model = nullptr;  // referenced while the update exists
  std::vector<Task> tasks;   // the group's new tasks
  bool failed = false;       // a refused task: aclmdlRICaptureTaskUpdateEnd fails
  std::string reason;
};

struct ModelRI {
  static constexpr uint32_t kMagic = 0x4d444c52U;  // "MDLR"
  std::atomic<uint32_t> magic{kMagic};
  std::atomic<int> refs{1};  // the handle (or the capture) + queued executions
  uint64_t id = 0;
  int device = 0;
  aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;  // that began the capture

  std::mutex mu;
  std::vector<Task> tasks;        // record/reset tasks hold a reference to their event
  std::vector<Stream*> streams;   // capturing: the origin first, then joined streams
  bool capturing = true;
  bool invalidated = false;
  std::string reason;             // of the first invalidation
  std::vector<std::pair<aclrtCallback, void*>> on_destroy;
  size_t records = 0;             // event-record tasks
  std::vector<std::unique_ptr<TaskGroup>> groups;
  int running = 0;                // executions under way (models with groups only)
  std::vector<std::pair<aclrtCallback, void*>> retired;  // of replaced kernels, run when running == 0

  void Ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  ~ModelRI();
};

namespace {

std::mutex g_groups_mu;            // guards g_groups
std::set<const void*> g_groups;    // live task groups (handles are checked against it)

bool IsEventTask(uint8_t kind) {
  return kind == kTaskEventRecord || kind == kTaskEventReset || kind == kTaskEventWait;
}

}  // namespace

ModelRI::~ModelRI() {
  {
    std::lock_guard<std::mutex> g(g_groups_mu);
    for (auto& group : groups) g_groups.erase(group.get());
  }
  for (Task& t : tasks) {
    if (IsEventTask(t.kind)) static_cast<Event*>(t.a)->Unref();
  }
  for (auto& [fn, data] : retired) fn(data);
  for (auto& [fn, data] : on_destroy) fn(data);
}

namespace {

std::atomic<uint64_t> g_model_serial{0};
std::mutex g_active_mu;                // guards g_active
std::vector<ModelRI*> g_active;        // captures under way
std::atomic<int> g_active_count{0};    // g_active.size(), read without the lock
thread_local aclmdlRICaptureMode tl_mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;

struct Execution {
  ModelRI* model;
  std::vector<uint64_t> gens;  // of the model's event records, in order
};

const char* ModeName(aclmdlRICaptureMode m) {
  switch (m) {
    case ACL_MODEL_RI_CAPTURE_MODE_GLOBAL: return "GLOBAL";
    case ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL: return "THREAD_LOCAL";
    case ACL_MODEL_RI_CAPTURE_MODE_RELAXED: return "RELAXED";
  }
  return "?";
}

const char* KindName(uint8_t k) {
  switch (k) {
    case kTaskKernel: return "kernel";
    case kTaskCallback: return "callback";
    case kTaskMemcpy: return "memcpy";
    case kTaskMemset: return "memset";
    case kTaskEventRecord: return "event_record";
    case kTaskEventWait: return "event_wait";
    case kTaskEventReset: return "event_reset";
    case kTaskModel: return "model";
  }
  return "?";
}

// First reason wins (aclmdlRICaptureEnd reports it).
void Invalidate(ModelRI* m, const std::string& reason) {
  std::lock_guard<std::mutex> g(m->mu);
  if (!m->invalidated) {
    m->invalidated = true;
    m->reason = reason;
  }
}

// Appends `t`, launched on `s`, to the capture (and to the task group open on `s`).
aclError Append(ModelRI* m, Stream* s, const Task& t) {
  std::lock_guard<std::mutex> g(m->mu);
  if (m->invalidated)
    return Fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                "%s: the stream capture was invalidated by an earlier error: %s", t.name[0] ? t.name : KindName(t.kind),
                m->reason.c_str());
  if (s->group != nullptr) s->group->indexes.push_back(m->tasks.size());
  m->tasks.push_back(t);
  if (t.kind == kTaskEventRecord) ++m->records;
  return ACL_SUCCESS;
}

ModelRI* ResolveModel(aclmdlRI handle, const char* api, aclError* err) {
  auto* m = static_cast<ModelRI*>(handle);
  if (m == nullptr || m->magic.load(std::memory_order_relaxed) != ModelRI::kMagic) {
    *err = Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid model handle %p%s", api, handle,
                handle ? " (destroyed?)" : "");
    return nullptr;
  }
  return m;
}

Stream* ResolveStreamHandle(aclrtStream stream, const char* api, aclError* err) {
  if (stream == nullptr) {
    Device* d = DeviceOrFail(CurrentDevice(), api, err);
    return d ? d->DefaultStream() : nullptr;
  }
  auto* s = static_cast<Stream*>(stream);
  if (s->magic.load(std::memory_order_relaxed) != Stream::kMagic) {
    *err = Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid stream handle %p (destroyed?)", api, stream);
    return nullptr;
  }
  return s;
}

// The capture under way with this id, referenced (the caller unrefs), or nullptr.
ModelRI* ActiveCapture(uint64_t id) {
  if (id == 0 || g_active_count.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard<std::mutex> g(g_active_mu);
  for (ModelRI* m : g_active) {
    if (m->id == id) {
      m->Ref();
      return m;
    }
  }
  return nullptr;
}

struct Unref {
  void operator()(ModelRI* m) const { m->Unref(); }
};
using ModelRef = std::unique_ptr<ModelRI, Unref>;

std::string NotPermitted(const char* api, const char* what) {
  std::string msg = api;
  msg += ": ";
  msg += what;
  return msg;
}

}  // namespace

// ---- hooks used by the stream and event APIs -------------------------------------------

aclError CaptureTask(Stream* s, const Task& t) {
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr) return s->Enqueue(t);  // the capture ended meanwhile
  return Append(m, s, t);
}

aclError UpdateTask(Stream* s, const Task& t) {
  TaskUpdate* u = s->update.load(std::memory_order_acquire);
  if (u == nullptr) return s->Enqueue(t);  // the update ended meanwhile
  const char* name = t.name[0] ? t.name : KindName(t.kind);
  if (IsEventTask(t.kind) || t.kind == kTaskModel) {
    std::string msg = std::string(name) + ": " + KindName(t.kind) +
                      " tasks cannot be recorded into a task group update (only kernels, callbacks, copies, memsets)";
    u->failed = true;
    if (u->reason.empty()) u->reason = msg;
    return Fail(ACL_ERROR_INVALID_PARAM, "%s", msg.c_str());
  }
  u->tasks.push_back(t);
  return ACL_SUCCESS;
}

void DropTaskUpdate(Stream* s) {
  std::unique_ptr<TaskUpdate> u(s->update.exchange(nullptr, std::memory_order_acq_rel));
  if (u != nullptr) u->model->Unref();  // its kernels' callbacks run when the model is freed
}

// Records an event task into the capture of `s`; the task holds a reference to `e`.
static aclError AppendEventTask(ModelRI* m, Stream* s, Event* e, TaskKind kind, const char* name) {
  Task t{};
  t.kind = kind;
  t.a = e;
  snprintf(t.name, sizeof(t.name), "%s", name);
  e->Ref();
  aclError err = Append(m, s, t);
  if (err != ACL_SUCCESS) e->Unref();
  return err;
}

aclError CaptureEventRecord(Stream* s, Event* e) {
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  aclError err = AppendEventTask(m, s, e, kTaskEventRecord, "aclrtRecordEvent");
  if (err == ACL_SUCCESS) e->capture_id.store(m->id, std::memory_order_release);
  return err;
}

aclError CaptureEventReset(Stream* s, Event* e) {
  return AppendEventTask(s->capture.load(std::memory_order_acquire), s, e, kTaskEventReset, "aclrtResetEvent");
}

aclError CaptureEventWait(Stream* s, Event* e, bool* handled) {
  ModelRI* own = s->capture.load(std::memory_order_acquire);
  if (e->flags & ACL_EVENT_EXTERNAL) {
    // A wait for an external event's flag: recorded, it waits at each execution.
    *handled = own != nullptr;
    return own ? AppendEventTask(own, s, e, kTaskEventWait, "aclrtStreamWaitEvent") : ACL_SUCCESS;
  }
  ModelRef holder_ref(ActiveCapture(e->capture_id.load(std::memory_order_acquire)));
  ModelRI* holder = holder_ref.get();
  *handled = true;
  if (holder != nullptr) {
    if (own == holder) return ACL_SUCCESS;  // ordered by the linearisation (see above)
    if (own == nullptr && s->is_default) {
      std::string msg = NotPermitted("aclrtStreamWaitEvent",
                                     "the default stream cannot join a stream capture (wait on a created stream)");
      Invalidate(holder, msg);
      return Fail(ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT, "%s", msg.c_str());
    }
    if (own == nullptr) {
      // The stream joins the capture (fork): its tasks are recorded from now on.
      std::lock_guard<std::mutex> g(holder->mu);
      if (!holder->capturing) return ACL_SUCCESS;
      holder->streams.push_back(s);
      s->capture.store(holder, std::memory_order_release);
      return ACL_SUCCESS;
    }
    std::string msg = NotPermitted("aclrtStreamWaitEvent",
                                   "the event was recorded in another stream capture (captures cannot depend on "
                                   "each other)");
    Invalidate(own, msg);
    Invalidate(holder, msg);
    return Fail(ACL_ERROR_RT_CAPTURE_DEPENDENCY, "%s", msg.c_str());
  }
  if (own == nullptr) {
    *handled = false;
    return ACL_SUCCESS;
  }
  // A capturing stream waiting for work outside the capture: fine if it is done already.
  uint64_t gen = e->recorded.load(std::memory_order_acquire);
  if (gen == 0 || e->Done(gen)) return ACL_SUCCESS;
  std::string msg = NotPermitted("aclrtStreamWaitEvent",
                                 "a capturing stream cannot wait for an event recorded outside the capture that "
                                 "has not completed (synchronise before aclmdlRICaptureBegin)");
  Invalidate(own, msg);
  return Fail(ACL_ERROR_RT_CAPTURE_DEPENDENCY, "%s", msg.c_str());
}

// Synchronisations and queries of what a capture holds are refused, and (unlike CUDA,
// whose capture they invalidate) the capture goes on: Ascend's runtime rejects them
// without invalidating it (Huawei's test_graph_rng_after_failed_capture relies on it).
aclError CheckStreamNotCapturing(Stream* s, const char* api) {
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr) return ACL_SUCCESS;
  std::string msg = NotPermitted(api, "operation not permitted when stream is capturing");
  return Fail(ACL_ERROR_RT_STREAM_CAPTURED, "%s", msg.c_str());
}

aclError CheckDeviceNotCapturing(Device* d, const char* api) {
  aclError rc = ACL_SUCCESS;
  if (g_active_count.load(std::memory_order_acquire) == 0) return rc;
  for (auto& s : d->Snapshot()) {
    if (s->capture.load(std::memory_order_acquire) != nullptr) {
      std::string msg = NotPermitted(api, "operation not permitted while a stream of the device is capturing");
      rc = Fail(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, "%s", msg.c_str());
    }
  }
  return rc;
}

aclError CheckEventNotCaptured(Event* e, const char* api) {
  ModelRef m(ActiveCapture(e->capture_id.load(std::memory_order_acquire)));
  if (m == nullptr) return ACL_SUCCESS;
  std::string msg = NotPermitted(api, "the event's latest record is part of a stream capture under way");
  return Fail(ACL_ERROR_RT_EVENT_CAPTURED, "%s", msg.c_str());
}

aclError CheckUnsafeCall(const char* api) {
  if (g_active_count.load(std::memory_order_acquire) == 0) return ACL_SUCCESS;
  if (CurrentWorkerStream() != nullptr) return ACL_SUCCESS;  // a task of a stream, not the host
  if (tl_mode == ACL_MODEL_RI_CAPTURE_MODE_RELAXED) return ACL_SUCCESS;
  std::vector<ModelRI*> hit;
  {
    std::lock_guard<std::mutex> g(g_active_mu);
    for (ModelRI* m : g_active) {
      if (m->mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL ||
          (m->mode == ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL && m->thread == std::this_thread::get_id())) {
        m->Ref();
        hit.push_back(m);
      }
    }
  }
  if (hit.empty()) return ACL_SUCCESS;
  char buf[256];
  snprintf(buf, sizeof(buf),
           "operation not permitted when a stream is capturing and the capture mode is not relaxed (capture "
           "mode %s)",
           ModeName(hit[0]->mode));
  std::string msg = NotPermitted(api, buf);
  for (ModelRI* m : hit) {
    Invalidate(m, msg);
    m->Unref();
  }
  return Fail(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, "%s", msg.c_str());
}

// Runs the callbacks of replaced kernels once no execution may still run them.
static void ReleaseRetired(ModelRI* m, bool execution_done) {
  std::vector<std::pair<aclrtCallback, void*>> retired;
  {
    std::lock_guard<std::mutex> g(m->mu);
    if (execution_done) --m->running;
    if (m->running == 0) retired.swap(m->retired);
  }
  for (auto& [fn, data] : retired) fn(data);
}

void RunModelExecution(Stream* s, void* execution, char* errbuf, size_t errlen) {
  auto* e = static_cast<Execution*>(execution);
  ModelRI* m = e->model;
  // The groups (and the task count) are fixed once the capture ended; only a model with
  // groups can have its tasks replaced while this runs.
  const bool updatable = !m->groups.empty();
  if (updatable) {
    std::lock_guard<std::mutex> g(m->mu);
    ++m->running;
  }
  size_t record = 0;
  const size_t n = m->tasks.size();
  for (size_t i = 0; i < n; ++i) {
    Task t;
    if (updatable) {
      std::lock_guard<std::mutex> g(m->mu);
      t = m->tasks[i];
    } else {
      t = m->tasks[i];
    }
    if (t.kind == kTaskEventRecord) t.n = e->gens[record++];
    if (IsEventTask(t.kind)) static_cast<Event*>(t.a)->Ref();  // Run drops one reference
    s->Run(t, errbuf, errlen);
  }
  if (updatable) ReleaseRetired(m, true);
  m->Unref();
  delete e;
}

// The task callback applying an update (aclmdlRICaptureTaskUpdateEnd) in its stream's order.
static void ApplyTaskUpdate(void* data) {
  std::unique_ptr<TaskUpdate> u(static_cast<TaskUpdate*>(data));
  ModelRI* m = u->model;
  {
    std::lock_guard<std::mutex> g(m->mu);
    const std::vector<size_t>& idx = u->group->indexes;
    for (size_t i = 0; i < idx.size(); ++i) {
      Task& old = m->tasks[idx[i]];
      if (old.kind == kTaskKernel && old.a != u->tasks[i].a) {
        // The replaced kernel's userData is released (its callbacks move to `retired`).
        auto owned = std::stable_partition(m->on_destroy.begin(), m->on_destroy.end(),
                                           [&](const auto& cb) { return cb.second != old.a; });
        m->retired.insert(m->retired.end(), owned, m->on_destroy.end());
        m->on_destroy.erase(owned, m->on_destroy.end());
      }
      old = u->tasks[i];
    }
  }
  ReleaseRetired(m, false);
  m->Unref();
}

}  // namespace aclsim

using namespace aclsim;

extern "C" {

aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureBegin", &err);
  if (!s) return err;
  if (mode != ACL_MODEL_RI_CAPTURE_MODE_GLOBAL && mode != ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL &&
      mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureBegin: invalid capture mode %d", static_cast<int>(mode));
  if (s->is_default)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureBegin: the default stream of device %d cannot be captured (use a stream from "
                "aclrtCreateStream)",
                s->device);
  if (s->capture.load(std::memory_order_acquire) != nullptr)
    return Fail(ACL_ERROR_RT_STREAM_CAPTURED, "aclmdlRICaptureBegin: the stream is already capturing");
  if (s->update.load(std::memory_order_acquire) != nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureBegin: the stream is updating a task group (call aclmdlRICaptureTaskUpdateEnd first)");
  auto* m = new ModelRI();
  m->id = g_model_serial.fetch_add(1, std::memory_order_relaxed) + 1;
  m->device = s->device;
  m->mode = mode;
  m->thread = std::this_thread::get_id();
  m->streams.push_back(s);
  {
    std::lock_guard<std::mutex> g(g_active_mu);
    g_active.push_back(m);
    g_active_count.store(static_cast<int>(g_active.size()), std::memory_order_release);
  }
  s->capture.store(m, std::memory_order_release);
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus* status, aclmdlRI* modelRI) {
  if (status == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureGetInfo: status is null");
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureGetInfo", &err);
  if (!s) return err;
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr) {
    *status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  } else {
    std::lock_guard<std::mutex> g(m->mu);
    *status = m->invalidated ? ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED : ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE;
  }
  if (modelRI) *modelRI = m;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI) {
  if (modelRI == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureEnd: modelRI is null");
  *modelRI = nullptr;
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureEnd", &err);
  if (!s) return err;
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr)
    return Fail(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "aclmdlRICaptureEnd: the stream is not capturing");
  bool invalidated;
  std::string reason;
  {
    std::lock_guard<std::mutex> g(m->mu);
    if (m->streams.front() != s)
      return Fail(ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
                  "aclmdlRICaptureEnd: the capture was not begun on this stream (it joined it through an event)");
    m->capturing = false;
    for (Stream* joined : m->streams) {
      joined->group = nullptr;  // a group left open stays unusable (never ended)
      joined->capture.store(nullptr, std::memory_order_release);
    }
    m->streams.clear();
    invalidated = m->invalidated;
    reason = m->reason;
  }
  {
    std::lock_guard<std::mutex> g(g_active_mu);
    for (auto it = g_active.begin(); it != g_active.end(); ++it) {
      if (*it == m) {
        g_active.erase(it);
        break;
      }
    }
    g_active_count.store(static_cast<int>(g_active.size()), std::memory_order_release);
  }
  if (invalidated) {
    m->magic.store(0);
    m->Unref();
    return Fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                "aclmdlRICaptureEnd: the stream capture was invalidated by an earlier error: %s", reason.c_str());
  }
  *modelRI = m;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode* mode) {
  if (mode == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureThreadExchangeMode: mode is null");
  aclmdlRICaptureMode m = *mode;
  if (m != ACL_MODEL_RI_CAPTURE_MODE_GLOBAL && m != ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL &&
      m != ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureThreadExchangeMode: invalid capture mode %d",
                static_cast<int>(m));
  *mode = tl_mode;
  tl_mode = m;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureTaskGrpBegin(aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureTaskGrpBegin", &err);
  if (!s) return err;
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr)
    return Fail(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "aclmdlRICaptureTaskGrpBegin: the stream is not capturing");
  std::lock_guard<std::mutex> g(m->mu);
  if (s->group != nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureTaskGrpBegin: a task group is already open on this stream (groups do not nest)");
  auto group = std::make_unique<TaskGroup>();
  group->model = m;
  group->stream = s;
  s->group = group.get();
  {
    std::lock_guard<std::mutex> gg(g_groups_mu);
    g_groups.insert(group.get());
  }
  m->groups.push_back(std::move(group));
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureTaskGrpEnd(aclrtStream stream, aclrtTaskGrp* handle) {
  if (handle == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureTaskGrpEnd: handle is null");
  *handle = nullptr;
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureTaskGrpEnd", &err);
  if (!s) return err;
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr)
    return Fail(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "aclmdlRICaptureTaskGrpEnd: the stream is not capturing");
  std::lock_guard<std::mutex> g(m->mu);
  if (s->group == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureTaskGrpEnd: no task group is open on this stream (call aclmdlRICaptureTaskGrpBegin)");
  s->group->open = false;
  *handle = s->group;
  s->group = nullptr;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureTaskUpdateBegin(aclrtStream stream, aclrtTaskGrp handle) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureTaskUpdateBegin", &err);
  if (!s) return err;
  auto* group = static_cast<TaskGroup*>(handle);
  ModelRI* m = nullptr;
  {
    std::lock_guard<std::mutex> g(g_groups_mu);
    if (g_groups.count(handle) == 0)
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclmdlRICaptureTaskUpdateBegin: invalid task group handle %p (its model destroyed?)", handle);
    m = group->model;
    m->Ref();  // held by the update
  }
  ModelRef model(m);
  if (m->magic.load(std::memory_order_relaxed) != ModelRI::kMagic)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureTaskUpdateBegin: the task group's model was destroyed");
  {
    std::lock_guard<std::mutex> g(m->mu);
    if (m->capturing || group->open)
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclmdlRICaptureTaskUpdateBegin: the task group is still being captured (end the group and the "
                  "capture first)");
  }
  if (s->capture.load(std::memory_order_acquire) != nullptr)
    return Fail(ACL_ERROR_RT_STREAM_CAPTURED,
                "aclmdlRICaptureTaskUpdateBegin: the stream is capturing (update from a stream that does not)");
  if (s->device != m->device)
    return Fail(ACL_ERROR_RT_STREAM_CONTEXT,
                "aclmdlRICaptureTaskUpdateBegin: the model was captured on device %d, the stream belongs to device %d",
                m->device, s->device);
  if (s->update.load(std::memory_order_acquire) != nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureTaskUpdateBegin: the stream is already updating a task group (call "
                "aclmdlRICaptureTaskUpdateEnd first)");
  auto* u = new TaskUpdate();
  u->group = group;
  u->model = model.release();
  s->update.store(u, std::memory_order_release);
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureTaskUpdateEnd(aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRICaptureTaskUpdateEnd", &err);
  if (!s) return err;
  std::unique_ptr<TaskUpdate> u(s->update.exchange(nullptr, std::memory_order_acq_rel));
  if (u == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureTaskUpdateEnd: the stream is not updating a task group (call "
                "aclmdlRICaptureTaskUpdateBegin first)");
  ModelRef model(u->model);
  std::string msg;
  {
    std::lock_guard<std::mutex> g(model->mu);
    const std::vector<size_t>& idx = u->group->indexes;
    if (u->failed) {
      msg = u->reason;
    } else if (u->tasks.size() != idx.size()) {
      msg = "the update recorded " + std::to_string(u->tasks.size()) + " tasks, the task group has " +
            std::to_string(idx.size()) + " (launch the same work with new parameters)";
    } else {
      for (size_t i = 0; i < idx.size() && msg.empty(); ++i) {
        const Task& old = model->tasks[idx[i]];
        if (old.kind != u->tasks[i].kind)
          msg = "task " + std::to_string(i) + " of the update is a " + KindName(u->tasks[i].kind) +
                ", the task group's is a " + KindName(old.kind) + " (" + old.name + ")";
      }
    }
    if (!msg.empty()) {
      // Nothing changes; the kernels recorded for the update are released now.
      std::vector<std::pair<aclrtCallback, void*>> dropped;
      for (const Task& t : u->tasks) {
        if (t.kind != kTaskKernel) continue;
        auto owned = std::stable_partition(model->on_destroy.begin(), model->on_destroy.end(),
                                           [&](const auto& cb) { return cb.second != t.a; });
        dropped.insert(dropped.end(), owned, model->on_destroy.end());
        model->on_destroy.erase(owned, model->on_destroy.end());
      }
      model->retired.insert(model->retired.end(), dropped.begin(), dropped.end());
    }
  }
  if (!msg.empty()) {
    ReleaseRetired(model.get(), false);
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureTaskUpdateEnd: %s", msg.c_str());
  }
  u->model = model.release();  // the update holds the reference until it is applied
  Task t{};
  t.kind = kTaskCallback;
  t.fn = reinterpret_cast<void*>(&ApplyTaskUpdate);
  t.a = u.get();
  snprintf(t.name, sizeof(t.name), "aclmdlRICaptureTaskUpdateEnd");
  if ((err = s->Enqueue(t)) != ACL_SUCCESS) {
    u->model->Unref();
    return err;
  }
  u.release();
  return ACL_SUCCESS;
}

aclError aclsimStreamTaskUpdateModel(aclrtStream stream, aclmdlRI* modelRI) {
  if (modelRI == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclsimStreamTaskUpdateModel: modelRI is null");
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclsimStreamTaskUpdateModel", &err);
  if (!s) return err;
  TaskUpdate* u = s->update.load(std::memory_order_acquire);
  *modelRI = u ? u->model : nullptr;
  return ACL_SUCCESS;
}

aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclmdlRIExecuteAsync", &err);
  if (!m) return err;
  Stream* s = ResolveStreamHandle(stream, "aclmdlRIExecuteAsync", &err);
  if (!s) return err;
  {
    std::lock_guard<std::mutex> g(m->mu);
    if (m->capturing)
      return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRIExecuteAsync: the model is still being captured");
  }
  if (s->device != m->device)
    return Fail(ACL_ERROR_RT_STREAM_CONTEXT,
                "aclmdlRIExecuteAsync: the model was captured on device %d, the stream belongs to device %d",
                m->device, s->device);
  if (s->capture.load(std::memory_order_acquire) != nullptr)
    return Fail(ACL_ERROR_RT_STREAM_CAPTURED,
                "aclmdlRIExecuteAsync: launching a model into a capturing stream is not supported");
  auto* e = new Execution{m, {}};
  e->gens.reserve(m->records);
  for (const Task& t : m->tasks) {
    if (t.kind != kTaskEventRecord) continue;
    auto* ev = static_cast<Event*>(t.a);
    ev->capture_id.store(0, std::memory_order_release);
    e->gens.push_back(ev->recorded.fetch_add(1, std::memory_order_acq_rel) + 1);
  }
  m->Ref();
  Task t{};
  t.kind = kTaskModel;
  t.a = e;
  snprintf(t.name, sizeof(t.name), "aclmdlRIExecuteAsync");
  if ((err = s->Enqueue(t)) != ACL_SUCCESS) {
    size_t i = 0;
    for (const Task& task : m->tasks)
      if (task.kind == kTaskEventRecord) static_cast<Event*>(task.a)->Complete(e->gens[i++]);
    m->Unref();
    delete e;
  }
  return err;
}

aclError aclmdlRIExecute(aclmdlRI modelRI, int32_t timeout) {
  if (timeout != -1)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRIExecute: timeout must be -1 (wait until done), got %d",
                static_cast<int>(timeout));
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclmdlRIExecute", &err);
  if (!m) return err;
  Device* d = DeviceOrFail(m->device, "aclmdlRIExecute", &err);
  if (!d) return err;
  aclrtStream s = d->DefaultStream();
  if ((err = aclmdlRIExecuteAsync(modelRI, s)) != ACL_SUCCESS) return err;
  return aclrtSynchronizeStream(s);
}

aclError aclmdlRIDestroy(aclmdlRI modelRI) {
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclmdlRIDestroy", &err);
  if (!m) return err;
  {
    std::lock_guard<std::mutex> g(m->mu);
    if (m->capturing)
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclmdlRIDestroy: the model is still being captured (end the capture first)");
  }
  if (m->magic.exchange(0) != ModelRI::kMagic)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRIDestroy: invalid model handle %p (destroyed?)", modelRI);
  m->Unref();  // queued executions keep it until they ran
  return ACL_SUCCESS;
}

static aclError DumpModel(ModelRI* m, FILE* f, bool json) {
  std::lock_guard<std::mutex> g(m->mu);
  if (json) {
    fprintf(f, "{\"model_id\": %" PRIu64 ", \"device\": %d, \"tasks\": [", m->id, m->device);
    for (size_t i = 0; i < m->tasks.size(); ++i) {
      const Task& t = m->tasks[i];
      fprintf(f, "%s\n  {\"index\": %zu, \"type\": \"%s\", \"name\": \"", i ? "," : "", i, KindName(t.kind));
      for (const char* c = t.name; *c; ++c) {
        if (*c == '"' || *c == '\\') fputc('\\', f);
        fputc(*c, f);
      }
      fprintf(f, "\"}");
    }
    fprintf(f, "\n]}\n");
  } else {
    fprintf(f, "model %" PRIu64 " (device %d): %zu tasks\n", m->id, m->device, m->tasks.size());
    for (size_t i = 0; i < m->tasks.size(); ++i)
      fprintf(f, "  %4zu %-12s %s\n", i, KindName(m->tasks[i].kind), m->tasks[i].name);
  }
  return ACL_SUCCESS;
}

aclError aclmdlRIDebugPrint(aclmdlRI modelRI) {
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclmdlRIDebugPrint", &err);
  if (!m) return err;
  DumpModel(m, stdout, false);
  fflush(stdout);
  return ACL_SUCCESS;
}

aclError aclmdlRIDebugJsonPrint(aclmdlRI modelRI, const char* path, uint32_t flags) {
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclmdlRIDebugJsonPrint", &err);
  if (!m) return err;
  if (path == nullptr || *path == '\0')
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRIDebugJsonPrint: path is empty");
  if (flags > 1) return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRIDebugJsonPrint: invalid flags %u", flags);
  FILE* f = fopen(path, "w");
  if (f == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRIDebugJsonPrint: cannot write %s: %s", path, strerror(errno));
  DumpModel(m, f, true);
  fclose(f);
  return ACL_SUCCESS;
}

aclError aclsimModelRIAddDestroyCallback(aclmdlRI modelRI, aclrtCallback fn, void* userData) {
  if (fn == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclsimModelRIAddDestroyCallback: fn is null");
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclsimModelRIAddDestroyCallback", &err);
  if (!m) return err;
  std::lock_guard<std::mutex> g(m->mu);
  m->on_destroy.emplace_back(fn, userData);
  return ACL_SUCCESS;
}

aclError aclsimModelRIInfo(aclmdlRI modelRI, size_t* numTasks, uint64_t* id) {
  aclError err = ACL_SUCCESS;
  ModelRI* m = ResolveModel(modelRI, "aclsimModelRIInfo", &err);
  if (!m) return err;
  std::lock_guard<std::mutex> g(m->mu);
  if (numTasks) *numTasks = m->tasks.size();
  if (id) *id = m->id;
  return ACL_SUCCESS;
}

aclError aclsimCaptureInvalidate(aclrtStream stream, const char* reason) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStreamHandle(stream, "aclsimCaptureInvalidate", &err);
  if (!s) return err;
  ModelRI* m = s->capture.load(std::memory_order_acquire);
  if (m == nullptr)
    return Fail(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "aclsimCaptureInvalidate: the stream is not capturing");
  Invalidate(m, reason ? reason : "invalidated");
  return ACL_SUCCESS;
}

}  // extern "C"
