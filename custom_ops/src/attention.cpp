// Fused attention: npu_fusion_attention and npu_fusion_attention_grad.
//
//   out = Dropout(Softmax(Mask(scale * (Q K^T + pse)) with sink), keep_prob) V
//
// in torch_npu's layouts (BSH, SBH, BSND, BNSD, TND), with GQA, the sparse modes and
// the softmax statistics ([.., 8] float, the value repeated 8 times) of Ascend's
// FlashAttentionScore. Flash-attention style: queries in blocks of kBlockQ rows meet
// keys in tiles of kBlockKV with an online softmax, so no S1 x S2 matrix is ever stored;
// the backward recomputes probabilities from softmax_max/softmax_sum. Products of tiles
// go through ATen's small GEMM (cpublas::brgemm); the softmax rows are vectorised loops.
// The problem description (Problem) and the forward's entry point (fa::forward) are
// shared with the inference operators (infer_attention.cpp) through attention.h.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention.h"
#include "fused.h"
#include "vmath.h"
#include "torch_npu/core/npu_generator.h"

namespace torch_npu::custom_ops {
namespace {

using namespace fa;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- row kernels ---------------------------------------------------------------------------
// Plain loops over float (or double) rows; the float entry points are compiled per ISA
// (NPU_SIMD). The loops are forced inline: GCC does not inline them into the three
// clones on its own, and an out-of-line copy is built for the baseline ISA only. Sums
// and maxima run in kLanes partial lanes, a shape GCC vectorises without reassociating
// float adds.
#define FA_INLINE __attribute__((always_inline)) inline
constexpr int kLanes = 16;

template <typename F>
FA_INLINE F row_max_impl(const F* x, int64_t n) {
  F m[kLanes];
  std::fill(m, m + kLanes, -std::numeric_limits<F>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) m[k] = x[j + k] > m[k] ? x[j + k] : m[k];
  }
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  return *std::max_element(m, m + kLanes);
}

// x = c * e^(x - m); returns the sum of e^(x - m).
template <typename F>
FA_INLINE F exp_shift_impl(F* x, int64_t n, F m, F c) {
  F s[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const F e = vmath::exp(x[j + k] - m);
      s[k] += e;
      x[j + k] = c * e;
    }
  }
  for (; j < n; ++j) {
    const F e = vmath::exp(x[j] - m);
    s[0] += e;
    x[j] = c * e;
  }
  F r = 0;
  for (int k = 0; k < kLanes; ++k) r += s[k];
  return r;
}

template <typename F>
FA_INLINE void scale_row_impl(F* x, int64_t n, F a) {
  for (int64_t j = 0; j < n; ++j) x[j] *= a;
}

// dp = p * (dp - delta): the softmax backward of one row.
template <typename F>
FA_INLINE void softmax_grad_impl(F* dp, const F* p, int64_t n, F delta) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

NPU_SIMD float row_max(const float* x, int64_t n) { return row_max_impl(x, n); }
NPU_SIMD float exp_shift(float* x, int64_t n, float m, float c) { return exp_shift_impl(x, n, m, c); }
NPU_SIMD void scale_row(float* x, int64_t n, float a) { scale_row_impl(x, n, a); }
NPU_SIMD void softmax_grad(float* dp, const float* p, int64_t n, float delta) { softmax_grad_impl(dp, p, n, delta); }
double row_max(const double* x, int64_t n) { return row_max_impl(x, n); }
double exp_shift(double* x, int64_t n, double m, double c) { return exp_shift_impl(x, n, m, c); }
void scale_row(double* x, int64_t n, double a) { scale_row_impl(x, n, a); }
void softmax_grad(double* dp, const double* p, int64_t n, double delta) { softmax_grad_impl(dp, p, n, delta); }

// C[m, n] (+)= A[m, k] B[k, n], row-major with leading dimensions.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.f);
    }
    return;
  }
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c);
}
void gemm(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
          int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    double* ci = c + i * ldc;
    if (!accumulate) std::fill(ci, ci + n, 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[i * lda + p];
      const double* bp = b + p * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

// dst[r, c] = mul * src[r, c], computed in float (double for double).
template <typename S, typename D>
void copy_rows(const S* src, int64_t src_ld, int64_t rows, int64_t cols, D* dst, int64_t dst_ld,
               vmath::acc_t<D> mul = 1) {
  using M = vmath::acc_t<D>;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] = static_cast<D>(mul * static_cast<M>(src[r * src_ld + c]));
  }
}

// dst[c, r] = src[r, c] (converted), in 16 x 16 blocks so that neither side strides
// through memory a row at a time.
template <typename S, typename D>
void transpose(const S* src, int64_t src_ld, int64_t rows, int64_t cols, D* dst, int64_t dst_ld) {
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) dst[c * dst_ld + r] = static_cast<D>(src[r * src_ld + c]);
      }
    }
  }
}

// ---- dropout (see Dropout in attention.h) ----------------------------------------------
inline void philox(uint64_t key, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// keep[j] = whether element e + j is kept, j < n: bit e + j of `bits` (a caller's mask) when
// given, else drawn from Philox at (seed, offset + e), as _npu_dropout_gen_mask draws it.
void dropout_keep(const Dropout& d, const uint8_t* bits, uint64_t e, int64_t n, uint8_t* keep) {
  if (bits) {
    for (int64_t j = 0; j < n; ++j, ++e) keep[j] = (bits[e >> 3] >> (e & 7)) & 1;
    return;
  }
  uint64_t draw = d.offset + e;
  int64_t j = 0;
  while (j < n) {
    uint32_t r[4];
    philox(d.seed, draw >> 2, r);
    for (uint64_t lane = draw & 3; lane < 4 && j < n; ++lane, ++j, ++draw) keep[j] = r[lane] < d.threshold;
  }
}

Layout parse_layout(const char* op, c10::string_view s) {
  std::string u(s);
  for (auto& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u == "BSH") return Layout::BSH;
  if (u == "SBH") return Layout::SBH;
  if (u == "BNSD") return Layout::BNSD;
  if (u == "BSND") return Layout::BSND;
  if (u == "TND") return Layout::TND;
  TORCH_CHECK(false, op, ": expected input_layout to be one of BSH, SBH, BSND, BNSD, TND, got \"", s, "\"");
  return Layout::BSH;
}

}  // namespace

namespace fa {
void split_cumulative(const char* op, const char* arg, c10::IntArrayRef ends, int64_t rows, const char* tensor,
                      std::vector<int64_t>& len, std::vector<int64_t>& first, bool& tail) {
  int64_t used = static_cast<int64_t>(ends.size());
  while (used > 1 && ends[used - 1] == 0) --used;
  const bool trailing_zeros = used < static_cast<int64_t>(ends.size());
  int64_t prev = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(ends.size()); ++b) {
    const int64_t end = b < used ? ends[b] : prev;
    TORCH_CHECK(end >= prev, op, ": expected ", arg, " to hold non-decreasing cumulative sequence lengths ",
                "(e.g. [2, 4, 6] for lengths 2, 2, 2), got ", ends);
    first.push_back(prev);
    len.push_back(end - prev);
    prev = end;
  }
  TORCH_CHECK(prev == rows || (trailing_zeros && prev <= rows), op, ": the sequence lengths in ", arg, " (", ends,
              ") add up to ", prev, ", but ", tensor, " has ", rows, " rows (dimension 0 of the TND layout)");
  tail = tail || prev < rows;
}
}  // namespace fa

