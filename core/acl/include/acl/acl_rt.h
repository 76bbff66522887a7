// ACL-style runtime C API of the NPU simulator ("CANN simulator").
//
// Names, types and error codes follow Huawei's AscendCL runtime (acl/acl_rt.h) so
// that the layers above could one day link the real libascendcl instead. Functions
// prefixed `aclsim` are simulator extensions with no AscendCL counterpart.
//
// Device memory is host memory: each device owns a lazily-backed arena (a memfd of
// the device's HBM capacity, mapped MAP_SHARED|MAP_NORESERVE) so an idle 64 GiB
// device costs only the pages touched, and pointers can be read by the CPU.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "acl_base.h"  // aclError, aclrtStream, aclrtEvent, the error codes

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ACL_MEM_MALLOC_HUGE_FIRST = 0,
  ACL_MEM_MALLOC_HUGE_ONLY = 1,
  ACL_MEM_MALLOC_NORMAL_ONLY = 2,
} aclrtMemMallocPolicy;

typedef enum {
  ACL_MEMCPY_HOST_TO_HOST = 0,
  ACL_MEMCPY_HOST_TO_DEVICE = 1,
  ACL_MEMCPY_DEVICE_TO_HOST = 2,
  ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
} aclrtMemcpyKind;

typedef enum {
  ACL_DDR_MEM = 0,
  ACL_HBM_MEM = 1,
  ACL_DDR_MEM_HUGE = 2,
  ACL_DDR_MEM_NORMAL = 3,
  ACL_HBM_MEM_HUGE = 4,
  ACL_HBM_MEM_NORMAL = 5,
  ACL_DDR_MEM_P2P_HUGE = 6,
  ACL_DDR_MEM_P2P_NORMAL = 7,
  ACL_HBM_MEM_P2P_HUGE = 8,
  ACL_HBM_MEM_P2P_NORMAL = 9,
  ACL_HBM_MEM_HUGE1G = 10,
  ACL_HBM_MEM_P2P_HUGE1G = 11,
} aclrtMemAttr;

// Virtual memory management (aclrtReserveMemAddress & co).
typedef void* aclrtDrvMemHandle;  // physical memory from aclrtMallocPhysical

typedef enum {
  ACL_MEM_LOCATION_TYPE_HOST = 0,  // not simulated
  ACL_MEM_LOCATION_TYPE_DEVICE = 1,
} aclrtMemLocationType;

typedef struct aclrtMemLocation {
  uint32_t id;  // device id
  aclrtMemLocationType type;
} aclrtMemLocation;

typedef enum { ACL_MEM_HANDLE_TYPE_NONE = 0 } aclrtMemHandleType;
typedef enum { ACL_MEM_ALLOCATION_TYPE_PINNED = 0 } aclrtMemAllocationType;

typedef struct aclrtPhysicalMemProp {
  aclrtMemHandleType handleType;
  aclrtMemAllocationType allocationType;
  aclrtMemAttr memAttr;
  aclrtMemLocation location;
  uint64_t reserve;
} aclrtPhysicalMemProp;

typedef enum {
  ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
  ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
} aclrtMemGranularityOptions;

typedef enum {
  ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
  ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
} aclrtEventRecordedStatus;

typedef enum {
  ACL_STREAM_STATUS_COMPLETE = 0,
  ACL_STREAM_STATUS_NOT_READY = 1,
} aclrtStreamStatus;

typedef enum {
  ACL_CALLBACK_NO_BLOCK = 0,
  ACL_CALLBACK_BLOCK = 1,
} aclrtCallbackBlockType;

typedef void (*aclrtCallback)(void* userData);

// Event flags (aclrtCreateEventWithFlag).
#define ACL_EVENT_SYNC 0x1u
#define ACL_EVENT_TIME_LINE 0x8u   // event records a timestamp
// An external event is a flag: a record sets it, aclrtResetEvent clears it, and a stream
// waiting for it (aclrtStreamWaitEvent, also before any record, also inside a captured
// model at each execution) waits until it is set. Graph task updates use it to make a
// replay wait for the update (see aclmdlRICaptureTaskUpdateBegin).
#define ACL_EVENT_EXTERNAL 0x20u
// An IPC event (the only flag it takes) can be shared with other processes
// (aclrtIpcGetEventHandle / aclrtIpcOpenEventHandle); it does not time.
#define ACL_EVENT_IPC 0x40u

