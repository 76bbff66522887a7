// Fused optimizer steps: one kernel updates a whole combined (flat) buffer of parameters
// and their states in a single pass (torch_npu.optim's NpuFused* optimizers call these
// once per parameter group and dtype). npu_apply_adam and npu_apply_adam_w are
// torch_npu's public ops; the _npu_fused_<opt>_step ops are the internal kernels of the
// other optimizers, in place on the flat buffers. Half-precision buffers compute in
// float (widened a block at a time); per-parameter norms (LAMB's trust ratio, AdamP's
// projection) and BertAdam's clipping norm are reduced inside the kernel over segments.
#include <ATen/Parallel.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "fused.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

using vmath::acc_t;
using vmath::kBlock;

constexpr int64_t kGrain = 16384;  // elements per task of the elementwise steps
constexpr int64_t kPiece = 32768;  // elements per piece of the segmented (norm-reducing) steps

// Calls fn(in, io, n) on [begin, end) with arrays of acc_t<T>: `in` read only, `io` read and
// written in place. Direct pointers when T is the compute type, else widened blocks (the
// io blocks are narrowed back). Null pointers (absent optional states) stay null.
template <typename T, size_t NI, size_t NIO, typename Fn>
void blocked_inplace(const std::array<const T*, NI>& in, const std::array<T*, NIO>& io, int64_t begin, int64_t end,
                     Fn&& fn) {
  using A = acc_t<T>;
  std::array<const A*, NI> i{};
  std::array<A*, NIO> o{};
  if constexpr (std::is_same_v<T, A>) {
    for (size_t k = 0; k < NI; ++k) i[k] = in[k] ? in[k] + begin : nullptr;
    for (size_t k = 0; k < NIO; ++k) o[k] = io[k] ? io[k] + begin : nullptr;
    fn(i, o, end - begin);
  } else {
    A ibuf[NI > 0 ? NI : 1][kBlock];
    A obuf[NIO > 0 ? NIO : 1][kBlock];
    for (size_t k = 0; k < NI; ++k) i[k] = in[k] ? ibuf[k] : nullptr;
    for (size_t k = 0; k < NIO; ++k) o[k] = io[k] ? obuf[k] : nullptr;
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t n = std::min(kBlock, end - b);
      for (size_t k = 0; k < NI; ++k) {
        if (in[k]) for (int64_t j = 0; j < n; ++j) ibuf[k][j] = static_cast<A>(in[k][b + j]);
      }
      for (size_t k = 0; k < NIO; ++k) {
        if (io[k]) for (int64_t j = 0; j < n; ++j) obuf[k][j] = static_cast<A>(io[k][b + j]);
      }
      fn(i, o, n);
      for (size_t k = 0; k < NIO; ++k) {
        if (io[k]) for (int64_t j = 0; j < n; ++j) io[k][b + j] = static_cast<T>(obuf[k][j]);
      }
    }
  }
}

// ---- elementwise steps on arrays of float (multiversioned) or double ------------------------
// Each mirrors the operation order of torch.optim's single-tensor implementation (or of
// torch_npu's fused optimizer), so float32 results agree to rounding.

