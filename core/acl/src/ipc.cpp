// Inter-process memory sharing: aclrtIpcMemGetExportKey / SetImportPid / ImportByKey / Close,
// and inter-process events: aclrtIpcGetEventHandle / aclrtIpcOpenEventHandle.
//
// Device memory is a range of the device's arena memfd (device.cpp), so another process
// of the same user reaches it through /proc/<exporter>/fd/<arena fd> and maps the range
// MAP_SHARED: both processes then see the same bytes, as two processes do with real IPC
// memory. The key spells where the range is:
//   aclsim-ipc:<exporter pid>:<physical device>:<arena fd>:<offset>:<size>:<validate pids>
// Imports are registered so that FindDevice accepts their pointers (copies, kernels).
// With pid validation, the processes allowed to import are listed in a file in /dev/shm
// that aclrtIpcMemSetImportPid writes and aclrtIpcMemClose (exporter side) removes.
//
// An ACL_EVENT_IPC event keeps its counters (IpcEventShared) in a page of its own memfd
// "aclsim_ipc_event"; its handle spells aclsim-ipcev:<creator pid>:<memfd>, and opening it
// maps that page through /proc/<creator pid>/fd/<memfd>. Completions bump a futex word
// in the page, on which waiters of every process sleep.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "internal.h"

using namespace aclsim;

namespace {

struct Key {
  long pid = 0;
  int physical = 0;
  int fd = -1;
  size_t offset = 0, size = 0;
  int validate = 0;
};

bool ParseKey(const char* text, Key* k) {
  if (text == nullptr) return false;
  char tail = 0;
  int n = sscanf(text, "aclsim-ipc:%ld:%d:%d:%zu:%zu:%d%c", &k->pid, &k->physical, &k->fd,
                 &k->offset, &k->size, &k->validate, &tail);
  return n == 6 && k->pid > 0 && k->fd >= 0 && k->size > 0 && (k->validate == 0 || k->validate == 1);
}

std::string AllowListPath(const Key& k) {
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/aclsim-ipc-%ld-%d-%zu.pids", k.pid, k.fd, k.offset);
  return path;
}

struct Import {
  size_t size;
  size_t lead;  // bytes mapped before the imported range (to its page boundary)
  int device;  // logical id in this process
  std::string key;
  int refs;
};

struct Registry {
  std::shared_mutex mu;
  std::map<uintptr_t, Import> imports;         // by mapped address
  std::map<std::string, uintptr_t> by_key;     // key -> mapped address
  std::set<std::string> exports;               // keys this process handed out
  std::atomic<int> import_count{0};
};

Registry& Reg() {
  static Registry* r = new Registry();  // never destroyed: used until process exit
  return *r;
}

bool AllowedToImport(const Key& k) {
  std::ifstream in(AllowListPath(k));
  long pid = 0;
  while (in >> pid)
    if (pid == static_cast<long>(getpid())) return true;
  return false;
}

}  // namespace

namespace aclsim {

int IpcDevice(const void* p, size_t len) {
  Registry& r = Reg();
  if (r.import_count.load(std::memory_order_acquire) == 0) return -1;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> lk(r.mu);
  auto it = r.imports.upper_bound(a);
  if (it == r.imports.begin()) return -1;
  --it;
  size_t off = a - it->first;
  if (off >= it->second.size || len > it->second.size - off) return -1;
  return it->second.device;
}

}  // namespace aclsim

namespace aclsim {

namespace {
constexpr char kEventFdName[] = "aclsim_ipc_event";
constexpr size_t kEventPage = 4096;
static_assert(sizeof(IpcEventShared) <= kEventPage, "IpcEventShared must fit a page");
}  // namespace

Event::~Event() {
  if (ipc != nullptr) munmap(ipc, kEventPage);
  if (ipc_fd >= 0) close(ipc_fd);
}

aclError CreateIpcEvent(aclrtEvent* event) {
  const char* api = "aclrtCreateEventWithFlag(ACL_EVENT_IPC)";
  int fd = memfd_create(kEventFdName, MFD_CLOEXEC);
  if (fd < 0) return Fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: memfd_create failed: %s", api, strerror(errno));
  if (ftruncate(fd, kEventPage) != 0) {
    int e = errno;
    close(fd);
    return Fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: ftruncate failed: %s", api, strerror(e));
  }
  void* p = mmap(nullptr, kEventPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: mmap failed: %s", api, strerror(e));
  }
  auto* shared = new (p) IpcEventShared{};  // the page is zeroed: counters start at 0
  auto* e = new Event(shared, fd);
  e->flags = ACL_EVENT_IPC;
  *event = e;
  return ACL_SUCCESS;
}

}  // namespace aclsim

