"""Inductor's Python wrapper code generator for npu graphs.

Inductor schedules npu graphs with its C++ (CPU) backend, ``CppScheduling``: fused loops
compiled to C++ that take the buffers' data pointers, valid for npu tensors because npu
memory is host memory. Around those kernels the generated Python wrapper allocates npu
buffers (``empty_strided(..., device='npu')``) and calls extern kernels (matmul, conv,
fallback ops, torch_npu custom ops), which are queued on the current npu stream.

The stock wrapper only knows how to call C++ kernels for ``cpu`` (and ``mps``); this one
calls them for ``npu`` too, each preceded by :func:`torch_npu._inductor.runtime.wait_for_stream`
because the kernel runs right away on the calling thread while extern kernels run later
on the stream's worker, and allocates buffers on the graph's npu device.
"""
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

from torch_npu._inductor.registration import DEVICE

__all__ = ["NpuPythonWrapperCodegen", "NpuSubgraphPythonWrapperCodegen", "NpuCppWrapperUnsupported"]

_WAIT = "npu_wait_for_stream"


class _NpuKernelCalls:
    """Mixin: how a wrapper calls a generated C++ kernel on npu memory."""

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != DEVICE:
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton,
                                                        **kwargs)
        index = device.index if device.index is not None else "torch.npu.current_device()"
        self.writeline(f"{_WAIT}({index})")
        self.writeline(self.wrap_kernel_call(kernel_name, call_args))
        return None

    def make_allocation(self, name, device, dtype, shape, stride, *args, **kwargs):
        # The stock line allocates on device='npu', the *current* device; Inductor emits no
        # device guard for non-GPU devices, so a graph on npu:1 would get buffers on npu:0.
        line = super().make_allocation(name, device, dtype, shape, stride, *args, **kwargs)
        if device.type == DEVICE and device.index is not None:
            line = line.replace(f"device='{DEVICE}'", f"device='{DEVICE}:{device.index}'", 1)
        return line


class NpuPythonWrapperCodegen(_NpuKernelCalls, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        # The stock create() hard-codes the stock classes.
        if is_subgraph:
            return NpuSubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NpuPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(f"from torch_npu._inductor.runtime import wait_for_stream as {_WAIT}")


class NpuSubgraphPythonWrapperCodegen(_NpuKernelCalls, SubgraphPythonWrapperCodegen):
    """Subgraphs (control flow) live in the parent's module, which imports the helper."""


class NpuCppWrapperUnsupported(CppWrapperCpu):
    """``config.cpp_wrapper=True`` on npu: a clear error instead of a wrapper without the waits.

    The C++ wrapper would call the generated kernels without waiting for the npu stream (and
    Inductor's C++ shims do not know the npu device), so it is refused.
    """

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError(
            "torch.compile on npu does not support Inductor's cpp_wrapper (options={'cpp_wrapper': True}): "
            "the generated C++ kernels must wait for the npu stream, which only the Python wrapper does. "
            "Leave cpp_wrapper off for npu graphs.")
