// Detection kernels: npu_iou/npu_ptiou, npu_giou (+ backward), npu_nms_v4,
// npu_nms_with_mask, npu_nms_rotated, npu_roi_align (+ npu_roi_alignbk) and the
// modulated deformable convolution npu_deformable_conv2d (+ npu_deformable_conv2dbk),
// with torch_npu's schemas; autograd where torch_npu has a backward.
#include <ATen/Parallel.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "fused.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using vmath::acc_t;

void check_boxes(const char* op, const char* arg, const Tensor& t, int64_t cols) {
  check_float(op, arg, t, 2);
  TORCH_CHECK(t.size(1) == cols, op, ": expected ", arg, " of shape [N, ", cols, "], got ", t.sizes());
}

// ---- npu_iou / npu_ptiou -----------------------------------------------------------------------
// overlap[m, n] between gtboxes[m] and bboxes[n] (x1, y1, x2, y2): IoU (mode 0) or the
// intersection over the gt box's area (IoF, mode 1).

Tensor npu_iou(const Tensor& bboxes, const Tensor& gtboxes, int64_t mode) {
  constexpr const char* op = "npu_iou";
  const auto device = npu_device(op, {{"bboxes", bboxes}, {"gtboxes", gtboxes}});
  check_boxes(op, "bboxes", bboxes, 4);
  check_boxes(op, "gtboxes", gtboxes, 4);
  check_dtype(op, "gtboxes", gtboxes, bboxes.scalar_type());
  TORCH_CHECK(mode == 0 || mode == 1, op, ": expected mode 0 (iou) or 1 (iof), got ", mode);
  const int64_t n = bboxes.size(0), m = gtboxes.size(0);
  Tensor out = at::empty({m, n}, bboxes.options());
  ops::launch_kernel(op, device, {dense(bboxes), dense(gtboxes), out}, n * m, [n, m, mode](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_iou", [&] {
      using A = acc_t<scalar_t>;
      const auto* b = t[0].const_data_ptr<scalar_t>();
      const auto* g = t[1].const_data_ptr<scalar_t>();
      auto* o = t[2].mutable_data_ptr<scalar_t>();
      at::parallel_for(0, m, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          const A gx1 = g[j * 4], gy1 = g[j * 4 + 1], gx2 = g[j * 4 + 2], gy2 = g[j * 4 + 3];
          const A garea = (gx2 - gx1) * (gy2 - gy1);
          for (int64_t i = 0; i < n; ++i) {
            const A bx1 = b[i * 4], by1 = b[i * 4 + 1], bx2 = b[i * 4 + 2], by2 = b[i * 4 + 3];
            const A iw = std::max(A(0), std::min(bx2, gx2) - std::max(bx1, gx1));
            const A ih = std::max(A(0), std::min(by2, gy2) - std::max(by1, gy1));
            const A inter = iw * ih;
            const A denom = mode == 0 ? (bx2 - bx1) * (by2 - by1) + garea - inter : garea;
            o[j * n + i] = static_cast<scalar_t>(denom > A(0) ? inter / denom : A(0));
          }
        }
      });
    });
  });
  return out;
}

Tensor npu_ptiou(const Tensor& bboxes, const Tensor& gtboxes, int64_t mode) { return npu_iou(bboxes, gtboxes, mode); }

// ---- npu_anchor_response_flags ---------------------------------------------------------------
// uint8 [feat_h * feat_w * num_base_anchors]: 1 for every anchor of a grid cell that holds a
// gt box's centre; the cell is floor(centre / stride) clamped to the map (stride[0] divides
// x, stride[1] y, as torch_npu's reference computation does).
Tensor npu_anchor_response_flags(const Tensor& self, at::IntArrayRef featmap_size, at::IntArrayRef stride,
                                 int64_t num_base_anchors) {
  constexpr const char* op = "npu_anchor_response_flags";
  const auto device = npu_device(op, {{"self", self}});
  check_boxes(op, "self", self, 4);
  TORCH_CHECK(featmap_size.size() == 2 && featmap_size[0] > 0 && featmap_size[1] > 0, op,
              ": expected featmap_size [h, w] of two positive ints, got ", featmap_size);
  TORCH_CHECK(stride.size() == 2 && stride[0] > 0 && stride[1] > 0, op, ": expected stride of two positive ints, got ",
              stride);
  TORCH_CHECK(num_base_anchors > 0, op, ": expected a positive num_base_anchors, got ", num_base_anchors);
  const int64_t h = featmap_size[0], w = featmap_size[1], anchors = num_base_anchors;
  int64_t cells = 0, total = 0;
  TORCH_CHECK(!__builtin_mul_overflow(h, w, &cells) && !__builtin_mul_overflow(cells, anchors, &total), op,
              ": featmap_size ", featmap_size, " x num_base_anchors ", anchors, " overflows");
  Tensor flags = at::empty({total}, self.options().dtype(at::kByte));
  const double sx = static_cast<double>(stride[0]), sy = static_cast<double>(stride[1]);
  ops::launch_kernel(op, device, {dense(self), flags}, total, [=](const std::vector<Tensor>& t) {
    auto* out = t[1].mutable_data_ptr<uint8_t>();
    std::fill(out, out + total, uint8_t(0));
    // The cell of a centre coordinate c (NaN counts as 0, as the integer cast of the reference clamps it).
    auto cell = [](double c, double s, int64_t size) {
      const double g = std::floor(c / s);
      return std::isnan(g) ? int64_t(0) : static_cast<int64_t>(std::clamp(g, 0.0, static_cast<double>(size - 1)));
    };
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_anchor_response_flags", [&] {
      const auto* b = t[0].const_data_ptr<scalar_t>();
      for (int64_t i = 0; i < t[0].size(0); ++i) {
        const double cx = (double(b[i * 4]) + double(b[i * 4 + 2])) * 0.5;
        const double cy = (double(b[i * 4 + 1]) + double(b[i * 4 + 3])) * 0.5;
        const int64_t idx = cell(cy, sy, h) * w + cell(cx, sx, w);
        std::fill(out + idx * anchors, out + (idx + 1) * anchors, uint8_t(1));
      }
    });
  });
  return flags;
}

// ---- npu_giou --------------------------------------------------------------------------------
// Boxes are columns: self [4, N], gtboxes [4, M]; rows x1, y1, x2, y2 (or cx, cy, w, h when
// trans). Output [N, 1] (box i with gt box i) or, is_cross, [N, M] (torch_npu's shapes).

template <typename A>
struct Box {
  A x1, y1, x2, y2;
};

template <typename T, typename A = acc_t<T>>
Box<A> load_box(const T* p, int64_t stride, int64_t i, bool trans) {
  const A a = p[i], b = p[stride + i], c = p[2 * stride + i], d = p[3 * stride + i];
  if (trans) return {a - c / 2, b - d / 2, a + c / 2, b + d / 2};
  return {a, b, c, d};
}

constexpr double kGiouEps = 1e-16;

template <typename A>
A giou_value(const Box<A>& p, const Box<A>& q, int64_t mode) {
  const A iw = std::min(p.x2, q.x2) - std::max(p.x1, q.x1);
  const A ih = std::min(p.y2, q.y2) - std::max(p.y1, q.y1);
  const A inter = std::max(iw, A(0)) * std::max(ih, A(0));
  const A a1 = (p.x2 - p.x1) * (p.y2 - p.y1), a2 = (q.x2 - q.x1) * (q.y2 - q.y1);
  const A u = (mode == 0 ? a1 + a2 - inter : a2) + A(kGiouEps);
  const A c = std::abs(std::max(p.x2, q.x2) - std::min(p.x1, q.x1)) * std::abs(std::max(p.y2, q.y2) - std::min(p.y1, q.y1));
  return inter / u - (c - u) / c;
}

