// Quantized npu tensors (dispatch key QuantizedPrivateUse1), the operators torch_npu serves
// for them: quantize_per_tensor / quantize_per_channel of float npu tensors, dequantize,
// int_repr, the quantizer accessors (q_scale, q_zero_point, q_per_channel_*, qscheme),
// allocation (_empty_affine_quantized, empty.memory_format, empty_strided, empty_like),
// views (view, as_strided, ravel), contiguous / clone, flip and _copy_from (copy_ between
// quantized tensors, on either device).
//
// A quantized npu tensor is a QTensorImpl whose storage is NPU memory (the caching
// allocator) and which carries its quantizer, as on CUDA. PyTorch's quantizers reach the
// device through the quantize/dequantize DispatchStubs, registered here for PrivateUse1 as
// torch_npu's op-plugin does: they run ATen's CPU kernels on CPU aliases of the npu bytes
// (ops/include/torch_npu/ops/zero_copy.h), queued on the current stream, so values are the
// CPU's to the bit. Everything else works on an "integer view": a plain npu tensor of the
// underlying integer dtype (uint8 for quint8, int8 for qint8, int32 for qint32) over the
// same storage, sizes and strides, which the ordinary npu kernels copy and flip.
//
// As in torch_npu, sub-byte dtypes (quint4x2, quint2x4) have no npu quantize kernels, and
// .cpu() / .to() of a quantized tensor raise: PyTorch's _to_copy makes the destination with
// empty_quantized, which torch_npu does not register for QuantizedPrivateUse1. copy_ into an
// existing quantized tensor of the other device moves the values (and the source's quantizer).
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <ATen/native/quantized/AffineQuantizer.h>
#include <ATen/ops/_empty_affine_quantized_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/dequantize_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_per_channel_scales_native.h>
#include <ATen/ops/q_per_channel_zero_points_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/quantize_per_channel_native.h>
#include <ATen/ops/quantize_per_tensor_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <limits>
#include <string>

#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/ops/zero_copy.h"

namespace torch_npu::ops {
namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

bool is_npu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }

bool sub_byte(at::ScalarType t) { return t == at::kQUInt4x2 || t == at::kQUInt2x4; }

c10::DeviceIndex npu_index(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    check_device_index(device->index());
    return device->index();
  }
  return current_device();
}

// A plain tensor of q's underlying integer dtype over q's storage, sizes, strides and offset
// (on q's device): what int_repr() reads, and what copies and flips move.
at::Tensor integer_view(const at::Tensor& q) {
  TORCH_CHECK(!sub_byte(q.scalar_type()), "quantized npu tensors of data type ", q.scalar_type(),
              " are not supported: torch_npu has no NPU kernels for sub-byte quantized dtypes");
  const auto underlying = c10::toUnderlying(q.scalar_type());
  c10::DispatchKeySet keys(c10::computeDispatchKey(underlying, c10::kStrided, q.device()));
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(q.storage()), keys,
                                                   c10::scalarTypeToTypeMeta(underlying));
  impl->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return at::Tensor(std::move(impl));
}

// A CPU quantized tensor over the bytes of `alias` (a CPU alias of an integer view), for
// ATen's QuantizedCPU kernels. The quantizer is the kernel's own (no npu tensors in it).
at::Tensor cpu_qtensor(const at::Tensor& alias, at::ScalarType qtype, at::QuantizerPtr quantizer) {
  auto q = at::detail::make_tensor<at::QTensorImpl>(c10::Storage(alias.storage()),
                                                    c10::DispatchKeySet(c10::DispatchKey::QuantizedCPU),
                                                    c10::scalarTypeToTypeMeta(qtype), std::move(quantizer));
  q.unsafeGetTensorImpl()->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
  return q;
}

// ATen's checkZeroPoints, which PyTorch leaves to the device's kernel on PrivateUse1. It reads
// npu zero points on the host, a synchronisation, which a capturing stream refuses: while one
// captures they are not checked (the kernel saturates what an out-of-range one gives).
void check_zero_points(const char* fn_name, const at::Tensor& zero_points, at::ScalarType qtype) {
  if (is_npu(zero_points) && isStreamRecording(getCurrentNPUStream(zero_points.device().index()))) return;
  const at::Tensor zp = zero_points.to(c10::kCPU, at::kLong).contiguous();
  int64_t lo = 0, hi = 0;
  AT_DISPATCH_QINT_TYPES(qtype, "check_zero_points", [&]() {
    lo = std::numeric_limits<underlying_t>::min();
    hi = std::numeric_limits<underlying_t>::max();
  });
  const int64_t* data = zp.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < zp.numel(); ++i) {
    TORCH_CHECK(data[i] <= hi, fn_name, " zero_point ", data[i], " is above upper bound.");
    TORCH_CHECK(data[i] >= lo, fn_name, " zero_point ", data[i], " is below lower bound.");
  }
}

