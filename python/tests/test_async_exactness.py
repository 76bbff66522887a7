"""The asynchronous path (TASK_QUEUE_ENABLE=1, the default) gives what the synchronous one
and the CPU give: named regressions of defects where it did not."""
import warnings

import pytest
import torch
import torch_npu  # noqa: F401

from conftest import run_python


def _busy_stream():
    """Queues a long kernel on the current stream: what follows is queued behind it."""
    a = torch.randn(1500, 1500, device="npu")
    return a @ a


def test_out_resize_is_visible_at_the_call_when_inputs_are_queued():
    x = torch.randn(8).npu()
    out = torch.empty(1, device="npu")
    busy = _busy_stream()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.add(busy[0, :8], x, out=out)
        assert out.shape == (8,)  # at the call, before any synchronisation
    assert sum("was resized" in str(w.message) for w in caught) == 1  # once, as on the CPU
    torch.testing.assert_close(out.cpu(), busy[0, :8].cpu() + x.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["same_numel", "reduction", "mm", "cat", "empty_out", "right_shape_strided"])
def test_out_geometry_matches_cpu_behind_queued_work(case):
    cpu_args = {
        "same_numel": lambda: (torch.add, (torch.randn(2, 4), torch.randn(2, 4)), {}, torch.empty(8)),
        "reduction": lambda: (torch.sum, (torch.randn(6, 5),), {"dim": 0}, torch.empty(2, 2)),
        "mm": lambda: (torch.mm, (torch.randn(3, 4), torch.randn(4, 5)), {}, torch.empty(5, 3)),
        "cat": lambda: (torch.cat, ([torch.randn(2, 3), torch.randn(4, 3)],), {}, torch.empty(3)),
        "empty_out": lambda: (torch.mul, (torch.randn(4, 3), torch.randn(3)), {}, torch.empty(0)),
        "right_shape_strided": lambda: (torch.sub, (torch.randn(4, 3), torch.randn(4, 3)), {},
                                        torch.empty(3, 4).t()),
    }[case]
    fn, args, kwargs, cpu_out = cpu_args()

    def to_npu(a):
        return [t.npu() for t in a] if isinstance(a, list) else a.npu()

    npu_args = [to_npu(a) for a in args]
    npu_out = cpu_out.npu() if cpu_out.dim() < 2 or cpu_out.is_contiguous() else cpu_out.t().npu().t()
    busy = _busy_stream()
    npu_args = [[t + busy[0, 0] * 0 for t in a] if isinstance(a, list) else a + busy[0, 0] * 0 for a in npu_args]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(*args, **kwargs, out=cpu_out)
        fn(*npu_args, **kwargs, out=npu_out)
        assert npu_out.shape == cpu_out.shape and npu_out.stride() == cpu_out.stride()
    torch.testing.assert_close(npu_out.cpu(), cpu_out, rtol=1e-6, atol=1e-6)


def test_out_resize_during_graph_capture_replays_into_the_new_shape():
    x = torch.randn(8, device="npu")
    out = torch.empty(1, device="npu")
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    g = torch.npu.NPUGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.npu.graph(g, stream=s):
            torch.mul(x, 2, out=out)
    assert out.shape == (8,)
    x.copy_(torch.arange(8.0))
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(out.cpu(), torch.arange(8.0) * 2)


def test_worker_kernels_run_in_the_callers_dispatch_state():
    # The CPU kernel of coalesce asserts that autograd is excluded from dispatch, as it is
    # on the calling thread inside an npu kernel; a large one runs on the stream's worker.
    torch.manual_seed(0)
    indices = torch.randint(0, 3000, (2, 100000))
    cpu = torch.sparse_coo_tensor(indices, torch.randn(100000), (3000, 3000))
    npu = cpu.npu().coalesce()
    assert torch.equal(npu.cpu().to_dense(), cpu.coalesce().to_dense())


def test_worker_kernels_run_in_inference_mode_when_the_caller_does():
    a = torch.randn(300, 300)
    with torch.inference_mode():
        b = a.npu() @ a.npu()
        total = b.sum()  # its kernel writes into an inference tensor: allowed in inference mode only
        assert total.item() == pytest.approx((a @ a).sum().item(), rel=1e-4)


def test_stream_of_another_device_makes_it_current():
    s1 = torch.npu.Stream(device=1)
    with torch.npu.stream(s1):
        assert torch.npu.current_device() == 1
        assert torch.npu.current_stream() == s1
        t = torch.ones(4, device="npu") * 2
    assert torch.npu.current_device() == 0
    assert t.device == torch.device("npu:1")
    assert torch.equal(t.cpu(), torch.full((4,), 2.0))


def test_set_stream_switches_device_as_torch_npu():
    torch.npu.set_stream(torch.npu.Stream(device=2))
    assert torch.npu.current_device() == 2
    torch.npu.set_stream(torch.npu.default_stream(0))
    assert torch.npu.current_device() == 0


def test_out_resize_matches_in_sync_mode_too():
    code = (
        "import torch, torch_npu, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "out = torch.empty(1, device='npu')\n"
        "torch.add(torch.ones(8, device='npu'), 1, out=out)\n"
        "assert out.shape == (8,) and out.cpu().eq(2).all()\n"
    )
    r = run_python(code, env={"TASK_QUEUE_ENABLE": "0"})
    assert r.returncode == 0, r.stderr


def test_out_arguments_sharing_memory_get_the_shape_the_cpu_gives():
    # Fuzzer seed 208163: kthvalue(..., out=(t, t)) resizes the one tensor twice; a Meta
    # kernel run on separate twins of the outs predicted no change, so the call was queued
    # and the host kept shape [1] where the CPU gives [].
    x = torch.arange(4).reshape(4, 1)
    cpu_out = torch.zeros(1, dtype=torch.int64)
    torch.kthvalue(x, 4, -2, out=(cpu_out, cpu_out))
    x_npu, npu_out = x.npu(), torch.zeros(1, dtype=torch.int64, device="npu")
    busy = _busy_stream()
    torch.kthvalue(x_npu, 4, -2, out=(npu_out, npu_out))
    assert npu_out.shape == cpu_out.shape == ()  # at the call
    assert npu_out.cpu().equal(cpu_out)
    torch.npu.synchronize()
    del busy


def test_a_dtype_the_kernel_refuses_raises_at_the_call_behind_queued_work():
    # Fuzzer seed 219040: cumsum into a bool out= is refused by the kernel ("not implemented
    # for 'Bool'"). Queued, that error came at the next synchronisation as a stream error;
    # synchronously (and on torch_npu, whose aclnn ops check dtypes at the call) it comes
    # from the call itself.
    idx = torch.randint(0, 8, (16,), device="npu")
    out = torch.zeros(16, dtype=torch.bool, device="npu")
    busy = _busy_stream()
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.cumsum(idx, -1, out=out)
    torch.npu.synchronize()  # the stream has no error left behind
    del busy
    # A signature that ran once may be queued afterwards, and still computes what the CPU does.
    ok = torch.zeros(16, dtype=torch.int64, device="npu")
    torch.cumsum(idx, -1, out=ok)
    busy = _busy_stream()
    torch.cumsum(idx, -1, out=ok)
    torch.testing.assert_close(ok.cpu(), torch.cumsum(idx.cpu(), -1), rtol=0, atol=0)
    del busy