// d giou / d (x1, y1, x2, y2) of both boxes.
template <typename A>
void giou_grad(const Box<A>& p, const Box<A>& q, int64_t mode, A g, A dp[4], A dq[4]) {
  const A iw = std::min(p.x2, q.x2) - std::max(p.x1, q.x1);
  const A ih = std::min(p.y2, q.y2) - std::max(p.y1, q.y1);
  const A riw = std::max(iw, A(0)), rih = std::max(ih, A(0));
  const A inter = riw * rih;
  const A a1 = (p.x2 - p.x1) * (p.y2 - p.y1), a2 = (q.x2 - q.x1) * (q.y2 - q.y1);
  const A u = (mode == 0 ? a1 + a2 - inter : a2) + A(kGiouEps);
  const A ow = std::max(p.x2, q.x2) - std::min(p.x1, q.x1), oh = std::max(p.y2, q.y2) - std::min(p.y1, q.y1);
  const A c = std::abs(ow) * std::abs(oh);
  // G = I/U - 1 + U/C
  const A dG_dU = -inter / (u * u) + A(1) / c;
  const A dG_dC = -u / (c * c);
  const A dG_dI = A(1) / u + (mode == 0 ? -dG_dU : A(0));
  const A dG_dA1 = mode == 0 ? dG_dU : A(0);
  const A dG_dA2 = dG_dU;
  for (int k = 0; k < 4; ++k) dp[k] = dq[k] = A(0);
  // intersection
  const A dI_diw = iw > 0 && ih > 0 ? rih : A(0), dI_dih = iw > 0 && ih > 0 ? riw : A(0);
  const A giw = dG_dI * dI_diw, gih = dG_dI * dI_dih;
  (p.x2 <= q.x2 ? dp[2] : dq[2]) += giw;
  (p.x1 >= q.x1 ? dp[0] : dq[0]) -= giw;
  (p.y2 <= q.y2 ? dp[3] : dq[3]) += gih;
  (p.y1 >= q.y1 ? dp[1] : dq[1]) -= gih;
  // areas
  const A pw = p.x2 - p.x1, ph = p.y2 - p.y1, qw = q.x2 - q.x1, qh = q.y2 - q.y1;
  dp[2] += dG_dA1 * ph, dp[0] -= dG_dA1 * ph, dp[3] += dG_dA1 * pw, dp[1] -= dG_dA1 * pw;
  dq[2] += dG_dA2 * qh, dq[0] -= dG_dA2 * qh, dq[3] += dG_dA2 * qw, dq[1] -= dG_dA2 * qw;
  // enclosing box
  const A sw = ow >= 0 ? A(1) : A(-1), sh = oh >= 0 ? A(1) : A(-1);
  const A gow = dG_dC * std::abs(oh) * sw, goh = dG_dC * std::abs(ow) * sh;
  (p.x2 >= q.x2 ? dp[2] : dq[2]) += gow;
  (p.x1 <= q.x1 ? dp[0] : dq[0]) -= gow;
  (p.y2 >= q.y2 ? dp[3] : dq[3]) += goh;
  (p.y1 <= q.y1 ? dp[1] : dq[1]) -= goh;
  for (int k = 0; k < 4; ++k) dp[k] *= g, dq[k] *= g;
}

// (x1, y1, x2, y2) gradients to the stored coordinates (cx, cy, w, h when trans).
template <typename A>
void to_stored(A d[4], bool trans) {
  if (!trans) return;
  const A dx1 = d[0], dy1 = d[1], dx2 = d[2], dy2 = d[3];
  d[0] = dx1 + dx2, d[1] = dy1 + dy2, d[2] = (dx2 - dx1) / 2, d[3] = (dy2 - dy1) / 2;
}

void check_giou_args(const char* op, const Tensor& self, const Tensor& gtboxes, bool is_cross, int64_t mode) {
  check_float(op, "self", self, 2);
  check_float(op, "gtboxes", gtboxes, 2);
  check_dtype(op, "gtboxes", gtboxes, self.scalar_type());
  TORCH_CHECK(self.size(0) == 4, op, ": expected self of shape [4, N] (boxes as columns), got ", self.sizes());
  TORCH_CHECK(gtboxes.size(0) == 4, op, ": expected gtboxes of shape [4, M] (boxes as columns), got ", gtboxes.sizes());
  TORCH_CHECK(is_cross || gtboxes.size(1) == self.size(1), op,
              ": with is_cross=False expected gtboxes of shape [4, ", self.size(1), "] (one gt box per box), got ",
              gtboxes.sizes());
  TORCH_CHECK(mode == 0 || mode == 1, op, ": expected mode 0 (iou) or 1 (iof), got ", mode);
}

Tensor npu_giou(const Tensor& self, const Tensor& gtboxes, bool trans, bool is_cross, int64_t mode) {
  constexpr const char* op = "npu_giou";
  const auto device = npu_device(op, {{"self", self}, {"gtboxes", gtboxes}});
  check_giou_args(op, self, gtboxes, is_cross, mode);
  const int64_t n = self.size(1), m = gtboxes.size(1);
  const int64_t cols = is_cross ? m : 1;
  // As torch_npu: [n, 1] (one value per box), or [n, m] with is_cross.
  Tensor out = at::empty({n, cols}, self.options());
  ops::launch_kernel(op, device, {dense(self), dense(gtboxes), out}, cols * n,
                     [n, m, cols, trans, is_cross, mode](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_giou", [&] {
                         const auto* b = t[0].const_data_ptr<scalar_t>();
                         const auto* g = t[1].const_data_ptr<scalar_t>();
                         auto* o = t[2].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, cols * n, 4096, [&](int64_t begin, int64_t end) {
                           for (int64_t k = begin; k < end; ++k) {
                             const int64_t i = k / cols, j = k % cols;
                             const auto p = load_box(b, n, i, trans);
                             const auto q = load_box(g, m, is_cross ? j : i, trans);
                             o[k] = static_cast<scalar_t>(giou_value(p, q, mode));
                           }
                         });
                       });
                     });
  return out;
}

std::tuple<Tensor, Tensor> npu_giou_backward(const Tensor& grad, const Tensor& bboxes, const Tensor& gtboxes,
                                             bool trans, bool is_cross, int64_t mode) {
  constexpr const char* op = "npu_giou_backward";
  const auto device = npu_device(op, {{"grad", grad}, {"bboxes", bboxes}, {"gtboxes", gtboxes}});
  check_giou_args(op, bboxes, gtboxes, is_cross, mode);
  TORCH_CHECK(!is_cross, op, ": the backward supports is_cross=False only (as torch_npu)");
  check_dtype(op, "grad", grad, bboxes.scalar_type());
  const int64_t n = bboxes.size(1);
  TORCH_CHECK(grad.numel() == n && (grad.dim() == 1 || (grad.dim() == 2 && (grad.size(0) == 1 || grad.size(1) == 1))),
              op, ": expected grad of shape [", n, ", 1], got ", grad.sizes());
  Tensor db = at::empty(bboxes.sizes(), bboxes.options());
  Tensor dg = at::empty(gtboxes.sizes(), gtboxes.options());
  ops::launch_kernel(op, device, {dense(grad), dense(bboxes), dense(gtboxes), db, dg}, n,
                     [n, trans, mode](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_giou_backward", [&] {
                         using A = acc_t<scalar_t>;
                         const auto* gr = t[0].const_data_ptr<scalar_t>();
                         const auto* b = t[1].const_data_ptr<scalar_t>();
                         const auto* g = t[2].const_data_ptr<scalar_t>();
                         auto* db = t[3].mutable_data_ptr<scalar_t>();
                         auto* dg = t[4].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
                           for (int64_t i = begin; i < end; ++i) {
                             A dp[4], dq[4];
                             giou_grad(load_box(b, n, i, trans), load_box(g, n, i, trans), mode, A(gr[i]), dp, dq);
                             to_stored(dp, trans);
                             to_stored(dq, trans);
                             for (int k = 0; k < 4; ++k) {
                               db[k * n + i] = static_cast<scalar_t>(dp[k]);
                               dg[k * n + i] = static_cast<scalar_t>(dq[k]);
                             }
                           }
                         });
                       });
                     });
  return {db, dg};
}