// Adam/AdamW. g = sign*grad + l2*p (maximize, L2 decay); p *= decay (decoupled decay);
// m = lerp(m, g, 1-beta1); v = beta2*v + (1-beta2)*g*g; AMS 1: vmax = max(vmax, v) is used
// and kept, AMS 2: max(vmax, v) is used, vmax only read (npu_apply_adam_w);
// p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
struct AdamArgs {
  double sign, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bc2_sqrt;
};
template <int AMS, typename F>
inline void adam_kernel(F* p, const F* g, F* m, F* v, F* vmax, int64_t n, const AdamArgs& a) {
  const F sign = F(a.sign), l2 = F(a.l2), decay = F(a.decay), w1 = F(a.one_minus_beta1), b2 = F(a.beta2),
          w2 = F(a.one_minus_beta2), eps = F(a.eps), step = F(a.step_size), bc2 = F(a.bc2_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    const F gi = sign * g[i] + l2 * p[i];
    const F mi = m[i] + w1 * (gi - m[i]);
    const F vi = v[i] * b2 + w2 * gi * gi;
    F vm = vi;
    if constexpr (AMS != 0) vm = std::max(vmax[i], vi);
    if constexpr (AMS == 1) vmax[i] = vm;
    const F denom = std::sqrt(vm) / bc2 + eps;
    p[i] = p[i] * decay - step * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}
template <int AMS>
NPU_SIMD void adam_f(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamArgs& a) {
  adam_kernel<AMS>(p, g, m, v, vmax, n, a);
}
template <int AMS>
void adam_f(double* p, const double* g, double* m, double* v, double* vmax, int64_t n, const AdamArgs& a) {
  adam_kernel<AMS>(p, g, m, v, vmax, n, a);
}

// TensorFlow's ApplyAdam (npu_apply_adam): lr_t = lr*sqrt(1-beta2^t)/(1-beta1^t);
// m += (g-m)(1-beta1); v += (g*g-v)(1-beta2); var -= lr_t * (nesterov ? g(1-beta1)+beta1 m : m) / (sqrt(v)+eps).
struct TfAdamArgs {
  double lr_t, beta1, one_minus_beta1, one_minus_beta2, eps;
};
template <bool NESTEROV, typename F>
inline void tf_adam_kernel(F* p, const F* g, F* m, F* v, int64_t n, const TfAdamArgs& a) {
  const F lr = F(a.lr_t), b1 = F(a.beta1), w1 = F(a.one_minus_beta1), w2 = F(a.one_minus_beta2), eps = F(a.eps);
  for (int64_t i = 0; i < n; ++i) {
    const F mi = m[i] + (g[i] - m[i]) * w1;
    const F vi = v[i] + (g[i] * g[i] - v[i]) * w2;
    const F num = NESTEROV ? g[i] * w1 + b1 * mi : mi;
    p[i] = p[i] - lr * num / (std::sqrt(vi) + eps);
    m[i] = mi;
    v[i] = vi;
  }
}
template <bool NESTEROV>
NPU_SIMD void tf_adam_f(float* p, const float* g, float* m, float* v, int64_t n, const TfAdamArgs& a) {
  tf_adam_kernel<NESTEROV>(p, g, m, v, n, a);
}
template <bool NESTEROV>
void tf_adam_f(double* p, const double* g, double* m, double* v, int64_t n, const TfAdamArgs& a) {
  tf_adam_kernel<NESTEROV>(p, g, m, v, n, a);
}

// SGD: d = g + wd p; with momentum: buf = first ? d : momentum buf + (1-dampening) d,
// d = nesterov ? d + momentum buf : buf; p -= lr d.
struct SgdArgs {
  double neg_lr, momentum, one_minus_dampening, weight_decay;
};
template <bool MOMENTUM, bool NESTEROV, bool FIRST, typename F>
inline void sgd_kernel(F* p, const F* g, F* buf, int64_t n, const SgdArgs& a) {
  const F neg_lr = F(a.neg_lr), mom = F(a.momentum), damp = F(a.one_minus_dampening), wd = F(a.weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    F d = g[i] + wd * p[i];
    if constexpr (MOMENTUM) {
      const F b = FIRST ? d : buf[i] * mom + damp * d;
      buf[i] = b;
      d = NESTEROV ? d + mom * b : b;
    }
    p[i] = p[i] + neg_lr * d;
  }
}
template <bool MOMENTUM, bool NESTEROV, bool FIRST>
NPU_SIMD void sgd_f(float* p, const float* g, float* buf, int64_t n, const SgdArgs& a) {
  sgd_kernel<MOMENTUM, NESTEROV, FIRST>(p, g, buf, n, a);
}
template <bool MOMENTUM, bool NESTEROV, bool FIRST>
void sgd_f(double* p, const double* g, double* buf, int64_t n, const SgdArgs& a) {
  sgd_kernel<MOMENTUM, NESTEROV, FIRST>(p, g, buf, n, a);
}

// RMSprop, PyTorch's order (TF = false) or TensorFlow's (TF = true: square_avg starts at 1
// in the optimizer, eps inside the sqrt, optional decoupled decay and lr inside momentum).
struct RmsArgs {
  double alpha, one_minus_alpha, eps, l2, decoupled, momentum, c_in, c_out;
};
template <bool TF, bool CENTERED, bool MOMENTUM, typename F>
inline void rmsprop_kernel(F* p, const F* g, F* sq, F* ga, F* buf, int64_t n, const RmsArgs& a) {
  const F alpha = F(a.alpha), w = F(a.one_minus_alpha), eps = F(a.eps), l2 = F(a.l2), dec = F(a.decoupled),
          mom = F(a.momentum), c_in = F(a.c_in), c_out = F(a.c_out);
  for (int64_t i = 0; i < n; ++i) {
    const F pi = p[i] + dec * p[i];
    const F gi = g[i] + l2 * pi;
    F avg;
    if constexpr (TF) {
      const F s = sq[i] + w * (gi * gi - sq[i]);
      sq[i] = s;
      if constexpr (CENTERED) {
        const F m = ga[i] + w * (gi - ga[i]);
        ga[i] = m;
        avg = std::sqrt(s + F(-1) * m * m + eps);
      } else {
        avg = std::sqrt(s + eps);
      }
    } else {
      const F s = sq[i] * alpha + w * gi * gi;
      sq[i] = s;
      if constexpr (CENTERED) {
        const F m = ga[i] + w * (gi - ga[i]);
        ga[i] = m;
        avg = std::sqrt(s + F(-1) * m * m) + eps;
      } else {
        avg = std::sqrt(s) + eps;
      }
    }
    if constexpr (MOMENTUM) {
      const F b = buf[i] * mom + c_in * (gi / avg);
      buf[i] = b;
      p[i] = pi - c_out * b;
    } else {
      p[i] = pi - c_out * (gi / avg);
    }
  }
}
template <bool TF, bool CENTERED, bool MOMENTUM>
NPU_SIMD void rmsprop_f(float* p, const float* g, float* sq, float* ga, float* buf, int64_t n, const RmsArgs& a) {
  rmsprop_kernel<TF, CENTERED, MOMENTUM>(p, g, sq, ga, buf, n, a);
}
template <bool TF, bool CENTERED, bool MOMENTUM>
void rmsprop_f(double* p, const double* g, double* sq, double* ga, double* buf, int64_t n, const RmsArgs& a) {
  rmsprop_kernel<TF, CENTERED, MOMENTUM>(p, g, sq, ga, buf, n, a);
}

// Adadelta: sq = rho sq + (1-rho) g^2; delta = sqrt(acc+eps)/sqrt(sq+eps) g;
// acc = rho acc + (1-rho) delta^2; p -= lr delta.
struct AdadeltaArgs {
  double neg_lr, rho, one_minus_rho, eps, weight_decay;
};
template <typename F>
inline void adadelta_kernel(F* p, const F* g, F* sq, F* acc, int64_t n, const AdadeltaArgs& a) {
  const F neg_lr = F(a.neg_lr), rho = F(a.rho), w = F(a.one_minus_rho), eps = F(a.eps), wd = F(a.weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    const F gi = g[i] + wd * p[i];
    const F s = sq[i] * rho + w * gi * gi;
    const F delta = std::sqrt(acc[i] + eps) / std::sqrt(s + eps) * gi;
    sq[i] = s;
    acc[i] = acc[i] * rho + w * delta * delta;
    p[i] = p[i] + neg_lr * delta;
  }
}
NPU_SIMD void adadelta_f(float* p, const float* g, float* sq, float* acc, int64_t n, const AdadeltaArgs& a) {
  adadelta_kernel(p, g, sq, acc, n, a);
}
void adadelta_f(double* p, const double* g, double* sq, double* acc, int64_t n, const AdadeltaArgs& a) {
  adadelta_kernel(p, g, sq, acc, n, a);
}

// ---- segments: per-parameter (per-row) reductions over a combined buffer ---------------------

// The buffer is a sequence of segments (parameters), segment s of numels[s] elements viewed
// as rows[s] rows. A piece is a range of at most kPiece elements inside one segment; it
// writes K partial sums for each row it touches, reduced afterwards in a fixed order (so
// results do not depend on the thread count).
struct Segments {
  std::vector<int64_t> start, numel, rows, cols, row0;
  struct Piece {
    int64_t seg, begin, end, first_row, last_row, acc;
  };
  std::vector<Piece> pieces;
  int64_t total_rows = 0, partials = 0;
};

Segments plan_segments(const char* op, int64_t total, c10::IntArrayRef numels, c10::IntArrayRef rows) {
  Segments s;
  int64_t off = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t n = numels[i];
    const int64_t r = rows.empty() ? 1 : std::max<int64_t>(rows[i], 1);
    TORCH_CHECK(n >= 0, op, ": expected numels to be non-negative, got ", n, " at index ", i);
    TORCH_CHECK(n == 0 || n % r == 0, op, ": expected rows[", i, "] = ", r, " to divide numels[", i, "] = ", n);
    s.start.push_back(off);
    s.numel.push_back(n);
    s.rows.push_back(n == 0 ? 0 : r);
    s.cols.push_back(n == 0 ? 1 : n / r);
    s.row0.push_back(s.total_rows);
    s.total_rows += n == 0 ? 0 : r;
    for (int64_t b = 0; b < n; b += kPiece) {
      const int64_t e = std::min(n, b + kPiece);
      const int64_t c = s.cols.back();
      Segments::Piece piece{static_cast<int64_t>(i), off + b, off + e, b / c, (e - 1) / c, s.partials};
      s.partials += piece.last_row - piece.first_row + 1;
      s.pieces.push_back(piece);
    }
    off += n;
  }
  TORCH_CHECK(off == total, op, ": expected numels to add up to the buffer's ", total, " elements, got ", off);
  return s;
}

