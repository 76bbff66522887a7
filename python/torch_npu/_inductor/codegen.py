"""Inductor's code generation for npu graphs: C++ kernels launched on the npu stream.

Inductor schedules npu graphs with its C++ (CPU) backend, ``CppScheduling``: fused loops
compiled to C++ that take the buffers' data pointers, valid for npu tensors because npu
memory is host memory. Around those kernels the generated Python wrapper allocates npu
buffers (``empty_strided(..., device='npu')``) and calls extern kernels (matmul, conv,
fallback ops, torch_npu custom ops), which are queued on the current npu stream.

The generated kernels are launched on that stream too, like any npu kernel
(:func:`torch_npu._inductor.runtime.launch_host_kernel`): :class:`NpuCppScheduling`
appends to each kernel's source an entry taking its arguments as 64-bit words, which is
called without Python; the wrapper (:class:`NpuPythonWrapperCodegen`) launches every kernel
through it. So a kernel runs in stream order after the extern kernels that produce its
inputs, on the calling thread or the stream's worker by eager kernels' rule, and a
capturing stream records it. The wrapper also
allocates buffers on the graph's npu device.
"""
import functools
import hashlib
import os

import torch
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.utils import Placeholder
from torch._inductor.virtualized import V

from torch_npu._inductor.registration import DEVICE

__all__ = ["NpuCppScheduling", "NpuPythonWrapperCodegen", "NpuSubgraphPythonWrapperCodegen",
           "NpuCppWrapperUnsupported", "vectorized_rand", "NpuCodegenKey", "ENTRY"]


class NpuCodegenKey(CustomGraphModulePass):
    """A no-op post-grad pass whose uuid puts torch_npu's code generation into Inductor's
    FX graph cache key (the "device custom pass" of ``register_backend_for_device``).

    The code Inductor generates for npu graphs depends on this package (the kernels' stream
    entries and launches, :func:`vectorized_rand`, the registration hooks), which Inductor
    cannot see: without the key, a cache filled by another torch_npu version would be
    reused as is. NPU_INDUCTOR_FALLBACK_LIST (which operators stay out of the kernels) is
    part of the key too.
    """

    def __call__(self, gm) -> None:
        pass

    def uuid(self) -> str:
        fallback_list = os.environ.get("NPU_INDUCTOR_FALLBACK_LIST", "").strip()
        return hashlib.sha256(f"{_sources_hash()}:{fallback_list}".encode()).hexdigest()


