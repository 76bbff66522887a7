// NPU storage formats: the tiled layouts, their conversions, and the torch_npu
// operators that expose them (npu_format_cast, get_npu_format, empty_with_format).
#include "torch_npu/ops/formats.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <torch/autograd.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>
#include <torch/library.h>

#include <atomic>
#include <numeric>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

namespace torch_npu::ops {
namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;
constexpr int64_t kBlock = 16;  // fractal side; C0 of the NC1HWC0 family

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

bool is_label(int64_t format) {
  switch (format) {
    case kFormatNCHW:
    case kFormatNHWC:
    case kFormatND:
    case kFormatNDHWC:
    case kFormatNCDHW:
    case kFormatNC:
    case kFormatNCL:
      return true;
    default:
      return false;
  }
}

// The plain format an internal one tiles (torch_npu's FormatHelper::GetBaseFormat).
int64_t base_format(int64_t format) {
  switch (format) {
    case kFormatNC1HWC0:
    case kFormatFractalZ:
      return kFormatNCHW;
    case kFormatNDC1HWC0:
    case kFormatFractalZ3D:
      return kFormatNCDHW;
    case kFormatFractalNZ:
      return kFormatND;
    default:
      return format;
  }
}

std::atomic<bool> g_allow_internal_format{false};

bool is_tiled_format(int64_t format) {
  switch (format) {
    case kFormatNC1HWC0:
    case kFormatFractalZ:
    case kFormatFractalNZ:
    case kFormatNDC1HWC0:
    case kFormatFractalZ3D:
      return true;
    default:
      return false;
  }
}

// NC1HWC0 and FRACTAL_Z read a tensor of fewer than 4 dims as torch_npu does:
// [C] -> [1,C,1,1], [C,H] -> [1,C,H,1], [C,H,W] -> [1,C,H,W].
FormatSizes as_nchw(c10::IntArrayRef b) {
  switch (b.size()) {
    case 0: return {1, 1, 1, 1};
    case 1: return {1, b[0], 1, 1};
    case 2: return {1, b[0], b[1], 1};
    case 3: return {1, b[0], b[1], b[2]};
    default: return FormatSizes(b.begin(), b.end());
  }
}

// How a format lays out its base array: the base read in the format's dimensions
// (`logical`), padded to whole blocks (`padded`), each blocked dimension split into
// (blocks, block) (`split`), and the order of the split dimensions in memory (`perm`).
struct Tiling {
  FormatSizes logical, padded, split, perm;
};

Tiling tiling_of(int64_t format, c10::IntArrayRef base, int64_t c0) {
  Tiling t;
  switch (format) {
    case kFormatFractalNZ: {
      // [..., m, n] -> [..., n/c0, m/16, 16, c0] (nz_c0 below).
      t.logical.assign(base.begin(), base.end());
      const size_t k = base.size() - 2;
      const int64_t m = base[k], n = base[k + 1];
      t.padded = t.logical;
      t.padded[k] = blocks(m, kBlock) * kBlock;
      t.padded[k + 1] = blocks(n, c0) * c0;
      t.split.assign(base.begin(), base.begin() + k);
      t.split.append({blocks(m, kBlock), kBlock, blocks(n, c0), c0});
      for (size_t i = 0; i < k; ++i) t.perm.push_back(static_cast<int64_t>(i));
      const int64_t K = static_cast<int64_t>(k);
      t.perm.append({K + 2, K, K + 1, K + 3});
      return t;
    }
    case kFormatNC1HWC0: {  // [N,C,H,W] -> [N, C/16, H, W, 16]
      t.logical = as_nchw(base);
      const auto& l = t.logical;
      t.padded = {l[0], blocks(l[1], kBlock) * kBlock, l[2], l[3]};
      t.split = {l[0], blocks(l[1], kBlock), kBlock, l[2], l[3]};
      t.perm = {0, 1, 3, 4, 2};
      return t;
    }
    case kFormatFractalZ: {  // [N,C,H,W] -> [C/16 * H * W, N/16, 16 (n), 16 (c)]
      t.logical = as_nchw(base);
      const auto& l = t.logical;
      t.padded = {blocks(l[0], kBlock) * kBlock, blocks(l[1], kBlock) * kBlock, l[2], l[3]};
      t.split = {blocks(l[0], kBlock), kBlock, blocks(l[1], kBlock), kBlock, l[2], l[3]};
      t.perm = {2, 4, 5, 0, 1, 3};
      return t;
    }
    case kFormatNDC1HWC0: {  // [N,C,D,H,W] -> [N, D, C/16, H, W, 16]
      t.logical.assign(base.begin(), base.end());
      const auto& l = t.logical;
      t.padded = {l[0], blocks(l[1], kBlock) * kBlock, l[2], l[3], l[4]};
      t.split = {l[0], blocks(l[1], kBlock), kBlock, l[2], l[3], l[4]};
      t.perm = {0, 3, 1, 4, 5, 2};
      return t;
    }
    case kFormatFractalZ3D: {  // [N,C,D,H,W] -> [D * C/16 * H * W, N/16, 16 (n), 16 (c)]
      t.logical.assign(base.begin(), base.end());
      const auto& l = t.logical;
      t.padded = {blocks(l[0], kBlock) * kBlock, blocks(l[1], kBlock) * kBlock, l[2], l[3], l[4]};
      t.split = {blocks(l[0], kBlock), kBlock, blocks(l[1], kBlock), kBlock, l[2], l[3], l[4]};
      t.perm = {4, 2, 5, 6, 0, 1, 3};
      return t;
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "no tiling for format ", format);
  }
}

FormatSizes permuted(const FormatSizes& sizes, const FormatSizes& perm) {
  FormatSizes out;
  for (int64_t p : perm) out.push_back(sizes[p]);
  return out;
}

FormatSizes inverse(const FormatSizes& perm) {
  FormatSizes inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

int64_t product(c10::IntArrayRef sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<int64_t>());
}

// The tiled bytes of `s`, in split order (padded array, blocks apart).
at::Tensor split_view(const FormattedStorage& s, const Tiling& t) {
  at::Tensor physical = at::from_blob(const_cast<void*>(s.data()), permuted(t.split, t.perm),
                                      at::TensorOptions().dtype(s.dtype));
  return physical.permute(inverse(t.perm));
}

// The base array's region of a padded array.
at::Tensor unpadded(at::Tensor padded, c10::IntArrayRef logical) {
  for (size_t d = 0; d < logical.size(); ++d) padded = padded.narrow(static_cast<int64_t>(d), 0, logical[d]);
  return padded;
}

}  // namespace