// ---- init / devices -------------------------------------------------------------
// aclInit is optional: every API initialises the simulator on first use.
aclError aclInit(const char* configPath);
aclError aclFinalize(void);
// Number of visible devices (profile count, filtered by ASCEND_RT_VISIBLE_DEVICES).
aclError aclrtGetDeviceCount(uint32_t* count);
// Current device is per host thread, as in AscendCL. Default: device 0.
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtGetDevice(int32_t* deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtSynchronizeDevice(void);  // all streams of the current device
// SoC name of the profile, e.g. "Ascend910B1".
const char* aclrtGetSocName(void);
// Message of the last failed call on this thread ("" if none).
const char* aclGetRecentErrMsg(void);

// ---- memory --------------------------------------------------------------------
// Allocates on the current device. Fails with ACL_ERROR_RT_MEMORY_ALLOCATION when
// the device's capacity would be exceeded. size 0 is invalid (as in AscendCL).
aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy);
// As aclrtMalloc, the size rounded up to a multiple of 32 bytes (no extra padding).
aclError aclrtMallocAlign32(void** devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void* devPtr);  // releases the pages back to the OS
aclError aclrtMallocHost(void** hostPtr, size_t size);  // "pinned" host memory
aclError aclrtFreeHost(void* hostPtr);
// Synchronous copy (waits for nothing queued; like AscendCL's blocking memcpy).
aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind);
// Copy enqueued on `stream`.
aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream);
aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count);
aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count,
                          aclrtStream stream);
// free/total of the current device (HBM); free = capacity - bytes aclrtMalloc'ed
// - bytes aclrtMallocPhysical'ed.
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total);

// ---- virtual memory ------------------------------------------------------------
// Reserve a virtual range, back it piecewise with physical memory, map and unmap at
// will. Sizes and addresses are in units of the granularity (2 MiB). A reserved but
// unmapped address is not device memory (aclsimPointerDevice gives -1, copies fail).
// 2 MiB for every prop and option.
aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp* prop,
                                          aclrtMemGranularityOptions option,
                                          size_t* granularity);
// Size rounded up to the granularity. alignment: 0 or a power of two (the range is
// aligned to at least the granularity). expectPtr: NULL, or a granularity-aligned
// address that must be free (else ACL_ERROR_RT_MEMORY_ALLOCATION). flags: 0 or 1
// (normal/huge pages; no difference here). Costs no memory.
aclError aclrtReserveMemAddress(void** virPtr, size_t size, size_t alignment,
                                void* expectPtr, uint64_t flags);
// virPtr: the start of a reservation with nothing mapped in it any more.
aclError aclrtReleaseMemAddress(void* virPtr);
// Physical memory on device prop->location.id (ACL_MEM_LOCATION_TYPE_DEVICE), size
// rounded up to the granularity and counted in the device's capacity like aclrtMalloc
// (ACL_ERROR_RT_MEMORY_ALLOCATION when it would be exceeded). flags must be 0.
aclError aclrtMallocPhysical(aclrtDrvMemHandle* handle, size_t size,
                             const aclrtPhysicalMemProp* prop, uint64_t flags);
// Fails while the handle is still mapped. The pages go back to the OS.
aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
// Maps all of `handle` at virPtr (granularity-aligned, inside one reservation, over
// nothing mapped yet). size: the handle's size (as given to aclrtMallocPhysical, or
// rounded up); offset and flags must be 0. A handle may be mapped several times; a
// reservation maps memory of one device at a time.
aclError aclrtMapMem(void* virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle,
                     uint64_t flags);
// virPtr: the start of a mapping. Does not synchronise (like aclrtFree).
aclError aclrtUnmapMem(void* virPtr);

// ---- inter-process memory sharing --------------------------------------------------
// The exporter names [devPtr, devPtr+size) of one aclrtMalloc allocation with a key (a
// NUL-terminated string of at most ACL_IPC_HANDLE_SIZE bytes); another process of the same
// user imports the key and gets its own device pointer to the same memory (the simulator
// maps the exporter's device memory file), valid until it calls aclrtIpcMemClose. With
// ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT only processes named by aclrtIpcMemSetImportPid may
// import; ..._DISABLE_PID_VALIDATION lets any process import. The exporter must keep the
// allocation alive while importers use it. aclrtIpcMemClose in the exporter withdraws the key.
#define ACL_IPC_HANDLE_SIZE 65
#define ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT 0x0UL
#define ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION 0x1UL
#define ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT 0x0UL
#define ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS 0x1UL
aclError aclrtIpcMemGetExportKey(void* devPtr, size_t size, char* key, size_t len, uint64_t flag);
aclError aclrtIpcMemSetImportPid(const char* key, int32_t* pid, size_t num);
aclError aclrtIpcMemImportByKey(void** devPtr, const char* key, uint64_t flag);
aclError aclrtIpcMemClose(const char* key);

