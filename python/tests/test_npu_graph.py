"""torch.npu.NPUGraph: capture, replay, memory pools, misuse, make_graphed_callables."""
import copy
import json
import os

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401
from conftest import run_python


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def _warm_up(fn, iters=2):
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        for _ in range(iters):
            fn()
    torch.npu.current_stream().wait_stream(s)
    torch.npu.synchronize()


def test_api_exported():
    for name in ("NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
                 "make_graphed_callables"):
        assert name in torch.npu.__all__ and hasattr(torch.npu, name)
    assert torch.npu.is_current_stream_capturing() is False


def test_mlp_forward_replay_matches_eager():
    torch.manual_seed(0)
    cpu_model = _mlp()
    model = copy.deepcopy(cpu_model).npu()
    static_x = torch.randn(4, 16).npu()
    with torch.no_grad():
        _warm_up(lambda: model(static_x))
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            assert torch.npu.is_current_stream_capturing()
            static_y = model(static_x)
    assert not torch.npu.is_current_stream_capturing()
    assert g._num_tasks() >= 4  # addmm, layer_norm, gelu, addmm at least
    previous = None
    for _ in range(3):
        x = torch.randn(4, 16)
        static_x.copy_(x)  # refill the captured input's memory
        g.replay()
        got = static_y.cpu()
        with torch.no_grad():
            expected = cpu_model(x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        if previous is not None:
            assert not torch.equal(got, previous)  # the values follow the inputs
        previous = got


def test_nothing_runs_during_capture():
    x = torch.ones(8).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        x.add_(1)
    assert torch.equal(x.cpu(), torch.ones(8))  # captured, not run
    g.replay()
    g.replay()
    assert torch.equal(x.cpu(), torch.full((8,), 3.0))
    # replay on the default stream, after other work on it
    x.mul_(2)
    g.replay()
    assert torch.equal(x.cpu(), torch.full((8,), 7.0))


def test_functional_ops_with_kernel_allocated_outputs():
    # layer_norm (and its backward), softmax and a reduction: ops whose outputs the CPU
    # kernel allocates are run once at capture to learn their outputs, then replayed.
    torch.manual_seed(1)
    w = torch.randn(32).npu()
    x = torch.randn(8, 32).npu()

    def f():
        y = F.layer_norm(x, (32,), w)
        return torch.softmax(y, dim=-1).sum(dim=0), y.max(dim=1).values

    _warm_up(f)
    before = x.cpu().clone()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        a, b = f()
    assert torch.equal(x.cpu(), before)
    for _ in range(2):
        xc = torch.randn(8, 32)
        x.copy_(xc)
        g.replay()
        yc = F.layer_norm(xc, (32,), w.cpu())
        torch.testing.assert_close(a.cpu(), torch.softmax(yc, -1).sum(0), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.cpu(), yc.max(dim=1).values)


def test_capture_does_not_change_written_arguments():
    # batch_norm in training mode updates its running stats in place and returns fresh
    # outputs: the capture-time run must not leave the running stats updated.
    bn = torch.nn.BatchNorm1d(4).npu()
    bn_ref = copy.deepcopy(bn).cpu()
    x = torch.randn(6, 4).npu()
    _warm_up(lambda: None)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = bn(x)
    torch.testing.assert_close(bn.running_mean.cpu(), bn_ref.running_mean)
    g.replay()
    expected = bn_ref(x.cpu())
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_mean.cpu(), bn_ref.running_mean, rtol=1e-5, atol=1e-6)


def _cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, stride=2, groups=2), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(4, 2, 2, stride=2), torch.nn.Flatten(), torch.nn.Linear(200, 5))


def _train_step(m, o, x, t):
    o.zero_grad(set_to_none=True)
    loss = F.mse_loss(m(x), t)
    loss.backward()
    o.step()
    return loss


def _capture_train_step(model, opt, static_x, static_t, warm_up_iters=2):
    """Warms up ``_train_step`` on a side stream, then captures one step (forward, backward,
    optimizer step) into a new graph; returns the graph and the captured loss tensor."""
    _warm_up(lambda: _train_step(model, opt, static_x, static_t), iters=warm_up_iters)
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        static_loss = F.mse_loss(model(static_x), static_t)
        static_loss.backward()
        opt.step()
    return g, static_loss