FormattedStorage::FormattedStorage(size_t nbytes, c10::DataPtr data, c10::Allocator* allocator, int64_t format,
                                   FormatSizes base_sizes, at::ScalarType dtype, int64_t c0)
    : c10::StorageImpl(c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(nbytes), std::move(data), allocator,
                       /*resizable=*/true),
      format(format),
      base_sizes(std::move(base_sizes)),
      dtype(dtype),
      c0(c0) {}

bool FormattedStorage::tiled() const { return is_tiled_format(format); }

size_t FormattedStorage::base_nbytes() const {
  return static_cast<size_t>(product(base_sizes)) * c10::elementSize(dtype);
}

void FormattedStorage::become_nd() {
  format = kFormatND;
  base_sizes = {static_cast<int64_t>(nbytes() / c10::elementSize(dtype))};
}

namespace {

c10::intrusive_ptr<c10::StorageImpl> make_byte_storage(c10::StorageImpl::use_byte_size_t, c10::SymInt size_bytes,
                                                       c10::DataPtr data_ptr, c10::Allocator* allocator,
                                                       bool resizable) {
  if (data_ptr == nullptr) data_ptr = allocator->allocate(size_bytes.expect_int());
  return c10::make_intrusive<ByteStorage>(c10::StorageImpl::use_byte_size_t(), std::move(size_bytes),
                                          std::move(data_ptr), allocator, resizable);
}

const bool kByteStorageRegistered = [] {
  c10::SetStorageImplCreate(c10::DeviceType::PrivateUse1, &make_byte_storage);
  return true;
}();

}  // namespace

