"""The AFD scheduler operators ``torch.ops.npu.{ffn,attention}_worker_scheduler{,_}``
(op-plugin's schemas; CANN's AICPU kernels FfnWorkerScheduler / AttentionWorkerScheduler).

They are Python kernels registered for npu (PrivateUse1) with fake implementations for
torch.compile. A kernel runs in the stream's order: it waits for the current stream (work
queued there, e.g. the writes that set the flags, finishes first), then runs on the calling
thread on the context and the windows it points to (zero-copy views of npu memory, see
_layout). Where the device kernel spins on flags another worker writes into the window, this
one polls them with a short sleep (other threads and processes keep running), stops when
``run_flag`` becomes 0 (``ScheduleContextHolder.stop_schedule``) and raises after
:data:`POLL_TIMEOUT_S` seconds (default 120; environment TORCH_NPU_AFD_POLL_TIMEOUT) instead
of hanging.

ffn_worker_scheduler_(context, *, sync_group_size=1, execute_mode=0), FFN side
    The token-info area holds one record per (session, micro batch): flag, layer id, expert
    ids. Sessions form groups of ``sync_group_size``. With one group (sync_group_size ==
    session_num) it waits until every session's record of micro batch ``polling_index`` is
    flagged, outputs them and advances ``polling_index``; otherwise it waits until some group
    has a micro batch flagged in all its sessions, then outputs, for every group, the first
    such micro batch. Output i (i < ``out_num``) is layer_ids[i], session_ids[i],
    micro_batch_ids[i] and expert_ids[i, :]; each consumed record gets flag 0 and expert ids
    0x7F7F7F7F. ``execute_mode`` must be 0 (once).
attention_worker_scheduler_(context), attention side
    Takes micro batch (micro_batch_id + 1) % micro_batch_num, waits until all its
    micro_batch_size * selected_expert_num flags are 1, clears them and stores the micro
    batch as ``micro_batch_id``.
The functional forms run the same on a copy of the context and return it (the windows, which
the context only points to, are updated either way).
"""
import os
import time
from typing import Callable

import torch

from . import _layout as L

#: Seconds a scheduler operator polls for ready flags before raising (a never-set flag would
#: otherwise spin forever). None: the environment variable TORCH_NPU_AFD_POLL_TIMEOUT, else 120.
POLL_TIMEOUT_S = None
_DEFAULT_POLL_TIMEOUT_S = 120.0


def _poll_timeout() -> float:
    if POLL_TIMEOUT_S is not None:
        return float(POLL_TIMEOUT_S)
    value = os.environ.get("TORCH_NPU_AFD_POLL_TIMEOUT", "").strip()
    if not value:
        return _DEFAULT_POLL_TIMEOUT_S
    try:
        timeout = float(value)
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise ValueError(f"TORCH_NPU_AFD_POLL_TIMEOUT must be a positive number of seconds, "
                         f"got {value!r}")
    return timeout

SCHEMAS = {
    "ffn_worker_scheduler_":
        "ffn_worker_scheduler_(Tensor(a!) self, *, int sync_group_size=1, int execute_mode=0) -> Tensor(a!)",
    "ffn_worker_scheduler":
        "ffn_worker_scheduler(Tensor self, *, int sync_group_size=1, int execute_mode=0) -> Tensor",
    "attention_worker_scheduler_":
        "attention_worker_scheduler_(Tensor(a!) self) -> Tensor(a!)",
    "attention_worker_scheduler":
        "attention_worker_scheduler(Tensor self) -> Tensor",
}
OP_NAMES = tuple(SCHEMAS)


