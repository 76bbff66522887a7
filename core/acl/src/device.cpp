// Device profiles, environment, runtime singleton, memory arenas and the sub-allocator.
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "internal.h"

namespace aclsim {

// ---- errors ------------------------------------------------------------------------
namespace {
thread_local std::string tl_recent_error;
}

void SetRecentError(const std::string& msg) { tl_recent_error = msg; }
const char* RecentError() { return tl_recent_error.c_str(); }

aclError Fail(aclError code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  tl_recent_error = buf;
  return code;
}

std::string FormatBytes(size_t bytes) {
  static const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    snprintf(buf, sizeof(buf), "%zu bytes", bytes);
  else
    snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

// ---- profiles and environment ---------------------------------------------------------
namespace {

constexpr size_t kGiB = size_t(1) << 30;

struct Profile {
  const char* soc;
  size_t hbm;
  int count;
};

// Device count 8 for every profile (one server); override with ASCEND_SIM_DEVICE_COUNT.
const Profile kProfiles[] = {
    {"Ascend910B1", 64 * kGiB, 8}, {"Ascend910B2", 64 * kGiB, 8},
    {"Ascend910B3", 64 * kGiB, 8}, {"Ascend910B4", 32 * kGiB, 8},
    {"Ascend910A", 32 * kGiB, 8},  {"Ascend910B", 64 * kGiB, 8},
    {"Ascend310P3", 24 * kGiB, 8},
};

void Warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Warn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("[acl-sim] warning: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

// "68719476736", "64G", "64GiB", "512m", "1T", "4096K". Binary multiples.
bool ParseBytes(const char* s, size_t* out) {
  while (*s == ' ') ++s;
  if (*s < '0' || *s > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; ++end; break;
    case 'm': case 'M': shift = 20; ++end; break;
    case 'g': case 'G': shift = 30; ++end; break;
    case 't': case 'T': shift = 40; ++end; break;
    default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) ++end;
  if (*end == 'b' || *end == 'B') ++end;
  while (*end == ' ') ++end;
  if (*end != '\0') return false;
  if (shift && v > (~0ULL >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

bool ParseInt(const char* s, long lo, long hi, long* out) {
  errno = 0;
  char* end = nullptr;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s) return false;
  while (*end == ' ') ++end;
  if (*end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

void AtExit() {
  SmiRelease();
  Runtime& rt = RT();
  if (rt.forked_child) return;  // the workers belong to the parent process
  ShutdownAllStreams(/*exiting=*/true);
}

void AtForkChild() {
  RT().forked_child = true;
  SmiForgetAfterFork();
}

}  // namespace

// The parent's stream workers do not exist in a forked child: waiting for or launching
// work would block forever. Real AscendCL has no usable context there either.
aclError ForkedChildFail(const char* api) {
  return Fail(ACL_ERROR_RT_CONTEXT_NULL,
              "%s: the NPU runtime was initialised before this process was forked; a forked child "
              "cannot use it (start NPU subprocesses with the 'spawn' start method)", api);
}

namespace {

// The simulated SoC: ASCEND_SIM_SOC (default: the first profile).
const Profile* SelectProfile(bool warn) {
  const Profile* prof = &kProfiles[0];
  if (const char* soc = getenv("ASCEND_SIM_SOC"); soc && *soc) {
    const Profile* found = nullptr;
    for (const Profile& p : kProfiles)
      if (strcasecmp(p.soc, soc) == 0) found = &p;
    if (found) {
      prof = found;
    } else if (warn) {
      std::string known;
      for (const Profile& p : kProfiles) known += std::string(known.empty() ? "" : ", ") + p.soc;
      Warn("ASCEND_SIM_SOC=%s is not a known SoC (known: %s); using %s", soc,
           known.c_str(), prof->soc);
    }
  }
  return prof;
}

// The driver's device count: the profile's, or ASCEND_SIM_DEVICE_COUNT.
int PhysicalCount(const Profile* prof, bool warn) {
  int count = prof->count;
  if (const char* s = getenv("ASCEND_SIM_DEVICE_COUNT"); s && *s) {
    long v;
    if (ParseInt(s, 0, 1024, &v))
      count = static_cast<int>(v);
    else if (warn)
      Warn("ignoring ASCEND_SIM_DEVICE_COUNT=%s (expected an integer 0..1024)", s);
  }
  return count;
}

// The physical ids of the visible devices, in order: ASCEND_RT_VISIBLE_DEVICES (invalid and
// repeated ids ignored), or all of them.
std::vector<int> VisibleDevices(int physical_count, bool warn) {
  std::vector<int> visible;
  const char* vis = getenv("ASCEND_RT_VISIBLE_DEVICES");
  bool have_vis = false;
  if (vis) {
    for (const char* c = vis; *c; ++c)
      if (*c != ' ' && *c != '\t') have_vis = true;
  }
  if (have_vis) {
    std::string all(vis);
    size_t pos = 0;
    while (pos <= all.size()) {
      size_t comma = all.find(',', pos);
      if (comma == std::string::npos) comma = all.size();
      std::string item = all.substr(pos, comma - pos);
      pos = comma + 1;
      size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
      if (a == std::string::npos) continue;
      item = item.substr(a, b - a + 1);
      long id;
      bool dup = false;
      if (ParseInt(item.c_str(), 0, physical_count - 1, &id)) {
        for (int v : visible) dup |= (v == id);
        if (!dup) visible.push_back(static_cast<int>(id));
      } else if (warn) {
        Warn("ASCEND_RT_VISIBLE_DEVICES: ignoring invalid device '%s' (physical devices: %d)",
             item.c_str(), physical_count);
      }
    }
  } else {
    for (int i = 0; i < physical_count; ++i) visible.push_back(i);
  }
  return visible;
}

Runtime* CreateRuntime() {
  auto* rt = new Runtime();  // never destroyed: usable from any static destructor
  const Profile* prof = SelectProfile(/*warn=*/true);
  rt->soc = prof->soc;
  rt->capacity = prof->hbm;
  rt->physical_count = PhysicalCount(prof, /*warn=*/true);

  if (const char* s = getenv("ASCEND_SIM_HBM_BYTES"); s && *s) {
    size_t v;
    if (ParseBytes(s, &v) && v > 0)
      rt->capacity = v;
    else
      Warn("ignoring ASCEND_SIM_HBM_BYTES=%s (expected bytes, e.g. 68719476736 or 64G)", s);
  }

  const std::vector<int> visible = VisibleDevices(rt->physical_count, /*warn=*/true);
  for (size_t i = 0; i < visible.size(); ++i) {
    auto d = std::make_unique<Device>();
    d->id = static_cast<int>(i);
    d->physical = visible[i];
    d->capacity = rt->capacity;
    d->arena.Init(d->id, d->physical, rt->capacity);
    rt->devices.push_back(std::move(d));
  }
  return rt;
}

std::atomic<bool> g_runtime_started{false};

thread_local int tl_current_device = 0;

}  // namespace

Runtime& RT() {
  static Runtime* rt = [] {
    Runtime* r = CreateRuntime();
    g_runtime_started.store(true);
    // Registered after construction: runs before the destructors of statics built
    // earlier, and after those of statics built later (which may still use the API).
    std::atexit(AtExit);
    pthread_atfork(nullptr, nullptr, AtForkChild);
    return r;
  }();
  return *rt;
}

int& CurrentDevice() { return tl_current_device; }

Device* DeviceOrFail(int id, const char* api, aclError* err) {
  Runtime& rt = RT();
  if (id < 0 || id >= rt.count()) {
    *err = Fail(ACL_ERROR_RT_INVALID_DEVICEID,
                "%s: invalid device id %d (%d visible device%s, valid ids 0..%d)", api, id,
                rt.count(), rt.count() == 1 ? "" : "s", rt.count() - 1);
    return nullptr;
  }
  return rt.devices[id].get();
}

Device* FindDevice(const void* ptr, size_t len) {
  if (ptr == nullptr) return nullptr;
  Runtime& rt = RT();
  for (auto& d : rt.devices) {
    if (d->arena.InMapping(ptr)) return d->arena.InAllocation(ptr, len) ? d.get() : nullptr;
  }
  int v = VmmDevice(ptr, len);
  if (v < 0) v = IpcDevice(ptr, len);
  if (v < 0) v = HostRegisteredDevice(ptr, len);
  return v >= 0 ? rt.devices[v].get() : nullptr;
}

// ---- Device ---------------------------------------------------------------------------
void Device::AddBusy(int64_t ns) {
  busy_ns.fetch_add(ns, std::memory_order_relaxed);
  SmiAddBusy(physical, ns);
}

Stream* Device::DefaultStream() {
  Stream* s = default_stream.load(std::memory_order_acquire);
  if (s) return s;
  std::lock_guard<std::mutex> lk(mu);
  s = default_stream.load(std::memory_order_relaxed);
  if (!s) {
    auto sp = std::make_shared<Stream>();
    sp->device = id;
    sp->is_default = true;
    streams.push_back(sp);
    s = sp.get();
    default_stream.store(s, std::memory_order_release);
  }
  return s;
}

std::vector<std::shared_ptr<Stream>> Device::Snapshot() {
  std::lock_guard<std::mutex> lk(mu);
  return streams;
}

// ---- Arena ----------------------------------------------------------------------------
void Arena::Init(int device, int physical, size_t capacity) {
  device_ = device;
  physical_ = physical;
  capacity_ = capacity;
  map_size_ = capacity / kGranule * kGranule;
}

aclError Arena::EnsureMapped() {
  if (base_.load(std::memory_order_acquire)) return ACL_SUCCESS;
  std::lock_guard<std::mutex> lk(create_mu_);
  if (base_.load(std::memory_order_relaxed)) return ACL_SUCCESS;
  if (map_size_ == 0)
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                "device %d: capacity %zu bytes is below the 2 MiB allocation granule",
                device_, capacity_);
  char name[32];
  snprintf(name, sizeof(name), "ascend_sim_dev%d", device_);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "device %d: memfd_create failed: %s",
                device_, strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(map_size_)) != 0) {
    int e = errno;
    close(fd);
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "device %d: ftruncate(%zu) failed: %s",
                device_, map_size_, strerror(e));
  }
  // Reserve address space with room to align the base to the 2 MiB granule, then map
  // the memfd over the aligned part and give the slack back.
  void* resv = mmap(nullptr, map_size_ + kGranule, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* p = MAP_FAILED;
  int e = 0;
  if (resv != MAP_FAILED) {
    uintptr_t r = reinterpret_cast<uintptr_t>(resv);
    uintptr_t aligned = (r + kGranule - 1) / kGranule * kGranule;
    p = mmap(reinterpret_cast<void*>(aligned), map_size_, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0);
    e = errno;
    if (p == MAP_FAILED) {
      munmap(resv, map_size_ + kGranule);
    } else {
      if (aligned > r) munmap(resv, aligned - r);
      uintptr_t end = aligned + map_size_, rend = r + map_size_ + kGranule;
      if (rend > end) munmap(reinterpret_cast<void*>(end), rend - end);
    }
  } else {
    e = errno;
  }
  if (p == MAP_FAILED) {
    close(fd);
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "device %d: mmap of %s failed: %s", device_,
                FormatBytes(map_size_).c_str(), strerror(e));
  }
  {
    std::unique_lock<std::shared_mutex> w(mu_);
    InsertFree(0, map_size_);
  }
  fd_ = fd;
  base_.store(static_cast<char*>(p), std::memory_order_release);
  return ACL_SUCCESS;
}

void Arena::EraseFree(std::map<size_t, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_off_.erase(it);
}

void Arena::InsertFree(size_t off, size_t len) {
  auto next = free_by_off_.lower_bound(off);
  if (next != free_by_off_.end() && off + len == next->first) {
    len += next->second;
    auto n = next++;
    EraseFree(n);
  }
  if (next != free_by_off_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      EraseFree(prev);
    }
  }
  free_by_off_.emplace(off, len);
  free_by_size_.emplace(len, off);
}

// ---- host memory behind device memory ----------------------------------------------
// Device memory is host memory (the arenas' pages, backed when first touched), and the
// devices advertise more of it than a host has: an allocation the host could not back
// would end in the kernel's OOM killer, not in an error. So each allocation is checked
// against what the host can still give: MemAvailable, minus a reserve for everything
// else (5% of MemTotal, at least 512 MiB), minus the device memory this process holds
// but has not touched yet (allocated bytes beyond its resident shared memory); and against
// ASCEND_SIM_HOST_MEMORY_LIMIT, a budget of the process's own.
namespace {

std::atomic<size_t> g_allocated{0};  // device memory held by this process, all devices
thread_local size_t tl_host_refusal = 0;  // 1 + bytes available, when the host refused last

size_t ProcBytes(const char* path, const char* key) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char line[256];
  size_t kb = 0;
  const size_t key_len = std::strlen(key);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, key_len) == 0) {
      kb = std::strtoull(line + key_len, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

// ASCEND_SIM_HOST_MEMORY_LIMIT: at most this much device memory for the process (SIZE_MAX:
// no limit of its own); "0" turns the host check off.
size_t HostMemoryLimit(bool* checked) {
  static size_t limit = SIZE_MAX;
  static const bool on = [] {
    const char* v = std::getenv("ASCEND_SIM_HOST_MEMORY_LIMIT");
    if (v == nullptr || *v == '\0') return true;
    if (std::strcmp(v, "0") == 0) return false;
    if (!ParseBytes(v, &limit)) Warn("ignoring ASCEND_SIM_HOST_MEMORY_LIMIT=%s (expected bytes, e.g. 8G, or 0)", v);
    return true;
  }();
  *checked = on;
  return limit;
}

// Bytes of device memory the host can still back for this process (SIZE_MAX: unchecked).
size_t HostBackable() {
  bool checked = true;
  const size_t limit = HostMemoryLimit(&checked);
  if (!checked) return SIZE_MAX;
  const size_t allocated = g_allocated.load(std::memory_order_relaxed);
  size_t backable = limit == SIZE_MAX ? SIZE_MAX : (limit > allocated ? limit - allocated : 0);
  const size_t available = ProcBytes("/proc/meminfo", "MemAvailable:");
  if (available == 0) return backable;  // no /proc: nothing more to go by
  const size_t reserve = std::max<size_t>(size_t{512} << 20, ProcBytes("/proc/meminfo", "MemTotal:") / 20);
  const size_t resident = ProcBytes("/proc/self/status", "RssShmem:");
  const size_t untouched = allocated > resident ? allocated - resident : 0;
  return std::min(backable, available > reserve + untouched ? available - reserve - untouched : 0);
}

}  // namespace

bool HostRefusedLastAllocation(size_t* available) {
  if (tl_host_refusal == 0) return false;
  *available = tl_host_refusal - 1;
  return true;
}

aclError Arena::Allocate(size_t size, bool physical, void** out) {
  if (aclError e = EnsureMapped(); e != ACL_SUCCESS) return e;
  size_t len = size > map_size_ ? 0 : (size + kGranule - 1) / kGranule * kGranule;
  tl_host_refusal = 0;
  if (len != 0) {
    const size_t backable = HostBackable();
    if (len > backable) {
      tl_host_refusal = backable + 1;
      return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                  "%s: out of memory on device %d: tried to allocate %s (%zu bytes); the host "
                  "cannot back it: %s of host memory can still back device memory of this process "
                  "(the simulator's device memory is host memory)",
                  physical ? "aclrtMallocPhysical" : "aclrtMalloc", device_, FormatBytes(size).c_str(), size,
                  FormatBytes(backable).c_str());
    }
  }
  std::unique_lock<std::shared_mutex> w(mu_);
  size_t free_bytes = capacity_ - used_;
  auto it = len ? free_by_size_.lower_bound({len, 0}) : free_by_size_.end();
  if (it == free_by_size_.end()) {
    size_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    const char* why = (len && used_ + len <= map_size_) ? " (fragmented)" : "";
    return Fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                "%s: out of memory on device %d: tried to allocate %s (%zu bytes); "
                "capacity %s, %s allocated, %s free, largest free block %s%s",
                physical ? "aclrtMallocPhysical" : "aclrtMalloc", device_,
                FormatBytes(size).c_str(), size, FormatBytes(capacity_).c_str(),
                FormatBytes(used_).c_str(), FormatBytes(free_bytes).c_str(),
                FormatBytes(largest).c_str(), why);
  }
  size_t off = it->second, blk = it->first;
  free_by_size_.erase(it);
  free_by_off_.erase(off);
  if (blk > len) {
    free_by_off_.emplace(off + len, blk - len);
    free_by_size_.emplace(blk - len, off + len);
  }
  allocs_.emplace(off, Alloc{len, physical});
  used_ += len;
  g_allocated.fetch_add(len, std::memory_order_relaxed);
  SmiPublishMemory(physical_, used_);
  *out = base_.load(std::memory_order_relaxed) + off;
  return ACL_SUCCESS;
}

