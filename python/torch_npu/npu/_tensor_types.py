"""The legacy tensor types of the npu device: ``torch.npu.FloatTensor`` and friends.

Like ``torch.cuda.FloatTensor``, each one is both a constructor with the legacy
signatures (``FloatTensor(2, 3)``, ``FloatTensor(torch.Size([2, 3]))``,
``FloatTensor([1., 2.])``, ``FloatTensor(100, device=1)``) and a type for
``isinstance`` (any npu tensor of that dtype) and ``Tensor.type(...)``.
"""
import torch

__all__ = ["ByteTensor", "CharTensor", "ShortTensor", "IntTensor", "LongTensor", "HalfTensor",
           "FloatTensor", "DoubleTensor", "BoolTensor", "BFloat16Tensor",
           "ComplexFloatTensor", "ComplexDoubleTensor"]

_DTYPES = {
    "ByteTensor": torch.uint8, "CharTensor": torch.int8, "ShortTensor": torch.int16,
    "IntTensor": torch.int32, "LongTensor": torch.int64, "HalfTensor": torch.float16,
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "BoolTensor": torch.bool,
    "BFloat16Tensor": torch.bfloat16, "ComplexFloatTensor": torch.complex64,
    "ComplexDoubleTensor": torch.complex128,
}


class _NpuTensorType(type):
    """Metaclass of the legacy types: construction and isinstance by device and dtype."""

    def __instancecheck__(cls, obj) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.device.type == "npu"
                and obj.layout == torch.strided and obj.dtype == cls.dtype)

    def __call__(cls, *args, device=None, **kwargs):
        if kwargs:
            raise TypeError(f"torch.npu.{cls.__qualname__}() got unexpected keyword arguments "
                            f"{sorted(kwargs)}; expected sizes, data, a tensor or a storage, and "
                            f"optionally device=")
        if device is None:
            device = torch.device("npu", torch.npu.current_device())
        else:
            device = torch.device("npu", device) if isinstance(device, int) else torch.device(device)
            if device.type != "npu":
                raise RuntimeError(f"torch.npu.{cls.__qualname__}(): argument 'device' must be an "
                                   f"npu device, got {device}")
        # Tensor.new has exactly the legacy constructor's signatures, with the options
        # (device, dtype) of the tensor it is called on.
        proto = torch.empty(0, dtype=cls.dtype, device=device)
        return proto.new(*args)


def _make(name: str, dtype: torch.dtype) -> type:
    # Tensor.type(t) reads the class's C-level name (tp_name): it must be the full
    # "torch.npu.FloatTensor", which setting __name__ gives; __qualname__ keeps repr short.
    cls = _NpuTensorType(name, (), {"dtype": dtype, "is_sparse": False, "is_npu": True,
                                    "__doc__": f"Legacy constructor and type of npu {dtype} tensors."})
    cls.__name__ = "torch.npu." + name
    cls.__qualname__ = name
    cls.__module__ = "torch.npu"
    return cls


for _name, _dtype in _DTYPES.items():
    globals()[_name] = _make(_name, _dtype)
del _name, _dtype
