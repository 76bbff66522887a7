// The op table as the kernels see it: what ops/torchnpugen generated for this pair from
// ops/npu_native_functions.yaml, and the kernels the generated registrations point at.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

namespace torch_npu::ops {

constexpr uint64_t kAnyDtype = ~uint64_t{0};
constexpr uint64_t dtype_bit(c10::ScalarType t) { return uint64_t{1} << static_cast<int>(t); }

struct OpDtypes {
  const char* op;  // "name.overload"
  uint64_t dtypes;
};
struct OpNote {
  const char* op;
  const char* why;
};

// Generated; each ends with an entry whose op is nullptr.
extern const OpDtypes kRestrictedDtypes[];
extern const OpNote kUnsupportedOps[];
extern const char* const kPairDescription;  // "torch_npu 2.13.0.post1, CANN 8.5.0"

// The dtypes the NPU takes for `op`: kAnyDtype unless the table restricts them.
uint64_t allowed_dtypes(const c10::OperatorName& op);

// Runs an ATen CPU kernel on NPU memory (zero_copy.cpp): the kernel of every supported
// operator that has no composite kernel.
void zero_copy_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_npu::ops
