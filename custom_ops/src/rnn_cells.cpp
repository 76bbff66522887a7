// The fused LSTM and GRU cells PyTorch calls for every time step of nn.LSTM / nn.GRU /
// LSTMCell / GRUCell on a non-CPU device (aten::_thnn_fused_lstm_cell,
// _thnn_fused_gru_cell and their backwards: CUDA-only kernels in PyTorch, so without these
// recurrent layers did not run on npu). One pass over the gates per step:
//   LSTM: gates = input_gates + hidden_gates (+ biases), chunks (i, f, g, o);
//         cy = sigmoid(f) cx + sigmoid(i) tanh(g), hy = sigmoid(o) tanh(cy);
//         workspace [B, 4H] = the activated gates.
//   GRU:  r = sigmoid(ir + hr), z = sigmoid(iz + hz), n = tanh(in + r hn),
//         hy = (1 - z) n + z hx; workspace [B, 5H] = (r, z, n, hx, hn).
// Half types compute in float.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "fused.h"

namespace torch_npu::custom_ops {
namespace {

constexpr int64_t kGrain = 2048;

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// [B, G*H] gates: checks shapes and dtypes and returns (B, H).
std::pair<int64_t, int64_t> check_cell(const char* op, int64_t chunks, const Tensor& input_gates,
                                       const Tensor& hidden_gates, const char* state_name, const Tensor& state,
                                       const std::optional<Tensor>& input_bias,
                                       const std::optional<Tensor>& hidden_bias) {
  check_float(op, "input_gates", input_gates, 2);
  const int64_t B = input_gates.size(0), G = input_gates.size(1);
  TORCH_CHECK(G % chunks == 0, op, ": expected input_gates of shape [B, ", chunks, " * hidden_size], got ",
              input_gates.sizes());
  const int64_t H = G / chunks;
  check_dtype(op, "hidden_gates", hidden_gates, input_gates.scalar_type());
  TORCH_CHECK(hidden_gates.sizes().equals(input_gates.sizes()), op, ": expected hidden_gates of shape ",
              input_gates.sizes(), ", got ", hidden_gates.sizes());
  check_dtype(op, state_name, state, input_gates.scalar_type());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == B && state.size(1) == H, op, ": expected ", state_name,
              " of shape [", B, ", ", H, "], got ", state.sizes());
  const bool ib = input_bias.has_value() && input_bias->defined();
  const bool hb = hidden_bias.has_value() && hidden_bias->defined();
  TORCH_CHECK(ib == hb, op, ": input_bias and hidden_bias must both be given or both be None");
  for (const auto& [name, bias] : {std::pair{"input_bias", ib ? *input_bias : Tensor()},
                                   std::pair{"hidden_bias", hb ? *hidden_bias : Tensor()}}) {
    if (!bias.defined()) continue;
    check_dtype(op, name, bias, input_gates.scalar_type());
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == G, op, ": expected ", name, " of shape [", G, "], got ",
                bias.sizes());
  }
  return {B, H};
}

std::tuple<Tensor, Tensor, Tensor> lstm_cell(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& cx,
                                             const std::optional<Tensor>& input_bias,
                                             const std::optional<Tensor>& hidden_bias) {
  constexpr const char* op = "_thnn_fused_lstm_cell";
  const auto device = npu_device(op, {{"input_gates", input_gates}, {"hidden_gates", hidden_gates}, {"cx", cx}});
  const auto [B, H] = check_cell(op, 4, input_gates, hidden_gates, "cx", cx, input_bias, hidden_bias);
  Tensor hy = at::empty({B, H}, cx.options());
  Tensor cy = at::empty({B, H}, cx.options());
  Tensor workspace = at::empty({B, 4 * H}, input_gates.options());
  ops::launch_kernel(
      op, device,
      {dense(input_gates), dense(hidden_gates), dense(cx), dense(input_bias.value_or(Tensor())),
       dense(hidden_bias.value_or(Tensor())), hy, cy, workspace},
      B * 4 * H, [B = B, H = H](const std::vector<Tensor>& t) {
        NPU_DISPATCH_FLOAT(t[0].scalar_type(), "_thnn_fused_lstm_cell", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const auto* ig = t[0].const_data_ptr<scalar_t>();
          const auto* hg = t[1].const_data_ptr<scalar_t>();
          const auto* c = t[2].const_data_ptr<scalar_t>();
          const scalar_t* ib = t[3].defined() ? t[3].const_data_ptr<scalar_t>() : nullptr;
          const scalar_t* hb = t[4].defined() ? t[4].const_data_ptr<scalar_t>() : nullptr;
          auto* h_out = t[5].mutable_data_ptr<scalar_t>();
          auto* c_out = t[6].mutable_data_ptr<scalar_t>();
          auto* ws = t[7].mutable_data_ptr<scalar_t>();
          at::parallel_for(0, B * H, kGrain, [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k) {
              const int64_t b = k / H, j = k % H;
              acc_t gate[4];
              for (int q = 0; q < 4; ++q) {
                const int64_t col = q * H + j, idx = b * 4 * H + col;
                acc_t x = acc_t(ig[idx]) + acc_t(hg[idx]);
                if (ib) x += acc_t(ib[col]) + acc_t(hb[col]);
                gate[q] = q == 2 ? std::tanh(x) : sigmoid(x);
                ws[idx] = scalar_t(gate[q]);
              }
              const acc_t c_new = gate[1] * acc_t(c[k]) + gate[0] * gate[2];
              c_out[k] = scalar_t(c_new);
              h_out[k] = scalar_t(gate[3] * std::tanh(c_new));
            }
          });
        });
      });
  return {hy, cy, workspace};
}

