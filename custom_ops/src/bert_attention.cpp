// BERT self-attention operators of torch_npu (op-plugin's AttentionScore, AttentionLnQKV,
// AttentionQKVGrad, LayerNormGrad and MatMulV2 based ones), which
// torch_npu.contrib.function.npu_fused_attention(_with_layernorm) chains:
//   npu_linear (+_backward), npu_fused_attention_score (+_fwd, _backward, _grad),
//   npu_fused_attention_layernorm_qkv_fwd, npu_fused_attention_qkv_grad, npu_layernorm_grad.
// Layouts as torch_npu has them: q/k/v layers [B, N, S, D]; the context and the q/k/v
// gradients of _grad are 2-D [B*S, N*D] (BSH rows); the dropout mask is one uint8 per
// softmax element (1 = kept). Half types compute in float.
#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "fused.h"
#include "torch_npu/ops/formats.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kGrain = 16384;  // elements per parallel chunk of the row loops
constexpr double kLayerNormGradEps = 1e-5;  // LayerNormGrad's epsilon (the forward's default)

// `t` in the dtype the kernels compute in: float for half types.
Tensor acc(const Tensor& t) {
  const auto st = t.scalar_type();
  return st == at::kHalf || st == at::kBFloat16 ? t.to(at::kFloat) : t;
}

// `result` in FRACTAL_NZ when `like` is (torch_npu allocates these outputs in the format
// of the named input), as it is otherwise.
Tensor format_like(const Tensor& result, const Tensor& like) {
  return ops::npu_format_of(like) == ops::kFormatFractalNZ ? ops::format_cast(result, ops::kFormatFractalNZ)
                                                           : result;
}

// Only the default layouts are simulated; the transposed ones name their flag.
void check_no_transpose(const char* op, std::initializer_list<std::pair<const char*, bool>> flags) {
  for (const auto& [name, value] : flags) {
    TORCH_CHECK_NOT_IMPLEMENTED(!value, op, ": ", name,
                                "=True is not supported; pass the tensors in the default [B, N, S, D] layout");
  }
}

void check_keep_prob(const char* op, double keep_prob) {
  TORCH_CHECK(keep_prob >= 0 && keep_prob <= 1, op, ": expected keep_prob in [0, 1], got ", keep_prob);
}

// Multiplier of kept elements: 1/keep_prob (0 when everything is dropped).
double keep_scale(double keep_prob) { return keep_prob > 0 ? 1.0 / keep_prob : 0.0; }

struct ScoreShape {
  int64_t B, N, S, Sk, D, Dv;
};

// q [B, N, S, D], k [B, N, Sk, D], v [B, N, Sk, Dv], one floating dtype.
ScoreShape check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float(op, "query_layer", q, 4);
  check_float(op, "key_layer", k, 4);
  check_float(op, "value_layer", v, 4);
  check_dtype(op, "key_layer", k, q.scalar_type());
  check_dtype(op, "value_layer", v, q.scalar_type());
  const ScoreShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  TORCH_CHECK(k.size(0) == s.B && k.size(1) == s.N && k.size(3) == s.D, op,
              ": expected key_layer of shape [", s.B, ", ", s.N, ", Sk, ", s.D,
              "] (query_layer's batch, heads and head dim), got ", k.sizes());
  TORCH_CHECK(v.size(0) == s.B && v.size(1) == s.N && v.size(2) == s.Sk, op, ": expected value_layer of shape [",
              s.B, ", ", s.N, ", ", s.Sk, ", Dv] (key_layer's batch, heads and length), got ", v.sizes());
  return s;
}

// ---- attention score: softmax(q k^T * scale + mask), dropout, times v ---------------------

