// Mixture-of-experts routing: npu_moe_gating_top_k_softmax, npu_moe_init_routing,
// npu_grouped_matmul (the non-quantised forms).
#include <ATen/Parallel.h>
#include <ATen/core/stack.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/silu.h>
#include <torch/library.h>

#include <numeric>

#include "fused.h"
#include "vmath.h"

namespace torch_npu::custom_ops {
namespace {

// softmax over the experts of each row, then the k largest (ties: the lower expert
// first). Rows marked finished get expert index E (no expert), as torch_npu marks them.
std::tuple<Tensor, Tensor, Tensor> npu_moe_gating_top_k_softmax(const Tensor& x, const std::optional<Tensor>& finished,
                                                                int64_t k) {
  constexpr const char* op = "npu_moe_gating_top_k_softmax";
  const Tensor fin = finished.value_or(Tensor());
  const auto device = npu_device(op, {{"x", x}, {"finished", fin}});
  check_float(op, "x", x);
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, op, ": expected x to be 2- or 3-dimensional, got shape ", x.sizes());
  const int64_t experts = x.size(-1);
  TORCH_CHECK(k > 0 && k <= experts && k <= 1024, op, ": expected 0 < k <= min(x.size(-1), 1024) = ",
              std::min<int64_t>(experts, 1024), ", got k=", k);
  if (fin.defined()) {
    check_dtype(op, "finished", fin, at::kBool);
    TORCH_CHECK(fin.sizes().equals(x.sizes().slice(0, x.dim() - 1)), op, ": expected finished of shape ",
                x.sizes().slice(0, x.dim() - 1), ", got ", fin.sizes());
  }
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = k;
  Tensor y = at::empty(out_sizes, x.options());
  Tensor expert_idx = at::empty(out_sizes, x.options().dtype(at::kInt));
  Tensor row_idx = at::empty(out_sizes, x.options().dtype(at::kInt));
  const int64_t rows = x.numel() / std::max<int64_t>(experts, 1);
  ops::launch_kernel(op, device, {dense(x), dense(fin), y, expert_idx, row_idx}, x.numel(),
                     [rows, experts, k](const std::vector<Tensor>& t) {
                       NPU_DISPATCH_FLOAT(t[0].scalar_type(), op, [&] {
                         using A = vmath::acc_t<scalar_t>;
                         const auto* x = t[0].const_data_ptr<scalar_t>();
                         const bool* fin = t[1].defined() ? t[1].const_data_ptr<bool>() : nullptr;
                         auto* y = t[2].mutable_data_ptr<scalar_t>();
                         auto* ei = t[3].mutable_data_ptr<int32_t>();
                         auto* ri = t[4].mutable_data_ptr<int32_t>();
                         at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / experts), [&](int64_t b, int64_t e) {
                           std::vector<A> p(experts);
                           std::vector<int32_t> order(experts);
                           for (int64_t r = b; r < e; ++r) {
                             const scalar_t* xr = x + r * experts;
                             A m = -INFINITY;
                             for (int64_t j = 0; j < experts; ++j) m = std::max(m, A(xr[j]));
                             A sum = 0;
                             for (int64_t j = 0; j < experts; ++j) sum += (p[j] = vmath::exp(A(xr[j]) - m));
                             std::iota(order.begin(), order.end(), 0);
                             std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                               [&](int32_t a, int32_t c) { return p[a] > p[c] || (p[a] == p[c] && a < c); });
                             const bool done = fin && fin[r];
                             for (int64_t j = 0; j < k; ++j) {
                               y[r * k + j] = static_cast<scalar_t>(p[order[j]] / sum);
                               ei[r * k + j] = done ? static_cast<int32_t>(experts) : order[j];
                               ri[r * k + j] = static_cast<int32_t>(j * rows + r);
                             }
                           }
                         });
                       });
                     });
  return {y, expert_idx, row_idx};
}

