// Collectives of a group that spans several hosts.
//
// On each host the ranks share a ShmComm; the first rank of the host (its leader) does
// the host's TCP traffic, reading and writing the other local ranks' buffers in place
// (their device memory is mapped, as in the same-host path), so no rank stages data for
// another. Every collective follows one protocol:
//   1. each rank publishes its header and buffer offsets in its host's segment; barrier;
//      the local headers are compared (as on one host);
//   2. the leaders swap headers over TCP (plus all-to-all's size tables) and compare them
//      with host 0's: every leader reaches the same verdict; a mismatch raises on every
//      rank (local peers through the failed segment);
//   3. data moves: leaders over TCP, everyone in shared memory;
//   4. barrier (nobody reuses a buffer another rank still reads or writes).
// all-reduce: the leader reduces its host's buffers into its own (in place), the leaders
// run a ring all-reduce (reduce-scatter, then all-gather) in 1 MiB chunks (received into
// a chunk-sized scratch and reduced into the tensor: no second copy of it), then the
// local ranks copy the result from their leader. The others are direct: leader to
// leader messages straight from and into the right rank's buffer.
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "algorithms.h"

namespace torch_npu::distributed {
namespace {

constexpr size_t kChunkBytes = 1 << 20;  // ring all-reduce step size over TCP

using Xfers = std::vector<TcpComm::Xfer>;

std::string where(Comm& c, const OpDesc& op) {
  return "hccl: rank " + std::to_string(c.rank()) + ": " + op.name + " (sequence number " + std::to_string(op.seq) +
         ") of group '" + c.group() + "'";
}

[[noreturn]] void mismatch(Comm& c, const OpDesc& op, const std::string& what) {
  C10_THROW_ERROR(DistBackendError, where(c, op) + " does not match across ranks: " + what);
}

char* cp(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }

// What leaders swap in step 2.
struct Wire {
  OpHeader header;
  int32_t local_mismatch;  // the leader's host already disagrees internally
  int32_t pad;
};

// Steps 1-2 (the caller published). `table`: optional per-rank values (per_rank of them,
// indexed [rank * per_rank + i]); on leaders, `fill` writes its host's ranks' rows (once
// they have published), the leaders' swap fills the rest.
void begin(Comm& c, const OpDesc& op, std::vector<uint64_t>* table = nullptr, size_t per_rank = 0,
           const std::function<void()>& fill = {}) {
  ShmComm& L = c.local();
  L.barrier(op);
  const auto& here = c.ranks_on(c.host());
  const OpHeader& h0 = c.slot(here[0]).header;
  std::string bad;
  for (int r : here) {
    if (!same_call(c.slot(r).header, h0)) {
      bad = "rank " + std::to_string(here[0]) + " called " + describe(h0) + ", rank " + std::to_string(r) +
            " called " + describe(c.slot(r).header);
      break;
    }
  }
  if (!c.is_leader()) {
    if (!bad.empty()) {
      // Wait until the leader has told the other hosts (it then fails the segment).
      try {
        L.barrier(op);
      } catch (const std::exception&) {
      }
      mismatch(c, op, bad);
    }
    return;  // a mismatch between hosts reaches us through the segment, failed by the leader
  }
  const int H = c.nhosts(), me = c.host();
  std::vector<Wire> wires(H);
  wires[me] = Wire{h0, bad.empty() ? 0 : 1, 0};
  std::vector<std::vector<uint64_t>> packed(H);  // table rows of each host's ranks
  if (fill) fill();
  if (table)
    for (int h = 0; h < H; ++h) {
      packed[h].resize(c.ranks_on(h).size() * per_rank);
      if (h == me)
        for (size_t i = 0; i < here.size(); ++i)
          std::copy_n(table->data() + here[i] * per_rank, per_rank, packed[h].data() + i * per_rank);
    }
  Xfers sends, recvs;
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    sends.push_back({c.leader(h), cp(&wires[me]), sizeof(Wire)});
    recvs.push_back({c.leader(h), cp(&wires[h]), sizeof(Wire)});
    if (table) {
      sends.push_back({c.leader(h), cp(packed[me].data()), packed[me].size() * sizeof(uint64_t)});
      recvs.push_back({c.leader(h), cp(packed[h].data()), packed[h].size() * sizeof(uint64_t)});
    }
  }
  c.net().exchange(sends, recvs, op);
  if (!bad.empty()) mismatch(c, op, bad);
  for (int h = 0; h < H; ++h)
    if (!same_call(wires[h].header, wires[0].header))
      mismatch(c, op, "rank " + std::to_string(c.leader(0)) + " called " + describe(wires[0].header) + ", rank " +
                          std::to_string(c.leader(h)) + " called " + describe(wires[h].header));
  for (int h = 0; h < H; ++h)
    if (wires[h].local_mismatch)
      mismatch(c, op, "the ranks on the host of rank " + std::to_string(c.leader(h)) + " called different collectives");
  if (table)
    for (int h = 0; h < H; ++h)
      for (size_t i = 0; i < c.ranks_on(h).size(); ++i)
        std::copy_n(packed[h].data() + i * per_rank, per_rank, table->data() + c.ranks_on(h)[i] * per_rank);
}

// Step 3 of all-reduce among the leaders: ring reduce-scatter then ring all-gather, one
// chunk at a time (each exchange sends a chunk to the next leader while receiving one
// from the previous leader).
void ring_allreduce(Comm& c, const OpDesc& op, char* data, int64_t numel, c10::ScalarType dt, RedOp redop) {
  const int H = c.nhosts(), me = c.host();
  const size_t es = c10::elementSize(dt);
  const int next = c.leader((me + 1) % H), prev = c.leader((me + H - 1) % H);
  auto lo = [&](int seg) { return numel * seg / H; };  // segment seg = [lo(seg), lo(seg + 1))
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / es);
  thread_local std::vector<char> scratch;
  if (scratch.size() < chunk * es) scratch.resize(chunk * es);
  for (int s = 0; s < H - 1; ++s) {
    const int ss = (me - s + H) % H, rs = (me - s - 1 + 2 * H) % H;
    for (int64_t k = 0;; k += chunk) {
      const int64_t sa = lo(ss) + k, sb = std::min(lo(ss + 1), sa + chunk);
      const int64_t ra = lo(rs) + k, rb = std::min(lo(rs + 1), ra + chunk);
      if (sa >= sb && ra >= rb) break;
      Xfers sends, recvs;
      if (sa < sb) sends.push_back({next, data + sa * es, static_cast<uint64_t>((sb - sa) * es)});
      if (ra < rb) recvs.push_back({prev, scratch.data(), static_cast<uint64_t>((rb - ra) * es)});
      c.net().exchange(sends, recvs, op);
      if (ra < rb) {
        const void* src[2] = {data + ra * es, scratch.data()};
        reduce_into(data + ra * es, src, 2, rb - ra, dt, redop);
      }
    }
  }
  // Now this leader holds the reduced segment me + 1; pass the segments around.
  for (int s = 0; s < H - 1; ++s) {
    const int ss = (me + 1 - s + H) % H, rs = (me - s + H) % H;
    c.net().exchange({{next, data + lo(ss) * es, static_cast<uint64_t>((lo(ss + 1) - lo(ss)) * es)}},
                     {{prev, data + lo(rs) * es, static_cast<uint64_t>((lo(rs + 1) - lo(rs)) * es)}}, op);
  }
}