// ---- NMS ---------------------------------------------------------------------------------------

template <typename A>
A box_iou(const A* a, const A* b) {  // corners in any order
  const A ax1 = std::min(a[0], a[2]), ax2 = std::max(a[0], a[2]), ay1 = std::min(a[1], a[3]), ay2 = std::max(a[1], a[3]);
  const A bx1 = std::min(b[0], b[2]), bx2 = std::max(b[0], b[2]), by1 = std::min(b[1], b[3]), by2 = std::max(b[1], b[3]);
  const A iw = std::max(A(0), std::min(ax2, bx2) - std::max(ax1, bx1));
  const A ih = std::max(A(0), std::min(ay2, by2) - std::max(ay1, by1));
  const A inter = iw * ih;
  const A uni = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter;
  return uni > A(0) ? inter / uni : A(0);
}

// Greedy NMS over candidates (indices, sorted by descending score, stable): keeps a box
// unless its IoU with a kept box exceeds the threshold; stops after `limit` kept boxes.
template <typename A, typename IoU>
std::vector<int64_t> greedy_nms(const std::vector<int64_t>& order, double iou_threshold, int64_t limit, IoU&& iou) {
  std::vector<int64_t> keep;
  for (int64_t idx : order) {
    if (limit >= 0 && static_cast<int64_t>(keep.size()) >= limit) break;
    bool ok = true;
    for (int64_t k : keep) {
      if (iou(k, idx) > A(iou_threshold)) {
        ok = false;
        break;
      }
    }
    if (ok) keep.push_back(idx);
  }
  return keep;
}

template <typename T>
std::vector<int64_t> score_order(const T* scores, int64_t n, bool use_threshold, double threshold) {
  std::vector<int64_t> order;
  order.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (!use_threshold || static_cast<double>(scores[i]) > threshold) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  return order;
}

double scalar_value(const char* op, const char* arg, const Tensor& t) {
  TORCH_CHECK(t.numel() == 1, op, ": expected ", arg, " to be a 0-dimensional (one-element) tensor, got shape ",
              t.sizes());
  return t.item<double>();
}

std::tuple<Tensor, Tensor> npu_nms_v4(const Tensor& self, const Tensor& scores, const at::Scalar& max_output_size,
                                      const Tensor& iou_threshold, const Tensor& scores_threshold,
                                      bool pad_to_max_output_size) {
  constexpr const char* op = "npu_nms_v4";
  const auto device = npu_device(op, {{"self", self}, {"scores", scores}});
  check_boxes(op, "self", self, 4);
  check_float(op, "scores", scores, 1);
  TORCH_CHECK(scores.size(0) == self.size(0), op, ": expected scores of shape [", self.size(0), "], got ",
              scores.sizes());
  const int64_t max_out = max_output_size.toLong();
  TORCH_CHECK(max_out >= 0, op, ": expected max_output_size >= 0, got ", max_out);
  const double iou_thr = scalar_value(op, "iou_threshold", iou_threshold);
  const double score_thr = scalar_value(op, "scores_threshold", scores_threshold);
  const int64_t n = self.size(0);
  const int64_t cap = pad_to_max_output_size ? max_out : std::min(max_out, n);
  Tensor selected = at::zeros({cap}, self.options().dtype(at::kInt));
  Tensor valid = at::empty({}, self.options().dtype(at::kInt));
  const Tensor boxes = dense(self).to(at::kFloat), sc = dense(scores).to(at::kFloat);
  ops::launch_kernel(op, device, {boxes, sc, selected, valid}, n * n,
                     [n, cap, iou_thr, score_thr](const std::vector<Tensor>& t) {
                       const float* b = t[0].const_data_ptr<float>();
                       const auto order = score_order(t[1].const_data_ptr<float>(), n, true, score_thr);
                       const auto keep = greedy_nms<float>(order, iou_thr, cap,
                                                           [&](int64_t i, int64_t j) { return box_iou(b + 4 * i, b + 4 * j); });
                       auto* s = t[2].mutable_data_ptr<int32_t>();
                       for (size_t k = 0; k < keep.size(); ++k) s[k] = static_cast<int32_t>(keep[k]);
                       *t[3].mutable_data_ptr<int32_t>() = static_cast<int32_t>(keep.size());
                     });
  if (pad_to_max_output_size) return {selected, valid};
  const int64_t count = valid.item<int64_t>();  // the output's length depends on the data
  return {selected.narrow(0, 0, count).clone(), valid};
}

// Boxes sorted by score (descending), their input indices, and whether NMS keeps each.
std::tuple<Tensor, Tensor, Tensor> npu_nms_with_mask(const Tensor& input, const at::Scalar& iou_threshold) {
  constexpr const char* op = "npu_nms_with_mask";
  const auto device = npu_device(op, {{"input", input}});
  check_float(op, "input", input, 2);
  TORCH_CHECK(input.size(1) == 5 || input.size(1) == 8, op,
              ": expected input of shape [N, 5] or [N, 8] (x1, y1, x2, y2, score[, padding]), got ", input.sizes());
  const int64_t n = input.size(0), cols = input.size(1);
  const double thr = iou_threshold.toDouble();
  Tensor boxes = at::empty({n, 5}, input.options());
  Tensor idx = at::empty({n}, input.options().dtype(at::kInt));
  Tensor mask = at::empty({n}, input.options().dtype(at::kByte));
  ops::launch_kernel(op, device, {dense(input), boxes, idx, mask}, n * n, [n, cols, thr](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_nms_with_mask", [&] {
      using A = acc_t<scalar_t>;
      const auto* in = t[0].const_data_ptr<scalar_t>();
      std::vector<A> a(n * 4), s(n);
      for (int64_t i = 0; i < n; ++i) {
        for (int k = 0; k < 4; ++k) a[i * 4 + k] = in[i * cols + k];
        s[i] = in[i * cols + 4];
      }
      const auto order = score_order(s.data(), n, false, 0.0);
      const auto keep = greedy_nms<A>(order, thr, -1, [&](int64_t i, int64_t j) { return box_iou(&a[4 * i], &a[4 * j]); });
      std::vector<uint8_t> kept(n, 0);
      for (int64_t k : keep) kept[k] = 1;
      auto* ob = t[1].mutable_data_ptr<scalar_t>();
      auto* oi = t[2].mutable_data_ptr<int32_t>();
      auto* om = t[3].mutable_data_ptr<uint8_t>();
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = order[r];
        for (int k = 0; k < 5; ++k) ob[r * 5 + k] = in[i * cols + k];
        oi[r] = static_cast<int32_t>(i);
        om[r] = kept[i];
      }
    });
  });
  return {boxes, idx, mask};
}

// Rotated boxes: (cx, cy, w, h, angle in degrees), or (x1, y1, x2, y2, angle) for mode 1.
struct Pt {
  double x, y;
};

std::vector<Pt> rotated_corners(const float* r, int64_t mode) {
  double cx = r[0], cy = r[1], w = r[2], h = r[3], angle = r[4];
  if (mode == 1) cx = (r[0] + r[2]) / 2, cy = (r[1] + r[3]) / 2, w = r[2] - r[0], h = r[3] - r[1], angle = -r[4];
  const double th = angle * M_PI / 180.0, c = std::cos(th) / 2, s = std::sin(th) / 2;
  // counter-clockwise for w, h > 0
  return {{cx - c * w + s * h, cy - s * w - c * h},
          {cx + c * w + s * h, cy + s * w - c * h},
          {cx + c * w - s * h, cy + s * w + c * h},
          {cx - c * w - s * h, cy - s * w + c * h}};
}

