// Kernels registered natively for npu (not through the zero-copy fallback):
// allocation, copies between host and device, views, resizes, scalars, and the
// ops the boxed fallback cannot serve (convolution_*_overrideable, native_dropout
// with the npu generator, record_stream).
#include <ATen/MemoryOverlap.h>
#include <ATen/EmptyTensor.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/record_function.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/contiguous_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_error.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/ops/formats.h"
#include "torch_npu/ops/zero_copy.h"

namespace torch_npu::ops {
namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;
const c10::DispatchKeySet kNPUKeys(c10::DispatchKey::PrivateUse1);

c10::DeviceIndex target_device(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    check_device_index(device->index());
    return device->index();
  }
  return current_device();
}

// ---- allocation ----------------------------------------------------------------
// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.
// fill_uninitialized_memory (its default): new memory reads NaN, or the largest integer,
// as ATen's CPU and CUDA empty and resize_ make it.
bool fill_uninitialized_memory() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "npu: only strided tensors are supported, got layout ",
              *layout);
  const auto d = target_device(device);
  c10::DeviceGuard guard(c10::Device(kNPU, d));
  at::Tensor t = at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), NPUCachingAllocator::get(), kNPUKeys,
                                           c10::dtype_or_default(dtype), memory_format);
  if (C10_UNLIKELY(fill_uninitialized_memory())) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "npu: only strided tensors are supported, got layout ",
              *layout);
  const auto d = target_device(device);
  c10::DeviceGuard guard(c10::Device(kNPU, d));
  at::Tensor t = at::detail::empty_strided_generic(C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                                   NPUCachingAllocator::get(), kNPUKeys, c10::dtype_or_default(dtype));
  if (C10_UNLIKELY(fill_uninitialized_memory())) at::native::fill_empty_deterministic_(t);
  return t;
}

// ---- copies --------------------------------------------------------------------
// Bytes that can be copied as they are (not in a tiled storage format, see formats.h).
bool plain_layout(const at::Tensor& t) { return t.is_contiguous() && tiled_storage(t) == nullptr; }

bool plain_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes().equals(b.sizes()) && plain_layout(a) && plain_layout(b) &&
         a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

void* bytes(const at::Tensor& t) { return static_cast<char*>(t.storage().mutable_data()) + t.storage_offset() * t.itemsize(); }

// Host -> npu. A pageable source is read before returning (as CUDA does); a pinned
// source with non_blocking=True is read in stream order.
void copy_h2d(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const auto device = dst.device().index();
  NPUStream stream = getCurrentNPUStream(device);
  at::Tensor host = src.to(dst.scalar_type()).contiguous();  // src is already expanded to dst
  // A plain copy is a memcpy task; a strided or tiled destination is a kernel (runs_on_caller).
  const bool plain = plain_layout(dst) && !dst.is_conj() && !dst.is_neg();
  launch(stream, "aten::copy_(H2D)", [host = twin(host), dst = borrowed_twin(dst), device, plain] {
    if (plain) {
      NPU_CHECK(aclrtMemcpy(bytes(dst), host.nbytes(), host.const_data_ptr(), host.nbytes(), ACL_MEMCPY_HOST_TO_DEVICE));
      return;
    }
    KernelScope scope(device);
    at::Tensor staged = at::empty(host.sizes(), host.options());  // NPU memory (kernel scope)
    NPU_CHECK(aclrtMemcpy(staged.data_ptr(), staged.nbytes(), host.const_data_ptr(), host.nbytes(),
                          ACL_MEMCPY_HOST_TO_DEVICE));
    AliasMap aliases(device);
    aliases.alias(dst).copy_(staged);
    aliases.store_untiled();
  }, plain ? -1 : dst.numel());
  const bool async_ok = non_blocking && src.is_pinned();
  if (!async_ok) {
    c10_npu::warn_or_error_on_sync();
    stream.synchronize();
  }
}

