#include "algorithms.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace torch_npu::distributed {
namespace {

const char* coll_name(uint32_t c) {
  static const char* names[] = {"?",          "broadcast", "allreduce", "reduce",  "allgather",
                                "reduce_scatter", "alltoall", "gather", "scatter", "barrier"};
  return c < sizeof(names) / sizeof(names[0]) ? names[c] : "?";
}

// ---- reductions: dst[i] = src[0][i] op ... op src[n-1][i]; dst may be one of the srcs --------
template <class Acc>
struct Sum { Acc operator()(Acc a, Acc b) const { return a + b; } };
template <class Acc>
struct Prod { Acc operator()(Acc a, Acc b) const { return a * b; } };
template <class Acc>
struct Min { Acc operator()(Acc a, Acc b) const { return b < a ? b : a; } };
template <class Acc>
struct Max { Acc operator()(Acc a, Acc b) const { return a < b ? b : a; } };
template <class Acc>
struct And { Acc operator()(Acc a, Acc b) const { return a & b; } };
template <class Acc>
struct Or { Acc operator()(Acc a, Acc b) const { return a | b; } };
template <class Acc>
struct Xor { Acc operator()(Acc a, Acc b) const { return a ^ b; } };

// Blocks of an L1-sized accumulator: half types are accumulated in float, and each
// source is streamed once per block in a vectorisable loop.
template <class T, class Acc, class F>
void reduce_loop(T* dst, const T* const* src, int nsrc, size_t n, F f, bool avg) {
  constexpr size_t B = 1024;
  Acc acc[B];
  const Acc scale = avg ? Acc(1) / Acc(nsrc) : Acc(1);
  for (size_t i = 0; i < n; i += B) {
    const size_t m = std::min(B, n - i);
    const T* s0 = src[0] + i;
    for (size_t k = 0; k < m; ++k) acc[k] = static_cast<Acc>(s0[k]);
    for (int j = 1; j < nsrc; ++j) {
      const T* sj = src[j] + i;
      for (size_t k = 0; k < m; ++k) acc[k] = f(acc[k], static_cast<Acc>(sj[k]));
    }
    if (avg) {
      if constexpr (std::is_integral_v<Acc>) {  // integers: the sum divided, truncated (as C)
        for (size_t k = 0; k < m; ++k) acc[k] /= static_cast<Acc>(nsrc);
      } else {
        for (size_t k = 0; k < m; ++k) acc[k] *= scale;
      }
    }
    T* d = dst + i;
    for (size_t k = 0; k < m; ++k) d[k] = static_cast<T>(acc[k]);
  }
}

template <class T, class Acc>
void reduce_typed(void* dst, const void* const* src, int nsrc, size_t n, RedOp op) {
  auto d = static_cast<T*>(dst);
  auto s = reinterpret_cast<const T* const*>(src);
  switch (op) {
    case RedOp::Sum: return reduce_loop<T, Acc>(d, s, nsrc, n, Sum<Acc>(), false);
    case RedOp::Avg: return reduce_loop<T, Acc>(d, s, nsrc, n, Sum<Acc>(), true);
    case RedOp::Product: return reduce_loop<T, Acc>(d, s, nsrc, n, Prod<Acc>(), false);
    case RedOp::Min: return reduce_loop<T, Acc>(d, s, nsrc, n, Min<Acc>(), false);
    case RedOp::Max: return reduce_loop<T, Acc>(d, s, nsrc, n, Max<Acc>(), false);
    default: break;
  }
  if constexpr (std::is_integral_v<Acc>) {
    switch (op) {
      case RedOp::Band: return reduce_loop<T, Acc>(d, s, nsrc, n, And<Acc>(), false);
      case RedOp::Bor: return reduce_loop<T, Acc>(d, s, nsrc, n, Or<Acc>(), false);
      case RedOp::Bxor: return reduce_loop<T, Acc>(d, s, nsrc, n, Xor<Acc>(), false);
      default: break;
    }
  }
  TORCH_CHECK(false, "hccl: unsupported reduction");
}

}  // namespace

