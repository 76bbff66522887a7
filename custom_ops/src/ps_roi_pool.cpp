// Position-sensitive RoI pooling (R-FCN): npu_ps_roi_pooling and npu_ps_roi_pooling_backward,
// with op-plugin's schemas, and autograd.
//
// self [N, output_dim * group_size^2, H, W]; rois [N, 5, R] (per image R boxes: batch index,
// x1, y1, x2, y2); output [N * R, output_dim, group_size, group_size], RoI k = b * R + r.
// Output (k, c, i, j) averages input channel (c * group_size + i) * group_size + j over bin
// (i, j) of RoI k, as R-FCN's PSROIPooling: box corners rounded to integers, the end
// inclusive (+1), scaled by spatial_scale; bin (i, j) spans rows [floor(i * bin_h),
// ceil((i + 1) * bin_h)) from the box start, clipped to the map; an empty bin gives 0.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fused.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using vmath::acc_t;

struct Bin {
  int64_t batch, hs, he, ws, we;
  bool empty() const { return he <= hs || we <= ws; }
};

// floor/ceil of a map coordinate clipped to [0, hi]; NaN and -inf give 0, +inf gives hi.
int64_t clip(double v, int64_t hi) {
  if (!(v > 0)) return 0;
  return v >= static_cast<double>(hi) ? hi : static_cast<int64_t>(v);
}

// Bin (i, j) of RoI r of image b; `rois` points at image b's [5, R] block.
template <typename T>
Bin ps_bin(const T* rois, int64_t R, int64_t r, double scale, int64_t gs, int64_t i, int64_t j, int64_t H,
           int64_t W) {
  auto at = [&](int64_t f) { return static_cast<double>(rois[f * R + r]); };
  const double sw = std::round(at(1)) * scale, sh = std::round(at(2)) * scale;
  const double ew = (std::round(at(3)) + 1.0) * scale, eh = (std::round(at(4)) + 1.0) * scale;
  const double bw = std::max(ew - sw, 0.1) / gs, bh = std::max(eh - sh, 0.1) / gs;
  Bin b;
  b.batch = static_cast<int64_t>(at(0));
  b.hs = clip(std::floor(i * bh + sh), H), b.he = clip(std::ceil((i + 1) * bh + sh), H);
  b.ws = clip(std::floor(j * bw + sw), W), b.we = clip(std::ceil((j + 1) * bw + sw), W);
  return b;
}

void check_common(const char* op, const Tensor& rois, int64_t group_size, int64_t output_dim) {
  check_float(op, "rois", rois, 3);
  TORCH_CHECK(rois.size(1) == 5, op, ": expected rois of shape [batch, 5, rois_num] (batch index, x1, y1, x2, y2), got ",
              rois.sizes());
  TORCH_CHECK(group_size > 0 && group_size < 128, op, ": expected group_size in (0, 128), got ", group_size);
  TORCH_CHECK(output_dim > 0, op, ": expected output_dim > 0, got ", output_dim);
}

// A batch index outside the map's batch is an error (checked in the kernel: reading the
// indices on the host would synchronise).
void check_batch(const char* op, const Bin& b, int64_t k, int64_t N) {
  TORCH_CHECK(b.batch >= 0 && b.batch < N, op, ": RoI ", k, " has batch index ", b.batch,
              ", expected one in [0, ", N, ")");
}

Tensor npu_ps_roi_pooling(const Tensor& self, const Tensor& rois, double spatial_scale, int64_t group_size,
                          int64_t output_dim) {
  constexpr const char* op = "npu_ps_roi_pooling";
  const auto device = npu_device(op, {{"self", self}, {"rois", rois}});
  check_float(op, "self", self, 4);
  check_common(op, rois, group_size, output_dim);
  const int64_t N = self.size(0), C = self.size(1), H = self.size(2), W = self.size(3);
  const int64_t gs = group_size, D = output_dim;
  TORCH_CHECK(C == D * gs * gs, op, ": expected self to have output_dim * group_size^2 = ", D * gs * gs,
              " channels, got self of shape ", self.sizes());
  TORCH_CHECK(rois.size(0) == N, op, ": expected rois of shape [", N, ", 5, rois_num] (one block per image of self), got ",
              rois.sizes());
  const int64_t R = rois.size(2), K = N * R;
  Tensor out = at::empty({K, D, gs, gs}, self.options());
  const Tensor r = dense(rois).to(self.scalar_type());
  ops::launch_kernel(op, device, {dense(self), r, out}, out.numel() * 4, [=](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), op, [&] {
      using A = acc_t<scalar_t>;
      const auto* x = t[0].const_data_ptr<scalar_t>();
      const auto* rp = t[1].const_data_ptr<scalar_t>();
      auto* y = t[2].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, K * D, 1, [&](int64_t begin, int64_t end) {
        for (int64_t kd = begin; kd < end; ++kd) {
          const int64_t k = kd / D, d = kd % D;
          for (int64_t i = 0; i < gs; ++i) {
            for (int64_t j = 0; j < gs; ++j) {
              const Bin b = ps_bin(rp + (k / R) * 5 * R, R, k % R, spatial_scale, gs, i, j, H, W);
              A acc = 0;
              if (!b.empty()) {
                check_batch(op, b, k, N);
                const scalar_t* plane = x + (b.batch * C + (d * gs + i) * gs + j) * H * W;
                for (int64_t h = b.hs; h < b.he; ++h) {
                  for (int64_t w = b.ws; w < b.we; ++w) acc += A(plane[h * W + w]);
                }
                acc /= A((b.he - b.hs) * (b.we - b.ws));
              }
              y[(kd * gs + i) * gs + j] = static_cast<scalar_t>(acc);
            }
          }
        }
      });
    });
  });
  return out;
}