def test_cnn_training_step_replay_matches_eager():
    # Convolutions (forward and backward, grouped and transposed) are queued with
    # outputs allocated on the host, so a conv + batch norm + relu step can be captured.
    torch.manual_seed(3)
    model = _cnn().npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    static_x = torch.randn(2, 3, 12, 12).npu()
    static_t = torch.randn(2, 5).npu()
    g, static_loss = _capture_train_step(model, opt, static_x, static_t)
    assert g._num_tasks() >= 10
    ref = copy.deepcopy(model).cpu()  # nothing ran during the capture
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    previous = None
    for _ in range(3):
        x, t = torch.randn(2, 3, 12, 12), torch.randn(2, 5)
        static_x.copy_(x)
        static_t.copy_(t)
        g.replay()
        loss_ref = _train_step(ref, opt_ref, x, t)
        got = static_loss.cpu()
        torch.testing.assert_close(got, loss_ref.detach(), rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)
        for b, c in zip(model.buffers(), ref.buffers()):  # batch norm running stats
            torch.testing.assert_close(b.cpu(), c, rtol=1e-4, atol=1e-5)
        assert previous is None or not torch.equal(got, previous)
        previous = got


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("kind", ["conv1d", "conv2d", "grouped", "transposed", "conv3d"])
def test_convolution_outputs_match_cpu(kind, memory_format):
    # Eager convolutions allocate their outputs before queuing the CPU kernel: values,
    # shapes and layouts (channels_last on the oneDNN path) must be the CPU kernel's.
    torch.manual_seed(1)
    shapes = {"conv1d": ((2, 4, 20), (6, 4, 3), {}),
              "conv2d": ((2, 4, 9, 9), (6, 4, 3, 3), dict(padding=1, stride=2)),
              "grouped": ((2, 4, 9, 9), (6, 2, 3, 3), dict(groups=2, dilation=2)),
              "transposed": ((2, 4, 9, 9), (4, 3, 3, 3), dict(stride=2, output_padding=1)),
              "conv3d": ((2, 3, 6, 6, 6), (4, 3, 3, 3, 3), dict(padding=1))}
    x_shape, w_shape, kwargs = shapes[kind]
    fn = {"conv1d": F.conv1d, "conv3d": F.conv3d, "transposed": F.conv_transpose2d}.get(kind, F.conv2d)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    if len(x_shape) == 4:
        x = x.contiguous(memory_format=memory_format)
    elif len(x_shape) == 5 and memory_format == torch.channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    b = torch.randn(w_shape[1] if kind == "transposed" else w_shape[0])
    cpu = [t.clone().requires_grad_() for t in (x, w, b)]
    npu = [t.detach().npu().requires_grad_() for t in (x, w, b)]
    y_cpu, y_npu = fn(*cpu, **kwargs), fn(*npu, **kwargs)
    grad = torch.randn_like(y_cpu)
    y_cpu.backward(grad)
    y_npu.backward(grad.npu())
    assert y_npu.stride() == y_cpu.stride()
    torch.testing.assert_close(y_npu.cpu(), y_cpu.detach(), rtol=1e-4, atol=1e-4)
    for c, n in zip(cpu, npu):
        assert n.grad.stride() == c.grad.stride()
        torch.testing.assert_close(n.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4)