RedOp summing(RedOp op) { return op == RedOp::Avg ? RedOp::Sum : op; }

}  // namespace

void broadcast(Comm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, int root) {
  if (!c.multi_host()) return broadcast(c.local(), op, data, numel, dtype, root);
  ShmComm& L = c.local();
  const uint64_t nbytes = numel * c10::elementSize(dtype);
  publish(L, op, Coll::Broadcast, dtype, numel, root, -1);
  L.mine().offset[0] = off(L, data, nbytes);
  begin(c, op);
  const int rh = c.host_of(root);
  if (c.is_leader() && nbytes) {
    Xfers sends, recvs;
    if (c.host() == rh) {
      char* src = c.addr(root, c.slot(root).offset[0], nbytes);
      for (int h = 0; h < c.nhosts(); ++h)
        if (h != rh) sends.push_back({c.leader(h), src, nbytes});
    } else {
      recvs.push_back({c.leader(rh), static_cast<char*>(data), nbytes});
    }
    c.net().exchange(sends, recvs, op);
  }
  L.barrier(op);
  const int src = c.host() == rh ? root : c.leader(c.host());  // who holds the data here
  if (c.rank() != src && nbytes) std::memcpy(data, c.addr(src, c.slot(src).offset[0], nbytes), nbytes);
  L.barrier(op);
}

