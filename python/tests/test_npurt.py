"""torch_npu.npu.npurt(): raw runtime calls returning AscendCL error codes (torch_npu/_npurt.py)."""
import ctypes
import mmap

import pytest
import torch

import torch_npu

PINNED, MAPPED = 0x10000000, 0x2
INVALID_PARAM = 100000


def test_npurt_is_c_npurt():
    rt = torch_npu.npu.npurt()
    assert rt is torch_npu._C._npurt and rt is torch.npu.npurt()
    assert torch_npu.npu.is_initialized()


def test_stream_create_and_destroy():
    rt = torch_npu.npu.npurt()
    handles = []
    for _ in range(2):
        stream = ctypes.c_void_p()
        assert rt.npuStreamCreate(ctypes.addressof(stream)) == 0
        handles.append(stream.value)
    assert all(handles) and handles[0] != handles[1]  # two distinct aclrtStreams
    assert torch.npu.current_stream().npu_stream not in handles  # not one of torch's streams
    for handle in handles:
        assert rt.npuStreamDestroy(handle) == 0


def test_null_arguments_are_invalid():
    rt = torch_npu.npu.npurt()
    assert rt.npuStreamCreate(0) == INVALID_PARAM
    assert rt.npuStreamDestroy(0) == INVALID_PARAM
    assert rt.npuHostRegister(0, 4096, PINNED) == INVALID_PARAM
    assert rt.npuHostUnregister(0) == INVALID_PARAM
    with pytest.raises(TypeError, match="address"):
        rt.npuStreamDestroy(-1)
    with pytest.raises(TypeError, match="flags"):
        rt.npuHostRegister(4096, 4096, "pinned")


def test_host_register_pinned_any_memory_mapped_whole_pages():
    rt = torch_npu.npu.npurt()
    t = torch.ones(20)  # ordinary allocation: pinning works
    assert rt.npuHostRegister(t.data_ptr(), t.nbytes, PINNED) == 0
    assert rt.npuHostUnregister(t.data_ptr()) == 0
    page = mmap.PAGESIZE
    shared = torch.empty(2 * page, dtype=torch.uint8).share_memory_()  # page-aligned
    ptr = shared.data_ptr()
    assert ptr % page == 0
    assert rt.npuHostRegister(ptr + 8, page, MAPPED) == INVALID_PARAM  # not page-aligned
    assert rt.npuHostRegister(ptr, page + 8, MAPPED) == INVALID_PARAM
    for flags in (PINNED, MAPPED, PINNED | MAPPED):
        assert rt.npuHostRegister(ptr, 2 * page, flags) == 0
        assert rt.npuHostUnregister(ptr) == 0


def test_host_register_refusals():
    rt = torch_npu.npu.npurt()
    t = torch.empty(4096, dtype=torch.uint8)
    ptr = t.data_ptr()
    assert rt.npuHostRegister(ptr, 0, PINNED) == INVALID_PARAM  # empty range
    assert rt.npuHostRegister(ptr, 4096, 0x4) == INVALID_PARAM  # unknown flag
    assert rt.npuHostRegister(ptr, 2048, PINNED) == 0
    assert rt.npuHostRegister(ptr + 1024, 2048, PINNED) == INVALID_PARAM  # overlaps
    assert rt.npuHostRegister(ptr + 2048, 2048, PINNED) == 0  # adjacent is fine
    assert rt.npuHostUnregister(ptr + 1024) == INVALID_PARAM  # not a registered start
    assert rt.npuHostUnregister(ptr) == 0 and rt.npuHostUnregister(ptr + 2048) == 0
    assert rt.npuHostUnregister(ptr) == INVALID_PARAM  # already unregistered