namespace {

// Strides of a dense [B|1, N|1, S1|1, S2] (or [S1, S2]) mask or pse: 0 along broadcast dims.
Strides broadcast_strides(const Tensor& t) {
  const int64_t S2 = t.size(-1), S1 = t.size(-2);
  Strides s;
  s.seq = S1 == 1 ? 0 : S2;
  if (t.dim() == 4) {
    s.head = t.size(1) == 1 ? 0 : S1 * S2;
    s.batch = t.size(0) == 1 ? 0 : t.size(1) * S1 * S2;
  }
  return s;
}

struct Inputs {
  const Tensor& q;
  const Tensor& k;
  const Tensor& v;
  const Tensor& pse;
  const Tensor& padding_mask;
  const Tensor& atten_mask;
  const Tensor& sink;
  const Tensor& drop_mask;  // a caller's dropout mask (uint8 bits), or undefined
};

struct Options {
  int64_t head_num;
  c10::string_view layout;
  double scale;
  double keep_prob;
  int64_t pre;
  int64_t next;
  at::OptionalIntArrayRef prefix;
  at::OptionalIntArrayRef qlen;
  at::OptionalIntArrayRef kvlen;
  int64_t sparse_mode;
  c10::string_view softmax_layout;
};

c10::ScalarType stat_dtype(const Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Checks every argument of the forward (and the shared ones of the backward) and
// describes the problem.
Problem make_problem(const char* op, const Inputs& in, const Options& o) {
  npu_device(op, {{"query", in.q},
                  {"key", in.k},
                  {"value", in.v},
                  {"pse", in.pse},
                  {"atten_mask", in.atten_mask},
                  {"sink", in.sink}});
  TORCH_CHECK(!in.padding_mask.defined(), op, ": padding_mask is not supported (as in torch_npu); pass None");
  check_float(op, "query", in.q);
  check_dtype(op, "key", in.k, in.q.scalar_type());
  check_dtype(op, "value", in.v, in.q.scalar_type());
  TORCH_CHECK(o.keep_prob > 0 && o.keep_prob <= 1, op, ": expected keep_prob in (0, 1], got ", o.keep_prob);
  TORCH_CHECK(o.head_num > 0, op, ": expected head_num > 0, got ", o.head_num);

  Problem p;
  p.layout = parse_layout(op, o.layout);
  const bool tnd = p.layout == Layout::TND;
  const int64_t dims = (p.layout == Layout::BNSD || p.layout == Layout::BSND) ? 4 : 3;
  for (const NamedTensor& t : {NamedTensor{"query", in.q}, NamedTensor{"key", in.k}, NamedTensor{"value", in.v}}) {
    TORCH_CHECK(t.tensor.dim() == dims, op, ": expected ", t.name, " to be ", dims, "-dimensional for input_layout ",
                o.layout, ", got shape ", t.tensor.sizes());
  }
  const auto& q = in.q;
  const auto& k = in.k;
  const auto& v = in.v;
  int64_t Tq = 0, Tkv = 0;
  switch (p.layout) {
    case Layout::BSH:
    case Layout::SBH: {
      const int64_t b = p.layout == Layout::BSH ? 0 : 1, s = 1 - b;
      p.B = q.size(b);
      p.S1 = q.size(s);
      p.S2 = k.size(s);
      p.N = o.head_num;
      const int64_t H = q.size(2);
      TORCH_CHECK(H % p.N == 0 && H > 0, op, ": head_num (", p.N, ") must divide the hidden size of query (",
                  H, "), whose shape is ", q.sizes());
      p.D = H / p.N;
      TORCH_CHECK(k.size(2) % p.D == 0 && k.size(2) > 0, op, ": expected key's hidden size (", k.size(2),
                  ") to be a multiple of the head dim ", p.D, " (query hidden size / head_num)");
      p.Nkv = k.size(2) / p.D;
      TORCH_CHECK(v.size(2) % p.Nkv == 0, op, ": expected value's hidden size (", v.size(2), ") to be a multiple of ",
                  "the number of key/value heads ", p.Nkv);
      p.Dv = v.size(2) / p.Nkv;
      TORCH_CHECK(k.size(b) == p.B && v.size(b) == p.B && v.size(s) == p.S2, op,
                  ": expected key and value to have query's batch size and the same sequence length, got query ",
                  q.sizes(), ", key ", k.sizes(), ", value ", v.sizes());
      break;
    }
    case Layout::BNSD:
    case Layout::BSND: {
      const int64_t s = p.layout == Layout::BNSD ? 2 : 1, n = 3 - s;
      p.B = q.size(0);
      p.N = q.size(n);
      p.S1 = q.size(s);
      p.S2 = k.size(s);
      p.Nkv = k.size(n);
      p.D = q.size(3);
      p.Dv = v.size(3);
      TORCH_CHECK(p.N == o.head_num, op, ": expected head_num (", o.head_num, ") to equal query's head dimension ",
                  "N=", p.N, " (query shape ", q.sizes(), ", layout ", o.layout, ")");
      TORCH_CHECK(k.size(0) == p.B && v.size(0) == p.B && v.size(s) == p.S2 && v.size(n) == p.Nkv &&
                      k.size(3) == p.D,
                  op, ": expected key [B, Skv, Nkv, D] and value [B, Skv, Nkv, Dv] (in ", o.layout,
                  " order) to match query's B and D, got query ", q.sizes(), ", key ", k.sizes(), ", value ",
                  v.sizes());
      break;
    }
    case Layout::TND: {
      Tq = q.size(0);
      Tkv = k.size(0);
      p.N = q.size(1);
      p.Nkv = k.size(1);
      p.D = q.size(2);
      p.Dv = v.size(2);
      TORCH_CHECK(p.N == o.head_num, op, ": expected head_num (", o.head_num, ") to equal query's head dimension ",
                  "N=", p.N, " (query shape ", q.sizes(), ", layout TND)");
      TORCH_CHECK(v.size(0) == Tkv && v.size(1) == p.Nkv && k.size(2) == p.D, op,
                  ": expected key [T, Nkv, D] and value [T, Nkv, Dv] with query's D, got query ", q.sizes(),
                  ", key ", k.sizes(), ", value ", v.sizes());
      TORCH_CHECK(o.qlen.has_value() && o.kvlen.has_value() && !o.qlen->empty() &&
                      o.qlen->size() == o.kvlen->size(),
                  op, ": input_layout TND needs actual_seq_qlen and actual_seq_kvlen, the cumulative sequence ",
                  "lengths of each batch, of the same non-zero length");
      p.B = static_cast<int64_t>(o.qlen->size());
      split_cumulative(op, "actual_seq_qlen", *o.qlen, Tq, "query", p.sq, p.q_first, p.tnd_tail);
      split_cumulative(op, "actual_seq_kvlen", *o.kvlen, Tkv, "key", p.skv, p.kv_first, p.tnd_tail);
      p.S1 = *std::max_element(p.sq.begin(), p.sq.end());
      p.S2 = *std::max_element(p.skv.begin(), p.skv.end());
      break;
    }
  }
  TORCH_CHECK(p.D > 0, op, ": expected a head dim of at least 1, got query ", q.sizes());
  TORCH_CHECK(p.Nkv > 0 && p.N % p.Nkv == 0, op, ": the number of query heads (", p.N,
              ") must be a multiple of the number of key/value heads (", p.Nkv, ")");
  p.G = p.N / p.Nkv;
  if (!tnd) {
    p.sq.assign(p.B, p.S1);
    p.skv.assign(p.B, p.S2);
    p.q_first.assign(p.B, 0);
    p.kv_first.assign(p.B, 0);
  }
  p.last_batch = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    if (p.sq[b] > 0) p.last_batch = b;
  }
  p.q = layout_strides(p.layout, p.B, p.S1, p.N, p.D);
  p.k = layout_strides(p.layout, p.B, p.S2, p.Nkv, p.D);
  p.v = layout_strides(p.layout, p.B, p.S2, p.Nkv, p.Dv);
  p.out = layout_strides(p.layout, p.B, p.S1, p.N, p.Dv);
  switch (p.layout) {
    case Layout::BSH: p.out_sizes = {p.B, p.S1, p.N * p.Dv}; break;
    case Layout::SBH: p.out_sizes = {p.S1, p.B, p.N * p.Dv}; break;
    case Layout::BNSD: p.out_sizes = {p.B, p.N, p.S1, p.Dv}; break;
    case Layout::BSND: p.out_sizes = {p.B, p.S1, p.N, p.Dv}; break;
    case Layout::TND: p.out_sizes = {Tq, p.N, p.Dv}; break;
  }
  p.scale = o.scale;

  // softmax_max/softmax_sum: [B, N, S1, 8]; TND: [T, N, 8], laid out N-major (NTD)
  // unless softmax_layout is "TND".
  TORCH_CHECK(o.softmax_layout.empty() || (o.softmax_layout == "TND" && tnd), op,
              ": softmax_layout must be \"\" or, with input_layout TND, \"TND\"; got \"", o.softmax_layout, "\"");
  if (tnd) {
    p.stat_sizes = {Tq, p.N, kStatLanes};
    p.stat = o.softmax_layout.empty() ? Strides{0, kStatLanes, Tq * kStatLanes}
                                      : Strides{0, p.N * kStatLanes, kStatLanes};
  } else {
    p.stat_sizes = {p.B, p.N, p.S1, kStatLanes};
    p.stat = {p.N * p.S1 * kStatLanes, kStatLanes, p.S1 * kStatLanes};
  }

  // Sparse modes and the mask.
  p.sparse_mode = o.sparse_mode;
  if (tnd) {
    TORCH_CHECK((o.sparse_mode >= 0 && o.sparse_mode <= 4) || (o.sparse_mode >= 6 && o.sparse_mode <= 8), op,
                ": sparse_mode must be in [0, 5) or (5, 8] for input_layout TND, got ", o.sparse_mode);
  } else {
    TORCH_CHECK(o.sparse_mode >= 0 && o.sparse_mode <= 6, op, ": sparse_mode must be in [0, 6] for input_layout ",
                o.layout, " (7 and 8 are TND only), got ", o.sparse_mode);
  }
  p.pre = std::clamp(o.pre, -kTokensMax, kTokensMax);
  p.next = std::clamp(o.next, -kTokensMax, kTokensMax);
  if (o.sparse_mode == 5 || o.sparse_mode == 6) {
    TORCH_CHECK(o.prefix.has_value() && static_cast<int64_t>(o.prefix->size()) == p.B, op, ": sparse_mode ",
                o.sparse_mode, " needs prefix, one length per batch (", p.B, "), got ",
                o.prefix.has_value() ? c10::str(*o.prefix) : std::string("None"));
    p.prefix.assign(o.prefix->begin(), o.prefix->end());
  }
  const Tensor& mask = in.atten_mask;
  // Without a mask torch_npu computes everything, whatever sparse_mode and the tokens say.
  p.band = mask.defined();
  if (mask.defined()) {
    TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte, op,
                ": expected atten_mask to be bool or uint8 (1 = masked out), got ", mask.scalar_type());
    const int64_t mode = o.sparse_mode;
    if (mode == 0 || mode == 1 || mode == 5) {
      p.use_mask = true;
      bool ok;
      if (tnd) {
        ok = mask.dim() == 2 && mask.size(0) == p.S1 && mask.size(1) == p.S2;
        TORCH_CHECK(ok, op, ": expected atten_mask of shape [maxSq, maxSkv] = [", p.S1, ", ", p.S2,
                    "] for input_layout TND, got ", mask.sizes());
        p.mask = {0, p.S2, 0};
      } else {
        ok = (mask.dim() == 2 || mask.dim() == 4) && mask.size(-2) == p.S1 && mask.size(-1) == p.S2;
        if (mask.dim() == 4) {
          ok = ok && (mask.size(0) == 1 || mask.size(0) == p.B) && (mask.size(1) == 1 || mask.size(1) == p.N);
        }
        TORCH_CHECK(ok, op, ": expected atten_mask of shape [B, N, S1, S2], [B, 1, S1, S2], [1, 1, S1, S2] or ",
                    "[S1, S2] with B=", p.B, ", N=", p.N, ", S1=", p.S1, ", S2=", p.S2, ", got ", mask.sizes());
        p.mask = broadcast_strides(mask);
      }
    } else {
      const int64_t rows = mode == 6 ? 3072 : 2048;
      TORCH_CHECK(mask.dim() == 2 && mask.size(0) == rows && mask.size(1) == 2048, op, ": sparse_mode ", mode,
                  " takes the compressed ", rows, "x2048 atten_mask (upper triangle masked), got shape ",
                  mask.sizes());
    }
  }