std::tuple<Tensor, Tensor, Tensor> lstm_cell_backward(const std::optional<Tensor>& grad_hy,
                                                      const std::optional<Tensor>& grad_cy, const Tensor& cx,
                                                      const Tensor& cy, const Tensor& workspace, bool has_bias) {
  constexpr const char* op = "_thnn_fused_lstm_cell_backward_impl";
  const Tensor ghy = grad_hy.value_or(Tensor()), gcy = grad_cy.value_or(Tensor());
  if (!ghy.defined() && !gcy.defined()) return {};  // no gradient flows in: none flows out
  const auto device = npu_device(op, {{"cx", cx}, {"cy", cy}, {"workspace", workspace}});
  check_float(op, "workspace", workspace, 2);
  const int64_t B = workspace.size(0), H = workspace.size(1) / 4;
  TORCH_CHECK(workspace.size(1) == 4 * H && cx.sizes().equals({B, H}) && cy.sizes().equals({B, H}), op,
              ": expected cx and cy of shape [B, H] and workspace of shape [B, 4H], got ", cx.sizes(), ", ",
              cy.sizes(), " and ", workspace.sizes());
  Tensor grad_gates = at::empty({B, 4 * H}, workspace.options());
  Tensor grad_cx = at::empty({B, H}, cx.options());
  ops::launch_kernel(
      op, device, {dense(ghy), dense(gcy), dense(cx), dense(cy), dense(workspace), grad_gates, grad_cx}, B * 4 * H,
      [B, H](const std::vector<Tensor>& t) {
        NPU_DISPATCH_FLOAT(t[4].scalar_type(), "_thnn_fused_lstm_cell_backward_impl", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const scalar_t* gh = t[0].defined() ? t[0].const_data_ptr<scalar_t>() : nullptr;
          const scalar_t* gc = t[1].defined() ? t[1].const_data_ptr<scalar_t>() : nullptr;
          const auto* c = t[2].const_data_ptr<scalar_t>();
          const auto* c_new = t[3].const_data_ptr<scalar_t>();
          const auto* ws = t[4].const_data_ptr<scalar_t>();
          auto* gg = t[5].mutable_data_ptr<scalar_t>();
          auto* gcx = t[6].mutable_data_ptr<scalar_t>();
          at::parallel_for(0, B * H, kGrain, [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k) {
              const int64_t b = k / H, j = k % H, row = b * 4 * H;
              const acc_t i = ws[row + j], f = ws[row + H + j], g = ws[row + 2 * H + j], o = ws[row + 3 * H + j];
              const acc_t tc = std::tanh(acc_t(c_new[k]));
              const acc_t dh = gh ? acc_t(gh[k]) : acc_t(0);
              const acc_t dc = (gc ? acc_t(gc[k]) : acc_t(0)) + dh * o * (acc_t(1) - tc * tc);
              gg[row + j] = scalar_t(dc * g * i * (acc_t(1) - i));
              gg[row + H + j] = scalar_t(dc * acc_t(c[k]) * f * (acc_t(1) - f));
              gg[row + 2 * H + j] = scalar_t(dc * i * (acc_t(1) - g * g));
              gg[row + 3 * H + j] = scalar_t(dh * tc * o * (acc_t(1) - o));
              gcx[k] = scalar_t(dc * f);
            }
          });
        });
      });
  Tensor grad_bias = has_bias ? grad_gates.sum(0) : Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<Tensor, Tensor> gru_cell(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& hx,
                                    const std::optional<Tensor>& input_bias,
                                    const std::optional<Tensor>& hidden_bias) {
  constexpr const char* op = "_thnn_fused_gru_cell";
  const auto device = npu_device(op, {{"input_gates", input_gates}, {"hidden_gates", hidden_gates}, {"hx", hx}});
  const auto [B, H] = check_cell(op, 3, input_gates, hidden_gates, "hx", hx, input_bias, hidden_bias);
  Tensor hy = at::empty({B, H}, hx.options());
  Tensor workspace = at::empty({B, 5 * H}, input_gates.options());
  ops::launch_kernel(
      op, device,
      {dense(input_gates), dense(hidden_gates), dense(hx), dense(input_bias.value_or(Tensor())),
       dense(hidden_bias.value_or(Tensor())), hy, workspace},
      B * 3 * H, [B = B, H = H](const std::vector<Tensor>& t) {
        NPU_DISPATCH_FLOAT(t[0].scalar_type(), "_thnn_fused_gru_cell", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const auto* ig = t[0].const_data_ptr<scalar_t>();
          const auto* hg = t[1].const_data_ptr<scalar_t>();
          const auto* h = t[2].const_data_ptr<scalar_t>();
          const scalar_t* ib = t[3].defined() ? t[3].const_data_ptr<scalar_t>() : nullptr;
          const scalar_t* hb = t[4].defined() ? t[4].const_data_ptr<scalar_t>() : nullptr;
          auto* h_out = t[5].mutable_data_ptr<scalar_t>();
          auto* ws = t[6].mutable_data_ptr<scalar_t>();
          at::parallel_for(0, B * H, kGrain, [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k) {
              const int64_t b = k / H, j = k % H, row = b * 3 * H;
              auto in_part = [&](int q) { return acc_t(ig[row + q * H + j]) + (ib ? acc_t(ib[q * H + j]) : acc_t(0)); };
              auto hid_part = [&](int q) { return acc_t(hg[row + q * H + j]) + (hb ? acc_t(hb[q * H + j]) : acc_t(0)); };
              const acc_t r = sigmoid(in_part(0) + hid_part(0));
              const acc_t z = sigmoid(in_part(1) + hid_part(1));
              const acc_t hn = hid_part(2);
              const acc_t n = std::tanh(in_part(2) + r * hn);
              const acc_t h_prev = h[k];
              h_out[k] = scalar_t((acc_t(1) - z) * n + z * h_prev);
              scalar_t* w = ws + b * 5 * H + j;
              w[0] = scalar_t(r);
              w[H] = scalar_t(z);
              w[2 * H] = scalar_t(n);
              w[3 * H] = scalar_t(h_prev);
              w[4 * H] = scalar_t(hn);
            }
          });
        });
      });
  return {hy, workspace};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gru_cell_backward(const Tensor& grad_hy, const Tensor& workspace,
                                                                     bool has_bias) {
  constexpr const char* op = "_thnn_fused_gru_cell_backward";
  const auto device = npu_device(op, {{"grad_hy", grad_hy}, {"workspace", workspace}});
  check_float(op, "workspace", workspace, 2);
  const int64_t B = workspace.size(0), H = workspace.size(1) / 5;
  TORCH_CHECK(workspace.size(1) == 5 * H && grad_hy.sizes().equals({B, H}), op,
              ": expected grad_hy of shape [B, H] and workspace of shape [B, 5H], got ", grad_hy.sizes(), " and ",
              workspace.sizes());
  check_dtype(op, "grad_hy", grad_hy, workspace.scalar_type());
  Tensor grad_input_gates = at::empty({B, 3 * H}, workspace.options());
  Tensor grad_hidden_gates = at::empty({B, 3 * H}, workspace.options());
  Tensor grad_hx = at::empty({B, H}, grad_hy.options());
  ops::launch_kernel(
      op, device, {dense(grad_hy), dense(workspace), grad_input_gates, grad_hidden_gates, grad_hx}, B * 5 * H,
      [B, H](const std::vector<Tensor>& t) {
        NPU_DISPATCH_FLOAT(t[1].scalar_type(), "_thnn_fused_gru_cell_backward", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const auto* gh = t[0].const_data_ptr<scalar_t>();
          const auto* ws = t[1].const_data_ptr<scalar_t>();
          auto* gi = t[2].mutable_data_ptr<scalar_t>();
          auto* ghid = t[3].mutable_data_ptr<scalar_t>();
          auto* ghx = t[4].mutable_data_ptr<scalar_t>();
          at::parallel_for(0, B * H, kGrain, [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k) {
              const int64_t b = k / H, j = k % H, row = b * 3 * H;
              const scalar_t* w = ws + b * 5 * H + j;
              const acc_t r = w[0], z = w[H], n = w[2 * H], h_prev = w[3 * H], hn = w[4 * H];
              const acc_t dh = gh[k];
              const acc_t dn = dh * (acc_t(1) - z) * (acc_t(1) - n * n);
              const acc_t dz = dh * (h_prev - n) * z * (acc_t(1) - z);
              const acc_t dr = dn * hn * r * (acc_t(1) - r);
              gi[row + j] = scalar_t(dr);
              gi[row + H + j] = scalar_t(dz);
              gi[row + 2 * H + j] = scalar_t(dn);
              ghid[row + j] = scalar_t(dr);
              ghid[row + H + j] = scalar_t(dz);
              ghid[row + 2 * H + j] = scalar_t(dn * r);
              ghx[k] = scalar_t(dh * z);
            }
          });
        });
      });
  Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : Tensor();
  Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
}

}  // namespace torch_npu::custom_ops