double polygon_area(const std::vector<Pt>& p) {
  double a = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const Pt& u = p[i];
    const Pt& v = p[(i + 1) % p.size()];
    a += u.x * v.y - u.y * v.x;
  }
  return std::abs(a) / 2;
}

// Sutherland-Hodgman: the part of convex polygon `subject` inside convex `clip` (both CCW).
std::vector<Pt> clip_polygon(std::vector<Pt> subject, const std::vector<Pt>& clip) {
  for (size_t e = 0; e < clip.size() && !subject.empty(); ++e) {
    const Pt a = clip[e], b = clip[(e + 1) % clip.size()];
    auto side = [&](const Pt& p) { return (b.x - a.x) * (p.y - a.y) - (b.y - a.y) * (p.x - a.x); };
    std::vector<Pt> out;
    for (size_t i = 0; i < subject.size(); ++i) {
      const Pt p = subject[i], q = subject[(i + 1) % subject.size()];
      const double sp = side(p), sq = side(q);
      if (sp >= 0) out.push_back(p);
      if ((sp >= 0) != (sq >= 0)) {
        const double f = sp / (sp - sq);
        out.push_back({p.x + f * (q.x - p.x), p.y + f * (q.y - p.y)});
      }
    }
    subject = std::move(out);
  }
  return subject;
}

std::vector<Pt> ccw(std::vector<Pt> p) {
  double a = 0;
  for (size_t i = 0; i < p.size(); ++i) a += p[i].x * p[(i + 1) % p.size()].y - p[i].y * p[(i + 1) % p.size()].x;
  if (a < 0) std::reverse(p.begin(), p.end());
  return p;
}

std::tuple<Tensor, Tensor> npu_nms_rotated(const Tensor& self, const Tensor& scores, double iou_threshold,
                                           double scores_threshold, int64_t max_output_size, int64_t mode) {
  constexpr const char* op = "npu_nms_rotated";
  const auto device = npu_device(op, {{"self", self}, {"scores", scores}});
  check_boxes(op, "self", self, 5);
  check_float(op, "scores", scores, 1);
  TORCH_CHECK(scores.size(0) == self.size(0), op, ": expected scores of shape [", self.size(0), "], got ",
              scores.sizes());
  TORCH_CHECK(mode == 0 || mode == 1, op, ": expected mode 0 (x, y, w, h, angle) or 1 (x1, y1, x2, y2, angle), got ",
              mode);
  const int64_t n = self.size(0);
  Tensor selected = at::empty({n}, self.options().dtype(at::kInt));
  Tensor num = at::empty({1}, self.options().dtype(at::kInt));
  const Tensor boxes = dense(self).to(at::kFloat), sc = dense(scores).to(at::kFloat);
  ops::launch_kernel(op, device, {boxes, sc, selected, num}, n * n,
                     [n, iou_threshold, scores_threshold, max_output_size, mode](const std::vector<Tensor>& t) {
                       const float* b = t[0].const_data_ptr<float>();
                       std::vector<std::vector<Pt>> poly(n);
                       std::vector<double> area(n);
                       for (int64_t i = 0; i < n; ++i) {
                         poly[i] = ccw(rotated_corners(b + 5 * i, mode));
                         area[i] = polygon_area(poly[i]);
                       }
                       const auto order = score_order(t[1].const_data_ptr<float>(), n, true, scores_threshold);
                       const auto keep = greedy_nms<double>(order, iou_threshold, max_output_size, [&](int64_t i, int64_t j) {
                         const double inter = polygon_area(clip_polygon(poly[j], poly[i]));
                         const double uni = area[i] + area[j] - inter;
                         return uni > 0 ? inter / uni : 0.0;
                       });
                       auto* s = t[2].mutable_data_ptr<int32_t>();
                       for (size_t k = 0; k < keep.size(); ++k) s[k] = static_cast<int32_t>(keep[k]);
                       *t[3].mutable_data_ptr<int32_t>() = static_cast<int32_t>(keep.size());
                     });
  const int64_t count = num.item<int64_t>();  // the output's length depends on the data
  return {selected.narrow(0, 0, count).clone(), num};
}

// ---- RoI Align ----------------------------------------------------------------------------------
// rois [K, 5]: (batch index, x1, y1, x2, y2) in image coordinates. roi_end_mode 0: the
// region is [x1, x2] * spatial_scale, at least 1 wide; 1: the end is (x2 + 1) * scale;
// 3 (torch_npu's ROIAlign(aligned=True)): both ends shifted by -0.5 pixel, no minimum.
// sample_num 0 takes ceil(region / pooled) samples per bin.

// The most samples per bin axis (sample_num, or the adaptive grid of sample_num 0).
constexpr int64_t kMaxRoiSamples = 1024;

struct RoiGeom {
  int64_t batch;
  double x0, y0, bin_w, bin_h;
  int64_t gw, gh;
};

template <typename T>
RoiGeom roi_geom(const T* r, double scale, int64_t ph, int64_t pw, int64_t sample_num, int64_t mode) {
  RoiGeom g;
  g.batch = static_cast<int64_t>(r[0]);
  const double off = mode == 3 ? 0.5 : 0.0;
  const double end_add = mode == 1 ? 1.0 : 0.0;
  const double x1 = static_cast<double>(r[1]) * scale - off, y1 = static_cast<double>(r[2]) * scale - off;
  const double x2 = (static_cast<double>(r[3]) + end_add) * scale - off, y2 = (static_cast<double>(r[4]) + end_add) * scale - off;
  double w = x2 - x1, h = y2 - y1;
  if (mode != 3) w = std::max(w, 1.0), h = std::max(h, 1.0);
  g.x0 = x1, g.y0 = y1, g.bin_w = w / pw, g.bin_h = h / ph;
  // The adaptive grid is capped at kMaxRoiSamples per axis (NaN gives 1): a RoI of absurd size
  // (coordinates of 1e30) must not turn into an endless loop.
  auto grid = [](double v) {
    return v > 1.0 ? static_cast<int64_t>(std::min(std::ceil(v), static_cast<double>(kMaxRoiSamples))) : int64_t{1};
  };
  g.gh = sample_num > 0 ? sample_num : grid(h / ph);
  g.gw = sample_num > 0 ? sample_num : grid(w / pw);
  return g;
}

// Bilinear weights and corner offsets of (y, x) in an H x W plane; false when outside.
struct Bilinear {
  int64_t o[4];
  double w[4];
};

bool bilinear(double y, double x, int64_t H, int64_t W, Bilinear& b) {
  if (y < -1.0 || y > H || x < -1.0 || x > W) return false;
  y = std::max(y, 0.0), x = std::max(x, 0.0);
  int64_t yl = static_cast<int64_t>(y), xl = static_cast<int64_t>(x), yh, xh;
  if (yl >= H - 1) yl = yh = H - 1, y = static_cast<double>(yl);
  else yh = yl + 1;
  if (xl >= W - 1) xl = xh = W - 1, x = static_cast<double>(xl);
  else xh = xl + 1;
  const double ly = y - yl, lx = x - xl, hy = 1 - ly, hx = 1 - lx;
  b.o[0] = yl * W + xl, b.o[1] = yl * W + xh, b.o[2] = yh * W + xl, b.o[3] = yh * W + xh;
  b.w[0] = hy * hx, b.w[1] = hy * lx, b.w[2] = ly * hx, b.w[3] = ly * lx;
  return true;
}

void check_roi_args(const char* op, const Tensor& rois, int64_t ph, int64_t pw, int64_t sample_num, int64_t mode) {
  check_float(op, "rois", rois, 2);
  TORCH_CHECK(rois.size(1) == 5, op, ": expected rois of shape [K, 5] (batch index, x1, y1, x2, y2), got ",
              rois.sizes());
  TORCH_CHECK(ph > 0 && pw > 0, op, ": expected pooled_height and pooled_width > 0, got ", ph, " and ", pw);
  TORCH_CHECK(sample_num >= 0 && sample_num <= kMaxRoiSamples, op, ": expected sample_num in [0, ", kMaxRoiSamples,
              "], got ", sample_num);
  TORCH_CHECK(mode == 0 || mode == 1 || mode == 3, op, ": expected roi_end_mode 0, 1 or 3, got ", mode);
}

