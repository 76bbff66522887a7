"""torch_npu's C++ SDK in the package (torch_npu/include, torch_npu/lib), as torch_npu's wheel
has it: small C / C++ libraries built against the shipped headers and linked with
-lascendcl / -ltorch_npu run against this process's runtime (a pluggable allocator over
aclrtMallocAlign32/aclrtFree, an allocator trace tracker)."""
import ctypes
import os
import shutil
import subprocess
import textwrap

import pytest
import torch
import torch.utils.cpp_extension

import torch_npu
from conftest import run_python

PKG = os.path.dirname(os.path.abspath(torch_npu.__file__))
INCLUDE = os.path.join(PKG, "include")
LIB = os.path.join(PKG, "lib")
ACL_INC = os.path.join(INCLUDE, "third_party", "acl", "inc")


def _compiler(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"no {name} on PATH")
    return path


def test_the_package_ships_headers_and_libraries():
    for rel in ("acl/acl.h", "acl/acl_base.h", "acl/acl_rt.h"):
        assert os.path.isfile(os.path.join(ACL_INC, rel)), rel
    assert os.path.isfile(os.path.join(INCLUDE, "torch_npu", "csrc", "core", "npu", "NPUCachingAllocator.h"))
    for name, symbol in (("libascendcl.so", "aclrtMallocAlign32"), ("libascendcl.so", "aclrtFree"),
                         ("libtorch_npu.so", "_ZN7c10_npu19NPUCachingAllocator9raw_allocEm")):
        lib = ctypes.CDLL(os.path.join(LIB, name))
        assert getattr(lib, symbol) is not None  # resolved in torch_npu._C, already loaded
    # One runtime: the library's acl functions are _C's (same address).
    c_lib = ctypes.CDLL(torch_npu._C.__file__)
    acl = ctypes.CDLL(os.path.join(LIB, "libascendcl.so"))
    assert ctypes.cast(acl.aclrtMalloc, ctypes.c_void_p).value == ctypes.cast(c_lib.aclrtMalloc, ctypes.c_void_p).value


_ALLOCATOR_C = r"""
#include <stdint.h>
#include <sys/types.h>
#include "third_party/acl/inc/acl/acl_base.h"
#include "third_party/acl/inc/acl/acl_rt.h"

static int allocs, frees, misaligned;

void* my_malloc(ssize_t size, int device, aclrtStream stream) {
  void* ptr = 0;
  if (aclrtMallocAlign32(&ptr, (size_t)size, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) return 0;
  if (((uintptr_t)ptr) % 32 != 0) misaligned++;
  allocs++;
  return ptr;
}

void my_free(void* ptr, ssize_t size, int device, aclrtStream stream) {
  aclrtFree(ptr);
  frees++;
}

int alloc_count(void) { return allocs; }
int free_count(void) { return frees; }
int misaligned_count(void) { return misaligned; }
"""


def test_pluggable_allocator_built_against_the_acl_headers(tmp_path):
    """A C library including only the shipped acl headers, linked with -lascendcl from
    torch_npu/lib, serves npu tensors as torch.npu.memory.NPUPluggableAllocator."""
    src = tmp_path / "alloc.c"
    src.write_text(_ALLOCATOR_C)
    so = tmp_path / "liballoc.so"
    subprocess.run([_compiler("cc"), "-shared", "-fPIC", "-Werror", "-I", INCLUDE, str(src), "-o", str(so),
                    "-L", LIB, "-lascendcl"], check=True, capture_output=True, text=True)
    result = run_python(textwrap.dedent(f"""
        import ctypes, torch, torch_npu
        alloc = torch_npu.npu.memory.NPUPluggableAllocator({str(so)!r}, "my_malloc", "my_free")
        torch_npu.npu.memory.change_current_allocator(alloc)
        lib = ctypes.CDLL({str(so)!r})
        x = torch.arange(1000, dtype=torch.float32, device="npu")
        y = (x * 2 + 1).cpu()
        assert torch.equal(y, torch.arange(1000, dtype=torch.float32) * 2 + 1)
        assert lib.alloc_count() >= 2 and lib.misaligned_count() == 0, lib.alloc_count()
        del x
        torch.npu.synchronize()
        print(lib.alloc_count() > 0, lib.free_count() >= 1)
    """))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


_TRACKER_CPP = r"""
#include <atomic>
#include <cstdint>

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"

namespace {
std::atomic<int64_t> segment_allocs{0}, segment_frees{0}, allocs{0};
}

extern "C" void attach_tracker() {
  using TraceEntry = c10_npu::NPUCachingAllocator::TraceEntry;
  c10_npu::NPUCachingAllocator::attachAllocatorTraceTracker([](const TraceEntry& te) {
    if (te.action_ == TraceEntry::SEGMENT_ALLOC) segment_allocs++;
    if (te.action_ == TraceEntry::SEGMENT_FREE) segment_frees++;
    if (te.action_ == TraceEntry::ALLOC) allocs++;
  });
}
extern "C" int64_t segment_alloc_count() { return segment_allocs.load(); }
extern "C" int64_t segment_free_count() { return segment_frees.load(); }
extern "C" int64_t alloc_count() { return allocs.load(); }
extern "C" int64_t raw_roundtrip(int64_t nbytes) {
  void* p = c10_npu::NPUCachingAllocator::raw_alloc(static_cast<size_t>(nbytes));
  const int64_t allocated = c10_npu::NPUCachingAllocator::getDeviceStats(0)
      .allocated_bytes[static_cast<size_t>(c10_npu::NPUCachingAllocator::StatType::AGGREGATE)].current;
  c10_npu::NPUCachingAllocator::raw_delete(p);
  return allocated;
}
extern "C" void empty_cache() { c10_npu::NPUCachingAllocator::emptyCache(); }
"""


def test_allocator_trace_tracker_built_against_the_allocator_header(tmp_path):
    """torch_npu/csrc/core/npu/NPUCachingAllocator.h: attachAllocatorTraceTracker sees segment
    allocations and frees without the memory history; raw_alloc / getDeviceStats /
    emptyCache reach this allocator (linked with -ltorch_npu)."""
    src = tmp_path / "tracker.cpp"
    src.write_text(_TRACKER_CPP)
    so = tmp_path / "libtracker.so"
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cmd = [_compiler("c++"), "-shared", "-fPIC", "-std=c++17", "-O0", "-I", INCLUDE]
    for inc in torch.utils.cpp_extension.include_paths():
        cmd += ["-isystem", inc]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", str(src), "-o", str(so),
            "-L", LIB, "-ltorch_npu", f"-Wl,-rpath,{LIB}", "-L", torch_lib, "-lc10", f"-Wl,-rpath,{torch_lib}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = run_python(textwrap.dedent(f"""
        import ctypes, gc, torch, torch_npu
        torch.empty(1, device="npu")
        lib = ctypes.CDLL({str(so)!r})
        lib.segment_alloc_count.restype = lib.segment_free_count.restype = ctypes.c_int64
        lib.alloc_count.restype = lib.raw_roundtrip.restype = ctypes.c_int64
        lib.raw_roundtrip.argtypes = [ctypes.c_int64]
        lib.attach_tracker()
        assert not torch_npu._C._npu_isHistoryEnabled()
        buf = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="npu")
        print(lib.segment_alloc_count() >= 1, lib.alloc_count() >= 1)
        del buf
        gc.collect()
        lib.empty_cache()
        print(lib.segment_free_count() >= 1)
        before = torch.npu.memory_allocated()
        print(lib.raw_roundtrip(4 << 20) - before >= 4 << 20, torch.npu.memory_allocated() == before)
    """))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 5