def test_convolution_overrideable_bad_arguments():
    x, w = torch.randn(2, 4, 9, 9).npu(), torch.randn(6, 4, 3, 3).npu()
    conv = torch.ops.aten.convolution_overrideable
    with pytest.raises(RuntimeError, match="expected stride to have 2 elements"):
        conv(x, w, None, [1], [0, 0], [1, 1], False, [0, 0], 1)
    with pytest.raises(RuntimeError, match="output size .* is empty"):
        conv(x[..., :2, :2], w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    with pytest.raises(RuntimeError, match="to have 4 channels"):  # checked by at::convolution
        F.conv2d(torch.randn(2, 3, 9, 9).npu(), w)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_training_step_replay_matches_eager(opt_name):
    torch.manual_seed(2)
    base = _mlp()
    model = copy.deepcopy(base).npu()
    ref = copy.deepcopy(base).npu()

    def make_opt(params, capturable):
        if opt_name == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.AdamW(params, lr=0.01, capturable=capturable)

    opt = make_opt(model.parameters(), True)
    opt_ref = make_opt(ref.parameters(), False)
    static_x = torch.randn(4, 16).npu()
    static_t = torch.randn(4, 8).npu()
    # Same warm-up on both (the optimizer state exists before the capture).
    g, static_loss = _capture_train_step(model, opt, static_x, static_t, warm_up_iters=3)
    for _ in range(3):
        _train_step(ref, opt_ref, static_x, static_t)
    for _ in range(3):
        x, t = torch.randn(4, 16), torch.randn(4, 8)
        static_x.copy_(x)
        static_t.copy_(t)
        g.replay()
        loss_ref = _train_step(ref, opt_ref, x.npu(), t.npu())
        torch.testing.assert_close(static_loss.cpu(), loss_ref.cpu(), rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.cpu(), q.cpu(), rtol=1e-4, atol=1e-5)


def test_sync_during_capture_is_refused_and_the_capture_goes_on():
    """As Ascend's runtime, not CUDA's: a synchronisation during a capture raises, and the
    capture stays valid (Huawei's test_graph_rng_after_failed_capture relies on it)."""
    x = torch.randn(16).npu()
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with torch.npu.graph(g):
            y = x * 2
            y.sum().item()
    assert not torch.npu.is_current_stream_capturing()
    assert torch.npu.current_stream() == torch.npu.default_stream()
    y.zero_()
    g.replay()  # what was captured before the refused call
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)
    # A caught sync error: the capture goes on and ends normally.
    g = torch.npu.NPUGraph()
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        g.capture_begin()
        y = x + 1
        with pytest.raises(RuntimeError, match="not permitted"):
            torch.npu.synchronize()
        with pytest.raises(RuntimeError, match="not permitted"):
            torch.npu.current_stream().synchronize()
        z = y * 3
        g.capture_end()
    torch.npu.current_stream().wait_stream(s)
    g.replay()
    torch.testing.assert_close(z.cpu(), (x.cpu() + 1) * 3)
    # .cpu() of a captured tensor is a synchronisation too
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="capturing"):
        with torch.npu.graph(g):
            (x * 3).cpu()
    # eager work is unaffected afterwards
    torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)


def test_data_dependent_op_during_capture_raises():
    x = torch.tensor([0.0, 1.0, 2.0]).npu()
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="aten::nonzero cannot be captured"):
        with torch.npu.graph(g):
            torch.nonzero(x)


def test_cpu_fallback_op_during_capture_raises():
    """An operator torch_npu runs through its CPU fallback copies its arguments to the host: a
    capturing stream refuses that synchronisation, as on torch_npu (async fuzzer seed 875,
    torch.hypot in a capture). Natively served operators in the same capture are fine."""
    x = torch.randn(9, 16).npu()
    assert not torch.npu.is_op_supported("aten::hypot.out")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        with torch.npu.graph(g):
            torch.hypot(x, x)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = torch.atan2(x, x)
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.atan2(x.cpu(), x.cpu()))


def test_capture_on_default_stream_raises():
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="NPU graphs must be captured on a non-default stream"):
        g.capture_begin()
    assert not torch.npu.is_current_stream_capturing()


def test_capture_rejects_pin_memory_expandable_segments():
    from torch_npu.npu.memory import _set_allocator_settings

    g = torch.npu.NPUGraph()
    _set_allocator_settings("pin_memory_expandable_segments:True")
    try:
        with pytest.raises(RuntimeError, match="not supported when pin_memory_expandable_segments=True"):
            with torch.npu.graph(g):
                pass
        assert not torch.npu.is_current_stream_capturing()
    finally:
        _set_allocator_settings("pin_memory_expandable_segments:False")
    x = torch.zeros(4).npu()
    with torch.npu.graph(g):
        x.add_(1)
    g.replay()
    assert x.cpu().tolist() == [1.0] * 4


