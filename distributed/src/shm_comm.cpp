#include "shm_comm.h"

#include <acl/acl_rt.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

namespace torch_npu::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct ShmComm::Segment {
  std::atomic<uint32_t> bell;      // bumped by every publication; futex word
  std::atomic<uint32_t> sleepers;  // ranks inside futex_wait (skip the wake syscall if 0)
  // 1 + the rank that failed the communicator; 0 (a fresh segment is zero-filled) while
  // healthy, so a rank that maps the segment before rank 0 looked at it sees it healthy.
  std::atomic<int32_t> failed_by;
  char why[1024];
};

namespace {

constexpr uint64_t kNack = 1ull << 63;  // receiver rejected a message (size/dtype mismatch)
// Waits spin this many pause instructions (a few µs) before yielding the core: enough for
// a peer running on the other core, short when the peer waits for ours.
constexpr int kSpinPauses = 64;

size_t slots_offset() { return (sizeof(ShmComm::Segment) + 63) / 64 * 64; }
// Page tables start page aligned after the slots; untouched pages of them cost nothing.
size_t tables_offset(int size) { return (slots_offset() + sizeof(Slot) * size + 4095) / 4096 * 4096; }

std::string str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>(timeout.count() % 1000) * 1000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Exited, or a zombie its parent has not reaped yet.
bool process_gone(int32_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char buf[512] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* close_paren = std::strrchr(buf, ')');
  return n && close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

[[noreturn]] void dist_error(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

}  // namespace

ShmComm::ShmComm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string group, Timeouts timeouts)
    : store_(std::move(store)), rank_(rank), size_(size), group_(std::move(group)), timeouts_(timeouts),
      peers_(new Peer[size]) {
  TORCH_CHECK(size >= 1 && size <= kMaxRanks, "hccl: the shared-memory transport supports up to ", kMaxRanks,
              " ranks on one host, got a group of ", size);
  seg_bytes_ = tables_offset(size) + sizeof(VmmTable) * size;
  std::string name;
  int fd = -1;
  try {
    if (rank == 0) {
      std::random_device rd;
      name = "/torch_npu_hccl." + std::to_string(getpid()) + "." + std::to_string(rd());
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      TORCH_CHECK(fd >= 0, "hccl: shm_open(", name, ") failed: ", std::strerror(errno));
      TORCH_CHECK(ftruncate(fd, static_cast<off_t>(seg_bytes_)) == 0, "hccl: ftruncate of ", name, " failed: ",
                  std::strerror(errno));
      store_->set("hccl/segment", bytes(name));
    } else {
      try {
        store_->wait({"hccl/segment"}, timeouts_.connect);
      } catch (const std::exception& e) {
        dist_error("hccl: rank " + std::to_string(rank) + " of group '" + group_ +
                   "' timed out after " + std::to_string(timeouts_.connect.count() / 1000) +
                   " s waiting for rank 0 to create the communicator (HCCL_CONNECT_TIMEOUT): " + e.what());
      }
      // Ranks here share this host (distributed/src/comm.cpp groups them by host id).
      name = str(store_->get("hccl/segment"));
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      TORCH_CHECK(fd >= 0, "hccl: rank ", rank, ": shm_open(", name, ") failed: ", std::strerror(errno));
    }
    void* p = mmap(nullptr, seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    TORCH_CHECK(p != MAP_FAILED, "hccl: mmap of ", name, " failed: ", std::strerror(errno));
    close(fd);
    fd = -1;
    seg_ = static_cast<Segment*>(p);
    slots_ = reinterpret_cast<Slot*>(static_cast<char*>(p) + slots_offset());
    tables_ = reinterpret_cast<VmmTable*>(static_cast<char*>(p) + tables_offset(size));
    mine().pid = static_cast<int32_t>(getpid());
    store_->set("hccl/attached/" + std::to_string(rank), bytes("1"));
    if (rank == 0) {
      // Once every rank has mapped the segment its name is no longer needed: unlinking now
      // leaves nothing in /dev/shm, however the processes end.
      std::vector<std::string> keys;
      for (int r = 1; r < size; ++r) keys.push_back("hccl/attached/" + std::to_string(r));
      try {
        if (!keys.empty()) store_->wait(keys, timeouts_.connect);
      } catch (const std::exception& e) {
        dist_error("hccl: rank 0 of group '" + group_ + "' timed out after " +
                   std::to_string(timeouts_.connect.count() / 1000) +
                   " s waiting for the other ranks to join (HCCL_CONNECT_TIMEOUT): " + e.what());
      }
      shm_unlink(name.c_str());
    }
  } catch (...) {
    if (fd >= 0) close(fd);
    if (rank == 0 && !name.empty()) shm_unlink(name.c_str());
    if (seg_) munmap(seg_, seg_bytes_);
    seg_ = nullptr;
    throw;
  }
}

ShmComm::~ShmComm() {
  for (int r = 0; r < size_; ++r) {
    Peer& peer = peers_[r];
    if (char* b = peer.base.load()) munmap(b, peer.bytes);
    if (peer.fd >= 0) close(peer.fd);
    for (Window& w : peer.windows)
      if (w.base) munmap(w.base, kReservationSpan);
  }
  if (seg_) munmap(seg_, seg_bytes_);
}

void ShmComm::bind(int device) {
  std::lock_guard<std::mutex> lock(map_mu_);
  if (device_ >= 0) return;
  void* base = nullptr;
  size_t bytes_ = 0;
  int fd = -1;
  TORCH_CHECK(aclsimDeviceArena(device, &base, &bytes_, &fd) == ACL_SUCCESS && fd >= 0,
              "hccl: npu:", device, " has no shareable memory arena: ", aclGetRecentErrMsg());
  base_ = static_cast<char*>(base);
  arena_bytes_ = bytes_;
  device_ = device;
  std::ostringstream v;
  v << getpid() << " " << fd << " " << bytes_;
  store_->set("hccl/arena/" + std::to_string(rank_), bytes(v.str()));
}

uint64_t ShmComm::offset_of(const void* p, size_t nbytes) {
  const char* c = static_cast<const char*>(p);
  TORCH_CHECK(device_ >= 0, "hccl: rank ", rank_, " has no device yet");
  if (c >= base_ && c + nbytes <= base_ + arena_bytes_) return static_cast<uint64_t>(c - base_);
  std::lock_guard<std::mutex> lock(map_mu_);
  return vmm_offset_of(c, nbytes);
}

uint64_t ShmComm::vmm_offset_of(const char* p, size_t nbytes) {
  void* start = nullptr;
  size_t size = 0;
  uint64_t id = 0;
  int32_t device = -1;
  TORCH_CHECK(aclsimVmmLookup(p, &start, &size, &id, &device, nullptr) == ACL_SUCCESS && device == device_,
              "hccl: rank ", rank_, ": a buffer at ", static_cast<const void*>(p), " is not memory of npu:", device_);
  const char* res = static_cast<const char*>(start);
  TORCH_CHECK(size <= kReservationSpan && p + nbytes <= res + size, "hccl: rank ", rank_, ": a buffer at ",
              static_cast<const void*>(p), " (", nbytes, " bytes) does not fit the shareable range of its segment");
  VmmTable& t = table(rank_);
  // The slot of this reservation: the one holding it, else the first free one, else one
  // whose reservation was released (its start no longer starts the same reservation).
  int slot = -1;
  for (int j = 0; j < kMaxReservations && slot < 0; ++j)
    if (t.id[j].load(std::memory_order_relaxed) == id) slot = j;
  for (int j = 0; j < kMaxReservations && slot < 0; ++j) {
    void* s0 = nullptr;
    uint64_t id0 = 0;
    const uint64_t held = t.id[j].load(std::memory_order_relaxed);
    if (held == 0 || aclsimVmmLookup(own_reservation_[j], &s0, nullptr, &id0, nullptr, nullptr) != ACL_SUCCESS ||
        id0 != held || s0 != own_reservation_[j]) {
      slot = j;
      std::memset(t.page[j], 0, sizeof(t.page[j]));
      t.id[j].store(id, std::memory_order_release);
      own_reservation_[j] = const_cast<char*>(res);
    }
  }
  TORCH_CHECK(slot >= 0, "hccl: rank ", rank_, ": buffers of more than ", kMaxReservations,
              " expandable segments are in use by collectives at once");
  // The arena page under every page of the buffer, for the peers to map.
  const uint64_t off = static_cast<uint64_t>(p - res);
  for (uint64_t i = off / kVmmPage; i * kVmmPage < off + std::max<size_t>(nbytes, 1); ++i) {
    uint64_t arena_off = 0;
    TORCH_CHECK(aclsimVmmLookup(res + i * kVmmPage, nullptr, nullptr, nullptr, nullptr, &arena_off) == ACL_SUCCESS,
                "hccl: rank ", rank_, ": a buffer at ", static_cast<const void*>(p), " is not mapped memory");
    t.page[slot][i] = arena_off + 1;
  }
  return arena_bytes_ + slot * kReservationSpan + off;
}

char* ShmComm::addr(int r, uint64_t offset, uint64_t nbytes) {
  if (r == rank_) {
    if (offset < arena_bytes_) return base_ + offset;
    std::lock_guard<std::mutex> lock(map_mu_);
    return vmm_addr(r, offset, nbytes);
  }
  Peer& peer = peers_[r];
  char* b = peer.base.load(std::memory_order_acquire);
  if (!b) {
    std::lock_guard<std::mutex> lock(map_mu_);
    b = peer.base.load();
    if (!b) {
      const std::string key = "hccl/arena/" + std::to_string(r);
      store_->wait({key}, timeouts_.connect);
      std::istringstream v(str(store_->get(key)));
      long pid = 0;
      int fd = -1;
      size_t size = 0;
      v >> pid >> fd >> size;
      const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
      int local = open(path.c_str(), O_RDWR);
      TORCH_CHECK(local >= 0, "hccl: rank ", g(rank_), " cannot open the device memory of rank ", g(r), " (", path,
                  "): ", std::strerror(errno), ". Ranks of a group must run on one host as one user.");
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, local, 0);
      if (p == MAP_FAILED) close(local);
      TORCH_CHECK(p != MAP_FAILED, "hccl: mapping the device memory of rank ", g(r), " failed: ", std::strerror(errno));
      peer.fd = local;  // kept to map pages of its expandable segments
      peer.bytes = size;
      b = static_cast<char*>(p);
      peer.base.store(b, std::memory_order_release);
    }
  }
  if (offset <= peer.bytes && nbytes <= peer.bytes - offset) return b + offset;
  std::lock_guard<std::mutex> lock(map_mu_);
  return vmm_addr(r, offset, nbytes);
}

char* ShmComm::vmm_addr(int r, uint64_t offset, uint64_t nbytes) {
  const uint64_t arena = r == rank_ ? arena_bytes_ : peers_[r].bytes;
  // Offsets come from the peer's slot: check them before touching memory.
  const uint64_t v = offset - arena, slot = v / kReservationSpan, off = v % kReservationSpan;
  TORCH_CHECK(offset >= arena && slot < kMaxReservations && nbytes <= kReservationSpan - off, "hccl: rank ", g(r),
              " published a buffer outside its device memory (offset ", offset, ", ", nbytes, " bytes)");
  if (r == rank_) return own_reservation_[slot] + off;
  Peer& peer = peers_[r];
  VmmTable& t = table(r);
  Window& w = peer.windows[slot];
  const uint64_t id = t.id[slot].load(std::memory_order_acquire);
  if (w.id != id || w.base == nullptr) {  // a new reservation in this slot: a fresh window
    if (w.base == nullptr) {
      void* p = mmap(nullptr, kReservationSpan, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "hccl: reserving address space for rank ", g(r), "'s memory failed: ",
                  std::strerror(errno));
      w.base = static_cast<char*>(p);
    } else {
      TORCH_CHECK(mmap(w.base, kReservationSpan, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                       -1, 0) != MAP_FAILED,
                  "hccl: resetting the window on rank ", g(r), "'s memory failed: ", std::strerror(errno));
    }
    w.mapped.assign(kVmmPages, 0);
    w.id = id;
  }
  for (uint64_t i = off / kVmmPage; i * kVmmPage < off + std::max<uint64_t>(nbytes, 1); ++i) {
    const uint64_t entry = t.page[slot][i];
    TORCH_CHECK(entry != 0 && peer.bytes >= kVmmPage && entry - 1 <= peer.bytes - kVmmPage && (entry - 1) % 4096 == 0,
                "hccl: rank ", g(r),
                " published a buffer whose memory it did not describe (page ", i, " of segment slot ", slot, ")");
    if (w.mapped[i] == entry) continue;
    TORCH_CHECK(mmap(w.base + i * kVmmPage, kVmmPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, peer.fd,
                     static_cast<off_t>(entry - 1)) != MAP_FAILED,
                "hccl: mapping rank ", g(r), "'s memory failed: ", std::strerror(errno));
    w.mapped[i] = entry;
  }
  return w.base + off;
}

void ShmComm::ring() {
  seg_->bell.fetch_add(1);
  if (seg_->sleepers.load() > 0) futex_wake_all(&seg_->bell);
}

void ShmComm::check_abort(const OpDesc& op) {
  const int32_t by = seg_->failed_by.load(std::memory_order_acquire) - 1;
  if (by < 0) return;
  dist_error("hccl: rank " + std::to_string(g(rank_)) + ": " + op.name + " (sequence number " + std::to_string(op.seq) +
             ") of group '" + group_ + "' cannot run: the communicator failed on rank " + std::to_string(g(by)) +
             ": " + seg_->why);
}

void ShmComm::mark_failed(const std::string& msg) {
  int32_t expected = 0;
  if (seg_->failed_by.load() == 0) {
    std::snprintf(seg_->why, sizeof(seg_->why), "%s", msg.c_str());
    seg_->failed_by.compare_exchange_strong(expected, rank_ + 1);
  }
  ring();
}

void ShmComm::fail(const std::string& msg) {
  mark_failed(msg);
  dist_error(msg);
}

void ShmComm::timeout(const OpDesc& op, const std::vector<int>& missing) {
  std::string who;
  for (int r : missing) who += (who.empty() ? "" : ", ") + std::to_string(g(r));
  fail("hccl: rank " + std::to_string(g(rank_)) + " timed out after " + std::to_string(timeouts_.exec.count()) +
       " ms in " + op.name + " (sequence number " + std::to_string(op.seq) + ") of group '" + group_ +
       "': rank(s) " + who +
       " never arrived (HCCL_EXEC_TIMEOUT / ProcessGroupHCCL.Options.op_timeout). The communicator is "
       "aborted.");
}

void ShmComm::check_alive(const OpDesc& op, const std::vector<int>& missing) {
  for (int r : missing) {
    const int32_t pid = slots_[r].pid;
    if (pid > 0 && process_gone(pid)) {
      fail("hccl: rank " + std::to_string(g(rank_)) + ": " + op.name + " (sequence number " + std::to_string(op.seq) +
           ") of group '" + group_ + "' cannot complete: rank " + std::to_string(g(r)) + " (pid " +
           std::to_string(pid) + ") exited. The communicator is aborted.");
    }
  }
}

template <class Ready, class Missing>
void ShmComm::wait_for(Ready ready, Missing missing, const OpDesc& op) {
  if (ready()) return;
  const auto start = Clock::now();
  // Peers usually arrive within microseconds: spin, then yield the core (2 cores are
  // shared by all ranks), then sleep on the futex.
  for (int i = 0; i < kSpinPauses; ++i) {
    if (ready()) return;
    __builtin_ia32_pause();
  }
  while (Clock::now() - start < milliseconds(2)) {
    if (ready()) return;
    check_abort(op);
    sched_yield();
  }
  const auto deadline = start + timeouts_.exec;
  while (true) {
    // Ready first: a peer may complete this very step, leave, and abort the communicator
    // (reinit_process_group) before this rank wakes; the step is still complete here.
    if (ready()) return;
    check_abort(op);
    uint32_t bell = seg_->bell.load();
    seg_->sleepers.fetch_add(1);
    if (ready()) {
      seg_->sleepers.fetch_sub(1);
      return;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      seg_->sleepers.fetch_sub(1);
      timeout(op, missing());
    }
    futex_wait(&seg_->bell, bell, std::min(left, milliseconds(100)));
    seg_->sleepers.fetch_sub(1);
    if (!ready()) check_alive(op, missing());
  }
}

void ShmComm::barrier(const OpDesc& op) {
  check_abort(op);
  uint64_t e = epoch_;
  if (resume_) {
    resume_ = false;  // arrived already, in the inline attempt
  } else {
    mine().arrived.store(++e);
    epoch_ = e;
    ring();
  }
  auto all_here = [&] {
    for (int r = 0; r < size_; ++r)
      if (slots_[r].arrived.load(std::memory_order_acquire) < e) return false;
    return true;
  };
  if (attempt_.count() > 0) {
    // Inline attempt: spin (a peer in a tight loop arrives within microseconds), then
    // yield the core, until the budget is spent; never sleep.
    const auto deadline = Clock::now() + attempt_;
    attempt_ = std::chrono::nanoseconds(0);
    for (int i = 0; !all_here(); ++i) {
      if (i < kSpinPauses) {
        __builtin_ia32_pause();
        continue;
      }
      if (Clock::now() >= deadline) throw NotArrived{};
      if (i % 16 == 0) check_abort(op);
      sched_yield();  // returns at once unless a thread (maybe the peer) waits for this core
    }
    return;
  }
  wait_for(
      all_here,
      [&] {
        std::vector<int> m;
        for (int r = 0; r < size_; ++r)
          if (slots_[r].arrived.load() < e) m.push_back(r);
        return m;
      },
      op);
}

void ShmComm::send(int dst, uint64_t offset, uint64_t nbytes, int32_t dtype, const OpDesc& op) {
  check_abort(op);
  const uint64_t n = ++sent_[dst];
  Mailbox& box = mine().box[dst];
  box.offset = offset;
  box.nbytes = nbytes;
  box.dtype = dtype;
  box.posted.store(n, std::memory_order_release);
  ring();
  std::atomic<uint64_t>& ack = slots_[dst].ack[rank_];
  wait_for([&] { return (ack.load(std::memory_order_acquire) & ~kNack) >= n; }, [&] { return std::vector<int>{dst}; },
           op);
  TORCH_CHECK(!(ack.load() & kNack), "hccl: rank ", g(rank_), ": ", op.name, " (sequence number ", op.seq,
              ") to rank ", g(dst), " was rejected: the receiver expected another size or dtype (", nbytes,
              " bytes sent)");
}

void ShmComm::recv(int src, void* dst, uint64_t nbytes, int32_t dtype, const OpDesc& op) {
  check_abort(op);
  const uint64_t n = ++taken_[src];
  Mailbox& box = slots_[src].box[rank_];
  wait_for([&] { return box.posted.load(std::memory_order_acquire) >= n; }, [&] { return std::vector<int>{src}; },
           op);
  if (box.nbytes != nbytes || box.dtype != dtype) {
    const uint64_t got = box.nbytes;
    const int32_t got_dtype = box.dtype;
    mine().ack[src].store(n | kNack, std::memory_order_release);
    ring();
    TORCH_CHECK(false, "hccl: rank ", g(rank_), ": ", op.name, " (sequence number ", op.seq, ") from rank ", g(src),
                " expected ", nbytes, " bytes of ", c10::toString(static_cast<c10::ScalarType>(dtype)),
                " but rank ", g(src), " sent ", got, " bytes of ",
                c10::toString(static_cast<c10::ScalarType>(got_dtype)));
  }
  std::memcpy(dst, addr(src, box.offset, nbytes), nbytes);
  mine().ack[src].store(n, std::memory_order_release);
  ring();
}

}  // namespace torch_npu::distributed