// npu -> host: waits for the stream unless non_blocking into pinned memory.
void copy_d2h(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const auto device = src.device().index();
  NPUStream stream = getCurrentNPUStream(device);
  const bool direct = plain_bytes(src, dst);
  at::Tensor host = direct ? dst : at::empty(dst.sizes(), dst.options().memory_format(at::MemoryFormat::Contiguous));
  launch(stream, "aten::copy_(D2H)", [src = borrowed_twin(src), host = twin(host), device, direct] {
    if (direct) {
      NPU_CHECK(aclrtMemcpy(bytes(host), host.nbytes(), bytes(src), host.nbytes(), ACL_MEMCPY_DEVICE_TO_HOST));
      return;
    }
    KernelScope scope(device);
    AliasMap aliases(device);
    at::Tensor staged = aliases.alias(src).expand(host.sizes()).to(host.scalar_type()).resolve_conj().resolve_neg().contiguous();
    NPU_CHECK(aclrtMemcpy(host.data_ptr(), host.nbytes(), staged.const_data_ptr(), staged.nbytes(),
                          ACL_MEMCPY_DEVICE_TO_HOST));
  }, direct ? -1 : host.numel());
  if (non_blocking && dst.is_pinned() && direct) return;
  c10_npu::warn_or_error_on_sync();
  stream.synchronize();
  if (!direct) dst.copy_(host);
}

// Work queued on `waiter` from now on runs after the work queued on `on` so far.
void stream_wait(const NPUStream& waiter, const NPUStream& on) {
  aclrtEvent event = nullptr;
  NPU_CHECK(aclrtCreateEventWithFlag(&event, ACL_EVENT_SYNC));
  NPU_CHECK(aclrtRecordEvent(event, on.stream()));
  NPU_CHECK(aclrtStreamWaitEvent(waiter.stream(), event));
  NPU_CHECK(aclrtDestroyEvent(event));  // the queued wait keeps it until it has run
}

// npu -> npu, on the source device's current stream. Across devices, as CUDA's: a two-way
// barrier, the copy after the work queued on both devices' current streams so far, and
// the destination's later work after the copy (later writes to the source follow it on
// the source's stream).
void copy_d2d(const at::Tensor& src, const at::Tensor& dst) {
  // torch_npu runs a device copy as the ACL operator aclnnInplaceCopy, and profiles name it so
  // (torch_npu's own trans_contiguous tests look for it in key_averages()).
  RECORD_FUNCTION("aclnnInplaceCopy", std::vector<c10::IValue>());
  const auto device = dst.device().index();
  const bool across = src.device().index() != device;
  NPUStream stream = getCurrentNPUStream(src.device().index());
  if (across) stream_wait(stream, getCurrentNPUStream(device));
  const bool memcpy_task = plain_bytes(src, dst) && across;
  launch(stream, "aten::copy_", [src = borrowed_twin(src), dst = borrowed_twin(dst), device, memcpy_task] {
    if (memcpy_task) {
      NPU_CHECK(aclrtMemcpy(bytes(dst), dst.nbytes(), bytes(src), src.nbytes(), ACL_MEMCPY_DEVICE_TO_DEVICE));
      return;
    }
    KernelScope scope(device);
    AliasMap aliases(device);
    at::Tensor d = aliases.alias(dst);
    AliasMap src_aliases(src.device().index());
    at::Tensor s = src.device() == dst.device() ? aliases.alias(src) : src_aliases.alias(src);
    d.copy_(s);
    aliases.store_untiled();
  }, memcpy_task ? -1 : dst.numel());
  if (across) stream_wait(getCurrentNPUStream(device), stream);
}

at::Tensor copy_from(const at::Tensor& source, const at::Tensor& dst, bool non_blocking) {
  const bool src_npu = source.device().type() == kNPU;
  const bool dst_npu = dst.device().type() == kNPU;
  // Shapes are checked now, at the call, not when the copy runs on the stream.
  const at::Tensor self = source.expand_as(dst);
  if (dst.numel() == 0) return dst;
  if (C10_UNLIKELY(unsafe_data_check_enabled())) check_and_update_for_copy(dst, source);
  if (src_npu && dst_npu) {
    if (dst.is_same(source)) return dst;  // as ATen's copy_
    // The overlap checks of the copy's TensorIterator, at the call (the kernel runs later).
    at::assert_no_internal_overlap(dst);
    at::assert_no_partial_overlap(dst, source);
    copy_d2d(self, dst);
  } else if (dst_npu) {
    TORCH_CHECK(self.device().is_cpu(), "copy_ from ", self.device(), " to ", dst.device(), " is not supported");
    copy_h2d(self, dst, non_blocking);
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "copy_ from ", self.device(), " to ", dst.device(), " is not supported");
    copy_d2h(self, dst, non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  c10_npu::warn_or_error_on_sync();
  getCurrentNPUStream(self.device().index()).synchronize();
  if (tiled_storage(self) != nullptr) {
    AliasMap aliases(self.device().index());
    return at::_local_scalar_dense(aliases.alias(self));
  }
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  NPU_CHECK(aclrtMemcpy(host.data_ptr(), host.nbytes(), bytes(self), self.itemsize(), ACL_MEMCPY_DEVICE_TO_HOST));
  return at::_local_scalar_dense(host);
}

// ---- views and resizes -----------------------------------------------------------
at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) { return at::native::view_symint(self, size); }

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset.has_value() ? std::optional<int64_t>(offset->expect_int())
                                                              : std::nullopt);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias_symint(self, size, stride);
}

