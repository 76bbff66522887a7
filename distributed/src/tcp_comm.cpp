#include "tcp_comm.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

namespace torch_npu::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMagic = 0x4843434c;  // "HCCL"
enum Kind : uint32_t { kHello = 1, kCollMsg = 2, kP2PMsg = 3 };

struct TcpComm::Frame {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;     // collective: the group's sequence number; p2p: messages on this pair
  uint64_t nbytes;  // payload that follows; hello: the sender's rank
  int32_t dtype;    // p2p: c10::ScalarType; hello: channel; else -1
  uint32_t group;   // hash of the group name
};


// One send or receive in flight (see progress()).
struct TcpComm::Pending {  // (Frame is 32 bytes: no padding, same layout on every rank)
  int fd;
  int peer;
  bool is_send;
  Frame hdr;  // to send, or as received
  char* buf;
  uint64_t nbytes;
  size_t hdr_done = 0;
  uint64_t done = 0;
  bool finished() const { return hdr_done == sizeof(Frame) && done == nbytes; }
};

namespace {

[[noreturn]] void dist_error(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char ch : s) h = (h ^ ch) * 16777619u;
  return h;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string ntop(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

// HCCL_SOCKET_IFNAME as HCCL reads it: comma-separated interface name prefixes, "=" in
// front for exact names, "^" in front to exclude the listed ones. First IPv4 address wins.
std::string ip_of_interface(const std::string& spec) {
  std::string s = spec;
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s = s.substr(1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s = s.substr(1);
  std::vector<std::string> names;
  std::stringstream ss(s);
  for (std::string n; std::getline(ss, n, ',');)
    if (!n.empty()) names.push_back(n);
  ifaddrs* list = nullptr;
  TORCH_CHECK(getifaddrs(&list) == 0, "hccl: getifaddrs failed: ", std::strerror(errno));
  std::string found;
  for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const std::string name = i->ifa_name;
    bool match = false;
    for (const auto& n : names) match = match || (exact ? name == n : name.rfind(n, 0) == 0);
    if (exclude && (i->ifa_flags & IFF_LOOPBACK)) continue;  // "^eth" means "any other real NIC"
    if (match != exclude) found = ntop(*reinterpret_cast<sockaddr_in*>(i->ifa_addr));
  }
  freeifaddrs(list);
  TORCH_CHECK(!found.empty(), "hccl: HCCL_SOCKET_IFNAME=", spec, " matches no network interface with an IPv4 address");
  return found;
}

// The local address the kernel routes through to reach `host` (a UDP connect sends nothing).
std::string ip_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "";
  std::string ip;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = ntop(a);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return ip;
}

// The host of the TCPStore behind `store` (the rendezvous master), else MASTER_ADDR.
std::string master_host(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> base = store;
  if (auto* p = dynamic_cast<c10d::PrefixStore*>(base.get())) base = p->getUnderlyingNonPrefixStore();
  if (auto* t = dynamic_cast<c10d::TCPStore*>(base.get())) return t->getHost();
  return env("MASTER_ADDR");
}

// The address this rank listens on: HCCL_IF_IP, else HCCL_SOCKET_IFNAME, else the address
// that routes to the rendezvous master (the one peers on other hosts can reach us at).
std::string listen_ip(const c10::intrusive_ptr<c10d::Store>& store) {
  if (!env("HCCL_IF_IP").empty()) return env("HCCL_IF_IP");
  if (!env("HCCL_SOCKET_IFNAME").empty()) return ip_of_interface(env("HCCL_SOCKET_IFNAME"));
  const std::string master = master_host(store);
  std::string ip = master.empty() ? "" : ip_towards(master);
  return ip.empty() ? "127.0.0.1" : ip;
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Blocking-with-deadline write/read of a small record on a blocking or non-blocking fd.
bool io_all(int fd, void* p, size_t n, bool write, Clock::time_point deadline) {
  char* c = static_cast<char*>(p);
  size_t done = 0;
  while (done < n) {
    ssize_t k = write ? ::send(fd, c + done, n - done, MSG_NOSIGNAL) : ::recv(fd, c + done, n - done, 0);
    if (k > 0) {
      done += k;
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 100)));
  }
  return true;
}

const char* dtype_name(int32_t dt) { return c10::toString(static_cast<c10::ScalarType>(dt)); }

}  // namespace