void note_set_storage(const at::Tensor& self) {
  auto* storage = self.storage().unsafeGetStorageImpl();
  if (storage == nullptr || typeid(*storage) != typeid(ByteStorage)) return;
  auto* bytes = static_cast<ByteStorage*>(storage);
  if (bytes->desc_set) return;
  bytes->desc_set = true;
  const auto n = static_cast<int64_t>(storage->nbytes()) / static_cast<int64_t>(self.itemsize());
  if (self.storage_offset() == 0 && self.is_contiguous() && self.numel() == n) {
    bytes->desc_sizes.assign(self.sizes().begin(), self.sizes().end());
  } else {
    bytes->desc_sizes = {n};
  }
}

const FormattedStorage* formatted(const c10::StorageImpl* storage) {
  return storage != nullptr && typeid(*storage) == typeid(FormattedStorage)
             ? static_cast<const FormattedStorage*>(storage)
             : nullptr;
}

FormattedStorage* formatted(c10::StorageImpl* storage) {
  return const_cast<FormattedStorage*>(formatted(static_cast<const c10::StorageImpl*>(storage)));
}

const FormattedStorage* tiled_storage(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const FormattedStorage* f = formatted(t.storage().unsafeGetStorageImpl());
  return f != nullptr && f->tiled() ? f : nullptr;
}

bool allow_internal_format() { return g_allow_internal_format.load(std::memory_order_relaxed); }
void set_allow_internal_format(bool allow) { g_allow_internal_format.store(allow, std::memory_order_relaxed); }

FormatSizes npu_storage_sizes(const at::Tensor& self) {
  const c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (const auto* f = formatted(storage)) return storage_sizes(f->format, f->base_sizes, f->c0);
  const int64_t itemsize = static_cast<int64_t>(self.itemsize());
  const int64_t elements = itemsize > 0 ? static_cast<int64_t>(storage->nbytes()) / itemsize : 0;
  // A tensor viewing its whole storage contiguously from the start describes it.
  if (self.is_contiguous() && self.storage_offset() == 0 && self.numel() == elements)
    return FormatSizes(self.sizes().begin(), self.sizes().end());
  return {elements};
}

std::string format_name(int64_t format) {
  switch (format) {
    case kFormatNCHW: return "NCHW";
    case kFormatNHWC: return "NHWC";
    case kFormatND: return "ND";
    case kFormatNC1HWC0: return "NC1HWC0";
    case kFormatFractalZ: return "FRACTAL_Z";
    case kFormatNDHWC: return "NDHWC";
    case kFormatFractalNZ: return "FRACTAL_NZ";
    case kFormatNCDHW: return "NCDHW";
    case kFormatNDC1HWC0: return "NDC1HWC0";
    case kFormatFractalZ3D: return "FRACTAL_Z_3D";
    case kFormatNC: return "NC";
    case kFormatNCL: return "NCL";
    default: return std::to_string(format);
  }
}

