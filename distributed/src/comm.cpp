#include "comm.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

namespace torch_npu::distributed {

std::string host_identity() {
  // TORCH_NPU_HCCL_HOST_ID overrides (e.g. a distinct value per rank makes every rank its
  // own "host", forcing TCP on one machine: benchmarks/hccl_bench.py --tcp).
  if (const char* v = std::getenv("TORCH_NPU_HCCL_HOST_ID"); v && *v) return v;
  // The host name alone is not enough: containers and machines often share one
  // ("localhost", an image's default). The kernel's boot id tells machines (and VMs)
  // apart; the inode of our network namespace tells containers and `ip netns` "hosts" on
  // one kernel apart, which is also the boundary of a host's network identity (its own
  // addresses, its own loopback). Ranks equal in all three can share memory.
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st {};
  const unsigned long long netns = stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0;
  return std::string(name) + "/" + boot_id + "/netns:" + std::to_string(netns);
}

Comm::Comm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::string group, Timeouts timeouts)
    : rank_(rank), size_(size), host_of_(size), local_index_(size) {
  // Rendezvous: everyone publishes its host id; hosts are numbered by their lowest rank.
  const std::string id = host_identity();
  store->set("hccl/host/" + std::to_string(rank), std::vector<uint8_t>(id.begin(), id.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("hccl/host/" + std::to_string(r));
  try {
    store->wait(keys, timeouts.connect);
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, "hccl: rank " + std::to_string(rank) + " of group '" + group + "' timed out after " +
                                          std::to_string(timeouts.connect.count() / 1000) +
                                          " s waiting for the other ranks to join (HCCL_CONNECT_TIMEOUT): " + e.what());
  }
  const auto ids = store->multiGet(keys);
  std::map<std::vector<uint8_t>, int> index;
  for (int r = 0; r < size; ++r) {
    auto [it, fresh] = index.emplace(ids[r], static_cast<int>(hosts_.size()));
    if (fresh) hosts_.emplace_back();
    host_of_[r] = it->second;
    local_index_[r] = static_cast<int>(hosts_[it->second].size());
    hosts_[it->second].push_back(r);
  }
  if (hosts_.size() == 1) {
    local_ = std::make_unique<ShmComm>(store, rank, size, std::move(group), timeouts);
    return;
  }
  TORCH_CHECK(size <= kMaxRanks, "hccl: groups spanning several hosts support up to ", kMaxRanks,
              " ranks, got ", size);
  const int h = host_of_[rank];
  auto host_store = c10::make_intrusive<c10d::PrefixStore>("hccl/host" + std::to_string(h), store);
  local_ = std::make_unique<ShmComm>(host_store, local_index_[rank], static_cast<int>(hosts_[h].size()), group,
                                     timeouts);
  local_->set_rank_names(hosts_[h]);
  net_ = std::make_unique<TcpComm>(store, rank, size, std::move(group), timeouts,
                                   [this](const OpDesc& op) { local_->check_abort(op); });
}

std::string Comm::transport(int peer) const {
  TORCH_CHECK(peer >= 0 && peer < size_, "hccl: invalid peer rank ", peer, " for a group of size ", size_);
  if (peer == rank_) return "self";
  return host_of_[peer] == host_of_[rank_] ? "shm" : "tcp";
}

void Comm::send(int dst, const void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op) {
  if (host_of_[dst] == host_of_[rank_])
    return local_->send(local_index_[dst], nbytes ? offset_of(data, nbytes) : 0, nbytes, dtype, op);
  net_->send(dst, data, nbytes, dtype, op);
}

void Comm::recv(int src, void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op) {
  if (host_of_[src] == host_of_[rank_]) return local_->recv(local_index_[src], data, nbytes, dtype, op);
  net_->recv(src, data, nbytes, dtype, op);
}

void Comm::abort(const std::string& why) {
  if (!net_) return;
  net_->abort();
  local_->mark_failed(why);
}

}  // namespace torch_npu::distributed
