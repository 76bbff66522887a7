"""The legacy typed storages of the npu device: ``torch.npu.BoolStorage`` and friends.

As ``torch.cuda.FloatStorage``: ``torch.npu.FloatStorage(3)`` / ``FloatStorage([1., 2.])``
make a storage on the current npu, and ``isinstance(t.storage(), torch.npu.FloatStorage)``
holds for an npu float tensor. PyTorch's ``_LegacyStorage`` does the work; it finds the
device from the class's module name, hence ``__module__ = "torch_npu.npu"``.
"""
import torch
from torch.storage import _LegacyStorage, _warn_typed_storage_removal
from torch._utils import classproperty

from ._tensor_types import _DTYPES as _TENSOR_DTYPES

# The storage of each legacy tensor type: torch.npu.FloatStorage next to torch.npu.FloatTensor.
_DTYPES = {name[:-len("Tensor")] + "Storage": dtype for name, dtype in _TENSOR_DTYPES.items()}
__all__ = list(_DTYPES)


class _NpuLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for NPU storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for NPU storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for NPU storage")


_NpuLegacyStorage.__module__ = "torch_npu.npu"


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype_of(cls):
        return dtype

    def _public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    return type(name, (_NpuLegacyStorage,), {
        "__module__": "torch_npu.npu", "__qualname__": name,
        "dtype": classproperty(_public_dtype), "_dtype": classproperty(_dtype_of)})


for _name, _dt in _DTYPES.items():
    globals()[_name] = _make(_name, _dt)
del _name, _dt