extern "C" {

aclError aclrtIpcGetEventHandle(aclrtEvent event, aclrtIpcEventHandle* handle) {
  const char* api = "aclrtIpcGetEventHandle";
  if (handle == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: handle is null", api);
  auto* e = static_cast<Event*>(event);
  if (e == nullptr || e->magic.load(std::memory_order_relaxed) != Event::kMagic)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid event handle %p", api, event);
  if (e->ipc == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: the event was not created with ACL_EVENT_IPC", api);
  if (e->ipc_fd < 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: the event was opened from another process's handle (export it "
                "from the process that created it)", api);
  memset(handle->reserved, 0, sizeof(handle->reserved));
  snprintf(handle->reserved, sizeof(handle->reserved), "aclsim-ipcev:%ld:%d", static_cast<long>(getpid()),
           e->ipc_fd);
  return ACL_SUCCESS;
}

aclError aclrtIpcOpenEventHandle(aclrtIpcEventHandle handle, aclrtEvent* event) {
  const char* api = "aclrtIpcOpenEventHandle";
  if (event == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: event is null", api);
  char text[ACL_IPC_EVENT_HANDLE_SIZE + 1] = {0};
  memcpy(text, handle.reserved, ACL_IPC_EVENT_HANDLE_SIZE);
  long pid = 0;
  int fd = -1;
  char tail = 0;
  if (sscanf(text, "aclsim-ipcev:%ld:%d%c", &pid, &fd, &tail) != 2 || pid <= 0 || fd < 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: not an event handle", api);
  char path[64], target[256] = {0};
  snprintf(path, sizeof(path), "/proc/%ld/fd/%d", pid, fd);
  ssize_t t = readlink(path, target, sizeof(target) - 1);
  const std::string expected = std::string("/memfd:") + kEventFdName + " ";
  if (t < 0 || strncmp(target, expected.c_str(), expected.size()) != 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: the process %ld that created the event is gone or destroyed it (%s)",
                api, pid, t < 0 ? strerror(errno) : "another file");
  int f = open(path, O_RDWR | O_CLOEXEC);
  if (f < 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: cannot open the event of process %ld: %s", api, pid, strerror(errno));
  void* p = mmap(nullptr, kEventPage, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  int err = errno;
  close(f);
  if (p == MAP_FAILED)
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: mapping the event failed: %s", api, strerror(err));
  RT();
  auto* e = new Event(static_cast<IpcEventShared*>(p), -1);
  e->flags = ACL_EVENT_IPC;
  *event = e;
  return ACL_SUCCESS;
}

aclError aclrtIpcMemGetExportKey(void* devPtr, size_t size, char* key, size_t len, uint64_t flag) {
  const char* api = "aclrtIpcMemGetExportKey";
  if (devPtr == nullptr || key == nullptr)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: %s is null", api, devPtr == nullptr ? "devPtr" : "key");
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "%s: size 0 is invalid", api);
  if (flag != ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT && flag != ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid flag %" PRIu64 " (expected %lu or %lu)", api, flag,
                ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT, ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION);
  Device* owner = nullptr;
  for (auto& d : RT().devices)
    if (d->arena.InMapping(devPtr)) owner = d.get();
  if (owner == nullptr || !owner->arena.InAllocation(devPtr, size))
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: [%p, +%zu) is not inside one aclrtMalloc allocation (only such memory can be shared)",
                api, devPtr, size);
  size_t offset = static_cast<size_t>(static_cast<char*>(devPtr) - owner->arena.base());
  int validate = flag == ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT ? 1 : 0;
  char text[ACL_IPC_HANDLE_SIZE + 32];
  int n = snprintf(text, sizeof(text), "aclsim-ipc:%ld:%d:%d:%zu:%zu:%d", static_cast<long>(getpid()),
                   owner->physical, owner->arena.fd(), offset, size, validate);
  if (n < 0 || static_cast<size_t>(n) + 1 > len || static_cast<size_t>(n) + 1 > ACL_IPC_HANDLE_SIZE)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: len %zu is too small for the key (%d bytes with its NUL)", api,
                len, n + 1);
  memcpy(key, text, static_cast<size_t>(n) + 1);
  Registry& r = Reg();
  std::unique_lock<std::shared_mutex> lk(r.mu);
  r.exports.insert(text);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemSetImportPid(const char* key, int32_t* pid, size_t num) {
  const char* api = "aclrtIpcMemSetImportPid";
  Key k;
  if (!ParseKey(key, &k)) return Fail(ACL_ERROR_INVALID_PARAM, "%s: not a memory sharing key", api);
  if (pid == nullptr || num == 0) return Fail(ACL_ERROR_INVALID_PARAM, "%s: no pids given", api);
  {
    Registry& r = Reg();
    std::shared_lock<std::shared_mutex> lk(r.mu);
    if (!r.exports.count(key))
      return Fail(ACL_ERROR_INVALID_PARAM, "%s: the key was not exported by this process", api);
  }
  if (!k.validate)
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: the key was exported with ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION "
                "(any process may import it)", api);
  int fd = open(AllowListPath(k).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: cannot record the pids: %s", api, strerror(errno));
  std::string lines;
  for (size_t i = 0; i < num; ++i) lines += std::to_string(pid[i]) + "\n";
  ssize_t w = write(fd, lines.data(), lines.size());
  close(fd);
  if (w != static_cast<ssize_t>(lines.size()))
    return Fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: cannot record the pids", api);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemImportByKey(void** devPtr, const char* key, uint64_t flag) {
  const char* api = "aclrtIpcMemImportByKey";
  if (devPtr == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr is null", api);
  if (flag != ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT && flag != ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: invalid flag %" PRIu64, api, flag);
  Key k;
  if (!ParseKey(key, &k)) return Fail(ACL_ERROR_INVALID_PARAM, "%s: not a memory sharing key", api);
  Runtime& rt = RT();
  int device = -1;
  for (auto& d : rt.devices)
    if (d->physical == k.physical) device = d->id;
  if (device < 0)
    return Fail(ACL_ERROR_RT_INVALID_DEVICEID,
                "%s: the memory is on physical device %d, which this process does not see "
                "(ASCEND_RT_VISIBLE_DEVICES)", api, k.physical);
  if (k.validate && k.pid != static_cast<long>(getpid()) && !AllowedToImport(k))
    return Fail(ACL_ERROR_INVALID_PARAM,
                "%s: process %ld is not allowed to import this memory (the exporter did not name it "
                "with aclrtIpcMemSetImportPid)", api, static_cast<long>(getpid()));
  Registry& r = Reg();
  std::unique_lock<std::shared_mutex> lk(r.mu);
  auto known = r.by_key.find(key);
  if (known != r.by_key.end()) {
    r.imports[known->second].refs++;
    *devPtr = reinterpret_cast<void*>(known->second);
    return ACL_SUCCESS;
  }
  char path[64], target[256] = {0};
  snprintf(path, sizeof(path), "/proc/%ld/fd/%d", k.pid, k.fd);
  ssize_t t = readlink(path, target, sizeof(target) - 1);
  // The arena is the memfd "ascend_sim_dev<n>" (Arena::EnsureMapped): anything else means
  // the exporter is gone and the pid or descriptor now names something else.
  char expected[48];
  snprintf(expected, sizeof(expected), "/memfd:ascend_sim_dev%d ", k.physical);
  if (t < 0 || strncmp(target, expected, strlen(expected)) != 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: the exporting process %ld is gone or its device memory is not "
                "reachable (%s)", api, k.pid, t < 0 ? strerror(errno) : "another file");
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: cannot open the device memory of process %ld: %s", api, k.pid,
                strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < k.offset + k.size) {
    close(fd);
    return Fail(ACL_ERROR_INVALID_PARAM, "%s: the key names memory beyond the exporter's device", api);
  }
  // mmap takes page-aligned offsets; small allocations share pages with their neighbours.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t lead = k.offset % page;
  void* p = mmap(nullptr, lead + k.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
                 static_cast<off_t>(k.offset - lead));
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: mapping %s failed: %s", api, FormatBytes(k.size).c_str(),
                strerror(e));
  uintptr_t a = reinterpret_cast<uintptr_t>(p) + lead;
  r.imports[a] = Import{k.size, lead, device, key, 1};
  r.by_key[key] = a;
  r.import_count.fetch_add(1, std::memory_order_release);
  *devPtr = reinterpret_cast<void*>(a);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemClose(const char* key) {
  const char* api = "aclrtIpcMemClose";
  Key k;
  if (!ParseKey(key, &k)) return Fail(ACL_ERROR_INVALID_PARAM, "%s: not a memory sharing key", api);
  Registry& r = Reg();
  std::unique_lock<std::shared_mutex> lk(r.mu);
  auto known = r.by_key.find(key);
  if (known != r.by_key.end()) {
    auto it = r.imports.find(known->second);
    if (--it->second.refs == 0) {
      munmap(reinterpret_cast<void*>(it->first - it->second.lead), it->second.lead + it->second.size);
      r.imports.erase(it);
      r.by_key.erase(known);
      r.import_count.fetch_sub(1, std::memory_order_release);
    }
    return ACL_SUCCESS;
  }
  if (r.exports.erase(key)) {
    if (k.validate) unlink(AllowListPath(k).c_str());
    return ACL_SUCCESS;
  }
  return Fail(ACL_ERROR_INVALID_PARAM, "%s: the key was neither exported nor imported by this process", api);
}

}  // extern "C"