  // pse: [B, N, S1, S2], [B, N, 1, S2] or [1, N, S1, S2], added to Q K^T before scaling.
  const Tensor& pse = in.pse;
  p.has_pse = pse.defined();
  if (pse.defined()) {
    TORCH_CHECK(!tnd, op, ": pse is not supported with input_layout TND in the simulator");
    check_dtype(op, "pse", pse, q.scalar_type());
    const bool ok = pse.dim() == 4 && (pse.size(0) == p.B || pse.size(0) == 1) && pse.size(1) == p.N &&
                    (pse.size(2) == p.S1 || pse.size(2) == 1) && pse.size(3) == p.S2;
    TORCH_CHECK(ok, op, ": expected pse of shape [B, N, S1, S2], [B, N, 1, S2] or [1, N, S1, S2] with B=", p.B,
                ", N=", p.N, ", S1=", p.S1, ", S2=", p.S2, ", got ", pse.sizes());
    p.pse = broadcast_strides(pse);
    p.pse_full = pse.size(0) == p.B && pse.size(2) == p.S1;
    p.pse_numel = pse.numel();
  }

  // sink: one logit per query head in the softmax denominator.
  if (in.sink.defined()) {
    check_dtype(op, "sink", in.sink, stat_dtype(q));
    TORCH_CHECK(in.sink.dim() == 1 && in.sink.size(0) == p.N, op, ": expected sink of shape [head_num] = [", p.N,
                "], got ", in.sink.sizes());
    p.has_sink = true;
  }

  // Dropout mask elements.
  p.drop_first.resize(p.B);
  int64_t e = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    p.drop_first[b] = e;
    e += p.N * p.sq[b] * p.skv[b];
  }
  p.numels = e;
  if (o.keep_prob < 1) {
    p.dropout.on = true;
    p.dropout.threshold = static_cast<uint32_t>(std::min(o.keep_prob * 4294967296.0, 4294967295.0));
    p.dropout.inv_keep = 1.0 / o.keep_prob;
  }
  return p;
}

// ---- forward ------------------------------------------------------------------------------
template <typename T, typename F>
struct Operands {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const T* pse = nullptr;
  const uint8_t* mask = nullptr;
  const F* sink = nullptr;
  const int32_t* block_table = nullptr;
  const uint8_t* drop_mask = nullptr;
};

template <typename X>
const X* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.const_data_ptr<X>() : nullptr;
}

// Adds scale * pse (or pse, when !pse_scaled) to the scores x of row i of head n against
// keys [j0, j0 + jn) and sets those the row may not see to -inf.
template <typename T, typename F>
void mask_scores(const Problem& p, const Operands<T, F>& a, int64_t b, int64_t n, int64_t i, int64_t lo, int64_t hi,
                 int64_t j0, int64_t jn, F* x) {
  if (a.pse) {
    const T* row = a.pse + p.pse.at(b, i, n) + j0;
    const F s = p.pse_scaled ? static_cast<F>(p.scale) : F(1);
    for (int64_t j = 0; j < jn; ++j) x[j] += s * static_cast<F>(row[j]);
  }
  const int64_t from = std::clamp<int64_t>(lo - j0, 0, jn), to = std::clamp<int64_t>(hi - j0, from, jn);
  std::fill(x, x + from, -std::numeric_limits<F>::infinity());
  std::fill(x + to, x + jn, -std::numeric_limits<F>::infinity());
  if (a.mask) {
    const uint8_t* row = a.mask + p.mask.at(b, i, n) + j0;
    for (int64_t j = from; j < to; ++j) x[j] = row[j] ? -std::numeric_limits<F>::infinity() : x[j];
  }
}

// A block of query rows of one batch and the keys they see: rows i0.. of one head, or
// (decode, one query per sequence) row 0 of consecutive heads of one kv head, so that
// a GQA decode multiplies [heads, D] blocks rather than single rows.
struct QueryBlock {
  int64_t i0 = 0, rows = 0;
  int64_t n[kBlockQ], i[kBlockQ];  // head and query row of each block row
  int64_t lo[kBlockQ], hi[kBlockQ];
  int64_t jlo = 0, jhi = 0;  // union of the rows' key ranges

  // Query block `block` of head `head`.
  QueryBlock(const Problem& p, int64_t b, int64_t block, int64_t head = 0) : i0(block * kBlockQ) {
    rows = std::min(kBlockQ, p.sq[b] - i0);
    for (int64_t r = 0; r < rows; ++r) {
      n[r] = head;
      i[r] = i0 + r;
    }
    bound(p, b);
  }
  // Row 0 of heads head0 .. head0 + count - 1 (at most kBlockQ of them).
  struct Heads {};
  QueryBlock(const Problem& p, int64_t b, Heads, int64_t head0, int64_t count) {
    rows = p.sq[b] > 0 ? std::min(kBlockQ, count) : 0;
    for (int64_t r = 0; r < rows; ++r) {
      n[r] = head0 + r;
      i[r] = 0;
    }
    bound(p, b);
  }
  void bound(const Problem& p, int64_t b) {
    jlo = std::numeric_limits<int64_t>::max();
    for (int64_t r = 0; r < rows; ++r) {
      std::tie(lo[r], hi[r]) = p.keys(b, i[r]);
      if (lo[r] < hi[r]) {
        jlo = std::min(jlo, lo[r]);
        jhi = std::max(jhi, hi[r]);
      }
    }
    if (jhi == 0) jlo = 0;
  }
  bool sees(int64_t r, int64_t j0, int64_t jn) const { return lo[r] < hi[r] && lo[r] < j0 + jn && hi[r] > j0; }
};

// Work is split into items (batch, kv head, chunk): an item packs its kv head's keys and
// values once, then runs every query block of the chunk (blocks chunk, chunk + chunks,
// ...) for the kv head's G query heads. Items go to slots round-robin; a slot is one
// thread's work and owns a workspace.
struct Split {
  int64_t chunks = 1, items = 0, slots = 1;
};

