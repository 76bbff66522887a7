"""op-plugin's AFD worker operators npu_ffn_worker_batching and npu_attention_worker_combine
(torch_npu._afd._worker_ops): results against references computed here from the documented
semantics, the context updates of the scheduling modes, bad arguments and fake shapes."""
import struct

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu
import torch_npu._afd
from torch_npu._afd import _ops as afd_ops

INT32_MAX = 2**31 - 1
MASK = 1000000
DTYPES = {0: torch.float16, 1: torch.bfloat16, 2: torch.int8}

# Byte offsets in the packed 1024-byte schedule context.
OFF = {
    "session_num": ("<I", 0), "micro_batch_num": ("<I", 4), "micro_batch_size": ("<I", 8),
    "selected_expert_num": ("<I", 12), "expert_num": ("<I", 16),
    "attn_to_ffn_token_size": ("<I", 20), "ffn_to_attn_token_size": ("<I", 24),
    "schedule_mode": ("<i", 28), "run_flag": ("<i", 128),
    "attn_token_info_buf": ("<Q", 256), "attn_token_info_buf_size": ("<Q", 264),
    "attn_token_data_buf": ("<Q", 272), "attn_token_data_buf_size": ("<Q", 280),
    "attn_micro_batch_id": ("<I", 288),
    "token_info_buf": ("<Q", 384), "token_info_buf_size": ("<Q", 392),
    "token_data_buf": ("<Q", 400), "token_data_buf_size": ("<Q", 408),
    "polling_index": ("<Q", 416),
    "layer_ids_buf": ("<Q", 512), "session_ids_buf": ("<Q", 528),
    "micro_batch_ids_buf": ("<Q", 544), "expert_ids_buf": ("<Q", 560), "out_num": ("<I", 576),
}


def make_context(**fields) -> torch.Tensor:
    raw = bytearray(1024)
    fields.setdefault("run_flag", 1)
    for name, value in fields.items():
        fmt, offset = OFF[name]
        struct.pack_into(fmt, raw, offset, value)
    return torch.frombuffer(raw, dtype=torch.int8).clone().npu()


def read(ctx: torch.Tensor, name: str) -> int:
    fmt, offset = OFF[name]
    return struct.unpack_from(fmt, ctx.cpu().numpy().tobytes(), offset)[0]


def npu_i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).npu()


# --------------------------------------------------------------------------- FFN side
def token_records(A, M, BS, K, H, HS, token_dtype, gen):
    """The FFN window's data area [A, M, BS, K, HS] bytes, its values and int8 scales."""
    raw = torch.randint(0, 256, (A, M, BS, K, HS), dtype=torch.uint8, generator=gen)  # padding
    if token_dtype == 2:
        values = torch.randint(-128, 128, (A, M, BS, K, H), dtype=torch.int8, generator=gen)
        scales = torch.rand(A, M, BS, K, 1, generator=gen) + 0.5
        raw[..., :H] = values.view(torch.uint8)
        raw[..., H:H + 4] = scales.view(torch.uint8)
        return raw, values, scales[..., 0]
    values = torch.randn(A, M, BS, K, H, generator=gen).to(DTYPES[token_dtype])
    raw[..., :2 * H] = values.view(torch.uint8)
    return raw, values, None


