"""torch_npu.npu._recovery: tensors marked unsafe after a device fault, the operators' check
of their inputs while the flag is on, copies and new allocations that make memory safe
again, stop_device (FORCE STOP) and restart_device."""
import pytest
import torch

import torch_npu
from torch_npu.npu._recovery import (
    check_npu_storage_is_safe,
    check_npu_tensor_is_safe,
    get_npu_tensor_unsafe_check_flag,
    mark_all_npu_tensor_unsafe,
    restart_device,
    stop_device,
    set_npu_tensor_unsafe_check_flag,
    update_npu_tensor_to_safe,
)

UNSAFE = "There is unsafe data in the input tensor."


@pytest.fixture(autouse=True)
def _flag_off():
    set_npu_tensor_unsafe_check_flag(False)
    yield
    set_npu_tensor_unsafe_check_flag(False)


def test_marked_tensors_are_unsafe_and_refused_by_operators_while_the_flag_is_on():
    a = torch.randn(4, 5, device="npu")
    b = torch.randn(4, 5, device="npu")
    assert check_npu_tensor_is_safe(a) and check_npu_tensor_is_safe(b)
    mark_all_npu_tensor_unsafe(0)
    assert not check_npu_tensor_is_safe(a)
    assert not check_npu_storage_is_safe(b.untyped_storage())
    assert not check_npu_storage_is_safe(b.storage())  # TypedStorage too
    assert (a + b).shape == (4, 5)  # flag off: no check
    set_npu_tensor_unsafe_check_flag(True)
    assert get_npu_tensor_unsafe_check_flag()
    for op in (lambda: a + b, lambda: a.sum(), lambda: torch.matmul(a, b.t()), lambda: a.cpu() + a):
        with pytest.raises(RuntimeError, match=UNSAFE):
            op()
    with pytest.raises(RuntimeError, match=UNSAFE):
        torch.empty(4, 5, device="npu").copy_(a)  # a copy's source is checked
    c = torch.ones(4, 5, device="npu")  # new memory is safe
    assert check_npu_tensor_is_safe(c)
    assert (c * 2).sum().item() == 40


def test_copy_into_and_reallocation_make_memory_safe_again():
    a = torch.randn(8, device="npu")
    b = torch.randn(8, device="npu")
    mark_all_npu_tensor_unsafe(0)
    set_npu_tensor_unsafe_check_flag(True)
    fresh = torch.arange(8.0, device="npu")
    b.copy_(fresh)  # the destination of a copy is written: safe
    assert check_npu_tensor_is_safe(b)
    assert b.cpu().tolist() == list(range(8))
    b.copy_(torch.zeros(8))  # from the host too
    assert check_npu_tensor_is_safe(b)
    assert not check_npu_tensor_is_safe(a)
    update_npu_tensor_to_safe(a)
    assert check_npu_tensor_is_safe(a)
    ptr = b.data_ptr()
    mark_all_npu_tensor_unsafe(0)
    del b
    again = torch.empty(8, device="npu")  # the freed block, allocated again
    assert again.data_ptr() == ptr
    assert check_npu_tensor_is_safe(again)


def test_cpu_tensors_are_safe_and_bad_arguments_raise():
    assert check_npu_tensor_is_safe(torch.ones(3))
    with pytest.raises(RuntimeError, match="param type should be Tensor"):
        check_npu_tensor_is_safe("invalid_tensor")
    with pytest.raises(RuntimeError, match="param type should be TypedStorage or UntypedStorage"):
        check_npu_storage_is_safe(torch.ones(3))


def test_marking_one_device_leaves_the_others_safe():
    if torch.npu.device_count() < 2:
        pytest.skip("needs 2 devices")
    a = torch.ones(3, device="npu:0")
    b = torch.ones(3, device="npu:1")
    mark_all_npu_tensor_unsafe(1)
    assert check_npu_tensor_is_safe(a) and not check_npu_tensor_is_safe(b)


def test_restart_device():
    t = torch.randn(2, 3, device="npu")
    restart_device(0)  # no rebuild: nothing marked
    assert check_npu_tensor_is_safe(t) and not get_npu_tensor_unsafe_check_flag()
    restart_device(0, rebuild_all_resources=True, disable_tensor_unsafe_check=True)
    assert check_npu_tensor_is_safe(t) and not get_npu_tensor_unsafe_check_flag()
    restart_device(0, rebuild_all_resources=True)
    assert not check_npu_tensor_is_safe(t) and get_npu_tensor_unsafe_check_flag()
    assert torch.npu.restart_device is restart_device
    with pytest.raises(RuntimeError, match="Invalid device id"):
        restart_device(torch.npu.device_count())


def test_stop_device_drops_queued_kernels_and_forces_stop_until_restart():
    # Device 1, so that a failure here leaves device 0 to the other tests.
    with torch.npu.device(1):
        x = torch.ones(64, device="npu")
        for _ in range(3):  # (the first kernels queued behind a sleep run at once)
            torch.npu._sleep(int(2e7))
            x.add_(0)
            torch.npu.synchronize()
        torch.npu._sleep(int(2e8))  # ~0.1 s of queued work in front
        for _ in range(20):
            x.add_(1)  # queued behind the sleep, dropped by the stop
        assert stop_device(1) == 0
        with pytest.raises(RuntimeError, match="FORCE STOP"):
            x.add_(1)
        with pytest.raises(RuntimeError, match="FORCE STOP"):
            torch.npu.synchronize()
    assert torch.ones(2, device="npu:0").add(1).sum().item() == 4  # the other devices run on
    restart_device(1)
    x.add_(1)
    assert x.cpu()[0].item() == 2  # the add after the restart ran, none of the dropped ones
    assert torch.npu.stop_device is stop_device
    with pytest.raises(RuntimeError, match="Invalid device id"):
        stop_device(torch.npu.device_count())