std::tuple<Tensor, Tensor, Tensor> npu_fused_attention_score_fwd(const Tensor& query, const Tensor& key,
                                                                 const Tensor& value, const Tensor& attention_mask,
                                                                 const at::Scalar& scale, double keep_prob,
                                                                 bool query_transpose, bool key_transpose,
                                                                 bool bmm_score_transpose_a,
                                                                 bool bmm_score_transpose_b, bool value_transpose,
                                                                 bool dx_transpose) {
  constexpr const char* op = "npu_fused_attention_score_fwd";
  const auto device = npu_device(
      op, {{"query_layer", query}, {"key_layer", key}, {"value_layer", value}, {"attention_mask", attention_mask}});
  check_no_transpose(op, {{"query_transpose", query_transpose},
                          {"key_transpose", key_transpose},
                          {"bmm_score_transpose_a", bmm_score_transpose_a},
                          {"bmm_score_transpose_b", bmm_score_transpose_b},
                          {"value_transpose", value_transpose},
                          {"dx_transpose", dx_transpose}});
  const auto s = check_qkv(op, query, key, value);
  check_float(op, "attention_mask", attention_mask, 4);
  const int64_t full[4] = {s.B, s.N, s.S, s.Sk};
  for (int64_t i = 0; i < 4; ++i) {
    TORCH_CHECK(attention_mask.size(i) == 1 || attention_mask.size(i) == full[i], op,
                ": expected attention_mask broadcastable to [", s.B, ", ", s.N, ", ", s.S, ", ", s.Sk, "], got ",
                attention_mask.sizes());
  }
  check_keep_prob(op, keep_prob);
  const double sc = scale.toDouble();
  const double ks = keep_scale(keep_prob);
  const auto opts = query.options();
  Tensor context = at::empty({s.B * s.S, s.N * s.Dv}, opts);
  Tensor softmax = at::empty({s.B, s.N, s.S, s.Sk}, opts);
  const int64_t numel = s.B * s.N * s.S * s.Sk;
  // One byte per softmax element from the npu generator (torch.npu.manual_seed replays it).
  Tensor drop_mask = keep_prob >= 1 ? at::ones({numel}, opts.dtype(at::kByte))
                                    : at::empty({numel}, opts.dtype(at::kByte)).bernoulli_(keep_prob);
  ops::launch_kernel(
      op, device, {dense(query), dense(key), dense(value), attention_mask, drop_mask, context, softmax},
      numel * std::max<int64_t>(s.D, 1), [s, sc, ks](const std::vector<Tensor>& t) {
        // Scores for all heads at once (ATen's batched GEMM), then one pass per row does
        // scale, mask, softmax and dropout, then the second GEMM writes [B, S, N, Dv].
        Tensor scores = at::matmul(acc(t[0]), acc(t[1]).transpose(-1, -2)).contiguous();
        scores.mul_(sc).add_(acc(t[3]));
        NPU_DISPATCH_FLOAT(t[6].scalar_type(), "npu_fused_attention_score_fwd", [&] {
          using A = vmath::acc_t<scalar_t>;
          A* z = scores.mutable_data_ptr<A>();
          const auto* dm = t[4].const_data_ptr<uint8_t>();
          auto* sm = t[6].mutable_data_ptr<scalar_t>();
          const int64_t n = s.Sk, rows = s.B * s.N * s.S;
          at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
              A* zr = z + r * n;
              A mx = -std::numeric_limits<A>::infinity();
              for (int64_t j = 0; j < n; ++j) mx = std::max(mx, zr[j]);
              A sum = 0;
              for (int64_t j = 0; j < n; ++j) {
                zr[j] = std::exp(zr[j] - mx);
                sum += zr[j];
              }
              for (int64_t j = 0; j < n; ++j) {
                const scalar_t p = static_cast<scalar_t>(zr[j] / sum);
                sm[r * n + j] = p;
                zr[j] = dm[r * n + j] ? A(p) * A(ks) : A(0);  // the dropped-out probabilities
              }
            }
          });
        });
        Tensor ctx = at::matmul(scores, acc(t[2]));  // [B, N, S, Dv]
        t[5].view({s.B, s.S, s.N, s.Dv}).copy_(ctx.transpose(1, 2));
      });
  return {format_like(context, query), format_like(softmax, query), drop_mask};
}

Tensor npu_fused_attention_score(const Tensor& query, const Tensor& key, const Tensor& value,
                                 const Tensor& attention_mask, const at::Scalar& scale, double keep_prob,
                                 bool query_transpose, bool key_transpose, bool bmm_score_transpose_a,
                                 bool bmm_score_transpose_b, bool value_transpose, bool dx_transpose) {
  // As torch_npu: the context of _fwd, whose autograd it shares.
  static auto fwd = op_handle<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                 const Tensor&, const at::Scalar&, double, bool, bool,
                                                                 bool, bool, bool, bool)>(
      "npu::npu_fused_attention_score_fwd");
  return std::get<0>(fwd.call(query, key, value, attention_mask, scale, keep_prob, query_transpose, key_transpose,
                              bmm_score_transpose_a, bmm_score_transpose_b, value_transpose, dx_transpose));
}