Split split_work(const Problem& p) {
  Split s;
  const int64_t heads = p.B * p.Nkv;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t blocks = std::max<int64_t>(1, (p.S1 + kBlockQ - 1) / kBlockQ);
  if (heads > 0) s.chunks = std::clamp<int64_t>((4 * threads + heads - 1) / heads, 1, blocks);
  s.items = heads * s.chunks;
  s.slots = std::clamp<int64_t>(s.items, 1, threads);
  return s;
}

// at::parallel_for is header-only OpenMP: it runs on several threads only if this TU is
// compiled with -fopenmp, and serially otherwise.
template <typename Fn>
void run_items(const Split& s, const Fn& fn) {
  at::parallel_for(0, s.slots, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot) {
      for (int64_t item = slot; item < s.items; item += s.slots) fn(item, slot);
    }
    at::native::cpublas::brgemm_release(false);
  });
}

template <typename T, typename F>
void forward_kernel(const Problem& p, const Operands<T, F>& a, T* out, F* smax, F* ssum) {
  if (p.paged) {  // ids come from the device: checked here, before any is followed
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t blk = 0; blk * p.block_size < p.skv[b]; ++blk) {
        const int64_t id = a.block_table[b * p.max_blocks + blk];
        TORCH_CHECK(id >= 0 && id < p.num_blocks, "block_table[", b, "][", blk, "] = ", id,
                    " is not a block of the key/value cache (expected 0 <= id < ", p.num_blocks, ")");
      }
    }
  }
  const Split split = split_work(p);
  const int64_t ld = std::max<int64_t>(p.S2, 1);  // packed keys/values: one row/column per key
  const int64_t per_slot = p.D * ld + ld * p.Dv + kBlockQ * (p.D + kBlockKV + p.Dv + 2);
  Tensor workspace = at::empty({split.slots, per_slot}, at::TensorOptions().dtype(c10::CppTypeToScalarType<F>::value));
  F* ws0 = workspace.mutable_data_ptr<F>();
  constexpr F kNegInf = -std::numeric_limits<F>::infinity();

  run_items(split, [&](int64_t item, int64_t slot) {
    const int64_t chunk = item % split.chunks, head = item / split.chunks;
    const int64_t b = head / p.Nkv, kvh = head % p.Nkv;
    const int64_t skv = p.skv[b];
    F* kT = ws0 + slot * per_slot;    // [D, ld]: keys transposed
    F* vb = kT + p.D * ld;            // [ld, Dv]
    F* qb = vb + ld * p.Dv;           // [rows, D]: scale * query
    F* sb = qb + kBlockQ * p.D;       // [rows, kBlockKV]: scores, then probabilities
    F* ob = sb + kBlockQ * kBlockKV;  // [rows, Dv]: unnormalised output
    F* m = ob + kBlockQ * p.Dv;       // running max
    F* l = m + kBlockQ;               // running sum
    if (p.paged) {  // block by block, through the batch's row of the block table
      for (int64_t j0 = 0; j0 < skv; j0 += p.block_size) {
        const int64_t id = a.block_table[b * p.max_blocks + j0 / p.block_size];
        const int64_t rows = std::min(p.block_size, skv - j0);
        transpose(a.k + p.k.at(id, 0, kvh), p.k.seq, rows, p.D, kT + j0, ld);
        copy_rows(a.v + p.v.at(id, 0, kvh), p.v.seq, rows, p.Dv, vb + j0 * p.Dv, p.Dv);
      }
    } else {
      transpose(a.k + p.k.at(b, p.kv_first[b], kvh), p.k.seq, skv, p.D, kT, ld);
      copy_rows(a.v + p.v.at(b, p.kv_first[b], kvh), p.v.seq, skv, p.Dv, vb, p.Dv);
    }
    uint8_t keep[kBlockKV];

    auto run_block = [&](const QueryBlock& qblk) {
      const int64_t rows = qblk.rows;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = qblk.n[r];
        copy_rows(a.q + p.q.at(b, p.q_first[b] + qblk.i[r], n), p.q.seq, 1, p.D, qb + r * p.D, p.D,
                  static_cast<F>(p.scale));
        m[r] = a.sink ? a.sink[n] : kNegInf;  // the sink is one more logit, with no value
        l[r] = a.sink ? F(1) : F(0);
      }
      std::fill(ob, ob + rows * p.Dv, F(0));
      for (int64_t j0 = qblk.jlo; j0 < qblk.jhi; j0 += kBlockKV) {
        const int64_t jn = std::min(kBlockKV, qblk.jhi - j0);
        gemm(rows, jn, p.D, qb, p.D, kT + j0, ld, sb, kBlockKV, false);
        for (int64_t r = 0; r < rows; ++r) {
          F* x = sb + r * kBlockKV;
          if (!qblk.sees(r, j0, jn)) {
            std::fill(x, x + jn, F(0));
            continue;
          }
          const int64_t n = qblk.n[r], i = qblk.i[r];
          mask_scores(p, a, b, n, i, qblk.lo[r], qblk.hi[r], j0, jn, x);
          const F mx = std::max(m[r], row_max(x, jn));
          if (mx == kNegInf) {  // nothing visible yet
            std::fill(x, x + jn, F(0));
            continue;
          }
          const F alpha = std::exp(m[r] - mx);
          l[r] = l[r] * alpha + exp_shift(x, jn, mx, F(1));
          m[r] = mx;
          if (alpha != F(1)) scale_row(ob + r * p.Dv, p.Dv, alpha);
          if (p.dropout.on) {
            dropout_keep(p.dropout, a.drop_mask, p.drop_first[b] + (n * p.sq[b] + i) * skv + j0, jn, keep);
            const F inv = static_cast<F>(p.dropout.inv_keep);
            for (int64_t j = 0; j < jn; ++j) x[j] = keep[j] ? x[j] * inv : F(0);
          }
        }
        gemm(rows, p.Dv, jn, sb, kBlockKV, vb + j0 * p.Dv, p.Dv, ob, p.Dv, true);
      }
      // A row that sees no key (and no sink) gives 0; its max is the lowest float.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = p.q_first[b] + qblk.i[r], n = qblk.n[r];
        copy_rows(ob + r * p.Dv, p.Dv, 1, p.Dv, out + p.out.at(b, row, n), p.out.seq,
                  l[r] > 0 ? F(1) / l[r] : F(0));
        const int64_t s = p.stat.at(b, row, n);
        if (p.lse) {
          if (smax) std::fill(smax + s, smax + s + p.stat_lanes, l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf);
          continue;
        }
        if (smax) {
          std::fill(smax + s, smax + s + p.stat_lanes, m[r] == kNegInf ? std::numeric_limits<F>::lowest() : m[r]);
        }
        if (ssum) std::fill(ssum + s, ssum + s + p.stat_lanes, l[r]);
      }
    };

    if (p.S1 == 1) {  // decode: the kv head's query heads, kBlockQ at a time
      for (int64_t g0 = 0; g0 < p.G; g0 += kBlockQ) {
        run_block(QueryBlock(p, b, QueryBlock::Heads{}, kvh * p.G + g0, p.G - g0));
      }
      return;
    }
    for (int64_t g = 0; g < p.G; ++g) {
      for (int64_t block = chunk; block * kBlockQ < p.sq[b]; block += split.chunks) {
        run_block(QueryBlock(p, b, block, kvh * p.G + g));
      }
    }
  });
}


template <typename T, typename F>
Operands<T, F> operands(const std::vector<Tensor>& t) {
  Operands<T, F> a;
  a.q = t[kQ].const_data_ptr<T>();
  a.k = t[kK].const_data_ptr<T>();
  a.v = t[kV].const_data_ptr<T>();
  a.pse = ptr_or_null<T>(t[kPse]);
  a.mask = t[kMask].defined() ? static_cast<const uint8_t*>(t[kMask].const_data_ptr()) : nullptr;
  a.sink = ptr_or_null<F>(t[kSink]);
  if (t.size() > kBlockTable) a.block_table = ptr_or_null<int32_t>(t[kBlockTable]);
  if (t.size() > kDropMask) a.drop_mask = ptr_or_null<uint8_t>(t[kDropMask]);
  return a;
}

}  // namespace

