"""Dynamo / Inductor semantics on npu that torch_npu's own test/_inductor and test/dynamo rely on:
torch.npu calls inside compiled functions, empty cpu tensors moved to npu in a graph, RNG
state saved and replayed around checkpointed regions. References are computed in the test
(eager on npu).
"""
import os

import pytest
import torch
import torch._dynamo.testing

import torch_npu


pytestmark = pytest.mark.usefixtures("fresh_inductor_cache", "reset_dynamo")


# ---- torch.npu device functions inside a compiled function (Dynamo trace rules) ----------
def _device_queries(x):
    y = torch.empty(x.shape, dtype=x.dtype, device=torch.npu.current_device())
    y.copy_(x)
    if torch.npu.is_available() and torch.npu.is_bf16_supported():
        y = y + torch.npu.device_count()
    return y * (torch.npu.get_device_properties(0).total_memory > 0) + y.device.index


def _host_side_effects(x):
    y = x + 1.0
    torch.npu.synchronize()
    torch_npu.npu.utils.synchronize()
    torch.npu.memory.reset_peak_memory_stats()
    torch_npu._C._npu_getDefaultStream(0)
    return y * 2.0


@pytest.mark.parametrize("fn", [_device_queries, _host_side_effects])
def test_npu_device_functions_trace_into_one_graph(fn):
    """No graph break (which fullgraph=True turns into an Unsupported error)."""
    x = torch.randn(4, 3, device="npu")
    counter = torch._dynamo.testing.CompileCounter()
    out = torch.compile(fn, backend=counter, fullgraph=True)(x)
    torch.testing.assert_close(out, fn(x))
    assert counter.frame_count == 1


def _reseeded_rand(x):
    torch.npu.manual_seed(0)
    return x + torch.rand(3, device="npu")



def _streams_and_events(x):
    x = torch.add(x, 2)
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        x = torch.sin(x)
    current = torch.npu.current_stream()
    current.wait_stream(side)
    start = torch.npu.Event()
    start.record(current)
    x = torch.add(x, 4)
    side.synchronize()
    current.synchronize()
    return torch.cos(x)


def test_streams_and_events_made_in_a_compiled_function_trace_into_one_graph():
    """torch.npu.Stream / Event built, entered and waited on inside fullgraph code are graph
    objects as torch.cuda's (Dynamo's in-graph classes and current-stream handler)."""
    x = torch.randn(4, 4, device="npu")
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(_streams_and_events, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(x), _streams_and_events(x), rtol=0, atol=0)
    assert counter.frame_count == 1
    assert counter.op_count >= 6


def test_deterministic_level_change_recompiles_the_npu_backend():
    """Levels 1 and 2 both enable torch's deterministic algorithms (which Dynamo guards); the
    npu backend guards torch_npu's level itself, so 1 -> 2 recompiles and 2 -> 1 reuses."""
    import warnings

    compiles = []

    def backend(gm, example_inputs):
        compiles.append(1)
        return torch_npu.dynamo.npu_backend(gm, example_inputs)

    fn = torch.compile(lambda x: x * 2 + 1, backend=backend, fullgraph=True, dynamic=False)
    x = torch.ones(3, device="npu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for level in (1, 2, 1, 2):
                torch_npu.npu.set_deterministic_level(level)
                torch.testing.assert_close(fn(x), x * 3)
        assert len(compiles) == 2
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch_npu.npu.set_deterministic_level(0)

def test_manual_seed_in_a_compiled_function_seeds_every_call():
    """torch.npu.manual_seed is a graph break, run at every call, as torch.cuda.manual_seed: traced
    "in graph" it ran once, while tracing, and the second call drew other numbers (silently)."""
    compiled = torch.compile(_reseeded_rand)
    x = torch.zeros(3, device="npu")
    first = compiled(x)
    torch.rand(5, device="npu")  # moves the generator on
    torch.testing.assert_close(compiled(x), first, rtol=0, atol=0)  # (Inductor's rand is not eager's)


def _add_current_device(x):
    return x + torch.npu.current_device()


def test_current_device_is_folded():
    """``torch.npu.current_device()`` becomes a constant of the graph."""
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(_add_current_device, backend=counter, fullgraph=True)
    x = torch.zeros(3, device="npu:0")
    with torch.npu.device(0):
        torch.testing.assert_close(compiled(x), x)
        torch.testing.assert_close(compiled(x), x)
    assert counter.frame_count == 1


@pytest.mark.skipif(torch.npu.device_count() < 2, reason="needs a second npu device (ASCEND_SIM_DEVICE_COUNT >= 2)")
def test_current_device_is_guarded():
    """Another current device fails the guard on the folded constant and recompiles."""
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(_add_current_device, backend=counter, fullgraph=True)
    x = torch.zeros(3, device="npu:0")
    with torch.npu.device(0):
        torch.testing.assert_close(compiled(x), x)
    assert counter.frame_count == 1
    with torch.npu.device(1):
        torch.testing.assert_close(compiled(x), x + 1)
    assert counter.frame_count == 2  # the guard on current_device() failed


def test_synchronize_is_not_in_the_inductor_code():
    """The host-side call runs at trace time, the kernels fuse."""
    from torch._inductor.utils import run_and_get_code

    def fn(x):
        y = x + 1.0
        torch_npu.npu.utils.synchronize()
        return y * 2.0

    x = torch.randn(32, 16, device="npu")
    out, codes = run_and_get_code(torch.compile(fn, fullgraph=True), x)
    torch.testing.assert_close(out, (x + 1.0) * 2.0)
    code = "\n".join(codes)
    assert "synchronize" not in code
    assert code.count("npu_launch_host_kernel(") == 1  # add and mul in one kernel


# ---- an empty cpu tensor moved to npu inside the graph -------------------------------
@pytest.mark.parametrize("make", [
    lambda: torch.empty(8, 64, 128),
    lambda: torch.empty_permuted((8, 64, 128), (2, 0, 1)),
])
def test_empty_tensor_moved_to_npu_keeps_its_size(make):
    """The compiled graph returns the full-size tensor, not a [0, 0, 0] one."""
    def fn():
        x = make().npu()
        x.uniform_(-100, 100)
        return x

    out = torch.compile(fn)()
    ref = fn()
    assert out.device.type == "npu"
    assert (out.shape, out.stride()) == (ref.shape, ref.stride())
    assert bool(((out >= -100) & (out < 100)).all()) and out.std().item() > 10


# ---- random ops saved and replayed around checkpointed regions -----------------------
def test_checkpointed_dropout_with_fallback_random_matches_eager():
    """run_and_save_rng_state / run_with_rng_state work for npu."""
    from torch.utils.checkpoint import checkpoint

    def fn(x):
        return checkpoint(lambda t: torch.sigmoid(torch.dropout(torch.sigmoid(t), 0.5, True)), x,
                          use_reentrant=False, preserve_rng_state=True)

    x = torch.randn(4, 4, device="npu", requires_grad=True)
    torch.manual_seed(42)
    ref = fn(x)
    ref.sum().backward()
    ref_grad, x.grad = x.grad.clone(), None
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(42)
        out = torch.compile(fn)(x)
        out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_grad)


def test_run_with_rng_state_replays_the_npu_generator():
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    like = torch.empty(64, device="npu")
    state, first = run_and_save_rng_state(torch.ops.aten.rand_like.default, like)
    again = torch.compile(lambda s: run_with_rng_state(s, torch.ops.aten.rand_like.default, like))(state)
    torch.testing.assert_close(again, first)
    assert not torch.equal(torch.rand_like(like), first)  # the generator moved on