// Gradients of query, key and value in [B, S, N, D] buffers (the BSH rows of
// npu_fused_attention_score_fwd's context).
std::tuple<Tensor, Tensor, Tensor> attention_score_grads(const char* op, const Tensor& grad_output,
                                                         const Tensor& softmax_output, const Tensor& query,
                                                         const Tensor& key, const Tensor& value,
                                                         const Tensor& drop_mask, const at::Scalar& scale,
                                                         double keep_prob, bool query_transpose, bool key_transpose,
                                                         bool value_transpose, bool dx_transpose) {
  const auto device = npu_device(op, {{"grad_output", grad_output},
                                      {"softmax_output", softmax_output},
                                      {"query_layer", query},
                                      {"key_layer", key},
                                      {"value_layer", value},
                                      {"mask", drop_mask}});
  check_no_transpose(op, {{"query_transpose", query_transpose},
                          {"key_transpose", key_transpose},
                          {"value_transpose", value_transpose},
                          {"dx_transpose", dx_transpose}});
  const auto s = check_qkv(op, query, key, value);
  check_dtype(op, "grad_output", grad_output, query.scalar_type());
  check_dtype(op, "softmax_output", softmax_output, query.scalar_type());
  TORCH_CHECK(grad_output.numel() == s.B * s.S * s.N * s.Dv && grad_output.dim() >= 1 &&
                  grad_output.size(-1) % std::max<int64_t>(s.Dv, 1) == 0,
              op, ": expected grad_output of the context's shape [", s.B * s.S, ", ", s.N * s.Dv, "], got ",
              grad_output.sizes());
  TORCH_CHECK(softmax_output.sizes().equals({s.B, s.N, s.S, s.Sk}), op, ": expected softmax_output of shape [", s.B,
              ", ", s.N, ", ", s.S, ", ", s.Sk, "], got ", softmax_output.sizes());
  check_dtype(op, "mask", drop_mask, at::kByte);
  TORCH_CHECK(drop_mask.numel() == softmax_output.numel(), op, ": expected mask (the dropout mask) of ",
              softmax_output.numel(), " elements, one per softmax_output element, got shape ", drop_mask.sizes());
  check_keep_prob(op, keep_prob);
  const double sc = scale.toDouble();
  const double ks = keep_scale(keep_prob);
  const auto opts = query.options();
  Tensor dq = at::empty({s.B, s.S, s.N, s.D}, opts);
  Tensor dk = at::empty({s.B, s.Sk, s.N, s.D}, opts);
  Tensor dv = at::empty({s.B, s.Sk, s.N, s.Dv}, opts);
  ops::launch_kernel(
      op, device,
      {dense(grad_output), dense(softmax_output), dense(query), dense(key), dense(value), dense(drop_mask), dq, dk,
       dv},
      softmax_output.numel() * std::max<int64_t>(s.D, 1), [s, sc, ks](const std::vector<Tensor>& t) {
        const Tensor g = acc(t[0]).reshape({s.B, s.S, s.N, s.Dv}).transpose(1, 2);  // [B, N, S, Dv]
        const Tensor v = acc(t[4]);
        Tensor dp = at::matmul(g, v.transpose(-1, -2)).contiguous();  // grad of the dropped probabilities
        Tensor p = at::empty(dp.sizes(), dp.options());                 // the dropped probabilities
        NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_fused_attention_score_backward", [&] {
          using A = vmath::acc_t<scalar_t>;
          A* dpp = dp.mutable_data_ptr<A>();
          A* pp = p.mutable_data_ptr<A>();
          const auto* sm = t[1].const_data_ptr<scalar_t>();
          const auto* dm = t[5].const_data_ptr<uint8_t>();
          const int64_t n = s.Sk, rows = s.B * s.N * s.S;
          at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
              A* d = dpp + r * n;
              A dot = 0;
              for (int64_t j = 0; j < n; ++j) {
                const A keep = dm[r * n + j] ? A(ks) : A(0);
                const A y = A(sm[r * n + j]);
                pp[r * n + j] = y * keep;
                d[j] *= keep;  // through the dropout
                dot += d[j] * y;
              }
              // through the softmax and the scale: the score gradient
              for (int64_t j = 0; j < n; ++j) d[j] = A(sm[r * n + j]) * (d[j] - dot) * A(sc);
            }
          });
        });
        t[8].transpose(1, 2).copy_(at::matmul(p.transpose(-1, -2), g));
        t[6].transpose(1, 2).copy_(at::matmul(dp, acc(t[3])));
        t[7].transpose(1, 2).copy_(at::matmul(dp.transpose(-1, -2), acc(t[2])));
      });
  return {dq, dk, dv};
}

// Returns (query, key, value) gradients shaped [B, N, S, D]: views of [B, S, N, D] buffers.
std::tuple<Tensor, Tensor, Tensor> npu_fused_attention_score_backward(
    const Tensor& grad_output, const Tensor& softmax_output, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& mask, const at::Scalar& scale, double keep_prob, bool query_transpose,
    bool key_transpose, bool value_transpose, bool dx_transpose) {
  auto [dq, dk, dv] = attention_score_grads("npu_fused_attention_score_backward", grad_output, softmax_output, query,
                                            key, value, mask, scale, keep_prob, query_transpose, key_transpose,
                                            value_transpose, dx_transpose);
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
}

// Returns (query, key, value) gradients as 2-D [B*S, N*D] in FRACTAL_NZ, the layout
// npu_fused_attention_qkv_grad takes.
std::tuple<Tensor, Tensor, Tensor> npu_fused_attention_score_grad(const Tensor& grad_output,
                                                                  const Tensor& softmax_output, const Tensor& query,
                                                                  const Tensor& key, const Tensor& value,
                                                                  const Tensor& mask, const at::Scalar& scale,
                                                                  double keep_prob, bool query_transpose,
                                                                  bool key_transpose, bool value_transpose,
                                                                  bool dx_transpose) {
  auto [dq, dk, dv] = attention_score_grads("npu_fused_attention_score_grad", grad_output, softmax_output, query, key,
                                            value, mask, scale, keep_prob, query_transpose, key_transpose,
                                            value_transpose, dx_transpose);
  auto flat = [](const Tensor& t) {
    return ops::format_cast(t.view({t.size(0) * t.size(1), t.size(2) * t.size(3)}), ops::kFormatFractalNZ);
  };
  return {flat(dq), flat(dk), flat(dv)};
}

// ---- layer norm + q/k/v projections ------------------------------------------------------

void check_kernel(const char* op, const char* name, const Tensor& kernel, int64_t in, c10::ScalarType dtype) {
  check_float(op, name, kernel, 2);
  check_dtype(op, name, kernel, dtype);
  TORCH_CHECK(kernel.size(0) == in, op, ": expected ", name, " of shape [", in, ", out] (x @ kernel), got ",
              kernel.sizes());
}

