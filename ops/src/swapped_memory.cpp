// torch_npu.empty_with_swapped_memory: an npu tensor whose storage is host memory mapped
// into the device (core's NPUSwappedMemoryAllocator). Ops use it like any npu tensor; the
// caching allocator does not count it.
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/record_function.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_swapped_memory_allocator.h"

namespace torch_npu::ops {
namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

at::Tensor empty_with_swapped_memory(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                     std::optional<at::Device> device) {
  RECORD_FUNCTION("empty_with_swapped_memory", std::vector<c10::IValue>({}));
  const c10::Device d = device.value_or(c10::Device(kNPU, current_device()));
  TORCH_CHECK(d.type() == kNPU, "empty_with_swapped_memory: expected an npu device, got ", d);
  const c10::DeviceIndex index = d.has_index() ? d.index() : current_device();
  check_device_index(index);
  at::check_size_nonnegative(size);
  c10::DeviceGuard device_guard(c10::Device(kNPU, index));
  const auto meta = c10::scalarTypeToTypeMeta(c10::dtype_or_default(dtype));
  const size_t nbytes = at::detail::computeStorageNbytesContiguous(size, meta.itemsize());
  c10::Allocator* allocator = NPUSwappedMemoryAllocator::get();
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       allocator->allocate(nbytes), allocator,
                                                       /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  const auto& ctx = at::globalContext();
  if (C10_UNLIKELY(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory())) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("empty_with_swapped_memory(int[] size, *, ScalarType? dtype=None, Device? device=None) -> Tensor");
}

// No tensor argument to dispatch on: the device argument decides.
TORCH_LIBRARY_IMPL(npu, CompositeExplicitAutograd, m) {
  m.impl("empty_with_swapped_memory", TORCH_FN(empty_with_swapped_memory));
}

}  // namespace torch_npu::ops