void ensure_storage_bytes(const at::Tensor& self, size_t nbytes) {
  const c10::Storage& storage = self.storage();
  if (nbytes > storage.nbytes()) at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(storage, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  for (auto s : sizes) TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", sizes);
  if (impl->sizes() == sizes && (!memory_format || *memory_format == at::MemoryFormat::Preserve)) return self;
  if (tiled_storage(self) != nullptr) {
    // A tiled layout has no room to grow in: the tensor moves to a plain (ND) copy first.
    at::Tensor nd = format_cast(self, kFormatND);
    impl->set_storage_keep_dtype(nd.storage());
    impl->set_sizes_and_strides(nd.sizes(), nd.strides(), nd.storage_offset());
  }
  impl->set_sizes_contiguous(sizes);
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, impl->strides(), self.itemsize(),
                                                         impl->storage_offset());
  const int64_t old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  ensure_storage_bytes(self, nbytes);
  if (C10_UNLIKELY(fill_uninitialized_memory())) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNPU, "Attempted to set the storage of a tensor on device ", self.device(),
              " to a storage on different device ", source.device(), ".  This is no longer allowed; the devices must match.");
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset.expect_int());
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  if (stride.empty()) {
    impl->set_sizes_contiguous(sizes);
  } else {
    impl->set_sizes_and_strides(sizes, C10_AS_INTARRAYREF_SLOW(stride));
  }
  ensure_storage_bytes(self, at::detail::computeStorageNbytes(sizes, impl->strides(), self.itemsize(),
                                                              impl->storage_offset()));
  note_set_storage(self);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_storage(self, std::move(source), 0, c10::SymIntArrayRef({c10::SymInt(n)}), {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return self;
  return set_storage(self, src.storage(), src.sym_storage_offset(), src.sym_sizes(), src.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                           NPUCachingAllocator::get()->allocate(0),
                                                           NPUCachingAllocator::get(), true));
  return set_storage(self, std::move(empty), 0, c10::SymIntArrayRef({c10::SymInt(0)}), {});
}

// ---- ops the boxed fallback cannot serve -------------------------------------------
// Convolutions: the CPU kernel allocates its outputs, so the fallback would have to run
// it before returning (which a capturing stream never does). Their shapes and layouts
// are known beforehand, though: the outputs are allocated here and the kernel is queued
// on the stream (launch_kernel: recorded while the stream captures), writing its
// results into them. Arguments were checked by at::convolution / convolution_backward
// (check_shape_forward/backward) before they chose this backend.

// Tensor.contiguous(memory_format), as torch_npu's: a tensor not already contiguous in the
// requested format is copied into the contiguous format only; channels_last and
// channels_last_3d raise (ERR01007). Registered for AutogradPrivateUse1 (the clone records
// autograd, as the composite kernel's does) and PrivateUse1 (below autograd). Quantized
// tensors keep ATen's behaviour.
at::Tensor contiguous(const at::Tensor& self, at::MemoryFormat memory_format) {
  if (self.is_quantized()) return at::native::contiguous(self, memory_format);
  if (self.is_contiguous(memory_format)) return self;
  TORCH_CHECK(memory_format == at::MemoryFormat::Contiguous,
              "NPU contiguous operator only supported contiguous memory format (got ", memory_format,
              " for a tensor of sizes ", self.sizes(), " and strides ", self.strides(), ").",
              ops_error(ErrCode::NOT_SUPPORT));
  return self.clone(memory_format);
}

