"""op-plugin's AFD worker operators ``torch.ops.npu.npu_ffn_worker_batching`` and
``torch.ops.npu.npu_attention_worker_combine`` (also ``torch_npu.<name>``; CANN's AI Core kernels
FfnWorkerBatching / AttentionWorkerCombine).

Like the scheduler operators (``_ops``) they take the 1024-byte schedule context (``_layout``)
and follow the npu addresses it holds; they are Python kernels registered for npu
(PrivateUse1), with fake implementations for torch.compile / FakeTensorMode.

npu_ffn_worker_batching(schedule_context, expert_num, max_out_shape [A, BS, K, H], *,
                        token_dtype=0, need_schedule=0, layer_num=0)
    FFN side: regroups the tokens the attention workers sent by expert. The FFN window's data
    area holds one record per (session, micro batch, token, selected expert), layout
    [session_num, micro_batch_num, micro_batch_size, selected_expert_num] records of
    ``attn_to_ffn_token_size`` bytes: H float16 (token_dtype 0) / bfloat16 (1) values, or H
    int8 values followed by a float32 dynamic scale (2).
    need_schedule=0 takes the scheduler's output (ffn_worker_scheduler): the expert ids
    ``expert_ids_buf[out_num, BS*K]`` of sessions ``session_ids_buf[i]``, micro batches
    ``micro_batch_ids_buf[i]``. need_schedule=1 first waits until every session's token-info
    record of micro batch ``polling_index`` is flagged, advances ``polling_index``, takes those
    records' expert ids and marks them consumed (flag 0, expert ids INT32_MAX).
    The expert ids are sorted (stably); ids >= 1000000 are masked out. Outputs, capacity
    Y = A * BS * K rows of which the first ``actual_token_num`` are valid (the rest zero):
    y [Y, H] (the token records' values, bit for bit), group_list [expert_num, 2] int64
    (a row [expert id, token count] per distinct expert in order, at most expert_num rows,
    then zeros), session_ids / micro_batch_ids / token_ids / expert_offsets [Y] int32 (where
    each row came from), dynamic_scale [Y] float32 (token_dtype 2; zeros otherwise),
    actual_token_num [1] int64. layer_num only takes part in the checks (as in the kernel).
npu_attention_worker_combine(schedule_context, expert_scales [BS, K], layer_id [1], hidden_size,
                             *, token_dtype=0, need_schedule=0)
    Attention side: combines what the FFN workers sent back. The attention window's data area
    holds [micro_batch_num, BS, K + 1, hidden_size] float16 (token_dtype 0) / bfloat16 (1)
    values (K routed experts, then the shared expert); its token-info area one int32 flag per
    (micro batch, token, expert). need_schedule=0 reads micro batch ``micro_batch_id``;
    need_schedule=1 takes micro batch (micro_batch_id + 1) % micro_batch_num, waits until all
    its flags are 1, clears them and stores the micro batch as ``micro_batch_id``.
        y[b] = sum_k expert_scales[b, k] * token[b, k] + token[b, K]
    accumulated over k in order in float32 and rounded once to the token dtype;
    next_layer_id = layer_id + 1 (int32).

Waiting (need_schedule=1) polls with a short sleep and gives up after
``_ops.POLL_TIMEOUT_S``, as the scheduler operators do; when ``run_flag`` drops to 0 first,
npu_ffn_worker_batching returns an empty batch (actual_token_num 0, nothing consumed) and
npu_attention_worker_combine raises, having no data to combine.
"""
import torch

from torch_npu._composite_ops import _SCALAR_TYPES, _check, _op

from . import _layout as L
from . import _ops

OP_NAMES = ("npu_ffn_worker_batching", "npu_attention_worker_combine")

_BATCHING = "npu_ffn_worker_batching"
_COMBINE = "npu_attention_worker_combine"

# Expert ids from this value up mark masked slots (the kernel's sort keeps ids below it).
_EXPERT_MASK = 1000000
# Limits of the FfnWorkerBatching kernel (its tiling and context checks).
_MAX_EXPERT_NUM = 8192
_MAX_SESSIONS = 1024
_MAX_MICRO_BATCHES = 64
_MAX_SELECTED_EXPERTS = 64
# AttentionWorkerCombine: expert_scales' second dimension (routed experts per token).
_MAX_COMBINE_K = 64

