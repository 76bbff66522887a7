"""Called by the Python wrappers Inductor generates for npu graphs (keep this import-light).

Inductor's generated C++ kernels are Python functions running on the calling thread and
touching npu memory directly, while npu ops (``extern_kernels.addmm``, fallback ops, the
eager code that produced the inputs) are queued on the stream and run later on its
worker. The wrapper calls each C++ kernel as

    if is_capturing(device): launch_host_kernel(device, name, kernel, (args, ))
    else:
        wait_for_stream(device)
        kernel(args)

- outside a graph capture, :func:`wait_for_stream` waits for the stream (an idle one, the
  usual case, is only queried: several times cheaper than a synchronize), so the kernel
  sees the results of the queued work and none of that work still reads a buffer the
  kernel overwrites;
- while the current stream captures (``torch.npu.graph``, the ``npugraphs`` backend),
  :func:`launch_host_kernel` records the kernel as a task of the stream: a replay re-runs
  it in stream order on the same memory. A kernel with arguments other than pointers and
  integers cannot be recorded: the wrapper only waits before it, and waiting for a
  capturing stream fails the capture (AscendCL 107027).
"""
import ctypes

from torch_npu._C import _npu_host_kernel_wait as wait_for_stream
from torch_npu._C import _npu_is_stream_capturing as is_capturing
from torch_npu._C import _npu_launch_host_kernel

__all__ = ["wait_for_stream", "is_capturing", "launch_host_kernel"]

_ENTRY_ADDRESSES = {}  # kernel (a builtin function of its extension module) -> address of its C entry


def _entry_address(kernel) -> int:
    """The address of the C function behind ``kernel``: Inductor's ``cpp_pybinding`` loads
    the kernel's shared library as an extension module whose method ``kernel`` parses its
    Python arguments and calls the ``extern "C"`` function of the same name."""
    module = getattr(kernel, "__self__", None)
    path = getattr(module, "__file__", None)
    if path is None:
        raise RuntimeError(f"cannot launch {kernel!r} on an npu stream: it is not a function of a compiled "
                           "C++ kernel module (Inductor's cpp_pybinding)")
    return ctypes.cast(getattr(ctypes.CDLL(path), kernel.__name__), ctypes.c_void_p).value


def launch_host_kernel(device_index: int, name: str, kernel, args: tuple) -> None:
    """Queue ``kernel(*args)`` on the current stream of npu ``device_index`` (recorded while
    it captures): the C function is called on the stream's worker with the tensors' data
    pointers, without Python."""
    address = _ENTRY_ADDRESSES.get(kernel)
    if address is None:
        address = _ENTRY_ADDRESSES[kernel] = _entry_address(kernel)
    _npu_launch_host_kernel(device_index, name, address, args)
