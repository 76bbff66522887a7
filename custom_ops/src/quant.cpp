// Quantised matrix products with op-plugin's schemas:
//   npu_trans_quant_param         float32 scale (+ offset) packed into the int64 the kernels take
//   npu_quant_matmul              int8 x int8 (or int4 x int4, packed eight to an int32) -> int32
//                                 accumulate, dequantised (and requantised to int8), or the int32 sums;
//                                 A8W4: int8 x int4 with scales per group of k (group_sizes)
//   npu_weight_quant_batchmatmul  float x int8 (or int4 in int32) weight, dequantised on the fly (per tensor,
//                                 channel or group), optionally quantised to int8 at the end
//   npu_quant_conv2d              int8 convolution, int32 accumulate, dequantised
// Integer accumulation is exact: int8 products summed in int32 (matmul) or in float64, where
// every such sum is an integer represented exactly (convolution, through ATen's kernel).
// Arguments for formats the simulator lacks (hifloat8, group sizes of the int8 x int8 quantised
// matmul, ...) raise NotImplementedError naming the argument.
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "fused.h"

namespace torch_npu::custom_ops {
namespace {

using OptTensor = std::optional<Tensor>;

const Tensor& get(const OptTensor& t) {
  static const Tensor undefined;
  return t.has_value() ? *t : undefined;
}

void check_none(const char* op, const char* arg, bool given) {
  TORCH_CHECK_NOT_IMPLEMENTED(!given, op, ": argument ", arg, " is not supported by the NPU simulator; pass None");
}

// An `int? *_dtype` argument (a torch.dtype from Python arrives as its ScalarType number).
c10::ScalarType dtype_arg(const char* op, const char* arg, int64_t v, std::initializer_list<c10::ScalarType> allowed) {
  for (auto st : allowed) {
    if (static_cast<int64_t>(st) == v) return st;
  }
  std::string names;
  for (auto st : allowed) names += std::string(names.empty() ? "" : ", ") + c10::toString(st);
  const bool known = v >= 0 && v < static_cast<int64_t>(c10::ScalarType::NumOptions);
  TORCH_CHECK(false, op, ": expected ", arg, " to be one of ", names, ", got ",
              known ? c10::toString(static_cast<c10::ScalarType>(v)) : std::to_string(v));
}

// A 1-D per-channel vector of `n` (or 1, broadcast) entries.
void check_vector(const char* op, const char* arg, const Tensor& t, int64_t n, const char* n_name) {
  TORCH_CHECK(t.dim() == 1 && (t.size(0) == 1 || t.size(0) == n), op, ": expected ", arg, " of shape [1] or [", n_name,
              " = ", n, "], got ", t.sizes());
}

void check_dtype_in(const char* op, const char* arg, const Tensor& t, std::initializer_list<c10::ScalarType> allowed) {
  for (auto st : allowed) {
    if (t.scalar_type() == st) return;
  }
  std::string names;
  for (auto st : allowed) names += std::string(names.empty() ? "" : ", ") + c10::toString(st);
  TORCH_CHECK(false, op, ": expected ", arg, " to have dtype ", names, ", got ", t.scalar_type());
}

// ---- the int64 packing of npu_trans_quant_param ----------------------------------------------
// bits 0-31: the float32 scale truncated to FP19 (its top 19 bits); bit 46: set; bits 37-45:
// the offset rounded and clamped to [-256, 255], as 9-bit two's complement.

constexpr uint64_t kFp19Mask = 0xFFFFE000u;

uint64_t pack_scale(float scale, bool round_fp19) {
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  if (round_fp19 && std::isfinite(scale)) bits += 0x1000u;  // round to nearest before truncating
  return (static_cast<uint64_t>(bits) & kFp19Mask) | (uint64_t{1} << 46);
}

uint64_t pack_offset(uint64_t packed, float offset) {
  const double o = std::isnan(offset) ? 0.0 : std::min(std::max(std::nearbyint(static_cast<double>(offset)), -256.0), 255.0);
  const auto v = static_cast<uint64_t>(static_cast<int64_t>(o)) & 0x1FFu;
  return (packed & 0x4000FFFFFFFFull) | (v << 37);
}

float unpack_scale(int64_t packed) {
  const auto bits = static_cast<uint32_t>(static_cast<uint64_t>(packed) & 0xFFFFFFFFu);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float unpack_offset(int64_t packed) {
  const auto v = static_cast<int64_t>((static_cast<uint64_t>(packed) >> 37) & 0x1FFu);
  return static_cast<float>(v >= 256 ? v - 512 : v);
}

Tensor npu_trans_quant_param(const Tensor& scale, const OptTensor& offset_opt, std::optional<int64_t> round_mode) {
  constexpr const char* op = "npu_trans_quant_param";
  const Tensor& offset = get(offset_opt);
  const auto device = npu_device(op, {{"scale", scale}, {"offset", offset}});
  check_dtype(op, "scale", scale, at::kFloat);
  TORCH_CHECK((scale.dim() == 1 || scale.dim() == 2) && scale.numel() > 0, op,
              ": expected scale to be a non-empty 1-D or 2-D tensor, got shape ", scale.sizes());
  const int64_t mode = round_mode.value_or(0);
  TORCH_CHECK(mode == 0 || mode == 1, op, ": expected round_mode 0 (truncate) or 1 (round), got ", mode);
  std::vector<int64_t> shape = scale.sizes().vec();
  if (offset.defined()) {
    check_dtype(op, "offset", offset, at::kFloat);
    TORCH_CHECK((offset.dim() == 1 || offset.dim() == 2) && offset.numel() > 0, op,
                ": expected offset to be a non-empty 1-D or 2-D tensor, got shape ", offset.sizes());
    auto s = at::infer_size_dimvector(scale.sizes(), offset.sizes());
    shape.assign(s.begin(), s.end());
  }
  const Tensor s = scale.expand(shape).contiguous();
  const Tensor o = offset.defined() ? offset.expand(shape).contiguous() : Tensor();
  Tensor out = at::empty(shape, scale.options().dtype(at::kLong));
  ops::launch_kernel(op, device, {s, o, out}, out.numel(), [mode](const std::vector<Tensor>& t) {
    const float* sp = t[0].const_data_ptr<float>();
    const float* op_ = t[1].defined() ? t[1].const_data_ptr<float>() : nullptr;
    auto* y = t[2].mutable_data_ptr<int64_t>();
    for (int64_t i = 0; i < t[2].numel(); ++i) {
      uint64_t p = pack_scale(sp[i], mode == 1);
      if (op_ != nullptr) p = pack_offset(p, op_[i]);
      y[i] = static_cast<int64_t>(p);
    }
  });
  return out;
}

// Per-channel float vectors of a scale (float32, bfloat16, float16 or packed int64) and,
// for packed scales, the offset packed with it.
void decode(const Tensor& t, int64_t n, std::vector<float>& values, std::vector<float>* packed_offset = nullptr) {
  values.assign(n, 0.f);
  if (packed_offset != nullptr) packed_offset->assign(n, 0.f);
  if (!t.defined()) return;
  const bool bcast = t.numel() == 1;
  if (t.scalar_type() == at::kLong) {
    const auto* p = t.const_data_ptr<int64_t>();
    for (int64_t j = 0; j < n; ++j) {
      values[j] = unpack_scale(p[bcast ? 0 : j]);
      if (packed_offset != nullptr) (*packed_offset)[j] = unpack_offset(p[bcast ? 0 : j]);
    }
    return;
  }
  const Tensor f = t.to(at::kFloat).contiguous();
  const float* p = f.const_data_ptr<float>();
  for (int64_t j = 0; j < n; ++j) values[j] = p[bcast ? 0 : j];
}

// Writes float `v` as the output dtype; int8 outputs round to nearest even and saturate.
template <typename T>
inline T narrow(float v) {
  if constexpr (std::is_same_v<T, int8_t>) {
    const float r = std::nearbyint(v);
    return static_cast<int8_t>(std::isnan(r) ? 0.f : std::min(std::max(r, -128.f), 127.f));
  } else {
    return static_cast<T>(v);
  }
}

#define NPU_DISPATCH_QUANT_OUT(TYPE, NAME, ...)                  \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kChar, __VA_ARGS__) \
                                     AT_DISPATCH_CASE_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, __VA_ARGS__))

// ---- npu_quant_matmul -----------------------------------------------------------------------
// out = (x1 @ x2 [+ bias int32]) * scale [* pertoken_scale] [+ bias float] [+ offset (int8 out)];
// an int32 output is the int32 sums (+ bias int32) themselves.

// op-plugin's test of a tensor that is the transpose of a contiguous one in its last two dims.
bool transposed_last_two(const Tensor& t) {
  if (t.dim() < 2 || t.dim() > 6) return false;
  const int64_t d1 = t.dim() - 1, d2 = t.dim() - 2;
  if (t.stride(d2) != 1 || t.stride(d1) != t.size(d2)) return false;
  int64_t span = t.size(d1) * t.size(d2);
  for (int64_t b = t.dim() - 3; b >= 0; --b) {
    if (t.stride(b) != span) return false;
    span *= t.size(b);
  }
  return !(t.size(d1) == 1 && t.size(d2) == 1);
}

// int4 values packed eight to an int32 along the last dimension, the lowest nibble first (as
// Ascend packs them), as int8 values: [..., c] int32 -> [..., 8 c] int8 (on the device).
Tensor unpack_int4(const Tensor& packed) {
  const Tensor bytes = packed.contiguous().view(at::kByte);  // little-endian: nibble 2i is byte i's low half
  const Tensor nibbles = at::stack({bytes.bitwise_and(15), bytes.bitwise_right_shift(4)}, -1).flatten(-2);
  return nibbles.to(at::kChar).bitwise_xor(8).sub(8);  // sign-extend 4 bits
}

// A8W4: int8 x1 [m, k], int4 weights packed eight to an int32 x2 [k, n // 8] (as
// npu_convert_weight_to_int4pack makes them), scales per group of group_sizes[2] rows of k and
// column ([k / group, n], float32 or packed by npu_trans_quant_param), the float32 y_offset
// (`offset`, [n]) and per-token scales x1_scale (`pertoken_scale`, [m] or [m, 1]):
//   out = ((x1 - 8) @ (x2 * x2_scale) + y_offset) * x1_scale
// as op-plugin's reference computes it: int8 x1 taken as two int4 halves, the high one and the low
// one shifted by -8 into int4's range (16 high + (low - 8) = x1 - 8). Sums are exact (float64).
Tensor quant_matmul_a8w4(const char* op, c10::DeviceIndex device, const Tensor& x1, const Tensor& x2,
                         const Tensor& scale, const Tensor& y_offset, const Tensor& pertoken, const Tensor& bias,
                         c10::ScalarType out_type, c10::IntArrayRef group_sizes) {
  TORCH_CHECK(x1.dim() == 2 && x2.dim() == 2, op, ": A8W4 (int8 x1, int32 x2) expects 2-D x1 [m, k] and x2 [k, n // 8], "
              "got ", x1.sizes(), " and ", x2.sizes());
  TORCH_CHECK(group_sizes.size() == 3, op, ": group_sizes only support input with three elements, but got ",
              group_sizes.size());
  for (auto g : group_sizes) {
    TORCH_CHECK(g >= 0 && g <= 65535, op, ": group param value must conform to range [0, 65535], got ", group_sizes);
  }
  TORCH_CHECK(group_sizes[0] <= 1 && group_sizes[1] <= 1, op,
              ": A8W4 takes groups along k only (group_sizes [0, 0, group_k]), got ", group_sizes);
  TORCH_CHECK(x2.is_contiguous(), op, ": an int4 (int32) x2 must be a contiguous [k, n // 8], got strides ",
              x2.strides());
  const int64_t m = x1.size(0), k = x1.size(1), n = x2.size(1) * 8;
  TORCH_CHECK(x2.size(0) == k, op, ": expected x2 of shape [k = ", k, ", n // 8], got ", x2.sizes());
  const int64_t group = group_sizes[2] > 0 ? group_sizes[2] : k;
  TORCH_CHECK(k % group == 0, op, ": group_sizes[2] = ", group, " must divide k = ", k);
  const int64_t groups = k / group;
  check_dtype_in(op, "scale", scale, {at::kFloat, at::kLong});
  TORCH_CHECK(scale.numel() == groups * n && (scale.dim() == 2 ? scale.size(0) == groups && scale.size(1) == n
                                                                : scale.dim() == 1),
              op, ": expected scale of shape [k / group = ", groups, ", n = ", n, "], got ", scale.sizes());
  TORCH_CHECK(!bias.defined(), op, ": A8W4 takes no bias (y_offset is `offset`)");
  TORCH_CHECK(out_type == at::kHalf || out_type == at::kBFloat16, op,
              ": A8W4 needs a float16 or bfloat16 output_dtype, got ", out_type);
  if (y_offset.defined()) {
    check_dtype(op, "offset", y_offset, at::kFloat);
    TORCH_CHECK(y_offset.numel() == n, op, ": expected offset (y_offset) of n = ", n, " values, got ", y_offset.sizes());
  }
  if (pertoken.defined()) {
    check_dtype(op, "pertoken_scale", pertoken, at::kFloat);
    TORCH_CHECK(pertoken.numel() == m && (pertoken.dim() == 1 || (pertoken.dim() == 2 && pertoken.size(1) == 1)), op,
                ": expected pertoken_scale of shape [m = ", m, "] or [m, 1], got ", pertoken.sizes());
  }
  Tensor out = at::empty({m, n}, x1.options().dtype(out_type));
  if (out.numel() == 0) return out;
  ops::launch_kernel(op, device, {dense(x1), x2, dense(scale), dense(y_offset), dense(pertoken), out},
                     m * n * std::max<int64_t>(k, 1) / 8, [=](const std::vector<Tensor>& t) {
                       // Per-group scales as float64 [groups, n] (packed ones: their float32 bits).
                       Tensor s = at::empty({groups, n}, t[0].options().dtype(at::kDouble));
                       auto* sd = s.mutable_data_ptr<double>();
                       if (t[2].scalar_type() == at::kLong) {
                         const auto* p = t[2].const_data_ptr<int64_t>();
                         for (int64_t i = 0; i < groups * n; ++i) sd[i] = unpack_scale(p[i]);
                       } else {
                         const auto* p = t[2].const_data_ptr<float>();
                         for (int64_t i = 0; i < groups * n; ++i) sd[i] = p[i];
                       }
                       const Tensor w = unpack_int4(t[1]).to(at::kDouble).mul_(s.repeat_interleave(group, 0));
                       Tensor y = at::mm(t[0].to(at::kDouble).sub_(8), w);
                       if (t[3].defined()) y.add_(t[3].to(at::kDouble).reshape({1, n}));
                       if (t[4].defined()) y.mul_(t[4].to(at::kDouble).reshape({m, 1}));
                       t[5].copy_(y);
                     });
  return out;
}

Tensor npu_quant_matmul(const Tensor& x1_in, const Tensor& x2_in, const Tensor& scale, const OptTensor& offset_opt,
                        const OptTensor& pertoken_opt, const OptTensor& bias_opt, std::optional<int64_t> output_dtype,
                        std::optional<int64_t> x1_dtype, std::optional<int64_t> x2_dtype,
                        std::optional<int64_t> pertoken_scale_dtype, std::optional<int64_t> scale_dtype,
                        at::OptionalIntArrayRef group_sizes, const OptTensor& y_scale) {
  constexpr const char* op = "npu_quant_matmul";
  const Tensor &offset = get(offset_opt), &pertoken = get(pertoken_opt), &bias = get(bias_opt);
  const auto device = npu_device(op, {{"x1", x1_in}, {"x2", x2_in}, {"scale", scale}, {"offset", offset},
                                      {"pertoken_scale", pertoken}, {"bias", bias}, {"y_scale", get(y_scale)}});
  check_none(op, "x1_dtype", x1_dtype.has_value());
  check_none(op, "x2_dtype", x2_dtype.has_value());
  check_none(op, "pertoken_scale_dtype", pertoken_scale_dtype.has_value());
  check_none(op, "scale_dtype", scale_dtype.has_value());
  check_none(op, "y_scale", y_scale.has_value());
  if (x1_in.scalar_type() == at::kChar && x2_in.scalar_type() == at::kInt) {
    const auto out_type =
        output_dtype.has_value() ? dtype_arg(op, "output_dtype", *output_dtype, {at::kHalf, at::kBFloat16}) : at::kChar;
    return quant_matmul_a8w4(op, device, x1_in, x2_in, scale, offset, pertoken, bias, out_type,
                             group_sizes.value_or(c10::IntArrayRef{0, 0, 0}));
  }
  check_none(op, "group_sizes", group_sizes.has_value());
  TORCH_CHECK(x1_in.dim() >= 2 && x1_in.dim() <= 6 && x2_in.dim() >= 2 && x2_in.dim() <= 6, op,
              ": expected x1 and x2 with 2 to 6 dimensions, got shapes ", x1_in.sizes(), " and ", x2_in.sizes());
  // int4 x int4: x1 [m, k // 8] contiguous, x2 [k, n // 8] contiguous or [k // 8, n] the transpose
  // of a contiguous [n, k // 8]; computed as the int8 products of the unpacked values.
  const bool int4 = x1_in.scalar_type() == at::kInt && x2_in.scalar_type() == at::kInt;
  Tensor x1 = x1_in, x2 = x2_in;
  if (int4) {
    TORCH_CHECK(x1_in.is_contiguous(), op, ": int4 x1 (int32, [m, k // 8]) must be contiguous");
    x1 = unpack_int4(x1_in);
    if (transposed_last_two(x2_in)) {
      x2 = unpack_int4(x2_in.transpose(-2, -1)).transpose(-2, -1);
    } else {
      TORCH_CHECK(x2_in.is_contiguous(), op, ": int4 x2 (int32) must be a contiguous [k, n // 8] or the transpose "
                  "of a contiguous [n, k // 8], got shape ", x2_in.sizes(), " and strides ", x2_in.strides());
      x2 = unpack_int4(x2_in);
    }
  } else {
    check_dtype(op, "x1", x1, at::kChar);
    check_dtype(op, "x2", x2, at::kChar);
  }
  const int64_t m = x1.size(-2), k = x1.size(-1), n = x2.size(-1);
  TORCH_CHECK(x2.size(-2) == k, op, ": expected x2 of shape [..., k, n] with k = x1.size(-1) = ", k, ", got x2 of shape ",
              x2.sizes());
  const auto b1 = x1.sizes().slice(0, x1.dim() - 2), b2 = x2.sizes().slice(0, x2.dim() - 2);
  std::optional<c10::DimVector> bcast;
  try {
    bcast = at::infer_size_dimvector(b1, b2);
  } catch (const c10::Error&) {
  }
  TORCH_CHECK(bcast.has_value(), op, ": the batch dimensions of x1 ", x1.sizes(), " and x2 ", x2.sizes(),
              " do not broadcast");
  const c10::DimVector& batch = *bcast;
  int64_t B = 1;
  for (auto b : batch) B *= b;

  const auto out_type =
      output_dtype.has_value()
          ? dtype_arg(op, "output_dtype", *output_dtype, {at::kChar, at::kHalf, at::kBFloat16, at::kInt})
          : at::kChar;
  const bool int_out = out_type == at::kInt;
  if (int4) {
    TORCH_CHECK(out_type == at::kHalf || out_type == at::kBFloat16, op,
                ": int4 x1/x2 (int32) need a float16 or bfloat16 output_dtype, got ", out_type);
  }
  if (int_out) {
    TORCH_CHECK(!offset.defined() && !pertoken.defined(), op,
                ": an int32 output takes neither offset nor pertoken_scale (it is the int32 sums)");
    TORCH_CHECK(!bias.defined() || bias.scalar_type() == at::kInt, op,
                ": an int32 output takes an int32 bias, got ", bias.scalar_type());
  }
  check_dtype_in(op, "scale", scale, {at::kFloat, at::kBFloat16, at::kLong});
  check_vector(op, "scale", scale, n, "n");
  if (offset.defined()) {
    TORCH_CHECK(out_type == at::kChar, op, ": offset is only used with int8 output (output_dtype None or torch.int8)");
    check_dtype(op, "offset", offset, at::kFloat);
    check_vector(op, "offset", offset, n, "n");
  }
  if (pertoken.defined()) {
    TORCH_CHECK(out_type != at::kChar, op, ": pertoken_scale needs a float16 or bfloat16 output_dtype");
    check_dtype(op, "pertoken_scale", pertoken, at::kFloat);
    TORCH_CHECK(pertoken.dim() == 1 && pertoken.size(0) == m, op, ": expected pertoken_scale of shape [m = ", m,
                "], got ", pertoken.sizes());
  }
  std::vector<int64_t> out_shape(batch.begin(), batch.end());
  out_shape.push_back(m);
  out_shape.push_back(n);
  bool bias_batched = false;
  if (bias.defined()) {
    check_dtype_in(op, "bias", bias, {at::kInt, at::kBFloat16, at::kHalf, at::kFloat});
    bias_batched = bias.dim() == 3;
    TORCH_CHECK((bias.dim() == 1 && bias.size(0) == n) ||
                    (bias_batched && out_shape.size() == 3 && bias.size(0) == B && bias.size(1) == 1 &&
                     bias.size(2) == n),
                op, ": expected bias of shape [n = ", n, "]", out_shape.size() == 3 ? " or [batch, 1, n]" : "",
                ", got ", bias.sizes());
  }
  Tensor out = at::empty(out_shape, x1.options().dtype(out_type));
  if (out.numel() == 0) return out;
  std::vector<int64_t> e1(batch.begin(), batch.end()), e2(e1);
  e1.insert(e1.end(), {m, k});
  e2.insert(e2.end(), {k, n});
  const Tensor a = x1.expand(e1).reshape({B, m, k}).contiguous();
  const Tensor w = x2.expand(e2).reshape({B, k, n}).contiguous();
  ops::launch_kernel(
      op, device, {a, w, scale, offset, pertoken, dense(bias), out}, B * m * n * std::max<int64_t>(k, 1) / 8,
      [=](const std::vector<Tensor>& t) {
        std::vector<float> sc, off, pk_off, pt;
        decode(t[2], n, sc, &pk_off);
        decode(t[3], n, off);
        for (int64_t j = 0; j < n; ++j) off[j] += pk_off[j];
        decode(t[4], m, pt);
        const bool has_pt = t[4].defined();
        const Tensor& bt = t[5];
        const bool int_bias = bt.defined() && bt.scalar_type() == at::kInt;
        const Tensor fbias = bt.defined() && !int_bias ? bt.to(at::kFloat).contiguous() : Tensor();
        const int32_t* ib = int_bias ? bt.const_data_ptr<int32_t>() : nullptr;
        const float* fb = fbias.defined() ? fbias.const_data_ptr<float>() : nullptr;
        const auto* xa = t[0].const_data_ptr<int8_t>();
        const auto* xw = t[1].const_data_ptr<int8_t>();
        // Row bi of x1 @ x2 (+ bias int32) into acc.
        const auto row_sums = [&](int64_t bi, std::vector<int32_t>& acc) {
          const int64_t b = bi / m;
          std::fill(acc.begin(), acc.end(), 0);
          const int8_t* row = xa + bi * k;
          for (int64_t kk = 0; kk < k; ++kk) {
            const int32_t v = row[kk];
            const int8_t* wr = xw + (b * k + kk) * n;
            for (int64_t j = 0; j < n; ++j) acc[j] += v * static_cast<int32_t>(wr[j]);
          }
          const int64_t bias_base = bias_batched ? b * n : 0;
          if (ib != nullptr) {
            for (int64_t j = 0; j < n; ++j) acc[j] += ib[bias_base + j];
          }
        };
        if (int_out) {
          auto* y = t[6].mutable_data_ptr<int32_t>();
          at::parallel_for(0, B * m, 1, [&](int64_t begin, int64_t end) {
            std::vector<int32_t> acc(n);
            for (int64_t bi = begin; bi < end; ++bi) {
              row_sums(bi, acc);
              std::copy(acc.begin(), acc.end(), y + bi * n);
            }
          });
          return;
        }
        NPU_DISPATCH_QUANT_OUT(t[6].scalar_type(), op, [&] {
          auto* y = t[6].mutable_data_ptr<scalar_t>();
          at::parallel_for(0, B * m, 1, [&](int64_t begin, int64_t end) {
            std::vector<int32_t> acc(n);
            for (int64_t bi = begin; bi < end; ++bi) {
              const int64_t b = bi / m, i = bi % m;
              row_sums(bi, acc);
              const int64_t bias_base = bias_batched ? b * n : 0;
              for (int64_t j = 0; j < n; ++j) {
                const int32_t s = acc[j];
                float v = static_cast<float>(s) * sc[j];
                if (has_pt) v *= pt[i];
                if (fb != nullptr) v += fb[bias_base + j];
                v += off[j];
                y[bi * n + j] = narrow<scalar_t>(v);
              }
            }
          });
        });
      });
  return out;
}

// ---- npu_weight_quant_batchmatmul ----------------------------------------------------------
// y = x @ ((weight + antiquant_offset) * antiquant_scale) + bias, then, with quant_scale,
// int8(round(y * quant_scale + quant_offset)). The antiquant parameters are per tensor ([1],
// [1, 1]), per output channel ([n], [1, n]) or per group of antiquant_group_size rows of k
// ([ceil(k / group), n]).

Tensor npu_weight_quant_batchmatmul(const Tensor& x, const Tensor& weight_in, const Tensor& antiquant_scale,
                                    const OptTensor& antiquant_offset_opt, const OptTensor& quant_scale_opt,
                                    const OptTensor& quant_offset_opt, const OptTensor& bias_opt,
                                    int64_t antiquant_group_size, int64_t inner_precise,
                                    std::optional<int64_t> weight_dtype) {
  constexpr const char* op = "npu_weight_quant_batchmatmul";
  const Tensor &aoff = get(antiquant_offset_opt), &qs = get(quant_scale_opt), &qo = get(quant_offset_opt),
               &bias = get(bias_opt);
  const auto device = npu_device(op, {{"x", x}, {"weight", weight_in}, {"antiquant_scale", antiquant_scale},
                                      {"antiquant_offset", aoff}, {"quant_scale", qs}, {"quant_offset", qo},
                                      {"bias", bias}});
  check_none(op, "weight_dtype", weight_dtype.has_value());
  // int4 weights packed eight to an int32 (npu_convert_weight_to_int4pack): [k, n // 8], or the
  // transpose of a contiguous [n, k // 8]; dequantised from their int8 values.
  Tensor weight = weight_in;
  if (weight_in.scalar_type() == at::kInt) {
    TORCH_CHECK(weight_in.dim() == 2, op, ": expected an int4 (int32) weight of 2 dimensions, got ", weight_in.sizes());
    if (transposed_last_two(weight_in)) {
      weight = unpack_int4(weight_in.transpose(-2, -1)).transpose(-2, -1);
    } else {
      TORCH_CHECK(weight_in.is_contiguous(), op, ": an int4 (int32) weight must be a contiguous [k, n // 8] or the "
                  "transpose of a contiguous [n, k // 8], got shape ", weight_in.sizes(), " and strides ",
                  weight_in.strides());
      weight = unpack_int4(weight_in);
    }
  }
  check_float(op, "x", x, 2);
  check_dtype(op, "weight", weight, at::kChar);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == x.size(1), op, ": expected weight of shape [k = ", x.size(1),
              ", n], got ", weight.sizes());
  TORCH_CHECK(inner_precise == 0 || inner_precise == 1, op, ": expected inner_precise 0 or 1, got ", inner_precise);
  TORCH_CHECK(antiquant_group_size >= 0, op, ": expected antiquant_group_size >= 0, got ", antiquant_group_size);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(1);
  const int64_t G = antiquant_group_size > 0 ? antiquant_group_size : std::max<int64_t>(K, 1);
  const int64_t groups = antiquant_group_size > 0 ? (K + G - 1) / G : 1;
  TORCH_CHECK_NOT_IMPLEMENTED(antiquant_scale.scalar_type() != at::kLong, op,
                              ": int64 (packed) antiquant_scale is not supported by the NPU simulator");
  TORCH_CHECK(antiquant_scale.scalar_type() == x.scalar_type(), op, ": expected antiquant_scale to have x's dtype ",
              x.scalar_type(), ", got ", antiquant_scale.scalar_type());
  // The parameter shapes as [rows, cols] with rows in {1, groups} and cols in {1, N}.
  auto param_shape = [&](const char* arg, const Tensor& t) {
    const int64_t rows = t.dim() == 2 ? t.size(0) : 1, cols = t.dim() == 2 ? t.size(1) : t.dim() == 1 ? t.size(0) : -1;
    const bool ok = (t.dim() == 1 || t.dim() == 2) &&
                    (antiquant_group_size > 0 ? (rows == groups && cols == N)
                                              : (rows == 1 && (cols == 1 || cols == N)));
    TORCH_CHECK(ok, op, ": expected ", arg, " of shape ",
                antiquant_group_size > 0 ? "[ceil(k / antiquant_group_size) = " + std::to_string(groups) + ", n = " +
                                               std::to_string(N) + "]"
                                         : "[1], [1, 1], [n = " + std::to_string(N) + "] or [1, n]",
                ", got ", t.sizes());
    return std::pair<int64_t, int64_t>(rows, cols);
  };
  const auto s_shape = param_shape("antiquant_scale", antiquant_scale);
  if (aoff.defined()) {
    TORCH_CHECK(aoff.scalar_type() == x.scalar_type(), op, ": expected antiquant_offset to have x's dtype ",
                x.scalar_type(), ", got ", aoff.scalar_type());
    TORCH_CHECK(aoff.sizes() == antiquant_scale.sizes(), op, ": expected antiquant_offset of antiquant_scale's shape ",
                antiquant_scale.sizes(), ", got ", aoff.sizes());
  }
  auto check_quant = [&](const char* arg, const Tensor& t) {
    check_dtype_in(op, arg, t, {at::kFloat, at::kLong});
    TORCH_CHECK((t.dim() == 1 && (t.size(0) == 1 || t.size(0) == N)) ||
                    (t.dim() == 2 && t.size(0) == 1 && (t.size(1) == 1 || t.size(1) == N)),
                op, ": expected ", arg, " of shape [1], [n = ", N, "] or [1, n], got ", t.sizes());
  };
  if (qs.defined()) check_quant("quant_scale", qs);
  if (qo.defined()) {
    TORCH_CHECK(qs.defined(), op, ": quant_offset needs quant_scale");
    check_quant("quant_offset", qo);
  }
  if (bias.defined()) {
    check_float(op, "bias", bias);
    TORCH_CHECK((bias.dim() == 1 && bias.size(0) == N) || (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == N),
                op, ": expected bias of shape [n = ", N, "] or [1, n], got ", bias.sizes());
  }
  Tensor out = at::empty({M, N}, x.options().dtype(qs.defined() ? at::kChar : x.scalar_type()));
  if (out.numel() == 0) return out;
  ops::launch_kernel(
      op, device, {dense(x), dense(weight), dense(antiquant_scale), dense(aoff), qs, qo, dense(bias), out},
      M * N * std::max<int64_t>(K, 1) / 8, [=](const std::vector<Tensor>& t) {
        const bool dbl = t[0].scalar_type() == at::kDouble;
        const auto acc_type = dbl ? at::kDouble : at::kFloat;
        // Dequantised weight [K, N] in the accumulation type, then a float GEMM.
        const Tensor s = t[2].to(acc_type).reshape({s_shape.first, s_shape.second}).contiguous();
        const Tensor o = t[3].defined() ? t[3].to(acc_type).reshape({s_shape.first, s_shape.second}).contiguous()
                                        : Tensor();
        Tensor wf = at::empty({K, N}, t[1].options().dtype(acc_type));
        // The antiquantisation runs in x's dtype (as on the NPU's vector unit): the sum
        // weight + offset and the product with the scale are each rounded to float16/bfloat16.
        const auto x_type = t[0].scalar_type();
        auto in_x_type = [x_type](float v) {
          if (x_type == at::kHalf) return static_cast<float>(static_cast<c10::Half>(v));
          if (x_type == at::kBFloat16) return static_cast<float>(static_cast<c10::BFloat16>(v));
          return v;
        };
        AT_DISPATCH_FLOATING_TYPES(acc_type, op, [&] {
          const auto* wq = t[1].const_data_ptr<int8_t>();
          const auto* sp = s.const_data_ptr<scalar_t>();
          const scalar_t* opp = o.defined() ? o.const_data_ptr<scalar_t>() : nullptr;
          auto* wd = wf.mutable_data_ptr<scalar_t>();
          const int64_t cols = s_shape.second;
          at::parallel_for(0, K, 64, [&](int64_t begin, int64_t end) {
            for (int64_t kk = begin; kk < end; ++kk) {
              const int64_t g = s_shape.first == 1 ? 0 : kk / G;
              for (int64_t j = 0; j < N; ++j) {
                const int64_t p = g * cols + (cols == 1 ? 0 : j);
                const scalar_t shifted = static_cast<scalar_t>(wq[kk * N + j]) + (opp ? opp[p] : scalar_t(0));
                wd[kk * N + j] = dbl ? shifted * sp[p] : in_x_type(in_x_type(shifted) * sp[p]);
              }
            }
          });
        });
        Tensor y = at::mm(t[0].to(acc_type), wf);
        if (t[6].defined()) y.add_(t[6].to(acc_type).reshape({N}));
        if (!t[4].defined()) {
          t[7].copy_(y);
          return;
        }
        std::vector<float> qsv, qov, pk_off;
        decode(t[4], N, qsv, &pk_off);
        decode(t[5], N, qov);
        const Tensor yf = y.to(at::kFloat).contiguous();
        const float* yp = yf.const_data_ptr<float>();
        auto* out8 = t[7].mutable_data_ptr<int8_t>();
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) out8[i * N + j] = narrow<int8_t>(yp[i * N + j] * qsv[j] + qov[j] + pk_off[j]);
        }
      });
  return out;
}

