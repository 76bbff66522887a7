// The batch-norm pieces torch.nn.SyncBatchNorm calls between its all-gathers and
// all-reduces (CUDA-only kernels in PyTorch): per-rank statistics, their combination by
// element counts, the normalisation and the two halves of the backward. Statistics are
// [C] tensors in float (double for double input), reductions run over every dimension
// but the channel one (1), and each piece is a few ATen ops on npu tensors.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/var_mean.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace torch_npu::ops {
namespace {

using at::Tensor;

at::ScalarType stats_dtype(const Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void check_input(const char* op, const Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected input of shape [N, C, ...], got ", input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op, ": expected a floating-point input, got ",
              input.scalar_type());
}

// Every dimension but the channel one.
std::vector<int64_t> reduce_dims(const Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A [C] tensor viewed to broadcast against [N, C, ...].
Tensor per_channel(const Tensor& t, const Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = t.numel();
  return t.view(shape);
}

void check_channels(const char* op, const char* name, const Tensor& t, int64_t C) {
  TORCH_CHECK(t.defined() && t.numel() == C, op, ": expected ", name, " with ", C, " elements (one per channel), got ",
              t.defined() ? t.sizes() : c10::IntArrayRef{});
}

std::tuple<Tensor, Tensor> batch_norm_stats(const Tensor& input, double eps) {
  check_input("batch_norm_stats", input);
  auto [var, mean] = at::var_mean(input.to(stats_dtype(input)), reduce_dims(input), std::optional<at::Scalar>(0), false);
  return {mean, var.add(eps).rsqrt()};
}

std::tuple<Tensor, Tensor> batch_norm_gather_stats_with_counts(const Tensor& input, const Tensor& mean,
                                                               const Tensor& invstd,
                                                               const std::optional<Tensor>& running_mean,
                                                               const std::optional<Tensor>& running_var,
                                                               double momentum, double eps, const Tensor& counts) {
  constexpr const char* op = "batch_norm_gather_stats_with_counts";
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes().equals(mean.sizes()), op,
              ": expected mean and invstd of shape [world_size, C], got ", mean.sizes(), " and ", invstd.sizes());
  TORCH_CHECK(counts.numel() == mean.size(0), op, ": expected counts with one element per rank (", mean.size(0),
              "), got ", counts.sizes());
  const Tensor n = counts.to(mean.scalar_type()).view({-1, 1});
  const Tensor total = n.sum();
  const Tensor mean_all = mean.mul(n).sum(0).div(total);
  // Each rank's biased variance, then the pooled one: within-rank plus between-rank spread.
  const Tensor var_rank = invstd.pow(-2).sub(eps);
  const Tensor var_all = var_rank.add(mean.sub(mean_all).pow(2)).mul(n).sum(0).div(total);
  if (running_mean.has_value() && running_mean->defined()) {
    check_channels(op, "running_mean", *running_mean, mean.size(1));
    running_mean->mul_(1 - momentum).add_(mean_all.to(running_mean->scalar_type()).mul(momentum));
  }
  if (running_var.has_value() && running_var->defined()) {
    check_channels(op, "running_var", *running_var, mean.size(1));
    const Tensor unbiased = var_all.mul(total).div(total.sub(1));
    running_var->mul_(1 - momentum).add_(unbiased.to(running_var->scalar_type()).mul(momentum));
  }
  return {mean_all, var_all.add(eps).rsqrt()};
}

std::tuple<Tensor, Tensor> batch_norm_gather_stats(const Tensor& input, const Tensor& mean, const Tensor& invstd,
                                                   const std::optional<Tensor>& running_mean,
                                                   const std::optional<Tensor>& running_var, double momentum,
                                                   double eps, int64_t count) {
  const Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

Tensor batch_norm_elemt(const Tensor& input, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                        const Tensor& mean, const Tensor& invstd, double /*eps*/) {
  constexpr const char* op = "batch_norm_elemt";
  check_input(op, input);
  const int64_t C = input.size(1);
  check_channels(op, "mean", mean, C);
  check_channels(op, "invstd", invstd, C);
  Tensor y = input.to(stats_dtype(input)).sub(per_channel(mean, input)).mul(per_channel(invstd, input));
  if (weight.has_value() && weight->defined()) {
    check_channels(op, "weight", *weight, C);
    y = y.mul(per_channel(*weight, input));
  }
  if (bias.has_value() && bias->defined()) {
    check_channels(op, "bias", *bias, C);
    y = y.add(per_channel(*bias, input));
  }
  return y.to(input.scalar_type());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input,
                                                                      const Tensor& mean, const Tensor& invstd,
                                                                      const std::optional<Tensor>& weight,
                                                                      bool input_g, bool weight_g, bool bias_g) {
  constexpr const char* op = "batch_norm_backward_reduce";
  check_input(op, input);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()), op, ": expected grad_out of shape ", input.sizes(), ", got ",
              grad_out.sizes());
  const int64_t C = input.size(1);
  check_channels(op, "mean", mean, C);
  check_channels(op, "invstd", invstd, C);
  const auto dims = reduce_dims(input);
  const Tensor dy = grad_out.to(stats_dtype(input));
  const Tensor sum_dy = dy.sum(dims);
  const Tensor sum_dy_xmu = dy.mul(input.to(stats_dtype(input)).sub(per_channel(mean, input))).sum(dims);
  const bool has_weight = weight.has_value() && weight->defined();
  const auto param_dtype = has_weight ? weight->scalar_type() : input.scalar_type();
  Tensor grad_weight = weight_g ? sum_dy_xmu.mul(invstd).to(param_dtype) : Tensor();
  Tensor grad_bias = bias_g ? sum_dy.to(param_dtype) : Tensor();
  if (!input_g) return {Tensor(), Tensor(), grad_weight, grad_bias};
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

Tensor batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                 const Tensor& invstd, const std::optional<Tensor>& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count) {
  constexpr const char* op = "batch_norm_backward_elemt";
  check_input(op, input);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()), op, ": expected grad_out of shape ", input.sizes(), ", got ",
              grad_out.sizes());
  const int64_t C = input.size(1);
  for (const auto& [name, t] : {std::pair{"mean", mean}, std::pair{"invstd", invstd}, std::pair{"sum_dy", sum_dy},
                                std::pair{"sum_dy_xmu", sum_dy_xmu}}) {
    check_channels(op, name, t, C);
  }
  // count: the element count of every rank; the statistics cover all of them.
  const Tensor total = count.to(stats_dtype(input)).sum();
  const Tensor mean_dy = per_channel(sum_dy.div(total), input);
  const Tensor mean_dy_xmu = per_channel(sum_dy_xmu.div(total), input);
  const Tensor inv = per_channel(invstd, input);
  const Tensor xmu = input.to(stats_dtype(input)).sub(per_channel(mean, input));
  Tensor dx = grad_out.to(stats_dtype(input)).sub(mean_dy).sub(xmu.mul(inv.pow(2)).mul(mean_dy_xmu)).mul(inv);
  if (weight.has_value() && weight->defined()) {
    check_channels(op, "weight", *weight, C);
    dx = dx.mul(per_channel(*weight, input));
  }
  return dx.to(input.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", TORCH_FN(batch_norm_stats));
  m.impl("batch_norm_gather_stats", TORCH_FN(batch_norm_gather_stats));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN(batch_norm_gather_stats_with_counts));
  m.impl("batch_norm_elemt", TORCH_FN(batch_norm_elemt));
  m.impl("batch_norm_backward_reduce", TORCH_FN(batch_norm_backward_reduce));
  m.impl("batch_norm_backward_elemt", TORCH_FN(batch_norm_backward_elemt));
}

}  // namespace torch_npu::ops