// Runs fn(piece, row, begin, end, partial) for every row-range of every piece in parallel
// (partial: the K sums of that row in that piece), then returns the K sums per row.
template <int K, typename Fn>
std::vector<double> reduce_rows(const Segments& s, Fn&& fn) {
  std::vector<double> partial(static_cast<size_t>(s.partials) * K, 0.0);
  at::parallel_for(0, static_cast<int64_t>(s.pieces.size()), 1, [&](int64_t pb, int64_t pe) {
    for (int64_t pi = pb; pi < pe; ++pi) {
      const auto& pc = s.pieces[pi];
      const int64_t st = s.start[pc.seg], c = s.cols[pc.seg];
      for (int64_t r = pc.first_row; r <= pc.last_row; ++r) {
        const int64_t b = std::max(pc.begin, st + r * c), e = std::min(pc.end, st + (r + 1) * c);
        fn(pc, r, b, e, &partial[(pc.acc + r - pc.first_row) * K]);
      }
    }
  });
  std::vector<double> sums(static_cast<size_t>(s.total_rows) * K, 0.0);
  for (const auto& pc : s.pieces) {
    for (int64_t r = pc.first_row; r <= pc.last_row; ++r) {
      for (int k = 0; k < K; ++k) sums[(s.row0[pc.seg] + r) * K + k] += partial[(pc.acc + r - pc.first_row) * K + k];
    }
  }
  return sums;
}

// Runs fn(piece, row, begin, end) for every row-range in parallel.
template <typename Fn>
void for_rows(const Segments& s, Fn&& fn) {
  at::parallel_for(0, static_cast<int64_t>(s.pieces.size()), 1, [&](int64_t pb, int64_t pe) {
    for (int64_t pi = pb; pi < pe; ++pi) {
      const auto& pc = s.pieces[pi];
      const int64_t st = s.start[pc.seg], c = s.cols[pc.seg];
      for (int64_t r = pc.first_row; r <= pc.last_row; ++r) {
        fn(pc, r, std::max(pc.begin, st + r * c), std::min(pc.end, st + (r + 1) * c));
      }
    }
  });
}

// ---- argument checks -------------------------------------------------------------------------

// `t` must be an npu tensor of param's dtype and number of elements, contiguous (flat buffers).
void check_like(const char* op, const char* arg, const Tensor& t, const Tensor& param) {
  if (!t.defined()) return;
  check_dtype(op, arg, t, param.scalar_type());
  TORCH_CHECK(t.numel() == param.numel(), op, ": expected ", arg, " to have ", param.numel(),
              " elements (as param), got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": expected ", arg, " to be contiguous");
}

// The last `optional` of `args` may be undefined (absent); the others are required (None
// from Python arrives as an undefined tensor even where the schema says Tensor).
c10::DeviceIndex check_buffers(const char* op, std::initializer_list<NamedTensor> args, size_t optional = 0) {
  size_t i = 0;
  for (const auto& a : args) {
    TORCH_CHECK(i++ >= args.size() - optional || a.tensor.defined(), op, ": expected ", a.name,
                " to be a tensor, got None");
  }
  const auto device = npu_device(op, args);
  const Tensor& param = args.begin()->tensor;
  check_float(op, args.begin()->name, param);
  for (const auto& a : args) check_like(op, a.name, a.tensor, param);
  return device;
}

template <typename T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.mutable_data_ptr<T>() : nullptr;
}

// ---- npu_apply_adam_w / npu_apply_adam (torch_npu's public ops) ------------------------------

void launch_adam(const char* op, c10::DeviceIndex device, const Tensor& var, const Tensor& grad, const Tensor& m,
                 const Tensor& v, const Tensor& vmax, int ams, const AdamArgs& args) {
  ops::launch_kernel(op, device, {var, grad, m, v, vmax}, var.numel(), [args, ams](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_adam_step", [&] {
      scalar_t* p = ptr<scalar_t>(t[0]);
      const scalar_t* g = t[1].const_data_ptr<scalar_t>();
      scalar_t* m = ptr<scalar_t>(t[2]);
      scalar_t* v = ptr<scalar_t>(t[3]);
      scalar_t* vmax = ptr<scalar_t>(t[4]);
      at::parallel_for(0, t[0].numel(), kGrain, [&](int64_t b, int64_t e) {
        blocked_inplace<scalar_t, 1, 4>({g}, {p, m, v, vmax}, b, e, [&](auto in, auto io, int64_t n) {
          if (ams == 0) adam_f<0>(io[0], in[0], io[1], io[2], io[3], n, args);
          else if (ams == 1) adam_f<1>(io[0], in[0], io[1], io[2], io[3], n, args);
          else adam_f<2>(io[0], in[0], io[1], io[2], io[3], n, args);
        });
      });
    });
  });
}

