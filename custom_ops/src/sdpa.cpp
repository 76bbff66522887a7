// torch.nn.functional.scaled_dot_product_attention on npu through the fused attention
// kernel (npu_fusion_attention), as torch_npu routes it: the PrivateUse1 entry of
// PyTorch's _fused_sdp_choice stub picks the "overrideable" backend for inputs the kernel
// takes, and _scaled_dot_product_fused_attention_overrideable (+ _backward, whose
// autograd formula PyTorch owns) call the kernel in layout BNSD or BSND. Without this, SDPA on
// npu ran PyTorch's math path: the B x N x Sq x Sk score matrix, several times over.
//
// SDPA's conventions differ from npu_fusion_attention's and are mapped here:
//   bool attn_mask:  True = attend            -> atten_mask True = masked out (inverted)
//   float attn_mask: softmax(scale QK^T + m)  -> pse = m / scale (the kernel adds pse
//                                                before scaling)
//   is_causal:       top-left aligned         -> sparse_mode 2 (leftUpCausal)
//   logsumexp [B, N, Sq]                      <- softmax_max + log(softmax_sum); the
//                                                backward passes it back as max with sum 1
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/log.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>

#include "fused.h"

namespace torch_npu::custom_ops {
namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int32_t>::max();
constexpr int64_t kLeftUpCausal = 2;

using FaForward = std::tuple<Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, int64_t>(
    const Tensor&, const Tensor&, const Tensor&, int64_t, c10::string_view, const std::optional<Tensor>&,
    const std::optional<Tensor>&, const std::optional<Tensor>&, double, double, int64_t, int64_t, int64_t,
    at::OptionalIntArrayRef, at::OptionalIntArrayRef, at::OptionalIntArrayRef, int64_t, bool, bool, c10::string_view,
    const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t, int64_t);

using FaBackward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, c10::string_view, const std::optional<Tensor>&,
    const std::optional<Tensor>&, const std::optional<Tensor>&, const std::optional<Tensor>&,
    const std::optional<Tensor>&, const std::optional<Tensor>&, const std::optional<Tensor>&, double, double, int64_t,
    int64_t, int64_t, int64_t, int64_t, int64_t, at::OptionalIntArrayRef, at::OptionalIntArrayRef,
    at::OptionalIntArrayRef, int64_t, bool, bool, c10::string_view, const std::optional<Tensor>&);

