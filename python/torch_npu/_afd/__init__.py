"""torch_npu._afd: Attention-FFN Disaggregation (MoE inference with attention and FFN layers
on different workers).

``create_schedule_context_holder`` builds a worker's schedule context (see
``_layout`` for its byte layout); the scheduler operators
``ffn_worker_scheduler(_)`` / ``attention_worker_scheduler(_)`` (``torch.ops.npu.*``, also
``torch_npu.<name>`` and ``torch_npu._afd.<name>``) scan the worker's window for the token
info other workers sent and update the context (see ``_ops``).
"""
from ._schedule_context import ScheduleContextHolder, _create_schedule_context_holder
from . import _ops
from . import _worker_ops  # noqa: F401  (npu_ffn_worker_batching, npu_attention_worker_combine)

__all__ = ["create_schedule_context_holder"]

_ops.register()
# torch_npu._afd.<op> is torch.ops.npu.<op>, as torch_npu's initialize_afd_bindings sets it.
for _name in _ops.OP_NAMES:
    globals()[_name] = getattr(__import__("torch").ops.npu, _name)
del _name


def create_schedule_context_holder(
        schedule_mode: int,
        session_num: int,
        micro_batch_num: int,
        micro_batch_size: int,
        selected_expert_num: int,
        expert_num: int,
        attn_to_ffn_token_size: int,
        ffn_to_attn_token_size: int,
        ffn_window: int = 0,
        ffn_window_size: int = 0,
        attention_window: int = 0,
        attention_window_size: int = 0,
) -> ScheduleContextHolder:
    """Create and initialize the schedule context holder of one worker.

    Args:
        schedule_mode: 0 schedules the FFN side, 1 the attention side
        session_num: number of sessions
        micro_batch_num: number of micro batches
        micro_batch_size: micro batch size
        selected_expert_num: experts selected per token
        expert_num: total number of experts
        attn_to_ffn_token_size: bytes per token from attention to FFN (multiple of 512)
        ffn_to_attn_token_size: bytes per token from FFN to attention (multiple of 512)
        ffn_window: FFN window address (an npu ``data_ptr()``), required when schedule_mode=0
        ffn_window_size: FFN window size in bytes, required when schedule_mode=0
        attention_window: attention window address, required when schedule_mode=1
        attention_window_size: attention window size in bytes, required when schedule_mode=1

    Returns:
        ScheduleContextHolder: the initialized holder

    Raises:
        RuntimeError: invalid parameters (zero counts, unaligned token sizes, missing or too
            small window, unsupported schedule_mode, size overflow)
    """
    return _create_schedule_context_holder(
        schedule_mode, session_num, micro_batch_num, micro_batch_size, selected_expert_num,
        expert_num, attn_to_ffn_token_size, ffn_to_attn_token_size, ffn_window,
        ffn_window_size, attention_window, attention_window_size)