void reduce_into(void* dst, const void* const* src, int nsrc, size_t n, c10::ScalarType dtype, RedOp op) {
  using c10::ScalarType;
  switch (dtype) {
    case ScalarType::Float: return reduce_typed<float, float>(dst, src, nsrc, n, op);
    case ScalarType::Double: return reduce_typed<double, double>(dst, src, nsrc, n, op);
    case ScalarType::Half: return reduce_typed<c10::Half, float>(dst, src, nsrc, n, op);
    case ScalarType::BFloat16: return reduce_typed<c10::BFloat16, float>(dst, src, nsrc, n, op);
    case ScalarType::Int: return reduce_typed<int32_t, int32_t>(dst, src, nsrc, n, op);
    case ScalarType::Long: return reduce_typed<int64_t, int64_t>(dst, src, nsrc, n, op);
    case ScalarType::Short: return reduce_typed<int16_t, int16_t>(dst, src, nsrc, n, op);
    case ScalarType::Char: return reduce_typed<int8_t, int8_t>(dst, src, nsrc, n, op);
    case ScalarType::Byte: return reduce_typed<uint8_t, uint8_t>(dst, src, nsrc, n, op);
    case ScalarType::Bool: {
      // Logical: SUM/MAX = any, PRODUCT/MIN = all (bytes are 0 or 1).
      RedOp bop = (op == RedOp::Sum || op == RedOp::Max || op == RedOp::Bor) ? RedOp::Bor
                  : (op == RedOp::Bxor)                                      ? RedOp::Bxor
                                                                             : RedOp::Band;
      return reduce_typed<uint8_t, uint8_t>(dst, src, nsrc, n, bop);
    }
    default: TORCH_CHECK(false, "hccl: reductions on ", dtype, " are not supported");
  }
}

template <class T, class Acc>
void scale_typed(void* data, size_t n, Acc f) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<Acc>(p[i]) * f);
}

template <class T>
void divide_typed(void* data, size_t n, int64_t d) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(d));
}

void average(void* data, size_t n, c10::ScalarType dtype, int size) {
  using c10::ScalarType;
  switch (dtype) {
    case ScalarType::Int: return divide_typed<int32_t>(data, n, size);
    case ScalarType::Long: return divide_typed<int64_t>(data, n, size);
    case ScalarType::Short: return divide_typed<int16_t>(data, n, size);
    case ScalarType::Char: return divide_typed<int8_t>(data, n, size);
    case ScalarType::Byte: return divide_typed<uint8_t>(data, n, size);
    default: return scale(data, n, dtype, 1.0 / size);
  }
}

void scale(void* data, size_t n, c10::ScalarType dtype, double factor) {
  using c10::ScalarType;
  switch (dtype) {
    case ScalarType::Float: return scale_typed<float, float>(data, n, static_cast<float>(factor));
    case ScalarType::Double: return scale_typed<double, double>(data, n, factor);
    case ScalarType::Half: return scale_typed<c10::Half, float>(data, n, static_cast<float>(factor));
    case ScalarType::BFloat16: return scale_typed<c10::BFloat16, float>(data, n, static_cast<float>(factor));
    default: TORCH_CHECK(false, "hccl: cannot scale a tensor of ", dtype);
  }
}

// ---- the common protocol ------------------------------------------------------------------

void publish(ShmComm& c, const OpDesc& op, Coll coll, c10::ScalarType dtype, int64_t count, int root, int redop) {
  OpHeader& h = c.mine().header;
  h.seq = op.seq;
  h.coll = static_cast<uint32_t>(coll);
  h.dtype = static_cast<int32_t>(dtype);
  h.count = count;
  h.root = root;
  h.redop = redop;
}

std::string describe(const OpHeader& h) {
  std::string s = std::string(coll_name(h.coll)) + " #" + std::to_string(h.seq);
  if (h.count >= 0) s += " of " + std::to_string(h.count) + " elements";
  s += std::string(" of ") + c10::toString(static_cast<c10::ScalarType>(h.dtype));
  if (h.root >= 0) s += ", root " + std::to_string(h.root);
  if (h.redop >= 0) s += std::string(", ") + redop_name(static_cast<RedOp>(h.redop));
  return s;
}

bool same_call(const OpHeader& a, const OpHeader& b) {
  return a.seq == b.seq && a.coll == b.coll && a.dtype == b.dtype && a.count == b.count && a.root == b.root &&
         a.redop == b.redop;
}

uint64_t off(ShmComm& c, const void* p, size_t nbytes) { return nbytes ? c.offset_of(p, nbytes) : 0; }

namespace {

[[noreturn]] void mismatch(ShmComm& c, const OpDesc& op, const std::string& what) {
  // Every rank reads the same slots and reaches the same verdict; one more barrier keeps a
  // fast rank from overwriting its slot (next collective) while a slow one still reads it.
  c.barrier(op);
  C10_THROW_ERROR(DistBackendError, "hccl: rank " + std::to_string(c.rank()) + ": " + op.name +
                                        " (sequence number " + std::to_string(op.seq) + ") of group '" +
                                        c.group() + "' does not match across ranks: " + what);
}

// Publish (already done by the caller), wait for everyone, compare headers with rank 0's.
void begin(ShmComm& c, const OpDesc& op) {
  c.barrier(op);
  const OpHeader& h0 = c.slot(0).header;
  for (int r = 1; r < c.size(); ++r) {
    const OpHeader& h = c.slot(r).header;
    if (!same_call(h, h0)) {
      mismatch(c, op, "rank 0 called " + describe(h0) + ", rank " + std::to_string(r) + " called " + describe(h));
    }
  }
}

}  // namespace