void allreduce(Comm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop) {
  if (!c.multi_host()) return allreduce(c.local(), op, data, numel, dtype, redop);
  ShmComm& L = c.local();
  const uint64_t nbytes = numel * c10::elementSize(dtype);
  publish(L, op, Coll::Allreduce, dtype, numel, -1, static_cast<int>(redop));
  L.mine().offset[0] = off(L, data, nbytes);
  begin(c, op);
  if (nbytes == 0) return L.barrier(op);
  const int leader = c.leader(c.host());
  if (c.is_leader()) {
    const auto& here = c.ranks_on(c.host());
    if (here.size() > 1) {
      const void* src[kMaxRanks];
      for (size_t i = 0; i < here.size(); ++i) src[i] = c.addr(here[i], c.slot(here[i]).offset[0], nbytes);
      reduce_into(data, src, static_cast<int>(here.size()), numel, dtype, summing(redop));  // src[0] is data
    }
    ring_allreduce(c, op, static_cast<char*>(data), numel, dtype, summing(redop));
    if (redop == RedOp::Avg) average(data, numel, dtype, c.size());
  }
  L.barrier(op);  // the leader's buffer holds the result
  if (!c.is_leader()) std::memcpy(data, c.addr(leader, c.slot(leader).offset[0], nbytes), nbytes);
  L.barrier(op);
}

void reduce(Comm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop, int root) {
  if (!c.multi_host()) return reduce(c.local(), op, data, numel, dtype, redop, root);
  ShmComm& L = c.local();
  const size_t es = c10::elementSize(dtype);
  const uint64_t nbytes = numel * es;
  publish(L, op, Coll::Reduce, dtype, numel, root, static_cast<int>(redop));
  L.mine().offset[0] = off(L, data, nbytes);
  begin(c, op);
  const int rh = c.host_of(root);
  if (c.is_leader() && nbytes) {
    const auto& here = c.ranks_on(c.host());
    const int n = static_cast<int>(here.size());
    const void* src[kMaxRanks];
    for (int i = 0; i < n; ++i) src[i] = c.addr(here[i], c.slot(here[i]).offset[0], nbytes);
    const int64_t chunk = std::max<int64_t>(1, kChunkBytes / es);
    thread_local std::vector<char> scratch;
    if (scratch.size() < chunk * es) scratch.resize(chunk * es);
    if (c.host() != rh) {
      // This host's partial result, chunk by chunk, to the root's leader (only the root's
      // buffer may change).
      for (int64_t a = 0; a < numel; a += chunk) {
        const int64_t m = std::min(chunk, numel - a);
        const void* part[kMaxRanks];
        for (int i = 0; i < n; ++i) part[i] = static_cast<const char*>(src[i]) + a * es;
        reduce_into(scratch.data(), part, n, m, dtype, summing(redop));
        c.net().exchange({{c.leader(rh), scratch.data(), static_cast<uint64_t>(m * es)}}, {}, op);
      }
    } else {
      char* dst = c.addr(root, c.slot(root).offset[0], nbytes);  // one of src
      reduce_into(dst, src, n, numel, dtype, summing(redop));
      for (int h = 0; h < c.nhosts(); ++h) {
        if (h == rh) continue;
        for (int64_t a = 0; a < numel; a += chunk) {
          const int64_t m = std::min(chunk, numel - a);
          c.net().exchange({}, {{c.leader(h), scratch.data(), static_cast<uint64_t>(m * es)}}, op);
          const void* two[2] = {dst + a * es, scratch.data()};
          reduce_into(dst + a * es, two, 2, m, dtype, summing(redop));
        }
      }
      if (redop == RedOp::Avg) average(dst, numel, dtype, c.size());
    }
  }
  L.barrier(op);
}

void allgather(Comm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
               const std::vector<void*>& outs) {
  if (!c.multi_host()) return allgather(c.local(), op, in, numel, dtype, outs);
  ShmComm& L = c.local();
  const uint64_t nbytes = numel * c10::elementSize(dtype);
  publish(L, op, Coll::Allgather, dtype, numel, -1, -1);
  L.mine().offset[0] = off(L, in, nbytes);
  for (int r = 0; r < c.size(); ++r) L.mine().out_offset[r] = off(L, outs[r], nbytes);
  begin(c, op);
  if (c.is_leader() && nbytes) {
    // Our ranks' inputs to every other leader; theirs into our own outputs.
    Xfers sends, recvs;
    for (int h = 0; h < c.nhosts(); ++h) {
      if (h == c.host()) continue;
      for (int g : c.ranks_on(c.host())) sends.push_back({c.leader(h), c.addr(g, c.slot(g).offset[0], nbytes), nbytes});
      for (int g : c.ranks_on(h)) recvs.push_back({c.leader(h), static_cast<char*>(outs[g]), nbytes});
    }
    c.net().exchange(sends, recvs, op);
  }
  L.barrier(op);
  const int leader = c.leader(c.host());
  for (int g = 0; g < c.size() && nbytes; ++g) {
    const void* from;
    if (c.host_of(g) == c.host())
      from = g == c.rank() ? in : c.addr(g, c.slot(g).offset[0], nbytes);
    else if (!c.is_leader())
      from = c.addr(leader, c.slot(leader).out_offset[g], nbytes);
    else
      continue;  // already received there
    if (from != outs[g]) std::memmove(outs[g], from, nbytes);
  }
  L.barrier(op);
}

