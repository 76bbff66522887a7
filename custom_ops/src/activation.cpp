// Activations and position embeddings: npu_swiglu, npu_geglu, npu_fast_gelu,
// npu_rotary_mul, npu_apply_rotary_pos_emb, npu_scaled_masked_softmax,
// npu_dropout_with_add_softmax, npu_confusion_transpose; forward, backward, autograd.
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum_to_size.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>
#include <string_view>

#include "fused.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using vmath::acc_t;

constexpr int64_t kGrain = 16384;  // elements per task: below this one thread does it all

// ---- elementwise kernels on arrays of float (multiversioned) or double -------------------

template <typename F>
inline void swiglu_kernel(const F* a, const F* b, F* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * vmath::sigmoid(a[i]) * b[i];
}
template <typename F>
inline void swiglu_grad_kernel(const F* g, const F* a, const F* b, F* da, F* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const F s = vmath::sigmoid(a[i]);
    da[i] = g[i] * b[i] * s * (F(1) + a[i] * (F(1) - s));
    db[i] = g[i] * a[i] * s;
  }
}
// fast_gelu as Ascend 910B computes it: x * sigmoid(1.702 x).
template <typename F>
inline void fast_gelu_kernel(const F* x, F* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * vmath::sigmoid(F(1.702) * x[i]);
}
template <typename F>
inline void fast_gelu_grad_kernel(const F* g, const F* x, F* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const F s = vmath::sigmoid(F(1.702) * x[i]);
    dx[i] = g[i] * (s + F(1.702) * x[i] * s * (F(1) - s));
  }
}
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
// gelu (approximate 1 = tanh, 0 = erf) of the activated half times the other half.
template <typename F>
inline void geglu_kernel(const F* act, const F* other, F* y, F* gelu, int64_t n, bool tanh_approx) {
  for (int64_t i = 0; i < n; ++i) {
    const F x = act[i];
    const F g = tanh_approx ? F(0.5) * x * (F(1) + vmath::tanh(F(kSqrt2OverPi) * (x + F(kGeluCubic) * x * x * x)))
                            : F(0.5) * x * (F(1) + std::erf(x * F(M_SQRT1_2)));
    gelu[i] = g;
    y[i] = g * other[i];
  }
}
template <typename F>
inline void geglu_grad_kernel(const F* grad, const F* act, const F* other, const F* gelu, F* dact, F* dother,
                              int64_t n, bool tanh_approx) {
  for (int64_t i = 0; i < n; ++i) {
    const F x = act[i];
    F d;
    if (tanh_approx) {
      const F t = vmath::tanh(F(kSqrt2OverPi) * (x + F(kGeluCubic) * x * x * x));
      d = F(0.5) * (F(1) + t) +
          F(0.5) * x * (F(1) - t * t) * F(kSqrt2OverPi) * (F(1) + F(3 * kGeluCubic) * x * x);
    } else {
      d = F(0.5) * (F(1) + std::erf(x * F(M_SQRT1_2))) + x * vmath::exp(F(-0.5) * x * x) * F(0.3989422804014327);
    }
    dact[i] = grad[i] * other[i] * d;
    dother[i] = grad[i] * gelu[i];
  }
}

// Multiversioned float entry points; the double ones (gradcheck) are plain.
NPU_SIMD void swiglu_f(const float* a, const float* b, float* y, int64_t n) { swiglu_kernel(a, b, y, n); }
void swiglu_f(const double* a, const double* b, double* y, int64_t n) { swiglu_kernel(a, b, y, n); }
NPU_SIMD void swiglu_grad_f(const float* g, const float* a, const float* b, float* da, float* db, int64_t n) {
  swiglu_grad_kernel(g, a, b, da, db, n);
}
void swiglu_grad_f(const double* g, const double* a, const double* b, double* da, double* db, int64_t n) {
  swiglu_grad_kernel(g, a, b, da, db, n);
}
NPU_SIMD void fast_gelu_f(const float* x, float* y, int64_t n) { fast_gelu_kernel(x, y, n); }
void fast_gelu_f(const double* x, double* y, int64_t n) { fast_gelu_kernel(x, y, n); }
NPU_SIMD void fast_gelu_grad_f(const float* g, const float* x, float* dx, int64_t n) {
  fast_gelu_grad_kernel(g, x, dx, n);
}
void fast_gelu_grad_f(const double* g, const double* x, double* dx, int64_t n) { fast_gelu_grad_kernel(g, x, dx, n); }
NPU_SIMD void geglu_f(const float* a, const float* o, float* y, float* gelu, int64_t n, bool tanh_approx) {
  geglu_kernel(a, o, y, gelu, n, tanh_approx);
}
void geglu_f(const double* a, const double* o, double* y, double* gelu, int64_t n, bool tanh_approx) {
  geglu_kernel(a, o, y, gelu, n, tanh_approx);
}
NPU_SIMD void geglu_grad_f(const float* g, const float* a, const float* o, const float* gelu, float* da, float* dob,
                           int64_t n, bool tanh_approx) {
  geglu_grad_kernel(g, a, o, gelu, da, dob, n, tanh_approx);
}
void geglu_grad_f(const double* g, const double* a, const double* o, const double* gelu, double* da, double* dob,
                  int64_t n, bool tanh_approx) {
  geglu_grad_kernel(g, a, o, gelu, da, dob, n, tanh_approx);
}

// ---- gated linear units: the input split in two halves along `dim` ------------------------

// x viewed as [outer, 2, half] (half = size(dim)/2 * the trailing sizes): element j of
// outer row o is A at o*2*half + j and B at o*2*half + half + j.
struct GluShape {
  int64_t dim = 0;
  int64_t outer = 0;
  int64_t half = 0;
  std::vector<int64_t> out_sizes;
};