void check_bias(const char* op, const char* name, const std::optional<Tensor>& bias, int64_t out,
                c10::ScalarType dtype) {
  if (!bias.has_value() || !bias->defined()) return;
  check_float(op, name, *bias, 1);
  check_dtype(op, name, *bias, dtype);
  TORCH_CHECK(bias->size(0) == out, op, ": expected ", name, " of shape [", out, "], got ", bias->sizes());
}

// Layer norm of the M rows of x [M, H]: y = (x - mean) / sqrt(var + eps) * gamma + beta,
// with the rows' mean and (biased) variance.
template <typename T>
void layer_norm_rows(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* variance, int64_t M, int64_t H,
                     double eps) {
  using A = vmath::acc_t<T>;
  at::parallel_for(0, M, std::max<int64_t>(1, kGrain / std::max<int64_t>(H, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = x + r * H;
      A m = 0, v = 0;
      for (int64_t j = 0; j < H; ++j) m += A(xr[j]);
      m /= A(H);
      for (int64_t j = 0; j < H; ++j) v += (A(xr[j]) - m) * (A(xr[j]) - m);
      v /= A(H);
      const A rstd = A(1) / std::sqrt(v + A(eps));
      for (int64_t j = 0; j < H; ++j) y[r * H + j] = static_cast<T>((A(xr[j]) - m) * rstd * A(gamma[j]) + A(beta[j]));
      mean[r] = static_cast<T>(m);
      variance[r] = static_cast<T>(v);
    }
  });
}

// Returns [norm, query, key, value, mean, variance]: norm = layer_norm(x) (rows of x),
// query = (norm @ kernel_query + bias_query) as [B, num_heads, seq_len, out / num_heads].
std::vector<Tensor> npu_fused_attention_layernorm_qkv_fwd(const Tensor& x, const Tensor& kernel_query,
                                                          const Tensor& kernel_key, const Tensor& kernel_value,
                                                          const Tensor& gamma, const Tensor& beta,
                                                          const std::optional<Tensor>& bias_query,
                                                          const std::optional<Tensor>& bias_key,
                                                          const std::optional<Tensor>& bias_value, int64_t seq_len,
                                                          int64_t num_heads, double eps) {
  constexpr const char* op = "npu_fused_attention_layernorm_qkv_fwd";
  const Tensor bq = bias_query.value_or(Tensor()), bk = bias_key.value_or(Tensor()),
               bv = bias_value.value_or(Tensor());
  const auto device = npu_device(op, {{"x", x},
                                      {"kernel_query", kernel_query},
                                      {"kernel_key", kernel_key},
                                      {"kernel_value", kernel_value},
                                      {"gamma", gamma},
                                      {"beta", beta},
                                      {"bias_query", bq},
                                      {"bias_key", bk},
                                      {"bias_value", bv}});
  check_float(op, "x", x, 2);
  TORCH_CHECK(seq_len > 0 && num_heads > 0, op, ": expected seq_len and num_heads > 0, got ", seq_len, " and ",
              num_heads);
  const int64_t M = x.size(0), H = x.size(1);
  TORCH_CHECK(M % seq_len == 0, op, ": expected x.size(0) (", M, ") divisible by seq_len (", seq_len, ")");
  const auto dt = x.scalar_type();
  check_kernel(op, "kernel_query", kernel_query, H, dt);
  const int64_t out = kernel_query.size(1);
  TORCH_CHECK(out % num_heads == 0, op, ": expected the projection width ", out, " divisible by num_heads (",
              num_heads, ")");
  check_kernel(op, "kernel_key", kernel_key, H, dt);
  check_kernel(op, "kernel_value", kernel_value, H, dt);
  TORCH_CHECK(kernel_key.size(1) == out && kernel_value.size(1) == out, op,
              ": expected kernel_key and kernel_value of kernel_query's shape ", kernel_query.sizes(), ", got ",
              kernel_key.sizes(), " and ", kernel_value.sizes());
  check_float(op, "gamma", gamma, 1);
  check_float(op, "beta", beta, 1);
  check_dtype(op, "gamma", gamma, dt);
  check_dtype(op, "beta", beta, dt);
  TORCH_CHECK(gamma.size(0) == H && beta.size(0) == H, op, ": expected gamma and beta of shape [", H, "], got ",
              gamma.sizes(), " and ", beta.sizes());
  check_bias(op, "bias_query", bq, out, dt);
  check_bias(op, "bias_key", bk, out, dt);
  check_bias(op, "bias_value", bv, out, dt);
  TORCH_CHECK(eps >= 0, op, ": expected eps >= 0, got ", eps);
  const int64_t B = M / seq_len, Dh = out / num_heads;
  const auto opts = x.options();
  Tensor norm = at::empty({M, H}, opts);
  Tensor mean = at::empty({M}, opts);
  Tensor variance = at::empty({M}, opts);
  std::vector<Tensor> qkv;
  for (int i = 0; i < 3; ++i) qkv.push_back(at::empty({B, num_heads, seq_len, Dh}, opts));
  ops::launch_kernel(op, device,
                     {dense(x), dense(kernel_query), dense(kernel_key), dense(kernel_value), dense(gamma),
                      dense(beta), dense(bq), dense(bk), dense(bv), norm, mean, variance, qkv[0], qkv[1], qkv[2]},
                     M * (H + 3 * out), [=](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), op, [&] {
                         layer_norm_rows(t[0].const_data_ptr<scalar_t>(), t[4].const_data_ptr<scalar_t>(),
                                         t[5].const_data_ptr<scalar_t>(), t[9].mutable_data_ptr<scalar_t>(),
                                         t[10].mutable_data_ptr<scalar_t>(), t[11].mutable_data_ptr<scalar_t>(), M,
                                         H, eps);
                       });
                       const Tensor n = acc(t[9]);
                       for (int i = 0; i < 3; ++i) {
                         const Tensor w = acc(t[1 + i]);
                         const Tensor y = t[6 + i].defined() ? at::addmm(acc(t[6 + i]), n, w) : at::mm(n, w);
                         // [B*S, out] rows -> [B, N, S, Dh]
                         t[12 + i].copy_(y.view({B, seq_len, num_heads, Dh}).transpose(1, 2));
                       }
                     });
  return {format_like(norm, x),
          format_like(qkv[0], kernel_query),
          format_like(qkv[1], kernel_query),
          format_like(qkv[2], kernel_query),
          mean,
          variance};
}

