// NPU storage formats (torch_npu.Format): the physical layout of a storage.
//
// Ascend kernels keep some tensors in tiled layouts: FRACTAL_NZ (16x16 fractals of a
// matrix, for the cube unit), NC1HWC0 (channels split in blocks of 16), FRACTAL_Z
// (convolution weights), ... torch_npu records the layout in the storage, next to the
// logical ("base") ND shape the storage holds. Here the same: a storage cast to a tiled
// format is a FormattedStorage, whose bytes really are the tiled, zero-padded layout
// and whose size is torch_npu's (dimensions rounded up to the block). Every tensor on
// it keeps sizes, strides and offset in terms of the contiguous base array, so views
// of it stay meaningful; kernels read such a tensor through an untiled copy of the
// base array and write back by tiling it again (zero_copy.cpp's AliasMap).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>

#include <string>

namespace torch_npu::ops {

// ACL format numbers, as torch_npu.Format.
enum AclFormat : int64_t {
  kFormatNCHW = 0,
  kFormatNHWC = 1,
  kFormatND = 2,
  kFormatNC1HWC0 = 3,
  kFormatFractalZ = 4,
  kFormatNDHWC = 27,
  kFormatFractalNZ = 29,
  kFormatNCDHW = 30,
  kFormatNDC1HWC0 = 32,
  kFormatFractalZ3D = 33,
  kFormatNC = 35,
  kFormatNCL = 47,
};

using FormatSizes = c10::SmallVector<int64_t, 6>;

// A storage with an NPU storage format other than plain ND.
struct FormattedStorage final : public c10::StorageImpl {
  FormattedStorage(size_t nbytes, c10::DataPtr data, c10::Allocator* allocator, int64_t format,
                   FormatSizes base_sizes, at::ScalarType dtype, int64_t c0);

  int64_t format;          // an AclFormat
  FormatSizes base_sizes;  // the ND array the storage holds
  at::ScalarType dtype;    // of its elements (tiling is in elements)
  int64_t c0;              // FRACTAL_NZ: elements per fractal row (32 bytes' worth)

  // The physical layout differs from the base array's (NZ, NC1HWC0, ...); NCHW, NHWC,
  // ND, ... are labels over plain bytes.
  bool tiled() const;
  // Bytes of the base array, untiled.
  size_t base_nbytes() const;
  // Forget the format: the storage now holds plain bytes (a kernel resized it).
  void become_nd();
};

// A plain ND storage made as bytes (torch.UntypedStorage(n, device="npu"), a storage moved to
// npu; c10's make_storage_impl for PrivateUse1). As torch_npu's storage desc, it takes its ND
// shape from the first set_ onto it: that set_'s sizes when it covers the whole storage
// contiguously from offset 0, else the 1-D element count (set_(storage), storage.copy_).
// A FRACTAL_NZ cast of a tensor on a storage whose shape is 1-D keeps ND, as in torch_npu.
struct ByteStorage final : public c10::StorageImpl {
  using c10::StorageImpl::StorageImpl;
  bool desc_set = false;
  FormatSizes desc_sizes;
};
// Records the first set_ onto a ByteStorage (no-op for other storages).
void note_set_storage(const at::Tensor& self);

// The descriptor of `storage`, or nullptr for a storage in plain ND.
const FormattedStorage* formatted(const c10::StorageImpl* storage);
FormattedStorage* formatted(c10::StorageImpl* storage);
// The descriptor of t's storage if its bytes are tiled, else nullptr.
const FormattedStorage* tiled_storage(const at::Tensor& t);

// FRACTAL_NZ's row block: 32 bytes of 16-bit elements (float32 counts as float16, as
// torch_npu does), 32 for 1-byte types; 32 bytes of customize_dtype if given.
int64_t nz_c0(at::ScalarType dtype, std::optional<int64_t> customize_dtype);
// The physical shape of `base_sizes` in `format` (torch_npu's storage sizes).
FormatSizes storage_sizes(int64_t format, c10::IntArrayRef base_sizes, int64_t c0);
// The format a cast to `format` gives a tensor of `dim` dimensions (NZ needs >= 2).
int64_t effective_format(int64_t format, int64_t dim);
std::string format_name(int64_t format);
// torch_npu's storage description: the physical shape of t's storage (t an npu tensor).
FormatSizes npu_storage_sizes(const at::Tensor& t);
// torch.npu.config.allow_internal_format (option ALLOW_INTERNAL_FORMAT): whether
// unsafe_empty_with_format may create internal (tiled) formats without keep_format.
bool allow_internal_format();
void set_allow_internal_format(bool allow);

// Untiled copy of the whole storage into `nd` (base_nbytes(), host-accessible), and
// back. Callers order them with the kernels using the storage (stream order).
void untile(const FormattedStorage& storage, void* nd);
void tile(FormattedStorage& storage, const void* nd);

// The storage format of an npu tensor (torch_npu.get_npu_format).
int64_t npu_format_of(const at::Tensor& t);

// torch_npu.npu_format_cast without autograd: self's values in a storage of
// `acl_format` (self itself if it has that format already).
at::Tensor format_cast(const at::Tensor& self, int64_t acl_format,
                       std::optional<int64_t> customize_dtype = std::nullopt);

}  // namespace torch_npu::ops