GluShape glu_shape(const char* op, const Tensor& x, int64_t dim) {
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK(dim >= -nd && dim < nd, op, ": expected dim in [", -nd, ", ", nd - 1, "], got ", dim);
  TORCH_CHECK(x.dim() >= 1, op, ": expected self to have at least 1 dimension, got a scalar");
  GluShape s;
  s.dim = dim < 0 ? dim + nd : dim;
  TORCH_CHECK(x.size(s.dim) % 2 == 0, op, ": expected self's size in dim ", dim, " to be even, got shape ",
              x.sizes());
  s.out_sizes = x.sizes().vec();
  s.out_sizes[s.dim] /= 2;
  int64_t inner = 1;
  for (int64_t d = s.dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  s.half = s.out_sizes[s.dim] * inner;
  s.outer = 1;
  for (int64_t d = 0; d < s.dim; ++d) s.outer *= x.size(d);
  return s;
}

// Calls fn(o, j0, j1) for the pieces of the flat output range [begin, end), one outer row each.
template <typename Fn>
void for_glu_rows(int64_t begin, int64_t end, int64_t half, Fn&& fn) {
  for (int64_t i = begin; i < end;) {
    const int64_t o = i / half;
    const int64_t j0 = i - o * half;
    const int64_t j1 = std::min(half, j0 + (end - i));
    fn(o, j0, j1);
    i += j1 - j0;
  }
}

Tensor npu_swiglu(const Tensor& self, int64_t dim) {
  constexpr const char* op = "npu_swiglu";
  const auto device = npu_device(op, {{"self", self}});
  check_float(op, "self", self);
  const GluShape s = glu_shape(op, self, dim);
  Tensor y = at::empty(s.out_sizes, self.options());
  ops::launch_kernel(op, device, {dense(self), y}, self.numel(), [s](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_swiglu", [&] {
      const auto* x = t[0].const_data_ptr<scalar_t>();
      auto* y = t[1].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, s.outer * s.half, kGrain, [&](int64_t b, int64_t e) {
        for_glu_rows(b, e, s.half, [&](int64_t o, int64_t j0, int64_t j1) {
          const scalar_t* a = x + o * 2 * s.half;
          vmath::blocked<scalar_t, 2, 1>({a, a + s.half}, {y + o * s.half}, j0, j1,
                                         [](auto in, auto out, int64_t n) { swiglu_f(in[0], in[1], out[0], n); });
        });
      });
    });
  });
  return y;
}

Tensor npu_swiglu_backward(const Tensor& grad_output, const Tensor& self, int64_t dim) {
  constexpr const char* op = "npu_swiglu_backward";
  const auto device = npu_device(op, {{"grad_output", grad_output}, {"self", self}});
  check_float(op, "self", self);
  check_dtype(op, "grad_output", grad_output, self.scalar_type());
  const GluShape s = glu_shape(op, self, dim);
  TORCH_CHECK(grad_output.sizes().equals(s.out_sizes), op, ": expected grad_output of shape ",
              c10::IntArrayRef(s.out_sizes), ", got ", grad_output.sizes());
  Tensor dx = at::empty(self.sizes(), self.options());
  ops::launch_kernel(op, device, {dense(grad_output), dense(self), dx}, self.numel(), [s](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_swiglu_backward", [&] {
      const auto* g = t[0].const_data_ptr<scalar_t>();
      const auto* x = t[1].const_data_ptr<scalar_t>();
      auto* dx = t[2].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, s.outer * s.half, kGrain, [&](int64_t b, int64_t e) {
        for_glu_rows(b, e, s.half, [&](int64_t o, int64_t j0, int64_t j1) {
          const scalar_t* a = x + o * 2 * s.half;
          scalar_t* da = dx + o * 2 * s.half;
          vmath::blocked<scalar_t, 3, 2>({g + o * s.half, a, a + s.half}, {da, da + s.half}, j0, j1,
                                         [](auto in, auto out, int64_t n) {
                                           swiglu_grad_f(in[0], in[1], in[2], out[0], out[1], n);
                                         });
        });
      });
    });
  });
  return dx;
}

// GeGLU: gelu of one half (the right one unless activate_left) times the other.
std::tuple<Tensor, Tensor> npu_geglu(const Tensor& self, int64_t dim, int64_t approximate, bool activate_left) {
  constexpr const char* op = "npu_geglu";
  const auto device = npu_device(op, {{"self", self}});
  check_float(op, "self", self);
  TORCH_CHECK(approximate == 0 || approximate == 1, op, ": expected approximate to be 0 (erf) or 1 (tanh), got ",
              approximate);
  const GluShape s = glu_shape(op, self, dim);
  Tensor y = at::empty(s.out_sizes, self.options());
  Tensor gelu = at::empty(s.out_sizes, self.options());
  const bool tanh_approx = approximate == 1;
  ops::launch_kernel(op, device, {dense(self), y, gelu}, self.numel(),
                     [s, tanh_approx, activate_left](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_geglu", [&] {
                         const auto* x = t[0].const_data_ptr<scalar_t>();
                         auto* y = t[1].mutable_data_ptr<scalar_t>();
                         auto* gl = t[2].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, s.outer * s.half, kGrain, [&](int64_t b, int64_t e) {
                           for_glu_rows(b, e, s.half, [&](int64_t o, int64_t j0, int64_t j1) {
                             const scalar_t* left = x + o * 2 * s.half;
                             const scalar_t* act = activate_left ? left : left + s.half;
                             const scalar_t* other = activate_left ? left + s.half : left;
                             vmath::blocked<scalar_t, 2, 2>(
                                 {act, other}, {y + o * s.half, gl + o * s.half}, j0, j1,
                                 [&](auto in, auto out, int64_t n) { geglu_f(in[0], in[1], out[0], out[1], n, tanh_approx); });
                           });
                         });
                       });
                     });
  return {y, gelu};
}

Tensor npu_geglu_grad(const Tensor& grad_output, const Tensor& self, const Tensor& gelu, int64_t dim,
                      int64_t approximate, bool activate_left) {
  constexpr const char* op = "npu_geglu_grad";
  const auto device = npu_device(op, {{"grad_output", grad_output}, {"self", self}, {"gelu", gelu}});
  check_float(op, "self", self);
  check_dtype(op, "grad_output", grad_output, self.scalar_type());
  check_dtype(op, "gelu", gelu, self.scalar_type());
  TORCH_CHECK(approximate == 0 || approximate == 1, op, ": expected approximate to be 0 (erf) or 1 (tanh), got ",
              approximate);
  const GluShape s = glu_shape(op, self, dim);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"grad_output", grad_output}, {"gelu", gelu}}) {
    TORCH_CHECK(t.sizes().equals(s.out_sizes), op, ": expected ", name, " of shape ", c10::IntArrayRef(s.out_sizes),
                ", got ", t.sizes());
  }
  Tensor dx = at::empty(self.sizes(), self.options());
  const bool tanh_approx = approximate == 1;
  ops::launch_kernel(op, device, {dense(grad_output), dense(self), dense(gelu), dx}, self.numel(),
                     [s, tanh_approx, activate_left](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_geglu_grad", [&] {
                         const auto* g = t[0].const_data_ptr<scalar_t>();
                         const auto* x = t[1].const_data_ptr<scalar_t>();
                         const auto* gl = t[2].const_data_ptr<scalar_t>();
                         auto* dx = t[3].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, s.outer * s.half, kGrain, [&](int64_t b, int64_t e) {
                           for_glu_rows(b, e, s.half, [&](int64_t o, int64_t j0, int64_t j1) {
                             const int64_t act_off = activate_left ? 0 : s.half;
                             const int64_t other_off = s.half - act_off;
                             const scalar_t* row = x + o * 2 * s.half;
                             scalar_t* drow = dx + o * 2 * s.half;
                             vmath::blocked<scalar_t, 4, 2>(
                                 {g + o * s.half, row + act_off, row + other_off, gl + o * s.half},
                                 {drow + act_off, drow + other_off}, j0, j1, [&](auto in, auto out, int64_t n) {
                                   geglu_grad_f(in[0], in[1], in[2], in[3], out[0], out[1], n, tanh_approx);
                                 });
                           });
                         });
                       });
                     });
  return dx;
}