// ---- npu_quant_conv2d ------------------------------------------------------------------------
// out = (conv(input, weight) + bias) * scale, per output channel; padding takes the value offset_x.

Tensor npu_quant_conv2d(const Tensor& input, const Tensor& weight, const Tensor& scale, c10::IntArrayRef strides,
                        c10::IntArrayRef pads, c10::IntArrayRef dilations, int64_t groups, int64_t offset_x,
                        c10::string_view round_mode, std::optional<int64_t> output_dtype, const OptTensor& bias_opt,
                        const OptTensor& offset_opt, std::optional<int64_t> input_dtype,
                        std::optional<int64_t> weight_dtype) {
  constexpr const char* op = "npu_quant_conv2d";
  const Tensor& bias = get(bias_opt);
  const auto device = npu_device(op, {{"input", input}, {"weight", weight}, {"scale", scale}, {"bias", bias}});
  check_none(op, "input_dtype (hifloat8)", input_dtype.has_value());
  check_none(op, "weight_dtype (hifloat8)", weight_dtype.has_value());
  TORCH_CHECK(!offset_opt.has_value() || !offset_opt->defined(), op, ": offset must be None");
  TORCH_CHECK(round_mode == "rint", op, ": expected round_mode 'rint', got '", round_mode, "'");
  TORCH_CHECK(output_dtype.has_value(), op, ": output_dtype can not be None");
  const auto out_type = dtype_arg(op, "output_dtype", *output_dtype, {at::kHalf, at::kBFloat16, at::kFloat});
  check_dtype(op, "input", input, at::kChar);
  check_dtype(op, "weight", weight, at::kChar);
  TORCH_CHECK(input.dim() == 4, op, ": expected input of shape [N, C, H, W], got ", input.sizes());
  TORCH_CHECK(weight.dim() == 4, op, ": expected weight of shape [Co, C / groups, kh, kw], got ", weight.sizes());
  TORCH_CHECK(strides.size() == 2 && strides[0] > 0 && strides[1] > 0, op,
              ": expected strides of 2 positive elements, got ", strides);
  TORCH_CHECK(pads.size() == 2 && pads[0] >= 0 && pads[1] >= 0, op, ": expected pads of 2 elements >= 0, got ", pads);
  TORCH_CHECK(dilations.size() == 2 && dilations[0] > 0 && dilations[1] > 0, op,
              ": expected dilations of 2 positive elements, got ", dilations);
  TORCH_CHECK(offset_x >= -128 && offset_x <= 127, op, ": expected offset_x in [-128, 127], got ", offset_x);
  const int64_t C = input.size(1), Co = weight.size(0);
  TORCH_CHECK(groups > 0 && C % groups == 0 && Co % groups == 0 && weight.size(1) * groups == C, op,
              ": expected groups > 0 dividing input channels (", C, ") and weight.size(0) (", Co,
              ") with weight.size(1) * groups = ", C, ", got groups = ", groups, " and weight of shape ",
              weight.sizes());
  const int64_t ho = (input.size(2) + 2 * pads[0] - dilations[0] * (weight.size(2) - 1) - 1) / strides[0] + 1;
  const int64_t wo = (input.size(3) + 2 * pads[1] - dilations[1] * (weight.size(3) - 1) - 1) / strides[1] + 1;
  TORCH_CHECK(weight.size(2) > 0 && weight.size(3) > 0 && ho > 0 && wo > 0, op,
              ": the kernel (", weight.sizes(), ") does not fit the padded input ", input.sizes(),
              "; expected a positive output height and width");
  check_dtype_in(op, "scale", scale, {at::kFloat, at::kLong});
  check_vector(op, "scale", scale, Co, "out channels");
  if (bias.defined()) {
    check_dtype_in(op, "bias", bias, {at::kInt, at::kFloat, at::kHalf, at::kBFloat16});
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == Co, op, ": expected bias of shape [", Co, "], got ", bias.sizes());
  }
  Tensor out = at::empty({input.size(0), Co, ho, wo}, input.options().dtype(out_type));
  if (out.numel() == 0) return out;
  const std::vector<int64_t> st(strides.begin(), strides.end()), pd(pads.begin(), pads.end()),
      dl(dilations.begin(), dilations.end());
  ops::launch_kernel(
      op, device, {dense(input), dense(weight), scale, dense(bias), out}, out.numel() * weight[0].numel() / 8,
      [=](const std::vector<Tensor>& t) {
        // int8 products summed in float64 are exact integers (|sum| < 2^53).
        Tensor xd = t[0].to(at::kDouble);
        if (pd[0] > 0 || pd[1] > 0) xd = at::constant_pad_nd(xd, {pd[1], pd[1], pd[0], pd[0]}, offset_x);
        Tensor acc = at::convolution(xd, t[1].to(at::kDouble), std::nullopt, st, {0, 0}, dl, false, {0, 0}, groups);
        std::vector<float> sc, bv;
        decode(t[2], Co, sc);
        decode(t[3], Co, bv);
        const int64_t plane = ho * wo;
        const double* ap = acc.const_data_ptr<double>();
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t[4].scalar_type(), op, [&] {
          auto* y = t[4].mutable_data_ptr<scalar_t>();
          at::parallel_for(0, t[4].numel() / plane, 1, [&](int64_t begin, int64_t end) {
            for (int64_t nc = begin; nc < end; ++nc) {
              const int64_t c = nc % Co;
              for (int64_t p = 0; p < plane; ++p) {
                y[nc * plane + p] = static_cast<scalar_t>((static_cast<float>(ap[nc * plane + p]) + bv[c]) * sc[c]);
              }
            }
          });
        });
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_trans_quant_param(Tensor scale, Tensor? offset=None, int? round_mode=0) -> Tensor");
  m.def(
      "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, Tensor? pertoken_scale=None, "
      "Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, int? x2_dtype=None, "
      "int? pertoken_scale_dtype=None, int? scale_dtype=None, int[]? group_sizes=None, Tensor? y_scale=None) -> Tensor");
  m.def(
      "npu_weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None, "
      "Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? bias=None, int antiquant_group_size=0, "
      "int inner_precise=0, int? weight_dtype=None) -> Tensor");
  m.def(
      "npu_quant_conv2d(Tensor input, Tensor weight, Tensor scale, int[2] strides=1, int[2] pads=0, "
      "int[2] dilations=1, int groups=1, int offset_x=0, str round_mode='rint', int? output_dtype=None, "
      "Tensor? bias=None, Tensor? offset=None, int? input_dtype=None, int? weight_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_trans_quant_param", TORCH_FN(npu_trans_quant_param));
  m.impl("npu_quant_matmul", TORCH_FN(npu_quant_matmul));
  m.impl("npu_weight_quant_batchmatmul", TORCH_FN(npu_weight_quant_batchmatmul));
  m.impl("npu_quant_conv2d", TORCH_FN(npu_quant_conv2d));
}

}  // namespace torch_npu::custom_ops