// ---- the quantize / dequantize stubs (PrivateUse1) ---------------------------------
void quantize_per_tensor_npu(const at::Tensor& rtensor, at::Tensor& qtensor, double scale, int64_t zero_point) {
  const auto qtype = qtensor.scalar_type();
  launch_kernel("aten::quantize_per_tensor", qtensor.device().index(), {rtensor, integer_view(qtensor)},
                rtensor.numel(), [qtype, scale, zero_point](const std::vector<at::Tensor>& t) {
                  at::Tensor q = cpu_qtensor(t[1], qtype, at::make_per_tensor_affine_quantizer(scale, zero_point, qtype));
                  at::native::quantize_tensor_per_tensor_affine(t[0], q, scale, zero_point);
                });
}

void dequantize_per_tensor_npu(const at::Tensor& qtensor, at::Tensor& rtensor, double scale, int64_t zero_point) {
  const auto qtype = qtensor.scalar_type();
  launch_kernel("aten::dequantize", rtensor.device().index(), {integer_view(qtensor), rtensor}, rtensor.numel(),
                [qtype, scale, zero_point](const std::vector<at::Tensor>& t) {
                  at::Tensor r = t[1];
                  at::native::dequantize_tensor_per_tensor_affine(
                      cpu_qtensor(t[0], qtype, at::make_per_tensor_affine_quantizer(scale, zero_point, qtype)), r,
                      scale, zero_point);
                });
}

void quantize_per_channel_npu(const at::Tensor& rtensor, at::Tensor& qtensor, const at::Tensor& scales,
                              const at::Tensor& zero_points, int64_t axis) {
  const auto qtype = qtensor.scalar_type();
  check_zero_points("quantize_tensor_per_channel_affine", zero_points, qtype);
  launch_kernel("aten::quantize_per_channel", qtensor.device().index(),
                {rtensor, integer_view(qtensor), scales, zero_points}, rtensor.numel(),
                [qtype, axis](const std::vector<at::Tensor>& t) {
                  at::Tensor q = cpu_qtensor(t[1], qtype,
                                             c10::make_intrusive<at::PerChannelAffineQuantizer>(qtype, t[2], t[3], axis));
                  at::native::quantize_tensor_per_channel_affine(t[0], q, t[2], t[3], axis);
                });
}

void dequantize_per_channel_npu(const at::Tensor& qtensor, at::Tensor& rtensor, const at::Tensor& scales,
                                const at::Tensor& zero_points, int64_t axis) {
  // The zero points were checked when the tensor was quantized; no host read here (the
  // dequantization stays asynchronous and can be captured into an NPU graph).
  const auto qtype = qtensor.scalar_type();
  launch_kernel("aten::dequantize", rtensor.device().index(), {integer_view(qtensor), rtensor, scales, zero_points},
                rtensor.numel(), [qtype, axis](const std::vector<at::Tensor>& t) {
                  at::Tensor r = t[1];
                  at::native::dequantize_tensor_per_channel_affine(
                      cpu_qtensor(t[0], qtype, c10::make_intrusive<at::PerChannelAffineQuantizer>(qtype, t[2], t[3], axis)),
                      r, t[2], t[3], axis);
                });
}

// ---- PrivateUse1: quantizing float npu tensors --------------------------------------
at::Tensor quantize_per_tensor(const at::Tensor& self, double scale, int64_t zero_point, at::ScalarType dtype) {
  c10::DeviceGuard guard(self.device());
  return at::native::quantize_per_tensor(self, scale, zero_point, dtype);
}

at::Tensor quantize_per_channel(const at::Tensor& self, const at::Tensor& scales, const at::Tensor& zero_points,
                                int64_t axis, at::ScalarType dtype) {
  c10::DeviceGuard guard(self.device());
  return at::native::quantize_per_channel(self, scales, zero_points, axis, dtype);
}