int64_t effective_format(int64_t format, int64_t dim) {
  TORCH_CHECK(is_label(format) || is_tiled_format(format), "npu_format_cast: acl_format ", format,
              " is not a storage format the NPU simulator has; it has ND (2), NCHW (0), NHWC (1), NC1HWC0 (3), "
              "FRACTAL_Z (4), NDHWC (27), FRACTAL_NZ (29), NCDHW (30), NDC1HWC0 (32), FRACTAL_Z_3D (33), NC (35), "
              "NCL (47)");
  // A vector or a scalar has no matrix to tile: torch_npu keeps it ND.
  if (format == kFormatFractalNZ && dim < 2) return kFormatND;
  if (format == kFormatNC1HWC0 || format == kFormatFractalZ) {
    TORCH_CHECK(dim <= 4, "npu_format_cast: ", format_name(format), " takes tensors of at most 4 dimensions, got ",
                dim);
  }
  if (format == kFormatNDC1HWC0 || format == kFormatFractalZ3D) {
    TORCH_CHECK(dim == 5, "npu_format_cast: ", format_name(format), " takes 5-dimensional (NCDHW) tensors, got ", dim,
                " dimensions");
  }
  return format;
}

int64_t nz_c0(at::ScalarType dtype, std::optional<int64_t> customize_dtype) {
  if (!customize_dtype.has_value()) return c10::elementSize(dtype) == 1 ? 32 : 16;
  TORCH_CHECK(*customize_dtype >= 0 && *customize_dtype < static_cast<int64_t>(at::ScalarType::NumOptions),
              "npu_format_cast: customize_dtype ", *customize_dtype, " is not a dtype number");
  const auto custom = static_cast<at::ScalarType>(*customize_dtype);
  const size_t size = c10::elementSize(custom);
  TORCH_CHECK(size >= 1 && size <= 8, "npu_format_cast: customize_dtype ", custom, " has no FRACTAL_NZ block");
  return 32 / static_cast<int64_t>(size);
}

FormatSizes storage_sizes(int64_t format, c10::IntArrayRef base, int64_t c0) {
  if (!is_tiled_format(format)) return FormatSizes(base.begin(), base.end());
  const Tiling t = tiling_of(format, base, c0);
  FormatSizes physical = permuted(t.split, t.perm);
  if (format == kFormatFractalZ || format == kFormatFractalZ3D) {
    // torch_npu reports the fractal's outer dimensions as one.
    const size_t outer = physical.size() - 3;
    const int64_t merged = product(c10::IntArrayRef(physical).slice(0, outer));
    return {merged, physical[outer], physical[outer + 1], physical[outer + 2]};
  }
  return physical;
}

void untile(const FormattedStorage& s, void* nd) {
  const Tiling t = tiling_of(s.format, s.base_sizes, s.c0);
  at::Tensor out = at::from_blob(nd, t.logical, at::TensorOptions().dtype(s.dtype));
  out.copy_(unpadded(split_view(s, t).reshape(t.padded), t.logical));
}

void tile(FormattedStorage& s, const void* nd) {
  const Tiling t = tiling_of(s.format, s.base_sizes, s.c0);
  at::Tensor in = at::from_blob(const_cast<void*>(nd), t.logical, at::TensorOptions().dtype(s.dtype));
  at::Tensor padded = at::zeros(t.padded, in.options());  // the padding holds zeros, as on Ascend
  unpadded(padded, t.logical).copy_(in);
  split_view(s, t).copy_(padded.view(t.split));
}

int64_t npu_format_of(const at::Tensor& t) {
  const FormattedStorage* f = t.has_storage() ? formatted(t.storage().unsafeGetStorageImpl()) : nullptr;
  return f != nullptr ? f->format : kFormatND;
}

namespace {

void check_npu(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.defined() && t.device().type() == kNPU, op, ": expected '", arg, "' to be an npu tensor, got ",
              t.defined() ? t.device().str() : std::string("an undefined tensor"));
}