namespace fa {
int64_t work_estimate(const Problem& p) {
  const double w = static_cast<double>(p.B) * p.N * p.S1 * p.S2 * std::max<int64_t>(p.D, 1);
  return w > 1e18 ? int64_t{1} << 60 : static_cast<int64_t>(w);
}

void forward(const Problem& p, const std::vector<Tensor>& t) {
  NPU_DISPATCH_FLOAT(t[kQ].scalar_type(), "attention_forward", [&] {
    using F = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    forward_kernel<scalar_t, F>(p, operands<scalar_t, F>(t), t[kOut].mutable_data_ptr<scalar_t>(),
                                t[kMax].defined() ? t[kMax].mutable_data_ptr<F>() : nullptr,
                                t[kSum].defined() ? t[kSum].mutable_data_ptr<F>() : nullptr);
  });
}
}  // namespace fa

namespace {

// Queues the forward on the current stream of the query's device; out, softmax_max and
// softmax_sum are allocated by the caller.
void launch_forward(const char* op, const std::shared_ptr<const Problem>& p, const Inputs& in, const Tensor& out,
                    const Tensor& smax, const Tensor& ssum) {
  const Tensor mask = p->use_mask ? dense(in.atten_mask) : Tensor();
  std::vector<Tensor> operands{dense(in.q), dense(in.k), dense(in.v), dense(in.pse), mask, dense(in.sink),
                               out, smax, ssum};
  if (in.drop_mask.defined()) operands.insert(operands.end(), {Tensor(), dense(in.drop_mask)});
  ops::launch_kernel(op, in.q.device().index(), std::move(operands), work_estimate(*p),
                     [p](const std::vector<Tensor>& t) { forward(*p, t); });
}

Tensor new_output(const Problem& p, c10::IntArrayRef sizes, const at::TensorOptions& options) {
  return p.tnd_tail ? at::zeros(sizes, options) : at::empty(sizes, options);
}

// The forward's outputs, for the backward when it is not given them.
struct ForwardOut {
  Tensor out, smax, ssum;
};

ForwardOut run_forward(const char* op, const std::shared_ptr<const Problem>& p, const Inputs& in) {
  const auto stat_options = in.q.options().dtype(stat_dtype(in.q));
  ForwardOut f{new_output(*p, p->out_sizes, in.q.options()), new_output(*p, p->stat_sizes, stat_options),
               new_output(*p, p->stat_sizes, stat_options)};
  launch_forward(op, p, in, f.out, f.smax, f.ssum);
  return f;
}

// Seed and offset of a dropout mask from the device's npu generator, as torch_npu
// takes them: the generator's seed and its Philox offset, advanced past this mask's draws.
std::pair<int64_t, int64_t> draw_seed(c10::DeviceIndex device, int64_t numels) {
  auto* gen = getDefaultNPUGenerator(device).get<NPUGeneratorImpl>();
  auto [seed, offset] = gen->philox_engine_inputs(static_cast<uint64_t>(numels));
  return {static_cast<int64_t>(seed), static_cast<int64_t>(offset)};
}

Options make_options(int64_t head_num, c10::string_view layout, double scale, double keep_prob, int64_t pre,
                     int64_t next, at::OptionalIntArrayRef prefix, at::OptionalIntArrayRef qlen,
                     at::OptionalIntArrayRef kvlen, int64_t sparse_mode, c10::string_view softmax_layout) {
  return {head_num, layout, scale, keep_prob, pre, next, prefix, qlen, kvlen, sparse_mode, softmax_layout};
}

const Tensor& value_or_undefined(const std::optional<Tensor>& t) {
  static const Tensor undefined;
  return t.has_value() ? *t : undefined;
}

using FwdResult = std::tuple<Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, int64_t>;

// A caller's dropout mask: uint8 on the query's device with a bit per score element of the
// problem (its [B, N, S1, S2] elements in order, lowest bit first), as _npu_dropout_gen_mask
// makes it. Used only with dropout (keep_prob < 1).
const Tensor& checked_drop_mask(const char* op, const Problem& p, const Tensor& query,
                                const std::optional<Tensor>& dropout_mask) {
  const Tensor& m = value_or_undefined(dropout_mask);
  if (!m.defined() || !p.dropout.on) return value_or_undefined(std::nullopt);
  npu_device(op, {{"query", query}, {"dropout_mask", m}});
  TORCH_CHECK(m.scalar_type() == at::kByte, op, ": expected dropout_mask of dtype uint8 (one keep bit per element, ",
              "as _npu_dropout_gen_mask makes it), got ", m.scalar_type());
  TORCH_CHECK(m.numel() * 8 >= p.numels, op, ": dropout_mask holds ", m.numel() * 8, " bits, the attention has ",
              p.numels, " score elements (expected at least ", (p.numels + 7) / 8, " bytes)");
  return m;
}

FwdResult npu_fusion_attention(const Tensor& query, const Tensor& key, const Tensor& value, int64_t head_num,
                               c10::string_view input_layout, const std::optional<Tensor>& pse,
                               const std::optional<Tensor>& padding_mask, const std::optional<Tensor>& atten_mask,
                               double scale, double keep_prob, int64_t pre_tockens, int64_t next_tockens,
                               int64_t inner_precise, at::OptionalIntArrayRef prefix,
                               at::OptionalIntArrayRef actual_seq_qlen, at::OptionalIntArrayRef actual_seq_kvlen,
                               int64_t sparse_mode, bool gen_mask_parallel, bool sync,
                               c10::string_view softmax_layout, const std::optional<Tensor>& sink,
                               const std::optional<Tensor>& dropout_mask, int64_t seed, int64_t offset) {
  constexpr const char* op = "npu_fusion_attention";
  (void)inner_precise;  // precision modes: the simulator always accumulates in float
  (void)gen_mask_parallel;
  (void)sync;
  const Inputs shapes{query, key, value, value_or_undefined(pse), value_or_undefined(padding_mask),
                      value_or_undefined(atten_mask), value_or_undefined(sink), value_or_undefined(std::nullopt)};
  auto p = std::make_shared<Problem>(make_problem(
      op, shapes,
      make_options(head_num, input_layout, scale, keep_prob, pre_tockens, next_tockens, prefix, actual_seq_qlen,
                   actual_seq_kvlen, sparse_mode, softmax_layout)));
  const Inputs in{query, key, value, shapes.pse, shapes.padding_mask, shapes.atten_mask, shapes.sink,
                  checked_drop_mask(op, *p, query, dropout_mask)};
  // As torch_npu: with dropout a non-zero seed (and offset) selects the mask, seed 0
  // draws one from the generator; seed and offset are returned for the backward.
  if (p->dropout.on && seed == 0) std::tie(seed, offset) = draw_seed(query.device().index(), p->numels);
  p->dropout.seed = static_cast<uint64_t>(seed);
  p->dropout.offset = static_cast<uint64_t>(offset);
  ForwardOut f = run_forward(op, p, in);
  return {f.out, f.smax, f.ssum, at::empty({0}, query.options()), seed, offset, p->numels};
}

// ---- backward -----------------------------------------------------------------------------
template <typename T, typename F>
struct GradTensors {
  const T* dy = nullptr;
  const T* o = nullptr;
  const F* smax = nullptr;
  const F* ssum = nullptr;
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  T* dpse = nullptr;  // written directly when the pse has one element per score
  F* dsink = nullptr;
};

// Flash-attention backward. For each query block and key tile it recomputes
// P = exp(S - max) / sum, then dP = dO V^T (with the dropout mask), dS = P (dP - delta)
// where delta = rowsum(dO * O), and accumulates dV += P_dropped^T dO, dQ += dS K,
// dK += dS^T Q. dQ rows belong to one item; dK/dV of a kv head are summed over the
// item's query heads (GQA) in float and, when a head's query blocks are split into
// several chunks, over the chunks' partial sums afterwards.
template <typename T, typename F>
void backward_kernel(const Problem& p, const Operands<T, F>& a, const GradTensors<T, F>& g) {
  const Split split = split_work(p);
  const int64_t ld = std::max<int64_t>(p.S2, 1);
  const bool partial = split.chunks > 1;
  const int64_t acc_size = ld * (p.D + p.Dv);  // dK and dV of one kv head
  const int64_t per_slot = 2 * p.D * ld + p.Dv * ld + (partial ? 0 : acc_size) +
                           kBlockQ * (2 * p.D + p.Dv + 2 * kBlockKV + 3) + kBlockKV * kBlockQ;
  const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<F>::value);
  Tensor workspace = at::empty({split.slots, per_slot}, options);
  // Partial dK/dV per (chunk, head); partial dpse (when broadcast) and dsink per slot.
  Tensor partials = partial ? at::zeros({split.items, acc_size}, options) : Tensor();
  const bool pse_partial = p.has_pse && !p.pse_full;
  Tensor dpse_acc = pse_partial ? at::zeros({split.slots, p.pse_numel}, options) : Tensor();
  Tensor dsink_acc = at::zeros({split.slots, p.N}, options);
  F* ws0 = workspace.mutable_data_ptr<F>();
  const F fscale = static_cast<F>(p.scale);