// ---- QuantizedPrivateUse1 -------------------------------------------------------------
at::Tensor int_repr(const at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  at::Tensor out = at::empty(self.sizes(), self.options().dtype(c10::toUnderlying(self.scalar_type())),
                             self.suggest_memory_format());
  out.copy_(integer_view(self));
  return out;
}

at::Tensor dequantize(const at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  return at::native::dequantize_quantized(self);
}

at::Tensor empty_affine_quantized(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                  std::optional<at::Layout> layout, std::optional<at::Device> device,
                                  std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                  std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::Device(kNPU, npu_index(device)));
  return at::native::empty_affine_quantized(size, dtype, layout, device, pin_memory, scale, zero_point,
                                            memory_format);
}

// Options for a new quantized npu tensor (torch_npu's checks and their words).
at::TensorOptions quantized_options(const char* what, std::optional<at::ScalarType> dtype,
                                    std::optional<at::Layout> layout, std::optional<at::Device> device,
                                    std::optional<bool> pin_memory) {
  const auto d = c10::device_or_default(device);
  TORCH_CHECK(d.is_privateuseone(), "QuantizedPrivateUse1 ", what, " expects an NPU (PrivateUse1) device.");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Quantized tensors do not support pin_memory.");
  const auto l = layout.value_or(c10::Layout::Strided);
  TORCH_CHECK(l == c10::Layout::Strided, "Quantized tensors only support strided layout, got ", l);
  TORCH_CHECK(dtype.has_value(), "Must provide dtype for quantized ", what, ".");
  TORCH_CHECK(c10::isQIntType(*dtype), what, " on QuantizedPrivateUse1 expects a quantized dtype, got ", *dtype);
  return at::TensorOptions().dtype(dtype).layout(l).device(c10::Device(kNPU, npu_index(device)));
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  auto options = quantized_options("empty.memory_format", dtype, layout, device, pin_memory);
  if (memory_format.has_value()) options = options.memory_format(*memory_format);
  c10::DeviceGuard guard(options.device());
  return at::new_qtensor(C10_AS_INTARRAYREF_SLOW(size), options, at::make_unknown_quantizer(*dtype));
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const auto options = quantized_options("empty_strided", dtype, layout, device, pin_memory);
  c10::DeviceGuard guard(options.device());
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  const auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  TORCH_CHECK(sizes.size() == strides.size(), "empty_strided: mismatch in length of strides and shape");
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize());
  at::Tensor t = at::new_qtensor({static_cast<int64_t>(nbytes / options.dtype().itemsize())}, options,
                                 at::make_unknown_quantizer(*dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, 0);
  return t;
}

// A new quantized tensor with `like`'s sizes and quantizer (its dtype unless `dtype`).
at::Tensor new_like(const at::Tensor& like, at::TensorOptions options) {
  at::QuantizerPtr quantizer = like.quantizer();
  const auto qtype = options.dtype().toScalarType();
  if (qtype != like.scalar_type()) {
    TORCH_CHECK(like.qscheme() == at::kPerTensorAffine, "empty_like: a per-channel quantized tensor keeps its dtype ",
                like.scalar_type(), ", got ", qtype);
    quantizer = at::make_per_tensor_affine_quantizer(like.q_scale(), like.q_zero_point(), qtype);
  }
  c10::DeviceGuard guard(options.device());
  return at::new_qtensor(like.sizes(), options, std::move(quantizer));
}

at::Tensor empty_like(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin_memory,
                      std::optional<at::MemoryFormat> memory_format) {
  auto options = self.options()
                     .merge_in(at::TensorOptions().dtype(dtype).layout(layout).device(device).pinned_memory(pin_memory))
                     .merge_memory_format(memory_format);
  auto format = options.memory_format_opt().value_or(at::MemoryFormat::Preserve);
  if (format == at::MemoryFormat::Preserve) format = self.suggest_memory_format();
  options = options.memory_format(format);
  if (!c10::isQIntType(options.dtype().toScalarType())) return at::empty(self.sizes(), options);
  TORCH_CHECK(options.device().type() == kNPU, "QuantizedPrivateUse1 empty_like expects an NPU (PrivateUse1) device.");
  return new_like(self, options);
}