// An npu tensor of `sizes` whose storage is in `format` (already effective).
at::Tensor empty_formatted(c10::IntArrayRef sizes, at::ScalarType dtype, c10::DeviceIndex device, int64_t format,
                           int64_t c0) {
  for (int64_t s : sizes) TORCH_CHECK(s >= 0, "empty_with_format: negative dimension ", s, " in size ", sizes);
  c10::DeviceGuard guard(c10::Device(kNPU, device));
  const FormatSizes physical = storage_sizes(format, sizes, c0);
  const size_t nbytes = static_cast<size_t>(product(physical)) * c10::elementSize(dtype);
  c10::Allocator* allocator = NPUCachingAllocator::get();
  auto storage = c10::make_intrusive<FormattedStorage>(nbytes, allocator->allocate(nbytes), allocator, format,
                                                      FormatSizes(sizes.begin(), sizes.end()), dtype, c0);
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(std::move(storage)),
                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                   c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_contiguous(sizes);
  return at::Tensor(std::move(impl));
}

at::Tensor empty_with_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin_memory, int64_t acl_format,
                             std::optional<int64_t> base_addr_aligned_kb) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "empty_with_format: only strided tensors, got layout ",
              *layout);
  const c10::Device d = device.value_or(c10::Device(kNPU));
  TORCH_CHECK(d.type() == kNPU, "empty_with_format: expected an npu device, got ", d);
  const c10::DeviceIndex index = d.has_index() ? d.index() : current_device();
  check_device_index(index);
  const at::ScalarType type = dtype.value_or(c10::get_default_dtype_as_scalartype());
  const int64_t format = effective_format(acl_format, static_cast<int64_t>(size.size()));
  if (format == kFormatND) {
    return at::empty(size, at::TensorOptions().dtype(type).device(kNPU, index));
  }
  return empty_formatted(size, type, index, format, nz_c0(type, std::nullopt));
}

}  // namespace

