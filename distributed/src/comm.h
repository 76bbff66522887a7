// One HCCL communicator (per process group): which ranks share a host, and the transports
// between them. Ranks on one host talk through a ShmComm (shared memory, peers' device
// memory read in place); when the group spans several hosts each rank also has a TcpComm,
// and the collectives become hierarchical (src/hierarchical.cpp): the first rank of each
// host (its "leader") moves its host's data over TCP, reading and writing the other local
// ranks' buffers in place. A group on one host is exactly the same-host path.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>
#include <vector>

#include "shm_comm.h"
#include "tcp_comm.h"

namespace torch_npu::distributed {

// Identifies the host (machine, container, network namespace) this process runs on.
std::string host_identity();

class Comm {
 public:
  Comm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::string group, Timeouts timeouts);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& group() const { return local_->group(); }
  bool multi_host() const { return net_ != nullptr; }

  ShmComm& local() { return *local_; }  // this host's ranks (the whole group on one host)
  TcpComm& net() { return *net_; }      // multi-host only

  int nhosts() const { return static_cast<int>(hosts_.size()); }
  int host() const { return host_of_[rank_]; }
  int host_of(int r) const { return host_of_[r]; }
  const std::vector<int>& ranks_on(int h) const { return hosts_[h]; }
  int leader(int h) const { return hosts_[h][0]; }
  bool is_leader() const { return leader(host()) == rank_; }
  int local_index(int r) const { return local_index_[r]; }  // position of r among its host's ranks

  // Same-host helpers on global ranks (r must be on this host).
  Slot& slot(int r) { return local_->slot(local_index_[r]); }
  char* addr(int r, uint64_t offset, uint64_t nbytes) { return local_->addr(local_index_[r], offset, nbytes); }

  void bind(int device) { local_->bind(device); }
  int device() const { return local_->device(); }
  uint64_t offset_of(const void* p, size_t nbytes) const { return local_->offset_of(p, nbytes); }

  // "self", "shm" or "tcp": how this rank reaches `peer`.
  std::string transport(int peer) const;

  // Point-to-point through the right transport.
  void send(int dst, const void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op);
  void recv(int src, void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op);

  // After an error in a multi-host group: marks the host's segment failed and shuts the
  // sockets down, so that local peers and the other hosts raise at once instead of
  // waiting out their timeout. No-op on one host (the shared-memory path fails itself).
  void abort(const std::string& why);

 private:
  int rank_;
  int size_;
  std::vector<int> host_of_;
  std::vector<int> local_index_;
  std::vector<std::vector<int>> hosts_;  // ranks of each host, ascending; hosts by lowest rank
  std::unique_ptr<ShmComm> local_;
  std::unique_ptr<TcpComm> net_;
};

}  // namespace torch_npu::distributed