Tensor npu_roi_align(const Tensor& self, const Tensor& rois, double spatial_scale, int64_t pooled_height,
                     int64_t pooled_width, int64_t sample_num, int64_t roi_end_mode) {
  constexpr const char* op = "npu_roi_align";
  const auto device = npu_device(op, {{"self", self}, {"rois", rois}});
  check_float(op, "self", self, 4);
  check_roi_args(op, rois, pooled_height, pooled_width, sample_num, roi_end_mode);
  const int64_t K = rois.size(0), N = self.size(0), C = self.size(1), H = self.size(2), W = self.size(3);
  const int64_t ph = pooled_height, pw = pooled_width;
  Tensor out = at::empty({K, C, ph, pw}, self.options());
  const Tensor r = dense(rois).to(self.scalar_type());
  ops::launch_kernel(op, device, {dense(self), r, out}, out.numel() * 4,
                     [=](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_roi_align", [&] {
                         using A = acc_t<scalar_t>;
                         const auto* x = t[0].const_data_ptr<scalar_t>();
                         const auto* rp = t[1].const_data_ptr<scalar_t>();
                         auto* y = t[2].mutable_data_ptr<scalar_t>();
                         at::parallel_for(0, K * C, 1, [&](int64_t begin, int64_t end) {
                           for (int64_t kc = begin; kc < end; ++kc) {
                             const int64_t k = kc / C, c = kc % C;
                             const RoiGeom g = roi_geom(rp + 5 * k, spatial_scale, ph, pw, sample_num, roi_end_mode);
                             TORCH_CHECK(g.batch >= 0 && g.batch < N, "npu_roi_align: rois[", k, ", 0] = ", g.batch,
                                         " is not a batch index of self (N = ", N, ")");
                             const scalar_t* plane = x + (g.batch * C + c) * H * W;
                             for (int64_t i = 0; i < ph; ++i) {
                               for (int64_t j = 0; j < pw; ++j) {
                                 A acc = 0;
                                 for (int64_t iy = 0; iy < g.gh; ++iy) {
                                   const double yy = g.y0 + i * g.bin_h + (iy + 0.5) * g.bin_h / g.gh;
                                   for (int64_t ix = 0; ix < g.gw; ++ix) {
                                     const double xx = g.x0 + j * g.bin_w + (ix + 0.5) * g.bin_w / g.gw;
                                     Bilinear b;
                                     if (!bilinear(yy, xx, H, W, b)) continue;
                                     for (int q = 0; q < 4; ++q) acc += A(b.w[q]) * A(plane[b.o[q]]);
                                   }
                                 }
                                 y[(kc * ph + i) * pw + j] = static_cast<scalar_t>(acc / A(g.gh * g.gw));
                               }
                             }
                           }
                         });
                       });
                     });
  return out;
}

// The adjoint of npu_roi_align: ydiff [K, C, ph, pw] scattered into xdiff of xdiff_shape.
Tensor npu_roi_alignbk(const Tensor& self, const Tensor& rois, c10::IntArrayRef xdiff_shape, int64_t pooled_width,
                       int64_t pooled_height, double spatial_scale, int64_t sample_num,
                       std::optional<int64_t> roi_end_mode) {
  constexpr const char* op = "npu_roi_alignbk";
  const auto device = npu_device(op, {{"self", self}, {"rois", rois}});
  const int64_t mode = roi_end_mode.value_or(1);
  check_float(op, "self", self, 4);
  check_roi_args(op, rois, pooled_height, pooled_width, sample_num, mode);
  TORCH_CHECK(xdiff_shape.size() == 4, op, ": expected xdiff_shape to have 4 elements [N, C, H, W], got ", xdiff_shape);
  const int64_t K = rois.size(0), N = xdiff_shape[0], C = xdiff_shape[1], H = xdiff_shape[2], W = xdiff_shape[3];
  const int64_t ph = pooled_height, pw = pooled_width;
  TORCH_CHECK(self.size(0) == K && self.size(1) == C && self.size(2) == ph && self.size(3) == pw, op,
              ": expected self (ydiff) of shape [", K, ", ", C, ", ", ph, ", ", pw, "], got ", self.sizes());
  Tensor dx = at::zeros(xdiff_shape, self.options());
  const Tensor r = dense(rois).to(self.scalar_type());
  ops::launch_kernel(op, device, {dense(self), r, dx}, self.numel() * 4, [=](const std::vector<Tensor>& t) {
    NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_roi_alignbk", [&] {
      using A = acc_t<scalar_t>;
      const auto* gy = t[0].const_data_ptr<scalar_t>();
      const auto* rp = t[1].const_data_ptr<scalar_t>();
      auto* gx = t[2].mutable_data_ptr<scalar_t>();
      // Parallel over channels: every RoI of channel c writes only planes of channel c.
      at::parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
        std::vector<A> acc(N * H * W);
        for (int64_t c = begin; c < end; ++c) {
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t k = 0; k < K; ++k) {
            const RoiGeom g = roi_geom(rp + 5 * k, spatial_scale, ph, pw, sample_num, mode);
            TORCH_CHECK(g.batch >= 0 && g.batch < N, "npu_roi_alignbk: rois[", k, ", 0] = ", g.batch,
                        " is not a batch index (N = ", N, ")");
            A* plane = acc.data() + g.batch * H * W;
            const A inv = A(1) / A(g.gh * g.gw);
            for (int64_t i = 0; i < ph; ++i) {
              for (int64_t j = 0; j < pw; ++j) {
                const A gv = A(gy[((k * C + c) * ph + i) * pw + j]) * inv;
                for (int64_t iy = 0; iy < g.gh; ++iy) {
                  const double yy = g.y0 + i * g.bin_h + (iy + 0.5) * g.bin_h / g.gh;
                  for (int64_t ix = 0; ix < g.gw; ++ix) {
                    const double xx = g.x0 + j * g.bin_w + (ix + 0.5) * g.bin_w / g.gw;
                    Bilinear b;
                    if (!bilinear(yy, xx, H, W, b)) continue;
                    for (int q = 0; q < 4; ++q) plane[b.o[q]] += A(b.w[q]) * gv;
                  }
                }
              }
            }
          }
          for (int64_t nb = 0; nb < N; ++nb) {
            for (int64_t p = 0; p < H * W; ++p) gx[(nb * C + c) * H * W + p] = static_cast<scalar_t>(acc[nb * H * W + p]);
          }
        }
      });
    });
  });
  return dx;
}

// ---- modulated deformable convolution ------------------------------------------------------------
// offset [N, 3 * dg * KH * KW, OH, OW]: dg * K x offsets, then dg * K y offsets, then dg * K
// masks (channel g * K + kh * KW + kw of each part). The kernel samples the input at the
// shifted taps into deformable_offset [N, C, OH * KH, OW * KW] (times the mask); the output
// is that convolved with weight at stride (KH, KW).

struct DcnShape {
  int64_t N, C, H, W, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw, dg;
  bool modulated;
};

