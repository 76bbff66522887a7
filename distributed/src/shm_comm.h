// The same-host transport of HCCL: one communicator per process group.
//
// Control: a shared-memory segment (shm_open, unlinked as soon as every rank has mapped
// it, so nothing stays in /dev/shm) holding one slot per rank: a barrier counter, the
// header of the rank's current collective (checked against every peer's), a table of
// buffer offsets and sizes, and point-to-point mailboxes. Waits spin briefly, then sleep
// on a futex in the segment, and give up after the execution timeout.
//
// Data: npu memory is host memory in a per-device memfd arena (core/acl), so each rank
// maps its peers' arenas (opened through /proc/<pid>/fd) and reads their buffers in
// place: no staging copy, no sockets. Buffers are named by (arena offset) in the tables.
// Memory of expandable segments (PYTORCH_NPU_ALLOC_CONF=expandable_segments:True) is
// arena pages mapped at reserved addresses in no particular order. Each rank keeps, in the
// control segment, a page table of the reservations its published buffers live in (the
// arena offset of every 2 MiB page), and names such a buffer by an offset past its
// arena: arena bytes + reservation slot * kReservationSpan + offset in the reservation.
// A peer maps the same arena pages, in the same order, into a window of its own (as
// CUDA IPC maps each page of an expandable segment), remapping only pages that changed.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_npu::distributed {

// Ranks of one group on one host (the slot table is fixed-size).
constexpr int kMaxRanks = 64;

// What each rank declares about its part of a collective; all ranks must agree.
struct OpHeader {
  uint64_t seq;
  uint32_t coll;    // Coll
  int32_t dtype;    // c10::ScalarType
  int64_t count;    // elements per rank (meaning per collective), -1: not compared
  int32_t root;     // -1: none
  int32_t redop;    // -1: none
};

// A collective as named in errors: "allreduce (sequence number 7)".
struct OpDesc {
  const char* name;
  uint64_t seq;
};

struct Mailbox {  // sender side of one (src -> dst) pair, in the sender's slot
  std::atomic<uint64_t> posted;
  uint64_t offset;
  uint64_t nbytes;
  int32_t dtype;
  int32_t pad;
};

struct alignas(64) Slot {
  std::atomic<uint64_t> arrived;  // barrier epochs reached by this rank
  int32_t pid;                    // to tell a slow peer from a dead one
  alignas(64) OpHeader header;
  uint64_t offset[kMaxRanks];     // arena offsets of this rank's buffers for the op
  uint64_t out_offset[kMaxRanks];  // ... and of its output buffers (multi-host collectives)
  uint64_t send_bytes[kMaxRanks];  // all-to-all: bytes this rank sends to each peer
  uint64_t recv_bytes[kMaxRanks];  // ... and expects from each peer
  Mailbox box[kMaxRanks];          // point-to-point: this rank -> peer
  std::atomic<uint64_t> ack[kMaxRanks];  // point-to-point: messages taken from peer
};

// Expandable-segment reservations a rank can publish buffers from, and the largest one.
constexpr int kMaxReservations = 16;
constexpr uint64_t kReservationSpan = uint64_t(128) << 30;
constexpr uint64_t kVmmPage = uint64_t(2) << 20;  // the simulator's VMM granularity
constexpr uint64_t kVmmPages = kReservationSpan / kVmmPage;

// A rank's page tables (in the control segment, after the slots).
struct VmmTable {
  std::atomic<uint64_t> id[kMaxReservations];      // reservation in this slot (0: none)
  uint64_t page[kMaxReservations][kVmmPages];     // 1 + arena offset of each page (0: unknown)
};

struct Timeouts {
  std::chrono::milliseconds connect;  // rendezvous (HCCL_CONNECT_TIMEOUT)
  std::chrono::milliseconds exec;     // one wait inside a collective (HCCL_EXEC_TIMEOUT)
};

