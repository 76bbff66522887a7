// The C API of acl/acl_rt.h: argument checks, error messages, dispatch to the runtime.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "internal.h"

using namespace aclsim;

namespace {

Device* CurrentDeviceOrFail(const char* api, aclError* err) {
  return DeviceOrFail(CurrentDevice(), api, err);
}

Stream* ResolveStream(aclrtStream stream, const char* api, aclError* err) {
  if (stream == nullptr) {
    Device* d = CurrentDeviceOrFail(api, err);
    return d ? d->DefaultStream() : nullptr;
  }
  auto* s = static_cast<Stream*>(stream);
  if (s->magic.load(std::memory_order_relaxed) != Stream::kMagic) {
    *err = Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid stream handle %p (destroyed?)", api,
                stream);
    return nullptr;
  }
  return s;
}

Event* ResolveEvent(aclrtEvent event, const char* api, aclError* err) {
  auto* e = static_cast<Event*>(event);
  if (e == nullptr || e->magic.load(std::memory_order_relaxed) != Event::kMagic) {
    *err = Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid event handle %p%s", api, event,
                event ? " (destroyed?)" : "");
    return nullptr;
  }
  return e;
}

aclError WorkerSelfWait(const char* api, int device) {
  return Fail(ACL_ERROR_RT_STREAM_CONTEXT,
              "%s: called from a task running on a stream of device %d, which would wait "
              "for itself (kernels must not synchronise their own stream)",
              api, device);
}

// A failed task is reported as an AI Core exception, unless it ran out of device memory
// (its kernel returned ACL_ERROR_RT_MEMORY_ALLOCATION) or was dropped by a device task
// abort (ACL_ERROR_RT_DEVICE_TASK_ABORT): those codes are passed on.
aclError ReportTaskError(std::string msg, int rc) {
  SetRecentError(msg);
  return rc == ACL_ERROR_RT_MEMORY_ALLOCATION || rc == ACL_ERROR_RT_DEVICE_TASK_ABORT
             ? rc
             : ACL_ERROR_RT_AICORE_EXCEPTION;
}

aclError SyncStream(Stream* s, const char* api) {
  if (s->Orphaned()) return ForkedChildFail(api);
  if (s->IsCurrentWorker()) return WorkerSelfWait(api, s->device);
  s->WaitIdle();
  std::string msg;
  int rc = 0;
  if (s->TakeError(&msg, &rc)) return ReportTaskError(std::move(msg), rc);
  return ACL_SUCCESS;
}

aclError SyncDevice(Device* d, const char* api) {
  Stream* own = CurrentWorkerStream();
  if (own && own->device == d->id) return WorkerSelfWait(api, d->id);
  auto streams = d->Snapshot();
  for (auto& s : streams)
    if (s->Orphaned()) return ForkedChildFail(api);
  for (auto& s : streams) s->WaitIdle();
  std::string first, msg;
  int extra = 0, first_rc = 0, rc = 0;
  for (auto& s : streams) {
    if (s->TakeError(&msg, &rc)) {
      if (first.empty()) {
        first = std::move(msg);
        first_rc = rc;
      } else {
        ++extra;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lk(d->mu);
    if (d->orphan_count > 0) {
      if (first.empty()) {
        first = std::move(d->orphan_error);
        first_rc = d->orphan_rc;
      } else {
        extra += d->orphan_count;
      }
      d->orphan_error.clear();
      d->orphan_count = 0;
    }
  }
  if (first.empty()) return ACL_SUCCESS;
  if (extra > 0) first += " (and failures on " + std::to_string(extra) + " other stream(s))";
  return ReportTaskError(std::move(first), first_rc);
}

// Explains why [p, p+count) is not device memory.
aclError BadDevicePtr(const char* api, const char* which, const void* p, size_t count) {
  for (auto& d : RT().devices) {
    if (d->arena.InMapping(p)) {
      if (d->arena.InAllocation(p, 0))
        return Fail(ACL_ERROR_INVALID_PARAM,
                    "%s: %s range [%p, +%zu bytes) runs past the end of its allocation on "
                    "device %d",
                    api, which, p, count, d->id);
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "%s: %s %p is inside device %d's memory but not in a live allocation "
                  "(freed?)",
                  api, which, p, d->id);
    }
  }
  if (VmmReserved(p))
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: %s range [%p, +%zu bytes) is reserved virtual memory that is not "
                "entirely mapped (to one device's physical memory)",
                api, which, p, count);
  return Fail(ACL_ERROR_INVALID_PARAM,
              "%s: %s %p is not device memory (allocate it with aclrtMalloc, or use a "
              "host kind)",
              api, which, p);
}