void check_same_shape(const char* op, const char* arg, const Tensor& t, const Tensor& grad) {
  TORCH_CHECK(t.sizes().equals(grad.sizes()), op, ": expected ", arg, " to have grad's shape ", grad.sizes(),
              ", got ", t.sizes());
}

std::tuple<Tensor&, Tensor&, Tensor&> npu_apply_adam_w_out(const at::Scalar& beta1_power,
                                                           const at::Scalar& beta2_power, const at::Scalar& lr,
                                                           const at::Scalar& weight_decay, const at::Scalar& beta1,
                                                           const at::Scalar& beta2, const at::Scalar& epsilon,
                                                           const Tensor& grad, const std::optional<Tensor>& max_grad_norm,
                                                           std::optional<bool> amsgrad, std::optional<bool> maximize,
                                                           Tensor& var, Tensor& m, Tensor& v) {
  constexpr const char* op = "npu_apply_adam_w";
  const bool ams = amsgrad.value_or(false);
  const Tensor vmax = ams && max_grad_norm.has_value() ? *max_grad_norm : Tensor();
  TORCH_CHECK(!ams || vmax.defined(), op, ": amsgrad=True requires max_grad_norm");
  const auto device = check_buffers(op, {{"var", var}, {"m", m}, {"v", v}, {"grad", grad}, {"max_grad_norm", vmax}}, 1);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"m", &m}, {"v", &v}, {"grad", &grad},
                                {"max_grad_norm", &vmax}}) {
    if (t->defined()) check_same_shape(op, name, *t, var);
  }
  const double b1 = beta1.toDouble(), b2 = beta2.toDouble(), lr_ = lr.toDouble();
  // beta*_power are beta^(t-1): the kernel advances them by one step, as Ascend's ApplyAdamW.
  // A bias correction of 0 (or below) gives inf / NaN, as on Ascend and in torch.optim.
  const double bc1 = 1.0 - beta1_power.toDouble() * b1;
  const double bc2 = 1.0 - beta2_power.toDouble() * b2;
  AdamArgs a{maximize.value_or(false) ? -1.0 : 1.0, 0.0, 1.0 - lr_ * weight_decay.toDouble(), b1, 1.0 - b1, b2,
             1.0 - b2, epsilon.toDouble(), lr_ / bc1, std::sqrt(bc2)};
  launch_adam(op, device, var, grad, m, v, vmax, ams ? 2 : 0, a);
  return {var, m, v};
}

std::tuple<Tensor, Tensor, Tensor> npu_apply_adam_w(const at::Scalar& beta1_power, const at::Scalar& beta2_power,
                                                    const at::Scalar& lr, const at::Scalar& weight_decay,
                                                    const at::Scalar& beta1, const at::Scalar& beta2,
                                                    const at::Scalar& epsilon, const Tensor& grad,
                                                    const std::optional<Tensor>& max_grad_norm,
                                                    std::optional<bool> amsgrad, std::optional<bool> maximize) {
  // The functional form starts from var = m = v = 0 (it has no inputs for them).
  Tensor var = at::zeros_like(grad, at::MemoryFormat::Contiguous), m = at::zeros_like(var), v = at::zeros_like(var);
  npu_apply_adam_w_out(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm, amsgrad,
                       maximize, var, m, v);
  return {var, m, v};
}

std::tuple<Tensor&, Tensor&, Tensor&> npu_apply_adam_out(const at::Scalar& beta1_power, const at::Scalar& beta2_power,
                                                         const at::Scalar& lr, const at::Scalar& beta1,
                                                         const at::Scalar& beta2, const at::Scalar& epsilon,
                                                         const Tensor& grad, std::optional<bool> use_locking,
                                                         std::optional<bool> use_nesterov, Tensor& var, Tensor& m,
                                                         Tensor& v) {
  constexpr const char* op = "npu_apply_adam";
  const auto device = check_buffers(op, {{"var", var}, {"m", m}, {"v", v}, {"grad", grad}});
  check_same_shape(op, "m", m, var);
  check_same_shape(op, "v", v, var);
  check_same_shape(op, "grad", grad, var);
  // beta*_power are beta^t here (TensorFlow's ApplyAdam); beta1_power 1 (no step yet) or beta2_power
  // above 1 give inf / NaN in var, as on Ascend (op-plugin's test_apply_adam passes 1 and reads v).
  const double b1p = beta1_power.toDouble(), b2p = beta2_power.toDouble();
  const double b1 = beta1.toDouble();
  TfAdamArgs a{lr.toDouble() * std::sqrt(1.0 - b2p) / (1.0 - b1p), b1, 1.0 - b1, 1.0 - beta2.toDouble(),
               epsilon.toDouble()};
  const bool nesterov = use_nesterov.value_or(false);
  ops::launch_kernel(op, device, {var, grad, m, v}, var.numel(), [a, nesterov](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_apply_adam", [&] {
      scalar_t* p = ptr<scalar_t>(t[0]);
      const scalar_t* g = t[1].const_data_ptr<scalar_t>();
      at::parallel_for(0, t[0].numel(), kGrain, [&](int64_t b, int64_t e) {
        blocked_inplace<scalar_t, 1, 3>({g}, {p, ptr<scalar_t>(t[2]), ptr<scalar_t>(t[3])}, b, e,
                                        [&](auto in, auto io, int64_t n) {
                                          if (nesterov) tf_adam_f<true>(io[0], in[0], io[1], io[2], n, a);
                                          else tf_adam_f<false>(io[0], in[0], io[1], io[2], n, a);
                                        });
      });
    });
  });
  return {var, m, v};
}

std::tuple<Tensor, Tensor, Tensor> npu_apply_adam(const at::Scalar& beta1_power, const at::Scalar& beta2_power,
                                                  const at::Scalar& lr, const at::Scalar& beta1,
                                                  const at::Scalar& beta2, const at::Scalar& epsilon,
                                                  const Tensor& grad, std::optional<bool> use_locking,
                                                  std::optional<bool> use_nesterov) {
  Tensor var = at::zeros_like(grad, at::MemoryFormat::Contiguous), m = at::zeros_like(var), v = at::zeros_like(var);
  npu_apply_adam_out(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, var, m, v);
  return {var, m, v};
}

