"""Functions of Huawei's ``torch_npu._C`` that torch_npu's own code and its users call directly.

They are implemented here in Python over the public API and installed on ``torch_npu._C``
under torch_npu's names (see :func:`install`).
"""
import torch


def _npu_get_soc_version() -> int:
    """torch_npu's ``SocVersion`` number of the NPUs, e.g. 220 for Ascend910B1."""
    return torch.npu.get_soc_version()


def _get_cann_version(module: str) -> str:
    """The version of the CANN component ``module`` (``torch_npu.utils.get_cann_version``)."""
    from torch_npu.utils import get_cann_version

    return get_cann_version(module)


def _empty_strided_npu(sizes, strides, dtype):
    """An uninitialised tensor of ``sizes``/``strides``/``dtype`` on the current npu (the
    allocation Inductor's generated code calls)."""
    for name, value in (("sizes", sizes), ("strides", strides)):
        if not isinstance(value, (tuple, list, torch.Size)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(f"_empty_strided_npu(): argument '{name}' must be a tuple of ints, "
                            f"got {value!r}")
    if len(sizes) != len(strides):
        raise RuntimeError(f"_empty_strided_npu(): 'sizes' and 'strides' must have the same "
                           f"length, got {len(sizes)} and {len(strides)}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"_empty_strided_npu(): argument 'dtype' must be a torch.dtype, got "
                        f"{type(dtype).__name__}")
    device = torch.device("npu", torch.npu.current_device())
    return torch.empty_strided(sizes, strides, dtype=dtype, device=device)


def _weak_ref_tensor(tensor):
    """A new tensor over ``tensor``'s memory: same storage (so the same data pointer and
    storage format), sizes, strides and offset, without autograd history.

    torch_npu's returns a tensor that does not own the memory. Here it shares ``tensor``'s
    storage, so the memory also stays valid while only the new tensor is alive.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_weak_ref_tensor(): argument 'tensor' must be a Tensor, got "
                        f"{type(tensor).__name__}")
    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    with torch.no_grad():
        out.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())
    return out


def _npu_getCurrentRawStream(device_index: int) -> int:
    """The ``aclrtStream`` address of the current stream of npu ``device_index``."""
    return torch.npu.current_stream(device_index).npu_stream


# torch_npu's variant does not wait for its task queue to drain; nothing here waits either.
_npu_getCurrentRawStreamNoWait = _npu_getCurrentRawStream


def install(c_module) -> None:
    """Put the functions above, and the submodules ``_mstx`` and ``_npurt``, on ``torch_npu._C`` (where the
    extension has none of its own)."""
    functions = {"_npu_get_soc_version": _npu_get_soc_version,
                 "_get_cann_version": _get_cann_version,
                 "_empty_strided_npu": _empty_strided_npu,
                 "_weak_ref_tensor": _weak_ref_tensor,
                 "_npu_getCurrentRawStream": _npu_getCurrentRawStream,
                 "_npu_getCurrentRawStreamNoWait": _npu_getCurrentRawStreamNoWait}
    for name, fn in functions.items():
        if not hasattr(c_module, name):
            setattr(c_module, name, fn)
    from torch_npu import _mstx, _npurt

    for name, module in (("_mstx", _mstx), ("_npurt", _npurt)):  # the markers' runtime, raw runtime calls
        if not hasattr(c_module, name):
            setattr(c_module, name, module)
