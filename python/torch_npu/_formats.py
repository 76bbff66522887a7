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


def install(module) -> None:
    """Sets ``module.Format`` and ``module.get_npu_format`` (the enum-returning one)."""
    module.Format = Format
    module.get_npu_format = get_npu_format


# Shapes for torch.compile / FakeTensorMode: a cast keeps the tensor's shape and dtype.
_fake = torch.library.register_fake


@_fake("npu::npu_format_cast")
def _npu_format_cast(self, acl_format, *, customize_dtype=None, input_dtype=None):
    return torch.empty_like(self)


@_fake("npu::_npu_format_cast")
def _npu_format_cast_internal(self, acl_format):
    return torch.empty_like(self)
