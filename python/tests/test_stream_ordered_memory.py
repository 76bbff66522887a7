"""Stream-ordered frees: a tensor deleted while queued work still reads it returns to the
caching allocator at `del`, as on CUDA and torch_npu; stream order (and record_stream for
other streams) keeps the reuse exact."""
import pytest
import torch

import torch_npu


@pytest.fixture(autouse=True)
def queued():
    """Large kernels queued, as these tests need (by default they run on the caller, in stream
    order: runs_on_caller, ASCEND_SIM_INLINE)."""
    prev = torch_npu._C._npu_set_inline(False)
    yield
    torch_npu._C._npu_set_inline(prev)

MIB = 1 << 20
PAD = 512  # torch_npu's block of an n MiB tensor: n MiB + 32 bytes, rounded up to 512


def busy(stream_work_ms_hint: int = 5):
    """Queues a few large matmuls on the current stream so that what follows waits."""
    a = torch.randn(1536, 1536, device="npu")
    for _ in range(stream_work_ms_hint):
        a = a @ a / 1536
    return a


def test_del_frees_at_once_while_queued_work_reads_it():
    torch.npu.synchronize()
    x = torch.randn(2048, 2048, device="npu")  # 16 MiB
    x_cpu = x.cpu()
    x * 2  # the first call of a dtype signature runs at once; later ones queue
    keep = busy()
    y = x * 2  # queued behind the matmuls: reads x later
    assert not torch.npu.current_stream().query(), "the reading kernel must still be queued"
    before = torch.npu.memory_allocated()
    x_ptr = x.data_ptr()
    del x
    assert torch.npu.memory_allocated() == before - (16 * MIB + PAD)  # at the del, not when y ran
    # The same stream reuses the block at once; its writes queue behind the read.
    z = torch.full((2048, 2048), 7.0, device="npu")
    assert z.data_ptr() == x_ptr
    assert torch.equal(y.cpu(), x_cpu * 2)
    assert bool((z == 7).all())
    del keep


def test_copies_borrow_too():
    torch.npu.synchronize()
    x = torch.randn(1024, 1024, device="npu")
    x_cpu = x.cpu()
    keep = busy()
    out = torch.empty(1024, 1024, device="npu")
    out.copy_(x)  # a device copy queued behind the matmuls
    before = torch.npu.memory_allocated()
    del x
    assert torch.npu.memory_allocated() == before - (4 * MIB + PAD)
    torch.full((1024, 1024), -1.0, device="npu")  # reuses x's block, after the copy
    assert torch.equal(out.cpu(), x_cpu)
    del keep


def test_another_stream_is_protected_by_record_stream():
    torch.npu.synchronize()
    side = torch.npu.Stream()
    x = torch.randn(2048, 2048, device="npu")  # allocated on the default stream
    x_cpu = x.cpu()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        keep = busy()
        y = x * 3  # reads x on the side stream, later
    x.record_stream(side)
    x_ptr = x.data_ptr()
    del x
    # Until the side stream's use is done, the block is not handed to the default stream.
    z = torch.full((2048, 2048), 5.0, device="npu")
    assert z.data_ptr() != x_ptr or side.query()
    side.synchronize()
    assert torch.equal(y.cpu(), x_cpu * 3)
    assert bool((z == 5).all())
    del keep


def test_erase_stream_after_the_use_is_ordered():
    side = torch.npu.Stream()
    x = torch.randn(256, device="npu")
    x.record_stream(side)
    torch_npu.erase_stream(x, side)  # the side stream no longer uses it
    ptr = x.data_ptr()
    del x
    assert torch.empty(256, device="npu").data_ptr() == ptr  # no event left to wait for


def test_fused_operator_inputs_are_borrowed():
    torch.npu.synchronize()
    x = torch.randn(2048, 2048, device="npu")
    w = torch.ones(2048, device="npu")
    x_cpu = x.cpu()
    keep = busy()
    y, _ = torch_npu.npu_rms_norm(x, w)
    before = torch.npu.memory_allocated()
    del x
    assert torch.npu.memory_allocated() == before - (16 * MIB + PAD)
    torch.full((2048, 2048), 3.0, device="npu")
    expected = x_cpu * torch.rsqrt(x_cpu.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.cpu(), expected)
    del keep


def test_a_kernel_queued_earlier_does_not_get_a_borrowed_block():
    """Found by the fuzzer: a block freed while a queued kernel borrows it must not go to a
    kernel queued *before* that one, which allocates its temporaries when it runs (a free
    records a marker on the stream; workers only reuse blocks whose marker completed)."""
    for _ in range(3):
        torch.npu.synchronize()
        a = torch.randn(1024, 2048, device="npu")
        b = torch.randn(1024, 1024, device="npu")
        c = torch.empty(1024, 1024, device="npu")
        x = torch.randn(1024, 1024, device="npu")
        x_cpu = x.cpu()
        keep = busy()
        torch.mm(a[:, ::2], b, out=c)  # queued: copies a[:, ::2] to a temporary like x when it runs
        y = x * 2                      # queued after it, borrows x
        del x
        assert torch.equal(y.cpu(), x_cpu * 2)
        del keep


def test_a_kernel_reuses_the_temporaries_it_freed():
    """A foreach kernel allocates and frees temporaries while it runs on its stream's worker:
    with a free marker on each, its next temporary took a fresh 2 MiB segment, and a small
    transformer's training loop reserved 2.4 GiB for a 16 MiB working set."""
    torch.npu.synchronize()
    torch.npu.empty_cache()
    before = torch.npu.memory_stats()["segment.all.current"]  # what earlier tests still hold
    tensors = [torch.randn(64, 128, device="npu") for _ in range(40)]
    expected = [t.cpu() for t in tensors]
    for _ in range(10):
        torch._foreach_mul_(tensors, 0.5)
        expected = [e * 0.5 for e in expected]
    torch.npu.synchronize()
    segments = torch.npu.memory_stats()["segment.all.current"] - before
    assert segments <= 3, torch.npu.memory_summary()
    assert all(torch.equal(t.cpu(), e) for t, e in zip(tensors, expected))


def test_host_waits_release_the_gil():
    """A stream task dropping the last C++ reference to a tensor with a Python object takes
    the GIL: a host wait holding it (empty_cache waiting for free markers did) deadlocked
    with such a task (the fuzzer hung in an async worker at seeds 31500..31999)."""
    from conftest import run_python
    code = """
import torch, torch_npu
for i in range(30):
    a = torch.randn(256, 256, device="npu")
    b = torch.rand(256, 256, device="npu") + 1
    out = torch.empty(256, 256, device="npu")
    torch.npu._sleep(int(2 * 1.8e6))   # what follows is queued
    torch.div(a, b, out=out)
    del a, b
    torch.npu.empty_cache()            # waits for the free markers
    torch.npu.current_stream().synchronize()
    del out
print("ok")
"""
    r = run_python(code, timeout=120, env={"ASCEND_SIM_INLINE": "0"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
