// Normalisation: npu_rms_norm and npu_add_rms_norm, forward and backward.
#include <ATen/Parallel.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "fused.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of x normalised over gamma's trailing shape; rstd's shape keeps the leading
// dims and has 1 for each normalised one, as torch_npu returns it.
struct RmsShape {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int64_t> rstd_sizes;
};

RmsShape rms_shape(const char* op, const Tensor& x, const Tensor& gamma) {
  TORCH_CHECK(gamma.dim() >= 1 && gamma.dim() <= x.dim(), op, ": expected gamma to have 1 to ", x.dim(),
              " dimensions (the trailing shape of self), got shape ", gamma.sizes());
  const int64_t lead = x.dim() - gamma.dim();
  TORCH_CHECK(x.sizes().slice(lead).equals(gamma.sizes()), op, ": expected gamma's shape ", gamma.sizes(),
              " to equal the last ", gamma.dim(), " dimension(s) of self, whose shape is ", x.sizes());
  RmsShape s;
  s.cols = gamma.numel();
  s.rows = s.cols == 0 ? 0 : x.numel() / s.cols;
  s.rstd_sizes.assign(x.sizes().begin(), x.sizes().begin() + lead);
  s.rstd_sizes.resize(x.dim(), 1);
  return s;
}

// Sum of squares with 16 partial sums (a reduction GCC vectorises only when the
// order of additions is spelled out), and y = x * inv * g.
inline float sum_squares(const float* x, int64_t n) {
  float part[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) part[j] += x[i + j] * x[i + j];
  }
  float s = 0.f;
  for (int j = 0; j < 16; ++j) s += part[j];
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}
NPU_SIMD float rms_row_f(const float* x, const float* g, float* y, int64_t n, float eps) {
  const float inv = 1.f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * g[i];
  return inv;
}
double rms_row_f(const double* x, const double* g, double* y, int64_t n, double eps) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(acc / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * g[i];
  return inv;
}

// y = x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps), one row at a time, in the
// compute type A. With `residual`, x is x1 + x2 (rounded to T) and is also written to `sum`.
template <typename T, typename G>
void rms_norm_rows(const T* x1, const T* x2, const G* gamma, T* y, float* rstd, T* sum, int64_t rows,
                   int64_t cols, double eps) {
  using A = vmath::acc_t<T>;
  std::vector<A> g(gamma, gamma + cols);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
    // Rows in the compute type, unless T is it already (then x and y are used in place).
    std::vector<A> xbuf(std::is_same_v<T, A> && !x2 ? 0 : cols), ybuf(std::is_same_v<T, A> ? 0 : cols);
    for (int64_t r = b; r < e; ++r) {
      const T* a = x1 + r * cols;
      const A* xs = reinterpret_cast<const A*>(a);
      if (x2) {
        const T* c = x2 + r * cols;
        T* s = sum + r * cols;
        for (int64_t i = 0; i < cols; ++i) {
          s[i] = static_cast<T>(static_cast<A>(a[i]) + static_cast<A>(c[i]));  // rounded as stored
          xbuf[i] = static_cast<A>(s[i]);
        }
        xs = xbuf.data();
      } else if (!std::is_same_v<T, A>) {
        for (int64_t i = 0; i < cols; ++i) xbuf[i] = static_cast<A>(a[i]);
        xs = xbuf.data();
      }
      A* out = std::is_same_v<T, A> ? reinterpret_cast<A*>(y + r * cols) : ybuf.data();
      rstd[r] = static_cast<float>(rms_row_f(xs, g.data(), out, cols, static_cast<A>(eps)));
      if (!std::is_same_v<T, A>) {
        for (int64_t i = 0; i < cols; ++i) y[r * cols + i] = static_cast<T>(out[i]);
      }
    }
  });
}

void check_gamma_dtype(const char* op, const Tensor& x, const Tensor& gamma) {
  TORCH_CHECK(gamma.scalar_type() == x.scalar_type() || gamma.scalar_type() == at::kFloat, op,
              ": expected gamma to have self's dtype (", x.scalar_type(), ") or float32, got ",
              gamma.scalar_type());
}