@functools.lru_cache(None)
def _sources_hash() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in ("codegen.py", "registration.py", "runtime.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


_WAIT = "npu_wait_for_stream"
_LAUNCH = "npu_launch_host_kernel"

ENTRY = "npu_kernel_entry"  # C name of the entry NpuCppScheduling appends to each kernel module
_INTEGERS = ("int64_t", "uintptr_t", "long", "int32_t", "int", "bool")
_FLOATS = ("float", "double")


def _entry_argument(i: int, arg_type) -> "str | None":
    """C++ expression turning word ``i`` of the entry's argument array back into a parameter
    of type ``arg_type`` (as Inductor spells it: ``const float*``, ``const int64_t``,
    ``const float``), or None for a type the launcher cannot pass as a word."""
    arg_type = str(arg_type).strip()
    base = arg_type.replace("const ", "").strip()
    if base.endswith("*"):
        return f"reinterpret_cast<{arg_type}>(args[{i}])"
    if base in _FLOATS:  # launch_host_kernel stores a Python float's double bits
        return f"static_cast<{base}>(npu_word_to_double(args[{i}]))"
    if base in _INTEGERS:
        return f"static_cast<{base}>(static_cast<int64_t>(args[{i}]))"
    return None


def _launchable(arg_types) -> bool:
    """Whether a C++ kernel with these argument types gets an entry (and is launched on the
    stream): pointers, integers and floating-point scalars."""
    return arg_types is not None and all(_entry_argument(i, t) is not None for i, t in enumerate(arg_types))


def _entry_source(arg_types) -> str:
    """The entry appended to a kernel's source: ``kernel`` called with its arguments unpacked
    from 64-bit words (see ``launch_host_kernel`` in python/csrc/graph_bindings.cpp)."""
    unpacked = ",\n        ".join(_entry_argument(i, t) for i, t in enumerate(arg_types))
    return f"""
// torch_npu: the kernel called from an npu stream's worker, one 64-bit word per argument.
static inline double npu_word_to_double(uintptr_t word)
{{
    double value;
    __builtin_memcpy(&value, &word, sizeof(value));
    return value;
}}
extern "C" void {ENTRY}(const uintptr_t* args)
{{
    {Placeholder.KERNEL_NAME}(
        {unpacked});
}}
"""


def _serial_if_bounds_checked(src_code: str) -> str:
    """A kernel with index bounds checks (``TORCH_CHECK(..., "index out of bounds: ...")``, Inductor's
    indirect indexing: embeddings, gathers) runs without its OpenMP team. A check that fails inside a
    parallel region cannot leave it: the C++ runtime terminates the process (CPU Inductor aborts
    there too). Serial, the failure raises an error at the kernel's launch or the next
    synchronisation, as a faulting kernel does on an NPU."""
    if "index out of bounds" not in src_code or "#pragma omp" not in src_code:
        return src_code
    return "\n".join(line for line in src_code.split("\n") if not line.lstrip().startswith("#pragma omp"))


class NpuCppScheduling(CppScheduling):
    """Inductor's C++ scheduling, with a stream entry appended to each kernel's source."""

    def define_kernel(self, src_code, nodes, kernel_args=None):
        args = self.kernel_group.args if kernel_args is None else kernel_args
        _, _, arg_types = args.cpp_argdefs()
        src_code = _serial_if_bounds_checked(src_code)
        if not V.graph.cpp_wrapper and _launchable(arg_types):
            src_code += _entry_source(arg_types)
        name = super().define_kernel(src_code, nodes, kernel_args)
        if "#pragma omp parallel" in src_code:
            _parallel_kernels(V.graph.wrapper_code).add(name)
        return name


def _parallel_kernels(wrapper) -> set:
    """Names of the kernels of ``wrapper``'s module that have an OpenMP parallel region: they
    must run on the stream's worker (see launch_host_kernel), never on the calling thread."""
    return wrapper.__dict__.setdefault("_npu_parallel_kernels", set())


class _NpuKernelCalls:
    """Mixin: how a wrapper calls a generated C++ kernel on npu memory."""

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != DEVICE:
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton,
                                                        **kwargs)
        index = device.index if device.index is not None else "torch.npu.current_device()"
        if not _launchable(kwargs.get("arg_types")):
            # No entry (not seen in practice): run it here once the stream is idle. Waiting
            # fails a capture (107027): such a graph runs uncaptured.
            self.writeline(f"{_WAIT}({index})")
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return None
        args = "".join(f"{a}, " for a in call_args)
        # A kernel this wrapper did not see defined (a subgraph's) counts as parallel: safe.
        parallel = kernel_name in _parallel_kernels(self) or kernel_name not in self.src_to_kernel.values()
        self.writeline(f"{_LAUNCH}({index}, '{kernel_name}', {kernel_name}, ({args}){', True' if parallel else ''})")
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
        self.imports.writeline(f"from torch_npu._inductor.runtime import launch_host_kernel as {_LAUNCH}")


class NpuSubgraphPythonWrapperCodegen(_NpuKernelCalls, SubgraphPythonWrapperCodegen):
    """Subgraphs (control flow) live in the parent's module, which imports the helper."""


class NpuCppWrapperUnsupported(CppWrapperCpu):
    """``config.cpp_wrapper=True`` on npu: a clear error instead of a wrapper without the waits.

    The C++ wrapper would call the generated kernels on the host instead of the npu stream (and
    Inductor's C++ shims do not know the npu device), so it is refused.
    """

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError(
            "torch.compile on npu does not support Inductor's cpp_wrapper (options={'cpp_wrapper': True}): "
            "the generated C++ kernels must be launched on the npu stream, which only the Python wrapper does. "
            "Leave cpp_wrapper off for npu graphs.")