// ---- host memory mapped into the device ------------------------------------------
// aclrtHostRegister makes [ptr, ptr+size) of host memory (e.g. from aclrtMallocHost)
// addressable by the current device: *devPtr is its device address (in the simulator the
// same address, as with the driver's VA normalisation), accepted wherever device memory
// is (copies, kernels, aclsimPointerDevice) until aclrtHostUnregister(ptr). It is not
// device memory: aclrtGetMemInfo does not count it. Ranges must not overlap device memory
// or another registration.
typedef enum { ACL_HOST_REGISTER_MAPPED = 0 } aclrtHostRegisterType;
aclError aclrtHostRegister(void* ptr, uint64_t size, aclrtHostRegisterType type, void** devPtr);
aclError aclrtHostUnregister(void* ptr);

// ---- inter-process events ----------------------------------------------------------
// An ACL_EVENT_IPC event's handle opens, in another process of the same user, an event
// that shares its state: a record in either process moves the event on, and a query,
// synchronisation or stream wait in either sees the latest record made by any of them
// (the simulator keeps the event's counters in a shared memory page of the creator,
// reached through /proc/<creator>/fd). The handle is valid while the creator's event lives.
#define ACL_IPC_EVENT_HANDLE_SIZE 64U
typedef struct aclrtIpcEventHandle {
  char reserved[ACL_IPC_EVENT_HANDLE_SIZE];
} aclrtIpcEventHandle;
aclError aclrtIpcGetEventHandle(aclrtEvent event, aclrtIpcEventHandle* handle);
aclError aclrtIpcOpenEventHandle(aclrtIpcEventHandle handle, aclrtEvent* event);

// ---- streams -------------------------------------------------------------------
// A stream is an ordered task queue executed by its own worker thread. Each device
// has a default stream, obtained by passing stream == NULL to any stream API
// (resolved against the calling thread's current device).
aclError aclrtCreateStream(aclrtStream* stream);  // on the current device
aclError aclrtCreateStreamWithConfig(aclrtStream* stream, uint32_t priority, uint32_t flag);
aclError aclrtDestroyStream(aclrtStream stream);  // drains it first
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus* status);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
// Enqueue a host callback; it runs on the stream's worker in stream order.
aclError aclrtLaunchCallback(aclrtCallback fn, void* userData,
                             aclrtCallbackBlockType blockType, aclrtStream stream);

// ---- events --------------------------------------------------------------------
aclError aclrtCreateEvent(aclrtEvent* event);  // timing enabled
aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtSynchronizeEvent(aclrtEvent event);
// COMPLETE for an event never recorded (as CUDA's cudaEventQuery).
aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status);
aclError aclrtEventElapsedTime(float* ms, aclrtEvent start, aclrtEvent end);
// When the event's latest record completed, in microseconds since the device started
// (here: the host's steady clock). The event must have completed.
aclError aclrtEventGetTimestamp(aclrtEvent event, uint64_t* timestamp);

// ---- model runtime instances: stream capture (acl/acl_mdl.h) ------------------------
// Between aclmdlRICaptureBegin and aclmdlRICaptureEnd the tasks launched on a stream
// (kernels, callbacks, async copies and memsets, event records) are recorded into a
// model runtime instance instead of running; aclmdlRIExecuteAsync runs them again, in
// order, on any stream of the device, as often as wanted. A stream waiting for an event
// recorded inside a capture joins that capture (its tasks are recorded too) until the
// capture ends. While capturing, synchronising the stream (or querying it) or its
// device fails with ACL_ERROR_RT_STREAM_CAPTURED / ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT
// and invalidates the capture: aclmdlRICaptureEnd then returns
// ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED (naming the first failure) and no model.
typedef void* aclmdlRI;

typedef enum {
  ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0,   // unsafe calls (synchronous copies and memsets)
                                          // fail on every thread
  ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL, // ... on the capturing thread
  ACL_MODEL_RI_CAPTURE_MODE_RELAXED,      // allowed everywhere
} aclmdlRICaptureMode;

typedef enum {
  ACL_MODEL_RI_CAPTURE_STATUS_NONE = 0,
  ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE,
  ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED,
} aclmdlRICaptureStatus;

aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode);
// status NONE (modelRI NULL) when the stream does not capture. modelRI may be NULL.
aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus* status,
                                aclmdlRI* modelRI);
aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI);
// Swaps the calling thread's capture mode (the mode its unsafe calls are judged by).
aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode* mode);
// Enqueues one execution of the model on `stream` (a stream of the model's device).
aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream);
// Runs the model on the device's default stream and waits for it. timeout (ms): -1 only.
aclError aclmdlRIExecute(aclmdlRI modelRI, int32_t timeout);
// Invalidates the handle; the model is freed once its queued executions have run.
aclError aclmdlRIDestroy(aclmdlRI modelRI);
// Task groups: the tasks a capturing stream records between aclmdlRICaptureTaskGrpBegin
// and aclmdlRICaptureTaskGrpEnd (no nesting) form a group whose parameters can be updated
// after the capture. Between aclmdlRICaptureTaskUpdateBegin(stream, group) and
// aclmdlRICaptureTaskUpdateEnd(stream), the tasks launched on `stream` (a stream that does
// not capture) are recorded, not run, as the group's new tasks: as many as the group has,
// of the same kinds (kernels, callbacks, copies, memsets; event tasks are refused).
// aclmdlRICaptureTaskUpdateEnd checks them and enqueues the update on `stream`: when the
// stream gets there, the group's tasks are replaced, and executions that reach the group
// afterwards run the new ones. Order replays after the update with an event (e.g. an
// ACL_EVENT_EXTERNAL event waited for at the start of the group and recorded on the
// update stream after aclmdlRICaptureTaskUpdateEnd). A group handle is valid as long as
// its model.
typedef void* aclrtTaskGrp;
aclError aclmdlRICaptureTaskGrpBegin(aclrtStream stream);
aclError aclmdlRICaptureTaskGrpEnd(aclrtStream stream, aclrtTaskGrp* handle);
aclError aclmdlRICaptureTaskUpdateBegin(aclrtStream stream, aclrtTaskGrp handle);
aclError aclmdlRICaptureTaskUpdateEnd(aclrtStream stream);
// Prints the model's tasks to stdout / writes them as JSON to `path` (flags: 0 or 1).
aclError aclmdlRIDebugPrint(aclmdlRI modelRI);
aclError aclmdlRIDebugJsonPrint(aclmdlRI modelRI, const char* path, uint32_t flags);

// ---- simulator extensions ----------------------------------------------------------
// A kernel: runs on the stream's worker in order. Returning non-zero marks the
// stream failed: the next synchronising call on that stream (or device) returns
// ACL_ERROR_RT_AICORE_EXCEPTION once (ACL_ERROR_RT_MEMORY_ALLOCATION if the kernel
// returned that code: it ran out of device memory), and aclGetRecentErrMsg() on that
// thread then reads "<name>: <message written to errBuf>". The stream stays usable after.
typedef int (*aclsimKernelFn)(void* userData, char* errBuf, size_t errBufLen);
aclError aclsimLaunchKernel(aclrtStream stream, aclsimKernelFn fn, void* userData,
                            const char* name);
