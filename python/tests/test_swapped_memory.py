"""torch_npu.empty_with_swapped_memory: host memory mapped into the device.

The tensor is an npu tensor (ops run on it as on device memory) whose storage is host memory
registered with aclrtHostRegister: the caching allocator and the device's free memory do not
count it.
"""
import gc

import pytest
import torch
import torch_npu

MiB = 1 << 20


def test_signature_and_result():
    t = torch_npu.empty_with_swapped_memory([4, 3], dtype=torch.float16, device="npu:0")
    assert t.shape == (4, 3) and t.dtype == torch.float16
    assert t.device == torch.device("npu", 0)
    assert t.is_contiguous()
    d = torch_npu.empty_with_swapped_memory((5,))
    assert d.dtype == torch.get_default_dtype()
    assert d.device == torch.device("npu", torch.npu.current_device())
    assert torch.ops.npu.empty_with_swapped_memory.default._schema.arguments[0].name == "size"


def test_not_counted_as_device_memory():
    gc.collect()
    torch.npu.synchronize()
    allocated = torch.npu.memory_allocated()
    reserved = torch.npu.memory_reserved()
    free = torch.npu.mem_get_info()[0]
    t = torch_npu.empty_with_swapped_memory([16 * MiB], dtype=torch.uint8, device="npu:0")
    t.fill_(3)
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == allocated
    assert torch.npu.memory_reserved() == reserved
    assert torch.npu.mem_get_info()[0] == free
    assert all(seg["address"] > t.data_ptr() or seg["address"] + seg["total_size"] <= t.data_ptr()
               for seg in torch.npu.memory_snapshot())
    del t


def test_ops_read_and_write_it():
    # torch_npu's test_02_async_operations_and_release
    t = torch_npu.empty_with_swapped_memory([512, 512], dtype=torch.float32, device="npu:0")
    t.fill_(1.0)
    for i in range(10):
        t = t * 1.1
        t = t + i * 0.1
    s = torch_npu.empty_with_swapped_memory([512, 512], dtype=torch.float32, device="npu:0")
    s.copy_(t)
    s.sqrt_()
    expected = torch.ones(512, 512)
    for i in range(10):
        expected = expected * 1.1 + i * 0.1
    torch.testing.assert_close(s.cpu(), expected.sqrt())
    x = torch_npu.empty_with_swapped_memory([3], dtype=torch.int64, device="npu:0")
    x.copy_(torch.tensor([1, 2, 3]))
    assert (x + torch.tensor([10, 20, 30], device="npu")).tolist() == [11, 22, 33]
    assert x.cpu().tolist() == [1, 2, 3]


def test_on_another_device():
    t = torch_npu.empty_with_swapped_memory([8], dtype=torch.float32, device="npu:1")
    assert t.device == torch.device("npu", 1)
    t.fill_(2.0)
    assert (t * 2).cpu().tolist() == [4.0] * 8


def test_released_when_the_tensor_dies():
    import weakref
    for _ in range(3):
        ts = [torch_npu.empty_with_swapped_memory([256 * (i + 1)], dtype=torch.float32, device="npu:0")
              for i in range(5)]
        for i, t in enumerate(ts):
            t.fill_(float(i))
        ref = weakref.ref(ts[0])
        del ts, t
        gc.collect()
        assert ref() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_deterministic_fill(dtype):
    from torch.testing._internal.common_utils import DeterministicGuard
    with DeterministicGuard(True, fill_uninitialized_memory=True):
        t = torch_npu.empty_with_swapped_memory((10, 9), dtype=dtype, device="npu")
    if dtype.is_floating_point:
        assert t.isnan().all()
    elif dtype == torch.bool:
        assert t.all()
    else:
        assert t.eq(torch.iinfo(dtype).max).all()


def test_zero_elements():
    t = torch_npu.empty_with_swapped_memory([0, 3], device="npu")
    assert t.shape == (0, 3) and t.numel() == 0


def test_bad_arguments():
    with pytest.raises(RuntimeError, match="expected an npu device, got cpu"):
        torch_npu.empty_with_swapped_memory([2], device="cpu")
    with pytest.raises(RuntimeError, match="negative"):
        torch_npu.empty_with_swapped_memory([-1])