// The adjoint: each output gradient spread evenly over its bin. input_size is [H, W] of the
// map; the gradient has rois.size(0) images (as op-plugin).
Tensor npu_ps_roi_pooling_backward(const Tensor& output_grad, const Tensor& rois, double spatial_scale,
                                   int64_t group_size, int64_t output_dim, c10::IntArrayRef input_size) {
  constexpr const char* op = "npu_ps_roi_pooling_backward";
  const auto device = npu_device(op, {{"output_grad", output_grad}, {"rois", rois}});
  check_float(op, "output_grad", output_grad, 4);
  check_common(op, rois, group_size, output_dim);
  TORCH_CHECK(input_size.size() == 2 && input_size[0] >= 0 && input_size[1] >= 0, op,
              ": expected input_size to be [H, W] with H, W >= 0, got ", input_size);
  const int64_t gs = group_size, D = output_dim, N = rois.size(0), R = rois.size(2), K = N * R;
  const int64_t H = input_size[0], W = input_size[1], C = D * gs * gs;
  TORCH_CHECK(output_grad.sizes() == c10::IntArrayRef({K, D, gs, gs}), op, ": expected output_grad of shape [", K,
              ", ", D, ", ", gs, ", ", gs, "] (batch * rois_num, output_dim, group_size, group_size), got ",
              output_grad.sizes());
  Tensor dx = at::zeros({N, C, H, W}, output_grad.options());
  const Tensor r = dense(rois).to(output_grad.scalar_type());
  ops::launch_kernel(op, device, {dense(output_grad), r, dx}, output_grad.numel() * 4,
                     [=](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), op, [&] {
                         using A = acc_t<scalar_t>;
                         const auto* gy = t[0].const_data_ptr<scalar_t>();
                         const auto* rp = t[1].const_data_ptr<scalar_t>();
                         auto* gx = t[2].mutable_data_ptr<scalar_t>();
                         // Parallel over input channels: channel c receives only from (d, i, j) = c.
                         at::parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
                           for (int64_t c = begin; c < end; ++c) {
                             const int64_t d = c / (gs * gs), i = (c / gs) % gs, j = c % gs;
                             for (int64_t k = 0; k < K; ++k) {
                               const Bin b = ps_bin(rp + (k / R) * 5 * R, R, k % R, spatial_scale, gs, i, j, H, W);
                               if (b.empty()) continue;
                               check_batch(op, b, k, N);
                               const A g = A(gy[((k * D + d) * gs + i) * gs + j]) /
                                           A((b.he - b.hs) * (b.we - b.ws));
                               scalar_t* plane = gx + (b.batch * C + c) * H * W;
                               for (int64_t h = b.hs; h < b.he; ++h) {
                                 for (int64_t w = b.ws; w < b.we; ++w) {
                                   plane[h * W + w] = static_cast<scalar_t>(A(plane[h * W + w]) + g);
                                 }
                               }
                             }
                           }
                         });
                       });
                     });
  return dx;
}

class PsRoiPooling : public torch::autograd::Function<PsRoiPooling> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& rois, double spatial_scale,
                        int64_t group_size, int64_t output_dim) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd =
        op_handle<Tensor(const Tensor&, const Tensor&, double, int64_t, int64_t)>("npu::npu_ps_roi_pooling");
    ctx->save_for_backward({rois});
    ctx->saved_data["hw"] = std::vector<int64_t>{self.size(2), self.size(3)};
    ctx->saved_data["scale"] = spatial_scale;
    ctx->saved_data["gs"] = group_size;
    ctx->saved_data["od"] = output_dim;
    return fwd.call(self, rois, spatial_scale, group_size, output_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&, double, int64_t, int64_t, c10::IntArrayRef)>(
        "npu::npu_ps_roi_pooling_backward");
    const auto saved = ctx->get_saved_variables();
    const auto hw = ctx->saved_data["hw"].toIntVector();
    return {bwd.call(grads[0].contiguous(), saved[0], ctx->saved_data["scale"].toDouble(),
                     ctx->saved_data["gs"].toInt(), ctx->saved_data["od"].toInt(), hw),
            Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor ps_roi_pooling_autograd(const Tensor& self, const Tensor& rois, double spatial_scale, int64_t group_size,
                               int64_t output_dim) {
  return PsRoiPooling::apply(self, rois, spatial_scale, group_size, output_dim);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_ps_roi_pooling(Tensor self, Tensor rois, float spatial_scale, int group_size, int output_dim) -> Tensor");
  m.def(
      "npu_ps_roi_pooling_backward(Tensor output_grad, Tensor rois, float spatial_scale, int group_size, "
      "int output_dim, SymInt[] input_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_ps_roi_pooling", TORCH_FN(npu_ps_roi_pooling));
  m.impl("npu_ps_roi_pooling_backward", TORCH_FN(npu_ps_roi_pooling_backward));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) { m.impl("npu_ps_roi_pooling", TORCH_FN(ps_roi_pooling_autograd)); }

}  // namespace torch_npu::custom_ops
