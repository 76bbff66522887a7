"""torch_npu._afd (Attention-FFN Disaggregation): the schedule context holder, its byte
layout, the scheduler operators against references computed here, bad arguments, and the
names the seed article imports. Scenarios adapted from torch_npu's test/_afd tests."""
import ctypes
import struct
import threading

import pytest
import torch

import torch_npu
import torch_npu._afd
from torch_npu._afd import _ops as afd_ops

ALIGN = 512
INT32_MAX = 2**31 - 1
RESET = 0x7F7F7F7F
A2F = (7168 + 4 + 511) // 512 * 512
F2A = 7168 * 2
WINDOW = 1 << 20

# Byte offsets of the packed 1024-byte context (torch_npu's ScheduleContext).
COMMON = ("<7Ii", 0, ("session_num", "micro_batch_num", "micro_batch_size",
                      "selected_expert_num", "expert_num", "attn_to_ffn_token_size",
                      "ffn_to_attn_token_size", "schedule_mode"))
RUN_FLAG = 128
ATTN = ("<4QI", 256, ("token_info_buf", "token_info_buf_size", "token_data_buf",
                      "token_data_buf_size", "micro_batch_id"))
FFN_IN = ("<5Q", 384, ("token_info_buf", "token_info_buf_size", "token_data_buf",
                       "token_data_buf_size", "polling_index"))
FFN_OUT = ("<8QI", 512, ("layer_ids_buf", "layer_ids_buf_size", "session_ids_buf",
                         "session_ids_buf_size", "micro_batch_ids_buf", "micro_batch_ids_buf_size",
                         "expert_ids_buf", "expert_ids_buf_size", "out_num"))


def parse(ctx: torch.Tensor) -> dict:
    raw = ctx.cpu().numpy().tobytes()
    assert len(raw) == 1024
    fields = {"run_flag": struct.unpack_from("<i", raw, RUN_FLAG)[0]}
    for fmt, offset, names in (COMMON, FFN_IN, FFN_OUT):
        fields.update(zip(names, struct.unpack_from(fmt, raw, offset)))
    fmt, offset, names = ATTN  # same names as the FFN area's: prefixed
    fields.update(zip(("attn_" + n for n in names), struct.unpack_from(fmt, raw, offset)))
    return fields


