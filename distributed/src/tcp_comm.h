// The between-hosts transport of HCCL: TCP sockets, one listening socket per rank.
//
// Each rank listens on an ephemeral port of the address it would use to reach the store's
// host (or HCCL_IF_IP / the first IPv4 address of an interface matching
// HCCL_SOCKET_IFNAME, as HCCL honours them) and publishes "ip:port" in the c10d Store.
// Connections are made lazily, one per (peer, channel): the lower rank connects, the
// higher one accepts (a background thread accepts and checks a hello). Channels keep the
// threads apart: the collective stream's worker owns channel kColl; on kP2P the send
// stream writes and the recv stream reads. TCP_NODELAY, non-blocking sockets, poll().
//
// Every message is a framed header (magic, kind, sequence number, byte count, dtype) plus
// payload; the receiver checks every field against what it expects before writing a byte
// of payload, so a malformed or hostile peer causes an error, never an out-of-bounds
// write. Waits give up after the execution timeout without progress; a closed connection
// (dead peer) raises at once, naming the peer rank, the collective and its sequence number.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shm_comm.h"

namespace torch_npu::distributed {

class TcpComm {
 public:
  enum Channel : int32_t { kColl = 0, kP2P = 1 };

  // `check` runs about every 100 ms while a wait blocks (e.g. raises if the host's
  // shared-memory communicator failed meanwhile).
  TcpComm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string group, Timeouts timeouts,
          std::function<void(const OpDesc&)> check);
  ~TcpComm();
  TcpComm(const TcpComm&) = delete;
  TcpComm& operator=(const TcpComm&) = delete;

  // One message of a collective, to or from a peer.
  struct Xfer {
    int peer;
    char* buf;
    uint64_t nbytes;
  };
  // Sends every `sends[i]` and receives every `recvs[i]` at the same time on channel kColl
  // (messages to one peer, and from one peer, in list order); returns when all are done.
  // Messages carry op.seq, checked by the receiver, as is each byte count.
  void exchange(const std::vector<Xfer>& sends, const std::vector<Xfer>& recvs, const OpDesc& op);

  // Point-to-point on channel kP2P (send stream / recv stream only): a send returns once
  // the bytes are in the kernel's buffers; the receiver checks count and dtype.
  void send(int dst, const void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op);
  void recv(int src, void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op);

  // Shuts every connection down: peers blocked on us see the connection close at once.
  void abort();

  const std::string& address() const { return address_; }  // "ip:port" of our listener
  // For tests and debugging: bytes moved and the peers we have a connection with.
  uint64_t bytes_sent() const { return bytes_sent_.load(); }
  uint64_t bytes_received() const { return bytes_received_.load(); }
  std::vector<int> connected_peers();

 private:
  struct Frame;
  struct Pending;
  int conn(int peer, Channel ch, const OpDesc& op);
  int connect_to(int peer, Channel ch, const OpDesc& op);
  void accept_loop();
  // Moves all of `items` (each a send or a receive on its fd) with poll(); see exchange().
  void progress(std::vector<Pending>& items, const OpDesc& op);
  std::string peer_name(int peer);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::string group_;
  uint32_t group_hash_;
  Timeouts timeouts_;
  std::function<void(const OpDesc&)> check_;
  std::string address_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> aborted_{false};
  std::thread acceptor_;

  std::mutex connect_mu_;  // one outgoing connect at a time
  std::mutex mu_;          // guards fds_ and addrs_
  std::condition_variable accepted_;
  std::map<std::pair<int, int>, int> fds_;  // (peer, channel) -> socket
  std::map<int, std::string> addrs_;        // peer -> "ip:port"

  std::vector<uint64_t> p2p_sent_;   // messages sent to each peer (send stream only)
  std::vector<uint64_t> p2p_recvd_;  // messages received from each peer (recv stream only)
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace torch_npu::distributed