// Shared by npu_rms_norm and npu_add_rms_norm: x2 and sum are undefined for the former.
std::tuple<Tensor, Tensor> rms_norm_launch(const char* op, const Tensor& x1, const Tensor& x2, const Tensor& gamma,
                                           const Tensor& sum, double epsilon, const RmsShape& shape) {
  Tensor y = at::empty(x1.sizes(), x1.options());
  Tensor rstd = at::empty(shape.rstd_sizes, x1.options().dtype(at::kFloat));
  const c10::DeviceIndex device = x1.device().index();
  ops::launch_kernel(op, device, {dense(x1), dense(x2), dense(gamma), y, rstd, sum}, x1.numel(),
                     [shape, epsilon](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_rms_norm", [&] {
                         using T = scalar_t;
                         auto run = [&](auto* g) {
                           rms_norm_rows<T>(t[0].const_data_ptr<T>(), t[1].defined() ? t[1].const_data_ptr<T>() : nullptr,
                                            g, t[3].mutable_data_ptr<T>(), t[4].mutable_data_ptr<float>(),
                                            t[5].defined() ? t[5].mutable_data_ptr<T>() : nullptr, shape.rows,
                                            shape.cols, epsilon);
                         };
                         if (t[2].scalar_type() == at::kFloat) {
                           run(t[2].const_data_ptr<float>());
                         } else {
                           run(t[2].const_data_ptr<T>());
                         }
                       });
                     });
  return {y, rstd};
}

std::tuple<Tensor, Tensor> npu_rms_norm(const Tensor& self, const Tensor& gamma, double epsilon) {
  constexpr const char* op = "npu_rms_norm";
  npu_device(op, {{"self", self}, {"gamma", gamma}});
  check_float(op, "self", self);
  check_gamma_dtype(op, self, gamma);
  const RmsShape shape = rms_shape(op, self, gamma);
  return rms_norm_launch(op, self, Tensor(), gamma, Tensor(), epsilon, shape);
}

std::tuple<Tensor, Tensor, Tensor> npu_add_rms_norm(const Tensor& x1, const Tensor& x2, const Tensor& gamma,
                                                    double epsilon) {
  constexpr const char* op = "npu_add_rms_norm";
  npu_device(op, {{"x1", x1}, {"x2", x2}, {"gamma", gamma}});
  check_float(op, "x1", x1);
  check_dtype(op, "x2", x2, x1.scalar_type());
  TORCH_CHECK(x1.sizes().equals(x2.sizes()), op, ": expected x2 to have x1's shape ", x1.sizes(), ", got ",
              x2.sizes());
  check_gamma_dtype(op, x1, gamma);
  const RmsShape shape = rms_shape(op, x1, gamma);
  Tensor sum = at::empty(x1.sizes(), x1.options());
  auto [y, rstd] = rms_norm_launch(op, x1, x2, gamma, sum, epsilon, shape);
  return {y, rstd, sum};
}

// dx = rstd * (dy*g - xhat * mean(dy*g*xhat)), dgamma = sum over rows of dy * xhat,
// with xhat = x * rstd. Each of `parts` row ranges accumulates its own dgamma row in
// `partial` ([parts, cols]); the partial sums are then added up.
template <typename T, typename G>
void rms_norm_backward_rows(const T* dy, const T* x, const G* gamma, const float* rstd, T* dx,
                            vmath::acc_t<T>* partial, int64_t parts, int64_t rows, int64_t cols) {
  using A = vmath::acc_t<T>;
  const int64_t chunk = (rows + parts - 1) / parts;
  std::fill(partial, partial + parts * cols, A(0));
  at::parallel_for(0, parts, 1, [&](int64_t pb, int64_t pe) {
    for (int64_t part = pb; part < pe; ++part) {
      A* dg = partial + part * cols;
      for (int64_t r = part * chunk; r < std::min(rows, (part + 1) * chunk); ++r) {
        const T* dyr = dy + r * cols;
        const T* xr = x + r * cols;
        const A inv = rstd[r];
        A dot = 0;
        for (int64_t i = 0; i < cols; ++i) {
          const A xh = static_cast<A>(xr[i]) * inv;
          const A d = static_cast<A>(dyr[i]);
          dot += d * static_cast<A>(gamma[i]) * xh;
          dg[i] += d * xh;
        }
        const A mean = dot / static_cast<A>(cols);
        T* dxr = dx + r * cols;
        for (int64_t i = 0; i < cols; ++i) {
          const A xh = static_cast<A>(xr[i]) * inv;
          dxr[i] = static_cast<T>(inv * (static_cast<A>(dyr[i]) * static_cast<A>(gamma[i]) - xh * mean));
        }
      }
    }
  });
}