// The cast itself: a storage in `format` holding what self's storage holds. A tensor
// on a formatted storage keeps its geometry (views stay views, as in torch_npu); one
// on a plain storage is copied as it appears.
at::Tensor format_cast(const at::Tensor& self, int64_t acl_format, std::optional<int64_t> customize_dtype) {
  check_npu(self, "npu_format_cast", "self");
  const FormattedStorage* src = formatted(self.storage().unsafeGetStorageImpl());
  const bool geometry_of_base = src != nullptr;
  const c10::IntArrayRef base = geometry_of_base ? c10::IntArrayRef(src->base_sizes) : self.sizes();
  const int64_t format = effective_format(acl_format, static_cast<int64_t>(base.size()));
  TORCH_CHECK(!geometry_of_base || c10::elementSize(src->dtype) == self.itemsize(), "npu_format_cast: a ",
              self.scalar_type(), " view of a ", src->dtype, " storage in ", format_name(src->format),
              " cannot be cast; cast the tensor it views");
  const at::ScalarType dtype = geometry_of_base ? src->dtype : self.scalar_type();
  // customize_dtype sets FRACTAL_NZ's block (32 bytes of that dtype), as on Ascend.
  const int64_t c0 = nz_c0(dtype, customize_dtype);
  if (npu_format_of(self) == format && (format != kFormatFractalNZ || src->c0 == c0)) return self;
  if (format == kFormatFractalNZ && !geometry_of_base) {
    const auto* storage = self.storage().unsafeGetStorageImpl();
    if (typeid(*storage) == typeid(ByteStorage)) {
      const auto* bytes = static_cast<const ByteStorage*>(storage);
      if (bytes->desc_set && bytes->desc_sizes.size() < 2) return self;  // torch_npu keeps ND
    }
  }
  at::Tensor dst = format == kFormatND ? at::empty(base, self.options().dtype(dtype))
                                       : empty_formatted(base, dtype, self.device().index(), format, c0);
  if (geometry_of_base) {
    // The whole base array, then self's view of it.
    FormatSizes strides(base.size(), 1);
    for (int64_t d = static_cast<int64_t>(base.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * base[d + 1];
    at::Tensor whole = self.as_strided(base, strides, 0);
    if (whole.scalar_type() != dtype) whole = whole.view(dtype);
    dst.copy_(whole);
    dst = dst.as_strided(self.sizes(), self.strides(), self.storage_offset());
    if (dst.scalar_type() != self.scalar_type()) dst = dst.view(self.scalar_type());
    return dst;
  }
  dst.copy_(self);
  return dst;
}

namespace {

using FormatCastFn = at::Tensor(const at::Tensor&, int64_t, std::optional<int64_t>, std::optional<int64_t>);

c10::TypedOperatorHandle<FormatCastFn> format_cast_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("npu::npu_format_cast", "").typed<FormatCastFn>();
  return op;
}

class FormatCast : public torch::autograd::Function<FormatCast> {
 public:
  // Through the dispatcher: below autograd, fake tensors (torch.compile) find their kernel.
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& self, int64_t acl_format,
                            std::optional<int64_t> customize_dtype, std::optional<int64_t> input_dtype) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return format_cast_op().call(self, acl_format, customize_dtype, input_dtype);
  }
  // The values are the input's: the gradient passes through (in ND).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// input_dtype reinterprets self's bytes (packed int4 and the like), which the simulator
// does not have: only self's own dtype is accepted.
void check_input_dtype(const at::Tensor& self, std::optional<int64_t> input_dtype) {
  TORCH_CHECK(!input_dtype.has_value() || *input_dtype == static_cast<int64_t>(self.scalar_type()),
              "npu_format_cast: input_dtype ", input_dtype.value_or(-1), " differs from self's dtype ",
              self.scalar_type(), "; reinterpreting storage bytes is not supported by the NPU simulator");
}

at::Tensor npu_format_cast(const at::Tensor& self, int64_t acl_format, std::optional<int64_t> customize_dtype,
                           std::optional<int64_t> input_dtype) {
  check_input_dtype(self, input_dtype);
  return format_cast(self, acl_format, customize_dtype);
}

at::Tensor npu_format_cast_autograd(const at::Tensor& self, int64_t acl_format, std::optional<int64_t> customize_dtype,
                                    std::optional<int64_t> input_dtype) {
  return FormatCast::apply(self, acl_format, customize_dtype, input_dtype);
}

// Casts to dst's format through the int overload (and its autograd).
at::Tensor npu_format_cast_like(const at::Tensor& self, const at::Tensor& dst, std::optional<int64_t> customize_dtype,
                                std::optional<int64_t> input_dtype) {
  check_npu(dst, "npu_format_cast", "dst");
  return format_cast_op().call(self, npu_format_of(dst), customize_dtype, input_dtype);
}

at::Tensor& npu_format_cast_inplace(at::Tensor& self, int64_t acl_format, std::optional<int64_t> customize_dtype,
                                    std::optional<int64_t> input_dtype) {
  at::Tensor cast = npu_format_cast(self, acl_format, customize_dtype, input_dtype);
  if (!cast.is_same(self)) {
    self.unsafeGetTensorImpl()->set_storage_keep_dtype(cast.storage());
    self.unsafeGetTensorImpl()->set_sizes_and_strides(cast.sizes(), cast.strides(), cast.storage_offset());
  }
  return self;
}

// torch_npu: copies src's values into self, which keeps its own format.
at::Tensor& npu_format_cast_from(at::Tensor& self, const at::Tensor& src, std::optional<int64_t> customize_dtype,
                                 std::optional<int64_t> input_dtype) {
  check_npu(self, "npu_format_cast_", "self");
  check_npu(src, "npu_format_cast_", "src");
  check_input_dtype(src, input_dtype);
  self.copy_(src);
  return self;
}

int64_t get_npu_format(const at::Tensor& self) {
  check_npu(self, "get_npu_format", "self");
  return npu_format_of(self);
}

at::Tensor npu_format_cast_internal(const at::Tensor& self, int64_t acl_format) { return format_cast(self, acl_format); }

at::Tensor npu_format_cast_internal_dtype(const at::Tensor& self, int64_t acl_format, int64_t customize_dtype) {
  return format_cast(self, acl_format, customize_dtype);
}

at::Tensor npu_format_cast_internal_input_dtype(const at::Tensor& self, int64_t acl_format, int64_t customize_dtype,
                                                int64_t input_dtype) {
  check_input_dtype(self, input_dtype);
  return format_cast(self, acl_format, customize_dtype);
}

int64_t get_storage_size(const at::Tensor& self) {
  check_npu(self, "get_storage_size", "self");
  return product(npu_storage_sizes(self));
}

// torch_npu's unsafe_empty_with_format: empty_with_format, except that an internal format
// is created only while allow_internal_format is on, or with keep_format (for kernels that
// need it); otherwise the base format is used, with a warning.
at::Tensor unsafe_empty_with_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                    std::optional<at::Layout> layout, std::optional<at::Device> device,
                                    std::optional<bool> pin_memory, int64_t acl_format, bool keep_format) {
  if (!keep_format && !allow_internal_format() && is_tiled_format(acl_format)) {
    acl_format = base_format(acl_format);
    TORCH_WARN_ONCE("Cannot create tensor with internal format while allow_internal_format=False, "
                    "tensor will be created with base format.");
  }
  return empty_with_format(size, dtype, layout, device, pin_memory, acl_format, std::nullopt);
}

