"""NPU graph task groups and their updates (torch.npu.graph_task_group_begin & co,
NPUGraph.update with auto_dispatch_capture), torch.npu.ExternalEvent, and the super kernel
API (checked arguments, replays unchanged)."""
import pytest
import torch
import torch_npu

FIA = torch.ops.npu.npu_fused_infer_attention_score


def _inputs():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 1, 16, dtype=torch.float16).npu()
    k = torch.randn(1, 2, 8, 16, dtype=torch.float16).npu()
    v = torch.randn(1, 2, 8, 16, dtype=torch.float16).npu()
    return q, k, v


def _fia(q, k, v, kv_len, **kw):
    return FIA(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25, actual_seq_lengths_kv=kv_len, **kw)


def test_task_group_update_replays_new_parameters():
    q, k, v = _inputs()
    expected = {n: _fia(q, k, v, [n])[0].cpu() for n in (3, 8, 5)}
    assert not torch.equal(expected[3], expected[8])
    g = torch.npu.NPUGraph()
    event = torch.npu.ExternalEvent()
    update_stream = torch.npu.Stream()
    out = torch.empty(1, 2, 1, 16, dtype=torch.float16, device="npu")
    lse = torch.empty(0, dtype=torch.float32, device="npu")
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        event.wait(stream)
        event.reset(stream)
        torch.npu.graph_task_group_begin(stream)
        FIA.out(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25, actual_seq_lengths_kv=[3], out=[out, lse])
        handle = torch.npu.graph_task_group_end(stream)
    for n in (8, 5, 8):
        with torch.npu.stream(update_stream):
            torch.npu.graph_task_update_begin(update_stream, handle)
            FIA.out(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25, actual_seq_lengths_kv=[n],
                    out=[out, lse])
            torch.npu.graph_task_update_end(update_stream)
            event.record(update_stream)
        g.replay()
        assert torch.equal(out.cpu(), expected[n])


def test_update_must_launch_the_group_work():
    q, k, v = _inputs()
    g = torch.npu.NPUGraph()
    out = torch.empty(1, 2, 1, 16, dtype=torch.float16, device="npu")
    lse = torch.empty(0, dtype=torch.float32, device="npu")
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        FIA.out(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25, actual_seq_lengths_kv=[3], out=[out, lse])
        handle = torch.npu.graph_task_group_end(stream)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.npu.graph_task_update_begin(s, handle)
        for _ in range(2):
            FIA.out(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25, actual_seq_lengths_kv=[8],
                    out=[out, lse])
        with pytest.raises(RuntimeError, match="recorded 2 tasks, the task group has 1"):
            torch.npu.graph_task_update_end(s)
    g.replay()  # as captured
    assert torch.equal(out.cpu(), _fia(q, k, v, [3])[0].cpu())
    with pytest.raises(TypeError, match="handle"):
        torch.npu.graph_task_update_begin(s, 1)
    with pytest.raises(RuntimeError, match="not capturing"):
        torch.npu.graph_task_group_begin(s)


def test_auto_dispatch_capture_update():
    q, k, v = _inputs()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, auto_dispatch_capture=True):
        out, lse = _fia(q, k, v, [3])
    assert len(g.graph_dispatch_mode.graph_dispatch_records) == 1
    for n in (8, 3, 5):
        g.update(cpu_update_input=[{"actual_seq_lengths_kv": [n], "not_an_argument": 1}])
        g.replay()
        assert torch.equal(out.cpu(), _fia(q, k, v, [n])[0].cpu())
    with pytest.raises(RuntimeError, match="captured 1 operators"):
        g.update(cpu_update_input=[{}, {}])
    assert g.graph_dispatch_mode.update_stream is torch.npu.NPUGraph().graph_dispatch_mode.update_stream