Tensor npu_fast_gelu(const Tensor& self) {
  constexpr const char* op = "npu_fast_gelu";
  const auto device = npu_device(op, {{"self", self}});
  check_float(op, "self", self);
  Tensor y = at::empty(self.sizes(), self.options());
  ops::launch_kernel(op, device, {dense(self), y}, self.numel(), [](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_fast_gelu", [&] {
      const auto* x = t[0].const_data_ptr<scalar_t>();
      auto* y = t[1].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, t[0].numel(), kGrain, [&](int64_t b, int64_t e) {
        vmath::blocked<scalar_t, 1, 1>({x}, {y}, b, e, [](auto in, auto out, int64_t n) { fast_gelu_f(in[0], out[0], n); });
      });
    });
  });
  return y;
}

Tensor npu_fast_gelu_backward(const Tensor& grad, const Tensor& self) {
  constexpr const char* op = "npu_fast_gelu_backward";
  const auto device = npu_device(op, {{"grad", grad}, {"self", self}});
  check_float(op, "self", self);
  check_dtype(op, "grad", grad, self.scalar_type());
  TORCH_CHECK(grad.sizes().equals(self.sizes()), op, ": expected grad of shape ", self.sizes(), ", got ", grad.sizes());
  Tensor dx = at::empty(self.sizes(), self.options());
  ops::launch_kernel(op, device, {dense(grad), dense(self), dx}, self.numel(), [](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_fast_gelu_backward", [&] {
      const auto* g = t[0].const_data_ptr<scalar_t>();
      const auto* x = t[1].const_data_ptr<scalar_t>();
      auto* dx = t[2].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, t[1].numel(), kGrain, [&](int64_t b, int64_t e) {
        vmath::blocked<scalar_t, 2, 1>({g, x}, {dx}, b, e,
                                       [](auto in, auto out, int64_t n) { fast_gelu_grad_f(in[0], in[1], out[0], n); });
      });
    });
  });
  return dx;
}

// ---- rotary position embedding -----------------------------------------------------------

// Element offsets of the rows of a tensor broadcast to `sizes` (its last dimension
// excluded): row r of the broadcast shape starts at offset(r).
struct RowIndexer {
  std::vector<int64_t> sizes, strides;  // leading dims, innermost last
  RowIndexer(const Tensor& t, c10::IntArrayRef full) {
    const auto e = t.expand(full);
    sizes.assign(full.begin(), full.end() - 1);
    strides.assign(e.strides().begin(), e.strides().end() - 1);
  }
  int64_t offset(int64_t row) const {
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0 && row > 0; --d) {
      off += (row % sizes[d]) * strides[d];
      row /= sizes[d];
    }
    return off;
  }
};

enum class RotaryMode { kHalf, kInterleave };

RotaryMode rotary_mode(const char* op, c10::string_view mode) {
  if (mode == "half") return RotaryMode::kHalf;
  if (mode == "interleave") return RotaryMode::kInterleave;
  TORCH_CHECK(false, "The rotary_mode of ", op, " should be half or interleave, but got ", mode);  // torch_npu's text
}

// The rotated partner of element j of a row of length d, and its sign:
// half: rot(x) = cat(-x2, x1); interleave: pairs (x0, x1) -> (-x1, x0).
inline int64_t partner(RotaryMode m, int64_t j, int64_t d, float* sign) {
  if (m == RotaryMode::kHalf) {
    const int64_t h = d / 2;
    *sign = j < h ? -1.f : 1.f;
    return j < h ? j + h : j - h;
  }
  *sign = (j & 1) ? 1.f : -1.f;
  return j ^ 1;
}

// y = x * c + rot(x) * s on one row of `d` (of `width`) elements; x is widened first so
// that y may be x (in-place application). Elements from d to width are copied.
template <typename T, typename R>
void rotary_row(const T* x, const R* c, const R* s, T* y, int64_t d, int64_t width, RotaryMode m,
                acc_t<T>* buf) {
  for (int64_t j = 0; j < d; ++j) buf[j] = static_cast<acc_t<T>>(x[j]);
  for (int64_t j = 0; j < d; ++j) {
    float sign;
    const int64_t p = partner(m, j, d, &sign);
    y[j] = static_cast<T>(buf[j] * static_cast<acc_t<T>>(c[j]) + sign * buf[p] * static_cast<acc_t<T>>(s[j]));
  }
  if (y != x) {
    for (int64_t j = d; j < width; ++j) y[j] = x[j];
  }
}

// Applies rotary_row to every row of dense x ([..., width]), with c and s broadcast to
// x's leading shape (their last dimension, d, dense).
void rotary_launch(const char* op, const Tensor& x, const Tensor& c, const Tensor& s, const Tensor& y, RotaryMode m) {
  const int64_t width = x.size(-1);
  const int64_t d = c.size(-1);
  std::vector<int64_t> full = x.sizes().vec();
  full.back() = d;
  RowIndexer ci(c, full), si(s, full);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  ops::launch_kernel(op, x.device().index(), {x, c, s, y}, x.numel(),
                     [ci, si, rows, width, d, m](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "rotary", [&] {
                         using T = scalar_t;
                         const T* x = t[0].const_data_ptr<T>();
                         const T* c = t[1].const_data_ptr<T>();
                         const T* s = t[2].const_data_ptr<T>();
                         T* y = t[3].mutable_data_ptr<T>();
                         at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(width, 1)),
                                          [&](int64_t b, int64_t e) {
                                            std::vector<acc_t<T>> buf(d);
                                            for (int64_t r = b; r < e; ++r) {
                                              rotary_row(x + r * width, c + ci.offset(r), s + si.offset(r),
                                                         y + r * width, d, width, m, buf.data());
                                            }
                                          });
                       });
                     });
}

void check_rotary_coeff(const char* op, const char* name, const Tensor& r, const Tensor& x, bool full_width) {
  check_dtype(op, name, r, x.scalar_type());
  TORCH_CHECK(r.dim() == x.dim(), op, ": expected ", name, " to have ", x.dim(), " dimensions like the input, got shape ",
              r.sizes());
  for (int64_t i = 0; i + 1 < x.dim(); ++i) {
    TORCH_CHECK(r.size(i) == 1 || r.size(i) == x.size(i), op, ": expected ", name, "'s shape ", r.sizes(),
                " to broadcast to the input's ", x.sizes(), " (each dimension but the last 1 or equal)");
  }
  if (full_width) {
    TORCH_CHECK(r.size(-1) == x.size(-1), op, ": expected ", name, "'s last dimension to be ", x.size(-1), ", got shape ",
                r.sizes());
  } else {
    TORCH_CHECK(r.size(-1) <= x.size(-1), op, ": expected ", name, "'s last dimension to be at most ", x.size(-1),
                ", got shape ", r.sizes());
  }
}