# Philox4x32-10 on a register of uint32 lanes: the counters' first words are ``ctr`` (the
# others 0), the key is (seed, 0); the first output word, mapped to [0, 1) as
# cpp_prefix.h's uint32_to_uniform_float does. A 32x32->64 multiply exists only for every
# other lane (vpmuludq), hence the even/odd split; the 0xAAAA / 0xAA masks pick odd lanes.
_PHILOX_SIMD = """\
int b = 0;
#if defined(CPU_CAPABILITY_AVX512)
for (; b + 16 <= {lanes}; b += 16)
{{
    __m512i c0 = _mm512_loadu_si512(ctr + b), c1 = _mm512_setzero_si512(), c2 = c1, c3 = c1;
    const __m512i ma = _mm512_set1_epi32(0xD2511F53u), mb = _mm512_set1_epi32(0xCD9E8D57u);
    uint32_t k0 = key, k1 = 0;
    for (int round = 0; round < 10; round++)
    {{
        const __m512i e0 = _mm512_mul_epu32(c0, ma), o0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), ma);
        const __m512i e1 = _mm512_mul_epu32(c2, mb), o1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), mb);
        c0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e1, 32), o1), c1),
                              _mm512_set1_epi32(k0));
        c2 = _mm512_xor_si512(_mm512_xor_si512(_mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e0, 32), o0), c3),
                              _mm512_set1_epi32(k1));
        c1 = _mm512_mask_blend_epi32(0xAAAA, e1, _mm512_slli_epi64(o1, 32));
        c3 = _mm512_mask_blend_epi32(0xAAAA, e0, _mm512_slli_epi64(o0, 32));
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }}
    _mm512_storeu_ps(result + b, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c0, _mm512_set1_epi32(0x7FFFFFFF))),
                                               _mm512_set1_ps(4.6566127342e-10f)));
}}
#elif defined(CPU_CAPABILITY_AVX2)
for (; b + 8 <= {lanes}; b += 8)
{{
    __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ctr + b)), c1 = _mm256_setzero_si256(), c2 = c1, c3 = c1;
    const __m256i ma = _mm256_set1_epi32(0xD2511F53u), mb = _mm256_set1_epi32(0xCD9E8D57u);
    uint32_t k0 = key, k1 = 0;
    for (int round = 0; round < 10; round++)
    {{
        const __m256i e0 = _mm256_mul_epu32(c0, ma), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), ma);
        const __m256i e1 = _mm256_mul_epu32(c2, mb), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), mb);
        c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA), c1),
                              _mm256_set1_epi32(k0));
        c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA), c3),
                              _mm256_set1_epi32(k1));
        c1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
        c3 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }}
    _mm256_storeu_ps(result + b, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c0, _mm256_set1_epi32(0x7FFFFFFF))),
                                               _mm256_set1_ps(4.6566127342e-10f)));
}}
#endif
for (; b < {lanes}; b++) result[b] = normalized_rand_cpu(key, ctr[b]);  // other ISAs, leftover lanes"""


def vectorized_rand(seed, offset):
    """``ops.rand`` in a vectorized C++ kernel: Inductor's uniform numbers, all lanes at once.

    The stock ``CppVecOverrides.rand`` calls ``normalized_rand_cpu(seed, offset)`` (cpp_prefix.h)
    once per lane, i.e. a scalar 10-round Philox4x32 per element: in a dropout graph that
    loop costs most of the fused kernel's time. This emits the same computation
    (``at::Philox4_32(seed, 0, offset)()``) for 16 (AVX-512) or 8 (AVX2) lanes at once with
    the ISA's 32x32->64-bit multiplies, ~3x faster on one core; the numbers are
    bit-identical to the stock kernel's. Other ISAs keep the per-lane call.
    """
    from torch._inductor.codegen.common import BracesBuffer
    from torch._inductor.codegen.cpp_utils import DTYPE_TO_CPP

    lanes = V.kernel.tiling_factor
    vectors = V.kernel._get_num_vectors(dtype=torch.float32)
    code = BracesBuffer()
    code.writeline("[&]()")
    with code.indent():
        code.writeline(f"{DTYPE_TO_CPP[offset.dtype]} offset[{lanes}];")
        code.writeline(f"{offset}.store(offset);")
        code.writeline(f"uint32_t ctr[{lanes}];")  # normalized_rand_cpu's uint32_t parameters
        code.writeline(f"for (int i = 0; i < {lanes}; i++) ctr[i] = static_cast<uint32_t>(offset[i]);")
        code.writeline(f"const uint32_t key = static_cast<uint32_t>({seed});")
        code.writeline(f"float result[{lanes}];")
        for line in _PHILOX_SIMD.format(lanes=lanes).splitlines():
            code.writeline(line)
        vec = "at::vec::Vectorized<float>" if vectors == 1 else f"at::vec::VectorizedN<float, {vectors}>"
        code.writeline(f"return {vec}::loadu(result);")
    code.writeline("()")
    return code