def test_record_keeps_weak_views_and_copies():
    # The record holds views of npu tensors (not the caller's objects) and copies of the rest:
    # a list the caller changes after capture does not change what replays.
    q, k, v = _inputs()
    lengths = [3]
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, auto_dispatch_capture=True):
        out, lse = _fia(q, k, v, lengths)
    record = g.graph_dispatch_mode.graph_dispatch_records[0]
    lengths.append(99)
    assert record.kwargs["actual_seq_lengths_kv"] == [3]
    kept_out = record.kwargs["attention_out"]  # the .out overload's output, kept as a view
    assert kept_out is not out and kept_out.data_ptr() == out.data_ptr()
    handler = torch.npu.NpuGraphOpHandler
    cpu = torch.ones(2)
    assert handler.record_wrap_kwarg("x", cpu, ["x"]) is not cpu
    assert handler.record_wrap_kwarg("x", None, ["x"]) is None
    npu = torch.ones(2, device="npu")
    view = handler.record_wrap_kwarg("x", npu, ["x"])
    assert view is not npu and view.data_ptr() == npu.data_ptr()
    assert handler.record_wrap_kwarg("scale", 0.5, ["x"]) == 0.5
    g.update(cpu_update_input=[{"actual_seq_lengths_kv": [5]}])
    g.replay()
    assert torch.equal(out.cpu(), _fia(q, k, v, [5])[0].cpu())


def test_update_refused_without_updatable_capture():
    x = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        x.add_(1)
    with pytest.raises(RuntimeError, match="auto_dispatch_capture"):
        g.update(cpu_update_input=[{}])
    g2 = torch.npu.NPUGraph()
    with torch.npu.graph(g2, auto_dispatch_capture=True):
        x.add_(1)
    with pytest.raises(RuntimeError, match="nothing to update"):
        g2.update(cpu_update_input=[{"context_lens": [1]}])


def test_external_event_is_a_flag():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    event = torch.npu.ExternalEvent()
    x = torch.zeros(1, device="npu")
    # The first call of an operator signature runs synchronously (proving it, see
    # ops/src/zero_copy.cpp): run both once, or the add below would wait for `a` on the host.
    x.add_(1).mul_(10).zero_()
    event.wait(a)  # before any record: a waits until b records
    with torch.npu.stream(a):
        x.add_(1)
    with torch.npu.stream(b):
        x.mul_(10)
    event.record(b)
    a.synchronize()
    assert x.cpu().item() == 1  # 0 * 10 + 1: a ran after b's record
    assert event.npu_event != 0 and "ExternalEvent" in repr(event)


def test_out_list_of_fused_infer_attention():
    q, k, v = _inputs()
    out = torch.empty(1, 2, 1, 16, dtype=torch.float16, device="npu")
    lse = torch.empty(0, dtype=torch.float32, device="npu")
    FIA.out(q, k, v, num_heads=2, input_layout="BNSD", scale=0.25, actual_seq_lengths_kv=[5], out=[out, lse])
    assert torch.equal(out.cpu(), _fia(q, k, v, [5])[0].cpu())
    with pytest.raises(RuntimeError, match="out must be a list of 2 tensors"):
        FIA.out(q, k, v, num_heads=2, input_layout="BNSD", out=[out])


def test_super_kernel_scope_and_optimize():
    x = torch.randn(8, 8, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.super_kernel_optimize()
    with torch.npu.graph(g):
        torch_npu.npu.super_kernel_scope_begin("s")
        y = x @ x + 1
        torch_npu.npu.super_kernel_scope_end("s")
    g.super_kernel_optimize({"stream_fusion": 1, "aggressive_opt_strategies": {"event_breaker_bypass": 1}},
                            {"debug_sync_all": 1})
    g.replay()
    assert torch.allclose(y.cpu(), (x @ x + 1).cpu())
    for bad in ({"stream_fusion": "1"}, {"nope": 1}, {"dcci_before_kernel_start": [1]},
                {"aggressive_opt_strategies": {"nope": 1}}, "options"):
        with pytest.raises(RuntimeError):
            g.super_kernel_optimize(optimize_options=bad)
    for name in ("", "   ", 3):
        with pytest.raises(RuntimeError, match="scope_name"):
            torch_npu.npu.super_kernel_scope_begin(name)


def test_handler_registry():
    from torch_npu.npu._npugraph_handlers.npugraph_handler import _NPU_GRAPH_OP_HANDLERS
    specs = _NPU_GRAPH_OP_HANDLERS["npu_fused_infer_attention_score.out"].get_update_specs(
        "npu_fused_infer_attention_score.out")
    assert ("arg", 6, "actual_seq_lengths_kv") in specs
    with pytest.raises(TypeError):
        torch.npu.register_npu_graph_handler("x")(object)