// Returns [grad_hidden_states (FRACTAL_NZ), grad_w_query, grad_w_key, grad_w_value,
// grad_b_query, grad_b_key, grad_b_value] of y_i = hidden_states @ kernel_i + b_i, with
// grad_output_ln added to grad_hidden_states (the layer norm output's own gradient).
std::vector<Tensor> npu_fused_attention_qkv_grad(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                                 const Tensor& kernel_q, const Tensor& kernel_k,
                                                 const Tensor& kernel_v, const Tensor& hidden,
                                                 const Tensor& grad_ln) {
  constexpr const char* op = "npu_fused_attention_qkv_grad";
  const auto device = npu_device(op, {{"grad_output_query", grad_q},
                                      {"grad_output_key", grad_k},
                                      {"grad_output_value", grad_v},
                                      {"query_kernel", kernel_q},
                                      {"key_kernel", kernel_k},
                                      {"value_kernel", kernel_v},
                                      {"hidden_states", hidden},
                                      {"grad_output_ln", grad_ln}});
  check_float(op, "hidden_states", hidden, 2);
  const auto dt = hidden.scalar_type();
  const int64_t M = hidden.size(0), H = hidden.size(1);
  check_float(op, "grad_output_ln", grad_ln, 2);
  check_dtype(op, "grad_output_ln", grad_ln, dt);
  TORCH_CHECK(grad_ln.sizes().equals(hidden.sizes()), op, ": expected grad_output_ln of hidden_states' shape ",
              hidden.sizes(), ", got ", grad_ln.sizes());
  const char* gnames[3] = {"grad_output_query", "grad_output_key", "grad_output_value"};
  const char* knames[3] = {"query_kernel", "key_kernel", "value_kernel"};
  const Tensor* grads[3] = {&grad_q, &grad_k, &grad_v};
  const Tensor* kernels[3] = {&kernel_q, &kernel_k, &kernel_v};
  for (int i = 0; i < 3; ++i) {
    check_kernel(op, knames[i], *kernels[i], H, dt);
    check_float(op, gnames[i], *grads[i], 2);
    check_dtype(op, gnames[i], *grads[i], dt);
    TORCH_CHECK(grads[i]->size(0) == M && grads[i]->size(1) == kernels[i]->size(1), op, ": expected ", gnames[i],
                " of shape [", M, ", ", kernels[i]->size(1), "] (hidden_states rows, ", knames[i], " columns), got ",
                grads[i]->sizes());
  }
  const auto opts = hidden.options();
  std::vector<Tensor> outs{at::empty({M, H}, opts)};
  for (int i = 0; i < 3; ++i) outs.push_back(at::empty(kernels[i]->sizes(), opts));
  for (int i = 0; i < 3; ++i) outs.push_back(at::empty({kernels[i]->size(1)}, opts));
  std::vector<Tensor> args{dense(grad_q), dense(grad_k),  dense(grad_v), dense(kernel_q),
                           dense(kernel_k), dense(kernel_v), dense(hidden), dense(grad_ln)};
  args.insert(args.end(), outs.begin(), outs.end());
  ops::launch_kernel(op, device, std::move(args), 6 * M * H * std::max<int64_t>(kernel_q.size(1), 1),
                     [](const std::vector<Tensor>& t) {
                       Tensor gx = acc(t[7]).clone();
                       const Tensor h = acc(t[6]);
                       for (int i = 0; i < 3; ++i) {
                         const Tensor g = acc(t[i]);
                         gx.addmm_(g, acc(t[3 + i]).t());
                         t[9 + i].copy_(at::mm(h.t(), g));
                         t[12 + i].copy_(at::sum(g, 0));
                       }
                       t[8].copy_(gx);
                     });
  std::vector<Tensor> result{ops::format_cast(outs[0], ops::kFormatFractalNZ)};
  for (int i = 0; i < 3; ++i) result.push_back(format_like(outs[1 + i], *kernels[i]));
  for (int i = 4; i < 7; ++i) result.push_back(outs[i]);
  return result;
}

