"""NPU storage formats: ``torch_npu.Format`` and the Python side of the format operators.

``torch_npu.npu_format_cast(t, acl_format)`` stores ``t``'s values in a physical layout of
the Ascend kernels (FRACTAL_NZ, NC1HWC0, ...; ops/src/formats.cpp); ``get_npu_format``
tells a tensor's format. Operators take tensors in any format and give the values they
would give in ND.
"""
from __future__ import annotations

from enum import IntEnum

import torch


class Format(IntEnum):
    """NPU storage format (ACL format numbers)."""
    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47
    FRACTAL_NZ_C0_16 = 50
    FRACTAL_NZ_C0_32 = 51
    FRACTAL_NZ_C0_2 = 52
    FRACTAL_NZ_C0_4 = 53
    FRACTAL_NZ_C0_8 = 54

    def __str__(self):
        return self.name


def get_npu_format(tensor: torch.Tensor) -> Format:
    """The storage format of an npu tensor, as a :class:`Format` (an ``int``)."""
    return Format(torch.ops.npu.get_npu_format(tensor))


# The formats whose storage holds a tiled layout (the others are ND with a label).
_TILED = (Format.NC1HWC0, Format.FRACTAL_Z, Format.FRACTAL_NZ, Format.NDC1HWC0, Format.FRACTAL_Z_3D)


def _deepcopy_keeps_format(original):
    """``Tensor.__deepcopy__`` copies the storage's bytes into a plain (ND) storage; torch_npu's
    copy of a tensor in a tiled format keeps the format. For a tensor that is its whole
    storage, the copy of the storage is made in the tensor's format and registered in the
    memo first, so ``Tensor.__deepcopy__`` (and the deep copies of views of the same storage
    in the same ``deepcopy``) use it. A view of a tiled storage copied alone is copied in ND."""

    def __deepcopy__(self, memo):
        if (self.device.type == "npu" and not self.is_sparse and torch._C._has_storage(self)
                and self.storage_offset() == 0 and self.is_contiguous()):
            fmt = torch.ops.npu.get_npu_format(self)
            storage = self.untyped_storage()
            storages = memo.setdefault("torch", {})
            if fmt in _TILED and storage._cdata not in storages:
                whole = torch.ops.npu.empty_with_format(self.shape, dtype=self.dtype, device=self.device,
                                                        acl_format=fmt)
                if whole.untyped_storage().nbytes() == storage.nbytes():
                    with torch.no_grad():
                        nd = torch.empty(self.shape, dtype=self.dtype, device=self.device)
                        nd.copy_(self)
                        storages[storage._cdata] = torch.ops.npu.npu_format_cast(nd, fmt).untyped_storage()
        return original(self, memo)

    __deepcopy__.__doc__ = original.__doc__
    return __deepcopy__


def install(module) -> None:
    """Sets ``module.Format`` and ``module.get_npu_format`` (the enum-returning one), and makes
    ``copy.deepcopy`` of an npu tensor keep its tiled format (as torch_npu's)."""
    module.Format = Format
    module.get_npu_format = get_npu_format
    if not getattr(torch.Tensor.__deepcopy__, "_npu_keeps_format", False):
        torch.Tensor.__deepcopy__ = _deepcopy_keeps_format(torch.Tensor.__deepcopy__)
        torch.Tensor.__deepcopy__._npu_keeps_format = True


# Shapes for torch.compile / FakeTensorMode: a cast keeps the tensor's shape and dtype.
_fake = torch.library.register_fake


@_fake("npu::npu_format_cast")
def _npu_format_cast(self, acl_format, *, customize_dtype=None, input_dtype=None):
    return torch.empty_like(self)


@_fake("npu::_npu_format_cast")
def _npu_format_cast_internal(self, acl_format):
    return torch.empty_like(self)