// Sorts the (row, expert) assignments by expert (stable) and gathers the token rows in
// that order: expanded_x[i] = x[sorted_row[i] % N], expanded_row_idx[sorted_row[i]] = i.
std::tuple<Tensor, Tensor, Tensor> npu_moe_init_routing(const Tensor& x, const Tensor& row_idx,
                                                        const Tensor& expert_idx, int64_t active_num) {
  constexpr const char* op = "npu_moe_init_routing";
  const auto device = npu_device(op, {{"x", x}, {"row_idx", row_idx}, {"expert_idx", expert_idx}});
  check_float(op, "x", x, 2);
  check_dtype(op, "expert_idx", expert_idx, at::kInt);
  check_dtype(op, "row_idx", row_idx, at::kInt);
  TORCH_CHECK(expert_idx.dim() == 2 && expert_idx.size(0) == x.size(0), op,
              ": expected expert_idx of shape [", x.size(0), ", K] (one row per row of x), got ", expert_idx.sizes());
  TORCH_CHECK(row_idx.sizes().equals(expert_idx.sizes()), op, ": expected row_idx to have expert_idx's shape ",
              expert_idx.sizes(), ", got ", row_idx.sizes());
  TORCH_CHECK(active_num >= 0, op, ": expected active_num >= 0, got ", active_num);
  const int64_t n = x.size(0), h = x.size(1), k = expert_idx.size(1);
  const int64_t active = std::min(active_num, n) * k;
  Tensor expanded_x = at::empty({active, h}, x.options());
  Tensor expanded_row_idx = at::empty({n * k}, row_idx.options());
  Tensor expanded_expert_idx = at::empty({n * k}, expert_idx.options());
  ops::launch_kernel(op, device, {dense(x), dense(row_idx), dense(expert_idx), expanded_x, expanded_row_idx,
                                  expanded_expert_idx},
                     x.numel(), [n, h, k, active](const std::vector<Tensor>& t) {
                       const int32_t* rows = t[1].const_data_ptr<int32_t>();
                       const int32_t* experts = t[2].const_data_ptr<int32_t>();
                       int32_t* exp_row = t[4].mutable_data_ptr<int32_t>();
                       int32_t* exp_expert = t[5].mutable_data_ptr<int32_t>();
                       const int64_t total = n * k;
                       std::vector<int64_t> order(total);
                       std::iota(order.begin(), order.end(), 0);
                       std::stable_sort(order.begin(), order.end(),
                                        [&](int64_t a, int64_t b) { return experts[a] < experts[b]; });
                       std::vector<int32_t> sorted_row(total);
                       for (int64_t i = 0; i < total; ++i) {
                         const int32_t src = rows[order[i]];
                         TORCH_CHECK(src >= 0 && src < total, "npu_moe_init_routing: row_idx holds ", src,
                                     ", outside [0, ", total, ")");
                         sorted_row[i] = src;
                         exp_expert[i] = experts[order[i]];
                         exp_row[src] = static_cast<int32_t>(i);
                       }
                       const auto elem = t[0].element_size();
                       const char* x = static_cast<const char*>(t[0].const_data_ptr());
                       char* out = static_cast<char*>(t[3].mutable_data_ptr());
                       at::parallel_for(0, active, std::max<int64_t>(1, 16384 / std::max<int64_t>(h, 1)),
                                        [&](int64_t b, int64_t e) {
                                          for (int64_t i = b; i < e; ++i) {
                                            std::memcpy(out + i * h * elem, x + (sorted_row[i] % n) * h * elem, h * elem);
                                          }
                                        });
                     });
  return {expanded_x, expanded_row_idx, expanded_expert_idx};
}

// ---- npu_grouped_matmul ------------------------------------------------------------------------
//
// y_i = act(x_i @ w_i + b_i). Either one x per group, or one x split along its rows by
// group_list (group_type 0). split_item 0/1 return one tensor per group, 2/3 one tensor
// (the groups' rows concatenated). The schema is long (quantisation arguments), so the
// kernel reads its arguments from the stack by name.

enum class Act { kNone = 0, kRelu = 1, kGeluTanh = 2, kFastGelu = 4, kSilu = 5 };

Tensor activate(const Tensor& y, int64_t act) {
  switch (act) {
    case 0:
      return y;
    case 1:
      return at::relu(y);
    case 2:
      return at::gelu(y, "tanh");
    case 4:
      return at::mul(y, at::sigmoid(at::mul(y, 1.702)));
    case 5:
      return at::silu(y);
    default:
      TORCH_CHECK(false, "npu_grouped_matmul: act_type ", act, " reached the kernel unchecked");
  }
}