# npu_ffn_worker_batching's token_dtype: y's dtype.
_BATCHING_DTYPES = {0: torch.float16, 1: torch.bfloat16, 2: torch.int8}
# npu_attention_worker_combine's token_dtype: 0 / 1, or (as op-plugin's own test passes it) the
# torch.dtype itself, which reaches the `int` argument as its ScalarType code.
_COMBINE_DTYPES = {0: torch.float16, 1: torch.bfloat16,
                   _SCALAR_TYPES.index(torch.float16): torch.float16,
                   _SCALAR_TYPES.index(torch.bfloat16): torch.bfloat16}


# --------------------------------------------------------------------------- helpers
def _check_context(who: str, ctx: torch.Tensor) -> None:
    _check(ctx.device.type == "npu",
           f"{who}: schedule_context must be an npu tensor, got a {ctx.device.type} tensor")
    _check(ctx.dtype == torch.int8, f"{who}: schedule_context must be int8, got {ctx.dtype}")
    _check(ctx.dim() == 1 and ctx.numel() >= L.CONTEXT_SIZE and ctx.is_contiguous(),
           f"{who}: schedule_context must be a contiguous one-dimensional tensor of at least "
           f"{L.CONTEXT_SIZE} bytes (shape ({L.CONTEXT_SIZE},)), got shape {tuple(ctx.shape)}")


def _check_mapped(who: str, name: str, address: int, nbytes: int, device: int) -> None:
    """RuntimeError unless [address, address + nbytes) lies in npu memory of ``device``.

    The kernels read whatever device memory the addresses name. Memory of a freed tensor
    stays mapped (in the caching allocator's segments) and keeps its bytes until it is reused,
    so, as on the device, a window may be the memory of a tensor already freed (op-plugin's
    own test passes ``tensor.npu().data_ptr()`` of a temporary). Addresses outside the
    allocator's segments are an error here (a memory fault on the device).
    """
    import torch_npu

    if address == 0:
        raise RuntimeError(f"{who}: invalid schedule context: {name} is a null address")
    end = address + nbytes
    spans = sorted((s["address"], s["address"] + s["total_size"])
                   for s in torch_npu._C._npu_memorySnapshot()["segments"]
                   if s.get("device", device) == device)
    start = stop = None
    for lo, hi in spans:  # adjacent segments merged: a range may span two of them
        if stop is not None and lo <= stop:
            stop = max(stop, hi)
        else:
            start, stop = lo, hi
        if start <= address and end <= stop:
            return
    raise RuntimeError(
        f"{who}: invalid schedule context: {name} = [{address:#x}, {end:#x}) ({nbytes} bytes) "
        f"is not npu memory of device {device}; it must be the data_ptr() of an npu tensor on "
        f"the context's device with at least that many bytes from that address")


def _same_device(who: str, name: str, tensor: torch.Tensor, ctx: torch.Tensor) -> None:
    _check(tensor.device == ctx.device,
           f"{who}: {name} must be on the schedule context's device {ctx.device}, "
           f"got {tensor.device}")


def _int_in(who: str, name: str, value: int, allowed) -> None:
    _check(value in allowed, f"{who}: {name} should be {' or '.join(map(str, allowed))}, "
                             f"but got {value}")


# --------------------------------------------------------------------------- FFN side
def _batching_args(expert_num, max_out_shape, token_dtype, need_schedule, layer_num):
    """op-plugin's argument checks (FfnWorkerBatchingKernelNpuOpApi.cpp, then the kernel's
    tiling); returns (Y, H, y dtype)."""
    who = _BATCHING
    _check(expert_num > 0, f"{who}: expert_num should be a positive number")
    _check(expert_num <= _MAX_EXPERT_NUM,
           f"{who}: expert_num:{expert_num} should be in range (0, {_MAX_EXPERT_NUM}]")
    _check(len(max_out_shape) > 0, f"{who}: max_out_shape is required")
    _check(len(max_out_shape) == 4, f"{who}: max_out_shape must have 4 elements, "
                                    f"got {list(max_out_shape)}")
    for i, nth in enumerate(("first", "second", "third", "fourth")):
        _check(max_out_shape[i] > 0,
               f"{who}: {nth} element of max_out_shape should be a positive number, "
               f"got {list(max_out_shape)}")
    a, bs, k, h = max_out_shape
    _check(a <= _MAX_SESSIONS,
           f"{who}: max_out_shape[0]:{a} should be in range of (0, {_MAX_SESSIONS}]")
    _check(k <= _MAX_SELECTED_EXPERTS,
           f"{who}: max_out_shape[2]:{k} should be in range of (0, {_MAX_SELECTED_EXPERTS}]")
    _check(token_dtype in _BATCHING_DTYPES,
           f"{who}: token_dtype should be 0, 1 or 2, but got {token_dtype}")
    _check(need_schedule in (0, 1), f"{who}: need_schedule should be 0 or 1 , but got {need_schedule}")
    _check(0 <= layer_num <= expert_num,
           f"{who}: layer_num:{layer_num} must be in range of [0, {expert_num}]")
    return a * bs * k, h, _BATCHING_DTYPES[token_dtype]


