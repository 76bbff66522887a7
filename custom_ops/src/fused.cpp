#include "fused.h"

#include <c10/util/Exception.h>

namespace torch_npu::custom_ops {

c10::DeviceIndex npu_device(const char* op, std::initializer_list<NamedTensor> args) {
  c10::DeviceIndex device = -1;
  const char* first = nullptr;
  for (const auto& a : args) {
    if (!a.tensor.defined()) continue;
    TORCH_CHECK(a.tensor.device().type() == c10::DeviceType::PrivateUse1, op, ": expected ", a.name,
                " to be an npu tensor, but it is on ", a.tensor.device());
    TORCH_CHECK(a.tensor.layout() == c10::kStrided, op, ": expected ", a.name, " to be a strided tensor, got ",
                a.tensor.layout());
    if (device < 0) {
      device = a.tensor.device().index();
      first = a.name;
    } else {
      // PyTorch's (and torch_npu's) words for operands on two devices
      TORCH_CHECK(a.tensor.device().index() == device,
                  "Expected all tensors to be on the same device, but found at least two devices, npu:",
                  static_cast<int>(device), " and ", a.tensor.device(), "! (when checking argument ", a.name, " of ",
                  op, ", with ", first, ")");
    }
  }
  TORCH_CHECK(device >= 0, op, ": expected at least one npu tensor argument");
  return device;
}

void check_float(const char* op, const char* arg, const Tensor& t, int64_t dim) {
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16 || st == at::kDouble, op, ": expected ",
              arg, " to be float16, bfloat16 or float32, got ", st);
  if (dim >= 0) {
    TORCH_CHECK(t.dim() == dim, op, ": expected ", arg, " to be ", dim, "-dimensional, got shape ", t.sizes());
  }
}

void check_dtype(const char* op, const char* arg, const Tensor& t, c10::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, op, ": expected ", arg, " to have dtype ", expected, ", got ",
              t.scalar_type());
}

}  // namespace torch_npu::custom_ops