// torch_npu's npu_change_data_ptr: dst's storage now starts `index` elements into src's
// (fused optimizers view their parameters in one flat buffer); dst's old memory returns to
// the caching allocator, and src's storage lives as long as dst's points into it. Unlike
// torch_npu's check (which adds the element index to a byte count), the whole of dst's
// storage must lie inside src's.
int64_t npu_change_data_ptr(const at::Tensor& dst, const at::Tensor& src, int64_t index) {
  check_npu(dst, "npu_change_data_ptr", "dst");
  check_npu(src, "npu_change_data_ptr", "src");
  TORCH_CHECK(index >= 0, "Expect offset(index) equal or greater than zero, got: ", index);
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), "Expect src and dst tensors having the same dtype, got: ",
              "src with dtype ", src.scalar_type(), ", dst with dtype ", dst.scalar_type());
  TORCH_CHECK(src.scalar_type() == at::kHalf || src.scalar_type() == at::kFloat || src.scalar_type() == at::kBFloat16,
              "Only supports src and dst tensors with dtype float32, float16 or bfloat16, got: ", src.scalar_type());
  TORCH_CHECK(src.device() == dst.device(), "npu_change_data_ptr: dst and src must be on one device, got ",
              dst.device(), " and ", src.device());
  const int64_t dst_size = product(npu_storage_sizes(dst));
  const int64_t src_size = product(npu_storage_sizes(src));
  TORCH_CHECK(index + dst_size <= src_size, "Offsets overflow, got: ", "offset(index) ", index,
              ", dst storage size ", dst_size, ", src storage size ", src_size);
  // Work queued on any stream may still read or write dst's present memory.
  wait_device(dst.device().index());
  char* data = static_cast<char*>(src.storage().mutable_data()) + index * static_cast<int64_t>(src.itemsize());
  auto* owner = new c10::Storage(src.storage());
  dst.storage().set_data_ptr_noswap(
      at::DataPtr(data, owner, [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, dst.device()));
  return 0;
}

// torch.save / torch.load. A storage's saved bytes are its base array's (what every
// view reads, zero_copy.h), so the values load right on any device; the format goes
// in the tensor's metadata and comes back when the tensor is loaded onto an npu.
constexpr const char* kFormatKey = "npu_format_/";

void save_format(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  const int64_t format = npu_format_of(t);
  if (format != kFormatND) metadata[kFormatKey + std::to_string(format)] = true;
}