def align_up(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def read_i32(address, count):
    torch.npu.synchronize()
    return list(struct.unpack(f"<{count}i", ctypes.string_at(address, 4 * count)))


def _holder(mode, win, S, M, B, K, **kw):
    side = "ffn" if mode == 0 else "attention"
    params = dict(schedule_mode=mode, session_num=S, micro_batch_num=M, micro_batch_size=B,
                  selected_expert_num=K, expert_num=288, attn_to_ffn_token_size=A2F,
                  ffn_to_attn_token_size=F2A, **{f"{side}_window": win.data_ptr(),
                                                 f"{side}_window_size": win.numel()})
    params.update(kw)
    return torch_npu._afd.create_schedule_context_holder(**params)


def ffn_holder(win, S, M, B, K, **kw):
    return _holder(0, win, S, M, B, K, **kw)


def attn_holder(win, S, M, B, K, **kw):
    return _holder(1, win, S, M, B, K, **kw)


@pytest.fixture
def window():
    return torch.zeros(WINDOW, dtype=torch.int8, device="npu")


# --------------------------------------------------------------------------- names
def test_seed_imports():
    import torch_npu.npu  # noqa: F401
    import torch_npu._afd  # noqa: F401
    import torch_npu._inductor  # noqa: F401
    from torch_npu import contrib  # noqa: F401
    from torch_npu.utils import _add_tensor_methods, _apply_module_patch

    from torch_npu import _patches
    for _ in range(2):  # idempotent
        _add_tensor_methods()
        _apply_module_patch()
    assert _patches._applied
    assert torch.Tensor.npu in torch.nn.parameter.UninitializedTensorMixin._allowed_methods
    assert torch.nn.parameter.UninitializedTensorMixin._allowed_methods.count(torch.Tensor.npu) == 1
    assert torch.ones(2).npu().is_npu and hasattr(torch.nn.Module, "npu")


def test_op_names_and_schemas():
    expected = {
        "ffn_worker_scheduler_": "npu::ffn_worker_scheduler_(Tensor(a!) self, *, int sync_group_size=1, int execute_mode=0) -> Tensor(a!)",
        "ffn_worker_scheduler": "npu::ffn_worker_scheduler(Tensor self, *, int sync_group_size=1, int execute_mode=0) -> Tensor",
        "attention_worker_scheduler_": "npu::attention_worker_scheduler_(Tensor(a!) self) -> Tensor(a!)",
        "attention_worker_scheduler": "npu::attention_worker_scheduler(Tensor self) -> Tensor",
    }
    for name, schema in expected.items():
        packet = getattr(torch.ops.npu, name)
        assert str(packet.default._schema) == schema
        assert getattr(torch_npu._afd, name) is packet
        assert getattr(torch_npu, name) is packet
    assert torch_npu._afd.__all__ == ["create_schedule_context_holder"]
    assert isinstance(torch_npu._afd.ScheduleContextHolder, type)


# --------------------------------------------------------------------------- context
def test_ffn_context_layout(window):
    S, M, B, K = 2, 3, 6, 9
    window.fill_(5)
    holder = ffn_holder(window, S, M, B, K)
    assert isinstance(holder, torch_npu._afd.ScheduleContextHolder)
    ctx = holder.get_schedule_context_tensor()
    assert ctx.device.type == "npu" and ctx.dtype == torch.int8 and ctx.shape == (1024,)
    f = parse(ctx)
    assert (f["schedule_mode"], f["session_num"], f["micro_batch_num"], f["micro_batch_size"],
            f["selected_expert_num"], f["expert_num"], f["attn_to_ffn_token_size"],
            f["ffn_to_attn_token_size"]) == (0, S, M, B, K, 288, A2F, F2A)
    assert f["run_flag"] == 1
    info = S * M * (8 + 4 * B * K)
    base = window.data_ptr()
    assert (f["token_info_buf"], f["token_info_buf_size"]) == (base, info)
    assert f["token_data_buf"] == base + align_up(info)
    assert f["token_data_buf_size"] == WINDOW - align_up(info)
    assert f["polling_index"] == 0 and f["out_num"] == 0
    ids = align_up(4 * S)
    assert (f["layer_ids_buf_size"], f["session_ids_buf_size"], f["micro_batch_ids_buf_size"],
            f["expert_ids_buf_size"]) == (4 * S, 4 * S, 4 * S, 4 * S * B * K)
    assert f["session_ids_buf"] - f["layer_ids_buf"] == ids
    assert f["micro_batch_ids_buf"] - f["session_ids_buf"] == ids
    assert f["expert_ids_buf"] - f["micro_batch_ids_buf"] == ids
    # Token info records: flag 0, layer 0, expert ids INT32_MAX; the data area is untouched.
    records = window[:info].view(torch.int32).view(S * M, 2 + B * K).cpu()
    assert torch.equal(records[:, :2], torch.zeros(S * M, 2, dtype=torch.int32))
    assert bool((records[:, 2:] == INT32_MAX).all())
    assert bool((window[info:].cpu() == 5).all())

    text = holder.get_schedule_context_info()
    assert text.startswith("schedule context: schedule_mode=0, session_num=2, micro_batch_num=3")
    assert "ffn info:" in text and f"token_info_buf={base}," in text and "run_flag=1" in text
    holder.init()  # a second init does nothing
    assert holder.get_schedule_context_tensor() is ctx
    holder.stop_schedule()
    assert parse(ctx)["run_flag"] == 0 and "run_flag=0" in holder.get_schedule_context_info()


def test_attention_context_layout(window):
    S, M, B, K = 144, 3, 30, 9
    window.fill_(1)
    holder = attn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    f = parse(ctx)
    info = 4 * M * B * K
    base = window.data_ptr()
    assert (f["schedule_mode"], f["session_num"], f["run_flag"]) == (1, S, 1)
    assert (f["attn_token_info_buf"], f["attn_token_info_buf_size"]) == (base, info)
    assert f["attn_token_data_buf"] == base + align_up(info)
    assert f["attn_token_data_buf_size"] == WINDOW - align_up(info)
    assert f["attn_micro_batch_id"] == M - 1
    # The FFN area is not used on the attention side.
    assert f["token_info_buf"] == 0 and f["polling_index"] == 0 and f["layer_ids_buf"] == 0
    w = window.cpu()
    assert bool((w[:info] == 0).all()) and bool((w[info:] == 1).all())
    assert "attention info:" in holder.get_schedule_context_info()
    holder.stop_schedule()
    assert parse(ctx)["run_flag"] == 0


def test_uninitialized_holder(window):
    holder = torch_npu._afd.ScheduleContextHolder(0, 2, 3, 6, 9, 288, A2F, F2A,
                                                  window.data_ptr(), WINDOW)
    assert holder.get_schedule_context_info() == "Error: schedule context is not inited!"
    with pytest.raises(RuntimeError, match="not initialized"):
        holder.get_schedule_context_tensor()
    with pytest.raises(RuntimeError, match="not initialized"):
        holder.stop_schedule()
    holder.init()
    assert parse(holder.get_schedule_context_tensor())["session_num"] == 2


INVALID = [
    ({"session_num": 0}, "session_num"),
    ({"micro_batch_num": 0}, "micro_batch_num"),
    ({"session_num": 1 << 31, "micro_batch_num": 1 << 31}, "overflow"),
    ({"micro_batch_size": 0}, "micro_batch_size"),
    ({"micro_batch_num": 1 << 31, "micro_batch_size": 1 << 31}, "overflow"),
    ({"schedule_mode": 1, "micro_batch_num": 1 << 31, "micro_batch_size": 1 << 31}, "overflow"),
    ({"selected_expert_num": 0}, "selected_expert_num"),
    ({"expert_num": 0}, "expert_num"),
    ({"micro_batch_size": 1 << 31, "selected_expert_num": 1 << 31}, "overflow"),
    ({"schedule_mode": 1, "micro_batch_size": 1 << 31, "selected_expert_num": 1 << 31}, "overflow"),
    ({"ffn_window": 0}, "ffn_window can't be 0"),
    ({"ffn_window_size": 0}, "ffn_window_size can't be 0"),
    ({"ffn_window_size": 511}, "ffn_window_size = 511 must be >"),
    ({"schedule_mode": 1, "attention_window": 0}, "attention_window can't be 0"),
    ({"schedule_mode": 1, "attention_window_size": 0}, "attention_window_size can't be 0"),
    ({"schedule_mode": 1, "attention_window_size": 511}, "attention_window_size = 511 must be >"),
    ({"schedule_mode": 2}, "schedule_mode = 2 is not supported"),
    ({"attn_to_ffn_token_size": 1023}, "attn_to_ffn_token_size = 1023 must be a multiple of 512"),
    ({"ffn_to_attn_token_size": 400}, "ffn_to_attn_token_size = 400 must be a multiple of 512"),
    ({"ffn_window_size": 2 * WINDOW}, "not inside npu memory"),
]


@pytest.mark.parametrize("update,message", INVALID)
def test_create_with_invalid_params(window, update, message):
    params = dict(schedule_mode=0, session_num=288, micro_batch_num=3, micro_batch_size=30,
                  selected_expert_num=9, expert_num=288, attn_to_ffn_token_size=A2F,
                  ffn_to_attn_token_size=F2A, attention_window=window.data_ptr(),
                  attention_window_size=WINDOW, ffn_window=window.data_ptr(), ffn_window_size=WINDOW)
    params.update(update)
    with pytest.raises(RuntimeError, match=message):
        torch_npu._afd.create_schedule_context_holder(**params)


def test_create_with_bad_types_and_windows(window):
    with pytest.raises(TypeError, match="'session_num' must be an int"):
        ffn_holder(window, 2.0, 3, 6, 9)
    with pytest.raises(TypeError, match="'micro_batch_num' = -1 is out of range for uint32"):
        ffn_holder(window, 2, -1, 6, 9)
    with pytest.raises(TypeError, match="'ffn_window' must be an int"):
        ffn_holder(window, 2, 3, 6, 9, ffn_window=window)
    host = torch.zeros(WINDOW, dtype=torch.int8)  # host memory is no npu window
    with pytest.raises(RuntimeError, match="ffn_window = .* is not inside npu memory"):
        ffn_holder(window, 2, 3, 6, 9, ffn_window=host.data_ptr())


# --------------------------------------------------------------------------- FFN scheduler
def ffn_reference(records, polling_index, S, M, group):
    """The FFN scheduler on a host copy: records[s][m] = [flag, layer, *expert_ids]."""
    out = []

    def emit(mb, sessions):
        for s in sessions:
            rec = records[s][mb]
            out.append((rec[1], s, mb, list(rec[2:])))
            rec[2:] = [RESET] * (len(rec) - 2)
            rec[0] = 0

    if group == S:
        if all(records[s][polling_index][0] == 1 for s in range(S)):
            emit(polling_index, range(S))
            polling_index = (polling_index + 1) % M
    else:
        for g in range(S // group):
            sessions = range(g * group, (g + 1) * group)
            for mb in range(M):
                if all(records[s][mb][0] == 1 for s in sessions):
                    emit(mb, sessions)
                    break
    return out, polling_index


def window_records(window, S, M, slots):
    return window[:S * M * 4 * (2 + slots)].view(torch.int32).view(S, M, 2 + slots)


def check_ffn_outputs(f, expected, slots):
    n = len(expected)
    assert f["out_num"] == n
    assert read_i32(f["layer_ids_buf"], n) == [e[0] for e in expected]
    assert read_i32(f["session_ids_buf"], n) == [e[1] for e in expected]
    assert read_i32(f["micro_batch_ids_buf"], n) == [e[2] for e in expected]
    experts = read_i32(f["expert_ids_buf"], n * slots)
    assert [experts[i * slots:(i + 1) * slots] for i in range(n)] == [e[3] for e in expected]


def test_ffn_scheduler_all_flags_set(window):
    # torch_npu's scenario: every int32 of every record set to 1, sync_group_size = session_num.
    S, M, B, K = 2, 3, 6, 9
    slots = B * K
    holder = ffn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    recs = window_records(window, S, M, slots)
    recs.fill_(1)
    before = ctx.clone()
    records = recs.cpu().tolist()
    expected, polling = ffn_reference(records, 0, S, M, 2)

    out = torch_npu._afd.ffn_worker_scheduler(ctx, sync_group_size=2)
    assert torch.equal(ctx.cpu(), before.cpu())  # the functional form keeps its input
    assert not torch.equal(out.cpu(), ctx.cpu())
    f = parse(out)
    assert f["polling_index"] == polling == 1
    check_ffn_outputs(f, expected, slots)
    assert recs.cpu().tolist() == records

    # The in-place form on the next micro batch.
    recs.fill_(1)
    records = recs.cpu().tolist()
    expected, polling = ffn_reference(records, 0, S, M, 2)
    res = torch_npu._afd.ffn_worker_scheduler_(ctx, sync_group_size=2, execute_mode=0)
    assert res is ctx
    f = parse(ctx)
    assert f["polling_index"] == polling
    check_ffn_outputs(f, expected, slots)
    assert recs.cpu().tolist() == records


def test_ffn_scheduler_groups_random(window):
    S, M, B, K = 6, 3, 2, 3
    slots = B * K
    gen = torch.Generator().manual_seed(0)
    holder = ffn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    recs = window_records(window, S, M, slots)
    for group in (1, 2, 3):
        for _ in range(4):
            host = torch.randint(0, 100, (S, M, 2 + slots), dtype=torch.int32, generator=gen)
            host[:, :, 0] = (torch.rand(S, M, generator=gen) < 0.6).int()
            host[0, 0, 0] = 1  # at least one group ready: session 0 ... group, micro batch 0
            host[:group, 0, 0] = 1
            recs.copy_(host)
            records = host.tolist()
            expected, _ = ffn_reference(records, 0, S, M, group)
            torch.ops.npu.ffn_worker_scheduler_(ctx, sync_group_size=group)
            f = parse(ctx)
            check_ffn_outputs(f, expected, slots)
            assert f["polling_index"] == 0  # only the single-group mode advances it
            assert recs.cpu().tolist() == records


def test_ffn_scheduler_polling_index_cycles(window):
    S, M, B, K = 3, 3, 2, 2
    slots = B * K
    holder = ffn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    recs = window_records(window, S, M, slots)
    host = torch.arange(S * M * (2 + slots), dtype=torch.int32).view(S, M, 2 + slots)
    host[:, :, 0] = 1
    recs.copy_(host)
    records = host.tolist()
    polling = 0
    for step in range(M + 1):
        if step == M:  # everything consumed: flag micro batch 0 again
            recs[:, 0, 0] = 1
            for s in range(S):
                records[s][0][0] = 1
        expected, polling = ffn_reference(records, polling, S, M, S)
        torch_npu.ffn_worker_scheduler_(ctx, sync_group_size=S)
        f = parse(ctx)
        assert f["polling_index"] == polling == (step + 1) % M
        check_ffn_outputs(f, expected, slots)
        assert recs.cpu().tolist() == records


# --------------------------------------------------------------------------- attention scheduler
def test_attention_scheduler_all_flags_set(window):
    # torch_npu's scenario: all flags of all micro batches set.
    S, M, B, K = 144, 3, 30, 9
    holder = attn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    flags = window[:4 * M * B * K].view(torch.int32).view(M, B * K)
    flags.fill_(1)
    before = ctx.clone()
    out = torch_npu._afd.attention_worker_scheduler(ctx)
    assert torch.equal(ctx.cpu(), before.cpu())
    assert not torch.equal(out.cpu(), ctx.cpu())
    assert parse(out)["attn_micro_batch_id"] == 0 and parse(ctx)["attn_micro_batch_id"] == M - 1
    expected = torch.ones(M, B * K, dtype=torch.int32)
    expected[0] = 0
    assert torch.equal(flags.cpu(), expected)

    # In place, micro batches in turn: 0, 1, 2, 0.
    for step in range(M + 1):
        mb = step % M
        flags[mb].fill_(1)
        expected = flags.cpu().clone()
        expected[mb] = 0
        version = ctx._version
        assert torch_npu._afd.attention_worker_scheduler_(ctx) is ctx
        assert ctx._version > version
        assert parse(ctx)["attn_micro_batch_id"] == mb
        assert torch.equal(flags.cpu(), expected)


# --------------------------------------------------------------------------- polling
def test_stopped_schedule_returns_without_work(window):
    S, M, B, K = 2, 2, 2, 2
    holder = ffn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    window_records(window, S, M, B * K)[:, :, 0] = 0  # nothing ready
    holder.stop_schedule()
    before = window.cpu()
    torch_npu.ffn_worker_scheduler_(ctx, sync_group_size=S)
    f = parse(ctx)
    assert (f["out_num"], f["polling_index"]) == (0, 0)
    assert torch.equal(window.cpu(), before)

    a_win = torch.zeros(WINDOW, dtype=torch.int8, device="npu")
    a = attn_holder(a_win, S, M, B, K)
    a.stop_schedule()
    actx = a.get_schedule_context_tensor()
    torch_npu.attention_worker_scheduler_(actx)
    assert parse(actx)["attn_micro_batch_id"] == M - 1


def test_scheduler_waits_for_a_writer_thread(window, monkeypatch):
    # The flags come from "another worker" (a thread writing npu memory) while the op polls.
    monkeypatch.setattr(afd_ops, "POLL_TIMEOUT_S", 60.0)
    S, M, B, K = 4, 2, 3, 2
    holder = attn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    flags = window[:4 * M * B * K].view(torch.int32).view(M, B * K)
    writer = threading.Timer(0.1, lambda: flags[0].fill_(1))
    writer.start()
    torch_npu.attention_worker_scheduler_(ctx)
    writer.join()
    assert parse(ctx)["attn_micro_batch_id"] == 0
    assert bool((flags.cpu() == 0).all())


def test_stop_schedule_ends_polling(window, monkeypatch):
    monkeypatch.setattr(afd_ops, "POLL_TIMEOUT_S", 60.0)
    S, M, B, K = 2, 3, 2, 2
    holder = ffn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    before = window.cpu()
    stopper = threading.Timer(0.1, holder.stop_schedule)
    stopper.start()
    torch_npu.ffn_worker_scheduler_(ctx, sync_group_size=1)  # no flag is ever set
    stopper.join()
    f = parse(ctx)
    assert (f["run_flag"], f["out_num"]) == (0, 0)
    assert torch.equal(window.cpu(), before)


def test_poll_timeout_raises(window, monkeypatch):
    monkeypatch.setattr(afd_ops, "POLL_TIMEOUT_S", 0.05)
    S, M, B, K = 2, 3, 2, 2
    ctx = attn_holder(window, S, M, B, K).get_schedule_context_tensor()
    with pytest.raises(RuntimeError, match=r"timed out .* micro batch 0: 0 of 4 flags set"):
        torch_npu.attention_worker_scheduler_(ctx)
    assert parse(ctx)["attn_micro_batch_id"] == M - 1
    monkeypatch.setattr(afd_ops, "POLL_TIMEOUT_S", None)
    monkeypatch.setenv("TORCH_NPU_AFD_POLL_TIMEOUT", "0.05")
    with pytest.raises(RuntimeError, match=r"timed out after 0.05 s"):
        torch_npu.attention_worker_scheduler(ctx)
    monkeypatch.setenv("TORCH_NPU_AFD_POLL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TORCH_NPU_AFD_POLL_TIMEOUT must be a positive number"):
        torch_npu.attention_worker_scheduler(ctx)
    monkeypatch.setenv("TORCH_NPU_AFD_POLL_TIMEOUT", "0.05")
    holder = ffn_holder(window, S, M, B, K)
    fctx = holder.get_schedule_context_tensor()
    with pytest.raises(RuntimeError, match="timed out"):
        torch_npu.ffn_worker_scheduler(fctx, sync_group_size=2)
    # The holder owns the FFN output buffers: once it is gone, the context points at freed
    # memory, which the operator refuses instead of writing to it.
    del holder
    with pytest.raises(RuntimeError, match=r"ffn\.\w+_buf = .* is not inside npu memory"):
        torch_npu.ffn_worker_scheduler_(fctx, sync_group_size=2)


# --------------------------------------------------------------------------- bad arguments
def test_scheduler_bad_arguments(window):
    S, M, B, K = 2, 3, 2, 2
    fctx = ffn_holder(window, S, M, B, K).get_schedule_context_tensor()
    a_win = torch.zeros(WINDOW, dtype=torch.int8, device="npu")
    actx = attn_holder(a_win, S, M, B, K).get_schedule_context_tensor()
    for op in (torch_npu.ffn_worker_scheduler_, torch_npu.ffn_worker_scheduler):
        with pytest.raises(RuntimeError, match="must be an npu tensor, got a cpu tensor"):
            op(fctx.cpu())
        with pytest.raises(RuntimeError, match="must be int8"):
            op(fctx.view(torch.int32))
        with pytest.raises(RuntimeError, match=r"one-dimensional .* got shape \(2, 512\)"):
            op(fctx.view(2, 512))
        with pytest.raises(RuntimeError, match=r"got shape \(512,\)"):
            op(fctx[:512])
        with pytest.raises(RuntimeError, match="'execute_mode' must be 0"):
            op(fctx, execute_mode=1)
        for bad in (0, 3, 4):
            with pytest.raises(RuntimeError, match=f"'sync_group_size' .* got {bad}"):
                op(fctx, sync_group_size=bad)
        with pytest.raises(RuntimeError, match="schedule_mode is 1, expected 0"):
            op(actx)
    for op in (torch_npu.attention_worker_scheduler_, torch_npu.attention_worker_scheduler):
        with pytest.raises(RuntimeError, match="schedule_mode is 0, expected 1"):
            op(fctx)
        with pytest.raises(RuntimeError, match="must be an npu tensor"):
            op(actx.cpu())
    # A corrupted context: micro_batch_id out of range, window address not npu memory.
    bad = actx.clone()
    bad[288:292] = torch.tensor([M], dtype=torch.int32).view(torch.int8).npu()
    with pytest.raises(RuntimeError, match=r"micro_batch_id = 3 is out of range \[0, 3\)"):
        torch_npu.attention_worker_scheduler_(bad)
    bad = actx.clone()
    host = torch.zeros(4096, dtype=torch.int8)
    bad[256:264] = torch.tensor([host.data_ptr()], dtype=torch.int64).view(torch.int8).npu()
    with pytest.raises(RuntimeError, match="attention.token_info_buf = .* is not inside npu memory"):
        torch_npu.attention_worker_scheduler_(bad)


# --------------------------------------------------------------------------- compile
def test_fake_shapes(window):
    from torch._subclasses.fake_tensor import FakeTensorMode

    ctx = ffn_holder(window, 2, 3, 2, 2).get_schedule_context_tensor()
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = mode.from_tensor(ctx)
        out = torch.ops.npu.ffn_worker_scheduler(fake, sync_group_size=2)
        assert out.shape == (1024,) and out.dtype == torch.int8 and out is not fake
        assert torch.ops.npu.ffn_worker_scheduler_(fake) is fake
        assert torch.ops.npu.attention_worker_scheduler(fake).shape == (1024,)
        assert torch.ops.npu.attention_worker_scheduler_(fake) is fake
    meta = torch.empty(1024, dtype=torch.int8, device="meta")
    assert torch.ops.npu.ffn_worker_scheduler(meta).device.type == "meta"


def test_torch_compile(window):
    S, M, B, K = 2, 3, 2, 2
    slots = B * K
    torch._dynamo.reset()
    holder = ffn_holder(window, S, M, B, K)
    ctx = holder.get_schedule_context_tensor()
    recs = window_records(window, S, M, slots)

    @torch.compile
    def functional(c):
        return torch_npu._afd.ffn_worker_scheduler(c, sync_group_size=1)

    @torch.compile
    def inplace(c):
        torch_npu._afd.ffn_worker_scheduler_(c, sync_group_size=2, execute_mode=0)

    for fn, group in ((functional, 1), (inplace, 2)):
        host = torch.randint(0, 50, (S, M, 2 + slots), dtype=torch.int32)
        host[:, :, 0] = 1
        recs.copy_(host)
        records = host.tolist()
        expected, polling = ffn_reference(records, 0, S, M, group)
        before = ctx.clone()
        result = fn(ctx)
        target = ctx if result is None else result
        if result is not None:
            assert torch.equal(ctx.cpu(), before.cpu())
        f = parse(target)
        assert f["polling_index"] == polling
        check_ffn_outputs(f, expected, slots)
        assert recs.cpu().tolist() == records
    torch._dynamo.reset()