void reduce_scatter(Comm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
                    c10::ScalarType dtype, RedOp redop) {
  if (!c.multi_host()) return reduce_scatter(c.local(), op, ins, out, numel, dtype, redop);
  ShmComm& L = c.local();
  const uint64_t nbytes = numel * c10::elementSize(dtype);
  publish(L, op, Coll::ReduceScatter, dtype, numel, -1, static_cast<int>(redop));
  for (int r = 0; r < c.size(); ++r) L.mine().offset[r] = off(L, ins[r], nbytes);
  L.mine().out_offset[0] = off(L, out, nbytes);
  begin(c, op);
  if (c.is_leader() && nbytes) {
    const auto& here = c.ranks_on(c.host());
    const int n = static_cast<int>(here.size()), H = c.nhosts();
    // Our host's partial sums of the other hosts' parts go out; theirs of ours come in.
    thread_local std::vector<char> out_parts, in_parts;
    out_parts.resize((c.size() - n) * nbytes);
    in_parts.resize((H - 1) * n * nbytes);
    Xfers sends, recvs;
    size_t o = 0, i = 0;
    for (int h = 0; h < H; ++h) {
      if (h == c.host()) continue;
      for (int t : c.ranks_on(h)) {
        const void* src[kMaxRanks];
        for (int k = 0; k < n; ++k) src[k] = c.addr(here[k], c.slot(here[k]).offset[t], nbytes);
        reduce_into(out_parts.data() + o, src, n, numel, dtype, summing(redop));
        sends.push_back({c.leader(h), out_parts.data() + o, nbytes});
        o += nbytes;
      }
      for (size_t k = 0; k < here.size(); ++k, i += nbytes) recvs.push_back({c.leader(h), in_parts.data() + i, nbytes});
    }
    c.net().exchange(sends, recvs, op);
    // Each local rank's part: its host's inputs and the other hosts' partials.
    for (int k = 0; k < n; ++k) {
      const int t = here[k];
      const void* src[2 * kMaxRanks];
      int m = 0;
      for (int j = 0; j < n; ++j) src[m++] = c.addr(here[j], c.slot(here[j]).offset[t], nbytes);
      for (int h = 0, x = 0; h < H; ++h)
        if (h != c.host()) src[m++] = in_parts.data() + (x++ * n + k) * nbytes;
      char* dst = c.addr(t, c.slot(t).out_offset[0], nbytes);
      reduce_into(dst, src, m, numel, dtype, summing(redop));
      if (redop == RedOp::Avg) average(dst, numel, dtype, c.size());
    }
  }
  L.barrier(op);
}

void alltoall(Comm& c, const OpDesc& op, c10::ScalarType dtype, const std::vector<const void*>& ins,
              const std::vector<uint64_t>& send_bytes, const std::vector<void*>& outs,
              const std::vector<uint64_t>& recv_bytes) {
  if (!c.multi_host()) return alltoall(c.local(), op, dtype, ins, send_bytes, outs, recv_bytes);
  ShmComm& L = c.local();
  const int W = c.size();
  publish(L, op, Coll::AllToAll, dtype, -1, -1, -1);
  Slot& me = L.mine();
  for (int r = 0; r < W; ++r) {
    me.offset[r] = off(L, ins[r], send_bytes[r]);
    me.send_bytes[r] = send_bytes[r];
    me.recv_bytes[r] = recv_bytes[r];
    me.out_offset[r] = off(L, outs[r], recv_bytes[r]);
  }
  // Leaders learn every rank's sizes: row r = r's send_bytes[0..W), then recv_bytes[0..W).
  std::vector<uint64_t> table(c.is_leader() ? 2 * W * W : 0);
  auto fill = [&] {
    for (int g : c.ranks_on(c.host())) {
      std::copy_n(c.slot(g).send_bytes, W, table.data() + g * 2 * W);
      std::copy_n(c.slot(g).recv_bytes, W, table.data() + g * 2 * W + W);
    }
  };
  auto sent = [&](int s, int t) { return table[s * 2 * W + t]; };
  auto expected = [&](int t, int s) { return table[t * 2 * W + W + s]; };
  begin(c, op, c.is_leader() ? &table : nullptr, 2 * W, fill);
  if (c.is_leader()) {
    const size_t es = c10::elementSize(dtype);
    for (int s = 0; s < W; ++s)
      for (int t = 0; t < W; ++t)
        if (sent(s, t) != expected(t, s))
          mismatch(c, op, "rank " + std::to_string(s) + " sends " + std::to_string(sent(s, t) / es) +
                              " elements to rank " + std::to_string(t) + ", which expects " +
                              std::to_string(expected(t, s) / es) + " (check the split sizes)");
    Xfers sends, recvs;
    for (int h = 0; h < c.nhosts(); ++h) {
      if (h == c.host()) continue;
      for (int s : c.ranks_on(c.host()))
        for (int t : c.ranks_on(h))
          if (sent(s, t)) sends.push_back({c.leader(h), c.addr(s, c.slot(s).offset[t], sent(s, t)), sent(s, t)});
      for (int s : c.ranks_on(h))
        for (int t : c.ranks_on(c.host()))
          if (sent(s, t)) recvs.push_back({c.leader(h), c.addr(t, c.slot(t).out_offset[s], sent(s, t)), sent(s, t)});
    }
    c.net().exchange(sends, recvs, op);
  }
  L.barrier(op);  // sizes agreed (else the leader failed the segment)
  for (int s : c.ranks_on(c.host())) {
    const uint64_t n = recv_bytes[s];
    if (n) std::memcpy(outs[s], c.addr(s, c.slot(s).offset[c.rank()], n), n);
  }
  L.barrier(op);
}