  run_items(split, [&](int64_t item, int64_t slot) {
    const int64_t chunk = item % split.chunks, head = item / split.chunks;
    const int64_t b = head / p.Nkv, kvh = head % p.Nkv;
    const int64_t skv = p.skv[b];
    F* kT = ws0 + slot * per_slot;  // [D, ld]
    F* kb = kT + p.D * ld;          // [ld, D]
    F* vT = kb + ld * p.D;          // [Dv, ld]
    F* acc = partial ? partials.mutable_data_ptr<F>() + item * acc_size : vT + p.Dv * ld;
    F* dK = acc;                    // [ld, D]
    F* dV = acc + ld * p.D;         // [ld, Dv]
    F* qb = (partial ? vT + p.Dv * ld : acc + acc_size);  // [rows, D]
    F* dob = qb + kBlockQ * p.D;    // [rows, Dv]
    F* dqb = dob + kBlockQ * p.Dv;  // [rows, D]
    F* sb = dqb + kBlockQ * p.D;    // [rows, kBlockKV]: P
    F* dpb = sb + kBlockQ * kBlockKV;  // [rows, kBlockKV]: dP, then dS
    F* tb = dpb + kBlockQ * kBlockKV;  // [kBlockKV, rows]: a transposed tile
    F* m = tb + kBlockKV * kBlockQ;
    F* il = m + kBlockQ;            // 1 / sum
    F* delta = il + kBlockQ;
    F* dsink = dsink_acc.mutable_data_ptr<F>() + slot * p.N;
    F* dpse_slot = pse_partial ? dpse_acc.mutable_data_ptr<F>() + slot * p.pse_numel : nullptr;
    const T* k0 = a.k + p.k.at(b, p.kv_first[b], kvh);
    const T* v0 = a.v + p.v.at(b, p.kv_first[b], kvh);
    transpose(k0, p.k.seq, skv, p.D, kT, ld);
    copy_rows(k0, p.k.seq, skv, p.D, kb, p.D);
    transpose(v0, p.v.seq, skv, p.Dv, vT, ld);
    if (!partial) std::fill(acc, acc + acc_size, F(0));
    uint8_t keep[kBlockKV];

    for (int64_t gi = 0; gi < p.G; ++gi) {
      const int64_t n = kvh * p.G + gi;
      for (int64_t block = chunk; block * kBlockQ < p.sq[b]; block += split.chunks) {
        const QueryBlock qblk(p, b, block);
        const int64_t rows = qblk.rows, i0 = qblk.i0;
        const int64_t row0 = p.q_first[b] + i0;
        copy_rows(a.q + p.q.at(b, row0, n), p.q.seq, rows, p.D, qb, p.D, fscale);
        copy_rows(g.dy + p.out.at(b, row0, n), p.out.seq, rows, p.Dv, dob, p.Dv);
        std::fill(dqb, dqb + rows * p.D, F(0));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t s = p.stat.at(b, row0 + r, n);
          m[r] = g.smax[s];
          il[r] = g.ssum[s] > 0 ? F(1) / g.ssum[s] : F(0);
          const T* o = g.o + p.out.at(b, row0 + r, n);
          F d = 0;
          for (int64_t c = 0; c < p.Dv; ++c) d += static_cast<F>(o[c]) * dob[r * p.Dv + c];
          delta[r] = d;
          if (a.sink) dsink[n] -= std::exp(a.sink[n] - m[r]) * il[r] * d;
        }
        for (int64_t j0 = qblk.jlo; j0 < qblk.jhi; j0 += kBlockKV) {
          const int64_t jn = std::min(kBlockKV, qblk.jhi - j0);
          gemm(rows, jn, p.D, qb, p.D, kT + j0, ld, sb, kBlockKV, false);
          gemm(rows, jn, p.Dv, dob, p.Dv, vT + j0, ld, dpb, kBlockKV, false);
          for (int64_t r = 0; r < rows; ++r) {
            F* x = sb + r * kBlockKV;
            F* dp = dpb + r * kBlockKV;
            if (!qblk.sees(r, j0, jn)) {
              std::fill(x, x + jn, F(0));
            } else {
              mask_scores(p, a, b, n, i0 + r, qblk.lo[r], qblk.hi[r], j0, jn, x);
              exp_shift(x, jn, m[r], il[r]);  // P; masked scores are -inf and give 0
            }
            if (p.dropout.on) {
              dropout_keep(p.dropout, a.drop_mask, p.drop_first[b] + (n * p.sq[b] + i0 + r) * skv + j0, jn,
                           keep);
              const F inv = static_cast<F>(p.dropout.inv_keep);
              for (int64_t j = 0; j < jn; ++j) {
                const F kj = keep[j] ? inv : F(0);
                dp[j] *= kj;
                tb[j * kBlockQ + r] = x[j] * kj;
              }
            } else {
              for (int64_t j = 0; j < jn; ++j) tb[j * kBlockQ + r] = x[j];
            }
            softmax_grad(dp, x, jn, delta[r]);  // dS
          }
          gemm(jn, p.Dv, rows, tb, kBlockQ, dob, p.Dv, dV + j0 * p.Dv, p.Dv, true);
          gemm(rows, p.D, jn, dpb, kBlockKV, kb + j0 * p.D, p.D, dqb, p.D, true);
          transpose(dpb, kBlockKV, rows, jn, tb, kBlockQ);
          gemm(jn, p.D, rows, tb, kBlockQ, qb, p.D, dK + j0 * p.D, p.D, true);
          if (p.has_pse) {  // d pse = scale * dS
            for (int64_t r = 0; r < rows; ++r) {
              const F* ds = dpb + r * kBlockKV;
              const int64_t at = p.pse.at(b, i0 + r, n) + j0;
              if (pse_partial) {
                for (int64_t j = 0; j < jn; ++j) dpse_slot[at + j] += fscale * ds[j];
              } else {
                for (int64_t j = 0; j < jn; ++j) g.dpse[at + j] = static_cast<T>(fscale * ds[j]);
              }
            }
          }
        }
        copy_rows(dqb, p.D, rows, p.D, g.dq + p.q.at(b, row0, n), p.q.seq, fscale);
      }
    }
    if (!partial) {
      copy_rows(dK, p.D, skv, p.D, g.dk + p.k.at(b, p.kv_first[b], kvh), p.k.seq);
      copy_rows(dV, p.Dv, skv, p.Dv, g.dv + p.v.at(b, p.kv_first[b], kvh), p.v.seq);
    }
  });

  // Sums of the per-chunk and per-slot partials, in a fixed order.
  if (partial) {
    const F* part = partials.const_data_ptr<F>();
    at::parallel_for(0, p.B * p.Nkv, 1, [&](int64_t begin, int64_t end) {
      std::vector<F> sum(acc_size);
      for (int64_t head = begin; head < end; ++head) {
        const int64_t b = head / p.Nkv, kvh = head % p.Nkv, skv = p.skv[b];
        std::fill(sum.begin(), sum.end(), F(0));
        for (int64_t c = 0; c < split.chunks; ++c) {
          const F* src = part + (head * split.chunks + c) * acc_size;
          for (int64_t x = 0; x < acc_size; ++x) sum[x] += src[x];
        }
        copy_rows(sum.data(), p.D, skv, p.D, g.dk + p.k.at(b, p.kv_first[b], kvh), p.k.seq);
        copy_rows(sum.data() + ld * p.D, p.Dv, skv, p.Dv, g.dv + p.v.at(b, p.kv_first[b], kvh), p.v.seq);
      }
    });
  }
  if (pse_partial) {
    const F* src = dpse_acc.const_data_ptr<F>();
    at::parallel_for(0, p.pse_numel, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        F s = 0;
        for (int64_t slot = 0; slot < split.slots; ++slot) s += src[slot * p.pse_numel + x];
        g.dpse[x] = static_cast<T>(s);
      }
    });
  }
  if (g.dsink) {
    const F* src = dsink_acc.const_data_ptr<F>();
    for (int64_t n = 0; n < p.N; ++n) {
      F s = 0;
      for (int64_t slot = 0; slot < split.slots; ++slot) s += src[slot * p.N + n];
      g.dsink[n] = s;
    }
  }
}

enum GradArg { kDy = kDropMask + 1, kAttn, kDq, kDk, kDv, kDpse, kDsink };

using GradResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