const char* KindName(aclrtMemcpyKind k) {
  switch (k) {
    case ACL_MEMCPY_HOST_TO_HOST: return "HOST_TO_HOST";
    case ACL_MEMCPY_HOST_TO_DEVICE: return "HOST_TO_DEVICE";
    case ACL_MEMCPY_DEVICE_TO_HOST: return "DEVICE_TO_HOST";
    case ACL_MEMCPY_DEVICE_TO_DEVICE: return "DEVICE_TO_DEVICE";
  }
  return "?";
}

aclError CheckCopy(const char* api, void* dst, size_t destMax, const void* src, size_t count,
                   aclrtMemcpyKind kind) {
  if (kind < ACL_MEMCPY_HOST_TO_HOST || kind > ACL_MEMCPY_DEVICE_TO_DEVICE)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid memcpy kind %d", api,
                static_cast<int>(kind));
  if (count > destMax)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: count %zu exceeds destMax %zu", api, count,
                destMax);
  if (count == 0) return ACL_SUCCESS;
  if (dst == nullptr || src == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: null %s pointer (%s, %zu bytes)", api,
                dst ? "src" : "dst", KindName(kind), count);
  bool dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  bool src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  if (dst_dev && !FindDevice(dst, count)) return BadDevicePtr(api, "dst", dst, count);
  if (src_dev && !FindDevice(src, count)) return BadDevicePtr(api, "src", src, count);
  return ACL_SUCCESS;
}

aclError CheckMemset(const char* api, void* p, size_t maxCount, size_t count) {
  if (p == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: null pointer", api);
  if (count > maxCount)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: count %zu exceeds maxCount %zu", api, count,
                maxCount);
  // Device memory must lie inside one allocation (or mapped range); other (host) memory
  // is accepted.
  for (auto& d : RT().devices)
    if (d->arena.InMapping(p) && !d->arena.InAllocation(p, count))
      return BadDevicePtr(api, "devPtr", p, count);
  if (VmmReserved(p) && VmmDevice(p, count) < 0) return BadDevicePtr(api, "devPtr", p, count);
  return ACL_SUCCESS;
}

void CopyName(Task& t, const char* name) {
  if (name == nullptr) name = "kernel";
  size_t n = strnlen(name, kTaskNameLen - 1);
  memcpy(t.name, name, n);
  t.name[n] = '\0';
}

}  // namespace