std::tuple<Tensor, Tensor> npu_rms_norm_backward(const Tensor& dy, const Tensor& self, const Tensor& gamma,
                                                 const Tensor& rstd) {
  constexpr const char* op = "npu_rms_norm_backward";
  const c10::DeviceIndex device = npu_device(op, {{"dy", dy}, {"self", self}, {"gamma", gamma}, {"rstd", rstd}});
  check_float(op, "self", self);
  check_dtype(op, "dy", dy, self.scalar_type());
  TORCH_CHECK(dy.sizes().equals(self.sizes()), op, ": expected dy to have self's shape ", self.sizes(), ", got ",
              dy.sizes());
  check_gamma_dtype(op, self, gamma);
  check_dtype(op, "rstd", rstd, at::kFloat);
  const RmsShape shape = rms_shape(op, self, gamma);
  TORCH_CHECK(rstd.numel() == shape.rows, op, ": expected rstd to have ", shape.rows, " elements (shape ",
              c10::IntArrayRef(shape.rstd_sizes), "), got shape ", rstd.sizes());
  Tensor dx = at::empty(self.sizes(), self.options());
  Tensor dgamma = at::empty(gamma.sizes(), gamma.options());
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), shape.rows));
  const auto acc_dtype = self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor partial = at::empty({parts, shape.cols}, self.options().dtype(acc_dtype));
  ops::launch_kernel(op, device, {dense(dy), dense(self), dense(gamma), dense(rstd), dx, dgamma, partial},
                     self.numel(), [shape, parts](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_rms_norm_backward", [&] {
                         using T = scalar_t;
                         using A = vmath::acc_t<T>;
                         A* partial = t[6].mutable_data_ptr<A>();
                         auto run = [&](auto* g) {
                           rms_norm_backward_rows<T>(t[0].const_data_ptr<T>(), t[1].const_data_ptr<T>(), g,
                                                     t[3].const_data_ptr<float>(), t[4].mutable_data_ptr<T>(),
                                                     partial, parts, shape.rows, shape.cols);
                         };
                         if (t[2].scalar_type() == at::kFloat) {
                           run(t[2].const_data_ptr<float>());
                         } else {
                           run(t[2].const_data_ptr<T>());
                         }
                         AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t[5].scalar_type(), "dgamma", [&] {
                           auto* dg = t[5].mutable_data_ptr<scalar_t>();
                           for (int64_t i = 0; i < shape.cols; ++i) {
                             A sum = 0;
                             for (int64_t p = 0; p < parts; ++p) sum += partial[p * shape.cols + i];
                             dg[i] = static_cast<scalar_t>(sum);
                           }
                         });
                       });
                     });
  return {dx, dgamma};
}

// ---- autograd ------------------------------------------------------------------------

class RmsNorm : public torch::autograd::Function<RmsNorm> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& self, const Tensor& gamma, double epsilon) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double)>("npu::npu_rms_norm");
    auto [y, rstd] = op.call(self, gamma, epsilon);
    ctx->save_for_backward({self, gamma, rstd});
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>(
        "npu::npu_rms_norm_backward");
    auto [dx, dgamma] = op.call(grads[0].defined() ? grads[0] : at::zeros_like(saved[0]), saved[0], saved[1], saved[2]);
    return {dx, dgamma, Tensor()};
  }
};

std::tuple<Tensor, Tensor> npu_rms_norm_autograd(const Tensor& self, const Tensor& gamma, double epsilon) {
  auto r = RmsNorm::apply(self, gamma, epsilon);
  return {r[0], r[1]};
}

class AddRmsNorm : public torch::autograd::Function<AddRmsNorm> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x1, const Tensor& x2, const Tensor& gamma,
                               double epsilon) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double)>(
        "npu::npu_add_rms_norm");
    auto [y, rstd, sum] = op.call(x1, x2, gamma, epsilon);
    ctx->save_for_backward({sum, gamma, rstd});
    ctx->mark_non_differentiable({rstd});
    return {y, rstd, sum};
  }
  // x = x1 + x2 feeds both y and the returned sum: its gradient is dx(y) + d(sum).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>(
        "npu::npu_rms_norm_backward");
    auto [dx, dgamma] = op.call(grads[0].defined() ? grads[0] : at::zeros_like(saved[0]), saved[0], saved[1], saved[2]);
    if (grads[2].defined()) dx = at::add(dx, grads[2]);
    return {dx, dx, dgamma, Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> npu_add_rms_norm_autograd(const Tensor& x1, const Tensor& x2, const Tensor& gamma,
                                                             double epsilon) {
  auto r = AddRmsNorm::apply(x1, x2, gamma, epsilon);
  return {r[0], r[1], r[2]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)");
  m.def("npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)");
  m.def("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_rms_norm", TORCH_FN(npu_rms_norm));
  m.impl("npu_rms_norm_backward", TORCH_FN(npu_rms_norm_backward));
  m.impl("npu_add_rms_norm", TORCH_FN(npu_add_rms_norm));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) {
  m.impl("npu_rms_norm", TORCH_FN(npu_rms_norm_autograd));
  m.impl("npu_add_rms_norm", TORCH_FN(npu_add_rms_norm_autograd));
}

}  // namespace torch_npu::custom_ops
