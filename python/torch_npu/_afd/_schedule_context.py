"""ScheduleContextHolder: builds the schedule context of one AFD worker (torch_npu's
``torch_npu/csrc/afd/ScheduleContext.cpp``, here in Python over the simulator's memory).

``init()`` checks the parameters, lays out the token-info area at the start of the worker's
window (FFN side: every record's flag and layer id 0, expert ids INT32_MAX; attention side:
all flags 0), allocates the FFN side's output buffers (layer / session / micro-batch / expert
ids, one npu workspace), sets ``run_flag`` = 1 and copies the packed context into an int8 npu
tensor of 1024 bytes, which the scheduler operators then read and update.
"""
import torch

from . import _layout as L

__all__ = ["ScheduleContextHolder"]

_WHO = "ScheduleContextHolder"


def _int_arg(name: str, value, lo: int, hi: int, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_WHO}: argument '{name}' must be an int ({kind}), "
                        f"got {type(value).__name__}")
    if not lo <= value <= hi:
        raise TypeError(f"{_WHO}: argument '{name}' = {value} is out of range for {kind} "
                        f"[{lo}, {hi}]")
    return value


class ScheduleContextHolder:
    """Holds the scheduling context of one worker in Attention-FFN disaggregated inference.

    Args:
        schedule_mode: 0 schedules the FFN side, 1 the attention side
        session_num: number of sessions (attention workers)
        micro_batch_num: number of micro batches
        micro_batch_size: tokens per micro batch
        selected_expert_num: experts selected per token (top-k, plus shared experts)
        expert_num: experts per layer
        attn_to_ffn_token_size: bytes of one token in the FFN window's data area (multiple of 512)
        ffn_to_attn_token_size: bytes of one token in the attention window's data area
            (multiple of 512)
        ffn_window, ffn_window_size: address and size of the FFN window (schedule_mode=0)
        attention_window, attention_window_size: address and size of the attention window
            (schedule_mode=1)
    """

    def __init__(self, schedule_mode: int, session_num: int, micro_batch_num: int,
                 micro_batch_size: int, selected_expert_num: int, expert_num: int,
                 attn_to_ffn_token_size: int, ffn_to_attn_token_size: int,
                 ffn_window: int = 0, ffn_window_size: int = 0,
                 attention_window: int = 0, attention_window_size: int = 0) -> None:
        i32 = (-2**31, 2**31 - 1, "int32")
        u32 = (0, L.UINT32_MAX, "uint32")
        u64 = (0, L.UINT64_MAX, "uint64")
        c = L.ScheduleContext()
        common = c.common
        common.schedule_mode = _int_arg("schedule_mode", schedule_mode, *i32)
        for name, value in (("session_num", session_num), ("micro_batch_num", micro_batch_num),
                            ("micro_batch_size", micro_batch_size),
                            ("selected_expert_num", selected_expert_num),
                            ("expert_num", expert_num),
                            ("attn_to_ffn_token_size", attn_to_ffn_token_size),
                            ("ffn_to_attn_token_size", ffn_to_attn_token_size)):
            setattr(common, name, _int_arg(name, value, *u32))
        self._ffn_window = _int_arg("ffn_window", ffn_window, *u64)
        self._ffn_window_size = _int_arg("ffn_window_size", ffn_window_size, *u64)
        self._attention_window = _int_arg("attention_window", attention_window, *u64)
        self._attention_window_size = _int_arg("attention_window_size", attention_window_size, *u64)
        self._context = c                 # the host copy of the context
        self._context_tensor = None       # the npu copy, after init()
        self._workspace = None            # FFN side: the output buffers
        self._initialized = False

    # ------------------------------------------------------------------ checks
    def _check_params(self) -> None:
        common = self._context.common
        zero = [n for n in ("session_num", "micro_batch_num", "micro_batch_size",
                            "selected_expert_num", "expert_num") if getattr(common, n) == 0]
        if zero:
            raise RuntimeError(f"{_WHO}: {', '.join(zero)} must be > 0")
        for name in ("attn_to_ffn_token_size", "ffn_to_attn_token_size"):
            value = getattr(common, name)
            if value % L.BUF_ALIGN:
                raise RuntimeError(f"{_WHO}: {name} = {value} must be a multiple of {L.BUF_ALIGN}")
        mode = common.schedule_mode
        if mode == L.SCHEDULE_MODE_FFN:
            window, size, prefix = self._ffn_window, self._ffn_window_size, "ffn_window"
        elif mode == L.SCHEDULE_MODE_ATTENTION:
            window, size, prefix = self._attention_window, self._attention_window_size, "attention_window"
        else:
            raise RuntimeError(f"{_WHO}: schedule_mode = {mode} is not supported; expected "
                               f"{L.SCHEDULE_MODE_FFN} (FFN) or {L.SCHEDULE_MODE_ATTENTION} (attention)")
        if window == 0:
            raise RuntimeError(f"{_WHO}: {prefix} can't be 0 when schedule_mode = {mode}")
        if size == 0:
            raise RuntimeError(f"{_WHO}: {prefix}_size can't be 0 when schedule_mode = {mode}")

    def _token_info_layout(self, window: int, window_size: int, name: str, info_size: int):
        """Token info at the window's start, token data after it (512-aligned)."""
        aligned = L.align_up(info_size)
        if window_size <= aligned:
            raise RuntimeError(f"{_WHO}: {name}_size = {window_size} must be > the aligned token "
                               f"info size {aligned}")
        if window + aligned > L.UINT64_MAX:
            raise RuntimeError(f"{_WHO}: {name} + token info size overflows uint64")
        L.check_npu_range(_WHO, name, window, window_size, torch.npu.current_device())
        return aligned

    # ------------------------------------------------------------------ init
    def _init_ffn(self) -> None:
        c = self._context
        common, ffn = c.common, c.ffn
        S, M = common.session_num, common.micro_batch_num
        per_record = L.ffn_desc_size(common)
        info_size = L.checked_product("FFN token info size", per_record, M, S)
        aligned = self._token_info_layout(self._ffn_window, self._ffn_window_size, "ffn_window",
                                          info_size)
        ffn.token_info_buf = self._ffn_window
        ffn.token_info_buf_size = info_size
        ffn.token_data_buf = self._ffn_window + aligned
        ffn.token_data_buf_size = self._ffn_window_size - aligned  # dtype unknown: the rest
        # Every record: flag 0, layer id 0, expert ids INT32_MAX (written through the window).
        records = L.host_view(self._ffn_window, info_size).view(S * M, per_record // 4)
        torch.npu.synchronize()  # work queued on the window's memory finishes first
        records[:, :2] = 0
        records[:, 2:] = L.INT32_MAX

        ids_size = 4 * S
        ffn.layer_ids_buf_size = ffn.session_ids_buf_size = ffn.micro_batch_ids_buf_size = ids_size
        ffn.expert_ids_buf_size = L.checked_product(
            "FFN expert ids size", 4, S, common.micro_batch_size, common.selected_expert_num)
        ids_aligned = L.align_up(ids_size)
        self._workspace = torch.empty(3 * ids_aligned + L.align_up(ffn.expert_ids_buf_size),
                                      dtype=torch.int8, device="npu")
        base = self._workspace.data_ptr()
        ffn.layer_ids_buf = base
        ffn.session_ids_buf = base + ids_aligned
        ffn.micro_batch_ids_buf = base + 2 * ids_aligned
        ffn.expert_ids_buf = base + 3 * ids_aligned

    def _init_attention(self) -> None:
        c = self._context
        common, attn = c.common, c.attention
        info_size = L.checked_product("attention token info size", 4, common.selected_expert_num,
                                      common.micro_batch_size, common.micro_batch_num)
        aligned = self._token_info_layout(self._attention_window, self._attention_window_size,
                                          "attention_window", info_size)
        attn.token_info_buf = self._attention_window
        attn.token_info_buf_size = info_size
        torch.npu.synchronize()
        L.host_view(self._attention_window, info_size, torch.int8).zero_()
        attn.token_data_buf = self._attention_window + aligned
        attn.token_data_buf_size = self._attention_window_size - aligned
        # The scheduler starts from (micro_batch_id + 1) % micro_batch_num, i.e. micro batch 0.
        attn.micro_batch_id = common.micro_batch_num - 1

    def init(self) -> None:
        """Check the parameters and build the context (once; later calls do nothing)."""
        if self._initialized:
            return
        self._check_params()
        if self._context.common.schedule_mode == L.SCHEDULE_MODE_FFN:
            self._init_ffn()
        else:
            self._init_attention()
        self._context.control.run_flag = L.RUN_FLAG_RUNNING
        host = torch.frombuffer(bytearray(bytes(self._context)), dtype=torch.int8)
        self._context_tensor = host.to("npu")
        self._initialized = True

    def _require_init(self, what: str) -> None:
        if not self._initialized:
            raise RuntimeError(f"{_WHO}.{what}: the schedule context is not initialized; "
                               f"call init() (create_schedule_context_holder does)")

    # ------------------------------------------------------------------ API
    def get_schedule_context_tensor(self) -> torch.Tensor:
        """The context: an int8 npu tensor of 1024 bytes (the scheduler operators' input)."""
        self._require_init("get_schedule_context_tensor")
        return self._context_tensor

    def stop_schedule(self) -> None:
        """Set ``run_flag`` = 0 in the npu context: polling scheduler operators return."""
        self._require_init("stop_schedule")
        self._context.control.run_flag = L.RUN_FLAG_STOP
        flag = torch.tensor([L.RUN_FLAG_STOP], dtype=torch.int32).view(torch.int8)
        self._context_tensor[L.RUN_FLAG_OFFSET:L.RUN_FLAG_OFFSET + 4].copy_(flag)

    def get_schedule_context_info(self) -> str:
        """The context as read back from the npu, as a string."""
        if not self._initialized:
            return "Error: schedule context is not inited!"
        c = L.ScheduleContext.from_buffer_copy(self._context_tensor.cpu().numpy().tobytes())
        return format_context(c)


def format_context(c: "L.ScheduleContext") -> str:
    common = c.common
    text = ("schedule context: " + ", ".join(
        f"{name}={getattr(common, name)}" for name in (
            "schedule_mode", "session_num", "micro_batch_num", "micro_batch_size",
            "selected_expert_num", "expert_num", "attn_to_ffn_token_size",
            "ffn_to_attn_token_size")) + f", run_flag={c.control.run_flag}")
    if common.schedule_mode == L.SCHEDULE_MODE_FFN:
        fields = [f for f, _ in L.FfnArea._fields_ if not f.startswith("reserve")]
        text += ", ffn info: " + ", ".join(f"{f}={getattr(c.ffn, f)}" for f in fields) + ";"
    elif common.schedule_mode == L.SCHEDULE_MODE_ATTENTION:
        fields = [f for f, _ in L.AttentionArea._fields_ if not f.startswith("reserve")]
        text += ", attention info: " + ", ".join(f"{f}={getattr(c.attention, f)}"
                                                 for f in fields) + ";"
    return text


def _create_schedule_context_holder(*args, **kwargs) -> ScheduleContextHolder:
    holder = ScheduleContextHolder(*args, **kwargs)
    holder.init()
    return holder