// The memory format of a convolution's results (output; grad_input and grad_weight), as
// torch_npu's and cuDNN's: channels_last (channels_last_3d for 5-d operands) when the input or
// the weight suggests it, else contiguous. ATen's CPU kernels may choose otherwise (a
// channels_last_3d Conv3d on its slow path gives a contiguous output).
at::MemoryFormat conv_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  const auto in = input.suggest_memory_format(), w = weight.suggest_memory_format();
  if (input.dim() == 4 && (in == at::MemoryFormat::ChannelsLast || w == at::MemoryFormat::ChannelsLast)) {
    return at::MemoryFormat::ChannelsLast;
  }
  if (input.dim() == 5 && (in == at::MemoryFormat::ChannelsLast3d || w == at::MemoryFormat::ChannelsLast3d)) {
    return at::MemoryFormat::ChannelsLast3d;
  }
  return at::MemoryFormat::Contiguous;
}

void check_conv_params(const char* op, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, c10::IntArrayRef output_padding,
                       bool transposed) {
  const int64_t k = input.dim() - 2;
  TORCH_CHECK(k >= 1 && weight.dim() == input.dim(), op, ": expected input and weight of the same rank >= 3, got input ",
              input.sizes(), " and weight ", weight.sizes());
  for (auto [name, list] : {std::pair<const char*, c10::IntArrayRef>{"stride", stride}, {"padding", padding},
                            {"dilation", dilation}}) {
    TORCH_CHECK(static_cast<int64_t>(list.size()) == k, op, ": expected ", name, " to have ", k,
                " elements (one per spatial dimension), got ", list);
  }
  TORCH_CHECK(!transposed || static_cast<int64_t>(output_padding.size()) == k, op, ": expected output_padding to have ",
              k, " elements, got ", output_padding);
}

// float16/bfloat16 convolutions are computed in float32 and rounded once into their results, as
// Ascend's cube units accumulate in float32 (ATen's CPU kernels for the low precisions
// round partial sums, and its slow paths accumulate in float16).
at::Tensor in_float32(const at::Tensor& t) {
  if (t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)) return t.to(at::kFloat);
  return t;
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  constexpr const char* kName = "aten::convolution_overrideable";
  check_conv_params(kName, input, weight, stride, padding, dilation, output_padding, transposed);
  const auto sizes = transposed ? at::native::conv_input_size(input.sizes(), weight.sizes(), padding, output_padding,
                                                              stride, dilation, groups)
                                : at::native::conv_output_size(input.sizes(), weight.sizes(), padding, stride, dilation);
  for (size_t d = 2; d < sizes.size(); ++d) {
    TORCH_CHECK(sizes[d] > 0, kName, ": the output size ", c10::IntArrayRef(sizes), " is empty (input ",
                input.sizes(), ", weight ", weight.sizes(), ", stride ", stride, ", padding ", padding, ", dilation ",
                dilation, ")");
  }
  const auto format = conv_memory_format(input, weight);
  at::Tensor out = at::empty(sizes, input.options().memory_format(format));
  at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  launch_kernel(kName, input.device().index(), {input, weight, b, out}, std::max(input.numel(), weight.numel()),
                [stride = stride.vec(), padding = padding.vec(), dilation = dilation.vec(), transposed,
                 output_padding = output_padding.vec(), groups](const std::vector<at::Tensor>& t) {
                  std::optional<at::Tensor> bias;
                  if (t[2].defined()) bias = in_float32(t[2]);
                  t[3].copy_(at::convolution(in_float32(t[0]), in_float32(t[1]), bias, stride, padding, dilation,
                                             transposed, output_padding, groups));
                });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  constexpr const char* kName = "aten::convolution_backward_overrideable";
  check_conv_params(kName, input, weight, stride, padding, dilation, output_padding, transposed);
  const int64_t bias_size = transposed ? weight.size(1) * groups : weight.size(0);
  const auto format = conv_memory_format(input, weight);
  at::Tensor gi, gw, gb;
  if (output_mask[0]) gi = at::empty(input.sizes(), input.options().memory_format(format));
  if (output_mask[1]) gw = at::empty(weight.sizes(), weight.options().memory_format(format));
  if (output_mask[2]) gb = at::empty({bias_size}, weight.options());
  const int64_t max_numel = std::max({grad_output.numel(), input.numel(), weight.numel()});
  launch_kernel(kName, input.device().index(), {grad_output, input, weight, gi, gw, gb}, max_numel,
                [stride = stride.vec(), padding = padding.vec(), dilation = dilation.vec(), transposed,
                 output_padding = output_padding.vec(), groups, output_mask,
                 bias_size](const std::vector<at::Tensor>& t) {
                  std::optional<std::vector<int64_t>> bias_sizes;
                  if (output_mask[2]) bias_sizes = std::vector<int64_t>{bias_size};
                  auto [gi, gw, gb] = at::convolution_backward(
                      in_float32(t[0]), in_float32(t[1]), in_float32(t[2]), bias_sizes ? c10::OptionalIntArrayRef(*bias_sizes) : std::nullopt, stride,
                      padding, dilation, transposed, output_padding, groups, output_mask);
                  if (t[3].defined()) t[3].copy_(gi);
                  if (t[4].defined()) t[4].copy_(gw);
                  if (t[5].defined()) t[5].copy_(gb);
                });
  return {gi, gw, gb};
}

