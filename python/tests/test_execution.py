"""The execution path: zero-copy kernels, asynchrony, stream ordering, errors, OOM."""
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torch_npu  # noqa: F401

from conftest import run_python

H2D, D2H = 1, 2


def copied():
    return torch_npu._C._npu_copiedBytes(H2D), torch_npu._C._npu_copiedBytes(D2H)


def test_ops_match_cpu_and_stay_on_npu():
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    na, nb = a.npu(), b.npu()
    out = torch.nn.functional.gelu(na @ nb).softmax(-1)
    assert out.device == torch.device("npu:0")
    torch.testing.assert_close(out.cpu(), torch.nn.functional.gelu(a @ b).softmax(-1))


def test_no_hidden_copies():
    x = torch.randn(256, 256, device="npu")
    y = torch.randn(256, 256, device="npu")
    out = torch.empty(256, 256, device="npu")
    torch.npu.synchronize()
    before = copied()
    z = x + y                      # out-of-place
    z.mul_(2)                      # in-place
    torch.matmul(x, y, out=out)    # out=
    v = z.view(-1)[:10]            # views
    v.add_(1)
    s = z.sum(dim=0)               # reduction
    torch.npu.synchronize()
    assert copied() == before, "npu ops moved bytes between host and device"
    del s


def test_views_alias_npu_memory():
    x = torch.zeros(4, 4, device="npu")
    row = x[1]
    row.fill_(3)
    x.t()[2].add_(1)               # a column, through a transposed view
    expected = torch.zeros(4, 4)
    expected[1] = 3
    expected[:, 2] += 1
    torch.testing.assert_close(x.cpu(), expected)
    assert row.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_outputs_count_in_npu_memory():
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    x = torch.ones(1024, 1024, device="npu")          # 4 MiB
    y = torch.nn.functional.layer_norm(x, (1024,))    # functional op: output from npu memory
    assert torch.npu.memory_allocated() >= base + 2 * 4 * 2**20
    del x, y
    assert torch.npu.memory_allocated() == base


def test_random_ops_follow_npu_generator():
    torch.npu.manual_seed(123)
    a = torch.randn(100, device="npu")
    d1 = torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.5)
    torch.npu.manual_seed(123)
    b = torch.randn(100, device="npu")
    d2 = torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.5)
    torch.testing.assert_close(a.cpu(), b.cpu())
    torch.testing.assert_close(d1.cpu(), d2.cpu())
    torch.npu.manual_seed(123)
    torch.randn(1000)  # drawing from the CPU generator does not move the npu one
    c = torch.randn(100, device="npu")
    torch.testing.assert_close(a.cpu(), c.cpu())
    g = torch.Generator(device="npu").manual_seed(7)
    e1 = torch.rand(10, device="npu", generator=g)
    g.manual_seed(7)
    e2 = torch.rand(10, device="npu", generator=g)
    torch.testing.assert_close(e1.cpu(), e2.cpu())


