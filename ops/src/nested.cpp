// Strided nested tensors on npu (torch.nested.nested_tensor(..., device="npu"), dispatch key
// NestedTensorPrivateUse1), as PyTorch's CPU and CUDA backends have them. A nested tensor is a
// strided npu buffer plus CPU metadata (each component's sizes, strides and offset in the buffer).
//
// An operator on nested npu tensors runs PyTorch's NestedTensorCPU kernel zero-copy, as
// sparse.cpp does for the sparse layouts: each nested argument becomes a CPU nested tensor over
// a CPU alias of its buffer (same metadata), other npu tensors become their CPU aliases, the
// kernel runs in stream order under a KernelScope (what it allocates is NPU memory), and the
// results map back: nested ones over their npu buffers, strided ones as the dense kernels' do.
// An operator PyTorch has no NestedTensorCPU kernel for raises the CPU's error. `_to_copy`
// (Tensor.to, .cpu(), .npu()) copies the buffer with the dense copies.
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/nested/NestedTensorUtils.h>
#include <torch/library.h>

#include "torch_npu/core/npu_stream.h"
#include "torch_npu/ops/zero_copy.h"

namespace torch_npu::ops {
namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

bool on_npu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }

// The whole storage of a nested tensor as a 1-D tensor (its components index it by offset).
at::Tensor storage_of(const at::Tensor& nested) {
  return at::native::get_nested_tensor_impl(nested)->get_unsafe_storage_as_tensor();
}

// `buffer` (1-D, on any device) under the metadata of `like`.
at::Tensor rewrap(const at::Tensor& buffer, const at::Tensor& like) {
  const auto* impl = at::native::get_nested_tensor_impl(like);
  return at::native::wrap_buffer(buffer, impl->get_nested_sizes().clone(), impl->get_nested_strides().clone(),
                                 impl->get_storage_offsets().clone());
}

// Converts the npu tensors of one call to CPU ones over the same memory and maps the
// kernel's results back.
class NestedCall {
 public:
  explicit NestedCall(c10::DeviceIndex device) : aliases_(device) {}

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!on_npu(t)) return t;
    if (!t.is_nested()) return aliases_.alias(t);
    // The map knows tensors by their TensorImpl: the storage tensor lives as long as the call.
    buffers_.push_back(storage_of(t));
    at::Tensor cpu = rewrap(aliases_.alias(buffers_.back()), t);
    mirror_requires_grad(t, cpu);
    nested_.emplace_back(t, cpu);
    return cpu;
  }

  at::Tensor to_npu(const at::Tensor& cpu) {
    if (!cpu.defined() || cpu.device().type() == kNPU) return cpu;
    for (const auto& [npu, stand_in] : nested_) {
      if (stand_in.unsafeGetTensorImpl() == cpu.unsafeGetTensorImpl()) return npu;  // the argument itself
    }
    return aliases_.to_npu(cpu);
  }

 private:
  AliasMap aliases_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::pair<at::Tensor, at::Tensor>> nested_;
};

// The npu device of a call (its first npu tensor's) and the largest buffer it touches.
c10::DeviceIndex nested_call_device(const torch::jit::Stack& stack, size_t begin, int64_t* max_numel) {
  c10::DeviceIndex device = -1;
  auto scan = [&](const at::Tensor& t) {
    if (!on_npu(t)) return;
    if (device < 0) device = t.device().index();
    TORCH_CHECK(t.device().index() == device, "Expected all tensors to be on the same device, but found at least two "
                "devices, npu:", static_cast<int>(device), " and ", t.device(), "! (on nested npu tensors)");
    *max_numel = std::max(*max_numel, t.is_nested() ? storage_of(t).numel() : t.numel());
  };
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      scan(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) scan(t);
    }
  }
  return device >= 0 ? device : current_device();
}

void nested_zero_copy_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  int64_t max_numel = 0;
  const c10::DeviceIndex device = nested_call_device(*stack, begin, &max_numel);

  NestedCall call(device);
  const c10::DispatchKeySet cpu(c10::DispatchKey::NestedTensorCPU);
  run_on_cpu_stand_ins(
      op, stack, device, [&call](const at::Tensor& t, bool) { return call.to_cpu(t); },
      [&] { run_now(schema.name().c_str(), device, max_numel, [&] { op.redispatchBoxed(cpu, stack); }); },
      [&call](const at::Tensor& t) { return call.to_npu(t); });
}

// Tensor.to / .cpu() / .npu() of a nested npu tensor: its storage copied with the dense copies
// (which order themselves with the stream), under the same metadata.
at::Tensor nested_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                          std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                          std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided,
              "to(): a nested npu tensor converts to strided nested tensors only, got layout ", *layout);
  TORCH_CHECK(!memory_format.has_value() || *memory_format == c10::MemoryFormat::Preserve,
              "to(): a nested tensor keeps its memory format, got ", *memory_format);
  at::Tensor buffer = storage_of(self).to(at::TensorOptions()
                                               .dtype(dtype.value_or(self.scalar_type()))
                                               .device(device.value_or(self.device()))
                                               .pinned_memory(pin_memory),
                                           non_blocking, /*copy=*/true);
  return rewrap(buffer, self);
}

}  // namespace

at::Tensor nested_result_to_npu(AliasMap& aliases, const at::Tensor& cpu) {
  return rewrap(aliases.to_npu(storage_of(cpu)), cpu);
}

}  // namespace torch_npu::ops

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_to_copy", TORCH_FN(torch_npu::ops::nested_to_copy));
  // Composite operators with a NestedTensorCPU kernel of their own: the composite (which reads
  // sizes() a nested tensor has not) would win over the fallback.
  for (const char* op : {"linear", "matmul", "matmul.out", "chunk", "narrow", "silu_backward",
                         "value_selecting_reduction_backward"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::nested_zero_copy_kernel>());
  }
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::nested_zero_copy_kernel>());
}