at::Tensor clone(const at::Tensor& self, std::optional<at::MemoryFormat> memory_format) {
  auto format = memory_format.value_or(at::MemoryFormat::Contiguous);
  if (format == at::MemoryFormat::Preserve) format = self.suggest_memory_format();
  at::Tensor out = new_like(self, self.options().memory_format(format));
  integer_view(out).copy_(integer_view(self));
  return out;
}

at::Tensor contiguous(const at::Tensor& self, at::MemoryFormat memory_format) {
  TORCH_CHECK(memory_format == at::MemoryFormat::Contiguous,
              "NPU quantized contiguous supports Contiguous memory format only.");
  if (self.is_contiguous(memory_format)) return self;
  return clone(self, memory_format);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) { return at::native::view_symint(self, size); }

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::native::as_strided_qtensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                            offset.has_value() ? std::optional<int64_t>(offset->expect_int())
                                                               : std::nullopt);
}

at::Tensor ravel(const at::Tensor& self) { return self.contiguous().view({-1}); }

at::Tensor flip(const at::Tensor& self, at::IntArrayRef dims) {
  TORCH_CHECK(!sub_byte(self.scalar_type()), "flip is not supported for tensor with data type ", self.scalar_type());
  (void)at::dim_list_to_bitset(dims, self.dim());
  TORCH_CHECK(self.qscheme() == at::kPerTensorAffine,
              "Setting strides is possible only on uniformly quantized tensor");
  at::Tensor out = new_like(self, self.options().memory_format(self.suggest_memory_format()));
  integer_view(out).copy_(at::flip(integer_view(self), dims));
  return out;
}

// Quantized -> quantized copies (the others are refused by copy_ before they get here): the
// destination takes the source's quantizer, the bytes move through the integer views (host
// <-> device or device <-> device, ops/src/native_kernels.cpp).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.is_quantized() && dst.is_quantized(),
              "Copying from quantized Tensor to non-quantized Tensor is not allowed, please use dequantize to get a "
              "float Tensor from a quantized Tensor");
  TORCH_CHECK(self.numel() == dst.numel(), "QuantizedPrivateUse1 _copy_from: numel mismatch.");
  TORCH_CHECK(self.scalar_type() == dst.scalar_type(), "QuantizedPrivateUse1 _copy_from: quantized dtype mismatch.");
  const auto scheme = self.qscheme();
  TORCH_CHECK(scheme == at::kPerTensorAffine || scheme == at::kPerChannelAffine,
              "QuantizedPrivateUse1 _copy_from: unsupported qscheme for NPU int_repr copy path.");
  at::set_quantizer_(dst, self.quantizer());
  integer_view(dst).copy_(integer_view(self).reshape(dst.sizes()), non_blocking);
  return dst;
}

}  // namespace
}  // namespace torch_npu::ops

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_tensor_affine_stub, &torch_npu::ops::quantize_per_tensor_npu)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_tensor_affine_stub, &torch_npu::ops::dequantize_per_tensor_npu)
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_channel_affine_stub, &torch_npu::ops::quantize_per_channel_npu)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_channel_affine_stub, &torch_npu::ops::dequantize_per_channel_npu)
}  // namespace at::native

namespace torch_npu::ops {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("quantize_per_tensor", TORCH_FN(quantize_per_tensor));
  m.impl("quantize_per_channel", TORCH_FN(quantize_per_channel));
}

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("int_repr", TORCH_FN(int_repr));
  m.impl("dequantize.self", TORCH_FN(dequantize));
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("empty_like", TORCH_FN(empty_like));
  m.impl("clone", TORCH_FN(clone));
  m.impl("contiguous", TORCH_FN(contiguous));
  m.impl("view", TORCH_FN(view));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("ravel", TORCH_FN(ravel));
  m.impl("flip", TORCH_FN(flip));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));
  m.impl("q_zero_point", TORCH_FN(at::native::q_zero_point_quant));
  m.impl("q_per_channel_scales", TORCH_FN(at::native::q_per_channel_scales));
  m.impl("q_per_channel_zero_points", TORCH_FN(at::native::q_per_channel_zero_points));
  m.impl("q_per_channel_axis", TORCH_FN(at::native::q_per_channel_axis));
  m.impl("qscheme", TORCH_FN(at::native::qscheme_quant));
}

}  // namespace torch_npu::ops
