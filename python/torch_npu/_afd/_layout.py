"""The schedule context of Attention-FFN Disaggregation: its byte layout and host access to
npu memory by address.

The context is a packed 1024-byte record (torch_npu's ``ScheduleContext``, CANN's
``attention_ffn_schedule.h``) held in an int8 npu tensor. Its windows and output buffers are
*addresses* of npu memory, as on the device: the scheduler kernels follow them. In the
simulator npu memory is host memory, so the kernels here reach those bytes through zero-copy
CPU views at those addresses, after checking that each range lies inside npu
tensors the caching allocator has allocated (a bad or freed address is an error, not a crash).

Layout (byte offsets, little endian):
  common     0..128   session_num, micro_batch_num, micro_batch_size, selected_expert_num,
                      expert_num, attn_to_ffn_token_size, ffn_to_attn_token_size (uint32),
                      schedule_mode (int32; 0 = FFN side, 1 = attention side)
  control  128..256   run_flag (int32; 1 = running, 0 = stop polling)
  attention 256..384  token_info_buf, token_info_buf_size, token_data_buf,
                      token_data_buf_size (uint64), micro_batch_id (uint32)
  ffn      384..640   token_info_buf, token_info_buf_size, token_data_buf, token_data_buf_size,
                      polling_index (uint64); at 512: layer_ids_buf, layer_ids_buf_size,
                      session_ids_buf, session_ids_buf_size, micro_batch_ids_buf,
                      micro_batch_ids_buf_size, expert_ids_buf, expert_ids_buf_size (uint64),
                      out_num (uint32)
  reserved 640..1024

Token info records (the windows' first bytes):
  FFN side, one per (session, micro batch), session-major:
      int32 flag, int32 layer_id, int32 expert_ids[micro_batch_size * selected_expert_num]
  attention side, one per micro batch: int32 flag[micro_batch_size * selected_expert_num]
"""
import ctypes
from typing import List, Tuple

import torch

CONTEXT_SIZE = 1024
BUF_ALIGN = 512            # window token-info areas and output buffers are 512-byte aligned
SCHEDULE_MODE_FFN = 0
SCHEDULE_MODE_ATTENTION = 1
RUN_FLAG_STOP = 0
RUN_FLAG_RUNNING = 1
VALID_FLAG = 1             # a token-info flag the sender set: data are ready
INVALID_FLAG = 0
INT32_MAX = 2**31 - 1      # expert id of an empty FFN slot after holder init
EXPERT_ID_RESET = 0x7F7F7F7F  # expert id the FFN scheduler leaves in a consumed slot (bytes 0x7F)
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
_I32 = 4


class _Packed(ctypes.LittleEndianStructure):
    _pack_ = 1


class CommonArea(_Packed):
    _fields_ = [("session_num", ctypes.c_uint32), ("micro_batch_num", ctypes.c_uint32),
                ("micro_batch_size", ctypes.c_uint32), ("selected_expert_num", ctypes.c_uint32),
                ("expert_num", ctypes.c_uint32), ("attn_to_ffn_token_size", ctypes.c_uint32),
                ("ffn_to_attn_token_size", ctypes.c_uint32), ("schedule_mode", ctypes.c_int32),
                ("reserve0", ctypes.c_int8 * 96)]


class ControlArea(_Packed):
    _fields_ = [("run_flag", ctypes.c_int32), ("reserve2", ctypes.c_int8 * 124)]


class AttentionArea(_Packed):
    _fields_ = [("token_info_buf", ctypes.c_uint64), ("token_info_buf_size", ctypes.c_uint64),
                ("token_data_buf", ctypes.c_uint64), ("token_data_buf_size", ctypes.c_uint64),
                ("micro_batch_id", ctypes.c_uint32), ("reserve5", ctypes.c_int8 * 92)]


class FfnArea(_Packed):
    _fields_ = [("token_info_buf", ctypes.c_uint64), ("token_info_buf_size", ctypes.c_uint64),
                ("token_data_buf", ctypes.c_uint64), ("token_data_buf_size", ctypes.c_uint64),
                ("polling_index", ctypes.c_uint64), ("reserve3", ctypes.c_int8 * 88),
                ("layer_ids_buf", ctypes.c_uint64), ("layer_ids_buf_size", ctypes.c_uint64),
                ("session_ids_buf", ctypes.c_uint64), ("session_ids_buf_size", ctypes.c_uint64),
                ("micro_batch_ids_buf", ctypes.c_uint64),
                ("micro_batch_ids_buf_size", ctypes.c_uint64),
                ("expert_ids_buf", ctypes.c_uint64), ("expert_ids_buf_size", ctypes.c_uint64),
                ("out_num", ctypes.c_uint32), ("reserve4", ctypes.c_int8 * 60)]


class ScheduleContext(_Packed):
    _fields_ = [("common", CommonArea), ("control", ControlArea),
                ("attention", AttentionArea), ("ffn", FfnArea),
                ("reserve6", ctypes.c_int8 * 384)]


assert ctypes.sizeof(ScheduleContext) == CONTEXT_SIZE
RUN_FLAG_OFFSET = ScheduleContext.control.offset + ControlArea.run_flag.offset


def align_up(n: int, align: int = BUF_ALIGN) -> int:
    return (n + align - 1) // align * align


def checked_product(what: str, *factors: int) -> int:
    """The product of ``factors``; RuntimeError if it does not fit in uint64 (as the C++ checks)."""
    result = 1
    for f in factors:
        result *= f
        if result > UINT64_MAX:
            raise RuntimeError(f"{what}: {' * '.join(map(str, factors))} overflows uint64")
    return result


def ffn_desc_size(common: CommonArea) -> int:
    """Bytes of one FFN token-info record: flag, layer_id, expert ids."""
    return 2 * _I32 + checked_product("FFN token info record size", _I32,
                                      common.micro_batch_size, common.selected_expert_num)


def host_view(address: int, nbytes: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """A CPU tensor over ``nbytes`` of (npu) memory at ``address`` -- no copy.

    Callers check the range first (:func:`check_npu_range`).
    """
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    raw = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(raw, dtype=dtype)


def _npu_ranges(device: int) -> List[Tuple[int, int]]:
    """[start, end) ranges of the npu caching allocator's allocated blocks on ``device``,
    adjacent blocks merged (a window may span several tensors allocated back to back)."""
    import torch_npu

    spans = sorted((b["address"], b["address"] + b["size"])
                   for s in torch_npu._C._npu_memorySnapshot()["segments"]
                   if s.get("device", device) == device
                   for b in s["blocks"] if b["state"] == "active_allocated")
    merged: List[List[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def check_npu_range(who: str, name: str, address: int, nbytes: int, device: int) -> None:
    """RuntimeError unless [address, address + nbytes) is npu memory of ``device``."""
    if address == 0:
        raise RuntimeError(f"{who}: {name} is a null address")
    end = address + nbytes
    for start, stop in _npu_ranges(device):
        if start <= address and end <= stop:
            return
    raise RuntimeError(
        f"{who}: {name} = [{address:#x}, {end:#x}) ({nbytes} bytes) is not inside npu memory "
        f"of device {device}; it must be the data_ptr() of an npu tensor (on the context's "
        f"device) with at least that many bytes from that address")