void gather(Comm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
            const std::vector<void*>& outs, int root) {
  if (!c.multi_host()) return gather(c.local(), op, in, numel, dtype, outs, root);
  ShmComm& L = c.local();
  const uint64_t nbytes = numel * c10::elementSize(dtype);
  publish(L, op, Coll::Gather, dtype, numel, root, -1);
  L.mine().offset[0] = off(L, in, nbytes);
  if (c.rank() == root)
    for (int r = 0; r < c.size(); ++r) L.mine().out_offset[r] = off(L, outs[r], nbytes);
  begin(c, op);
  const int rh = c.host_of(root);
  if (c.is_leader() && nbytes) {
    Xfers sends, recvs;
    if (c.host() != rh) {
      for (int g : c.ranks_on(c.host()))
        sends.push_back({c.leader(rh), c.addr(g, c.slot(g).offset[0], nbytes), nbytes});
    } else {
      for (int h = 0; h < c.nhosts(); ++h)
        if (h != rh)
          for (int g : c.ranks_on(h))
            recvs.push_back({c.leader(h), c.addr(root, c.slot(root).out_offset[g], nbytes), nbytes});
    }
    c.net().exchange(sends, recvs, op);
  }
  if (c.rank() == root && nbytes)
    for (int g : c.ranks_on(c.host())) std::memmove(outs[g], c.addr(g, c.slot(g).offset[0], nbytes), nbytes);
  L.barrier(op);
}

void scatter(Comm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
             c10::ScalarType dtype, int root) {
  if (!c.multi_host()) return scatter(c.local(), op, ins, out, numel, dtype, root);
  ShmComm& L = c.local();
  const uint64_t nbytes = numel * c10::elementSize(dtype);
  publish(L, op, Coll::Scatter, dtype, numel, root, -1);
  if (c.rank() == root)
    for (int r = 0; r < c.size(); ++r) L.mine().offset[r] = off(L, ins[r], nbytes);
  L.mine().out_offset[0] = off(L, out, nbytes);
  begin(c, op);
  const int rh = c.host_of(root);
  if (c.is_leader() && nbytes) {
    Xfers sends, recvs;
    if (c.host() == rh) {
      for (int h = 0; h < c.nhosts(); ++h)
        if (h != rh)
          for (int t : c.ranks_on(h))
            sends.push_back({c.leader(h), c.addr(root, c.slot(root).offset[t], nbytes), nbytes});
    } else {
      for (int t : c.ranks_on(c.host()))
        recvs.push_back({c.leader(rh), c.addr(t, c.slot(t).out_offset[0], nbytes), nbytes});
    }
    c.net().exchange(sends, recvs, op);
  }
  if (c.host() == rh && nbytes) std::memmove(out, c.addr(root, c.slot(root).offset[c.rank()], nbytes), nbytes);
  L.barrier(op);
}

void barrier(Comm& c, const OpDesc& op) {
  if (!c.multi_host()) return barrier(c.local(), op);
  publish(c.local(), op, Coll::Barrier, c10::ScalarType::Byte, 0, -1, -1);
  begin(c, op);
  c.local().barrier(op);
}

}  // namespace torch_npu::distributed