def batching_reference(ids, sources, values, scales, Y, H, dtype, expert_num, BS, K):
    """Expected outputs. ids: flat expert ids of the rows (row r's slot s at r * BS * K + s);
    sources[r] = (session, micro batch) of row r."""
    slots = BS * K
    picked = sorted((i for i in range(len(ids)) if ids[i] < MASK), key=lambda i: ids[i])  # stable
    n = len(picked)
    y = torch.zeros(Y, H, dtype=dtype)
    meta = torch.zeros(4, Y, dtype=torch.int32)
    scale = torch.zeros(Y)
    for j, i in enumerate(picked):
        s, m = sources[i // slots]
        b, k = (i % slots) // K, (i % slots) % K
        y[j] = values[s, m, b, k]
        meta[:, j] = torch.tensor([s, m, b, k])
        if scales is not None:
            scale[j] = scales[s, m, b, k]
    groups = []
    for i in picked:
        if groups and groups[-1][0] == ids[i]:
            groups[-1][1] += 1
        else:
            groups.append([ids[i], 1])
    group_list = torch.zeros(expert_num, 2, dtype=torch.int64)
    for row, (e, c) in enumerate(groups[:expert_num]):
        group_list[row] = torch.tensor([e, c])
    return y, group_list, meta, scale, n


def check_batching(out, ref, token_dtype):
    y, group_list, sessions, mbs, tokens, offsets, scale, actual = (t.cpu() for t in out)
    ry, rgroups, rmeta, rscale, n = ref
    assert out[0].device.type == "npu"
    assert int(actual[0]) == n and actual.dtype == torch.int64 and actual.shape == (1,)
    # Bit for bit: the operator moves token records, it does not compute on them.
    assert torch.equal(y[:n].view(torch.uint8), ry[:n].view(torch.uint8))
    assert torch.equal(group_list, rgroups)
    for got, want in zip((sessions, mbs, tokens, offsets), rmeta):
        assert got.dtype == torch.int32 and torch.equal(got[:n], want[:n])
    if token_dtype == 2:
        assert torch.equal(scale[:n], rscale[:n])


@pytest.mark.parametrize("token_dtype", [0, 1, 2])
def test_batching_from_scheduler_output(token_dtype):
    """need_schedule=0: expert ids, session and micro-batch ids from the scheduler's buffers."""
    gen = torch.Generator().manual_seed(token_dtype)
    A, M, BS, K, H = 3, 2, 2, 3, 8
    HS = 64 if token_dtype != 1 else 48  # any record size that holds a token
    dtype = DTYPES[token_dtype]
    raw, values, scales = token_records(A, M, BS, K, H, HS, token_dtype, gen)
    data = raw.npu()
    out_num, expert_num = 2, 5
    sources = [(2, 1), (0, 0)]
    ids = torch.randint(0, expert_num, (out_num * BS * K,), generator=gen, dtype=torch.int32)
    ids[[1, 7]] = MASK          # masked slots
    ids[4] = MASK + 12345
    ids[9] = -3                 # below the mask value: a valid (if odd) id, sorted first
    ids_buf = ids.npu()
    session_buf, mb_buf = npu_i32([s for s, _ in sources]), npu_i32([m for _, m in sources])
    ctx = make_context(session_num=A, micro_batch_num=M, micro_batch_size=BS,
                       selected_expert_num=K, attn_to_ffn_token_size=HS,
                       token_data_buf=data.data_ptr(), session_ids_buf=session_buf.data_ptr(),
                       micro_batch_ids_buf=mb_buf.data_ptr(), expert_ids_buf=ids_buf.data_ptr(),
                       out_num=out_num)
    before = ctx.cpu().clone()
    out = torch_npu.npu_ffn_worker_batching(ctx, 8, [A, BS, K, H], token_dtype=token_dtype,
                                            need_schedule=0, layer_num=1)
    Y = A * BS * K
    assert [tuple(t.shape) for t in out] == [(Y, H), (8, 2)] + [(Y,)] * 5 + [(1,)]
    assert [t.dtype for t in out] == [dtype, torch.int64] + [torch.int32] * 4 + [torch.float32,
                                                                                torch.int64]
    ref = batching_reference(ids.tolist(), sources, values, scales, Y, H, dtype, 8, BS, K)
    check_batching(out, ref, token_dtype)
    assert int(out[-1][0]) == out_num * BS * K - 3
    assert torch.equal(ctx.cpu(), before)  # need_schedule=0 changes nothing in the context


def test_batching_recv_consumes_micro_batch():
    """need_schedule=1: waits for micro batch polling_index in all sessions, consumes it."""
    gen = torch.Generator().manual_seed(7)
    A, M, BS, K, H, HS = 2, 3, 2, 2, 16, 32
    raw, values, scales = token_records(A, M, BS, K, H, HS, 2, gen)
    data = raw.npu()
    F = 2 + BS * K
    info = torch.zeros(A, M, F, dtype=torch.int32)
    info[:, :, 1] = 4                                     # layer id
    info[:, :, 2:] = torch.randint(0, 3, (A, M, BS * K), generator=gen, dtype=torch.int32)
    info[1, 1, 3] = MASK
    info[:, 1, 0] = 1                                     # micro batch 1 ready in both sessions
    info[0, 2, 0] = 1                                     # micro batch 2 only in session 0
    info_npu = info.npu()
    ctx = make_context(session_num=A, micro_batch_num=M, micro_batch_size=BS,
                       selected_expert_num=K, attn_to_ffn_token_size=HS,
                       token_info_buf=info_npu.data_ptr(), token_data_buf=data.data_ptr(),
                       polling_index=1)
    out = torch.ops.npu.npu_ffn_worker_batching(ctx, 4, [A, BS, K, H], token_dtype=2,
                                                need_schedule=1)
    ids = info[:, 1, 2:].reshape(-1).tolist()
    ref = batching_reference(ids, [(0, 1), (1, 1)], values, scales, A * BS * K, H, torch.int8, 4,
                             BS, K)
    check_batching(out, ref, 2)
    assert read(ctx, "polling_index") == 2
    after = info.clone()
    after[:, 1, 0] = 0
    after[:, 1, 2:] = INT32_MAX
    assert torch.equal(info_npu.cpu(), after)             # consumed; the rest untouched


def test_batching_recv_stop_and_timeout(monkeypatch):
    A, M, BS, K, H, HS = 2, 1, 1, 2, 4, 8
    data = torch.zeros(A * M * BS * K * HS, dtype=torch.int8, device="npu")
    info = torch.zeros(A, M, 2 + BS * K, dtype=torch.int32)
    info[0, 0, 0] = 1                                     # session 1 never ready
    info_npu = info.npu()
    fields = dict(session_num=A, micro_batch_num=M, micro_batch_size=BS, selected_expert_num=K,
                  attn_to_ffn_token_size=HS, token_info_buf=info_npu.data_ptr(),
                  token_data_buf=data.data_ptr())
    # run_flag 0: nothing to wait for; an empty batch, nothing consumed.
    ctx = make_context(run_flag=0, **fields)
    out = torch_npu.npu_ffn_worker_batching(ctx, 2, [A, BS, K, H], need_schedule=1)
    assert int(out[-1][0]) == 0 and not bool(out[1].cpu().any())
    assert torch.equal(info_npu.cpu(), info) and read(ctx, "polling_index") == 0
    monkeypatch.setattr(afd_ops, "POLL_TIMEOUT_S", 0.2)
    with pytest.raises(RuntimeError, match="timed out .* micro batch 0"):
        torch_npu.npu_ffn_worker_batching(make_context(**fields), 2, [A, BS, K, H],
                                          need_schedule=1)


def test_batching_group_list_limited_to_expert_num():
    A, M, BS, K, H, HS = 1, 1, 2, 2, 2, 4
    data = torch.arange(A * M * BS * K * HS, dtype=torch.int8).npu()
    ids = npu_i32([9, 3, 7, 3])
    sessions, mbs = npu_i32([0]), npu_i32([0])
    ctx = make_context(session_num=A, micro_batch_num=M, micro_batch_size=BS,
                       selected_expert_num=K, attn_to_ffn_token_size=HS,
                       token_data_buf=data.data_ptr(), session_ids_buf=sessions.data_ptr(),
                       micro_batch_ids_buf=mbs.data_ptr(), expert_ids_buf=ids.data_ptr(), out_num=1)
    out = torch_npu.npu_ffn_worker_batching(ctx, 2, [A, BS, K, H])
    assert out[1].cpu().tolist() == [[3, 2], [7, 1]]      # at most expert_num rows
    assert int(out[-1][0]) == 4
    assert out[4].cpu().tolist() == [0, 1, 1, 0] and out[5].cpu().tolist() == [1, 1, 0, 0]
    # y rows: the records (4 bytes, H = 2 float16 values) of slots 1, 3, 2, 0
    assert torch.equal(out[0].cpu().view(torch.uint8),
                       data.cpu().view(torch.uint8).view(4, 4)[[1, 3, 2, 0]])


def test_batching_with_holder_and_scheduler():
    """The AFD pipeline: holder -> ffn_worker_scheduler_ -> npu_ffn_worker_batching."""
    S, M, B, K, H, HS = 2, 2, 2, 3, 8, 512
    window = torch.zeros(16384, dtype=torch.int8, device="npu")
    holder = torch_npu._afd.create_schedule_context_holder(
        0, S, M, B, K, 6, HS, 512, ffn_window=window.data_ptr(), ffn_window_size=window.numel())
    ctx = holder.get_schedule_context_tensor()
    info_off = read(ctx, "token_info_buf") - window.data_ptr()
    data_off = read(ctx, "token_data_buf") - window.data_ptr()
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(S, M, B, K, H, generator=gen).half()
    records = torch.zeros(S, M, B, K, HS, dtype=torch.uint8)
    records[..., :2 * H] = values.view(torch.uint8)
    window[data_off:data_off + records.numel()].copy_(records.view(torch.int8).reshape(-1))
    info = torch.zeros(S, M, 2 + B * K, dtype=torch.int32)
    info[:, :, 2:] = torch.randint(0, 6, (S, M, B * K), generator=gen, dtype=torch.int32)
    info[:, 0, 0] = 1
    window[info_off:info_off + info.numel() * 4].copy_(info.view(torch.int8).reshape(-1))
    torch_npu.ffn_worker_scheduler_(ctx, sync_group_size=S)
    out = torch_npu.npu_ffn_worker_batching(ctx, 6, [S, B, K, H], need_schedule=0)
    ref = batching_reference(info[:, 0, 2:].reshape(-1).tolist(), [(0, 0), (1, 0)], values, None,
                             S * B * K, H, torch.float16, 6, B, K)
    check_batching(out, ref, 0)
    holder.stop_schedule()


def batching_ctx(**over):
    data = torch.zeros(4096, dtype=torch.int8, device="npu")
    ids = npu_i32([0] * 8)
    fields = dict(session_num=2, micro_batch_num=1, micro_batch_size=2, selected_expert_num=2,
                  attn_to_ffn_token_size=64, token_data_buf=data.data_ptr(),
                  session_ids_buf=ids.data_ptr(), micro_batch_ids_buf=ids.data_ptr(),
                  expert_ids_buf=ids.data_ptr(), out_num=2)
    fields.update(over)
    return make_context(**fields), (data, ids)


BATCHING_ERRORS = [
    (dict(expert_num=0), "expert_num should be a positive number"),
    (dict(expert_num=8193), r"expert_num:8193 should be in range \(0, 8192\]"),
    (dict(max_out_shape=[2, 2, 2]), "max_out_shape must have 4 elements"),
    (dict(max_out_shape=[2, 0, 2, 8]), "second element of max_out_shape should be a positive"),
    (dict(max_out_shape=[1025, 2, 2, 8]), r"max_out_shape\[0\]:1025"),
    (dict(max_out_shape=[2, 2, 65, 8]), r"max_out_shape\[2\]:65"),
    (dict(token_dtype=3), "token_dtype should be 0, 1 or 2, but got 3"),
    (dict(token_dtype=torch.float16), "token_dtype should be 0, 1 or 2, but got 5"),
    (dict(need_schedule=2), "need_schedule should be 0 or 1 , but got 2"),
    (dict(layer_num=5), r"layer_num:5 must be in range of \[0, 4\]"),
    (dict(ctx=dict(attn_to_ffn_token_size=8)), "attn_to_ffn_token_size = 8 bytes cannot hold"),
    (dict(ctx=dict(out_num=3)), "out_num = 3 must be <= session_num = 2"),
    (dict(ctx=dict(session_num=0)), r"session_num = 0 must be in \(0, 1024\]"),
    (dict(ctx=dict(micro_batch_num=65)), r"micro_batch_num = 65 must be in \(0, 64\]"),
    (dict(ctx=dict(selected_expert_num=0)), "selected_expert_num = 0"),
    (dict(ctx=dict(token_data_buf=0)), "ffn.token_data_buf is a null address"),
    (dict(ctx=dict(expert_ids_buf=0x1000)), "ffn.expert_ids_buf = .* is not npu memory"),
    (dict(max_out_shape=[1, 2, 2, 8]), "rows exceed max_out_shape's capacity"),
    (dict(need_schedule=1, ctx=dict(polling_index=1)), "polling_index = 1 must be < micro_batch_num"),
]


@pytest.mark.parametrize("change,message", BATCHING_ERRORS)
def test_batching_bad_arguments(change, message):
    ctx, keep = batching_ctx(**change.get("ctx", {}))
    kwargs = dict(expert_num=4, max_out_shape=[2, 2, 2, 8], token_dtype=0, need_schedule=0,
                  layer_num=0)
    kwargs.update({k: v for k, v in change.items() if k != "ctx"})
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_ffn_worker_batching(ctx, kwargs.pop("expert_num"),
                                          kwargs.pop("max_out_shape"), **kwargs)


def test_batching_bad_ids_and_context():
    data = torch.zeros(4096, dtype=torch.int8, device="npu")
    zeros, bad = npu_i32([0] * 8), npu_i32([0, 5])
    common = dict(session_num=2, micro_batch_num=1, micro_batch_size=2, selected_expert_num=2,
                  attn_to_ffn_token_size=64, token_data_buf=data.data_ptr(),
                  expert_ids_buf=zeros.data_ptr(), out_num=2)
    ctx = make_context(session_ids_buf=bad.data_ptr(), micro_batch_ids_buf=zeros.data_ptr(), **common)
    with pytest.raises(RuntimeError, match=r"session_ids_buf\[1\] = 5 is out of range \[0, session_num = 2\)"):
        torch_npu.npu_ffn_worker_batching(ctx, 4, [2, 2, 2, 8])
    ctx = make_context(session_ids_buf=zeros.data_ptr(), micro_batch_ids_buf=bad.data_ptr(), **common)
    with pytest.raises(RuntimeError, match=r"micro_batch_ids_buf\[1\] = 5 is out of range \[0, micro_batch_num = 1\)"):
        torch_npu.npu_ffn_worker_batching(ctx, 4, [2, 2, 2, 8])
    with pytest.raises(RuntimeError, match="schedule_context must be an npu tensor"):
        torch_npu.npu_ffn_worker_batching(ctx.cpu(), 4, [2, 2, 2, 8])
    with pytest.raises(RuntimeError, match="schedule_context must be int8"):
        torch_npu.npu_ffn_worker_batching(ctx.view(torch.uint8), 4, [2, 2, 2, 8])
    with pytest.raises(RuntimeError, match="at least 1024 bytes"):
        torch_npu.npu_ffn_worker_batching(ctx[:512], 4, [2, 2, 2, 8])


def test_batching_fake():
    with FakeTensorMode():
        ctx = torch.empty(1024, dtype=torch.int8, device="npu")
        out = torch_npu.npu_ffn_worker_batching(ctx, 3, [4, 2, 5, 16], token_dtype=1,
                                                need_schedule=1, layer_num=1)
        assert [tuple(t.shape) for t in out] == [(40, 16), (3, 2)] + [(40,)] * 5 + [(1,)]
        assert [t.dtype for t in out] == ([torch.bfloat16, torch.int64] + [torch.int32] * 4
                                          + [torch.float32, torch.int64])
        assert all(t.device.type == "npu" for t in out)


# --------------------------------------------------------------------------- attention side
def combine_reference(tokens, scales, dtype):
    """y[b] = sum_k scales[b, k] * tokens[b, k] + tokens[b, K]: float32, products added in
    order, one rounding at the end."""
    t = tokens.float().numpy()
    s = scales.numpy()
    acc = np.zeros(t.shape[::2], dtype=np.float32)
    for k in range(s.shape[1]):
        acc = acc + t[:, k] * s[:, k:k + 1]
    return torch.from_numpy(acc + t[:, -1]).to(dtype)


def attention_window(M, BS, K, H, dtype, gen):
    tokens = (torch.randn(M, BS, K + 1, H, generator=gen) * 4).to(dtype)
    flags = torch.zeros(M, BS, K + 1, dtype=torch.int32)
    return tokens, flags, tokens.npu(), flags.npu()


@pytest.mark.parametrize("token_dtype", [0, 1, torch.float16, torch.bfloat16])
def test_combine(token_dtype):
    dtype = torch.bfloat16 if token_dtype in (1, torch.bfloat16) else torch.float16
    gen = torch.Generator().manual_seed(11)
    M, BS, K, H = 2, 3, 4, 40
    tokens, flags, tokens_npu, flags_npu = attention_window(M, BS, K, H, dtype, gen)
    scales = torch.rand(BS, K, generator=gen)
    ctx = make_context(micro_batch_num=M, attn_token_info_buf=flags_npu.data_ptr(),
                       attn_token_data_buf=tokens_npu.data_ptr(), attn_micro_batch_id=1)
    before = ctx.cpu().clone()
    layer = npu_i32([6])
    y, next_layer = torch_npu.npu_attention_worker_combine(ctx, scales.npu(), layer, H,
                                                           token_dtype=token_dtype)
    assert y.device.type == "npu" and y.dtype == dtype and y.shape == (BS, H)
    assert torch.equal(y.cpu(), combine_reference(tokens[1], scales, dtype))
    # Close to the float64 formula as well (one rounding to the token dtype).
    exact = (tokens[1, :, :K].double() * scales[..., None].double()).sum(1) + tokens[1, :, K].double()
    torch.testing.assert_close(y.cpu().double(), exact, rtol=8e-3, atol=1e-2)
    assert next_layer.dtype == torch.int32 and next_layer.cpu().tolist() == [7]
    assert layer.cpu().tolist() == [6] and torch.equal(ctx.cpu(), before)


def test_combine_scheduled():
    """need_schedule=1: micro batch (micro_batch_id + 1) % micro_batch_num, once its flags are
    all set; clears them and records the micro batch."""
    gen = torch.Generator().manual_seed(5)
    M, BS, K, H = 3, 2, 2, 16
    tokens, flags, tokens_npu, flags_npu = attention_window(M, BS, K, H, torch.float16, gen)
    flags[0] = 1            # the target: (2 + 1) % 3
    flags[1] = 0x13579      # other micro batches keep their flags
    flags_npu.copy_(flags)
    scales = torch.rand(BS, K, generator=gen)
    ctx = make_context(micro_batch_num=M, attn_token_info_buf=flags_npu.data_ptr(),
                       attn_token_data_buf=tokens_npu.data_ptr(), attn_micro_batch_id=2)
    y, nxt = torch_npu.npu_attention_worker_combine(ctx, scales.npu(), npu_i32([0]), H,
                                                    need_schedule=1)
    assert torch.equal(y.cpu(), combine_reference(tokens[0], scales, torch.float16))
    assert nxt.cpu().tolist() == [1] and read(ctx, "attn_micro_batch_id") == 0
    after = flags.clone()
    after[0] = 0
    assert torch.equal(flags_npu.cpu(), after)


def test_combine_scheduled_not_ready(monkeypatch):
    M, BS, K, H = 1, 2, 1, 8
    tokens_npu = torch.zeros(M * BS * (K + 1) * H, dtype=torch.float16, device="npu")
    flags_npu = npu_i32([1, 1, 0, 1])
    fields = dict(micro_batch_num=M, attn_token_info_buf=flags_npu.data_ptr(),
                  attn_token_data_buf=tokens_npu.data_ptr())
    scales, layer = torch.ones(BS, K).npu(), npu_i32([0])
    with pytest.raises(RuntimeError, match="run_flag was set to 0"):
        torch_npu.npu_attention_worker_combine(make_context(run_flag=0, **fields), scales, layer,
                                               H, need_schedule=1)
    monkeypatch.setattr(afd_ops, "POLL_TIMEOUT_S", 0.2)
    with pytest.raises(RuntimeError, match="timed out .* 3 of 4 flags set"):
        torch_npu.npu_attention_worker_combine(make_context(**fields), scales, layer, H,
                                               need_schedule=1)
    assert flags_npu.cpu().tolist() == [1, 1, 0, 1]


COMBINE_ERRORS = [
    (dict(scales=torch.ones(2, 3, dtype=torch.float16)), "expert_scales must be float32"),
    (dict(scales=torch.ones(6)), "expert_scales must be 2-dimensional"),
    (dict(scales=torch.ones(2, 65)), r"K in \(0, 64\]"),
    (dict(scales=torch.ones(0, 3)), "needs BS > 0"),
    (dict(layer=torch.tensor([1], dtype=torch.int64)), "layer_id must be int32"),
    (dict(layer=torch.tensor([1, 2], dtype=torch.int32)), r"layer_id must have shape \(1,\)"),
    (dict(hidden_size=0), "hidden_size should be a positive number"),
    (dict(token_dtype=2), r"token_dtype should be 0 \(float16\) or 1 \(bfloat16\), but got 2"),
    (dict(token_dtype=torch.float32), "token_dtype should be .* but got 6"),
    (dict(need_schedule=3), "need_schedule should be 0 or 1, but got 3"),
    (dict(ctx=dict(attn_token_data_buf=0)), "attention.token_data_buf .* is a null address"),
    (dict(ctx=dict(attn_micro_batch_id=1 << 30)), r"token_data_buf \(micro batch 1073741824\) .* is not npu memory"),
    (dict(need_schedule=1, ctx=dict(micro_batch_num=0)), "micro_batch_num must be > 0"),
]


@pytest.mark.parametrize("change,message", COMBINE_ERRORS)
def test_combine_bad_arguments(change, message):
    tokens = torch.zeros(2 * 4 * 8, dtype=torch.float16, device="npu")
    flags = torch.ones(2 * 4, dtype=torch.int32, device="npu")
    fields = dict(micro_batch_num=1, attn_token_info_buf=flags.data_ptr(),
                  attn_token_data_buf=tokens.data_ptr())
    fields.update(change.get("ctx", {}))
    ctx = make_context(**fields)
    scales = change.get("scales", torch.ones(2, 3)).npu()
    layer = change.get("layer", torch.tensor([1], dtype=torch.int32)).npu()
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_attention_worker_combine(
            ctx, scales, layer, change.get("hidden_size", 8),
            token_dtype=change.get("token_dtype", 0), need_schedule=change.get("need_schedule", 0))


def test_combine_devices():
    tokens = torch.zeros(64, dtype=torch.float16, device="npu")
    ctx = make_context(micro_batch_num=1, attn_token_data_buf=tokens.data_ptr())
    layer = npu_i32([0])
    with pytest.raises(RuntimeError, match="expert_scales must be on the schedule context's device"):
        torch_npu.npu_attention_worker_combine(ctx, torch.ones(2, 3), layer, 8)
    with pytest.raises(RuntimeError, match="schedule_context must be an npu tensor"):
        torch_npu.npu_attention_worker_combine(ctx.cpu(), torch.ones(2, 3), layer.cpu(), 8)
    with pytest.raises(TypeError, match="layer_id must be a Tensor"):
        torch_npu.npu_attention_worker_combine(ctx, torch.ones(2, 3).npu(), None, 8)


def test_combine_fake():
    with FakeTensorMode():
        ctx = torch.empty(1024, dtype=torch.int8, device="npu")
        scales = torch.empty(16, 8, device="npu")
        layer = torch.empty(1, dtype=torch.int32, device="npu")
        y, nxt = torch_npu.npu_attention_worker_combine(ctx, scales, layer, 64, token_dtype=1)
        assert y.shape == (16, 64) and y.dtype == torch.bfloat16 and y.device.type == "npu"
        assert nxt.shape == (1,) and nxt.dtype == torch.int32


def test_schemas():
    assert str(torch.ops.npu.npu_ffn_worker_batching.default._schema) == (
        "npu::npu_ffn_worker_batching(Tensor schedule_context, int expert_num, int[4] max_out_shape, "
        "*, int token_dtype=0, int need_schedule=0, int layer_num=0) -> (Tensor, Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor, Tensor)")
    assert str(torch.ops.npu.npu_attention_worker_combine.default._schema) == (
        "npu::npu_attention_worker_combine(Tensor schedule_context, Tensor expert_scales, "
        "Tensor layer_id, int hidden_size, *, int token_dtype=0, int need_schedule=0) -> "
        "(Tensor, Tensor)")
    assert torch_npu.npu_ffn_worker_batching is torch.ops.npu.npu_ffn_worker_batching
    assert torch_npu.npu_attention_worker_combine is torch.ops.npu.npu_attention_worker_combine
