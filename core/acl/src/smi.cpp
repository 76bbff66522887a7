// The device-usage registry that `npu-smi` reads (python/torch_npu/npu_smi.py).
//
// One POSIX shared memory object per user, /dev/shm/ascend_sim_smi.<uid>: a header and
// kSmiSlots process slots. A process takes a slot at its first device allocation and
// publishes, per physical device, the HBM its arena holds and the time its streams spent
// running tasks; it frees the slot at exit. A process that died without freeing it (a
// crash, SIGKILL) is recognised by readers and by the next claimer: its pid is gone, or
// now belongs to a process with another start time. The layout is versioned; readers of
// another version ignore the object.
//
// Layout (native endianness, all fields 8-byte aligned):
//   header: char magic[8] = "ASIMSMI1"; u32 version, slots, devices, slot_bytes;
//           u64 hbm_capacity; u32 physical_count; u32 reserved; char soc[24]   (64 bytes)
//   slot:   i32 pid (0 free, -pid while being claimed); u32 reserved;
//           u64 start_ticks (/proc/<pid>/stat field 22); char name[16] (comm);
//           u64 hbm_used[devices]; u64 busy_ns[devices]
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "internal.h"

namespace aclsim {
namespace {

constexpr char kMagic[8] = {'A', 'S', 'I', 'M', 'S', 'M', 'I', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kSlots = 256;
constexpr uint32_t kDevices = 64;  // physical ids 0..63

struct Header {
  char magic[8];
  uint32_t version, slots, devices, slot_bytes;
  uint64_t hbm_capacity;
  uint32_t physical_count, reserved;
  char soc[24];
};
static_assert(sizeof(Header) == 64, "npu_smi.py reads a 64-byte header");

struct Slot {
  std::atomic<int32_t> pid;
  uint32_t reserved;
  uint64_t start_ticks;
  char name[16];
  std::atomic<uint64_t> hbm_used[kDevices];
  std::atomic<uint64_t> busy_ns[kDevices];
};
static_assert(sizeof(Slot) == 32 + 16 * kDevices, "npu_smi.py reads 1056-byte slots");

constexpr size_t kBytes = sizeof(Header) + kSlots * sizeof(Slot);

uint64_t StartTicks(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "r");
  if (f == nullptr) return 0;
  char buf[1024];
  const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');  // the command name may hold spaces
  if (p == nullptr) return 0;
  unsigned long long ticks = 0;
  // after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice threads itrealvalue starttime (field 22)
  if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
             &ticks) != 1)
    return 0;
  return ticks;
}

bool Alive(int32_t pid, uint64_t start_ticks) {
  if (pid == 0) return false;
  const pid_t p = pid < 0 ? -pid : pid;
  if (kill(p, 0) != 0 && errno == ESRCH) return false;
  return pid < 0 || start_ticks == 0 || StartTicks(p) == start_ticks;
}

struct Registry {
  Header* header = nullptr;
  Slot* slots = nullptr;
  // This process's slot (a forked child forgets its parent's: SmiForgetAfterFork).
  std::atomic<Slot*> mine{nullptr};
  bool failed = false;
  std::mutex mu;  // guards the claim (mapping and choosing a slot)
};

Registry& Reg() {
  static Registry* r = new Registry();  // never destroyed: used at exit
  return *r;
}