Tensor npu_rotary_mul(const Tensor& self, const Tensor& r1, const Tensor& r2, c10::string_view mode,
                      const std::optional<Tensor>& rotate) {
  constexpr const char* op = "npu_rotary_mul";
  npu_device(op, {{"self", self}, {"r1", r1}, {"r2", r2}, {"rotate", rotate.value_or(Tensor())}});
  check_float(op, "self", self);
  TORCH_CHECK(self.dim() == 3 || self.dim() == 4, op, ": expected self to be 3- or 4-dimensional, got shape ",
              self.sizes());
  check_rotary_coeff(op, "r1", r1, self, true);
  check_rotary_coeff(op, "r2", r2, self, true);
  const RotaryMode m = rotary_mode(op, mode);
  TORCH_CHECK(self.size(-1) % 2 == 0, op, ": expected the last dimension of self to be even, got shape ", self.sizes());
  if (rotate.has_value() && rotate->defined()) {
    // rotate(x) = x @ rotate: a matrix product, then the fused multiply-add.
    const int64_t d = self.size(-1);
    TORCH_CHECK(rotate->dim() == 2 && rotate->size(0) == d && rotate->size(1) == d, op,
                ": expected rotate of shape [", d, ", ", d, "], got ", rotate->sizes());
    return at::add(at::mul(self, r1), at::mul(at::matmul(self, *rotate), r2));
  }
  Tensor y = at::empty(self.sizes(), self.options());
  rotary_launch(op, dense(self), dense(r1), dense(r2), y, m);
  return y;
}

std::tuple<Tensor, Tensor, Tensor> npu_rotary_mul_backward(const Tensor& grad, const Tensor& self, const Tensor& r1,
                                                           const Tensor& r2, c10::string_view mode) {
  constexpr const char* op = "npu_rotary_mul_backward";
  const auto device = npu_device(op, {{"grad", grad}, {"self", self}, {"r1", r1}, {"r2", r2}});
  check_float(op, "self", self);
  check_dtype(op, "grad", grad, self.scalar_type());
  TORCH_CHECK(grad.sizes().equals(self.sizes()), op, ": expected grad of shape ", self.sizes(), ", got ", grad.sizes());
  check_rotary_coeff(op, "r1", r1, self, true);
  check_rotary_coeff(op, "r2", r2, self, true);
  const RotaryMode m = rotary_mode(op, mode);
  const int64_t d = self.size(-1);
  // dx = g*c + rot^T(g*s); per element: d(r1) = g*x and d(r2) = g*rot(x), summed to
  // r1's and r2's shapes afterwards.
  Tensor dx = at::empty(self.sizes(), self.options());
  // The per-element products are kept in the compute type and summed there.
  const auto acc_dtype = self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor gx = at::empty(self.sizes(), self.options().dtype(acc_dtype));
  Tensor grot = at::empty(self.sizes(), self.options().dtype(acc_dtype));
  RowIndexer ci(r1, self.sizes()), si(r2, self.sizes());
  const int64_t rows = d == 0 ? 0 : self.numel() / d;
  ops::launch_kernel(op, device, {dense(grad), dense(self), dense(r1), dense(r2), dx, gx, grot}, self.numel(),
                     [ci, si, rows, d, m](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_rotary_mul_backward", [&] {
                         using T = scalar_t;
                         using A = acc_t<T>;
                         const T* g = t[0].const_data_ptr<T>();
                         const T* x = t[1].const_data_ptr<T>();
                         const T* c0 = t[2].const_data_ptr<T>();
                         const T* s0 = t[3].const_data_ptr<T>();
                         T* dx = t[4].mutable_data_ptr<T>();
                         A* gx = t[5].mutable_data_ptr<A>();
                         A* grot = t[6].mutable_data_ptr<A>();
                         at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1)),
                                          [&](int64_t b, int64_t e) {
                                            for (int64_t r = b; r < e; ++r) {
                                              const T* gr = g + r * d;
                                              const T* xr = x + r * d;
                                              const T* c = c0 + ci.offset(r);
                                              const T* s = s0 + si.offset(r);
                                              for (int64_t j = 0; j < d; ++j) {
                                                float sign;
                                                const int64_t p = partner(m, j, d, &sign);
                                                // rot^T moves g*s from the partner with the partner's sign.
                                                float psign;
                                                partner(m, p, d, &psign);
                                                dx[r * d + j] = static_cast<T>(A(gr[j]) * A(c[j]) + psign * A(gr[p]) * A(s[p]));
                                                gx[r * d + j] = A(gr[j]) * A(xr[j]);
                                                grot[r * d + j] = A(gr[j]) * sign * A(xr[p]);
                                              }
                                            }
                                          });
                       });
                     });
  return {dx, gx.sum_to_size(r1.sizes()).to(r1.scalar_type()), grot.sum_to_size(r2.sizes()).to(r2.scalar_type())};
}

// Layouts of npu_apply_rotary_pos_emb: where N (heads) is, over which cos/sin broadcast.
int64_t heads_dim(const char* op, c10::string_view layout, const Tensor& q) {
  const int64_t expected_dim = layout == "TND" ? 3 : 4;
  int64_t n = -1;
  if (layout == "BSND" || layout == "SBND") n = 2;
  if (layout == "BNSD" || layout == "TND") n = 1;
  TORCH_CHECK(n >= 0, op, ": expected layout 'BSND', 'SBND', 'BNSD' or 'TND', got '", layout, "'");
  TORCH_CHECK(q.dim() == expected_dim, op, ": expected query to be ", expected_dim, "-dimensional for layout ", layout,
              ", got shape ", q.sizes());
  return n;
}