# --------------------------------------------------------------------------- helpers
def _check_context_tensor(who: str, ctx) -> None:
    if not isinstance(ctx, torch.Tensor):
        raise TypeError(f"{who}: argument 'self' (the schedule context) must be a Tensor, "
                        f"got {type(ctx).__name__}")
    if ctx.device.type != "npu":
        raise RuntimeError(f"{who}: argument 'self' (the schedule context) must be an npu "
                           f"tensor, got a {ctx.device.type} tensor")
    if ctx.dtype != torch.int8:
        raise RuntimeError(f"{who}: argument 'self' (the schedule context) must be int8, "
                           f"got {ctx.dtype}")
    if ctx.dim() != 1 or ctx.numel() < L.CONTEXT_SIZE:
        raise RuntimeError(f"{who}: argument 'self' (the schedule context) must be "
                           f"one-dimensional with at least {L.CONTEXT_SIZE} bytes (shape "
                           f"({L.CONTEXT_SIZE},)), got shape {tuple(ctx.shape)}")
    if not ctx.is_contiguous():
        raise RuntimeError(f"{who}: argument 'self' (the schedule context) must be contiguous")


def _open_context(who: str, ctx: torch.Tensor):
    """(alias, context struct): the npu context's bytes, live, after its stream's work."""
    import torch_npu

    if torch_npu._C._npu_isCurrentStreamCapturing():
        raise RuntimeError(f"{who}: cannot be captured into an NPUGraph (the scheduler polls "
                           f"flags written by other workers at run time)")
    torch.npu.current_stream(ctx.device).synchronize()
    alias = torch_npu._C._npu_cpuAlias(ctx)
    return alias, L.ScheduleContext.from_address(alias.data_ptr())


def _require(who: str, ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(f"{who}: invalid schedule context: {message}")


def _poll(who: str, ready: Callable[[], bool], running: Callable[[], bool],
          waiting_for: Callable[[], str]) -> bool:
    """Wait until ``ready()``; False if ``running()`` turns false first; raise on timeout."""
    timeout = _poll_timeout()
    deadline = time.monotonic() + timeout
    delay = 1e-4
    while running():
        if ready():
            return True
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{who}: timed out after {timeout:g} s waiting for {waiting_for()} "
                f"(run_flag is still 1; the sending worker never set them -- call "
                f"ScheduleContextHolder.stop_schedule() to end polling, or raise "
                f"torch_npu._afd._ops.POLL_TIMEOUT_S / TORCH_NPU_AFD_POLL_TIMEOUT)")
        time.sleep(delay)  # releases the GIL: the writers keep running
        delay = min(delay * 2, 5e-3)
    return False