bool is_kernel_float(c10::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// Which SDPA calls the fused kernel takes; the others keep PyTorch's math path (which
// also raises PyTorch's own errors for malformed arguments).
int64_t npu_fused_sdp_choice(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
                             double dropout_p, bool is_causal, std::optional<double> /*scale*/, bool enable_gqa) {
  constexpr auto kMath = static_cast<int64_t>(at::SDPBackend::math);
  if (!at::globalContext().userEnabledOverrideableSDP()) return kMath;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return kMath;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return kMath;
  if (!is_kernel_float(q.scalar_type()) || k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    return kMath;
  }
  // Symbolic sizes (torch.compile with dynamic shapes traces this choice on fake tensors):
  // comparing them adds guards on their relations; reading them as int64 would specialize
  // the graph to the traced sizes.
  const c10::SymInt B = q.sym_size(0), N = q.sym_size(1), S1 = q.sym_size(2), D = q.sym_size(3);
  const c10::SymInt N2 = k.sym_size(1), S2 = k.sym_size(2);
  if (k.sym_size(0) != B || v.sym_size(0) != B || v.sym_size(1) != N2 || v.sym_size(2) != S2) return kMath;
  if (k.sym_size(3) != D || v.sym_size(3) != D || D == 0 || S1 == 0 || S2 == 0 || N2 == 0) return kMath;
  if (N2 != N && (!enable_gqa || N % N2 != 0)) return kMath;
  if (dropout_p < 0.0 || dropout_p >= 1.0) return kMath;
  if (mask.has_value() && mask->defined()) {
    const Tensor& m = *mask;
    if (is_causal || m.dim() > 4 || m.dim() < 2) return kMath;
    if (m.scalar_type() != at::kBool && m.scalar_type() != q.scalar_type()) return kMath;
    // Broadcastable to [B, N, S1, S2] (a 2-D or 3-D mask lines up with the last dims).
    const std::array<c10::SymInt, 4> full{B, N, S1, S2};
    for (int64_t i = 1; i <= m.dim(); ++i) {
      const c10::SymInt size = m.sym_size(-i);
      if (size != 1 && size != full[4 - i]) return kMath;
    }
  }
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

// The compressed causal mask of sparse_mode 2 (2048 x 2048, upper triangle masked), one
// per device, made on first use.
const Tensor& causal_mask(c10::DeviceIndex device) {
  static std::mutex mu;
  static std::array<Tensor, 64> masks;
  std::lock_guard<std::mutex> lock(mu);
  Tensor& m = masks.at(device);
  if (!m.defined()) {
    m = at::ones({2048, 2048}, at::TensorOptions().dtype(at::kBool)).triu(1).to(c10::Device(c10::kPrivateUse1, device));
  }
  return m;
}

struct MappedMask {
  std::optional<Tensor> atten_mask;  // bool, True = masked out
  std::optional<Tensor> pse;         // additive, before scaling
  int64_t sparse_mode = 0;
};

// SDPA's attn_mask / is_causal in npu_fusion_attention's terms (see the file comment).
MappedMask map_mask(const std::optional<Tensor>& attn_bias, bool is_causal, const Tensor& q, double scale) {
  MappedMask out;
  const int64_t B = q.size(0), N = q.size(1), S1 = q.size(2);
  if (is_causal) {
    out.atten_mask = causal_mask(q.device().index());
    out.sparse_mode = kLeftUpCausal;
    return out;
  }
  if (!attn_bias.has_value() || !attn_bias->defined()) return out;
  Tensor m = *attn_bias;
  while (m.dim() < 4) m = m.unsqueeze(0);
  const int64_t S2 = m.size(3);
  if (m.scalar_type() == at::kBool) {
    // The kernel takes [B|1, N|1, S1, S2] masks: only the query dimension needs filling in.
    out.atten_mask = m.logical_not().expand({m.size(0), m.size(1), S1, S2}).contiguous();
  } else {
    // pse takes [B, N, S1|1, S2] or [1, N, S1, S2].
    const int64_t b = m.size(2) == 1 ? B : m.size(0);
    out.pse = m.div(scale).expand({b, N, m.size(2), S2}).contiguous();
  }
  return out;
}

double softmax_scale(const Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

// The kernel's layout for SDPA's [B, N, S, D] tensors: BSND when the query is a transposed
// [B, S, N, D] tensor (how models make it: view(B, S, N, D).transpose(1, 2)), so no copy
// is needed; else BNSD.
struct KernelLayout {
  bool bsnd;
  explicit KernelLayout(const Tensor& query) : bsnd(!query.is_contiguous() && query.transpose(1, 2).is_contiguous()) {}
  const char* name() const { return bsnd ? "BSND" : "BNSD"; }
  Tensor in(const Tensor& t) const { return bsnd ? t.transpose(1, 2) : t; }   // [B, N, S, D] -> kernel
  Tensor out(const Tensor& t) const { return bsnd ? t.transpose(1, 2) : t; }  // kernel -> [B, N, S, D]
};

// PyTorch's meta functions give each result the layout of its input (empty_like), and
// compiled graphs check it: `t` (same sizes as `like`) in that layout.
Tensor in_layout_of(const Tensor& t, const Tensor& like) {
  if (!t.defined() || (like.is_non_overlapping_and_dense() && t.strides() == like.strides())) return t;
  Tensor target = at::empty_like(like);
  if (t.strides() == target.strides()) return t;
  target.copy_(t);
  return target;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor> sdpa_forward(
    const Tensor& query, const Tensor& key, const Tensor& value, const std::optional<Tensor>& attn_bias,
    double dropout_p, bool is_causal, bool return_debug_mask, std::optional<double> scale) {
  TORCH_CHECK(!return_debug_mask, "scaled_dot_product_attention on npu: return_debug_mask=True is not supported");
  const double s = softmax_scale(query, scale);
  const MappedMask m = map_mask(attn_bias, is_causal, query, s);
  const KernelLayout layout(query);
  static const auto fa = op_handle<FaForward>("npu::npu_fusion_attention");
  auto [out, smax, ssum, sout, seed, offset, numels] =
      fa.call(layout.in(query), layout.in(key), layout.in(value), query.size(1), layout.name(), m.pse, std::nullopt,
              m.atten_mask, s, 1.0 - dropout_p, kNoLimit, kNoLimit, 0, std::nullopt, std::nullopt, std::nullopt,
              m.sparse_mode, true, false, "", std::nullopt, std::nullopt, 0, 0);
  // The statistics hold each value 8 times; logsumexp is [B, N, Sq] float.
  Tensor lse = smax.select(-1, 0).add(at::log(ssum.select(-1, 0))).to(at::kFloat);
  const auto cpu_i64 = at::TensorOptions().dtype(at::kLong);
  Tensor philox_seed = at::scalar_tensor(seed, cpu_i64);
  Tensor philox_offset = at::scalar_tensor(offset, cpu_i64);
  Tensor none;
  return {in_layout_of(layout.out(out), query), lse, none, none, c10::SymInt(query.size(2)),
          c10::SymInt(key.size(2)), philox_seed, philox_offset, at::empty({0}, query.options())};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sdpa_backward(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_bias,
    std::array<bool, 4> grad_input_mask, const Tensor& out, const Tensor& logsumexp, const Tensor& /*cum_seq_q*/,
    const Tensor& /*cum_seq_k*/, int64_t /*max_q*/, int64_t /*max_k*/, double dropout_p, bool is_causal,
    const Tensor& philox_seed, const Tensor& philox_offset, std::optional<double> scale) {
  if (!grad_out.defined()) return {};  // no gradient flows in: none flows out
  const double s = softmax_scale(query, scale);
  const std::optional<Tensor> bias = attn_bias.defined() ? std::optional<Tensor>(attn_bias) : std::nullopt;
  const MappedMask m = map_mask(bias, is_causal, query, s);
  // exp(x - lse) / 1 is the softmax: logsumexp stands in for the max, with a sum of 1.
  // A fully masked row has lse = -inf and no probabilities: +inf makes them all 0.
  const auto stat_sizes = {query.size(0), query.size(1), query.size(2), int64_t{8}};
  Tensor lse = logsumexp.to(query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  lse = lse.masked_fill(lse.isneginf(), std::numeric_limits<float>::infinity());
  Tensor smax = lse.unsqueeze(-1).expand(stat_sizes).contiguous();
  Tensor ssum = at::ones(stat_sizes, smax.options());
  const int64_t seed = philox_seed.defined() ? philox_seed.item<int64_t>() : 0;
  const int64_t offset = philox_offset.defined() ? philox_offset.item<int64_t>() : 0;
  const KernelLayout layout(query);
  static const auto fa_grad = op_handle<FaBackward>("npu::npu_fusion_attention_grad");
  auto [dq, dk, dv, dpse, dsink] = fa_grad.call(
      layout.in(query), layout.in(key), layout.in(value), layout.in(grad_out), query.size(1), layout.name(), m.pse,
      std::nullopt, m.atten_mask, smax, ssum, std::nullopt, layout.in(out), s, 1.0 - dropout_p, kNoLimit, kNoLimit, 0,
      seed, offset, 0, std::nullopt, std::nullopt, std::nullopt, m.sparse_mode, true, false, "", std::nullopt);
  Tensor dbias;
  if (grad_input_mask[3] && attn_bias.defined() && attn_bias.scalar_type() != at::kBool && dpse.defined()) {
    dbias = dpse.div(s).sum_to_size(attn_bias.sizes());
  }
  return {grad_input_mask[0] ? in_layout_of(layout.out(dq), query) : Tensor(),
          grad_input_mask[1] ? in_layout_of(layout.out(dk), key) : Tensor(),
          grad_input_mask[2] ? in_layout_of(layout.out(dv), value) : Tensor(), dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(npu_fused_sdp_choice));
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(sdpa_forward));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(sdpa_backward));
}

}  // namespace torch_npu::custom_ops

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_npu::custom_ops::npu_fused_sdp_choice)
}  // namespace at::native