// Rotates query and key in place (as torch_npu does) and returns them.
std::tuple<Tensor, Tensor> npu_apply_rotary_pos_emb(Tensor query, Tensor key, const Tensor& cos, const Tensor& sin,
                                                    c10::string_view layout, c10::string_view mode) {
  constexpr const char* op = "npu_apply_rotary_pos_emb";
  npu_device(op, {{"query", query}, {"key", key}, {"cos", cos}, {"sin", sin}});
  check_float(op, "query", query);
  check_dtype(op, "key", key, query.scalar_type());
  TORCH_CHECK(mode != "quarter", op, ": rotary_mode 'quarter' is supported on Ascend 950 only, not on Ascend 910B");
  const RotaryMode m = rotary_mode(op, mode);
  const int64_t n = heads_dim(op, layout, query);
  TORCH_CHECK(key.dim() == query.dim(), op, ": expected key to have query's ", query.dim(), " dimensions, got shape ",
              key.sizes());
  for (int64_t i = 0; i < query.dim(); ++i) {
    TORCH_CHECK(i == n || key.size(i) == query.size(i), op, ": expected key's shape ", key.sizes(),
                " to equal query's ", query.sizes(), " in every dimension but N (", n, ")");
  }
  for (const auto& [name, r] : {std::pair<const char*, const Tensor&>{"cos", cos}, {"sin", sin}}) {
    check_rotary_coeff(op, name, r, query, false);
    TORCH_CHECK(r.size(n) == 1, op, ": expected ", name, " to have size 1 in the N dimension (", n, "), got shape ",
                r.sizes());
    TORCH_CHECK(r.size(-1) % 2 == 0, op, ": expected ", name, "'s last dimension to be even, got shape ", r.sizes());
  }
  TORCH_CHECK(cos.sizes().equals(sin.sizes()), op, ": expected sin's shape ", sin.sizes(), " to equal cos's ",
              cos.sizes());
  for (Tensor* t : {&query, &key}) {
    TORCH_CHECK(t->is_contiguous(), op, ": query and key are updated in place and must be contiguous");
    rotary_launch(op, *t, dense(cos), dense(sin), *t, m);
  }
  return {query, key};
}

// ---- softmax family ------------------------------------------------------------------------

constexpr float kMaskedLogit = -10000.f;  // what torch_npu's kernels write for masked positions

// softmax over a row of length n of z (float), into p.
template <typename F>
inline void softmax_row(const F* z, F* p, int64_t n) {
  F m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, z[j]);
  F sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = vmath::exp(z[j] - m);
    sum += p[j];
  }
  const F inv = F(1) / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
}

// The mask of npu_scaled_masked_softmax: a bool tensor broadcast to x, or (fixed_triu_mask)
// the upper triangle above the diagonal of the last two dimensions.
struct SoftmaxMask {
  RowIndexer rows;
  int64_t col_stride;  // 0 when the mask broadcasts along the last dimension
  bool triu;
  int64_t s1;          // x.size(-2) for triu
};

SoftmaxMask softmax_mask(const char* op, const Tensor& x, const Tensor& mask, bool fixed_triu_mask) {
  TORCH_CHECK(x.dim() >= 2, op, ": expected x to have at least 2 dimensions, got shape ", x.sizes());
  if (!fixed_triu_mask) {
    TORCH_CHECK(mask.scalar_type() == at::kBool, op, ": expected mask to be a bool tensor, got ", mask.scalar_type());
    TORCH_CHECK(at::is_expandable_to(mask.sizes(), x.sizes()), op, ": expected mask's shape ", mask.sizes(),
                " to broadcast to x's shape ", x.sizes());
  }
  const Tensor m = fixed_triu_mask ? x : mask;  // the indexer is unused for triu
  const auto e = m.expand(x.sizes());
  return {RowIndexer(m, x.sizes()), e.stride(-1), fixed_triu_mask, x.size(-2)};
}

Tensor npu_scaled_masked_softmax(const Tensor& x, const Tensor& mask, const at::Scalar& scale, bool fixed_triu_mask) {
  constexpr const char* op = "npu_scaled_masked_softmax";
  const auto device = npu_device(op, {{"x", x}, {"mask", mask}});
  check_float(op, "x", x);
  const Tensor m = fixed_triu_mask ? Tensor() : mask.contiguous();
  const SoftmaxMask sm = softmax_mask(op, x, fixed_triu_mask ? x : m, fixed_triu_mask);
  Tensor y = at::empty(x.sizes(), x.options());
  const int64_t n = x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const double sc = scale.toDouble();
  ops::launch_kernel(op, device, {dense(x), m, y}, x.numel(), [sm, n, rows, sc](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), op, [&] {
      using A = acc_t<scalar_t>;
      const auto* x = t[0].const_data_ptr<scalar_t>();
      const bool* mask = sm.triu ? nullptr : t[1].const_data_ptr<bool>();
      auto* y = t[2].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        std::vector<A> z(n), p(n);
        for (int64_t r = b; r < e; ++r) {
          const bool* mr = mask ? mask + sm.rows.offset(r) : nullptr;
          const int64_t i = r % sm.s1;
          for (int64_t j = 0; j < n; ++j) {
            const bool masked = mr ? mr[j * sm.col_stride] : j > i;
            z[j] = masked ? A(kMaskedLogit) : A(x[r * n + j]) * A(sc);
          }
          softmax_row(z.data(), p.data(), n);
          for (int64_t j = 0; j < n; ++j) y[r * n + j] = static_cast<scalar_t>(p[j]);
        }
      });
    });
  });
  return y;
}

Tensor npu_scaled_masked_softmax_backward(const Tensor& y_grad, const Tensor& y, const Tensor& mask,
                                          const at::Scalar& scale, bool fixed_triu_mask) {
  constexpr const char* op = "npu_scaled_masked_softmax_backward";
  const auto device = npu_device(op, {{"y_grad", y_grad}, {"y", y}, {"mask", mask}});
  check_float(op, "y", y);
  check_dtype(op, "y_grad", y_grad, y.scalar_type());
  TORCH_CHECK(y_grad.sizes().equals(y.sizes()), op, ": expected y_grad of shape ", y.sizes(), ", got ",
              y_grad.sizes());
  const Tensor m = fixed_triu_mask ? Tensor() : mask.contiguous();
  const SoftmaxMask sm = softmax_mask(op, y, fixed_triu_mask ? y : m, fixed_triu_mask);
  Tensor dx = at::empty(y.sizes(), y.options());
  const int64_t n = y.size(-1);
  const int64_t rows = n == 0 ? 0 : y.numel() / n;
  const double sc = scale.toDouble();
  ops::launch_kernel(op, device, {dense(y_grad), dense(y), m, dx}, y.numel(), [sm, n, rows, sc](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[1].scalar_type(), op, [&] {
      using A = acc_t<scalar_t>;
      const auto* g = t[0].const_data_ptr<scalar_t>();
      const auto* y = t[1].const_data_ptr<scalar_t>();
      const bool* mask = sm.triu ? nullptr : t[2].const_data_ptr<bool>();
      auto* dx = t[3].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const bool* mr = mask ? mask + sm.rows.offset(r) : nullptr;
          const int64_t i = r % sm.s1;
          A dot = 0;
          for (int64_t j = 0; j < n; ++j) dot += A(g[r * n + j]) * A(y[r * n + j]);
          for (int64_t j = 0; j < n; ++j) {
            const bool masked = mr ? mr[j * sm.col_stride] : j > i;
            const A v = A(y[r * n + j]) * (A(g[r * n + j]) - dot) * A(sc);
            dx[r * n + j] = static_cast<scalar_t>(masked ? A(0) : v);
          }
        }
      });
    });
  });
  return dx;
}