// Maps (creating if needed) the object; false when the registry is unusable here.
bool Map(Registry& r) {
  if (r.header != nullptr) return true;
  if (r.failed) return false;
  char name[64];
  snprintf(name, sizeof(name), "/ascend_sim_smi.%u", static_cast<unsigned>(getuid()));
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  const bool created = fd >= 0;
  if (!created) fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0) {
    r.failed = true;
    return false;
  }
  if (created && ftruncate(fd, static_cast<off_t>(kBytes)) != 0) {
    close(fd);
    shm_unlink(name);
    r.failed = true;
    return false;
  }
  // A creator may not have sized it yet: wait for it, briefly.
  struct stat st {};
  for (int i = 0; i < 1000 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) < kBytes; ++i) usleep(1000);
  if (static_cast<size_t>(st.st_size) < kBytes && !created) {
    close(fd);
    r.failed = true;
    return false;
  }
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    r.failed = true;
    return false;
  }
  auto* h = static_cast<Header*>(p);
  if (created) {
    h->version = kVersion;
    h->slots = kSlots;
    h->devices = kDevices;
    h->slot_bytes = sizeof(Slot);
    h->hbm_capacity = RT().capacity;
    h->physical_count = static_cast<uint32_t>(RT().physical_count);
    snprintf(h->soc, sizeof(h->soc), "%s", RT().soc.c_str());
    std::atomic_thread_fence(std::memory_order_release);
    memcpy(h->magic, kMagic, sizeof(kMagic));
  } else {
    for (int i = 0; i < 1000 && memcmp(h->magic, kMagic, sizeof(kMagic)) != 0; ++i) usleep(1000);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (memcmp(h->magic, kMagic, sizeof(kMagic)) != 0 || h->version != kVersion || h->slots != kSlots ||
        h->devices != kDevices || h->slot_bytes != sizeof(Slot)) {
      munmap(p, kBytes);
      r.failed = true;  // another layout: this process stays out of npu-smi
      return false;
    }
  }
  r.header = h;
  r.slots = reinterpret_cast<Slot*>(static_cast<char*>(p) + sizeof(Header));
  return true;
}

// Takes a free slot (or a dead process's) for this process; r.mu held.
Slot* Claim(Registry& r) {
  if (Slot* s = r.mine.load(std::memory_order_acquire)) return s;  // another thread claimed it
  if (!Map(r)) return nullptr;
  const pid_t me = getpid();
  for (uint32_t i = 0; i < kSlots; ++i) {
    Slot& s = r.slots[i];
    int32_t pid = s.pid.load(std::memory_order_acquire);
    if (Alive(pid, s.start_ticks)) continue;
    if (!s.pid.compare_exchange_strong(pid, -static_cast<int32_t>(me))) continue;
    s.start_ticks = StartTicks(me);
    for (uint32_t d = 0; d < kDevices; ++d) {
      s.hbm_used[d].store(0, std::memory_order_relaxed);
      s.busy_ns[d].store(0, std::memory_order_relaxed);
    }
    memset(s.name, 0, sizeof(s.name));
    if (FILE* f = fopen("/proc/self/comm", "r")) {
      if (fgets(s.name, sizeof(s.name), f) != nullptr) s.name[strcspn(s.name, "\n")] = '\0';
      fclose(f);
    }
    s.pid.store(static_cast<int32_t>(me), std::memory_order_release);
    r.mine.store(&s, std::memory_order_release);
    return &s;
  }
  r.failed = true;  // every slot is taken by a live process
  return nullptr;
}

Slot* MySlot() {
  Registry& r = Reg();
  if (Slot* s = r.mine.load(std::memory_order_acquire)) return s;
  std::lock_guard<std::mutex> g(r.mu);
  return Claim(r);
}

}  // namespace

void SmiPublishMemory(int physical, size_t used) {
  if (physical < 0 || physical >= static_cast<int>(kDevices)) return;
  if (Slot* s = MySlot()) s->hbm_used[physical].store(used, std::memory_order_relaxed);
}

void SmiAddBusy(int physical, int64_t ns) {
  if (physical < 0 || physical >= static_cast<int>(kDevices) || ns <= 0) return;
  // Only a process that holds memory (and so a slot) shows up: no claim from here.
  if (Slot* s = Reg().mine.load(std::memory_order_acquire)) s->busy_ns[physical].fetch_add(ns, std::memory_order_relaxed);
}

void SmiRelease() {
  if (Slot* s = Reg().mine.exchange(nullptr)) s->pid.store(0, std::memory_order_release);
}

// The parent's slot; the child claims its own if it ever allocates.
void SmiForgetAfterFork() { Reg().mine.store(nullptr); }

}  // namespace aclsim
