"""``torch_npu._C._npurt`` (``torch_npu.npu.npurt()``): a few raw runtime calls, returning
the runtime's error code (0: success) as torch_npu's bindings do.

- ``npuStreamCreate(stream_p)``: creates an ``aclrtStream`` on the current device and stores
  its handle at the address ``stream_p`` (e.g. ``ctypes.addressof(ctypes.c_void_p())``);
  ``npuStreamDestroy(stream)`` drains and destroys it. These call the simulator's AscendCL
  (``aclrtCreateStream`` / ``aclrtDestroyStream``, exported by ``torch_npu._C``).
- ``npuHostRegister(ptr, size, flags)`` / ``npuHostUnregister(ptr)``: register host memory for
  device access (``flags``: ``ACL_HOST_REG_PINNED`` and/or ``ACL_HOST_REG_MAPPED``, which needs
  page-aligned ``ptr`` and ``size``). The simulator's devices already reach all host memory, so
  a registration only records the range: it checks the arguments and overlaps as the runtime
  does, but changes neither copies nor ``Tensor.is_pinned()``.
"""
import ctypes
import mmap
import threading

ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_HOST_REG_MAPPED = 0x2
ACL_HOST_REG_PINNED = 0x10000000

_lock = threading.Lock()
_registered = {}  # start address -> size of the registered host ranges
_acl = None


def _runtime():
    """The simulator's AscendCL entry points (in torch_npu._C)."""
    global _acl
    if _acl is None:
        from torch_npu import _C

        lib = ctypes.CDLL(_C.__file__)  # already loaded: the same library; calls release the GIL
        for name, argtype in (("aclrtCreateStream", ctypes.c_void_p), ("aclrtDestroyStream", ctypes.c_void_p)):
            getattr(lib, name).argtypes = [argtype]
            getattr(lib, name).restype = ctypes.c_int
        _acl = lib
    return _acl


def _address(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected an address (a non-negative int), got {value!r}")
    return value


def npuStreamCreate(stream_p: int) -> int:
    if _address(stream_p) == 0:
        return ACL_ERROR_INVALID_PARAM
    return _runtime().aclrtCreateStream(stream_p)


def npuStreamDestroy(stream: int) -> int:
    if _address(stream) == 0:
        return ACL_ERROR_INVALID_PARAM
    return _runtime().aclrtDestroyStream(stream)


def npuHostRegister(ptr: int, size: int, flags: int) -> int:
    ptr, size = _address(ptr), _address(size)
    if isinstance(flags, bool) or not isinstance(flags, int):
        raise TypeError(f"npuHostRegister(): argument 'flags' must be an int, got {flags!r}")
    if ptr == 0 or size == 0 or flags & ~(ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED):
        return ACL_ERROR_INVALID_PARAM
    if flags & ACL_HOST_REG_MAPPED and (ptr % mmap.PAGESIZE or size % mmap.PAGESIZE):
        return ACL_ERROR_INVALID_PARAM  # mapping works on whole pages
    with _lock:
        if any(start < ptr + size and ptr < start + length for start, length in _registered.items()):
            return ACL_ERROR_INVALID_PARAM  # overlaps a registered range
        _registered[ptr] = size
    return ACL_SUCCESS


def npuHostUnregister(ptr: int) -> int:
    with _lock:
        return ACL_SUCCESS if _registered.pop(_address(ptr), None) is not None else ACL_ERROR_INVALID_PARAM