class ShmComm {
 public:
  ShmComm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string group, Timeouts timeouts);
  ~ShmComm();
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& group() const { return group_; }
  const Timeouts& timeouts() const { return timeouts_; }

  // The device whose arena holds this rank's buffers; fixed at the first call. Publishes
  // the arena for peers (through the store).
  void bind(int device);
  int device() const { return device_; }
  // Offset naming [p, p + nbytes) of this rank for its peers: in the bound arena, or past
  // it for expandable-segment memory (error if neither).
  uint64_t offset_of(const void* p, size_t nbytes);
  // Address of a peer's (or our own) buffer; maps the peer's arena on first use.
  char* addr(int rank, uint64_t offset, uint64_t nbytes);

  Slot& slot(int rank) { return slots_[rank]; }
  Slot& mine() { return slots_[rank_]; }

  // Every rank reaches this point (each collective calls it the same number of times).
  void barrier(const OpDesc& op);

  // Inline attempts (process_group_hccl.cpp runs small collectives on the calling thread
  // when its streams are idle): after attempt(budget) the next barrier waits at most
  // `budget` for the peers (spinning) and throws NotArrived if one is missing. Its
  // arrival stays posted; after resume() the next barrier (the same one, when the
  // collective is re-run on the communication stream) waits for it without arriving
  // again. Publishing a header and offsets is idempotent, so a collective can be re-run
  // from its start. attempt(0) cancels an attempt that never reached a barrier.
  struct NotArrived {};
  void attempt(std::chrono::nanoseconds budget) { attempt_ = budget; }
  void resume() { resume_ = true; }
  // Point-to-point (pull): the sender posts a buffer and waits until the receiver took it.
  void send(int dst, uint64_t offset, uint64_t nbytes, int32_t dtype, const OpDesc& op);
  void recv(int src, void* dst, uint64_t nbytes, int32_t dtype, const OpDesc& op);

  // Errors name ranks by these numbers (the group's ranks, when this communicator holds
  // only one host's ranks of a larger group); default: our own numbering.
  void set_rank_names(std::vector<int> global) { global_ = std::move(global); }

  // Marks the communicator failed for every rank (peers waiting raise at once).
  [[noreturn]] void fail(const std::string& msg);
  void mark_failed(const std::string& msg);  // the same without raising
  // Raises if the communicator was marked failed (by any rank).
  void check_abort(const OpDesc& op);

  struct Segment;  // header of the control segment (defined in shm_comm.cpp)

 private:
  template <class Ready, class Missing>
  void wait_for(Ready ready, Missing missing, const OpDesc& op);
  [[noreturn]] void timeout(const OpDesc& op, const std::vector<int>& missing);
  void check_alive(const OpDesc& op, const std::vector<int>& missing);
  void ring();
  uint64_t vmm_offset_of(const char* p, size_t nbytes);  // map_mu_ held
  char* vmm_addr(int rank, uint64_t offset, uint64_t nbytes);  // map_mu_ held
  VmmTable& table(int rank) { return tables_[rank]; }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::string group_;
  Timeouts timeouts_;
  Segment* seg_ = nullptr;
  Slot* slots_ = nullptr;
  VmmTable* tables_ = nullptr;
  size_t seg_bytes_ = 0;
  uint64_t epoch_ = 0;               // barriers passed (collective stream, or inline while it is idle)
  std::chrono::nanoseconds attempt_{0};
  bool resume_ = false;
  uint64_t sent_[kMaxRanks] = {};    // send stream only
  uint64_t taken_[kMaxRanks] = {};   // recv stream only
  int g(int r) const { return global_.empty() ? r : global_[r]; }
  std::vector<int> global_;
  int device_ = -1;
  char* base_ = nullptr;  // own arena
  size_t arena_bytes_ = 0;
  struct Window {  // a peer's reservation, mapped page by page as its buffers need
    uint64_t id = 0;
    char* base = nullptr;  // kReservationSpan of address space
    std::vector<uint64_t> mapped;  // table entry mapped at each page (0: none)
  };
  struct Peer {
    std::atomic<char*> base{nullptr};
    size_t bytes = 0;
    int fd = -1;  // its arena memfd
    Window windows[kMaxReservations];
  };
  std::unique_ptr<Peer[]> peers_;
  char* own_reservation_[kMaxReservations] = {};  // start of the reservation in each slot
  std::mutex map_mu_;
};

}  // namespace torch_npu::distributed