TcpComm::TcpComm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string group, Timeouts timeouts,
                 std::function<void(const OpDesc&)> check)
    : store_(std::move(store)), rank_(rank), size_(size), group_(std::move(group)), group_hash_(fnv1a(group_)),
      timeouts_(timeouts), check_(std::move(check)), p2p_sent_(size), p2p_recvd_(size) {
  const std::string ip = listen_ip(store_);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;  // ephemeral: several groups and ranks per host never collide
  TORCH_CHECK(inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1, "hccl: '", ip,
              "' is not an IPv4 address (HCCL_IF_IP / HCCL_SOCKET_IFNAME)");
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(listen_fd_ >= 0, "hccl: socket() failed: ", std::strerror(errno));
  socklen_t len = sizeof(a);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_fd_, 128) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    close(listen_fd_);
    TORCH_CHECK(false, "hccl: rank ", rank_, " cannot listen on ", ip, ": ", std::strerror(err));
  }
  address_ = ip + ":" + std::to_string(ntohs(a.sin_port));
  store_->set("hccl/tcp/" + std::to_string(rank_), std::vector<uint8_t>(address_.begin(), address_.end()));
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpComm::~TcpComm() {
  stop_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  for (auto& [key, fd] : fds_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

void TcpComm::accept_loop() {
  while (!stop_.load()) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // The connector says who it is; anything else is dropped.
    Frame h{};
    const bool ok = io_all(fd, &h, sizeof(h), false, Clock::now() + milliseconds(5000)) && h.magic == kMagic &&
                    h.kind == kHello && h.group == group_hash_ && h.nbytes < static_cast<uint64_t>(rank_) &&
                    (h.dtype == kColl || h.dtype == kP2P);
    if (!ok) {
      close(fd);
      continue;
    }
    tune(fd);
    std::lock_guard<std::mutex> lock(mu_);
    // The first connection of a (peer, channel) stays: ranks never reconnect, so a second
    // one is an impostor (it could not take over a live connection).
    if (!fds_.emplace(std::make_pair(static_cast<int>(h.nbytes), static_cast<int>(h.dtype)), fd).second) close(fd);
    accepted_.notify_all();
  }
}

std::string TcpComm::peer_name(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = addrs_.find(peer);
  return "rank " + std::to_string(peer) + (it == addrs_.end() ? "" : " (" + it->second + ")");
}

int TcpComm::connect_to(int peer, Channel ch, const OpDesc& op) {
  const std::string key = "hccl/tcp/" + std::to_string(peer);
  try {
    store_->wait({key}, timeouts_.connect);
  } catch (const std::exception& e) {
    dist_error("hccl: rank " + std::to_string(rank_) + ": " + op.name + " (sequence number " + std::to_string(op.seq) +
               ") of group '" + group_ + "': rank " + std::to_string(peer) +
               " never published its TCP address (HCCL_CONNECT_TIMEOUT): " + e.what());
  }
  const auto v = store_->get(key);
  const std::string addr(v.begin(), v.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    addrs_[peer] = addr;
  }
  const auto colon = addr.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(addr.c_str() + colon + 1)));
  TORCH_CHECK(colon != std::string::npos && inet_pton(AF_INET, addr.substr(0, colon).c_str(), &a.sin_addr) == 1,
              "hccl: rank ", peer, " published a malformed TCP address '", addr, "'");
  const auto deadline = Clock::now() + timeouts_.connect;
  while (true) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(fd >= 0, "hccl: socket() failed: ", std::strerror(errno));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      Frame h{kMagic, kHello, 0, static_cast<uint64_t>(rank_), ch, group_hash_};
      if (io_all(fd, &h, sizeof(h), true, deadline)) {
        tune(fd);
        return fd;
      }
    }
    const int err = errno;
    close(fd);
    if (Clock::now() >= deadline)
      dist_error("hccl: rank " + std::to_string(rank_) + ": " + op.name + " (sequence number " +
                 std::to_string(op.seq) + ") of group '" + group_ + "': cannot connect to rank " +
                 std::to_string(peer) + " at " + addr + " within " + std::to_string(timeouts_.connect.count() / 1000) +
                 " s (HCCL_CONNECT_TIMEOUT): " + std::strerror(err));
    check_(op);
    std::this_thread::sleep_for(milliseconds(50));
  }
}