void check_last_dim(const char* op, const Tensor& t, int64_t dim) {
  TORCH_CHECK(t.dim() >= 1 && (dim == -1 || dim == t.dim() - 1), op,
              ": expected dim to be -1 (the last dimension; the only one Ascend supports), got ", dim);
}

// softmax(x1 + alpha * self) along the last dim, then dropout with keep probability
// 1 - prob; returns (mask as uint8, softmax_out, output).
std::tuple<Tensor, Tensor, Tensor> npu_dropout_with_add_softmax(const Tensor& self, const Tensor& x1,
                                                                const at::Scalar& alpha, double prob, int64_t dim) {
  constexpr const char* op = "npu_dropout_with_add_softmax";
  const auto device = npu_device(op, {{"self", self}, {"x1", x1}});
  check_float(op, "self", self);
  check_dtype(op, "x1", x1, self.scalar_type());
  TORCH_CHECK(x1.sizes().equals(self.sizes()), op, ": expected x1 to have self's shape ", self.sizes(), ", got ",
              x1.sizes());
  TORCH_CHECK(prob >= 0 && prob < 1, op, ": expected prob in [0, 1), got ", prob);
  check_last_dim(op, self, dim);
  Tensor mask = prob == 0 ? at::ones(self.sizes(), self.options().dtype(at::kByte))
                          : at::empty(self.sizes(), self.options().dtype(at::kByte)).bernoulli_(1 - prob);
  Tensor softmax_out = at::empty(self.sizes(), self.options());
  Tensor out = at::empty(self.sizes(), self.options());
  const int64_t n = self.size(-1);
  const int64_t rows = n == 0 ? 0 : self.numel() / n;
  const double a = alpha.toDouble();
  const double keep_scale = 1.0 / (1.0 - prob);
  ops::launch_kernel(op, device, {dense(self), dense(x1), mask, softmax_out, out}, self.numel(),
                     [n, rows, a, keep_scale](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), op, [&] {
                         using A = acc_t<scalar_t>;
                         const auto* x = t[0].const_data_ptr<scalar_t>();
                         const auto* x1 = t[1].const_data_ptr<scalar_t>();
                         const auto* mk = t[2].const_data_ptr<uint8_t>();
                         auto* sm = t[3].mutable_data_ptr<scalar_t>();
                         auto* out = t[4].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                                          [&](int64_t b, int64_t e) {
                                            std::vector<A> z(n), p(n);
                                            for (int64_t r = b; r < e; ++r) {
                                              const int64_t o = r * n;
                                              for (int64_t j = 0; j < n; ++j) z[j] = A(x1[o + j]) + A(a) * A(x[o + j]);
                                              softmax_row(z.data(), p.data(), n);
                                              for (int64_t j = 0; j < n; ++j) {
                                                sm[o + j] = static_cast<scalar_t>(p[j]);
                                                out[o + j] = static_cast<scalar_t>(mk[o + j] ? p[j] * A(keep_scale) : A(0));
                                              }
                                            }
                                          });
                       });
                     });
  return {mask, softmax_out, out};
}

// Returns (grad of self, grad of x1).
std::tuple<Tensor, Tensor> npu_dropout_with_add_softmax_backward(const Tensor& grad, const Tensor& mask,
                                                                 const Tensor& softmax_out, const at::Scalar& alpha,
                                                                 double prob, int64_t dim) {
  constexpr const char* op = "npu_dropout_with_add_softmax_backward";
  const auto device = npu_device(op, {{"grad", grad}, {"mask", mask}, {"softmax_out", softmax_out}});
  check_float(op, "softmax_out", softmax_out);
  check_dtype(op, "grad", grad, softmax_out.scalar_type());
  check_dtype(op, "mask", mask, at::kByte);
  TORCH_CHECK(grad.sizes().equals(softmax_out.sizes()) && mask.sizes().equals(softmax_out.sizes()), op,
              ": expected grad and mask of softmax_out's shape ", softmax_out.sizes(), ", got ", grad.sizes(), " and ",
              mask.sizes());
  TORCH_CHECK(prob >= 0 && prob < 1, op, ": expected prob in [0, 1), got ", prob);
  check_last_dim(op, softmax_out, dim);
  Tensor dself = at::empty(grad.sizes(), grad.options());
  Tensor dx1 = at::empty(grad.sizes(), grad.options());
  const int64_t n = grad.size(-1);
  const int64_t rows = n == 0 ? 0 : grad.numel() / n;
  const double a = alpha.toDouble();
  const double keep_scale = 1.0 / (1.0 - prob);
  ops::launch_kernel(op, device, {dense(grad), dense(mask), dense(softmax_out), dself, dx1}, grad.numel(),
                     [n, rows, a, keep_scale](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[2].scalar_type(), op, [&] {
                         using A = acc_t<scalar_t>;
                         const auto* g = t[0].const_data_ptr<scalar_t>();
                         const auto* mk = t[1].const_data_ptr<uint8_t>();
                         const auto* p = t[2].const_data_ptr<scalar_t>();
                         auto* ds = t[3].mutable_data_ptr<scalar_t>();
                         auto* dx1 = t[4].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                                          [&](int64_t b, int64_t e) {
                                            std::vector<A> gp(n);
                                            for (int64_t r = b; r < e; ++r) {
                                              const int64_t o = r * n;
                                              A dot = 0;
                                              for (int64_t j = 0; j < n; ++j) {
                                                gp[j] = mk[o + j] ? A(g[o + j]) * A(keep_scale) : A(0);
                                                dot += gp[j] * A(p[o + j]);
                                              }
                                              for (int64_t j = 0; j < n; ++j) {
                                                const A dz = A(p[o + j]) * (gp[j] - dot);
                                                dx1[o + j] = static_cast<scalar_t>(dz);
                                                ds[o + j] = static_cast<scalar_t>(dz * A(a));
                                              }
                                            }
                                          });
                       });
                     });
  return {dself, dx1};
}

// ---- confusion transpose: a permute and a reshape in one copy ----------------------------------

std::vector<int64_t> checked_perm(const char* op, c10::IntArrayRef perm, int64_t dim) {
  TORCH_CHECK(static_cast<int64_t>(perm.size()) == dim, op, ": expected perm to have ", dim, " entries, got ", perm);
  std::vector<int64_t> inverse(dim, -1);
  for (int64_t i = 0; i < dim; ++i) {
    const int64_t p = perm[i] < 0 ? perm[i] + dim : perm[i];
    TORCH_CHECK(p >= 0 && p < dim && inverse[p] < 0, op, ": expected perm to be a permutation of 0..", dim - 1,
                ", got ", perm);
    inverse[p] = i;
  }
  return inverse;
}