void load_format(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (!value || key.rfind(kFormatKey, 0) != 0) continue;
    const int64_t format = std::stoll(key.substr(std::string(kFormatKey).size()));
    c10::DeviceGuard guard(t.device());
    // The saved format is restored whatever shape a byte storage took from the load's set_.
    auto* storage = t.storage().unsafeGetStorageImpl();
    if (storage != nullptr && typeid(*storage) == typeid(ByteStorage)) {
      auto* bytes = static_cast<ByteStorage*>(storage);
      bytes->desc_set = true;
      bytes->desc_sizes.assign(t.sizes().begin(), t.sizes().end());
    }
    at::Tensor cast = format_cast(t, format);
    // In place, below autograd: the tensor may already require grad.
    t.unsafeGetTensorImpl()->set_storage_keep_dtype(cast.storage());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(cast.sizes(), cast.strides(), cast.storage_offset());
  }
}

const bool kSerializationRegistered = [] {
  torch::jit::TensorBackendMetaRegistry(kNPU, &save_format, &load_format);
  return true;
}();

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("get_npu_format(Tensor self) -> int");
  m.def("npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None, int? input_dtype=None) -> Tensor");
  m.def(
      "npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, int? input_dtype=None) -> "
      "Tensor");
  m.def(
      "npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, int? customize_dtype=None, "
      "int? input_dtype=None) -> Tensor(a!)");
  m.def(
      "npu_format_cast_(Tensor(a!) self, Tensor src, *, int? customize_dtype=None, int? input_dtype=None) -> "
      "Tensor(a!)");
  m.def("_npu_format_cast(Tensor self, int acl_format) -> Tensor");
  m.def("_npu_format_cast.aclnn(Tensor self, int acl_format, int customize_dtype) -> Tensor");
  m.def("_npu_format_cast.input_dtype(Tensor self, int acl_format, int customize_dtype, int input_dtype) -> Tensor");
  m.def("get_storage_size(Tensor self) -> int");
  m.def("npu_change_data_ptr(Tensor dst, Tensor src, int index) -> int");
  m.def(
      "unsafe_empty_with_format(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None, int acl_format=2, bool keep_format=False) -> Tensor");
  m.def(
      "empty_with_format(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
      "bool? pin_memory=None, int acl_format=2, int? base_addr_aligned_kb=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_format_cast", TORCH_FN(npu_format_cast));
  m.impl("npu_format_cast_.acl_format", TORCH_FN(npu_format_cast_inplace));
  m.impl("npu_format_cast_", TORCH_FN(npu_format_cast_from));
  m.impl("_npu_format_cast", TORCH_FN(npu_format_cast_internal));
  m.impl("_npu_format_cast.aclnn", TORCH_FN(npu_format_cast_internal_dtype));
  m.impl("_npu_format_cast.input_dtype", TORCH_FN(npu_format_cast_internal_input_dtype));
  m.impl("get_storage_size", TORCH_FN(get_storage_size));
  m.impl("npu_change_data_ptr", TORCH_FN(npu_change_data_ptr));
}

// A cpu argument gets the kernels' own error naming it.
TORCH_LIBRARY_IMPL(npu, CPU, m) {
  m.impl("get_storage_size", TORCH_FN(get_storage_size));
  m.impl("npu_change_data_ptr", TORCH_FN(npu_change_data_ptr));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) {
  m.impl("npu_format_cast", TORCH_FN(npu_format_cast_autograd));
}

TORCH_LIBRARY_IMPL(npu, CompositeImplicitAutograd, m) {
  m.impl("npu_format_cast.Tensor", TORCH_FN(npu_format_cast_like));
}

// No tensor argument to dispatch on: the device argument decides.
TORCH_LIBRARY_IMPL(npu, CompositeExplicitAutograd, m) {
  m.impl("empty_with_format", TORCH_FN(empty_with_format));
  m.impl("unsafe_empty_with_format", TORCH_FN(unsafe_empty_with_format));
  m.impl("get_npu_format", TORCH_FN(get_npu_format));  // names the device of a cpu tensor
}

}  // namespace torch_npu::ops