// The backward; `dropout_mask` is the forward's mask when the caller gave one (autograd keeps
// it), else the mask is drawn again from seed and offset.
GradResult fusion_attention_grad(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& dy, int64_t head_num,
    c10::string_view input_layout, const std::optional<Tensor>& pse, const std::optional<Tensor>& padding_mask,
    const std::optional<Tensor>& atten_mask, const std::optional<Tensor>& softmax_max,
    const std::optional<Tensor>& softmax_sum, const std::optional<Tensor>& attention_in, double scale_value,
    double keep_prob, int64_t pre_tockens, int64_t next_tockens, int64_t seed, int64_t offset,
    at::OptionalIntArrayRef prefix, at::OptionalIntArrayRef actual_seq_qlen, at::OptionalIntArrayRef actual_seq_kvlen,
    int64_t sparse_mode, c10::string_view softmax_layout, const std::optional<Tensor>& sink,
    const std::optional<Tensor>& dropout_mask) {
  constexpr const char* op = "npu_fusion_attention_grad";
  const Inputs shapes{query, key, value, value_or_undefined(pse), value_or_undefined(padding_mask),
                      value_or_undefined(atten_mask), value_or_undefined(sink), value_or_undefined(std::nullopt)};
  auto p = std::make_shared<Problem>(make_problem(
      op, shapes,
      make_options(head_num, input_layout, scale_value, keep_prob, pre_tockens, next_tockens, prefix,
                   actual_seq_qlen, actual_seq_kvlen, sparse_mode, softmax_layout)));
  const Inputs in{query, key, value, shapes.pse, shapes.padding_mask, shapes.atten_mask, shapes.sink,
                  checked_drop_mask(op, *p, query, dropout_mask)};
  p->dropout.seed = static_cast<uint64_t>(seed);
  p->dropout.offset = static_cast<uint64_t>(offset);
  const auto device = npu_device(op, {{"query", query}, {"dy", dy}});
  check_dtype(op, "dy", dy, query.scalar_type());
  TORCH_CHECK(dy.sizes().equals(p->out_sizes), op, ": expected dy to have the attention output's shape ",
              c10::IntArrayRef(p->out_sizes), ", got ", dy.sizes());
  Tensor o = value_or_undefined(attention_in), smax = value_or_undefined(softmax_max),
         ssum = value_or_undefined(softmax_sum);
  if (o.defined() && smax.defined() && ssum.defined()) {
    npu_device(op, {{"query", query}, {"attention_in", o}, {"softmax_max", smax}, {"softmax_sum", ssum}});
    check_dtype(op, "attention_in", o, query.scalar_type());
    TORCH_CHECK(o.sizes().equals(p->out_sizes), op, ": expected attention_in to have the attention output's shape ",
                c10::IntArrayRef(p->out_sizes), ", got ", o.sizes());
    for (const NamedTensor& t : {NamedTensor{"softmax_max", smax}, NamedTensor{"softmax_sum", ssum}}) {
      check_dtype(op, t.name, t.tensor, stat_dtype(query));
      TORCH_CHECK(t.tensor.sizes().equals(p->stat_sizes), op, ": expected ", t.name, " of shape ",
                  c10::IntArrayRef(p->stat_sizes), ", got ", t.tensor.sizes());
    }
  } else {  // recompute what the forward would have returned
    ForwardOut f = run_forward(op, p, in);
    o = f.out;
    smax = f.smax;
    ssum = f.ssum;
  }
  Tensor dq = new_output(*p, query.sizes(), query.options());
  Tensor dk = new_output(*p, key.sizes(), key.options());
  Tensor dv = new_output(*p, value.sizes(), value.options());
  Tensor dpse = in.pse.defined() ? at::zeros(in.pse.sizes(), in.pse.options()) : at::empty({0}, query.options());
  Tensor dsink = in.sink.defined() ? at::empty(in.sink.sizes(), in.sink.options())
                                   : at::empty({0}, query.options().dtype(stat_dtype(query)));
  ops::launch_kernel(
      op, device,
      {dense(query), dense(key), dense(value), dense(in.pse), p->use_mask ? dense(in.atten_mask) : Tensor(),
       dense(in.sink), Tensor(), dense(smax), dense(ssum), Tensor(), dense(in.drop_mask), dense(dy), dense(o), dq,
       dk, dv,
       in.pse.defined() ? dpse : Tensor(), in.sink.defined() ? dsink : Tensor()},
      2 * work_estimate(*p), [p](const std::vector<Tensor>& t) {
        NPU_DISPATCH_FLOAT(t[kQ].scalar_type(), "npu_fusion_attention_grad", [&] {
          using F = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
          GradTensors<scalar_t, F> g;
          g.dy = t[kDy].const_data_ptr<scalar_t>();
          g.o = t[kAttn].const_data_ptr<scalar_t>();
          g.smax = t[kMax].const_data_ptr<F>();
          g.ssum = t[kSum].const_data_ptr<F>();
          g.dq = t[kDq].mutable_data_ptr<scalar_t>();
          g.dk = t[kDk].mutable_data_ptr<scalar_t>();
          g.dv = t[kDv].mutable_data_ptr<scalar_t>();
          g.dpse = t[kDpse].defined() ? t[kDpse].mutable_data_ptr<scalar_t>() : nullptr;
          g.dsink = t[kDsink].defined() ? t[kDsink].mutable_data_ptr<F>() : nullptr;
          backward_kernel<scalar_t, F>(*p, operands<scalar_t, F>(t), g);
        });
      });
  return {dq, dk, dv, dpse, dsink};
}

GradResult npu_fusion_attention_grad(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& dy, int64_t head_num,
    c10::string_view input_layout, const std::optional<Tensor>& pse, const std::optional<Tensor>& padding_mask,
    const std::optional<Tensor>& atten_mask, const std::optional<Tensor>& softmax_max,
    const std::optional<Tensor>& softmax_sum, const std::optional<Tensor>& softmax_in,
    const std::optional<Tensor>& attention_in, double scale_value, double keep_prob, int64_t pre_tockens,
    int64_t next_tockens, int64_t inner_precise, int64_t seed, int64_t offset, int64_t numels,
    at::OptionalIntArrayRef prefix, at::OptionalIntArrayRef actual_seq_qlen, at::OptionalIntArrayRef actual_seq_kvlen,
    int64_t sparse_mode, bool gen_mask_parallel, bool sync, c10::string_view softmax_layout,
    const std::optional<Tensor>& sink) {
  (void)inner_precise;  // precision modes: the simulator always accumulates in float
  (void)gen_mask_parallel;
  (void)sync;
  (void)softmax_in;  // reserved by torch_npu, as the forward's softmax_out
  (void)numels;      // the mask size follows from the shapes
  return fusion_attention_grad(query, key, value, dy, head_num, input_layout, pse, padding_mask, atten_mask,
                               softmax_max, softmax_sum, attention_in, scale_value, keep_prob, pre_tockens,
                               next_tockens, seed, offset, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
                               softmax_layout, sink, std::nullopt);
}

// ---- autograd -----------------------------------------------------------------------------
// The non-tensor arguments, as the autograd node keeps them for the backward.
struct Args {
  int64_t head_num;
  std::string layout;
  double scale, keep_prob;
  int64_t pre, next, inner_precise;
  std::optional<std::vector<int64_t>> prefix, qlen, kvlen;
  int64_t sparse_mode;
  bool gen_mask_parallel, sync;
  std::string softmax_layout;
  int64_t seed, offset;
};