Tensor npu_confusion_transpose(const Tensor& self, c10::IntArrayRef perm, c10::IntArrayRef shape,
                               bool transpose_first) {
  constexpr const char* op = "npu_confusion_transpose";
  npu_device(op, {{"self", self}});
  if (transpose_first) {
    checked_perm(op, perm, self.dim());
    return self.permute(perm).reshape(shape).contiguous();
  }
  TORCH_CHECK(c10::multiply_integers(shape) == self.numel(), op, ": expected shape ", shape, " to have ",
              self.numel(), " elements like self ", self.sizes());
  checked_perm(op, perm, static_cast<int64_t>(shape.size()));
  return self.reshape(shape).permute(perm).contiguous();
}

// `shape` is the forward input's shape; transpose_first is the negation of the forward's.
Tensor npu_confusion_transpose_backward(const Tensor& grad, c10::IntArrayRef perm, c10::SymIntArrayRef shape,
                                        bool transpose_first) {
  constexpr const char* op = "npu_confusion_transpose_backward";
  npu_device(op, {{"grad", grad}});
  const auto sizes = C10_AS_INTARRAYREF_SLOW(shape);
  if (transpose_first) {  // the forward reshaped, then permuted
    const auto inverse = checked_perm(op, perm, grad.dim());
    return grad.permute(inverse).reshape(sizes).contiguous();
  }
  const auto inverse = checked_perm(op, perm, static_cast<int64_t>(sizes.size()));
  std::vector<int64_t> permuted(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) permuted[i] = sizes[perm[i] < 0 ? perm[i] + sizes.size() : perm[i]];
  return grad.reshape(permuted).permute(inverse).contiguous();
}

// ---- autograd ---------------------------------------------------------------------------------

Tensor or_zeros(const Tensor& grad, const Tensor& like) { return grad.defined() ? grad : at::zeros_like(like); }

class Swiglu : public torch::autograd::Function<Swiglu> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, int64_t dim) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<Tensor(const Tensor&, int64_t)>("npu::npu_swiglu");
    ctx->save_for_backward({self});
    ctx->saved_data["dim"] = dim;
    return fwd.call(self, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&, int64_t)>("npu::npu_swiglu_backward");
    return {bwd.call(grads[0], ctx->get_saved_variables()[0], ctx->saved_data["dim"].toInt()), Tensor()};
  }
};

class Geglu : public torch::autograd::Function<Geglu> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& self, int64_t dim, int64_t approximate,
                               bool activate_left) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd =
        op_handle<std::tuple<Tensor, Tensor>(const Tensor&, int64_t, int64_t, bool)>("npu::npu_geglu");
    auto [y, gelu] = fwd.call(self, dim, approximate, activate_left);
    ctx->save_for_backward({self, gelu});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["approximate"] = approximate;
    ctx->saved_data["activate_left"] = activate_left;
    ctx->mark_non_differentiable({gelu});
    return {y, gelu};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, bool)>(
        "npu::npu_geglu_grad");
    const auto saved = ctx->get_saved_variables();
    return {bwd.call(or_zeros(grads[0], saved[1]), saved[0], saved[1], ctx->saved_data["dim"].toInt(),
                     ctx->saved_data["approximate"].toInt(), ctx->saved_data["activate_left"].toBool()),
            Tensor(), Tensor(), Tensor()};
  }
};

class FastGelu : public torch::autograd::Function<FastGelu> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<Tensor(const Tensor&)>("npu::npu_fast_gelu");
    ctx->save_for_backward({self});
    return fwd.call(self);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&)>("npu::npu_fast_gelu_backward");
    return {bwd.call(grads[0], ctx->get_saved_variables()[0])};
  }
};

class RotaryMul : public torch::autograd::Function<RotaryMul> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& r1, const Tensor& r2,
                        c10::string_view mode, const std::optional<Tensor>& rotate) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd =
        op_handle<Tensor(const Tensor&, const Tensor&, const Tensor&, c10::string_view, const std::optional<Tensor>&)>(
            "npu::npu_rotary_mul");
    TORCH_CHECK(!(rotate.has_value() && rotate->defined() && c10::GradMode::is_enabled() &&
                  (self.requires_grad() || r1.requires_grad() || r2.requires_grad())),
                "npu_rotary_mul: rotate has no backward (as in torch_npu); call it under torch.no_grad()");
    ctx->save_for_backward({self, r1, r2});
    ctx->saved_data["mode"] = std::string(mode);
    return fwd.call(self, r1, r2, mode, rotate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                   const Tensor&, c10::string_view)>(
        "npu::npu_rotary_mul_backward");
    const auto saved = ctx->get_saved_variables();
    auto [dx, dr1, dr2] = bwd.call(grads[0], saved[0], saved[1], saved[2], ctx->saved_data["mode"].toStringRef());
    return {dx, dr1, dr2, Tensor(), Tensor()};
  }
};

class ScaledMaskedSoftmax : public torch::autograd::Function<ScaledMaskedSoftmax> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& mask, const at::Scalar& scale,
                        bool fixed_triu_mask) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<Tensor(const Tensor&, const Tensor&, const at::Scalar&, bool)>(
        "npu::npu_scaled_masked_softmax");
    Tensor y = fwd.call(x, mask, scale, fixed_triu_mask);
    ctx->save_for_backward({y, mask});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["fixed_triu_mask"] = fixed_triu_mask;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&, const Tensor&, const at::Scalar&, bool)>(
        "npu::npu_scaled_masked_softmax_backward");
    const auto saved = ctx->get_saved_variables();
    return {bwd.call(grads[0], saved[0], saved[1], ctx->saved_data["scale"].toScalar(),
                     ctx->saved_data["fixed_triu_mask"].toBool()),
            Tensor(), Tensor(), Tensor()};
  }
};

class DropoutWithAddSoftmax : public torch::autograd::Function<DropoutWithAddSoftmax> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& self, const Tensor& x1, const at::Scalar& alpha,
                               double prob, int64_t dim) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const at::Scalar&,
                                                                   double, int64_t)>("npu::npu_dropout_with_add_softmax");
    auto [mask, softmax_out, out] = fwd.call(self, x1, alpha, prob, dim);
    ctx->save_for_backward({mask, softmax_out});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["prob"] = prob;
    ctx->saved_data["dim"] = dim;
    ctx->mark_non_differentiable({mask, softmax_out});
    return {mask, softmax_out, out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                           const at::Scalar&, double, int64_t)>(
        "npu::npu_dropout_with_add_softmax_backward");
    const auto saved = ctx->get_saved_variables();
    auto [dself, dx1] = bwd.call(or_zeros(grads[2], saved[1]), saved[0], saved[1], ctx->saved_data["alpha"].toScalar(),
                                 ctx->saved_data["prob"].toDouble(), ctx->saved_data["dim"].toInt());
    return {dself, dx1, Tensor(), Tensor(), Tensor()};
  }
};