// ---- the internal steps of torch_npu.optim ---------------------------------------------------

void npu_fused_adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                         const std::optional<Tensor>& max_exp_avg_sq, double lr, double beta1, double beta2,
                         double eps, double weight_decay, int64_t step, bool amsgrad, bool maximize,
                         bool decoupled_weight_decay) {
  constexpr const char* op = "_npu_fused_adam_step";
  const Tensor vmax = amsgrad && max_exp_avg_sq.has_value() ? *max_exp_avg_sq : Tensor();
  TORCH_CHECK(!amsgrad || vmax.defined(), op, ": amsgrad=True requires max_exp_avg_sq");
  TORCH_CHECK(step >= 1, op, ": expected step >= 1, got ", step);
  const auto device = check_buffers(op, {{"param", param}, {"grad", grad}, {"exp_avg", exp_avg},
                                         {"exp_avg_sq", exp_avg_sq}, {"max_exp_avg_sq", vmax}}, 1);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamArgs a{maximize ? -1.0 : 1.0,
             decoupled_weight_decay ? 0.0 : weight_decay,
             decoupled_weight_decay ? 1.0 - lr * weight_decay : 1.0,
             beta1,
             1.0 - beta1,
             beta2,
             1.0 - beta2,
             eps,
             lr / bc1,
             std::sqrt(bc2)};
  launch_adam(op, device, param, grad, exp_avg, exp_avg_sq, vmax, amsgrad ? 1 : 0, a);
}

void npu_fused_sgd_step(const Tensor& param, const Tensor& grad, const std::optional<Tensor>& momentum_buffer,
                        double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                        bool first_step) {
  constexpr const char* op = "_npu_fused_sgd_step";
  const Tensor buf = momentum != 0 && momentum_buffer.has_value() ? *momentum_buffer : Tensor();
  TORCH_CHECK(momentum == 0 || buf.defined(), op, ": momentum != 0 requires momentum_buffer");
  const auto device = check_buffers(op, {{"param", param}, {"grad", grad}, {"momentum_buffer", buf}}, 1);
  SgdArgs a{-lr, momentum, 1.0 - dampening, weight_decay};
  const int mode = momentum == 0 ? 0 : (1 + (nesterov ? 1 : 0) + (first_step ? 2 : 0));
  ops::launch_kernel(op, device, {param, grad, buf}, param.numel(), [a, mode](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "_npu_fused_sgd_step", [&] {
      const scalar_t* g = t[1].const_data_ptr<scalar_t>();
      at::parallel_for(0, t[0].numel(), kGrain, [&](int64_t b, int64_t e) {
        blocked_inplace<scalar_t, 1, 2>({g}, {ptr<scalar_t>(t[0]), ptr<scalar_t>(t[2])}, b, e,
                                        [&](auto in, auto io, int64_t n) {
                                          switch (mode) {
                                            case 0: sgd_f<false, false, false>(io[0], in[0], io[1], n, a); break;
                                            case 1: sgd_f<true, false, false>(io[0], in[0], io[1], n, a); break;
                                            case 2: sgd_f<true, true, false>(io[0], in[0], io[1], n, a); break;
                                            case 3: sgd_f<true, false, true>(io[0], in[0], io[1], n, a); break;
                                            default: sgd_f<true, true, true>(io[0], in[0], io[1], n, a); break;
                                          }
                                        });
      });
    });
  });
}

template <bool TF>
void rmsprop_step(const char* op, const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                  const std::optional<Tensor>& grad_avg, const std::optional<Tensor>& momentum_buffer, double lr,
                  double alpha, double eps, double weight_decay, double momentum, bool centered, bool decoupled_decay,
                  bool lr_in_momentum) {
  const Tensor ga = centered && grad_avg.has_value() ? *grad_avg : Tensor();
  const Tensor buf = momentum > 0 && momentum_buffer.has_value() ? *momentum_buffer : Tensor();
  TORCH_CHECK(!centered || ga.defined(), op, ": centered=True requires grad_avg");
  TORCH_CHECK(momentum <= 0 || buf.defined(), op, ": momentum > 0 requires momentum_buffer");
  const auto device = check_buffers(
      op, {{"param", param}, {"grad", grad}, {"square_avg", square_avg}, {"grad_avg", ga}, {"momentum_buffer", buf}},
      2);
  const bool decoupled = TF && decoupled_decay;
  const bool lr_in = TF && lr_in_momentum && momentum > 0;
  RmsArgs a{alpha, 1.0 - alpha, eps, decoupled ? 0.0 : weight_decay, decoupled ? -weight_decay : 0.0, momentum,
            lr_in ? lr : 1.0, lr_in ? 1.0 : lr};
  const int mode = (centered ? 1 : 0) + (momentum > 0 ? 2 : 0);
  ops::launch_kernel(op, device, {param, grad, square_avg, ga, buf}, param.numel(),
                     [a, mode](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "_npu_fused_rmsprop_step", [&] {
                         const scalar_t* g = t[1].const_data_ptr<scalar_t>();
                         at::parallel_for(0, t[0].numel(), kGrain, [&](int64_t b, int64_t e) {
                           blocked_inplace<scalar_t, 1, 4>(
                               {g}, {ptr<scalar_t>(t[0]), ptr<scalar_t>(t[2]), ptr<scalar_t>(t[3]), ptr<scalar_t>(t[4])},
                               b, e, [&](auto in, auto io, int64_t n) {
                                 switch (mode) {
                                   case 0: rmsprop_f<TF, false, false>(io[0], in[0], io[1], io[2], io[3], n, a); break;
                                   case 1: rmsprop_f<TF, true, false>(io[0], in[0], io[1], io[2], io[3], n, a); break;
                                   case 2: rmsprop_f<TF, false, true>(io[0], in[0], io[1], io[2], io[3], n, a); break;
                                   default: rmsprop_f<TF, true, true>(io[0], in[0], io[1], io[2], io[3], n, a); break;
                                 }
                               });
                         });
                       });
                     });
}