aclError Arena::Free(void* ptr, bool physical) {
  char* b = base();
  size_t off = static_cast<size_t>(static_cast<char*>(ptr) - b);
  size_t len;
  {
    std::unique_lock<std::shared_mutex> w(mu_);
    auto it = allocs_.find(off);
    if (it == allocs_.end() || it->second.physical != physical)
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtFree: %p on device %d is not the start of a live allocation "
                  "(double free, or a pointer into the middle of a block?)",
                  ptr, device_);
    len = it->second.len;
    allocs_.erase(it);
  }
  // Give the pages back before the range can be handed out again (new memory reads 0).
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
                static_cast<off_t>(len)) != 0) {
    madvise(b + off, len, MADV_REMOVE);
  }
  std::unique_lock<std::shared_mutex> w(mu_);
  InsertFree(off, len);
  used_ -= len;
  g_allocated.fetch_sub(len, std::memory_order_relaxed);
  SmiPublishMemory(physical_, used_);
  return ACL_SUCCESS;
}

bool Arena::InAllocation(const void* p, size_t len) const {
  const char* b = base();
  if (!b) return false;
  size_t off = static_cast<size_t>(static_cast<const char*>(p) - b);
  std::shared_lock<std::shared_mutex> r(mu_);
  auto it = allocs_.upper_bound(off);
  if (it == allocs_.begin()) return false;
  --it;
  size_t end = it->first + it->second.len;
  return !it->second.physical && off < end && len <= end - off;
}

size_t Arena::Used() const {
  std::shared_lock<std::shared_mutex> r(mu_);
  return used_;
}

bool RuntimeStarted() { return g_runtime_started.load(); }

int VisibleCountNow() {
  if (RuntimeStarted()) return RT().count();
  return static_cast<int>(VisibleDevices(PhysicalCount(SelectProfile(false), false), false).size());
}

}  // namespace aclsim