int TcpComm::conn(int peer, Channel ch, const OpDesc& op) {
  const auto key = std::make_pair(peer, static_cast<int>(ch));
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_.load()) dist_error("hccl: rank " + std::to_string(rank_) + ": " + op.name + " (sequence number " +
                                  std::to_string(op.seq) + ") of group '" + group_ + "': the communicator was aborted");
  auto it = fds_.find(key);
  if (it != fds_.end()) return it->second;
  if (rank_ < peer) {
    // kP2P is used by two threads (send and recv streams): one connects, the other waits
    // for it (connect_mu_), so the peer never sees two connections for one channel.
    lock.unlock();
    std::lock_guard<std::mutex> connecting(connect_mu_);
    lock.lock();
    it = fds_.find(key);
    if (it != fds_.end()) return it->second;
    lock.unlock();
    const int fd = connect_to(peer, ch, op);
    lock.lock();
    fds_[key] = fd;
    return fd;
  }
  const auto deadline = Clock::now() + timeouts_.connect;
  while (fds_.find(key) == fds_.end()) {
    if (Clock::now() >= deadline)
      dist_error("hccl: rank " + std::to_string(rank_) + ": " + op.name + " (sequence number " +
                 std::to_string(op.seq) + ") of group '" + group_ + "': rank " + std::to_string(peer) +
                 " did not connect within " + std::to_string(timeouts_.connect.count() / 1000) +
                 " s (HCCL_CONNECT_TIMEOUT)");
    accepted_.wait_for(lock, milliseconds(100));
    lock.unlock();
    check_(op);
    lock.lock();
  }
  return fds_[key];
}

void TcpComm::progress(std::vector<Pending>& items, const OpDesc& op) {
  const std::string where = "hccl: rank " + std::to_string(rank_) + ": " + op.name + " (sequence number " +
                            std::to_string(op.seq) + ") of group '" + group_ + "'";
  auto last_progress = Clock::now();
  auto last_check = last_progress;
  std::vector<pollfd> pfds;
  std::vector<std::pair<Pending*, Pending*>> heads;  // per pollfd: first unfinished (send, recv)
  while (true) {
    pfds.clear();
    heads.clear();
    for (auto& it : items) {
      if (it.finished()) continue;
      size_t k = 0;
      while (k < pfds.size() && pfds[k].fd != it.fd) ++k;
      if (k == pfds.size()) {
        pfds.push_back({it.fd, 0, 0});
        heads.push_back({nullptr, nullptr});
      }
      Pending*& head = it.is_send ? heads[k].first : heads[k].second;
      if (!head) {  // messages on one fd and direction go in list order
        head = &it;
        pfds[k].events |= it.is_send ? POLLOUT : POLLIN;
      }
    }
    if (pfds.empty()) return;
    const int n = poll(pfds.data(), pfds.size(), 100);
    TORCH_CHECK(n >= 0 || errno == EINTR, where, ": poll failed: ", std::strerror(errno));
    for (size_t k = 0; k < pfds.size() && n > 0; ++k) {
      if (!pfds[k].revents) continue;
      for (Pending* p : {heads[k].first, heads[k].second}) {
        if (!p) continue;
        // Header first, then payload; as much as the socket takes without blocking.
        while (!p->finished()) {
          ssize_t got;
          if (p->hdr_done < sizeof(Frame)) {
            char* h = reinterpret_cast<char*>(&p->hdr) + p->hdr_done;
            const size_t want = sizeof(Frame) - p->hdr_done;
            got = p->is_send ? ::send(p->fd, h, want, MSG_NOSIGNAL) : ::recv(p->fd, h, want, 0);
            if (got > 0) p->hdr_done += got;
          } else {
            const uint64_t want = p->nbytes - p->done;
            got = p->is_send ? ::send(p->fd, p->buf + p->done, want, MSG_NOSIGNAL)
                             : ::recv(p->fd, p->buf + p->done, want, 0);
            if (got > 0) {
              p->done += got;
              (p->is_send ? bytes_sent_ : bytes_received_).fetch_add(got);
            }
          }
          if (got == 0 && !p->is_send)
            dist_error(where + ": " + peer_name(p->peer) +
                       " closed the connection (the process exited or aborted the communicator)");
          if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            dist_error(where + ": the connection to " + peer_name(p->peer) + " failed: " + std::strerror(errno) +
                       " (the process exited or aborted the communicator)");
          }
          last_progress = Clock::now();
          if (!p->is_send && p->hdr_done == sizeof(Frame) && p->done == 0) {
            // A complete header: check every field before any payload lands in p->buf.
            const Frame& h = p->hdr;
            // (p2p headers are read alone and checked by recv().)
            if (h.magic != kMagic || h.group != group_hash_ || (h.kind != kCollMsg && h.kind != kP2PMsg))
              dist_error(where + ": malformed message from " + peer_name(p->peer));
            if (h.kind == kCollMsg && h.seq != op.seq)
              dist_error(where + ": " + peer_name(p->peer) + " sent data of collective number " +
                         std::to_string(h.seq) + ": ranks called collectives in different orders");
            if (h.kind == kCollMsg && h.nbytes != p->nbytes)
              dist_error(where + ": " + peer_name(p->peer) + " sent " + std::to_string(h.nbytes) +
                         " bytes where " + std::to_string(p->nbytes) +
                         " were expected (sizes differ across ranks)");
          }
        }
      }
    }
    const auto now = Clock::now();
    if (now - last_progress > timeouts_.exec) {
      std::set<int> who;
      for (auto& it : items)
        if (!it.finished()) who.insert(it.peer);
      std::string list;
      for (int r : who) list += (list.empty() ? "" : ", ") + peer_name(r);
      dist_error("hccl: rank " + std::to_string(rank_) + " timed out after " + std::to_string(timeouts_.exec.count()) +
                 " ms in " + op.name + " (sequence number " + std::to_string(op.seq) + ") of group '" + group_ +
                 "' waiting for " + list + " over TCP (HCCL_EXEC_TIMEOUT / ProcessGroupHCCL.Options.op_timeout)");
    }
    if (now - last_check > milliseconds(100)) {
      last_check = now;
      if (aborted_.load()) dist_error(where + ": the communicator was aborted");
      check_(op);
    }
  }
}