// Layer norm backward as torch_npu's LayerNormGrad: `rstd` is the forward's *variance*
// (what torch_npu's layer norm and npu_fused_attention_layernorm_qkv_fwd return);
// returns (grad_input, grad_weight, grad_bias).
std::tuple<Tensor, Tensor, Tensor> npu_layernorm_grad(const Tensor& grad_out, const Tensor& input,
                                                      at::IntArrayRef normalized_shape, const Tensor& mean,
                                                      const Tensor& variance, const std::optional<Tensor>& weight,
                                                      const std::optional<Tensor>& bias) {
  constexpr const char* op = "npu_layernorm_grad";
  const Tensor w = weight.value_or(Tensor()), b = bias.value_or(Tensor());
  const auto device = npu_device(op, {{"grad_out", grad_out},
                                      {"input", input},
                                      {"mean", mean},
                                      {"rstd", variance},
                                      {"weight", w},
                                      {"bias", b}});
  check_float(op, "input", input);
  const auto dt = input.scalar_type();
  check_dtype(op, "grad_out", grad_out, dt);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()), op, ": expected grad_out of input's shape ", input.sizes(),
              ", got ", grad_out.sizes());
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(nd >= 1 && input.dim() >= nd && input.sizes().slice(input.dim() - nd).equals(normalized_shape), op,
              ": expected normalized_shape to be the trailing sizes of input ", input.sizes(), ", got ",
              normalized_shape);
  const int64_t N = c10::multiply_integers(normalized_shape);
  const int64_t M = N == 0 ? 0 : input.numel() / N;
  check_float(op, "mean", mean);
  check_float(op, "rstd", variance);
  TORCH_CHECK(mean.numel() == M && variance.numel() == M, op, ": expected mean and rstd (the variance) of ", M,
              " elements (one per normalized row), got shapes ", mean.sizes(), " and ", variance.sizes());
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"weight", w}, {"bias", b}}) {
    if (!t.defined()) continue;
    check_float(op, name, t);
    check_dtype(op, name, t, dt);
    TORCH_CHECK(t.sizes().equals(normalized_shape), op, ": expected ", name, " of shape ", normalized_shape,
                ", got ", t.sizes());
  }
  Tensor dx = at::empty(input.sizes(), input.options());
  Tensor dgamma = at::empty(normalized_shape, input.options());
  Tensor dbeta = at::empty(normalized_shape, input.options());
  ops::launch_kernel(
      op, device,
      {dense(grad_out), dense(input), dense(mean), dense(variance), dense(w), dx, dgamma, dbeta}, input.numel(),
      [M, N](const std::vector<Tensor>& t) {
        NPU_DISPATCH_FLOAT(t[1].scalar_type(), "npu_layernorm_grad", [&] {
          using A = vmath::acc_t<scalar_t>;
          constexpr auto acc_type = c10::CppTypeToScalarType<A>::value;
          const Tensor mf = t[2].to(acc_type).contiguous();
          const Tensor vf = t[3].to(acc_type).contiguous();
          const A* mp = mf.const_data_ptr<A>();
          const A* vp = vf.const_data_ptr<A>();
          const auto* dy = t[0].const_data_ptr<scalar_t>();
          const auto* x = t[1].const_data_ptr<scalar_t>();
          const scalar_t* g = t[4].defined() ? t[4].const_data_ptr<scalar_t>() : nullptr;
          auto* dxp = t[5].mutable_data_ptr<scalar_t>();
          // Row-parallel dx; per-thread partial sums of dgamma/dbeta, reduced after.
          const int64_t threads = at::get_num_threads();
          std::vector<A> pg(threads * N, A(0)), pb(threads * N, A(0));
          at::parallel_for(0, M, std::max<int64_t>(1, kGrain / std::max<int64_t>(N, 1)), [&](int64_t b, int64_t e) {
            A* sg = pg.data() + at::get_thread_num() * N;
            A* sb = pb.data() + at::get_thread_num() * N;
            for (int64_t r = b; r < e; ++r) {
              const A m = mp[r], rstd = A(1) / std::sqrt(vp[r] + A(kLayerNormGradEps));
              A s1 = 0, s2 = 0;  // sums of dy*gamma and dy*gamma*xhat
              for (int64_t j = 0; j < N; ++j) {
                const A xh = (A(x[r * N + j]) - m) * rstd;
                const A d = A(dy[r * N + j]);
                const A dg = d * (g ? A(g[j]) : A(1));
                s1 += dg;
                s2 += dg * xh;
                sg[j] += d * xh;
                sb[j] += d;
              }
              s1 /= A(N);
              s2 /= A(N);
              for (int64_t j = 0; j < N; ++j) {
                const A xh = (A(x[r * N + j]) - m) * rstd;
                const A dg = A(dy[r * N + j]) * (g ? A(g[j]) : A(1));
                dxp[r * N + j] = static_cast<scalar_t>(rstd * (dg - s1 - xh * s2));
              }
            }
          });
          auto* dgp = t[6].mutable_data_ptr<scalar_t>();
          auto* dbp = t[7].mutable_data_ptr<scalar_t>();
          for (int64_t j = 0; j < N; ++j) {
            A sg = 0, sb = 0;
            for (int64_t k = 0; k < threads; ++k) {
              sg += pg[k * N + j];
              sb += pb[k * N + j];
            }
            dgp[j] = static_cast<scalar_t>(sg);
            dbp[j] = static_cast<scalar_t>(sb);
          }
        });
      });
  return {format_like(dx, input), dgamma, dbeta};
}