// Whether the runtime has started (the first AscendCL call starts it; it reads
// ASCEND_RT_VISIBLE_DEVICES, ASCEND_SIM_SOC, ASCEND_SIM_DEVICE_COUNT then).
int aclsimRuntimeStarted(void);
// The number of visible devices without starting the runtime: before it starts, what it would
// have if it started now (the environment read again on every call, as the driver's count
// and ASCEND_RT_VISIBLE_DEVICES are before AscendCL initialises); after, aclrtGetDeviceCount's.
int32_t aclsimVisibleDeviceCount(void);
// Device that owns `ptr` (anywhere inside an allocation or a mapped virtual range), or
// -1 for host memory.
int32_t aclsimPointerDevice(const void* ptr);
// The serial of a stream (NULL = current device's default stream): the s<serial> of its
// worker thread's name, and the stream id of its tasks in profiles; -1 if invalid.
int32_t aclsimStreamId(aclrtStream stream);
// Device of a stream (NULL = current device's default stream), or -1 when `stream` is not
// a live stream (any address may be passed: it is looked up, not dereferenced).
int32_t aclsimStreamDevice(aclrtStream stream);
// The resolved handle of the current device's default stream (never NULL).
aclrtStream aclsimDefaultStream(int32_t deviceId);
// True when called from a stream worker thread (kernels must not synchronise).
int aclsimOnWorkerThread(void);
// True when called from the worker thread of `stream` (NULL = current device's default
// stream), i.e. from a task of that stream.
int aclsimOnWorkerOf(aclrtStream stream);
// Copy accounting: bytes moved by aclrtMemcpy/aclrtMemcpyAsync per kind since start
// (kind in aclrtMemcpyKind). Used by tests proving "no hidden copies".
uint64_t aclsimCopiedBytes(aclrtMemcpyKind kind);
// Nanoseconds the streams of a device spent running tasks since start, summed over its
// streams (kernels run on the launching thread count once reported with
// aclsimDeviceAddBusyNs); -1 for an invalid id.
int64_t aclsimDeviceBusyNs(int32_t deviceId);
// Adds the time of a task the host ran in a stream's place (in stream order, on the calling
// thread) to the device's busy time.
aclError aclsimDeviceAddBusyNs(int32_t deviceId, int64_t ns);
// Capacity of a device in bytes (profile or ASCEND_SIM_HBM_BYTES override).
size_t aclsimDeviceCapacity(int32_t deviceId);
// 1 when the calling thread's last device allocation failed because the host could not
// back it (device memory is host memory), with the bytes it could still back; else 0.
int aclsimHostRefusedLastAllocation(size_t* available);
// Arena of a device: base address and memfd (for sharing with other processes).
aclError aclsimDeviceArena(int32_t deviceId, void** base, size_t* size, int* fd);
// Profiling (the layer under torch_npu.profiler). While enabled, every kernel, copy,
// memset, host callback and graph execution a stream runs is recorded: what it was, where
// it ran (device; stream = the serial in its worker's name "npu<d>-s<serial>"), a
// correlation id, the thread that launched it and when, and when it started and ended.
// Times are aclsimNowNs() (steady clock, ns).
typedef enum {
  ACLSIM_PROF_KERNEL = 0,
  ACLSIM_PROF_MEMCPY = 1,
  ACLSIM_PROF_MEMSET = 2,
  ACLSIM_PROF_CALLBACK = 3,
  ACLSIM_PROF_GRAPH = 4,
} aclsimProfKind;
typedef struct {
  char name[56];  // kernels and graphs
  int32_t kind;   // aclsimProfKind
  int32_t device;
  int32_t stream;
  int32_t launch_tid;
  uint64_t correlation;
  int64_t launch_ns;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t bytes;  // copies and memsets
  uint64_t host_op;  // the launching thread's tag (aclsimProfilerSetLaunchTag) at launch
} aclsimProfRecord;
aclError aclsimProfilerEnable(int enable);
// Tags the calling thread's later launches (e.g. with the host operator running them).
void aclsimProfilerSetLaunchTag(uint64_t tag);
int aclsimProfilerEnabled(void);
int64_t aclsimNowNs(void);
// Records a kernel run on the calling thread (not through a stream's queue).
aclError aclsimProfilerRecord(const char* name, int32_t deviceId, int32_t stream, int64_t startNs,
                              int64_t endNs);
// Moves up to max records (oldest first) into out and returns how many; out NULL: just
// the count. *dropped (if not NULL): records lost to the buffer limit since the last call.
size_t aclsimProfilerDrain(aclsimProfRecord* out, size_t max, uint64_t* dropped);
// Virtual memory, for sharing with other processes: the reservation holding ptr (start,
// size, an id unique in the process, device of its mapped memory or -1) and, if asked
// (arenaOffset not NULL; ptr must then be mapped), the arena (memfd) offset of the byte
// at ptr. Any output may be NULL.
aclError aclsimVmmLookup(const void* ptr, void** resStart, size_t* resSize, uint64_t* resId,
                         int32_t* deviceId, uint64_t* arenaOffset);
// Model extensions. Calls fn(userData) when the model is freed (after aclmdlRIDestroy
// and its last queued execution): owners of recorded kernels' userData free it there.
// A callback whose userData is the userData of a recorded kernel belongs to that kernel:
// when a task update replaces the kernel, it is called once no execution of the model
// runs any more (or when the model is freed, if that comes first).
aclError aclsimModelRIAddDestroyCallback(aclmdlRI modelRI, aclrtCallback fn, void* userData);
// The model whose task group `stream` is updating (between aclmdlRICaptureTaskUpdateBegin
// and End), or NULL.
aclError aclsimStreamTaskUpdateModel(aclrtStream stream, aclmdlRI* modelRI);
// Number of recorded tasks; a unique id of the model (never reused in the process).
aclError aclsimModelRIInfo(aclmdlRI modelRI, size_t* numTasks, uint64_t* id);
// Invalidates the capture `stream` takes part in, with a reason aclmdlRICaptureEnd
// reports (for failures the layers above detect while capturing).
aclError aclsimCaptureInvalidate(aclrtStream stream, const char* reason);

#ifdef __cplusplus
}
#endif