DcnShape dcn_shape(const char* op, const Tensor& input, const Tensor& weight, const Tensor& offset,
                   c10::IntArrayRef kernel_size, c10::IntArrayRef stride, c10::IntArrayRef padding,
                   c10::IntArrayRef dilation, int64_t groups, int64_t deformable_groups, bool modulated) {
  check_float(op, "input", input, 4);
  check_float(op, "weight", weight, 4);
  check_float(op, "offset", offset, 4);
  check_dtype(op, "weight", weight, input.scalar_type());
  check_dtype(op, "offset", offset, input.scalar_type());
  TORCH_CHECK(kernel_size.size() == 2, op, ": expected kernel_size of 2 elements, got ", kernel_size);
  TORCH_CHECK(stride.size() == 4, op, ": expected stride of 4 elements [1, 1, sH, sW], got ", stride);
  TORCH_CHECK(padding.size() == 4, op, ": expected padding of 4 elements [top, bottom, left, right], got ", padding);
  TORCH_CHECK(dilation.size() == 4, op, ": expected dilation of 4 elements [1, 1, dH, dW], got ", dilation);
  TORCH_CHECK(stride[2] > 0 && stride[3] > 0 && dilation[2] > 0 && dilation[3] > 0, op,
              ": expected positive strides and dilations, got stride ", stride, " and dilation ", dilation);
  TORCH_CHECK(groups > 0 && deformable_groups > 0, op, ": expected groups and deformable_groups > 0, got ", groups,
              " and ", deformable_groups);
  DcnShape s;
  s.N = input.size(0), s.C = input.size(1), s.H = input.size(2), s.W = input.size(3);
  s.KH = weight.size(2), s.KW = weight.size(3);
  TORCH_CHECK((kernel_size[0] == s.KH && kernel_size[1] == s.KW) || (kernel_size[0] == s.KW && kernel_size[1] == s.KH),
              op, ": expected kernel_size to match weight's kernel ", weight.sizes().slice(2), ", got ", kernel_size);
  TORCH_CHECK(s.C % groups == 0 && weight.size(0) % groups == 0 && weight.size(1) * groups == s.C, op,
              ": expected weight of shape [out_channels, ", s.C / std::max<int64_t>(groups, 1), ", KH, KW] with groups=",
              groups, " dividing in_channels ", s.C, " and out_channels, got ", weight.sizes());
  TORCH_CHECK(s.C % deformable_groups == 0, op, ": expected deformable_groups (", deformable_groups,
              ") to divide in_channels ", s.C);
  s.sh = stride[2], s.sw = stride[3], s.pt = padding[0], s.pl = padding[2], s.dh = dilation[2], s.dw = dilation[3];
  s.OH = (s.H + padding[0] + padding[1] - ((s.KH - 1) * s.dh + 1)) / s.sh + 1;
  s.OW = (s.W + padding[2] + padding[3] - ((s.KW - 1) * s.dw + 1)) / s.sw + 1;
  TORCH_CHECK(s.OH > 0 && s.OW > 0, op, ": the input ", input.sizes(), " is smaller than the dilated kernel");
  s.dg = deformable_groups;
  s.modulated = modulated;
  const int64_t oc = (modulated ? 3 : 2) * deformable_groups * s.KH * s.KW;
  TORCH_CHECK(offset.size(0) == s.N && offset.size(1) == oc && offset.size(2) == s.OH && offset.size(3) == s.OW, op,
              ": expected offset of shape [", s.N, ", ", oc, ", ", s.OH, ", ", s.OW, "], got ", offset.sizes());
  return s;
}

// Sample position of tap (kh, kw) of output (oh, ow) in group g, and the mask.
template <typename T>
inline void dcn_tap(const DcnShape& s, const T* off, int64_t n, int64_t g, int64_t kh, int64_t kw, int64_t oh,
                    int64_t ow, double& y, double& x, double& m) {
  const int64_t K = s.KH * s.KW, plane = s.OH * s.OW, ch = g * K + kh * s.KW + kw;
  const int64_t parts = s.modulated ? 3 : 2;
  const T* base = off + n * parts * s.dg * K * plane + oh * s.OW + ow;
  x = static_cast<double>(ow * s.sw - s.pl + kw * s.dw) + static_cast<double>(base[ch * plane]);
  y = static_cast<double>(oh * s.sh - s.pt + kh * s.dh) + static_cast<double>(base[(s.dg * K + ch) * plane]);
  m = s.modulated ? static_cast<double>(base[(2 * s.dg * K + ch) * plane]) : 1.0;
}

// Corners of (y, x) with zero outside the image: weights of (y0,x0),(y0,x1),(y1,x0),(y1,x1).
struct Corners {
  int64_t y0, x0;
  double ly, lx;
};
inline Corners corners(double y, double x) {
  const double fy = std::floor(y), fx = std::floor(x);
  return {static_cast<int64_t>(fy), static_cast<int64_t>(fx), y - fy, x - fx};
}

template <typename T, typename A>
inline A sample(const T* plane, int64_t H, int64_t W, const Corners& c) {
  A v = 0;
  const A ly = A(c.ly), lx = A(c.lx);
  auto at = [&](int64_t yy, int64_t xx) { return yy >= 0 && yy < H && xx >= 0 && xx < W ? A(plane[yy * W + xx]) : A(0); };
  v += (1 - ly) * (1 - lx) * at(c.y0, c.x0) + (1 - ly) * lx * at(c.y0, c.x0 + 1) + ly * (1 - lx) * at(c.y0 + 1, c.x0) +
       ly * lx * at(c.y0 + 1, c.x0 + 1);
  return v;
}