void npu_fused_rmsprop_step(const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                            const std::optional<Tensor>& grad_avg, const std::optional<Tensor>& momentum_buffer,
                            double lr, double alpha, double eps, double weight_decay, double momentum, bool centered) {
  rmsprop_step<false>("_npu_fused_rmsprop_step", param, grad, square_avg, grad_avg, momentum_buffer, lr, alpha, eps,
                      weight_decay, momentum, centered, false, false);
}

void npu_fused_rmsprop_tf_step(const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                               const std::optional<Tensor>& grad_avg, const std::optional<Tensor>& momentum_buffer,
                               double lr, double alpha, double eps, double weight_decay, double momentum,
                               bool centered, bool decoupled_decay, bool lr_in_momentum) {
  rmsprop_step<true>("_npu_fused_rmsprop_tf_step", param, grad, square_avg, grad_avg, momentum_buffer, lr, alpha, eps,
                     weight_decay, momentum, centered, decoupled_decay, lr_in_momentum);
}

void npu_fused_adadelta_step(const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                             const Tensor& acc_delta, double lr, double rho, double eps, double weight_decay) {
  constexpr const char* op = "_npu_fused_adadelta_step";
  const auto device =
      check_buffers(op, {{"param", param}, {"grad", grad}, {"square_avg", square_avg}, {"acc_delta", acc_delta}});
  AdadeltaArgs a{-lr, rho, 1.0 - rho, eps, weight_decay};
  ops::launch_kernel(op, device, {param, grad, square_avg, acc_delta}, param.numel(), [a](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_fused_optimizer_step", [&] {
      const scalar_t* g = t[1].const_data_ptr<scalar_t>();
      at::parallel_for(0, t[0].numel(), kGrain, [&](int64_t b, int64_t e) {
        blocked_inplace<scalar_t, 1, 3>({g}, {ptr<scalar_t>(t[0]), ptr<scalar_t>(t[2]), ptr<scalar_t>(t[3])}, b, e,
                                        [&](auto in, auto io, int64_t n) {
                                          adadelta_f(io[0], in[0], io[1], io[2], n, a);
                                        });
      });
    });
  });
}

// LAMB (torch_npu's NpuFusedLamb, no bias correction): g *= grad_scale; m, v as Adam;
// u = m / (sqrt(v) + eps) + wd p; per parameter trust = min(|p|, 10) / |u| (1 when either
// norm is 0, or adam=True); p -= lr trust u.
void npu_fused_lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                         c10::IntArrayRef numels, double lr, double beta1, double beta2, double eps,
                         double weight_decay, double grad_scale, bool adam) {
  constexpr const char* op = "_npu_fused_lamb_step";
  const auto device =
      check_buffers(op, {{"param", param}, {"grad", grad}, {"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}});
  auto segs = std::make_shared<Segments>(plan_segments(op, param.numel(), numels, {}));
  ops::launch_kernel(op, device, {param, grad, exp_avg, exp_avg_sq}, param.numel(), [=](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_fused_optimizer_step", [&] {
      using A = acc_t<scalar_t>;
      scalar_t* p = ptr<scalar_t>(t[0]);
      const scalar_t* g = t[1].const_data_ptr<scalar_t>();
      scalar_t* m = ptr<scalar_t>(t[2]);
      scalar_t* v = ptr<scalar_t>(t[3]);
      const A b1 = A(beta1), w1 = A(1 - beta1), b2 = A(beta2), w2 = A(1 - beta2), e = A(eps), wd = A(weight_decay),
              gs = A(grad_scale);
      const auto sums = reduce_rows<2>(*segs, [&](const Segments::Piece&, int64_t, int64_t b, int64_t en, double* acc) {
        double pp = 0, uu = 0;
        blocked_inplace<scalar_t, 2, 2>({p, g}, {m, v}, b, en, [&](auto in, auto io, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const A gi = in[1][i] * gs;
            const A mi = io[0][i] * b1 + w1 * gi;
            const A vi = io[1][i] * b2 + w2 * gi * gi;
            io[0][i] = mi;
            io[1][i] = vi;
          }
        });
        // The update from the stored (rounded) moments, as the second pass sees them.
        blocked_inplace<scalar_t, 3, 0>({p, m, v}, {}, b, en, [&](auto in, auto, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const A u = in[1][i] / (std::sqrt(in[2][i]) + e) + wd * in[0][i];
            pp += double(in[0][i]) * double(in[0][i]);
            uu += double(u) * double(u);
          }
        });
        acc[0] += pp;
        acc[1] += uu;
      });
      std::vector<A> trust(segs->numel.size(), A(1));
      if (!adam) {
        for (size_t s = 0; s < trust.size(); ++s) {
          if (segs->rows[s] == 0) continue;
          const double wn = std::min(std::sqrt(sums[segs->row0[s] * 2]), 10.0);
          const double an = std::sqrt(sums[segs->row0[s] * 2 + 1]);
          trust[s] = wn == 0 || an == 0 ? A(1) : A(wn / an);
        }
      }
      const A neg_lr = A(-lr);
      for_rows(*segs, [&](const Segments::Piece& pc, int64_t, int64_t b, int64_t en) {
        const A tr = trust[pc.seg];
        blocked_inplace<scalar_t, 2, 1>({m, v}, {p}, b, en, [&](auto in, auto io, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const A u = in[0][i] / (std::sqrt(in[1][i]) + e) + wd * io[0][i];
            io[0][i] = io[0][i] + neg_lr * (u * tr);
          }
        });
      });
    });
  });
}