// ---- npu_linear: input @ weight^T + bias ---------------------------------------------------

Tensor npu_linear(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias) {
  constexpr const char* op = "npu_linear";
  const Tensor b = bias.value_or(Tensor());
  const auto device = npu_device(op, {{"input", input}, {"weight", weight}, {"bias", b}});
  check_float(op, "input", input, 2);
  check_float(op, "weight", weight, 2);
  check_dtype(op, "weight", weight, input.scalar_type());
  TORCH_CHECK(weight.size(1) == input.size(1), op, ": expected weight of shape [out, ", input.size(1),
              "] (input's columns), got ", weight.sizes());
  check_bias(op, "bias", b, weight.size(0), input.scalar_type());
  Tensor out = at::empty({input.size(0), weight.size(0)}, input.options());
  ops::launch_kernel(op, device, {dense(input), dense(weight), dense(b), out},
                     input.numel() * std::max<int64_t>(weight.size(0), 1), [](const std::vector<Tensor>& t) {
                       const Tensor w = acc(t[1]).t();
                       t[3].copy_(t[2].defined() ? at::addmm(acc(t[2]), acc(t[0]), w) : at::mm(acc(t[0]), w));
                     });
  return format_like(out, input);
}

// Returns (grad of input = grad @ weight, grad of weight = grad^T @ input).
std::tuple<Tensor, Tensor> npu_linear_backward(const Tensor& grad, const Tensor& input, const Tensor& weight) {
  constexpr const char* op = "npu_linear_backward";
  const auto device = npu_device(op, {{"grad", grad}, {"input", input}, {"weight", weight}});
  check_float(op, "input", input, 2);
  check_float(op, "weight", weight, 2);
  check_float(op, "grad", grad, 2);
  check_dtype(op, "weight", weight, input.scalar_type());
  check_dtype(op, "grad", grad, input.scalar_type());
  TORCH_CHECK(weight.size(1) == input.size(1), op, ": expected weight of shape [out, ", input.size(1),
              "] (input's columns), got ", weight.sizes());
  TORCH_CHECK(grad.size(0) == input.size(0) && grad.size(1) == weight.size(0), op, ": expected grad of shape [",
              input.size(0), ", ", weight.size(0), "] (the output's), got ", grad.sizes());
  Tensor gi = at::empty(input.sizes(), input.options());
  Tensor gw = at::empty(weight.sizes(), weight.options());
  ops::launch_kernel(op, device, {dense(grad), dense(input), dense(weight), gi, gw},
                     2 * input.numel() * std::max<int64_t>(weight.size(0), 1), [](const std::vector<Tensor>& t) {
                       const Tensor g = acc(t[0]);
                       t[3].copy_(at::mm(g, acc(t[2])));
                       t[4].copy_(at::mm(g.t(), acc(t[1])));
                     });
  return {format_like(gi, input), format_like(gw, weight)};
}

// ---- autograd ------------------------------------------------------------------------------

class Linear : public torch::autograd::Function<Linear> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const std::optional<Tensor>& bias) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd =
        op_handle<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&)>("npu::npu_linear");
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return fwd.call(input, weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    static auto bwd = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&)>(
        "npu::npu_linear_backward");
    const auto saved = ctx->get_saved_variables();
    auto [gi, gw] = bwd.call(grads[0], saved[0], saved[1]);
    Tensor gb = ctx->saved_data["has_bias"].toBool() ? at::sum(grads[0], 0) : Tensor();
    return {gi, gw, gb};
  }
};

class AttentionScoreFwd : public torch::autograd::Function<AttentionScoreFwd> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& query, const Tensor& key, const Tensor& value,
                               const Tensor& attention_mask, const at::Scalar& scale, double keep_prob,
                               bool query_transpose, bool key_transpose, bool bmm_score_transpose_a,
                               bool bmm_score_transpose_b, bool value_transpose, bool dx_transpose) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto fwd = op_handle<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                   const Tensor&, const at::Scalar&, double, bool,
                                                                   bool, bool, bool, bool, bool)>(
        "npu::npu_fused_attention_score_fwd");
    auto [context, softmax, drop_mask] =
        fwd.call(query, key, value, attention_mask, scale, keep_prob, query_transpose, key_transpose,
                 bmm_score_transpose_a, bmm_score_transpose_b, value_transpose, dx_transpose);
    ctx->save_for_backward({query, key, value, softmax, drop_mask});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["keep_prob"] = keep_prob;
    ctx->saved_data["query_transpose"] = query_transpose;
    ctx->saved_data["key_transpose"] = key_transpose;
    ctx->saved_data["value_transpose"] = value_transpose;
    ctx->saved_data["dx_transpose"] = dx_transpose;
    ctx->mark_non_differentiable({softmax, drop_mask});
    return {context, softmax, drop_mask};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(12);
    if (!grads[0].defined()) return result;
    static auto bwd = op_handle<std::tuple<Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const at::Scalar&,
        double, bool, bool, bool, bool)>("npu::npu_fused_attention_score_backward");
    const auto s = ctx->get_saved_variables();
    auto flag = [&](const char* name) { return ctx->saved_data[name].toBool(); };
    auto [dq, dk, dv] =
        bwd.call(grads[0], s[3], s[0], s[1], s[2], s[4], ctx->saved_data["scale"].toScalar(),
                 ctx->saved_data["keep_prob"].toDouble(), flag("query_transpose"), flag("key_transpose"),
                 flag("value_transpose"), flag("dx_transpose"));
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    return result;
  }
};