const char* redop_name(RedOp op) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"};
  return names[static_cast<int>(op)];
}

void check_reduction(c10::ScalarType dtype, RedOp op) {
  const bool fp = c10::isFloatingType(dtype);
  const bool integral = c10::isIntegralType(dtype, /*includeBool=*/true);
  TORCH_CHECK(fp || integral, "hccl: reductions on ", dtype, " are not supported");
  TORCH_CHECK(op != RedOp::Avg || dtype != c10::kBool, "hccl: ReduceOp.AVG does not support bool tensors");
  TORCH_CHECK(!(op == RedOp::Band || op == RedOp::Bor || op == RedOp::Bxor) || integral, "hccl: ReduceOp.",
              redop_name(op), " needs an integer or bool tensor, got ", dtype);
}

Algo algo_from_env() {
  const char* v = std::getenv("HCCL_ALGO");
  if (!v || !*v) return Algo::Auto;
  std::string s(v);
  if (s.find("oneshot") != std::string::npos) return Algo::OneShot;
  if (s.find("twoshot") != std::string::npos || s.find("ring") != std::string::npos) return Algo::TwoShot;
  return Algo::Auto;
}

void broadcast(ShmComm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, int root) {
  const size_t nbytes = numel * c10::elementSize(dtype);
  publish(c, op, Coll::Broadcast, dtype, numel, root, -1);
  c.mine().offset[0] = off(c, data, nbytes);
  begin(c, op);
  if (c.rank() != root && nbytes) std::memcpy(data, c.addr(root, c.slot(root).offset[0], nbytes), nbytes);
  c.barrier(op);
}

void allreduce(ShmComm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop) {
  static const Algo forced = algo_from_env();
  const size_t es = c10::elementSize(dtype);
  const size_t nbytes = numel * es;
  const int W = c.size();
  publish(c, op, Coll::Allreduce, dtype, numel, -1, static_cast<int>(redop));
  c.mine().offset[0] = off(c, data, nbytes);
  begin(c, op);
  if (nbytes == 0) return c.barrier(op);
  const void* src[kMaxRanks];
  const Algo algo = forced != Algo::Auto ? forced : (nbytes <= (256u << 10) ? Algo::OneShot : Algo::TwoShot);
  if (algo == Algo::OneShot) {
    thread_local std::vector<char> scratch;
    if (scratch.size() < nbytes) scratch.resize(nbytes);
    for (int r = 0; r < W; ++r) src[r] = c.addr(r, c.slot(r).offset[0], nbytes);
    reduce_into(scratch.data(), src, W, numel, dtype, redop);
    c.barrier(op);  // every peer has read our buffer: now overwrite it
    std::memcpy(data, scratch.data(), nbytes);
    return;
  }
  // Part r of the buffer is reduced by rank r; parts are cache-line aligned.
  auto lo = [&](int r) { return std::min<int64_t>(numel, (numel * r / W + 15) / 16 * 16); };
  const int me = c.rank();
  const int64_t a = lo(me), b = lo(me + 1);
  if (b > a) {
    for (int r = 0; r < W; ++r) src[r] = c.addr(r, c.slot(r).offset[0] + a * es, (b - a) * es);
    reduce_into(static_cast<char*>(data) + a * es, src, W, b - a, dtype, redop);
  }
  c.barrier(op);  // every part is reduced at its owner
  for (int r = 0; r < W; ++r) {
    const int64_t ra = lo(r), rb = lo(r + 1);
    if (r == me || rb <= ra) continue;
    std::memcpy(static_cast<char*>(data) + ra * es, c.addr(r, c.slot(r).offset[0] + ra * es, (rb - ra) * es),
                (rb - ra) * es);
  }
  c.barrier(op);  // nobody still reads our part
}

void reduce(ShmComm& c, const OpDesc& op, void* data, int64_t numel, c10::ScalarType dtype, RedOp redop, int root) {
  const size_t nbytes = numel * c10::elementSize(dtype);
  publish(c, op, Coll::Reduce, dtype, numel, root, static_cast<int>(redop));
  c.mine().offset[0] = off(c, data, nbytes);
  begin(c, op);
  if (c.rank() == root && nbytes) {
    const void* src[kMaxRanks];
    for (int r = 0; r < c.size(); ++r) src[r] = c.addr(r, c.slot(r).offset[0], nbytes);
    reduce_into(data, src, c.size(), numel, dtype, redop);  // the root's own buffer is read by nobody else
  }
  c.barrier(op);
}