def test_bad_arguments():
    with pytest.raises(ValueError, match="Unknown capture error mode"):
        torch.npu.graph(torch.npu.NPUGraph(), capture_error_mode="strict")
    with pytest.raises(TypeError, match="pool must be"):
        torch.npu.graph(torch.npu.NPUGraph(), pool="mine")
    with pytest.raises(TypeError, match="npu_graph must be a torch.npu.NPUGraph"):
        torch.npu.graph(object())
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="pool\\(\\) without a preceding successful capture"):
        g.pool()
    with pytest.raises(RuntimeError, match="capture_end\\(\\) called before capture_begin"):
        g.capture_end()
    x = torch.zeros(4).npu()
    with torch.npu.graph(g):
        x.add_(1)
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        with torch.npu.graph(g):
            x.add_(1)


def test_capture_error_modes():
    # relaxed: a synchronous copy on the host is allowed while capturing
    x = torch.zeros(4).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, capture_error_mode="relaxed"):
        x.add_(1)
    g.replay()
    assert torch.equal(x.cpu(), torch.ones(4))


def test_pool_sharing_and_reset():
    x = torch.ones(1024).npu()
    g1, g2 = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(g1):
        a = x + 1
    with torch.npu.graph(g2, pool=g1.pool()):
        b = a * 3
    assert g1.pool() == g2.pool()
    pool = g1.pool()
    use_count, segments = torch_npu._C._npu_graphPoolInfo(0, pool)
    assert use_count == 2 and segments >= 1
    x.fill_(2.0)
    g1.replay()
    g2.replay()
    assert torch.equal(b.cpu(), torch.full((1024,), 9.0))
    g1.reset()
    assert torch_npu._C._npu_graphPoolInfo(0, pool)[0] == 1
    g2.replay()  # still valid: its pool and a's memory live on
    g2.reset()
    torch.npu.synchronize()  # the queued replay held the graph's kernels until it ran
    assert torch_npu._C._npu_graphPoolInfo(0, pool)[0] == 0  # unused; a and b still hold memory
    del a, b
    assert torch_npu._C._npu_graphPoolInfo(0, pool) == (-1, 0)  # released
    # graph_pool_handle(): a pool shared from the start
    handle = torch.npu.graph_pool_handle()
    assert isinstance(handle, tuple) and handle[0] == 0 and handle[1] > 0
    g3 = torch.npu.NPUGraph()
    with torch.npu.graph(g3, pool=handle):
        c = x * 2
    assert g3.pool() == handle
    g3.replay()
    assert torch.equal(c.cpu(), torch.full((1024,), 4.0))
    del g3
    assert torch_npu._C._npu_graphPoolInfo(0, handle)[0] == 0


def test_capture_allocations_come_from_the_pool():
    x = torch.randn(4096).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = x * 2
        z = y + 1
    _, segments = torch_npu._C._npu_graphPoolInfo(0, g.pool())
    assert segments >= 1
    y_ptr, z_ptr = y.data_ptr(), z.data_ptr()
    g.replay()
    assert (y.data_ptr(), z.data_ptr()) == (y_ptr, z_ptr)  # replays reuse the same memory
    torch.testing.assert_close(z.cpu(), x.cpu() * 2 + 1)


def test_debug_dump(tmp_path):
    x = torch.ones(4).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        x.mul_(2)
    path = os.path.join(str(tmp_path), "graph.json")
    g.debug_dump(path)
    with open(path) as f:
        dump = json.load(f)
    assert len(dump["tasks"]) == g._num_tasks() >= 1
    assert any("mul" in t["name"] for t in dump["tasks"])
    with open(os.path.join(str(tmp_path), "graph.aligned.json")) as f:
        trace = json.load(f)["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert [e["args"]["index"] for e in spans] == [t["index"] for t in dump["tasks"]]
    assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(spans, spans[1:]))  # replay order, no overlap