// torch_npu runs _nnpack_spatial_convolution on the device as a convolution (aclnnConvolution,
// dilation 1, one group); PyTorch's composite kernel calls NNPACK, which takes CPU float
// tensors only ("Mismatched Tensor types in NNPack convolutionOutput").
at::Tensor nnpack_spatial_convolution(const at::Tensor& input, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias, c10::SymIntArrayRef padding,
                                      c10::SymIntArrayRef stride) {
  TORCH_CHECK(input.dim() == 4, "_nnpack_spatial_convolution: expected a 4-D input (N, C, H, W), got ", input.sizes());
  TORCH_CHECK(weight.dim() == 4, "_nnpack_spatial_convolution: expected a 4-D weight (oC, iC, kH, kW), got ",
              weight.sizes());
  TORCH_CHECK(padding.size() == 2 && stride.size() == 2,
              "_nnpack_spatial_convolution: expected padding and stride of 2 values, got padding ", padding,
              " and stride ", stride);
  return at::convolution(input, weight, bias, C10_AS_INTARRAYREF_SLOW(stride), C10_AS_INTARRAYREF_SLOW(padding),
                         {1, 1}, false, {0, 0}, 1);
}

// Dropout drawing from the npu generator (the CPU kernel would use the CPU default).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  if (p == 1) {
    return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  }
  at::Tensor mask = at::empty(input.sizes(), input.options().dtype(at::kBool)).bernoulli_(1 - p);
  at::Tensor out = at::mul(input, mask).mul_(1.0 / (1.0 - p));
  return {out, mask};
}

// silu_backward also has a CompositeImplicitAutograd kernel, which PyTorch gives to the
// autograd key of a backend with no kernel of its own for the functional form: a chain of
// float16/bfloat16 ops with a rounding after each. This kernel makes autograd use the
// structured .grad_input kernel instead (computed in float, rounded once), as on CPU.
at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  at::Tensor grad_input = at::empty({0}, grad_output.options());
  return at::silu_backward_out(grad_input, grad_output, self);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  NPUCachingAllocator::recordStream(self.storage().data_ptr(), stream);
}

// torch_npu's one_hot (aclnnOneHot) takes index tensors of any integer dtype and returns
// that dtype (int32 labels give an int32 one-hot); PyTorch's composite kernel takes int64
// only. The checks and num_classes=-1 are PyTorch's.
at::Tensor one_hot(const at::Tensor& self, int64_t num_classes) {
  TORCH_CHECK(at::isIntegralType(self.scalar_type(), /*includeBool=*/false),
              "one_hot is only applicable to index tensors of an integer type, got ", self.scalar_type());
  TORCH_CHECK(num_classes >= -1, "num_classes should be positive or -1 (infer it), got ", num_classes);
  if (self.numel() == 0) {
    TORCH_CHECK(num_classes > 0, "Can not infer total number of classes from empty tensor.");
  } else {
    TORCH_CHECK(self.min().item<int64_t>() >= 0, "Class values must be non-negative.");
    const int64_t top = self.max().item<int64_t>();
    if (num_classes == -1) {
      num_classes = top + 1;
    } else {
      TORCH_CHECK(top < num_classes, "Class values must be smaller than num_classes.");
    }
  }
  return at::eq(self.unsqueeze(-1), at::arange(num_classes, self.options())).to(self.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("view", TORCH_FN(view));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("contiguous", TORCH_FN(contiguous));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
  m.impl("_nnpack_spatial_convolution", TORCH_FN(nnpack_spatial_convolution));
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("silu_backward", TORCH_FN(silu_backward));
  m.impl("one_hot", TORCH_FN(one_hot));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("contiguous", TORCH_FN(contiguous)); }

// Without these, _copy_from on a conjugated/negated view recurses forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torch_npu::ops