struct GroupedMatmulArgs {
  std::vector<Tensor> x, weight, bias;
  bool split_x = false;              // one x, split along its rows by group_list
  std::vector<int64_t> group_list;   // given as int[] (or read from the tensor on the host)
  Tensor group_list_tensor;          // given as a tensor: read by the kernel when it can be
  int64_t group_list_type = 0;       // 0: cumulative row counts, 1: row counts
  int64_t split_item = 0;
  int64_t act_type = 0;
  bool split_k = false;              // group_type 2: x's columns and weight's rows split by group_list
};

// Row counts per group from group_list values; what is wrong is an error naming it.
std::vector<int64_t> group_sizes(c10::ArrayRef<int64_t> values, int64_t list_type, int64_t x_rows) {
  constexpr const char* op = "npu_grouped_matmul";
  std::vector<int64_t> sizes;
  int64_t prev = 0;
  for (int64_t v : values) {
    const int64_t size = list_type == 0 ? v - prev : v;
    TORCH_CHECK(size >= 0, op, ": group_list must be ", list_type == 0 ? "non-decreasing" : "non-negative",
                ", got ", values);
    sizes.push_back(size);
    prev += size;
  }
  TORCH_CHECK(prev == x_rows, op, ": group_list covers ", prev, " rows, but x has ", x_rows);
  return sizes;
}

std::vector<Tensor> tensor_list(const c10::IValue& v) {
  if (v.isNone()) return {};
  return v.toTensorVector();
}

// group_type 2 (the K dimension split, as MoE's weight gradients use it): one x [M, K] and one
// weight [K, N] (or one per group, [K_i, N]); group i multiplies x's columns and the weight's rows
// of its range of K. The ranges come from group_list (read on the host); each group becomes a
// pair of views, and split_item 2/3's single output is the groups' [G, M, N] stack.
GroupedMatmulArgs split_k_args(const char* op, GroupedMatmulArgs a, const c10::IValue& gl, int64_t list_type) {
  TORCH_CHECK(!gl.isNone(), op, ": group_type 2 (K split) needs group_list");
  TORCH_CHECK(a.x.size() == 1 && a.x[0].dim() == 2, op, ": group_type 2 expects one 2-D x [M, K], got ", a.x.size(),
              " tensor(s)", a.x.empty() ? "" : " of shape ", a.x.empty() ? c10::IntArrayRef() : a.x[0].sizes());
  TORCH_CHECK(a.bias.empty(), op, ": group_type 2 (K split) takes no bias");
  TORCH_CHECK(list_type == 0 || list_type == 1, op, ": expected group_list_type 0 (cumulative) or 1 (sizes), got ",
              list_type);
  std::vector<int64_t> values;
  if (gl.isTensor()) {
    const Tensor host = gl.toTensor().to(at::kCPU, at::kLong);
    values.assign(host.const_data_ptr<int64_t>(), host.const_data_ptr<int64_t>() + host.numel());
  } else {
    values = gl.toIntVector();
  }
  const Tensor x = a.x[0];
  const std::vector<int64_t> sizes = group_sizes(values, list_type, x.size(1));
  std::vector<Tensor> weights = a.weight;
  if (weights.size() == 1 && sizes.size() > 1) {
    TORCH_CHECK(weights[0].dim() == 2 && weights[0].size(0) == x.size(1), op,
                ": group_type 2 expects weight [K, N] with x's K = ", x.size(1), ", got ", weights[0].sizes());
    weights = weights[0].split_with_sizes(sizes, 0);
  }
  TORCH_CHECK(weights.size() == sizes.size(), op, ": expected group_list to have one entry per weight (",
              weights.size(), "), got ", sizes.size());
  a.x.clear();
  int64_t k = 0;
  for (int64_t size : sizes) {
    a.x.push_back(x.narrow(1, k, size));
    k += size;
  }
  a.weight = weights;
  a.split_k = true;
  for (size_t i = 0; i < weights.size(); ++i) {
    TORCH_CHECK(weights[i].dim() == 2 && weights[i].size(0) == sizes[i], op, ": expected weight[", i, "] [",
                sizes[i], ", N] for its K range, got ", weights[i].sizes());
    TORCH_CHECK(weights[i].scalar_type() == x.scalar_type(), op, ": expected weight[", i, "] to have x's dtype ",
                x.scalar_type(), ", got ", weights[i].scalar_type());
  }
  return a;
}