def test_debug_dump_trace_failure_keeps_the_dump_and_no_capture_writes_nothing(tmp_path):
    from unittest import mock

    x = torch.ones(4).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        x.add_(1)
    path = os.path.join(str(tmp_path), "g.json")
    with mock.patch("torch_npu.npu._npugraph_utils.align_trace_json", side_effect=RuntimeError("no")) as align:
        assert g.debug_dump(path) is None
    align.assert_called_once_with(path, None)
    assert os.path.getsize(path) > 0 and not os.path.exists(os.path.join(str(tmp_path), "g.aligned.json"))
    with mock.patch("torch_npu.npu._npugraph_utils.align_trace_json") as align, \
            pytest.warns(UserWarning, match="without a preceding successful capture"):
        torch.npu.NPUGraph().debug_dump(path)  # nothing captured: the older dump is not traced again
    align.assert_not_called()
    not_a_dump = os.path.join(str(tmp_path), "list.json")
    with open(not_a_dump, "w") as f:
        json.dump([1, 2], f)
    with pytest.raises(ValueError, match="expected an NPUGraph debug dump"):
        torch_npu.npu._npugraph_utils.align_trace_json(not_a_dump)


def test_make_graphed_callables_matches_eager():
    torch.manual_seed(3)
    base = _mlp()
    module = copy.deepcopy(base).npu()
    ref = copy.deepcopy(base).npu()
    # a leaf on the npu: a non-leaf made on the default stream (randn(...).npu()) would make
    # the backward capture wait on the default stream, which cannot join a capture
    sample = torch.randn(4, 16, device="npu", requires_grad=True)
    graphed = torch.npu.make_graphed_callables(module, (sample,))
    for _ in range(2):
        x = torch.randn(4, 16)
        xa = x.clone().npu().requires_grad_()
        xb = x.clone().npu().requires_grad_()
        out = graphed(xa)
        expected = ref(xb)
        torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=1e-5, atol=1e-5)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(xa.grad.cpu(), xb.grad.cpu(), rtol=1e-5, atol=1e-5)
        for p, q in zip(module.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-5)
        # set_to_none (as with CUDA graphs): autograd may adopt the graph's static gradient
        # buffers as .grad, which zeroing in place would then share with the next replay.
        module.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)


def test_make_graphed_callables_bad_input():
    m = torch.nn.Linear(2, 2).npu()
    with pytest.raises(TypeError, match="must contain only Tensors"):
        torch.npu.make_graphed_callables(m, (3,))
    m.register_forward_hook(lambda *a: None)
    with pytest.raises(RuntimeError, match="must not have hooks"):
        torch.npu.make_graphed_callables(m, (torch.randn(1, 2).npu(),))


def test_task_queue_disabled_capture_replay():
    code = (
        "import torch, torch_npu\n"
        "x = torch.ones(8).npu()\n"
        "g = torch.npu.NPUGraph()\n"
        "with torch.npu.graph(g):\n"
        "    y = x * 3 + 1\n"
        "assert torch_npu._C._npu_taskQueueEnabled() is False\n"
        "g.replay()\n"
        "x.fill_(2.0)\n"
        "g.replay()\n"
        "assert torch.equal(y.cpu(), torch.full((8,), 7.0)), y\n"
        "print('ok')\n"
    )
    res = run_python(code, env={"TASK_QUEUE_ENABLE": "0"})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


# ---- Dynamo backends ------------------------------------------------------------------

def _compiled_pair(backend):
    torch._dynamo.reset()
    torch.manual_seed(4)
    base = _mlp()
    model = copy.deepcopy(base).npu()
    ref = copy.deepcopy(base).npu()
    return torch.compile(model, backend=backend), model, ref