std::tuple<Tensor, Tensor> npu_deformable_conv2d(const Tensor& input, const Tensor& weight, const Tensor& offset,
                                                 const std::optional<Tensor>& bias, c10::IntArrayRef kernel_size,
                                                 c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                 c10::IntArrayRef dilation, int64_t groups, int64_t deformable_groups,
                                                 bool modulated) {
  constexpr const char* op = "npu_deformable_conv2d";
  const Tensor b = bias.value_or(Tensor());
  const auto device = npu_device(op, {{"input", input}, {"weight", weight}, {"offset", offset}, {"bias", b}});
  const DcnShape s =
      dcn_shape(op, input, weight, offset, kernel_size, stride, padding, dilation, groups, deformable_groups, modulated);
  if (b.defined()) {
    check_dtype(op, "bias", b, input.scalar_type());
    TORCH_CHECK(b.dim() == 1 && b.size(0) == weight.size(0), op, ": expected bias of shape [", weight.size(0),
                "], got ", b.sizes());
  }
  Tensor out_off = at::empty({s.N, s.C, s.OH * s.KH, s.OW * s.KW}, input.options());
  ops::launch_kernel(op, device, {dense(input), dense(offset), out_off}, out_off.numel() * 4,
                     [s](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_deformable_conv2d", [&] {
                         using A = acc_t<scalar_t>;
                         const auto* x = t[0].const_data_ptr<scalar_t>();
                         const auto* off = t[1].const_data_ptr<scalar_t>();
                         auto* y = t[2].mutable_data_ptr<scalar_t>();
                         const int64_t cpg = s.C / s.dg, OWK = s.OW * s.KW;
                         at::parallel_for(0, s.N * s.C, 1, [&](int64_t begin, int64_t end) {
                           for (int64_t nc = begin; nc < end; ++nc) {
                             const int64_t n = nc / s.C, c = nc % s.C, g = c / cpg;
                             const scalar_t* plane = x + nc * s.H * s.W;
                             scalar_t* dst = y + nc * s.OH * s.KH * OWK;
                             for (int64_t oh = 0; oh < s.OH; ++oh)
                               for (int64_t kh = 0; kh < s.KH; ++kh)
                                 for (int64_t ow = 0; ow < s.OW; ++ow)
                                   for (int64_t kw = 0; kw < s.KW; ++kw) {
                                     double yy, xx, m;
                                     dcn_tap(s, off, n, g, kh, kw, oh, ow, yy, xx, m);
                                     const A v = sample<scalar_t, A>(plane, s.H, s.W, corners(yy, xx)) * A(m);
                                     dst[(oh * s.KH + kh) * OWK + ow * s.KW + kw] = static_cast<scalar_t>(v);
                                   }
                           }
                         });
                       });
                     });
  Tensor out = at::convolution(out_off, weight, b.defined() ? std::optional<Tensor>(b) : std::nullopt,
                               {s.KH, s.KW}, {0, 0}, {1, 1}, false, {0, 0}, groups);
  return {out, out_off};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> npu_deformable_conv2dbk(
    const Tensor& input, const Tensor& grad_output, const Tensor& offset_out, const Tensor& weight,
    const Tensor& offset, c10::IntArrayRef kernel_size, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, int64_t groups, int64_t deformable_groups, bool modulated) {
  constexpr const char* op = "npu_deformable_conv2dbk";
  const auto device = npu_device(op, {{"input", input}, {"grad_output", grad_output}, {"offset_out", offset_out},
                                      {"weight", weight}, {"offset", offset}});
  const DcnShape s =
      dcn_shape(op, input, weight, offset, kernel_size, stride, padding, dilation, groups, deformable_groups, modulated);
  check_dtype(op, "grad_output", grad_output, input.scalar_type());
  check_dtype(op, "offset_out", offset_out, input.scalar_type());
  TORCH_CHECK(grad_output.dim() == 4 && grad_output.size(0) == s.N && grad_output.size(1) == weight.size(0) &&
                  grad_output.size(2) == s.OH && grad_output.size(3) == s.OW,
              op, ": expected grad_output of shape [", s.N, ", ", weight.size(0), ", ", s.OH, ", ", s.OW, "], got ",
              grad_output.sizes());
  TORCH_CHECK(offset_out.sizes().equals({s.N, s.C, s.OH * s.KH, s.OW * s.KW}), op, ": expected offset_out of shape [",
              s.N, ", ", s.C, ", ", s.OH * s.KH, ", ", s.OW * s.KW, "], got ", offset_out.sizes());
  auto [g_off_out, g_weight, g_bias] =
      at::convolution_backward(grad_output, offset_out, weight, std::vector<int64_t>{weight.size(0)}, {s.KH, s.KW},
                               {0, 0}, {1, 1}, false, {0, 0}, groups, {true, true, true});
  Tensor g_input = at::zeros(input.sizes(), input.options());
  Tensor g_offset = at::zeros(offset.sizes(), offset.options());
  ops::launch_kernel(op, device, {dense(input), dense(offset), dense(g_off_out), g_input, g_offset},
                     g_off_out.numel() * 8, [s](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), "npu_deformable_conv2dbk", [&] {
                         using A = acc_t<scalar_t>;
                         const auto* x = t[0].const_data_ptr<scalar_t>();
                         const auto* off = t[1].const_data_ptr<scalar_t>();
                         const auto* gd = t[2].const_data_ptr<scalar_t>();
                         auto* gx = t[3].mutable_data_ptr<scalar_t>();
                         auto* goff = t[4].mutable_data_ptr<scalar_t>();
                         const int64_t cpg = s.C / s.dg, OWK = s.OW * s.KW, K = s.KH * s.KW, plane = s.OH * s.OW;
                         const int64_t parts = s.modulated ? 3 : 2;
                         // d input: each (n, c) scatters into its own plane.
                         at::parallel_for(0, s.N * s.C, 1, [&](int64_t begin, int64_t end) {
                           std::vector<A> acc(s.H * s.W);
                           for (int64_t nc = begin; nc < end; ++nc) {
                             const int64_t n = nc / s.C, c = nc % s.C, g = c / cpg;
                             std::fill(acc.begin(), acc.end(), A(0));
                             const scalar_t* gsrc = gd + nc * s.OH * s.KH * OWK;
                             for (int64_t oh = 0; oh < s.OH; ++oh)
                               for (int64_t kh = 0; kh < s.KH; ++kh)
                                 for (int64_t ow = 0; ow < s.OW; ++ow)
                                   for (int64_t kw = 0; kw < s.KW; ++kw) {
                                     double yy, xx, m;
                                     dcn_tap(s, off, n, g, kh, kw, oh, ow, yy, xx, m);
                                     const A gv = A(gsrc[(oh * s.KH + kh) * OWK + ow * s.KW + kw]) * A(m);
                                     const Corners cr = corners(yy, xx);
                                     const A ly = A(cr.ly), lx = A(cr.lx);
                                     const A w4[4] = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
                                     for (int q = 0; q < 4; ++q) {
                                       const int64_t py = cr.y0 + q / 2, px = cr.x0 + q % 2;
                                       if (py >= 0 && py < s.H && px >= 0 && px < s.W) acc[py * s.W + px] += w4[q] * gv;
                                     }
                                   }
                             for (int64_t p = 0; p < s.H * s.W; ++p) gx[nc * s.H * s.W + p] = static_cast<scalar_t>(acc[p]);
                           }
                         });
                         // d offset, d mask: each (n, g, tap, oh, ow) sums over the group's channels.
                         at::parallel_for(0, s.N * s.dg * K, 1, [&](int64_t begin, int64_t end) {
                           for (int64_t ngk = begin; ngk < end; ++ngk) {
                             const int64_t n = ngk / (s.dg * K), g = (ngk / K) % s.dg, k = ngk % K;
                             const int64_t kh = k / s.KW, kw = k % s.KW;
                             scalar_t* gbase = goff + n * parts * s.dg * K * plane;
                             for (int64_t oh = 0; oh < s.OH; ++oh)
                               for (int64_t ow = 0; ow < s.OW; ++ow) {
                                 double yy, xx, m;
                                 dcn_tap(s, off, n, g, kh, kw, oh, ow, yy, xx, m);
                                 const Corners cr = corners(yy, xx);
                                 const A ly = A(cr.ly), lx = A(cr.lx);
                                 A gxo = 0, gyo = 0, gm = 0;
                                 for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
                                   const scalar_t* pl = x + (n * s.C + c) * s.H * s.W;
                                   auto at = [&](int64_t yy2, int64_t xx2) {
                                     return yy2 >= 0 && yy2 < s.H && xx2 >= 0 && xx2 < s.W ? A(pl[yy2 * s.W + xx2]) : A(0);
                                   };
                                   const A v00 = at(cr.y0, cr.x0), v01 = at(cr.y0, cr.x0 + 1), v10 = at(cr.y0 + 1, cr.x0),
                                           v11 = at(cr.y0 + 1, cr.x0 + 1);
                                   const A gv =
                                       A(gd[(n * s.C + c) * s.OH * s.KH * OWK + (oh * s.KH + kh) * OWK + ow * s.KW + kw]);
                                   const A val = (1 - ly) * (1 - lx) * v00 + (1 - ly) * lx * v01 + ly * (1 - lx) * v10 +
                                                 ly * lx * v11;
                                   gm += gv * val;
                                   gxo += gv * A(m) * ((1 - ly) * (v01 - v00) + ly * (v11 - v10));
                                   gyo += gv * A(m) * ((1 - lx) * (v10 - v00) + lx * (v11 - v01));
                                 }
                                 const int64_t ch = g * K + k, pos = oh * s.OW + ow;
                                 gbase[ch * plane + pos] = static_cast<scalar_t>(gxo);
                                 gbase[(s.dg * K + ch) * plane + pos] = static_cast<scalar_t>(gyo);
                                 if (s.modulated) gbase[(2 * s.dg * K + ch) * plane + pos] = static_cast<scalar_t>(gm);
                               }
                           }
                         });
                       });
                     });
  return {g_input, g_weight, g_offset, g_bias};
}

// ---- autograd -----------------------------------------------------------------------------------

class Giou : public torch::autograd::Function<Giou> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& gtboxes, bool trans, bool is_cross,
                        int64_t mode) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<Tensor(const Tensor&, const Tensor&, bool, bool, int64_t)>("npu::npu_giou");
    ctx->save_for_backward({self, gtboxes});
    ctx->saved_data["trans"] = trans;
    ctx->saved_data["is_cross"] = is_cross;
    ctx->saved_data["mode"] = mode;
    return fwd.call(self, gtboxes, trans, is_cross, mode);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool, bool,
                                                           int64_t)>("npu::npu_giou_backward");
    const auto saved = ctx->get_saved_variables();
    auto [db, dg] = bwd.call(grads[0], saved[0], saved[1], ctx->saved_data["trans"].toBool(),
                             ctx->saved_data["is_cross"].toBool(), ctx->saved_data["mode"].toInt());
    return {db, dg, Tensor(), Tensor(), Tensor()};
  }
};