std::optional<std::vector<int64_t>> to_vector(at::OptionalIntArrayRef a) {
  return a.has_value() ? std::optional<std::vector<int64_t>>(a->vec()) : std::nullopt;
}
at::OptionalIntArrayRef to_ref(const std::optional<std::vector<int64_t>>& v) {
  return v.has_value() ? at::OptionalIntArrayRef(*v) : at::OptionalIntArrayRef();
}
std::optional<Tensor> optional(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

using FwdSignature = FwdResult(const Tensor&, const Tensor&, const Tensor&, int64_t, c10::string_view,
                               const std::optional<Tensor>&, const std::optional<Tensor>&,
                               const std::optional<Tensor>&, double, double, int64_t, int64_t, int64_t,
                               at::OptionalIntArrayRef, at::OptionalIntArrayRef, at::OptionalIntArrayRef, int64_t,
                               bool, bool, c10::string_view, const std::optional<Tensor>&,
                               const std::optional<Tensor>&, int64_t, int64_t);
using GradSignature = GradResult(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                                 c10::string_view, const std::optional<Tensor>&, const std::optional<Tensor>&,
                                 const std::optional<Tensor>&, const std::optional<Tensor>&,
                                 const std::optional<Tensor>&, const std::optional<Tensor>&,
                                 const std::optional<Tensor>&, double, double, int64_t, int64_t, int64_t, int64_t,
                                 int64_t, int64_t, at::OptionalIntArrayRef, at::OptionalIntArrayRef,
                                 at::OptionalIntArrayRef, int64_t, bool, bool, c10::string_view,
                                 const std::optional<Tensor>&);

class FusionAttention : public torch::autograd::Function<FusionAttention> {
 public:
  // `rng` receives (seed, offset, numels), the op's integer outputs.
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const std::optional<Tensor>& pse, const std::optional<Tensor>& sink,
                               const std::optional<Tensor>& atten_mask, const std::optional<Tensor>& padding_mask,
                               const std::optional<Tensor>& dropout_mask, const Args& a,
                               std::array<int64_t, 3>* rng) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_handle<FwdSignature>("npu::npu_fusion_attention");
    auto [out, smax, ssum, softmax_out, seed, offset, numels] =
        op.call(q, k, v, a.head_num, a.layout, pse, padding_mask, atten_mask, a.scale, a.keep_prob, a.pre, a.next,
                a.inner_precise, to_ref(a.prefix), to_ref(a.qlen), to_ref(a.kvlen), a.sparse_mode,
                a.gen_mask_parallel, a.sync, a.softmax_layout, sink, dropout_mask, a.seed, a.offset);
    *rng = {seed, offset, numels};
    ctx->save_for_backward({q, k, v, value_or_undefined(pse), value_or_undefined(sink),
                            value_or_undefined(atten_mask), value_or_undefined(padding_mask), out, smax, ssum,
                            value_or_undefined(dropout_mask)});
    ctx->mark_non_differentiable({smax, ssum, softmax_out});
    auto& d = ctx->saved_data;
    d["ints"] = std::vector<int64_t>{a.head_num, a.pre, a.next, a.inner_precise, a.sparse_mode,
                                     a.gen_mask_parallel, a.sync, seed, offset, numels};
    d["floats"] = std::vector<double>{a.scale, a.keep_prob};
    d["layout"] = a.layout;
    d["softmax_layout"] = a.softmax_layout;
    d["prefix"] = a.prefix;
    d["qlen"] = a.qlen;
    d["kvlen"] = a.kvlen;
    return {out, smax, ssum, softmax_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const auto& d = ctx->saved_data;
    const auto ints = d.at("ints").toIntVector();
    const auto floats = d.at("floats").toDoubleVector();
    const auto list = [&](const char* key) { return d.at(key).toOptional<std::vector<int64_t>>(); };
    const auto prefix = list("prefix"), qlen = list("qlen"), kvlen = list("kvlen");
    const std::string layout = d.at("layout").toStringRef(), softmax_layout = d.at("softmax_layout").toStringRef();
    const Tensor& out = s[7];
    const Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(out);
    GradResult r;
    if (s[10].defined()) {  // the caller's dropout mask, which the grad operator cannot take
      r = fusion_attention_grad(s[0], s[1], s[2], dy, ints[0], layout, optional(s[3]), optional(s[6]),
                                optional(s[5]), s[8], s[9], out, floats[0], floats[1], ints[1], ints[2], ints[7],
                                ints[8], to_ref(prefix), to_ref(qlen), to_ref(kvlen), ints[4], softmax_layout,
                                optional(s[4]), s[10]);
    } else {
      static auto op = op_handle<GradSignature>("npu::npu_fusion_attention_grad");
      r = op.call(s[0], s[1], s[2], dy, ints[0], layout, optional(s[3]), optional(s[6]), optional(s[5]), s[8],
                  s[9], std::nullopt, out, floats[0], floats[1], ints[1], ints[2], ints[3], ints[7], ints[8], ints[9],
                  to_ref(prefix), to_ref(qlen), to_ref(kvlen), ints[4], ints[5] != 0, ints[6] != 0, softmax_layout,
                  optional(s[4]));
    }
    auto [dq, dk, dv, dpse, dsink] = r;
    return {dq, dk, dv, s[3].defined() ? dpse : Tensor(), s[4].defined() ? dsink : Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

FwdResult npu_fusion_attention_autograd(
    const Tensor& query, const Tensor& key, const Tensor& value, int64_t head_num, c10::string_view input_layout,
    const std::optional<Tensor>& pse, const std::optional<Tensor>& padding_mask,
    const std::optional<Tensor>& atten_mask, double scale, double keep_prob, int64_t pre_tockens,
    int64_t next_tockens, int64_t inner_precise, at::OptionalIntArrayRef prefix,
    at::OptionalIntArrayRef actual_seq_qlen, at::OptionalIntArrayRef actual_seq_kvlen, int64_t sparse_mode,
    bool gen_mask_parallel, bool sync, c10::string_view softmax_layout, const std::optional<Tensor>& sink,
    const std::optional<Tensor>& dropout_mask, int64_t seed, int64_t offset) {
  const Args a{head_num,         std::string(input_layout), scale,  keep_prob, pre_tockens, next_tockens,
               inner_precise,    to_vector(prefix),         to_vector(actual_seq_qlen),
               to_vector(actual_seq_kvlen), sparse_mode,    gen_mask_parallel, sync,
               std::string(softmax_layout), seed,           offset};
  std::array<int64_t, 3> rng{};
  auto r = FusionAttention::apply(query, key, value, pse, sink, atten_mask, padding_mask, dropout_mask, a, &rng);
  return {r[0], r[1], r[2], r[3], rng[0], rng[1], rng[2]};
}

// _npu_dropout_gen_mask.Tensor: the dropout mask npu_fusion_attention draws for (seed, offset),
// as a tensor: bit e (lowest bit first) keeps element e of a tensor of `size` with probability
// 1 - p; the element count is rounded up to 128 bits (16 bytes), as DropOutGenMask's.
Tensor npu_dropout_gen_mask_seeded(const Tensor& self, c10::IntArrayRef size, double p, int64_t seed,
                                   int64_t offset, std::optional<bool> parallel, std::optional<bool> sync) {
  constexpr const char* op = "_npu_dropout_gen_mask";
  (void)parallel;
  (void)sync;
  const auto device = npu_device(op, {{"self", self}});
  TORCH_CHECK(p >= 0 && p <= 1, op, ": expected p in [0, 1], got ", p);
  int64_t n = 1;
  for (int64_t d : size) {
    TORCH_CHECK(d >= 0, op, ": expected a size of non-negative dimensions, got ", size);
    n *= d;
  }
  Tensor bits = at::empty({(n + 127) / 128 * 16}, self.options().dtype(at::kByte));
  Dropout d;
  d.seed = static_cast<uint64_t>(seed);
  d.offset = static_cast<uint64_t>(offset);
  d.threshold = static_cast<uint32_t>(std::min((1.0 - p) * 4294967296.0, 4294967295.0));
  ops::launch_kernel(op, device, {bits}, n, [d, n](const std::vector<Tensor>& t) {
    uint8_t* out = t[0].mutable_data_ptr<uint8_t>();
    const int64_t bytes = t[0].numel();
    at::parallel_for(0, bytes, 4096, [&](int64_t b0, int64_t b1) {
      uint8_t keep[8];
      for (int64_t byte = b0; byte < b1; ++byte) {
        const int64_t e = byte * 8, count = std::clamp<int64_t>(n - e, 0, 8);
        dropout_keep(d, nullptr, static_cast<uint64_t>(e), count, keep);
        uint8_t v = 0;
        for (int64_t j = 0; j < count; ++j) v |= static_cast<uint8_t>(keep[j] << j);
        out[byte] = v;  // padding bits beyond the n elements are 0
      }
    });
  });
  return bits;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def(
      "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
      "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
      "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
      "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
      "bool sync=False, str softmax_layout=\"\", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, "
      "int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)",
      {at::Tag::nondeterministic_seeded});
  m.def(
      "npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
      "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
      "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, "
      "float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, "
      "int inner_precise=0, int seed=0, int offset=0, int numels=0, int[]? prefix=None, "
      "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
      "bool sync=False, str softmax_layout=\"\", Tensor? sink=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "_npu_dropout_gen_mask.Tensor(Tensor self, int[] size, float p, int seed, int offset, *, bool? parallel=True, "
      "bool? sync=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_fusion_attention", TORCH_FN(npu_fusion_attention));
  m.impl("npu_fusion_attention_grad", TORCH_FN(npu_fusion_attention_grad));
  m.impl("_npu_dropout_gen_mask.Tensor", TORCH_FN(npu_dropout_gen_mask_seeded));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) { m.impl("npu_fusion_attention", TORCH_FN(npu_fusion_attention_autograd)); }

}  // namespace torch_npu::custom_ops