def _batching_outputs(Y, H, dtype, expert_num, device):
    """The eight outputs (fake / meta shapes as op-plugin's meta registration)."""
    def new(shape, dt):
        return torch.zeros(shape, dtype=dt, device=device)
    return (new((Y, H), dtype), new((expert_num, 2), torch.int64),
            *(new((Y,), torch.int32) for _ in range(4)),
            new((Y,), torch.float32), new((1,), torch.int64))


@_op("npu_ffn_worker_batching(Tensor schedule_context, int expert_num, int[4] max_out_shape, *, "
     "int token_dtype=0, int need_schedule=0, int layer_num=0) -> "
     "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", keys=("PrivateUse1", "CPU"))
def _npu_ffn_worker_batching(schedule_context, expert_num, max_out_shape, *, token_dtype=0,
                             need_schedule=0, layer_num=0):
    who = _BATCHING
    Y, H, dtype = _batching_args(expert_num, max_out_shape, token_dtype, need_schedule, layer_num)
    _check_context(who, schedule_context)
    alias, c = _ops._open_context(who, schedule_context)
    common, ffn = c.common, c.ffn
    A, M = common.session_num, common.micro_batch_num
    BS, K, HS = common.micro_batch_size, common.selected_expert_num, common.attn_to_ffn_token_size
    require = _ops._require
    require(who, 0 < A <= _MAX_SESSIONS, f"session_num = {A} must be in (0, {_MAX_SESSIONS}]")
    require(who, 0 < M <= _MAX_MICRO_BATCHES,
            f"micro_batch_num = {M} must be in (0, {_MAX_MICRO_BATCHES}]")
    require(who, BS > 0, "micro_batch_size must be > 0")
    require(who, 0 < K <= _MAX_SELECTED_EXPERTS,
            f"selected_expert_num = {K} must be in (0, {_MAX_SELECTED_EXPERTS}]")
    # A token record: H values (+ the int8 tokens' float32 scale) in attn_to_ffn_token_size bytes.
    token_bytes = H * dtype.itemsize + (4 if token_dtype == 2 else 0)
    require(who, HS >= token_bytes,
            f"attn_to_ffn_token_size = {HS} bytes cannot hold a token of max_out_shape[3] = {H} "
            f"{dtype} values{' and its float32 scale' if token_dtype == 2 else ''} "
            f"({token_bytes} bytes)")
    slots = BS * K
    device = schedule_context.device.index
    data_size = L.checked_product(who, A, M, slots, HS)
    _check_mapped(who, "ffn.token_data_buf", ffn.token_data_buf, data_size, device)
    outputs = _batching_outputs(Y, H, dtype, expert_num, "cpu")

    if need_schedule == 0:
        # The scheduler's output: out_num sessions' expert ids and where they came from.
        n = ffn.out_num
        require(who, n <= A, f"ffn.out_num = {n} must be <= session_num = {A}")
        require(who, n * slots <= Y,
                f"ffn.out_num * micro_batch_size * selected_expert_num = {n * slots} rows exceed "
                f"max_out_shape's capacity A * BS * K = {Y}")
        views = {}
        for name, nbytes in (("session_ids_buf", 4 * n), ("micro_batch_ids_buf", 4 * n),
                             ("expert_ids_buf", 4 * n * slots)):
            if n:
                _check_mapped(who, "ffn." + name, getattr(ffn, name), nbytes, device)
                views[name] = L.host_view(getattr(ffn, name), nbytes).clone()
            else:
                views[name] = torch.empty(0, dtype=torch.int32)
        sessions, micro_batches = views["session_ids_buf"], views["micro_batch_ids_buf"]
        for name, ids, bound, what in (("session_ids_buf", sessions, A, "session_num"),
                                       ("micro_batch_ids_buf", micro_batches, M, "micro_batch_num")):
            bad = ((ids < 0) | (ids >= bound)).nonzero().flatten()
            if bad.numel():
                i = int(bad[0])
                require(who, False, f"ffn.{name}[{i}] = {int(ids[i])} is out of range [0, {what} = {bound})")
        expert_ids = views["expert_ids_buf"]
    else:
        # Wait for micro batch polling_index in every session, then consume its records.
        mb = ffn.polling_index
        require(who, mb < M, f"ffn.polling_index = {mb} must be < micro_batch_num = {M}")
        require(who, A * slots <= Y,
                f"session_num * micro_batch_size * selected_expert_num = {A * slots} rows exceed "
                f"max_out_shape's capacity A * BS * K = {Y}")
        per_record = L.ffn_desc_size(common)
        info_size = L.checked_product(who, A, M, per_record)
        _check_mapped(who, "ffn.token_info_buf", ffn.token_info_buf, info_size, device)
        records = L.host_view(ffn.token_info_buf, info_size).view(A, M, per_record // 4)[:, mb]
        if not _ops._poll(who, lambda: bool((records[:, 0] == L.VALID_FLAG).all()),
                          lambda: c.control.run_flag != L.RUN_FLAG_STOP,
                          lambda: f"all {A} sessions' flags of micro batch {mb}"):
            del alias
            return tuple(t.to(schedule_context.device) for t in outputs)
        ffn.polling_index = (mb + 1) % M
        expert_ids = records[:, 2:].clone().reshape(-1)
        records[:, 2:] = L.INT32_MAX
        records[:, 0] = L.INVALID_FLAG
        sessions = torch.arange(A, dtype=torch.int32)
        micro_batches = torch.full((A,), mb, dtype=torch.int32)

    # Stable sort of the unmasked expert ids: the gather order.
    valid = expert_ids < _EXPERT_MASK
    count = int(valid.sum())
    keys = torch.where(valid, expert_ids, torch.iinfo(torch.int32).max).long()
    order = torch.sort(keys, stable=True).indices[:count]
    sorted_ids = expert_ids[order]
    row, slot = order // slots, order % slots
    token, offset = slot // K, slot % K
    session, micro_batch = sessions[row].long(), micro_batches[row].long()

    data = L.host_view(ffn.token_data_buf, data_size, torch.uint8).view(A, M, BS, K, HS)
    picked = data[session, micro_batch, token, offset]  # [count, HS] bytes
    y, group_list, session_ids, micro_batch_ids, token_ids, expert_offsets, scale, actual = outputs
    y[:count] = picked[:, :H * dtype.itemsize].contiguous().view(dtype)
    if token_dtype == 2:
        scale[:count] = picked[:, H:H + 4].contiguous().view(torch.float32).reshape(-1)
    session_ids[:count] = session.int()
    micro_batch_ids[:count] = micro_batch.int()
    token_ids[:count] = token.int()
    expert_offsets[:count] = offset.int()
    actual[0] = count
    experts, tokens = torch.unique_consecutive(sorted_ids, return_counts=True)
    groups = min(experts.numel(), expert_num)  # the kernel writes at most expert_num rows
    group_list[:groups, 0] = experts[:groups]
    group_list[:groups, 1] = tokens[:groups]
    del alias
    return tuple(t.to(schedule_context.device) for t in outputs)


@torch.library.register_fake("npu::npu_ffn_worker_batching")
def _npu_ffn_worker_batching_fake(schedule_context, expert_num, max_out_shape, *, token_dtype=0,
                                  need_schedule=0, layer_num=0):
    Y, H, dtype = _batching_args(expert_num, max_out_shape, token_dtype, need_schedule, layer_num)
    return _batching_outputs(Y, H, dtype, expert_num, schedule_context.device)


# --------------------------------------------------------------------------- attention side
def _combine_args(expert_scales, layer_id, hidden_size, token_dtype, need_schedule):
    """Argument checks; returns (BS, K, y dtype)."""
    who = _COMBINE
    _check(expert_scales.dtype == torch.float32,
           f"{who}: expert_scales must be float32, got {expert_scales.dtype}")
    _check(expert_scales.dim() == 2, f"{who}: expert_scales must be 2-dimensional (BS, K), "
                                     f"got shape {tuple(expert_scales.shape)}")
    bs, k = expert_scales.shape
    _check(bs > 0 and 0 < k <= _MAX_COMBINE_K,
           f"{who}: expert_scales (BS, K) needs BS > 0 and K in (0, {_MAX_COMBINE_K}], "
           f"got shape {tuple(expert_scales.shape)}")
    _check(layer_id.dtype == torch.int32, f"{who}: layer_id must be int32, got {layer_id.dtype}")
    _check(tuple(layer_id.shape) == (1,), f"{who}: layer_id must have shape (1,), "
                                          f"got {tuple(layer_id.shape)}")
    _check(hidden_size > 0, f"{who}: hidden_size should be a positive number, got {hidden_size}")
    _check(token_dtype in _COMBINE_DTYPES,
           f"{who}: token_dtype should be 0 (float16) or 1 (bfloat16), but got {token_dtype}")
    _int_in(who, "need_schedule", need_schedule, (0, 1))
    return bs, k, _COMBINE_DTYPES[token_dtype]


@_op("npu_attention_worker_combine(Tensor schedule_context, Tensor expert_scales, Tensor layer_id, "
     "int hidden_size, *, int token_dtype=0, int need_schedule=0) -> (Tensor, Tensor)",
     keys=("PrivateUse1", "CPU"))
def _npu_attention_worker_combine(schedule_context, expert_scales, layer_id, hidden_size, *,
                                  token_dtype=0, need_schedule=0):
    who = _COMBINE
    BS, K, dtype = _combine_args(expert_scales, layer_id, hidden_size, token_dtype, need_schedule)
    _check_context(who, schedule_context)
    _same_device(who, "expert_scales", expert_scales, schedule_context)
    _same_device(who, "layer_id", layer_id, schedule_context)
    alias, c = _ops._open_context(who, schedule_context)  # also orders after the stream's work
    attn = c.attention
    device = schedule_context.device.index
    H, slots = hidden_size, K + 1  # K routed experts, then the shared one
    if need_schedule == 1:
        M = c.common.micro_batch_num
        _ops._require(who, M > 0, "micro_batch_num must be > 0")
        mb = (attn.micro_batch_id + 1) % M
        flag_bytes = L.checked_product(who, 4, BS, slots)
        flag_addr = attn.token_info_buf + mb * flag_bytes
        _check_mapped(who, f"attention.token_info_buf (micro batch {mb})", flag_addr, flag_bytes,
                      device)
        flags = L.host_view(flag_addr, flag_bytes)
        if not _ops._poll(who, lambda: bool((flags == L.VALID_FLAG).all()),
                          lambda: c.control.run_flag != L.RUN_FLAG_STOP,
                          lambda: f"micro batch {mb}: {int((flags == L.VALID_FLAG).sum())} of "
                                  f"{flags.numel()} flags set"):
            raise RuntimeError(f"{who}: run_flag was set to 0 (stop_schedule) before micro batch "
                               f"{mb} was ready; there is nothing to combine")
    else:
        mb = attn.micro_batch_id
    data_bytes = L.checked_product(who, BS, slots, H, dtype.itemsize)
    data_addr = attn.token_data_buf + mb * data_bytes
    _check_mapped(who, f"attention.token_data_buf (micro batch {mb})", data_addr, data_bytes, device)
    tokens = L.host_view(data_addr, data_bytes, dtype).view(BS, slots, H).float()
    scales = expert_scales.cpu()
    acc = torch.zeros(BS, H)
    for k in range(K):  # the kernel's order: one product per expert, added in float32
        acc = acc + tokens[:, k] * scales[:, k, None]
    y = (acc + tokens[:, K]).to(dtype)
    if need_schedule == 1:
        flags.zero_()
        attn.micro_batch_id = mb
    del alias
    next_layer_id = (layer_id.cpu()[:1] + 1).to(torch.int32)
    return y.to(schedule_context.device), next_layer_id.to(schedule_context.device)


@torch.library.register_fake("npu::npu_attention_worker_combine")
def _npu_attention_worker_combine_fake(schedule_context, expert_scales, layer_id, hidden_size, *,
                                       token_dtype=0, need_schedule=0):
    BS, _, dtype = _combine_args(expert_scales, layer_id, hidden_size, token_dtype, need_schedule)
    return (schedule_context.new_empty((BS, hidden_size), dtype=dtype),
            schedule_context.new_empty((1,), dtype=torch.int32))