GroupedMatmulArgs parse_grouped_matmul(const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                                       size_t begin) {
  constexpr const char* op = "npu_grouped_matmul";
  auto arg = [&](const char* name) -> const c10::IValue& {
    return stack[begin + *schema.argumentIndexWithName(name)];
  };
  GroupedMatmulArgs a;
  a.x = tensor_list(arg("x"));
  a.weight = tensor_list(arg("weight"));
  a.bias = tensor_list(arg("bias"));
  for (const char* quant : {"scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale",
                            "activation_input", "activation_quant_scale", "activation_quant_offset"}) {
    TORCH_CHECK(arg(quant).isNone(), op, ": ", quant, " (quantised grouped matmul) is not supported by the NPU "
                "simulator; pass None");
  }
  const c10::IValue& out_dtype = arg("output_dtype");
  TORCH_CHECK(out_dtype.isNone() || (schema.overload_name() == "List" && a.x[0].defined() &&
                                     out_dtype.toScalarType() == a.x[0].scalar_type()),
              op, ": output_dtype other than x's dtype (quantised grouped matmul) is not supported by the NPU "
              "simulator; pass None");
  a.split_item = arg("split_item").isNone() ? 0 : arg("split_item").toInt();
  a.act_type = arg("act_type").isNone() ? 0 : arg("act_type").toInt();
  TORCH_CHECK(a.split_item >= 0 && a.split_item <= 3, op, ": expected split_item in 0..3, got ", a.split_item);
  TORCH_CHECK(a.act_type >= 0 && a.act_type <= 5 && a.act_type != 3, op,
              ": expected act_type 0 (none), 1 (relu), 2 (gelu_tanh), 4 (fast_gelu) or 5 (silu), got ", a.act_type);
  TORCH_CHECK(!a.x.empty() && !a.weight.empty(), op, ": expected non-empty x and weight lists");
  const c10::IValue& gl = arg("group_list");
  // As torch_npu: the tensor overload needs group_type (-1: no grouping, 0: x's rows split by
  // group_list, 2: the K dimension split, x's columns and the weight's rows).
  TORCH_CHECK(schema.overload_name() == "List" || !arg("group_type").isNone(), op,
              ": Requires manual passing group_type, current is None.");
  const int64_t group_type = arg("group_type").isNone() ? -1 : arg("group_type").toInt();
  TORCH_CHECK(group_type == -1 || group_type == 0 || group_type == 2, op,
              ": The group type must be -1, 0 or 2, but now is [", group_type, "]");
  const int64_t list_type = arg("group_list_type").isNone() ? 0 : arg("group_list_type").toInt();
  if (group_type == 2) return split_k_args(op, std::move(a), gl, list_type);

  // One weight per group, or one [g, K, N] tensor (and then one [g, N] bias).
  if (a.weight.size() == 1 && a.weight[0].dim() == 3) a.weight = a.weight[0].unbind(0);
  const size_t groups = a.weight.size();
  if (groups > 1 && a.bias.size() == 1 && a.bias[0].dim() == 2 && a.bias[0].size(0) == static_cast<int64_t>(groups)) {
    a.bias = a.bias[0].unbind(0);
  }
  if (!gl.isNone()) {
    TORCH_CHECK(a.x.size() == 1, op, ": with group_list, expected one x tensor (split along its rows), got ",
                a.x.size());
    if (gl.isTensor()) {
      a.group_list_tensor = gl.toTensor();
      const Tensor& g = a.group_list_tensor;
      TORCH_CHECK(g.dim() == 1 && g.scalar_type() == at::kLong, op,
                  ": expected group_list to be a 1-D int64 tensor, got ", g.scalar_type(), " of shape ", g.sizes());
      TORCH_CHECK(g.size(0) == static_cast<int64_t>(groups), op, ": expected group_list to have one entry per weight (",
                  groups, "), got ", g.size(0));
    } else {
      a.group_list = gl.toIntVector();
      TORCH_CHECK(a.group_list.size() == groups, op, ": expected group_list to have one entry per weight (", groups,
                  "), got ", a.group_list.size());
      group_sizes(a.group_list, 0, a.x[0].size(0));  // validates
    }
    TORCH_CHECK(list_type == 0 || list_type == 1, op, ": expected group_list_type 0 (cumulative) or 1 (sizes), got ",
                list_type);
    a.group_list_type = gl.isTensor() ? list_type : 0;
    a.split_x = true;
  } else {
    TORCH_CHECK(a.x.size() == groups, op, ": expected as many x tensors as weights (", groups, "), got ", a.x.size());
  }
  TORCH_CHECK(a.bias.empty() || a.bias.size() == groups, op, ": expected one bias per weight (", groups, "), got ",
              a.bias.size());
  const Tensor& x0 = a.x[0];
  for (size_t i = 0; i < groups; ++i) {
    const Tensor& w = a.weight[i];
    const Tensor& xi = a.split_x ? x0 : a.x[i];
    TORCH_CHECK(w.dim() == 2, op, ": expected weight[", i, "] to be 2-dimensional [K, N], got ", w.sizes());
    TORCH_CHECK(xi.size(-1) == w.size(0), op, ": x[", a.split_x ? 0 : i, "] (shape ", xi.sizes(),
                ") and weight[", i, "] (shape ", w.sizes(), ") cannot be multiplied");
    TORCH_CHECK(xi.scalar_type() == w.scalar_type(), op, ": expected weight[", i, "] to have x's dtype ",
                xi.scalar_type(), ", got ", w.scalar_type());
    if (!a.bias.empty()) {
      TORCH_CHECK(a.bias[i].dim() == 1 && a.bias[i].size(0) == w.size(1), op, ": expected bias[", i, "] of shape [",
                  w.size(1), "], got ", a.bias[i].sizes());
    }
  }
  return a;
}