void TcpComm::exchange(const std::vector<Xfer>& sends, const std::vector<Xfer>& recvs, const OpDesc& op) {
  std::vector<Pending> items;
  items.reserve(sends.size() + recvs.size());
  for (const auto& s : sends) {
    TORCH_INTERNAL_ASSERT(s.peer != rank_);
    const Frame h{kMagic, kCollMsg, op.seq, s.nbytes, -1, group_hash_};
    items.push_back(Pending{conn(s.peer, kColl, op), s.peer, true, h, s.buf, s.nbytes});
  }
  for (const auto& r : recvs) {
    TORCH_INTERNAL_ASSERT(r.peer != rank_);
    items.push_back(Pending{conn(r.peer, kColl, op), r.peer, false, Frame{}, r.buf, r.nbytes});
  }
  progress(items, op);
}

void TcpComm::send(int dst, const void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op) {
  const uint64_t n = ++p2p_sent_[dst];
  const Frame h{kMagic, kP2PMsg, n, nbytes, dtype, group_hash_};
  std::vector<Pending> items{
      Pending{conn(dst, kP2P, op), dst, true, h, static_cast<char*>(const_cast<void*>(data)), nbytes}};
  progress(items, op);
}

void TcpComm::recv(int src, void* data, uint64_t nbytes, int32_t dtype, const OpDesc& op) {
  const uint64_t n = ++p2p_recvd_[src];
  const std::string where = "hccl: rank " + std::to_string(rank_) + ": " + op.name + " (sequence number " +
                            std::to_string(op.seq) + ") from rank " + std::to_string(src);
  // The header alone first: count and dtype are checked before the payload is read.
  const int fd = conn(src, kP2P, op);
  std::vector<Pending> items{Pending{fd, src, false, Frame{}, nullptr, 0}};
  progress(items, op);
  const Frame h = items[0].hdr;
  if (h.kind != kP2PMsg || h.seq != n)
    dist_error(where + ": got message number " + std::to_string(h.seq) + " of kind " + std::to_string(h.kind) +
               ", expected point-to-point message number " + std::to_string(n));
  if (h.nbytes != nbytes || h.dtype != dtype)
    dist_error(where + " expected " + std::to_string(nbytes) + " bytes of " + dtype_name(dtype) + " but rank " +
               std::to_string(src) + " sent " + std::to_string(h.nbytes) + " bytes of " +
               (h.dtype >= 0 && h.dtype < static_cast<int32_t>(c10::ScalarType::NumOptions) ? dtype_name(h.dtype)
                                                                                               : "?"));
  Pending body{fd, src, false, h, static_cast<char*>(data), nbytes};
  body.hdr_done = sizeof(Frame);  // header already consumed
  items = {body};
  progress(items, op);
}

void TcpComm::abort() {
  aborted_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, fd] : fds_) shutdown(fd, SHUT_RDWR);
  accepted_.notify_all();
}

std::vector<int> TcpComm::connected_peers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<int> s;
  for (auto& [key, fd] : fds_) s.insert(key.first);
  return std::vector<int>(s.begin(), s.end());
}

}  // namespace torch_npu::distributed