extern "C" {

// ---- init / devices -------------------------------------------------------------
aclError aclInit(const char* configPath) {
  (void)configPath;  // accepted and ignored (no dump/profiling config in the simulator)
  Runtime& rt = RT();
  if (rt.explicit_init.exchange(true))
    return Fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialised (call aclFinalize first)");
  return ACL_SUCCESS;
}

aclError aclFinalize(void) {
  Runtime& rt = RT();
  if (Stream* own = CurrentWorkerStream()) return WorkerSelfWait("aclFinalize", own->device);
  ShutdownAllStreams(/*exiting=*/false);
  rt.explicit_init.store(false);
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t* count) {
  if (count == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is null");
  *count = static_cast<uint32_t>(RT().count());
  return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
  aclError err = ACL_SUCCESS;
  if (!DeviceOrFail(deviceId, "aclrtSetDevice", &err)) return err;
  CurrentDevice() = deviceId;
  return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t* deviceId) {
  if (deviceId == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is null");
  aclError err = ACL_SUCCESS;
  if (!CurrentDeviceOrFail("aclrtGetDevice", &err)) return err;
  *deviceId = CurrentDevice();
  return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId) {
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(deviceId, "aclrtResetDevice", &err);
  if (!d) return err;
  // Waits for the device's queued work; memory and streams stay valid (and pending
  // task errors stay pending for the next synchronisation).
  Stream* own = CurrentWorkerStream();
  if (own && own->device == d->id) return WorkerSelfWait("aclrtResetDevice", d->id);
  if ((err = CheckDeviceNotCapturing(d, "aclrtResetDevice")) != ACL_SUCCESS) return err;
  auto streams = d->Snapshot();
  for (auto& s : streams)
    if (s->Orphaned()) return ForkedChildFail("aclrtResetDevice");
  for (auto& s : streams) s->WaitIdle();
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
  aclError err = ACL_SUCCESS;
  Device* d = CurrentDeviceOrFail("aclrtSynchronizeDevice", &err);
  if (!d) return err;
  if ((err = CheckDeviceNotCapturing(d, "aclrtSynchronizeDevice")) != ACL_SUCCESS) return err;
  return SyncDevice(d, "aclrtSynchronizeDevice");
}

const char* aclrtGetSocName(void) { return RT().soc.c_str(); }

const char* aclGetRecentErrMsg(void) { return RecentError(); }

// ---- memory --------------------------------------------------------------------
aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  (void)policy;  // all policies behave alike (no huge/normal page distinction)
  if (devPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is null");
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size 0 is invalid");
  aclError err = ACL_SUCCESS;
  Device* d = CurrentDeviceOrFail("aclrtMalloc", &err);
  if (!d) return err;
  return d->arena.Allocate(size, /*physical=*/false, devPtr);
}

aclError aclrtMallocAlign32(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  if (devPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocAlign32: devPtr is null");
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocAlign32: size 0 is invalid");
  if (size > SIZE_MAX - 31) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocAlign32: size too large");
  return aclrtMalloc(devPtr, (size + 31) / 32 * 32, policy);
}

aclError aclrtFree(void* devPtr) {
  if (devPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: devPtr is null");
  for (auto& d : RT().devices)
    if (d->arena.InMapping(devPtr)) return d->arena.Free(devPtr, /*physical=*/false);
  if (VmmReserved(devPtr))
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclrtFree: %p is reserved virtual memory (use aclrtUnmapMem, "
                "aclrtFreePhysical and aclrtReleaseMemAddress)",
                devPtr);
  return Fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: %p is not device memory", devPtr);
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
  if (hostPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is null");
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size 0 is invalid");
  void* p = nullptr;
  if (posix_memalign(&p, 64, size) != 0 || p == nullptr)
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                "aclrtMallocHost: out of host memory allocating %s (%zu bytes)",
                FormatBytes(size).c_str(), size);
  Runtime& rt = RT();
  {
    std::lock_guard<std::mutex> lk(rt.host_mu);
    rt.host_allocs.emplace(p, size);
  }
  *hostPtr = p;
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void* hostPtr) {
  if (hostPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is null");
  Runtime& rt = RT();
  {
    std::lock_guard<std::mutex> lk(rt.host_mu);
    if (rt.host_allocs.erase(hostPtr) == 0)
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtFreeHost: %p was not allocated by aclrtMallocHost (or already freed)",
                  hostPtr);
  }
  free(hostPtr);
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind) {
  if (aclError e = CheckCopy("aclrtMemcpy", dst, destMax, src, count, kind); e != ACL_SUCCESS)
    return e;
  if (kind != ACL_MEMCPY_HOST_TO_HOST) {
    if (aclError e = CheckUnsafeCall("aclrtMemcpy"); e != ACL_SUCCESS) return e;
  }
  if (count == 0) return ACL_SUCCESS;
  memmove(dst, src, count);
  RT().copied[kind].fetch_add(count, std::memory_order_relaxed);
  return ACL_SUCCESS;
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream) {
  aclError err = CheckCopy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
  if (err != ACL_SUCCESS) return err;
  Stream* s = ResolveStream(stream, "aclrtMemcpyAsync", &err);
  if (!s) return err;
  if (count == 0) return ACL_SUCCESS;
  Task t;
  t.kind = kTaskMemcpy;
  t.a = dst;
  t.b = src;
  t.n = count;
  if ((err = s->Enqueue(t)) != ACL_SUCCESS) return err;
  RT().copied[kind].fetch_add(count, std::memory_order_relaxed);
  return ACL_SUCCESS;
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count) {
  if (aclError e = CheckMemset("aclrtMemset", devPtr, maxCount, count); e != ACL_SUCCESS) return e;
  if (aclError e = CheckUnsafeCall("aclrtMemset"); e != ACL_SUCCESS) return e;
  memset(devPtr, value, count);
  return ACL_SUCCESS;
}

aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count,
                          aclrtStream stream) {
  aclError err = CheckMemset("aclrtMemsetAsync", devPtr, maxCount, count);
  if (err != ACL_SUCCESS) return err;
  Stream* s = ResolveStream(stream, "aclrtMemsetAsync", &err);
  if (!s) return err;
  if (count == 0) return ACL_SUCCESS;
  Task t;
  t.kind = kTaskMemset;
  t.a = devPtr;
  t.value = value;
  t.n = count;
  return s->Enqueue(t);
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: null output pointer");
  if (attr == ACL_DDR_MEM) {
    long page = sysconf(_SC_PAGESIZE);
    *total = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page;
    *free = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
    return ACL_SUCCESS;
  }
  if (attr != ACL_HBM_MEM)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: invalid attr %d", static_cast<int>(attr));
  aclError err = ACL_SUCCESS;
  Device* d = CurrentDeviceOrFail("aclrtGetMemInfo", &err);
  if (!d) return err;
  size_t used = d->arena.Used();
  *total = d->capacity;
  *free = d->capacity > used ? d->capacity - used : 0;
  return ACL_SUCCESS;
}

// ---- streams -------------------------------------------------------------------
aclError aclrtCreateStreamWithConfig(aclrtStream* stream, uint32_t priority, uint32_t flag) {
  if (stream == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream is null");
  aclError err = ACL_SUCCESS;
  Device* d = CurrentDeviceOrFail("aclrtCreateStream", &err);
  if (!d) return err;
  auto s = std::make_shared<Stream>();
  s->device = d->id;
  s->priority = priority;
  s->flags = flag;
  {
    std::lock_guard<std::mutex> lk(d->mu);
    d->streams.push_back(s);
  }
  *stream = s.get();
  return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream* stream) {
  return aclrtCreateStreamWithConfig(stream, 0, 0);
}

aclError aclrtDestroyStream(aclrtStream stream) {
  if (stream == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: the default stream (NULL) cannot be destroyed");
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStream(stream, "aclrtDestroyStream", &err);
  if (!s) return err;
  if (s->is_default)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: %p is the default stream of device %d",
                stream, s->device);
  if (s->IsCurrentWorker()) return WorkerSelfWait("aclrtDestroyStream", s->device);
  if ((err = CheckStreamNotCapturing(s, "aclrtDestroyStream")) != ACL_SUCCESS) return err;
  Device* d = RT().devices[s->device].get();
  std::shared_ptr<Stream> keep;
  {
    std::lock_guard<std::mutex> lk(d->mu);
    for (auto it = d->streams.begin(); it != d->streams.end(); ++it) {
      if (it->get() == s) {
        keep = std::move(*it);
        d->streams.erase(it);
        break;
      }
    }
  }
  if (!keep || keep->magic.exchange(0) != Stream::kMagic)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: invalid stream handle %p (destroyed?)", stream);
  keep->Shutdown(/*restartable=*/false);  // racing enqueues run inline, none is stranded
  // An unreported task failure is handed to the device: the next
  // aclrtSynchronizeDevice reports it.
  std::string msg;
  int rc = 0;
  if (keep->TakeError(&msg, &rc)) {
    std::lock_guard<std::mutex> lk(d->mu);
    if (d->orphan_count++ == 0) {
      d->orphan_error = std::move(msg);
      d->orphan_rc = rc;
    }
  }
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStream(stream, "aclrtSynchronizeStream", &err);
  if (!s) return err;
  if ((err = CheckStreamNotCapturing(s, "aclrtSynchronizeStream")) != ACL_SUCCESS) return err;
  return SyncStream(s, "aclrtSynchronizeStream");
}

aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus* status) {
  if (status == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: status is null");
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStream(stream, "aclrtStreamQuery", &err);
  if (!s) return err;
  if ((err = CheckStreamNotCapturing(s, "aclrtStreamQuery")) != ACL_SUCCESS) return err;
  *status = s->Idle() ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtStreamWaitEvent", &err);
  if (!e) return err;
  Stream* s = ResolveStream(stream, "aclrtStreamWaitEvent", &err);
  if (!s) return err;
  bool handled = false;
  if ((err = CaptureEventWait(s, e, &handled)) != ACL_SUCCESS || handled) return err;
  uint64_t gen = e->recorded.load(std::memory_order_acquire);
  // (an external event's flag is judged when the wait runs, even before any record)
  if (!(e->flags & ACL_EVENT_EXTERNAL) && (gen == 0 || e->Done(gen))) return ACL_SUCCESS;  // nothing outstanding
  Task t;
  t.kind = kTaskEventWait;
  t.a = e;
  t.n = gen;
  e->Ref();
  if ((err = s->Enqueue(t)) != ACL_SUCCESS) e->Unref();
  return err;
}

aclError aclrtLaunchCallback(aclrtCallback fn, void* userData, aclrtCallbackBlockType blockType,
                             aclrtStream stream) {
  if (fn == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: fn is null");
  if (blockType != ACL_CALLBACK_NO_BLOCK && blockType != ACL_CALLBACK_BLOCK)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: invalid blockType %d",
                static_cast<int>(blockType));
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStream(stream, "aclrtLaunchCallback", &err);
  if (!s) return err;
  Task t;
  t.kind = kTaskCallback;
  t.fn = reinterpret_cast<void*>(fn);
  t.a = userData;
  return s->Enqueue(t);
}

// ---- events --------------------------------------------------------------------
aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag) {
  if (event == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent: event is null");
  RT();
  if (flag & ACL_EVENT_IPC) {
    if (flag != ACL_EVENT_IPC)
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent: ACL_EVENT_IPC cannot be combined with other flags "
                  "(flag %#x)", flag);
    return CreateIpcEvent(event);
  }
  auto* e = new Event();
  e->flags = flag;
  *event = e;
  return ACL_SUCCESS;
}

aclError aclrtCreateEvent(aclrtEvent* event) {
  return aclrtCreateEventWithFlag(event, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE);
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtDestroyEvent", &err);
  if (!e) return err;
  if (e->magic.exchange(0) != Event::kMagic)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent: invalid event handle %p", event);
  e->Unref();  // queued records/waits keep it alive until they ran
  return ACL_SUCCESS;
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtRecordEvent", &err);
  if (!e) return err;
  Stream* s = ResolveStream(stream, "aclrtRecordEvent", &err);
  if (!s) return err;
  if (s->capture.load(std::memory_order_acquire) != nullptr) return CaptureEventRecord(s, e);
  Task t;
  t.kind = kTaskEventRecord;
  t.a = e;
  snprintf(t.name, sizeof(t.name), "aclrtRecordEvent");
  // Refused (before the generation moves on) by a stream recording a task group update.
  if (s->update.load(std::memory_order_acquire) != nullptr) return UpdateTask(s, t);
  e->capture_id.store(0, std::memory_order_release);
  e->Ref();
  e->record_pid.store(getpid(), std::memory_order_relaxed);
  e->record_device.store(s->device, std::memory_order_relaxed);
  t.n = e->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  if ((err = s->Enqueue(t)) != ACL_SUCCESS) {
    e->Complete(t.n);  // keep queries from hanging on a record that never ran
    e->Unref();
  }
  return err;
}

aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtResetEvent", &err);
  if (!e) return err;
  if (e->ipc != nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtResetEvent: an ACL_EVENT_IPC event cannot be reset");
  Stream* s = ResolveStream(stream, "aclrtResetEvent", &err);
  if (!s) return err;
  if (s->capture.load(std::memory_order_acquire) != nullptr) return CaptureEventReset(s, e);
  Task t;
  t.kind = kTaskEventReset;
  t.a = e;
  e->Ref();
  if ((err = s->Enqueue(t)) != ACL_SUCCESS) e->Unref();
  return err;
}

aclError aclrtSynchronizeEvent(aclrtEvent event) {
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtSynchronizeEvent", &err);
  if (!e) return err;
  if ((err = CheckEventNotCaptured(e, "aclrtSynchronizeEvent")) != ACL_SUCCESS) return err;
  if (RT().forked_child && !e->Done(e->recorded.load(std::memory_order_acquire)) &&
      e->record_pid.load(std::memory_order_relaxed) != getpid())
    return ForkedChildFail("aclrtSynchronizeEvent");  // recorded by the parent: never completes here
  e->WaitFor(e->recorded.load(std::memory_order_acquire));
  return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status) {
  if (status == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status is null");
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtQueryEventStatus", &err);
  if (!e) return err;
  if ((err = CheckEventNotCaptured(e, "aclrtQueryEventStatus")) != ACL_SUCCESS) return err;
  *status = e->Done(e->recorded.load(std::memory_order_acquire))
                ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtEventElapsedTime(float* ms, aclrtEvent start, aclrtEvent end) {
  if (ms == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms is null");
  aclError err = ACL_SUCCESS;
  Event* ev[2] = {ResolveEvent(start, "aclrtEventElapsedTime", &err), nullptr};
  if (!ev[0]) return err;
  ev[1] = ResolveEvent(end, "aclrtEventElapsedTime", &err);
  if (!ev[1]) return err;
  int64_t stamp[2];
  for (int i = 0; i < 2; ++i) {
    const char* which = i == 0 ? "start" : "end";
    Event* e = ev[i];
    if (!(e->flags & ACL_EVENT_TIME_LINE))
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtEventElapsedTime: %s event was created without ACL_EVENT_TIME_LINE "
                  "(timing disabled)",
                  which);
    uint64_t gen = e->recorded.load(std::memory_order_acquire);
    if (gen == 0)
      return Fail(ACL_ERROR_RT_EVENT_NOT_RECORDED,
                  "aclrtEventElapsedTime: %s event was never recorded", which);
    if (!e->Done(gen))
      return Fail(ACL_ERROR_RT_EVENT_NOT_RECORDED,
                  "aclrtEventElapsedTime: %s event has not completed yet (synchronise it first)",
                  which);
    stamp[i] = e->stamp_ns.load(std::memory_order_acquire);
    if (stamp[i] < 0)
      return Fail(ACL_ERROR_RT_EVENT_NOT_RECORDED,
                  "aclrtEventElapsedTime: %s event was reset after its last record", which);
  }
  // Each device has its own clock: events of two devices are not comparable.
  const int start_device = ev[0]->record_device.load(std::memory_order_relaxed);
  const int end_device = ev[1]->record_device.load(std::memory_order_relaxed);
  if (start_device != end_device)
    return Fail(ACL_ERROR_RT_PARAM_INVALID,
                "aclrtEventElapsedTime: the start event was recorded on device %d and the end event on "
                "device %d (events of different devices cannot be timed)",
                start_device, end_device);
  *ms = static_cast<float>(static_cast<double>(stamp[1] - stamp[0]) / 1e6);
  return ACL_SUCCESS;
}

aclError aclrtEventGetTimestamp(aclrtEvent event, uint64_t* timestamp) {
  if (timestamp == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtEventGetTimestamp: timestamp is null");
  aclError err = ACL_SUCCESS;
  Event* e = ResolveEvent(event, "aclrtEventGetTimestamp", &err);
  if (!e) return err;
  uint64_t gen = e->recorded.load(std::memory_order_acquire);
  if (gen == 0) return Fail(ACL_ERROR_RT_EVENT_NOT_RECORDED, "aclrtEventGetTimestamp: the event was never recorded");
  if (!e->Done(gen))
    return Fail(ACL_ERROR_RT_EVENT_NOT_RECORDED,
                "aclrtEventGetTimestamp: the event has not completed yet (synchronise it first)");
  const int64_t ns = e->stamp_ns.load(std::memory_order_acquire);
  if (ns < 0)
    return Fail(ACL_ERROR_RT_EVENT_NOT_RECORDED, "aclrtEventGetTimestamp: the event was reset after its last record");
  *timestamp = static_cast<uint64_t>(ns) / 1000;
  return ACL_SUCCESS;
}

// ---- simulator extensions ----------------------------------------------------------
aclError aclsimLaunchKernel(aclrtStream stream, aclsimKernelFn fn, void* userData,
                            const char* name) {
  if (fn == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "aclsimLaunchKernel: fn is null");
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStream(stream, "aclsimLaunchKernel", &err);
  if (!s) return err;
  Task t;
  t.kind = kTaskKernel;
  t.fn = reinterpret_cast<void*>(fn);
  t.a = userData;
  CopyName(t, name);
  return s->Enqueue(t);
}

int32_t aclsimPointerDevice(const void* ptr) {
  Device* d = FindDevice(ptr, 0);
  return d ? d->id : -1;
}

int32_t aclsimStreamId(aclrtStream stream) {
  aclError err = ACL_SUCCESS;
  Stream* s = ResolveStream(stream, "aclsimStreamId", &err);
  return s ? s->Serial() : -1;
}

int32_t aclsimStreamDevice(aclrtStream stream) {
  if (stream == nullptr) {
    aclError err = ACL_SUCCESS;
    Stream* s = ResolveStream(stream, "aclsimStreamDevice", &err);
    return s ? s->device : -1;
  }
  // Looked up among the live streams, never dereferenced: any address may come in.
  for (auto& d : RT().devices) {
    std::lock_guard<std::mutex> g(d->mu);
    for (auto& s : d->streams)
      if (s.get() == stream) return d->id;
  }
  return -1;
}

aclrtStream aclsimDefaultStream(int32_t deviceId) {
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(deviceId, "aclsimDefaultStream", &err);
  return d ? d->DefaultStream() : nullptr;
}

int aclsimOnWorkerThread(void) { return CurrentWorkerStream() != nullptr; }

int aclsimOnWorkerOf(aclrtStream stream) {
  Stream* own = CurrentWorkerStream();
  if (own == nullptr) return 0;
  if (stream == nullptr) return own->is_default && own->device == CurrentDevice();
  return own == static_cast<Stream*>(stream);
}

uint64_t aclsimCopiedBytes(aclrtMemcpyKind kind) {
  if (kind < ACL_MEMCPY_HOST_TO_HOST || kind > ACL_MEMCPY_DEVICE_TO_DEVICE) return 0;
  return RT().copied[kind].load(std::memory_order_relaxed);
}

int64_t aclsimDeviceBusyNs(int32_t deviceId) {
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(deviceId, "aclsimDeviceBusyNs", &err);
  return d ? d->busy_ns.load(std::memory_order_relaxed) : -1;
}

aclError aclsimDeviceAddBusyNs(int32_t deviceId, int64_t ns) {
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(deviceId, "aclsimDeviceAddBusyNs", &err);
  if (d == nullptr) return err;
  if (ns < 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclsimDeviceAddBusyNs: ns is negative (%lld)", (long long)ns);
  d->AddBusy(ns);
  return ACL_SUCCESS;
}

int aclsimHostRefusedLastAllocation(size_t* available) {
  size_t bytes = 0;
  if (!HostRefusedLastAllocation(&bytes)) return 0;
  if (available != nullptr) *available = bytes;
  return 1;
}

int aclsimRuntimeStarted(void) { return RuntimeStarted() ? 1 : 0; }

int32_t aclsimVisibleDeviceCount(void) { return VisibleCountNow(); }

size_t aclsimDeviceCapacity(int32_t deviceId) {
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(deviceId, "aclsimDeviceCapacity", &err);
  return d ? d->capacity : 0;
}

aclError aclsimDeviceArena(int32_t deviceId, void** base, size_t* size, int* fd) {
  aclError err = ACL_SUCCESS;
  Device* d = DeviceOrFail(deviceId, "aclsimDeviceArena", &err);
  if (!d) return err;
  if ((err = d->arena.EnsureMapped()) != ACL_SUCCESS) return err;  // maps it if needed
  if (base) *base = d->arena.base();
  if (size) *size = d->arena.map_size();
  if (fd) *fd = d->arena.fd();
  return ACL_SUCCESS;
}

}  // extern "C"