// BertAdam (torch_npu's NpuFusedBertAdam): when max_grad_norm > 0 the whole buffer's grad is
// clipped to that 2-norm (and written back, clipped); m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr (m / (sqrt(v) + eps) + wd p) (wd only when > 0).
void npu_fused_bert_adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                              const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                              double weight_decay, double max_grad_norm) {
  constexpr const char* op = "_npu_fused_bert_adam_step";
  const auto device =
      check_buffers(op, {{"param", param}, {"grad", grad}, {"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}});
  const int64_t numel = param.numel();
  auto segs = std::make_shared<Segments>(plan_segments(op, numel, {numel}, {}));
  ops::launch_kernel(op, device, {param, grad, exp_avg, exp_avg_sq}, numel, [=](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_fused_optimizer_step", [&] {
      using A = acc_t<scalar_t>;
      scalar_t* p = ptr<scalar_t>(t[0]);
      scalar_t* g = ptr<scalar_t>(t[1]);
      scalar_t* m = ptr<scalar_t>(t[2]);
      scalar_t* v = ptr<scalar_t>(t[3]);
      double scale = 1.0;
      if (max_grad_norm > 0 && numel > 0) {
        const auto sums = reduce_rows<1>(*segs, [&](const Segments::Piece&, int64_t, int64_t b, int64_t e, double* acc) {
          double s = 0;
          for (int64_t i = b; i < e; ++i) s += double(A(g[i])) * double(A(g[i]));
          acc[0] += s;
        });
        const double coef = max_grad_norm / (std::sqrt(sums[0]) + 1e-6);
        if (coef < 1) scale = coef;
      }
      const A gs = A(scale), b1 = A(beta1), w1 = A(1 - beta1), b2 = A(beta2), w2 = A(1 - beta2), e = A(eps),
              wd = A(weight_decay > 0 ? weight_decay : 0), lr_ = A(lr);
      const bool clip = scale != 1.0;
      at::parallel_for(0, numel, kGrain, [&](int64_t b, int64_t en) {
        blocked_inplace<scalar_t, 0, 4>({}, {p, g, m, v}, b, en, [&](auto, auto io, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const A gi = clip ? io[1][i] * gs : io[1][i];
            const A mi = io[2][i] * b1 + w1 * gi;
            const A vi = io[3][i] * b2 + w2 * gi * gi;
            const A u = mi / (std::sqrt(vi) + e) + wd * io[0][i];
            io[0][i] = io[0][i] - lr_ * u;
            io[1][i] = gi;
            io[2][i] = mi;
            io[3][i] = vi;
          }
        });
      });
    });
  });
}