# --------------------------------------------------------------------------- FFN side
def _ffn_kernel(ctx: torch.Tensor, sync_group_size: int, execute_mode: int) -> None:
    who = "ffn_worker_scheduler"
    _check_context_tensor(who, ctx)
    if execute_mode != 0:
        raise RuntimeError(f"{who}: argument 'execute_mode' must be 0 (once), got {execute_mode}")
    alias, c = _open_context(who, ctx)
    common, ffn = c.common, c.ffn
    _require(who, common.schedule_mode == L.SCHEDULE_MODE_FFN,
             f"schedule_mode is {common.schedule_mode}, expected {L.SCHEDULE_MODE_FFN} (FFN); "
             f"use attention_worker_scheduler for an attention-side context")
    S, M = common.session_num, common.micro_batch_num
    slots = common.micro_batch_size * common.selected_expert_num
    for name in ("session_num", "micro_batch_num", "micro_batch_size", "selected_expert_num"):
        _require(who, getattr(common, name) > 0, f"{name} must be > 0")
    for name in ("token_info_buf", "token_data_buf", "layer_ids_buf", "session_ids_buf",
                 "micro_batch_ids_buf", "expert_ids_buf"):
        _require(who, getattr(ffn, name) != 0, f"ffn.{name} is a null address")
    per_record = L.ffn_desc_size(common)
    info_size = L.checked_product(who, S, M, per_record)
    _require(who, ffn.token_info_buf_size >= info_size,
             f"ffn.token_info_buf_size = {ffn.token_info_buf_size} < {info_size}")
    for name in ("layer_ids_buf", "session_ids_buf", "micro_batch_ids_buf"):
        _require(who, getattr(ffn, name + "_size") >= 4 * S,
                 f"ffn.{name}_size = {getattr(ffn, name + '_size')} < {4 * S}")
    _require(who, ffn.expert_ids_buf_size >= 4 * S * slots,
             f"ffn.expert_ids_buf_size = {ffn.expert_ids_buf_size} < {4 * S * slots}")
    _require(who, ffn.polling_index < M,
             f"ffn.polling_index = {ffn.polling_index} must be < micro_batch_num = {M}")
    if isinstance(sync_group_size, bool) or not 1 <= sync_group_size <= S or S % sync_group_size:
        raise RuntimeError(f"{who}: argument 'sync_group_size' must be in [1, session_num = {S}] "
                           f"and divide session_num, got {sync_group_size}")

    device = ctx.device.index
    L.check_npu_range(who, "ffn.token_info_buf", ffn.token_info_buf, info_size, device)
    outputs = {}
    for name, nbytes in (("layer_ids_buf", 4 * S), ("session_ids_buf", 4 * S),
                         ("micro_batch_ids_buf", 4 * S), ("expert_ids_buf", 4 * S * slots)):
        L.check_npu_range(who, "ffn." + name, getattr(ffn, name), nbytes, device)
        outputs[name] = L.host_view(getattr(ffn, name), nbytes)
    expert_ids_out = outputs["expert_ids_buf"].view(S, slots)
    records = L.host_view(ffn.token_info_buf, info_size).view(S, M, per_record // 4)
    flags = records[:, :, 0]  # [session, micro batch], live

    def emit(mb: int, first: int, end: int) -> None:
        """Output sessions [first, end) of micro batch ``mb`` and mark their records consumed."""
        out, n = ffn.out_num, end - first
        outputs["layer_ids_buf"][out:out + n] = records[first:end, mb, 1]
        outputs["session_ids_buf"][out:out + n] = torch.arange(first, end, dtype=torch.int32)
        outputs["micro_batch_ids_buf"][out:out + n] = mb
        expert_ids_out[out:out + n] = records[first:end, mb, 2:]
        records[first:end, mb, 2:] = L.EXPERT_ID_RESET
        records[first:end, mb, 0] = L.INVALID_FLAG
        ffn.out_num = out + n

    def running() -> bool:
        return c.control.run_flag != L.RUN_FLAG_STOP

    ffn.out_num = 0
    groups = S // sync_group_size
    if groups == 1:
        # All sessions synchronised: micro batches are taken in turn from polling_index.
        mb = ffn.polling_index
        if _poll(who, lambda: bool((flags[:, mb] == L.VALID_FLAG).all()), running,
                 lambda: f"all {S} sessions' flags of micro batch {mb}"):
            emit(mb, 0, S)
            ffn.polling_index = (mb + 1) % M
    else:
        def ready() -> torch.Tensor:  # [group, micro batch]: flagged in all the group's sessions
            return (flags.reshape(groups, sync_group_size, M) == L.VALID_FLAG).all(dim=1)

        if _poll(who, lambda: bool(ready().any()), running,
                 lambda: f"any group of {sync_group_size} sessions with a micro batch flagged "
                         f"in all of them"):
            for g in range(groups):
                first = g * sync_group_size
                done = (flags[first:first + sync_group_size] == L.VALID_FLAG).all(dim=0)
                if bool(done.any()):
                    emit(int(done.nonzero()[0]), first, first + sync_group_size)
    del alias


# --------------------------------------------------------------------------- attention side
def _attention_kernel(ctx: torch.Tensor) -> None:
    who = "attention_worker_scheduler"
    _check_context_tensor(who, ctx)
    alias, c = _open_context(who, ctx)
    common, attn = c.common, c.attention
    _require(who, common.schedule_mode == L.SCHEDULE_MODE_ATTENTION,
             f"schedule_mode is {common.schedule_mode}, expected {L.SCHEDULE_MODE_ATTENTION} "
             f"(attention); use ffn_worker_scheduler for an FFN-side context")
    M = common.micro_batch_num
    for name in ("micro_batch_num", "micro_batch_size", "selected_expert_num"):
        _require(who, getattr(common, name) > 0, f"{name} must be > 0")
    for name in ("token_info_buf", "token_data_buf"):
        _require(who, getattr(attn, name) != 0, f"attention.{name} is a null address")
    flag_num = common.micro_batch_size * common.selected_expert_num
    per_batch = L.checked_product(who, 4, flag_num)
    info_size = L.checked_product(who, M, per_batch)
    _require(who, attn.token_info_buf_size >= info_size,
             f"attention.token_info_buf_size = {attn.token_info_buf_size} < {info_size}")
    _require(who, attn.micro_batch_id < M,
             f"attention.micro_batch_id = {attn.micro_batch_id} is out of range [0, {M})")
    L.check_npu_range(who, "attention.token_info_buf", attn.token_info_buf, info_size,
                      ctx.device.index)

    mb = (attn.micro_batch_id + 1) % M
    flags = L.host_view(attn.token_info_buf + mb * per_batch, per_batch)
    if _poll(who, lambda: bool((flags == L.VALID_FLAG).all()),
             lambda: c.control.run_flag != L.RUN_FLAG_STOP,
             lambda: f"micro batch {mb}: {int((flags == L.VALID_FLAG).sum())} of {flag_num} "
                     f"flags set"):
        flags.zero_()
        attn.micro_batch_id = mb
    del alias


# --------------------------------------------------------------------------- registration
def _ffn_worker_scheduler_(self, *, sync_group_size=1, execute_mode=0):
    _ffn_kernel(self, sync_group_size, execute_mode)
    torch.autograd.graph.increment_version(self)  # as any in-place op (no ADInplaceOrView kernel)
    return self


def _ffn_worker_scheduler(self, *, sync_group_size=1, execute_mode=0):
    _check_context_tensor("ffn_worker_scheduler", self)
    out = self.clone()
    _ffn_kernel(out, sync_group_size, execute_mode)
    return out


def _attention_worker_scheduler_(self):
    _attention_kernel(self)
    torch.autograd.graph.increment_version(self)
    return self


def _attention_worker_scheduler(self):
    _check_context_tensor("attention_worker_scheduler", self)
    out = self.clone()
    _attention_kernel(out)
    return out


def _not_on_npu(name: str):
    def kernel(self, *args, **kwargs):
        raise RuntimeError(f"{name}: argument 'self' (the schedule context) must be an npu "
                           f"tensor, got a {self.device.type} tensor")
    return kernel


_library = None  # keeps the registrations alive for the life of the process


def register() -> None:
    """Define the four operators in ``torch.ops.npu`` with kernels and fakes (once)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("npu", "FRAGMENT")
    kernels = {"ffn_worker_scheduler_": _ffn_worker_scheduler_,
               "ffn_worker_scheduler": _ffn_worker_scheduler,
               "attention_worker_scheduler_": _attention_worker_scheduler_,
               "attention_worker_scheduler": _attention_worker_scheduler}
    for name, schema in SCHEMAS.items():
        # "inplace" (mutates and returns self) lets torch.compile functionalize the op.
        library.define(schema, tags=(torch.Tag.inplace,) if name.endswith("_") else ())
        library.impl(name, kernels[name], "PrivateUse1")
        library.impl(name, _not_on_npu(name), "CPU")
    _library = library

    # Fakes (torch.compile, FakeTensorMode, meta): in place -> self, functional -> a new context.
    fake = torch.library.register_fake
    fake("npu::ffn_worker_scheduler_", lib=library)(
        lambda self, *, sync_group_size=1, execute_mode=0: self)
    fake("npu::ffn_worker_scheduler", lib=library)(
        lambda self, *, sync_group_size=1, execute_mode=0: torch.empty_like(self))
    fake("npu::attention_worker_scheduler_", lib=library)(lambda self: self)
    fake("npu::attention_worker_scheduler", lib=library)(lambda self: torch.empty_like(self))
