// torch_npu's storage-format C++ API (core/sdk/torch_npu/csrc/core/npu/NPUFormat.h) over
// the npu operators of ops/src/formats.cpp and swapped_memory.cpp, called through the
// dispatcher as a user's torch.ops.npu call would be (autograd included).
#include "torch_npu/csrc/core/npu/NPUFormat.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "torch_npu/ops/formats.h"

namespace at_npu::native {

namespace {

template <typename Fn>
c10::TypedOperatorHandle<Fn> npu_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace

int64_t get_npu_format(const at::Tensor& self) {
  static auto op = npu_op<int64_t(const at::Tensor&)>("npu::get_npu_format");
  return op.call(self);
}

std::vector<int64_t> get_npu_storage_sizes(const at::Tensor& self) {
  TORCH_CHECK(self.defined() && self.device().type() == c10::DeviceType::PrivateUse1,
              "get_npu_storage_sizes: expected 'self' to be an npu tensor");
  const auto sizes = torch_npu::ops::npu_storage_sizes(self);
  return std::vector<int64_t>(sizes.begin(), sizes.end());
}

at::Tensor npu_format_cast(const at::Tensor& self, int64_t acl_format) {
  using Fn = at::Tensor(const at::Tensor&, int64_t, std::optional<int64_t>, std::optional<int64_t>);
  static auto op = npu_op<Fn>("npu::npu_format_cast");
  return op.call(self, acl_format, std::nullopt, std::nullopt);
}

at::Tensor empty_with_format(c10::IntArrayRef sizes, const c10::TensorOptions& options, int64_t format,
                             bool /*keep_format*/) {
  using Fn = at::Tensor(c10::IntArrayRef, std::optional<at::ScalarType>, std::optional<at::Layout>,
                        std::optional<at::Device>, std::optional<bool>, int64_t, std::optional<int64_t>);
  static auto op = npu_op<Fn>("npu::empty_with_format");
  return op.call(sizes, c10::optTypeMetaToScalarType(options.dtype_opt()), options.layout_opt(),
                 options.device_opt(), options.pinned_memory_opt(), format, std::nullopt);
}

at::Tensor empty_with_swapped_memory(c10::IntArrayRef size, c10::optional<at::ScalarType> dtype_opt,
                                     c10::optional<c10::Device> device_opt) {
  using Fn = at::Tensor(c10::IntArrayRef, std::optional<at::ScalarType>, std::optional<at::Device>);
  static auto op = npu_op<Fn>("npu::empty_with_swapped_memory");
  return op.call(size, dtype_opt, device_opt);
}

}  // namespace at_npu::native