def test_convolution_forward_backward_matches_cpu():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    nconv = torch.nn.Conv2d(3, 8, 3, padding=1).npu()
    nconv.load_state_dict(conv.state_dict())
    nx = x.detach().npu().requires_grad_()
    conv(x).square().sum().backward()
    nconv(nx).square().sum().backward()
    torch.testing.assert_close(nx.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(nconv.weight.grad.cpu(), conv.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(nconv.bias.grad.cpu(), conv.bias.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch_npu._C._npu_taskQueueEnabled(), reason="TASK_QUEUE_ENABLE=0")
@pytest.mark.parametrize("inline", ["1", "0"])
def test_where_a_parallel_kernel_runs(inline):
    """A kernel ATen splits across threads (more than 32768 elements) runs on the calling thread
    (ASCEND_SIM_INLINE=1, the default), after the work queued before it: the stream is idle when
    the call returns. With ASCEND_SIM_INLINE=0 it is queued behind that work. Same values."""
    code = """
import torch, torch_npu
x = torch.zeros(64, device="npu")
big = torch.ones(512, 512, device="npu")
for _ in range(3):                      # the first calls of each signature on a busy stream run at once
    torch.npu._sleep(36_000_000); x.add_(1); y = big.add(x[0]); torch.npu.synchronize()
torch.npu._sleep(900_000_000)           # ~0.5 s: the stream is busy
x.add_(1)                               # small: queued behind the sleep
y = big.add(x[0])                       # parallel, reads what the queued add_ writes
idle = torch.npu.current_stream().query()
print(idle, torch.equal(y.cpu(), torch.full((512, 512), 5.0)), torch.equal(x.cpu(), torch.full((64,), 4.0)))
"""
    r = run_python(code, env={"ASCEND_SIM_INLINE": inline, "TASK_QUEUE_ENABLE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(inline == "1"), "True", "True"], r.stdout


def test_wait_stream_orders_streams():
    side = torch.npu.Stream()
    a = torch.randn(1024, 1024, device="npu")
    b = torch.randn(1024, 1024, device="npu")
    c = torch.empty(1024, 1024, device="npu")
    torch.npu.synchronize()
    with torch.npu.stream(side):
        torch.matmul(a, b, out=c)
        c.mul_(0.5)
    torch.npu.current_stream().wait_stream(side)
    d = c + 1                       # on the default stream, after side's work
    torch.testing.assert_close(d.cpu(), a.cpu() @ b.cpu() * 0.5 + 1, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not torch_npu._C._npu_taskQueueEnabled(), reason="TASK_QUEUE_ENABLE=0: nothing is queued")
def test_kernel_error_surfaces_at_sync_and_stream_recovers():
    x = torch.zeros(4, device="npu")
    idx = torch.tensor([0, 9], device="npu")
    x.index_add_(0, idx * 0, torch.ones(2, device="npu"))  # this dtype signature has run: the next may queue
    torch.npu._sleep(540_000_000)      # ~0.3 s: keeps the stream busy, what follows is queued
    x.index_add_(0, idx, torch.ones(2, device="npu"))
    with pytest.raises(RuntimeError, match="index_add"):
        torch.npu.synchronize()
    y = torch.ones(3, device="npu") * 2
    assert y.sum().item() == 6.0
    # On an idle stream the same error is raised by the call itself, with torch's type.
    with pytest.raises(IndexError, match="index out of range"):
        x.index_add_(0, idx, torch.ones(2, device="npu"))


@pytest.mark.parametrize("inline", ["1", "0"])
def test_inline_decides_where_a_small_kernel_on_an_idle_stream_fails(inline):
    """ASCEND_SIM_INLINE=1 (default) runs a small kernel launched on an idle stream on the
    caller, so its error is raised by the call; =0 queues it, so the call returns and the error
    surfaces at the next synchronisation, naming the operator."""
    code = """
import torch, torch_npu
x = torch.zeros(4, device="npu")
idx = torch.tensor([0, 9], device="npu")
x.index_add_(0, idx * 0, torch.ones(2, device="npu"))  # the first call of a dtype signature runs at once
torch.npu.synchronize()
try:
    x.index_add_(0, idx, torch.ones(2, device="npu"))
    print("returned")
    torch.npu.synchronize()
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0])
"""
    r = run_python(code, env={"ASCEND_SIM_INLINE": inline, "TASK_QUEUE_ENABLE": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    if inline == "1":
        assert lines[0].startswith("IndexError") and "index out of range" in lines[0], r.stdout
    else:
        assert lines[0] == "returned" and lines[1].startswith("RuntimeError") and "index_add" in lines[1], r.stdout


def test_large_ops_with_python_scalars_match_cpu():
    torch.manual_seed(0)
    a, b = torch.randn(300, 700), torch.randn(300, 700)
    na, nb = a.npu(), b.npu()
    out = (na * 2 + nb).mul_(0.5).sub(1).relu_()
    torch.testing.assert_close(out.cpu(), (a * 2 + b).mul_(0.5).sub(1).relu_())
    s = torch.tensor(3.0)                 # a 0-dim CPU tensor operand, changed right after
    r = na * s
    s.fill_(100.0)
    torch.testing.assert_close(r.cpu(), a * 3.0)


def test_mixed_devices_are_rejected():
    a = torch.ones(2, device="npu:0")
    with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
        a + torch.ones(2, device="npu:1")
    with pytest.raises(RuntimeError, match="npu:0 and cpu"):
        a + torch.ones(2)
    assert (a + torch.tensor(1.0)).cpu().tolist() == [2.0, 2.0]  # 0-dim CPU scalars are fine


def test_copy_shape_mismatch_is_reported_at_the_call():
    dst = torch.ones(2, device="npu:0")
    with pytest.raises(RuntimeError, match="size"):
        dst.copy_(torch.ones(3, device="npu:1"))
    with pytest.raises(RuntimeError, match="size"):
        dst.copy_(torch.ones(3))
    dst.copy_(torch.tensor(5.0))  # broadcasting still works
    assert dst.cpu().tolist() == [5.0, 5.0]


def test_invalid_device_index():
    with pytest.raises((RuntimeError, IndexError, ValueError), match="npu"):
        torch.ones(1, device="npu:64")


def test_oom_is_clear_and_recoverable():
    script = textwrap.dedent("""
        import torch, torch_npu
        base = torch.npu.memory_allocated()
        keep = torch.empty(600 * 2**20, dtype=torch.uint8, device="npu")
        try:
            torch.empty(600 * 2**20, dtype=torch.uint8, device="npu")
        except torch.OutOfMemoryError as e:
            msg = str(e)
        else:
            raise SystemExit("no OOM")
        assert "NPU out of memory" in msg, msg
        assert "Tried to allocate" in msg and "PYTORCH_NPU_ALLOC_CONF" in msg, msg
        assert isinstance(torch.npu.OutOfMemoryError(), torch.OutOfMemoryError) or torch.npu.OutOfMemoryError is torch.OutOfMemoryError
        del keep
        x = torch.ones(10, device="npu") * 3
        assert x.sum().item() == 30
        del x
        assert torch.npu.memory_allocated() == base
        print("ok")
    """)
    env = dict(os.environ, ASCEND_SIM_HBM_BYTES=str(1024 * 2**20))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_no_leak_over_training_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).npu()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32, device="npu"), torch.randn(16, 1, device="npu")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):
        step()
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    for _ in range(1000):
        step()
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == base


def test_sync_mode_runs_inline():
    script = textwrap.dedent("""
        import torch, torch_npu
        assert not torch_npu._C._npu_taskQueueEnabled()
        a = torch.randn(64, 64, device="npu"); b = torch.randn(64, 64, device="npu")
        torch.testing.assert_close((a @ b).cpu(), a.cpu() @ b.cpu())
        print("ok")
    """)
    env = dict(os.environ, TASK_QUEUE_ENABLE="0")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_kernels_use_the_intra_op_threads_the_user_set():
    # OpenMP keeps the thread count per thread: the stream worker must follow
    # torch.set_num_threads of the launching thread. Threads an OpenMP team adds to the
    # worker inherit its name, so the team size shows in /proc.
    script = textwrap.dedent("""
        import os, torch, torch_npu
        def worker_threads():
            names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
            return names.count("npu0-s0")
        torch.set_num_threads(1)
        x = torch.randn(1 << 22, device="npu")
        (x * 2).sum().item()
        print(worker_threads(), end=" ")
        torch.set_num_threads(2)
        (x * 2).sum().item()
        print(worker_threads())
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_"))}
    env["ASCEND_SIM_INLINE"] = "0"  # queued (by default such kernels run on the caller)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "2"], r.stdout


def test_stream_workers_start_no_openmp_team():
    # Parallel kernels run on the host's OpenMP team (runs_on_caller): a worker's team beside
    # it would make libgomp put idle threads to sleep at every parallel region of the process.
    script = textwrap.dedent("""
        import os, torch, torch_npu
        names = lambda: [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        torch.ones(1 << 20).mul_(2)               # the host's team (any CPU work makes one)
        x = torch.randn(1 << 22, device="npu")
        for _ in range(3):
            x.add_(1).mul_(0.5)
            m = x.view(2048, 2048)
            y = (m @ m[:16].T).sum() + m.softmax(-1).sum()
        torch.npu._sleep(1000)                    # a queued task: the worker exists
        torch.npu.synchronize()
        print(names().count("npu0-s0"), y.item() == y.item())
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "ASCEND_SIM_INLINE"))}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "True"], r.stdout


def test_quickstart_trains_with_amp():
    """The README's quick start (a transformer LM, AdamW, GradScaler + autocast)."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quickstart.py")
    spec = importlib.util.spec_from_file_location("quickstart", path)
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    quickstart.main(steps=15)  # raises SystemExit when the loss does not decrease
    # The cache stays near the working set (a few MiB), not growing step after step.
    assert torch.npu.memory_reserved() < 256 * 2**20, torch.npu.memory_summary()


def test_torch_npu_error_texts_and_codes():
    x = torch.tensor([7, -7]).npu()
    suffix = r"\n\[ERROR\] \d{4}-\d\d-\d\d-\d\d:\d\d:\d\d \(PID:\d+, Device:0, RankID:-?\d+\) "
    bad_mode = r"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found 'test'"
    for call in (lambda: torch.div(x, x, rounding_mode="test"), lambda: x.clone().div_(x, rounding_mode="test"),
                 lambda: torch.div(x, x, rounding_mode="test", out=torch.empty_like(x)),
                 lambda: torch.div(x, 2, rounding_mode="test")):
        with pytest.raises(RuntimeError, match=bad_mode + suffix + "ERR01001 OPS invalid parameter"):
            call()
    c = torch.tensor([7, -7])
    for mode in (None, "trunc", "floor"):
        assert torch.equal(torch.div(x, 2, rounding_mode=mode).cpu(), torch.div(c, 2, rounding_mode=mode))
    # a CPU tensor among npu operands (0-dim CPU tensors are scalars and allowed)
    same_device = ("Expected all tensors to be on the same device. Expected NPU tensor, please check whether the "
                   "input tensor device is correct.")
    for call in (lambda: torch.add(torch.rand(2), torch.rand(2).npu()), lambda: torch.rand(2).npu() * torch.rand(2),
                 lambda: torch.dot(torch.rand(2).npu(), torch.rand(2))):
        with pytest.raises(RuntimeError, match=re.escape(same_device) + r".*" + suffix + "ERR01002 OPS invalid type"):
            call()
    assert torch.equal((x + torch.tensor(1)).cpu(), c + 1)
    # TORCH_NPU_COMPACT_ERROR_OUTPUT=1: no suffix
    result = run_python("import torch, torch_npu\n"
                        "x = torch.tensor(1).npu()\n"
                        "try:\n    torch.div(x, x, rounding_mode='test')\nexcept RuntimeError as e:\n"
                        "    print(repr(str(e).splitlines()[0]), 'ERR0' in str(e))\n",
                        env={"TORCH_NPU_COMPACT_ERROR_OUTPUT": "1"})
    assert result.returncode == 0, result.stderr
    assert "found 'test'\" False" in result.stdout or "found 'test'' False" in result.stdout, result.stdout


def test_exit_with_a_large_kernel_queued_is_clean():
    """A kernel still queued at exit ran while the interpreter finalized and took the GIL there:
    std::terminate (about one exit in three). torch_npu's exit hook drains the streams first."""
    code = """
import torch, torch_npu
torch_npu._C._npu_set_inline(False)
x = torch.randn(2048, 2048, device="npu")
y = x * 2; torch.npu.synchronize()
torch.npu._sleep(20_000_000)
y = x * 2                      # queued at exit
"""
    for _ in range(4):
        r = run_python(code)
        assert r.returncode == 0, r.stderr[-2000:]


def test_a_host_wait_sleeps_until_its_work_is_done():
    """A host thread waiting for a stream was woken after every finished task (and went back to
    sleep), taking a core from the kernels: 20 voluntary context switches for 20 queued tasks."""
    def switches():
        with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
            return int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])

    torch.npu.synchronize()
    for _ in range(20):
        torch.npu._sleep(9_000_000)  # 5 ms each
    before = switches()
    torch.npu.current_stream().synchronize()
    assert switches() - before <= 3
