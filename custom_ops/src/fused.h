// What every fused operator of custom_ops/ shares: argument checks that name the
// argument, the dtype dispatch, and calling an operator below autograd.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <initializer_list>
#include <utility>

#include "torch_npu/ops/zero_copy.h"

namespace torch_npu::custom_ops {

using at::Tensor;

struct NamedTensor {
  const char* name;
  const Tensor& tensor;
};

// The npu device all defined `args` are on; a clear error naming the argument otherwise.
c10::DeviceIndex npu_device(const char* op, std::initializer_list<NamedTensor> args);

// Requires `t` to have dimension `dim` (when `dim` >= 0) and a floating dtype the
// kernels take: float32, float16, bfloat16, and (a simulator extension, for gradcheck)
// float64.
void check_float(const char* op, const char* arg, const Tensor& t, int64_t dim = -1);

// Requires `t` to have `expected` dtype.
void check_dtype(const char* op, const char* arg, const Tensor& t, c10::ScalarType expected);

// `t` contiguous (a no-op for contiguous tensors; otherwise a copy queued on the stream).
inline Tensor dense(const Tensor& t) { return t.defined() ? t.contiguous() : t; }

// Calls operator `name` (e.g. "npu::npu_rms_norm") with the autograd keys excluded: what
// an autograd kernel does to reach the device kernel.
template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Signature>();
}

// The dtype dispatch of the kernels (those of check_float); half types compute in float.
#define NPU_DISPATCH_FLOAT(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

}  // namespace torch_npu::custom_ops
