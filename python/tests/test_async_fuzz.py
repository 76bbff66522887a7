"""The asynchronous path gives what the synchronous path and the CPU give: random op programs
(async_fuzz.py) run on npu in three modes (default, every launch queued, task queue off) and on cpu, and regressions it found."""
import pytest
import torch

import torch_npu
import async_fuzz

PROGRAMS = 1500

async_only = pytest.mark.skipif(not torch_npu._C._npu_taskQueueEnabled(), reason="TASK_QUEUE_ENABLE=0")


def test_random_programs_match_sync_and_cpu():
    batch = async_fuzz.run_batch(0, PROGRAMS)
    if batch.mismatches or batch.compared != PROGRAMS:
        pytest.fail(batch.report(), pytrace=False)


def test_programs_are_deterministic():
    assert async_fuzz.generate(7) == async_fuzz.generate(7) != async_fuzz.generate(8)


def test_generation_never_copies_an_expanded_view_whole():
    """Seed 42629 drew index_put values shaped as an expanded view: a worker's generator made
    them as a new tensor of gigabytes and the kernel's OOM killer ended the workers. New tensors
    stay small, and the seed runs as the harness runs it."""
    program = async_fuzz.generate(42629)
    made = [step.args[0] for step in program if step.op == "make"]
    assert made and all(torch.Size(shape).numel() <= async_fuzz.MAX_NEW_ELEMENTS for shape in made)
    batch = async_fuzz.run_batch(42629, 1)
    assert batch.compared == 1 and not batch.mismatches, batch.report()


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", range(8))
def test_a_printed_program_runs_as_printed(seed):
    """``render`` is what runs: exec'd, a program ends with the values (or the error) of its trace."""
    program = async_fuzz.generate(seed)
    trace = async_fuzz.run_program(program, "cpu")
    error = next((item[2] for item in trace if item[1] == "raises"), None)
    namespace = {}
    try:
        exec(async_fuzz.render(program, seed), namespace)
    except Exception as e:
        assert type(e).__name__ == error
    else:
        assert error is None
    torch.npu.synchronize()
    for _, name, value, _ in trace:
        if name in namespace:
            assert async_fuzz.same(async_fuzz.snapshot(namespace[name]), value[2]), name


def test_an_unordered_side_stream_is_a_mismatch():
    """The comparison sees races: a side stream that reads without waiting for the current stream."""
    Ref, Step = async_fuzz.Ref, async_fuzz.Step
    x, s, y = Ref("t0"), Ref("s1"), Ref("t2")
    program = [
        Step("t0", "make", ((64, 64), torch.float32), {"seed": 1, "device": async_fuzz.DEV}),
        Step(None, "sleep", (), {}),                   # keeps the current stream busy
        Step(None, ".add_", (x, 1), {}),               # queued behind the sleep
        Step("s1", "stream", (), {}),
        Step(None, "enter_stream", (s,), {}),
        Step("t2", ".sum", (x,), {}),                  # no s.wait_stream(current stream) before
        Step(None, "exit", (), {}),
        Step(None, ".wait_stream", (async_fuzz.CUR, s), {}),
        Step("x4", "item", (y,), {}),
    ]
    cpu = async_fuzz.run_program(program, "cpu")
    found = [async_fuzz.compare(0, async_fuzz.render(program),
                                {"cpu": cpu, "sync": cpu, "async": async_fuzz.run_program(program, "npu")})
             for _ in range(5)]
    assert any(found) == torch_npu._C._npu_taskQueueEnabled()


@async_only
@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_out_of_another_shape_has_its_new_shape_at_the_call():
    x = torch.ones(256, 256, device="npu")
    busy = x @ x
    a = torch.ones(8, device="npu") * 2       # queued behind the matmul
    c = torch.zeros(1, device="npu")
    torch.add(a, 1, out=c)
    assert c.shape == (8,)
    assert c.tolist() == [3.0] * 8
    del busy