class ConfusionTranspose : public torch::autograd::Function<ConfusionTranspose> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, c10::IntArrayRef perm, c10::IntArrayRef shape,
                        bool transpose_first) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<Tensor(const Tensor&, c10::IntArrayRef, c10::IntArrayRef, bool)>(
        "npu::npu_confusion_transpose");
    ctx->saved_data["perm"] = perm.vec();
    ctx->saved_data["sizes"] = self.sizes().vec();
    ctx->saved_data["transpose_first"] = transpose_first;
    return fwd.call(self, perm, shape, transpose_first);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, c10::IntArrayRef, c10::SymIntArrayRef, bool)>(
        "npu::npu_confusion_transpose_backward");
    const auto perm = ctx->saved_data["perm"].toIntVector();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    return {bwd.call(grads[0], perm, c10::fromIntArrayRefSlow(sizes), !ctx->saved_data["transpose_first"].toBool()),
            Tensor(), Tensor(), Tensor()};
  }
};

Tensor swiglu_autograd(const Tensor& self, int64_t dim) { return Swiglu::apply(self, dim); }
std::tuple<Tensor, Tensor> geglu_autograd(const Tensor& self, int64_t dim, int64_t approximate, bool activate_left) {
  auto r = Geglu::apply(self, dim, approximate, activate_left);
  return {r[0], r[1]};
}
Tensor fast_gelu_autograd(const Tensor& self) { return FastGelu::apply(self); }
Tensor rotary_mul_autograd(const Tensor& self, const Tensor& r1, const Tensor& r2, c10::string_view mode,
                           const std::optional<Tensor>& rotate) {
  return RotaryMul::apply(self, r1, r2, mode, rotate);
}
Tensor scaled_masked_softmax_autograd(const Tensor& x, const Tensor& mask, const at::Scalar& scale,
                                      bool fixed_triu_mask) {
  return ScaledMaskedSoftmax::apply(x, mask, scale, fixed_triu_mask);
}
std::tuple<Tensor, Tensor, Tensor> dropout_with_add_softmax_autograd(const Tensor& self, const Tensor& x1,
                                                                     const at::Scalar& alpha, double prob,
                                                                     int64_t dim) {
  auto r = DropoutWithAddSoftmax::apply(self, x1, alpha, prob, dim);
  return {r[0], r[1], r[2]};
}
Tensor confusion_transpose_autograd(const Tensor& self, c10::IntArrayRef perm, c10::IntArrayRef shape,
                                    bool transpose_first) {
  return ConfusionTranspose::apply(self, perm, shape, transpose_first);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_swiglu(Tensor self, int dim=-1) -> Tensor");
  m.def("npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor");
  m.def("npu_geglu(Tensor self, int dim=-1, int approximate=1, bool activate_left=False) -> (Tensor, Tensor)");
  m.def(
      "npu_geglu_grad(Tensor grad_output, Tensor self, Tensor gelu, int dim=-1, int approximate=1, "
      "bool activate_left=False) -> Tensor");
  m.def("npu_fast_gelu(Tensor self) -> Tensor");
  m.def("npu_fast_gelu_backward(Tensor grad, Tensor self) -> Tensor");
  m.def("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor");
  m.def(
      "npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> "
      "(Tensor, Tensor, Tensor)");
  // torch_npu declares this one functional but updates query and key in place; the
  // schema here says so, which keeps functionalization (torch.compile) correct.
  m.def(
      "npu_apply_rotary_pos_emb(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, str layout='BSND', "
      "str rotary_mode='half') -> (Tensor(a!), Tensor(b!))");
  m.def("npu_scaled_masked_softmax(Tensor x, Tensor mask, Scalar scale=1, bool fixed_triu_mask=False) -> Tensor");
  m.def(
      "npu_scaled_masked_softmax_backward(Tensor y_grad, Tensor y, Tensor mask, Scalar scale, bool fixed_triu_mask) "
      "-> Tensor");
  m.def(
      "npu_dropout_with_add_softmax(Tensor self, Tensor x1, Scalar alpha, float prob, int dim) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "npu_dropout_with_add_softmax_backward(Tensor grad, Tensor mask, Tensor softmax_out, Scalar alpha, float prob, "
      "int dim) -> (Tensor, Tensor)");
  m.def("npu_confusion_transpose(Tensor self, int[] perm, int[] shape, bool transpose_first) -> Tensor");
  m.def(
      "npu_confusion_transpose_backward(Tensor grad, int[] perm, SymInt[] shape, bool transpose_first) -> Tensor");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_swiglu", TORCH_FN(npu_swiglu));
  m.impl("npu_swiglu_backward", TORCH_FN(npu_swiglu_backward));
  m.impl("npu_geglu", TORCH_FN(npu_geglu));
  m.impl("npu_geglu_grad", TORCH_FN(npu_geglu_grad));
  m.impl("npu_fast_gelu", TORCH_FN(npu_fast_gelu));
  m.impl("npu_fast_gelu_backward", TORCH_FN(npu_fast_gelu_backward));
  m.impl("npu_rotary_mul", TORCH_FN(npu_rotary_mul));
  m.impl("npu_rotary_mul_backward", TORCH_FN(npu_rotary_mul_backward));
  m.impl("npu_apply_rotary_pos_emb", TORCH_FN(npu_apply_rotary_pos_emb));
  m.impl("npu_scaled_masked_softmax", TORCH_FN(npu_scaled_masked_softmax));
  m.impl("npu_scaled_masked_softmax_backward", TORCH_FN(npu_scaled_masked_softmax_backward));
  m.impl("npu_dropout_with_add_softmax", TORCH_FN(npu_dropout_with_add_softmax));
  m.impl("npu_dropout_with_add_softmax_backward", TORCH_FN(npu_dropout_with_add_softmax_backward));
  m.impl("npu_confusion_transpose", TORCH_FN(npu_confusion_transpose));
  m.impl("npu_confusion_transpose_backward", TORCH_FN(npu_confusion_transpose_backward));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) {
  m.impl("npu_swiglu", TORCH_FN(swiglu_autograd));
  m.impl("npu_geglu", TORCH_FN(geglu_autograd));
  m.impl("npu_fast_gelu", TORCH_FN(fast_gelu_autograd));
  m.impl("npu_rotary_mul", TORCH_FN(rotary_mul_autograd));
  m.impl("npu_scaled_masked_softmax", TORCH_FN(scaled_masked_softmax_autograd));
  m.impl("npu_dropout_with_add_softmax", TORCH_FN(dropout_with_add_softmax_autograd));
  m.impl("npu_confusion_transpose", TORCH_FN(confusion_transpose_autograd));
}

}  // namespace torch_npu::custom_ops