class RoiAlign : public torch::autograd::Function<RoiAlign> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& rois, double spatial_scale,
                        int64_t pooled_height, int64_t pooled_width, int64_t sample_num, int64_t roi_end_mode) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<Tensor(const Tensor&, const Tensor&, double, int64_t, int64_t, int64_t, int64_t)>(
        "npu::npu_roi_align");
    ctx->save_for_backward({rois});
    ctx->saved_data["shape"] = self.sizes().vec();
    ctx->saved_data["scale"] = spatial_scale;
    ctx->saved_data["ph"] = pooled_height;
    ctx->saved_data["pw"] = pooled_width;
    ctx->saved_data["sample_num"] = sample_num;
    ctx->saved_data["mode"] = roi_end_mode;
    return fwd.call(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<Tensor(const Tensor&, const Tensor&, c10::IntArrayRef, int64_t, int64_t, double,
                                       int64_t, std::optional<int64_t>)>("npu::npu_roi_alignbk");
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    return {bwd.call(grads[0].contiguous(), saved[0], shape, ctx->saved_data["pw"].toInt(),
                     ctx->saved_data["ph"].toInt(), ctx->saved_data["scale"].toDouble(),
                     ctx->saved_data["sample_num"].toInt(), ctx->saved_data["mode"].toInt()),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

class DeformableConv2d : public torch::autograd::Function<DeformableConv2d> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight, const Tensor& offset,
                               const std::optional<Tensor>& bias, c10::IntArrayRef kernel_size,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                               int64_t groups, int64_t deformable_groups, bool modulated) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd =
        op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                             c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef,
                                             int64_t, int64_t, bool)>("npu::npu_deformable_conv2d");
    auto [out, out_off] = fwd.call(input, weight, offset, bias, kernel_size, stride, padding, dilation, groups,
                                   deformable_groups, modulated);
    ctx->save_for_backward({input, weight, offset, out_off});
    ctx->saved_data["kernel_size"] = kernel_size.vec();
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["deformable_groups"] = deformable_groups;
    ctx->saved_data["modulated"] = modulated;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({out_off});
    return {out, out_off};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, c10::IntArrayRef, c10::IntArrayRef,
        c10::IntArrayRef, c10::IntArrayRef, int64_t, int64_t, bool)>("npu::npu_deformable_conv2dbk");
    const auto saved = ctx->get_saved_variables();
    const Tensor g = grads[0].defined() ? grads[0] : Tensor();
    if (!g.defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
                              Tensor(), Tensor(), Tensor()};
    auto [gi, gw, go, gb] =
        bwd.call(saved[0], g.contiguous(), saved[3], saved[1], saved[2], ctx->saved_data["kernel_size"].toIntVector(),
                 ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
                 ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt(),
                 ctx->saved_data["deformable_groups"].toInt(), ctx->saved_data["modulated"].toBool());
    return {gi, gw, go, ctx->saved_data["has_bias"].toBool() ? gb : Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor(), Tensor()};
  }
};

Tensor giou_autograd(const Tensor& self, const Tensor& gtboxes, bool trans, bool is_cross, int64_t mode) {
  return Giou::apply(self, gtboxes, trans, is_cross, mode);
}
Tensor roi_align_autograd(const Tensor& self, const Tensor& rois, double spatial_scale, int64_t pooled_height,
                          int64_t pooled_width, int64_t sample_num, int64_t roi_end_mode) {
  return RoiAlign::apply(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode);
}
std::tuple<Tensor, Tensor> deformable_conv2d_autograd(const Tensor& input, const Tensor& weight, const Tensor& offset,
                                                      const std::optional<Tensor>& bias, c10::IntArrayRef kernel_size,
                                                      c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                      c10::IntArrayRef dilation, int64_t groups,
                                                      int64_t deformable_groups, bool modulated) {
  auto r = DeformableConv2d::apply(input, weight, offset, bias, kernel_size, stride, padding, dilation, groups,
                                   deformable_groups, modulated);
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_iou(Tensor bboxes, Tensor gtboxes, int mode=0) -> Tensor");
  m.def("npu_ptiou(Tensor bboxes, Tensor gtboxes, int mode=0) -> Tensor");
  m.def("npu_anchor_response_flags(Tensor self, int[2] featmap_size, int[2] stride, int num_base_anchors) -> Tensor");
  m.def("npu_giou(Tensor self, Tensor gtboxes, bool trans=False, bool is_cross=False, int mode=0) -> Tensor");
  m.def(
      "npu_giou_backward(Tensor grad, Tensor bboxes, Tensor gtboxes, bool trans=False, bool is_cross=False, "
      "int mode=0) -> (Tensor, Tensor)");
  m.def(
      "npu_nms_v4(Tensor self, Tensor scores, Scalar max_output_size, Tensor iou_threshold, Tensor scores_threshold, "
      "bool pad_to_max_output_size=False) -> (Tensor, Tensor)");
  m.def("npu_nms_with_mask(Tensor input, Scalar iou_threshold) -> (Tensor, Tensor, Tensor)");
  m.def(
      "npu_nms_rotated(Tensor self, Tensor scores, float iou_threshold, float scores_threshold=0, "
      "int max_output_size=-1, int mode=0) -> (Tensor, Tensor)");
  m.def(
      "npu_roi_align(Tensor self, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
      "int sample_num, int roi_end_mode) -> Tensor");
  m.def(
      "npu_roi_alignbk(Tensor self, Tensor rois, int[] xdiff_shape, int pooled_width, int pooled_height, "
      "float spatial_scale, int sample_num, int? roi_end_mode=None) -> Tensor");
  m.def(
      "npu_deformable_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor? bias, int[2] kernel_size, "
      "int[] stride, int[] padding, int[4] dilation=[1,1,1,1], int groups=1, int deformable_groups=1, "
      "bool modulated=True) -> (Tensor, Tensor)");
  m.def(
      "npu_deformable_conv2dbk(Tensor input, Tensor grad_output, Tensor offset_out, Tensor weight, Tensor offset, "
      "int[2] kernel_size, int[] stride, int[] padding, int[4] dilation=[1,1,1,1], int groups=1, "
      "int deformable_groups=1, bool modulated=True) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_iou", TORCH_FN(npu_iou));
  m.impl("npu_ptiou", TORCH_FN(npu_ptiou));
  m.impl("npu_anchor_response_flags", TORCH_FN(npu_anchor_response_flags));
  m.impl("npu_giou", TORCH_FN(npu_giou));
  m.impl("npu_giou_backward", TORCH_FN(npu_giou_backward));
  m.impl("npu_nms_v4", TORCH_FN(npu_nms_v4));
  m.impl("npu_nms_with_mask", TORCH_FN(npu_nms_with_mask));
  m.impl("npu_nms_rotated", TORCH_FN(npu_nms_rotated));
  m.impl("npu_roi_align", TORCH_FN(npu_roi_align));
  m.impl("npu_roi_alignbk", TORCH_FN(npu_roi_alignbk));
  m.impl("npu_deformable_conv2d", TORCH_FN(npu_deformable_conv2d));
  m.impl("npu_deformable_conv2dbk", TORCH_FN(npu_deformable_conv2dbk));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) {
  m.impl("npu_giou", TORCH_FN(giou_autograd));
  m.impl("npu_roi_align", TORCH_FN(roi_align_autograd));
  m.impl("npu_deformable_conv2d", TORCH_FN(deformable_conv2d_autograd));
}

}  // namespace torch_npu::custom_ops