def test_npugraph_ex_inference_and_training_match_eager():
    compiled, model, ref = _compiled_pair("npugraph_ex")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16).npu()
            torch.testing.assert_close(compiled(x).cpu(), ref(x).cpu(), rtol=1e-5, atol=1e-5)
    outs = []
    for _ in range(3):
        x = torch.randn(4, 16).npu()
        y = compiled(x)
        outs.append(y)
        y.pow(2).sum().backward()
        r = ref(x)
        r.pow(2).sum().backward()
        torch.testing.assert_close(y.cpu(), r.cpu(), rtol=1e-5, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-5)
    # outputs are the caller's: a later replay did not overwrite earlier ones
    assert not torch.equal(outs[0].cpu(), outs[1].cpu())
    # a new input shape captures another graph
    x = torch.randn(7, 16).npu()
    torch.testing.assert_close(compiled(x).cpu(), ref(x).cpu(), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_npugraph_ex_replays_instead_of_running_ops():
    import torch_npu.dynamo.graphs as graphs

    torch._dynamo.reset()
    calls = []
    original = graphs._GraphRunner._capture

    def spy(self, args):
        entry = original(self, args)
        calls.append(entry)
        return entry

    graphs._GraphRunner._capture = spy
    try:
        f = torch.compile(lambda a, b: (a * b + 1).relu(), backend="npugraph_ex")
        a, b = torch.randn(32).npu(), torch.randn(32).npu()
        for _ in range(4):
            torch.testing.assert_close(f(a, b).cpu(), (a.cpu() * b.cpu() + 1).relu())
            a.add_(1)
    finally:
        graphs._GraphRunner._capture = original
        torch._dynamo.reset()
    assert len(calls) == 1 and calls[0] is not None  # captured once, replayed afterwards
    assert calls[0][1]._num_tasks() >= 2


def test_npugraphs_backend_matches_eager():
    compiled, model, ref = _compiled_pair("npugraphs")
    with warnings_ok():
        for _ in range(2):
            x = torch.randn(4, 16).npu()
            with torch.no_grad():
                torch.testing.assert_close(compiled(x).cpu(), ref(x).cpu(), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def _no_capture_warnings(caught):
    msgs = [str(w.message) for w in caught if "capture" in str(w.message)]
    assert not msgs, msgs


def test_npugraphs_records_inductor_kernels():
    # Inductor's fused C++ kernels are launched on the capturing stream (not run on the
    # host, which would fail the capture): forward and backward graphs are captured,
    # replays follow new inputs and match eager.
    import warnings

    import torch_npu.dynamo.graphs as graphs

    torch._dynamo.reset()
    torch.manual_seed(6)
    base = _mlp()
    model, ref = copy.deepcopy(base).npu(), copy.deepcopy(base).npu()
    runners = []
    original = graphs._GraphRunner._capture

    def spy(self, args):
        entry = original(self, args)
        runners.append((self, entry))
        return entry

    graphs._GraphRunner._capture = spy
    try:
        compiled = torch.compile(lambda x: F.gelu(model(x) * 2 + 1).relu(), backend="npugraphs")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            previous = None
            for _ in range(3):
                x = torch.randn(4, 16).npu().requires_grad_()
                xr = x.detach().clone().requires_grad_()
                y = compiled(x)
                y.sum().backward()
                yr = F.gelu(ref(xr) * 2 + 1).relu()
                yr.sum().backward()
                torch.testing.assert_close(y.cpu(), yr.cpu(), rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(x.grad.cpu(), xr.grad.cpu(), rtol=1e-5, atol=1e-5)
                for p, q in zip(model.parameters(), ref.parameters()):
                    torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-5)
                assert previous is None or not torch.equal(y.cpu(), previous)
                previous = y.detach().cpu()
        _no_capture_warnings(caught)
    finally:
        graphs._GraphRunner._capture = original
        torch._dynamo.reset()
    assert len(runners) == 2  # forward and backward, each captured once
    for runner, entry in runners:
        assert entry is not None and runner.uncapturable is None
        assert entry[1]._num_tasks() >= 2


def test_graph_captures_inductor_compiled_function():
    # torch.compile's default backend inside torch.npu.graph: the generated kernels are
    # recorded, so a replay after new values are copied into the input recomputes them.
    torch._dynamo.reset()
    torch.manual_seed(7)
    w = torch.randn(16, 8)
    wn = w.npu()
    f = torch.compile(lambda x: (torch.softmax(x @ wn, -1) * 3 - x.sum(-1, keepdim=True)).tanh())
    static_x = torch.randn(5, 16).npu()
    with torch.no_grad():
        f(static_x)
        _warm_up(lambda: f(static_x))
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            static_y = f(static_x)
    assert g._num_tasks() >= 2  # the matmul and at least one fused C++ kernel
    previous = None
    for _ in range(3):
        x = torch.randn(5, 16)
        static_x.copy_(x)
        g.replay()
        got = static_y.cpu()
        torch.testing.assert_close(got, (torch.softmax(x @ w, -1) * 3 - x.sum(-1, keepdim=True)).tanh(),
                                   rtol=1e-5, atol=1e-5)
        assert previous is None or not torch.equal(got, previous)
        previous = got
    torch._dynamo.reset()


def test_kernels_with_pointer_integer_and_float_arguments_are_launched():
    from torch_npu._inductor.codegen import _launchable

    assert _launchable(["const float*", "float*", "const int64_t", "const bool*", "const float"])
    assert not _launchable(["const float*", "std::vector<AtenTensorHandle>"])  # no word for it
    assert not _launchable(None)


def test_launch_host_kernel_bad_arguments():
    from torch_npu._inductor import runtime

    with pytest.raises(RuntimeError, match="not a function of a compiled C\\+\\+ kernel module"):
        runtime.launch_host_kernel(0, "k", len, ())
    with pytest.raises(RuntimeError, match="argument 1 of k must be a tensor, an int or a float, got str"):
        torch_npu._C._npu_launch_host_kernel(0, "k", 1, (1.5, "x"))


def test_backend_bad_options():
    import torch_npu.dynamo.graphs as graphs

    with pytest.raises(ValueError, match="unknown option"):
        graphs._check_options("npugraph_ex", {"no_such_option": 1})
    with pytest.raises(TypeError, match="clone_outputs"):
        graphs._check_options("npugraph_ex", {"clone_outputs": "yes"})


class warnings_ok:
    """The Inductor graphs may run without capture (with a warning): allowed here."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def test_random_ops_draw_new_numbers_each_replay():
    torch.npu.manual_seed(5)
    x = torch.ones(4096).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = F.dropout(x, p=0.5, training=True)
        u = torch.rand(4096, device="npu")
    g.replay()
    y1, u1 = y.cpu(), u.cpu()
    g.replay()
    y2, u2 = y.cpu(), u.cpu()
    assert not torch.equal(y1, y2) and not torch.equal(u1, u2)
    for yy in (y1, y2):
        kept = (yy != 0).float().mean().item()
        assert 0.45 < kept < 0.55
        assert torch.all((yy == 0) | (yy == 2.0))
    assert 0.0 <= u1.min().item() and u1.max().item() < 1.0


def test_side_stream_joins_capture():
    # fork/join inside a capture: work on another stream is recorded into the graph too
    x = torch.ones(64).npu()
    side = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        a = x * 2
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            b = a + 1
        torch.npu.current_stream().wait_stream(side)
        c = b * a
    assert not torch.npu.is_current_stream_capturing()
    x.fill_(3.0)
    g.replay()
    torch.testing.assert_close(c.cpu(), torch.full((64,), 42.0))
    # the default stream cannot join a capture
    g2 = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="default stream cannot join"):
        with torch.npu.graph(g2):
            a = x * 2
            torch.npu.default_stream().wait_stream(torch.npu.current_stream())


def test_accelerator_graph_captures_and_replays_on_npu():
    # torch.accelerator.Graph, PyTorch's device-generic API, is served by NPUGraph
    x = torch.zeros(2000, device="npu")
    s = torch.npu.Stream()
    g = torch.accelerator.Graph()
    with s, g:
        x += 1
        y = x * 2
    assert torch.equal(x.cpu(), torch.zeros(2000))  # nothing ran during capture
    g.replay()
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.full((2000,), 2.0))
    assert torch.equal(y.cpu(), torch.full((2000,), 4.0))

    # keep_graph: explicit instantiate; a second graph shares the first one's pool
    g2 = torch.accelerator.Graph(keep_graph=True, pool=g.pool(), capture_error_mode="relaxed")
    with s, g2:
        x.mul_(3)
    g2.instantiate()
    g2.replay()
    torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.full((2000,), 6.0))
    g2.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g2.replay()

    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        torch.accelerator.Graph().instantiate()
    with pytest.raises(RuntimeError, match="non-default stream"):
        with torch.accelerator.Graph():
            x.add_(1)


# ---- random ops in a graph draw fresh numbers at each replay, as CUDA graphs' do ----

def test_replayed_random_ops_advance_and_match_eager_for_the_same_state():
    x = torch.ones(1000, device="npu")
    g = torch.npu.NPUGraph()
    gen = torch.Generator(device="npu")
    gen.manual_seed(11)
    g.register_generator_state(gen)
    with torch.npu.graph(g):
        dropped = torch.nn.functional.dropout(x, 0.5)
        drawn = torch.rand(16, device="npu", generator=gen)
    assert g.generators == [gen]
    torch.npu.manual_seed(7)
    gen.manual_seed(5)
    g.replay()
    first = (dropped.cpu(), drawn.cpu())
    g.replay()
    second = (dropped.cpu(), drawn.cpu())
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
    torch.npu.manual_seed(7)
    gen.manual_seed(5)
    eager = (torch.nn.functional.dropout(x, 0.5).cpu(), torch.rand(16, device="npu", generator=gen).cpu())
    assert torch.equal(first[0], eager[0]) and torch.equal(first[1], eager[1])


def test_register_generator_state_takes_npu_generators_only():
    g = torch.npu.NPUGraph()
    with pytest.raises(TypeError, match="npu torch.Generator"):
        g.register_generator_state(torch.Generator())


def test_random_replays_draw_in_host_order_whatever_the_stream():
    """Graph-safe generators, as CUDA's: a replay draws where the host enqueued it among
    eager random calls, even on another stream and with queued work in between."""
    n = 1000
    torch.npu.manual_seed(7)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        u = torch.rand(n, device="npu")
    torch.npu.manual_seed(123)
    eager = [torch.rand(n, device="npu").cpu() for _ in range(4)]
    torch.npu.manual_seed(123)
    side = torch.npu.Stream()
    g.replay()
    a = u.clone()
    v = torch.rand(n, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        g.replay()
        b = u.clone()
    torch.npu.current_stream().wait_stream(side)
    w = torch.rand(n, device="npu")
    for got, want in zip([a, v, b, w], eager):
        assert torch.equal(got.cpu(), want)


def test_rng_state_get_and_set_during_capture():
    """get_rng_state() in a capture snapshots the state when a replay reaches it, and
    set_rng_state() of that state rewinds the replay to it."""
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        state = torch.npu.get_rng_state()
        p = torch.rand(1000, device="npu")
        torch.npu.set_rng_state(state)
        q = torch.rand(1000, device="npu")
    g.replay()
    first = p.cpu()
    assert torch.equal(first, q.cpu())
    g.replay()
    assert torch.equal(p.cpu(), q.cpu()) and not torch.equal(p.cpu(), first)


def test_seeding_during_capture_must_keep_the_seed():
    torch.npu.manual_seed(11)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.npu.manual_seed(11)  # the same seed: allowed, as torch_npu
        x = torch.rand(8, device="npu")
    g.replay()
    with pytest.raises(RuntimeError, match="only if new seed is the same as the original seed"):
        with torch.npu.graph(torch.npu.NPUGraph()):
            torch.npu.manual_seed(12)
    # the failed capture left nothing behind: capturing again works
    g2 = torch.npu.NPUGraph()
    with torch.npu.graph(g2):
        y = x * 2
    g2.replay()
    assert torch.equal(y.cpu(), x.cpu() * 2)


def test_captured_functional_random_op_replays_eagers_numbers():
    """multinomial is captured by running it once on the host to learn its output: that run
    used to draw from the generator, so the replay after manual_seed drew other numbers."""
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], device="npu")
    torch.npu.manual_seed(42)
    eager = torch.multinomial(w, 100, replacement=True).cpu()
    torch.npu.manual_seed(42)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = torch.multinomial(w, 100, replacement=True)
    g.replay()
    assert torch.equal(out.cpu(), eager)