Tensor linear_autograd(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias) {
  return Linear::apply(input, weight, bias);
}

std::tuple<Tensor, Tensor, Tensor> attention_score_fwd_autograd(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attention_mask,
    const at::Scalar& scale, double keep_prob, bool query_transpose, bool key_transpose, bool bmm_score_transpose_a,
    bool bmm_score_transpose_b, bool value_transpose, bool dx_transpose) {
  auto r = AttentionScoreFwd::apply(query, key, value, attention_mask, scale, keep_prob, query_transpose,
                                    key_transpose, bmm_score_transpose_a, bmm_score_transpose_b, value_transpose,
                                    dx_transpose);
  return {r[0], r[1], r[2]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def(
      "npu_fused_attention_score(Tensor query_layer, Tensor key_layer, Tensor value_layer, Tensor attention_mask, "
      "Scalar scale, float keep_prob, bool query_transpose=False, bool key_transpose=False, "
      "bool bmm_score_transpose_a=False, bool bmm_score_transpose_b=False, bool value_transpose=False, "
      "bool dx_transpose=False) -> Tensor");
  m.def(
      "npu_fused_attention_score_fwd(Tensor query_layer, Tensor key_layer, Tensor value_layer, "
      "Tensor attention_mask, Scalar scale, float keep_prob, bool query_transpose=False, bool key_transpose=False, "
      "bool bmm_score_transpose_a=False, bool bmm_score_transpose_b=False, bool value_transpose=False, "
      "bool dx_transpose=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "npu_fused_attention_score_backward(Tensor grad_output, Tensor softmax_output, Tensor query_layer, "
      "Tensor key_layer, Tensor value_layer, Tensor mask, Scalar scale, float keep_prob, "
      "bool query_transpose=False, bool key_transpose=False, bool value_transpose=False, bool dx_transpose=False) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "npu_fused_attention_score_grad(Tensor grad_output, Tensor softmax_output, Tensor query_layer, "
      "Tensor key_layer, Tensor value_layer, Tensor mask, Scalar scale, float keep_prob, "
      "bool query_transpose=False, bool key_transpose=False, bool value_transpose=False, bool dx_transpose=False) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "npu_fused_attention_layernorm_qkv_fwd(Tensor x, Tensor kernel_query, Tensor kernel_key, "
      "Tensor kernel_value, Tensor gamma, Tensor beta, Tensor? bias_query=None, Tensor? bias_key=None, "
      "Tensor? bias_value=None, int seq_len=128, int num_heads=12, float eps=1e-05) -> Tensor[]");
  m.def(
      "npu_fused_attention_qkv_grad(Tensor grad_output_query, Tensor grad_output_key, Tensor grad_output_value, "
      "Tensor query_kernel, Tensor key_kernel, Tensor value_kernel, Tensor hidden_states, Tensor grad_output_ln) "
      "-> Tensor[]");
  m.def(
      "npu_layernorm_grad(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, "
      "Tensor? weight, Tensor? bias) -> (Tensor, Tensor, Tensor)");
  m.def("npu_linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("npu_linear_backward(Tensor grad, Tensor input, Tensor weight) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_fused_attention_score_fwd", TORCH_FN(npu_fused_attention_score_fwd));
  m.impl("npu_fused_attention_score_backward", TORCH_FN(npu_fused_attention_score_backward));
  m.impl("npu_fused_attention_score_grad", TORCH_FN(npu_fused_attention_score_grad));
  m.impl("npu_fused_attention_layernorm_qkv_fwd", TORCH_FN(npu_fused_attention_layernorm_qkv_fwd));
  m.impl("npu_fused_attention_qkv_grad", TORCH_FN(npu_fused_attention_qkv_grad));
  m.impl("npu_layernorm_grad", TORCH_FN(npu_layernorm_grad));
  m.impl("npu_linear", TORCH_FN(npu_linear));
  m.impl("npu_linear_backward", TORCH_FN(npu_linear_backward));
}

// npu_fused_attention_score is _fwd's context (differentiable through _fwd's autograd).
TORCH_LIBRARY_IMPL(npu, CompositeImplicitAutograd, m) {
  m.impl("npu_fused_attention_score", TORCH_FN(npu_fused_attention_score));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) {
  m.impl("npu_linear", TORCH_FN(linear_autograd));
  m.impl("npu_fused_attention_score_fwd", TORCH_FN(attention_score_fwd_autograd));
}

}  // namespace torch_npu::custom_ops