void npu_grouped_matmul(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
  constexpr const char* op = "npu_grouped_matmul";
  const auto& schema = handle.schema();
  const size_t begin = stack->size() - schema.arguments().size();
  GroupedMatmulArgs a = parse_grouped_matmul(schema, *stack, begin);
  torch::jit::drop(*stack, schema.arguments().size());

  const size_t groups = a.weight.size();
  std::vector<Tensor> all = a.x;
  all.insert(all.end(), a.weight.begin(), a.weight.end());
  all.insert(all.end(), a.bias.begin(), a.bias.end());
  const c10::DeviceIndex device = npu_device(op, {{"x[0]", a.x[0]}});
  for (const auto& t : all) {
    TORCH_CHECK(t.device() == a.x[0].device(), op, ": expected x, weight and bias on ", a.x[0].device(),
                ", found a tensor on ", t.device());
  }
  check_float(op, "x", a.x[0]);
  const bool stack_groups = a.split_k && a.split_item >= 2;  // K split: the groups' [G, M, N]
  const bool single = a.split_item >= 2 && !a.split_k;
  // Rows per group. A tensor group_list is read by the kernel when the output shapes do
  // not depend on it (one output tensor), so the call does not wait for the device.
  std::vector<int64_t> rows(groups, -1);
  const bool rows_in_kernel = a.split_x && single && a.group_list_tensor.defined();
  if (a.split_x && !rows_in_kernel) {
    std::vector<int64_t> values = a.group_list;
    if (a.group_list_tensor.defined()) {
      const Tensor host = a.group_list_tensor.cpu();
      values.assign(host.const_data_ptr<int64_t>(), host.const_data_ptr<int64_t>() + host.numel());
    }
    rows = group_sizes(values, a.group_list_type, a.x[0].size(0));
  } else if (!a.split_x) {
    for (size_t i = 0; i < groups; ++i) {  // a K-split group may have K = 0 (its output is zeros)
      rows[i] = a.split_k ? a.x[i].size(0) : a.x[i].numel() / std::max<int64_t>(a.x[i].size(-1), 1);
    }
  }
  std::vector<Tensor> outs;
  if (single) {
    const int64_t n = a.weight[0].size(1);
    for (const auto& w : a.weight) {
      TORCH_CHECK(w.size(1) == n, op, ": split_item ", a.split_item, " returns one tensor, so every weight needs ",
                  n, " columns; got ", w.sizes());
    }
    const int64_t total = a.split_x ? a.x[0].size(0) : std::accumulate(rows.begin(), rows.end(), int64_t{0});
    outs.push_back(at::empty({total, n}, a.x[0].options()));
  } else {
    for (size_t i = 0; i < groups; ++i) {
      std::vector<int64_t> shape = a.split_x ? std::vector<int64_t>{rows[i], 0} : a.x[i].sizes().vec();
      shape.back() = a.weight[i].size(1);
      outs.push_back(at::empty(shape, a.x[0].options()));
    }
  }
  std::vector<Tensor> args;
  for (const auto& t : all) args.push_back(dense(t));
  const size_t first_out = args.size();
  args.insert(args.end(), outs.begin(), outs.end());
  args.push_back(rows_in_kernel ? dense(a.group_list_tensor) : Tensor());
  int64_t work = 0;
  for (const auto& o : outs) work += o.numel();
  const bool has_bias = !a.bias.empty();
  const bool split_x = a.split_x;
  const size_t num_x = a.x.size();
  const int64_t act = a.act_type, list_type = a.group_list_type;
  ops::launch_kernel(op, device, std::move(args), work * 64, [=](const std::vector<Tensor>& t) {
    std::vector<int64_t> sizes = rows;
    if (t.back().defined()) {
      const int64_t* v = t.back().const_data_ptr<int64_t>();
      sizes = group_sizes(c10::ArrayRef<int64_t>(v, groups), list_type, t[0].size(0));
    }
    int64_t row = 0;
    for (size_t i = 0; i < groups; ++i) {
      Tensor xi = split_x ? t[0].narrow(0, row, sizes[i]) : t[i].reshape({sizes[i], t[i].size(-1)});
      const Tensor& w = t[num_x + i];
      Tensor out = single ? t[first_out].narrow(0, row, sizes[i]) : t[first_out + i].view({sizes[i], w.size(1)});
      row += sizes[i];
      if (sizes[i] == 0) continue;
      if (has_bias) {
        at::addmm_out(out, t[num_x + groups + i], xi, w);
      } else {
        at::mm_out(out, xi, w);
      }
      if (act != 0) out.copy_(activate(out, act));
    }
  });
  std::vector<Tensor> result = stack_groups ? std::vector<Tensor>{at::stack(outs)} : outs;
  torch::jit::push(*stack, c10::IValue(std::move(result)));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)");
  m.def("npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) -> (Tensor, Tensor, Tensor)");
  m.def(
      "npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, "
      "Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, "
      "Tensor[]? per_token_scale=None, Tensor? group_list=None, Tensor[]? activation_input=None, "
      "Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, "
      "int? group_type=None, int? group_list_type=0, int? act_type=0, int[]? tuning_config=None, "
      "int? output_dtype=None, int? x_dtype=None, int? weight_dtype=None, int? scale_dtype=None, "
      "int? per_token_scale_dtype=None) -> Tensor[]");
  m.def(
      "npu_grouped_matmul.List(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, "
      "Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, "
      "Tensor[]? per_token_scale=None, int[]? group_list=None, Tensor[]? activation_input=None, "
      "Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, "
      "int? group_type=None, int? group_list_type=0, int? act_type=0, ScalarType? output_dtype=None) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_moe_gating_top_k_softmax", TORCH_FN(npu_moe_gating_top_k_softmax));
  m.impl("npu_moe_init_routing", TORCH_FN(npu_moe_init_routing));
  m.impl("npu_grouped_matmul", torch::CppFunction::makeFromBoxedFunction<&npu_grouped_matmul>());
  m.impl("npu_grouped_matmul.List", torch::CppFunction::makeFromBoxedFunction<&npu_grouped_matmul>());
}

}  // namespace torch_npu::custom_ops