void allgather(ShmComm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
               const std::vector<void*>& outs) {
  const size_t nbytes = numel * c10::elementSize(dtype);
  publish(c, op, Coll::Allgather, dtype, numel, -1, -1);
  c.mine().offset[0] = off(c, in, nbytes);
  begin(c, op);
  for (int r = 0; r < c.size() && nbytes; ++r) {
    const void* from = r == c.rank() ? in : c.addr(r, c.slot(r).offset[0], nbytes);
    if (from != outs[r]) std::memmove(outs[r], from, nbytes);
  }
  c.barrier(op);
}

void reduce_scatter(ShmComm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
                    c10::ScalarType dtype, RedOp redop) {
  const size_t nbytes = numel * c10::elementSize(dtype);
  publish(c, op, Coll::ReduceScatter, dtype, numel, -1, static_cast<int>(redop));
  for (int r = 0; r < c.size(); ++r) c.mine().offset[r] = off(c, ins[r], nbytes);
  begin(c, op);
  if (nbytes) {
    const void* src[kMaxRanks];
    for (int r = 0; r < c.size(); ++r) src[r] = c.addr(r, c.slot(r).offset[c.rank()], nbytes);
    reduce_into(out, src, c.size(), numel, dtype, redop);
  }
  c.barrier(op);
}

void alltoall(ShmComm& c, const OpDesc& op, c10::ScalarType dtype, const std::vector<const void*>& ins,
              const std::vector<uint64_t>& send_bytes, const std::vector<void*>& outs,
              const std::vector<uint64_t>& recv_bytes) {
  const int W = c.size();
  publish(c, op, Coll::AllToAll, dtype, -1, -1, -1);
  Slot& me = c.mine();
  for (int r = 0; r < W; ++r) {
    me.offset[r] = off(c, ins[r], send_bytes[r]);
    me.send_bytes[r] = send_bytes[r];
    me.recv_bytes[r] = recv_bytes[r];
  }
  begin(c, op);
  const size_t es = c10::elementSize(dtype);
  for (int s = 0; s < W; ++s) {
    for (int r = 0; r < W; ++r) {
      if (c.slot(s).send_bytes[r] != c.slot(r).recv_bytes[s]) {
        mismatch(c, op, "rank " + std::to_string(s) + " sends " + std::to_string(c.slot(s).send_bytes[r] / es) +
                            " elements to rank " + std::to_string(r) + ", which expects " +
                            std::to_string(c.slot(r).recv_bytes[s] / es) + " (check the split sizes)");
      }
    }
  }
  for (int s = 0; s < W; ++s) {
    const uint64_t n = recv_bytes[s];
    if (n) std::memcpy(outs[s], c.addr(s, c.slot(s).offset[c.rank()], n), n);
  }
  c.barrier(op);
}

void gather(ShmComm& c, const OpDesc& op, const void* in, int64_t numel, c10::ScalarType dtype,
            const std::vector<void*>& outs, int root) {
  const size_t nbytes = numel * c10::elementSize(dtype);
  publish(c, op, Coll::Gather, dtype, numel, root, -1);
  c.mine().offset[0] = off(c, in, nbytes);
  begin(c, op);
  if (c.rank() == root && nbytes) {
    for (int r = 0; r < c.size(); ++r) std::memmove(outs[r], c.addr(r, c.slot(r).offset[0], nbytes), nbytes);
  }
  c.barrier(op);
}

void scatter(ShmComm& c, const OpDesc& op, const std::vector<const void*>& ins, void* out, int64_t numel,
             c10::ScalarType dtype, int root) {
  const size_t nbytes = numel * c10::elementSize(dtype);
  publish(c, op, Coll::Scatter, dtype, numel, root, -1);
  if (c.rank() == root)
    for (int r = 0; r < c.size(); ++r) c.mine().offset[r] = off(c, ins[r], nbytes);
  begin(c, op);
  if (nbytes) std::memmove(out, c.addr(root, c.slot(root).offset[c.rank()], nbytes), nbytes);
  c.barrier(op);
}

void barrier(ShmComm& c, const OpDesc& op) {
  publish(c, op, Coll::Barrier, c10::ScalarType::Byte, 0, -1, -1);
  begin(c, op);
  c.barrier(op);
}

}  // namespace torch_npu::distributed