def test_copy_to_another_device_reads_the_source_before_later_writes():
    for _ in range(20):
        x = torch.full((4,), 1.0, device="npu:0")
        y = x.to("npu:1")
        z = torch.zeros(4, device="npu:1")
        z.copy_(x)
        x.fill_(2.0)
        assert y.tolist() == [1.0] * 4 and z.tolist() == [1.0] * 4


def test_overlapping_copy_raises_at_the_call():
    t = torch.tensor(4.0, device="npu")
    with pytest.raises(RuntimeError, match="single memory location"):
        t.view(1, 1).copy_(t)
    torch.npu.synchronize()  # the stream did not fail


def test_one_tensor_as_two_outputs_is_one_tensor_to_the_kernel():
    """Fuzz seed 36549: torch.min(t, dim, out=(o, o)) squeezes o twice on the CPU (values, then
    indices: shape []); each out= argument had its own alias, so npu gave shape [1]."""
    for device in ("cpu", "npu"):
        t = torch.arange(8).reshape(8, 1).to(device)
        o = torch.empty((1,), dtype=torch.int64, device=device)
        torch.min(t, dim=-2, keepdim=False, out=(o, o))
        if device == "cpu":
            expected = o
    assert o.shape == expected.shape == torch.Size([])
    assert torch.equal(o.cpu(), expected)


def test_a_fallback_kernel_sees_its_operands_strides():
    """Fuzz seed 70931: hypot (no npu kernel: CPU fallback) of a strided column gave a value one ulp
    from the CPU's: the fallback copied the column contiguous, and the CPU's vectorised hypot rounds
    differently from its strided (scalar) loop. The fallback now runs on aliases, strides kept."""
    gen = torch.Generator().manual_seed(7)
    base = torch.rand((64, 64), dtype=torch.float64, generator=gen) * 10
    other = torch.rand((64,), dtype=torch.float64, generator=gen) * 10
    expected = torch.hypot(base[:, 5], other)
    got = torch.hypot(base.npu()[:, 5], other.npu())
    assert torch.equal(got.cpu(), expected)


def test_an_in_place_op_with_a_grad_marked_integer_mask():
    """Fuzz seed 73272: ne_ of a bool view with a grad-requiring operand leaves the bool tensor
    marked requires_grad (autograd's CopySlices, on the CPU too); a later masked_fill_ with it as
    the mask raised "Only Tensors of floating point and complex dtype can require gradients" on npu,
    where the kernel's CPU stand-in copied the mark."""
    results = {}
    for device in ("cpu", "npu"):
        x = torch.tensor(1.0, device=device, requires_grad=True)
        mask = torch.tensor(True, device=device)
        mask.unsqueeze(0).squeeze().ne_(x * 2)
        assert mask.requires_grad and mask.dtype == torch.bool
        out = torch.zeros((2, 3), dtype=torch.int64, device=device)
        out.masked_fill_(mask, 3)
        results[device] = out.cpu()
    assert torch.equal(results["npu"], results["cpu"])


def test_empty_cache_waits_for_reads_queued_on_other_streams():
    """Fuzz seed 68898 (queued mode): a tensor made on a side stream, read by a kernel queued on the
    default stream (no record_stream), deleted, then torch.npu.empty_cache(): its block went back
    to the device while the read was still queued, and the read saw fresh zero pages. As torch_npu's
    (and cudaFree on CUDA), releasing cached memory first synchronises the device."""
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        src = torch.arange(1, 40, dtype=torch.int64, device="npu")
    side.synchronize()
    expected = torch.arange(1, 40, dtype=torch.float64)
    prev = torch_npu._C._npu_set_inline(False)  # queue every kernel
    try:
        torch.npu._sleep(20_000_000)  # the read below waits behind this on the default stream
        out = src.to(torch.float64)
        del src  # its block returns to the side stream's pool at once
        torch.npu.empty_cache()
        assert torch.equal(out.cpu(), expected)
    finally:
        torch_npu._C._npu_set_inline(prev)