// AdamP (torch_npu's NpuFusedAdamP): Adam's moments with bias correction; perturb =
// (nesterov ? b1 m + (1-b1) g : m) / denom; for each parameter with rows[s] > 0 (dim > 1,
// rows = size(0)) the projection: if the channel-wise (per row) cosine similarity of grad
// and param stays below delta / sqrt(cols), perturb loses its component along each
// normalised row of p, and weight decay is scaled by wd_ratio; else the same test on the
// whole parameter (layer-wise). p = p (1 - lr wd ratio) - step_size perturb.
void npu_fused_adamp_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                          c10::IntArrayRef numels, c10::IntArrayRef rows, double lr, double beta1, double beta2,
                          double eps, double weight_decay, double delta, double wd_ratio, int64_t step,
                          bool nesterov) {
  constexpr const char* op = "_npu_fused_adamp_step";
  const auto device =
      check_buffers(op, {{"param", param}, {"grad", grad}, {"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}});
  TORCH_CHECK(rows.size() == numels.size(), op, ": expected rows and numels of the same length, got ", rows.size(),
              " and ", numels.size());
  TORCH_CHECK(step >= 1, op, ": expected step >= 1, got ", step);
  auto segs = std::make_shared<Segments>(plan_segments(op, param.numel(), numels, rows));
  std::vector<bool> project(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) project[i] = rows[i] > 0;
  ops::launch_kernel(op, device, {param, grad, exp_avg, exp_avg_sq}, param.numel(), [=](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_fused_optimizer_step", [&] {
      using A = acc_t<scalar_t>;
      scalar_t* p = ptr<scalar_t>(t[0]);
      const scalar_t* g = t[1].const_data_ptr<scalar_t>();
      scalar_t* m = ptr<scalar_t>(t[2]);
      scalar_t* v = ptr<scalar_t>(t[3]);
      const double bc1 = 1.0 - std::pow(beta1, double(step)), bc2 = 1.0 - std::pow(beta2, double(step));
      const A b1 = A(beta1), w1 = A(1 - beta1), b2 = A(beta2), w2 = A(1 - beta2), e = A(eps),
              bc2s = A(std::sqrt(bc2));
      auto perturb = [=](A gi, A mi, A vi) {
        const A denom = std::sqrt(vi) / bc2s + e;
        return (nesterov ? b1 * mi + w1 * gi : mi) / denom;
      };
      // Pass 1: moments; per row: g.g, p.p, g.p, p.perturb.
      const auto sums = reduce_rows<4>(*segs, [&](const Segments::Piece& pc, int64_t, int64_t b, int64_t en,
                                                  double* acc) {
        blocked_inplace<scalar_t, 1, 2>({g}, {m, v}, b, en, [&](auto in, auto io, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const A gi = in[0][i];
            io[0][i] = io[0][i] * b1 + w1 * gi;
            io[1][i] = io[1][i] * b2 + w2 * gi * gi;
          }
        });
        if (!project[pc.seg]) return;
        double gg = 0, pp = 0, gp = 0, pu = 0;
        blocked_inplace<scalar_t, 4, 0>({p, g, m, v}, {}, b, en, [&](auto in, auto, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const double pi = in[0][i], gi = in[1][i];
            gg += gi * gi;
            pp += pi * pi;
            gp += gi * pi;
            pu += pi * double(perturb(in[1][i], in[2][i], in[3][i]));
          }
        });
        acc[0] += gg;
        acc[1] += pp;
        acc[2] += gp;
        acc[3] += pu;
      });
      // Per parameter: which projection (coefficient per row: perturb -= c_row p) and decay.
      std::vector<A> coef(segs->total_rows, A(0));
      std::vector<A> decay(segs->numel.size(), A(1 - lr * weight_decay));
      for (size_t s = 0; s < segs->numel.size(); ++s) {
        if (!project[s] || segs->rows[s] == 0) continue;
        const int64_t r0 = segs->row0[s], nr = segs->rows[s];
        double max_cos = 0;
        double tgg = 0, tpp = 0, tgp = 0, tpu = 0;
        for (int64_t r = 0; r < nr; ++r) {
          const double* a = &sums[(r0 + r) * 4];
          max_cos = std::max(max_cos, std::abs(a[2]) / (std::sqrt(a[0]) + eps) / (std::sqrt(a[1]) + eps));
          tgg += a[0];
          tpp += a[1];
          tgp += a[2];
          tpu += a[3];
        }
        bool projected = false;
        if (max_cos < delta / std::sqrt(double(segs->cols[s]))) {
          for (int64_t r = 0; r < nr; ++r) {
            const double* a = &sums[(r0 + r) * 4];
            const double norm = std::sqrt(a[1]) + eps;
            coef[r0 + r] = A(a[3] / (norm * norm));
          }
          projected = true;
        } else {
          const double cos = std::abs(tgp) / (std::sqrt(tgg) + eps) / (std::sqrt(tpp) + eps);
          if (cos < delta / std::sqrt(double(segs->numel[s]))) {
            const double norm = std::sqrt(tpp) + eps;
            for (int64_t r = 0; r < nr; ++r) coef[r0 + r] = A(tpu / (norm * norm));
            projected = true;
          }
        }
        if (projected) decay[s] = A(1 - lr * weight_decay * wd_ratio);
      }
      if (weight_decay <= 0) std::fill(decay.begin(), decay.end(), A(1));
      const A step_size = A(lr / bc1);
      // Pass 2: p = p decay - step_size (perturb - c_row p).
      for_rows(*segs, [&](const Segments::Piece& pc, int64_t r, int64_t b, int64_t en) {
        const A c = project[pc.seg] ? coef[segs->row0[pc.seg] + r] : A(0), d = decay[pc.seg];
        blocked_inplace<scalar_t, 3, 1>({g, m, v}, {p}, b, en, [&](auto in, auto io, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const A u = perturb(in[0][i], in[1][i], in[2][i]) - c * io[0][i];
            io[0][i] = io[0][i] * d - step_size * u;
          }
        });
      });
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def(
      "npu_apply_adam_w(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar weight_decay, Scalar beta1, "
      "Scalar beta2, Scalar epsilon, Tensor grad, Tensor? max_grad_norm, bool? amsgrad, bool? maximize) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "npu_apply_adam_w.out(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar weight_decay, Scalar beta1, "
      "Scalar beta2, Scalar epsilon, Tensor grad, Tensor? max_grad_norm, bool? amsgrad, bool? maximize, *, "
      "Tensor(a!) var, Tensor(b!) m, Tensor(c!) v) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  m.def(
      "npu_apply_adam(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar beta1, Scalar beta2, "
      "Scalar epsilon, Tensor grad, bool? use_locking, bool? use_nesterov) -> (Tensor, Tensor, Tensor)");
  m.def(
      "npu_apply_adam.out(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar beta1, Scalar beta2, "
      "Scalar epsilon, Tensor grad, bool? use_locking, bool? use_nesterov, *, Tensor(a!) var, Tensor(b!) m, "
      "Tensor(c!) v) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  m.def(
      "_npu_fused_adam_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, "
      "Tensor(d!)? max_exp_avg_sq, float lr, float beta1, float beta2, float eps, float weight_decay, int step, "
      "bool amsgrad=False, bool maximize=False, bool decoupled_weight_decay=False) -> ()");
  m.def(
      "_npu_fused_sgd_step(Tensor(a!) param, Tensor grad, Tensor(b!)? momentum_buffer, float lr, float momentum, "
      "float dampening, float weight_decay, bool nesterov, bool first_step) -> ()");
  m.def(
      "_npu_fused_rmsprop_step(Tensor(a!) param, Tensor grad, Tensor(b!) square_avg, Tensor(c!)? grad_avg, "
      "Tensor(d!)? momentum_buffer, float lr, float alpha, float eps, float weight_decay, float momentum, "
      "bool centered) -> ()");
  m.def(
      "_npu_fused_rmsprop_tf_step(Tensor(a!) param, Tensor grad, Tensor(b!) square_avg, Tensor(c!)? grad_avg, "
      "Tensor(d!)? momentum_buffer, float lr, float alpha, float eps, float weight_decay, float momentum, "
      "bool centered, bool decoupled_decay, bool lr_in_momentum) -> ()");
  m.def(
      "_npu_fused_adadelta_step(Tensor(a!) param, Tensor grad, Tensor(b!) square_avg, Tensor(c!) acc_delta, "
      "float lr, float rho, float eps, float weight_decay) -> ()");
  m.def(
      "_npu_fused_lamb_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, int[] numels, "
      "float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, bool adam) -> ()");
  m.def(
      "_npu_fused_bert_adam_step(Tensor(a!) param, Tensor(b!) grad, Tensor(c!) exp_avg, Tensor(d!) exp_avg_sq, "
      "float lr, float beta1, float beta2, float eps, float weight_decay, float max_grad_norm) -> ()");
  m.def(
      "_npu_fused_adamp_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, "
      "int[] numels, int[] rows, float lr, float beta1, float beta2, float eps, float weight_decay, float delta, "
      "float wd_ratio, int step, bool nesterov) -> ()");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_apply_adam_w", TORCH_FN(npu_apply_adam_w));
  m.impl("npu_apply_adam_w.out", TORCH_FN(npu_apply_adam_w_out));
  m.impl("npu_apply_adam", TORCH_FN(npu_apply_adam));
  m.impl("npu_apply_adam.out", TORCH_FN(npu_apply_adam_out));
  m.impl("_npu_fused_adam_step", TORCH_FN(npu_fused_adam_step));
  m.impl("_npu_fused_sgd_step", TORCH_FN(npu_fused_sgd_step));
  m.impl("_npu_fused_rmsprop_step", TORCH_FN(npu_fused_rmsprop_step));
  m.impl("_npu_fused_rmsprop_tf_step", TORCH_FN(npu_fused_rmsprop_tf_step));
  m.impl("_npu_fused_adadelta_step", TORCH_FN(npu_fused_adadelta_step));
  m.impl("_npu_fused_lamb_step", TORCH_FN(npu_fused_lamb_step));
  m.impl("_npu_fused_bert_adam_step", TORCH_FN(npu_fused_bert_adam_step));
  m.impl("_npu_fused_adamp_step", TORCH_FN(npu_fused_adamp_step));
}

}  // namespace torch_npu::custom_ops
