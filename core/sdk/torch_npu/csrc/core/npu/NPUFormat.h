// torch_npu's storage-format API for C++ extensions (at_npu::native::, torch_npu's path and
// names): ACL format numbers as torch_npu.Format (2 ND, 29 FRACTAL_NZ, 3 NC1HWC0, ...).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Optional.h>

#include <vector>

#include "torch_npu/csrc/core/npu/NPUMacros.h"

namespace at_npu {
namespace native {

// The storage format of an npu tensor.
TORCH_NPU_API int64_t get_npu_format(const at::Tensor& self);
// The physical shape of the tensor's storage in its format (e.g. [.., n/16, m/16, 16, 16]
// for FRACTAL_NZ); for ND, the storage's shape as its first full view gave it, or the
// element count.
TORCH_NPU_API std::vector<int64_t> get_npu_storage_sizes(const at::Tensor& self);
// self's values in a storage of acl_format (differentiable, as torch_npu.npu_format_cast).
TORCH_NPU_API at::Tensor npu_format_cast(const at::Tensor& self, int64_t acl_format);
// An uninitialised npu tensor whose storage has `format` (keep_format is accepted for
// torch_npu's signature: the format is always kept).
TORCH_NPU_API at::Tensor empty_with_format(c10::IntArrayRef sizes, const c10::TensorOptions& options, int64_t format, bool keep_format = false);
// An npu tensor backed by host memory mapped into the device (torch_npu.empty_with_swapped_memory).
TORCH_NPU_API at::Tensor empty_with_swapped_memory(c10::IntArrayRef size, c10::optional<at::ScalarType> dtype_opt, c10::optional<c10::Device> device_opt);

}  // namespace native
}  // namespace at_npu
