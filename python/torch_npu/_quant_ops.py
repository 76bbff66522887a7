"""op-plugin's fused quantizing operators: AddRmsNorm with dynamic quantization and MoE
routing with quantized output.

``torch_npu.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, *, smooth_scale1, smooth_scale2, beta,
epsilon, output_mask, y_dtype)`` adds x1 and x2 (``x_out``), normalises the sum by its root mean
square over the last dimension (``y = x / sqrt(mean(x^2) + epsilon) * gamma + beta``, in float32)
and quantizes y symmetrically per row, once or twice: ``input_i = y * smooth_scale_i`` (or y),
``scale_i = max|input_i| / 127`` (/ 7 for int4), ``y_i = round(input_i / scale_i)``. output_mask
chooses the branches; without it the first is always computed and the second only when both smooth
scales are given. A branch not computed returns 0-dim placeholders, as torch_npu does.

``torch_npu.npu_moe_init_routing_quant(x, expert_idx, *, scale, offset, active_num,
expert_capacity, expert_num, drop_pad_mode, expert_tokens_num_mode,
expert_tokens_before_capacity_flag, quant_mode)`` expands the tokens x [N, H] to their top-k
experts expert_idx [N, K], sorted by expert (stable over the row-major flat index s = n * K + k),
and quantizes them to int8: statically (quant_mode 0: ``round(x * scale + offset)`` in float16
arithmetic) or dynamically per row (quant_mode 1: ``x * smooth``, ``scale = max|row| / 127``,
returned as ``expanded_scale``). drop_pad_mode 0 keeps all N * K rows (or the first active_num of
them); 1 gives each expert expert_capacity slots, dropping its later tokens and padding with zeros.
The outputs torch_npu leaves undefined for the chosen mode are None.

Both are ``torch.ops.npu`` operators with op-plugin's schemas (op_plugin_functions.yaml),
composed of ATen operators and of the simulator's own ``npu_add_rms_norm_cast``,
``npu_dynamic_quant`` and ``npu_moe_init_routing_v2``, registered CompositeImplicitAutograd as in
``_composite_ops``; their argument checks are op-plugin's and CANN's.
"""
from __future__ import annotations

import torch

from torch_npu import _custom_dtype as _cdt
from torch_npu._composite_ops import _check, _dtype, _op

_HALF_TYPES = (torch.float16, torch.bfloat16)


# ---- AddRmsNorm + dynamic quantization ------------------------------------------------------

def _y_target(name: str, y_dtype) -> torch.dtype:
    """The quantized format y_dtype names: torch.int8 (None, the default) or torch.quint4x2
    (torch.quint4x2 or torch_npu.int4: int4 values packed eight to an int32)."""
    if y_dtype is None:
        return torch.int8
    if y_dtype == _cdt.DType.int4:
        return torch.quint4x2
    target = _cdt.torch_dtype(y_dtype) if _cdt.is_custom(y_dtype) else _dtype(name, "y_dtype", y_dtype)
    _check(target in (torch.int8, torch.quint4x2),
           f"{name}: y_dtype must be torch.int8 (the default), torch.quint4x2 or torch_npu.int4, got "
           f"{_cdt.to_string(y_dtype) if isinstance(y_dtype, int) else y_dtype}")
    return target


@_op("npu_add_rms_norm_dynamic_quant(Tensor x1, Tensor x2, Tensor gamma, *, Tensor? smooth_scale1=None, "
     "Tensor? smooth_scale2=None, Tensor? beta=None, float epsilon=1e-6, bool[2]? output_mask=None, "
     "int? y_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_add_rms_norm_dynamic_quant(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None, beta=None,
                                    epsilon=1e-6, output_mask=None, y_dtype=None):
    """(y1, y2, x_out, scale1, scale2): x_out = x1 + x2; y = RMSNorm(x_out) * gamma + beta in float32;
    branch i: scale_i = max|y * smooth_scale_i| / 127 per row (float32, x1's shape without its last
    dimension), y_i = round(y * smooth_scale_i / scale_i) as int8 in x1's shape (int4: / 7, packed
    eight to an int32 along the last dimension). A branch output_mask leaves out (or, without
    output_mask, the second one unless both smooth scales are given) returns 0-dim tensors."""
    name = "npu_add_rms_norm_dynamic_quant"
    if output_mask is not None:
        _check(len(output_mask) == 2, f"{name}: output_mask must hold 2 values, got {list(output_mask)}")
        _check(output_mask[0] or output_mask[1],
               "When the output_mask is not empty, at least one of y1 and y2 must be output.")
        _check(smooth_scale1 is None or output_mask[0],
               f"{name}: smooth_scale1 is given, so output_mask[0] must be True")
        _check(smooth_scale2 is None or output_mask[1],
               f"{name}: smooth_scale2 is given, so output_mask[1] must be True")
        out1, out2 = bool(output_mask[0]), bool(output_mask[1])
    else:
        _check(smooth_scale2 is None or smooth_scale1 is not None,
               f"{name}: smooth_scale2 needs smooth_scale1 when output_mask is None")
        out1, out2 = True, smooth_scale1 is not None and smooth_scale2 is not None

    _check(2 <= x1.dim() <= 8, "The x1 should be in 2~8D")
    _check(2 <= x2.dim() <= 8, "The x2 should be in 2~8D")
    _check(x1.shape == x2.shape, "The shape of x1 and x2 must be the same")
    _check(x1.dtype in _HALF_TYPES, f"{name}: x1 must be float16 or bfloat16, got {x1.dtype}")
    _check(x2.dtype == x1.dtype, f"{name}: x2 must have x1's dtype ({x1.dtype}), got {x2.dtype}")
    width = x1.size(-1)
    for arg, t in (("gamma", gamma), ("smooth_scale1", smooth_scale1), ("smooth_scale2", smooth_scale2),
                   ("beta", beta)):
        if t is not None:
            _check(t.dim() == 1 and t.size(0) == width and t.dtype == x1.dtype,
                   f"{name}: {arg} must be a 1-D {x1.dtype} tensor of x1's last dimension ({width}), got "
                   f"{t.dtype} of shape {list(t.shape)}")
    target = _y_target(name, y_dtype)
    if target == torch.quint4x2:
        _check(width % 8 == 0,
               "The last dim input shape must be divisible by 8 if y dtype is torch_npu.int4 or torch.quint4x2")

    # y in float32 (the fused kernel quantizes it without rounding it to x1's dtype first).
    y, _, _, x_out = torch.ops.npu.npu_add_rms_norm_cast(x1, x2, gamma, epsilon)
    if beta is not None:
        y = y + beta.float()

    def branch(enabled, smooth):
        if not enabled:  # torch_npu allocates 0-dim tensors for an output not computed
            held = torch.int32 if target == torch.quint4x2 else torch.int8
            return y.new_zeros((), dtype=held), y.new_zeros((), dtype=torch.float32)
        return torch.ops.npu.npu_dynamic_quant(y, smooth_scales=smooth, dst_type=target)

    y1, scale1 = branch(out1, smooth_scale1)
    y2, scale2 = branch(out2, smooth_scale2)
    return y1, y2, x_out, scale1, scale2


# ---- MoE routing with quantized output --------------------------------------------------------

def _check_moe_quant_scales(name, x, scale, offset, quant_mode, expert_num):
    """scale and offset: [1] float32 each for static quantization; for dynamic, scale (the smooth
    scales, optional) [1, H] or [expert_num, H] float32, offset unused."""
    for arg, t in (("scale", scale), ("offset", offset)):
        if t is not None:
            _check(t.dtype == torch.float32, f"{name}: {arg} must be float32, got {t.dtype}")
    if quant_mode == 0:
        _check(scale is not None and offset is not None,
               f"{name}: static quantization (quant_mode=0) needs scale and offset")
        for arg, t in (("scale", scale), ("offset", offset)):
            _check(t.dim() == 1 and t.size(0) == 1,
                   f"{name}: {arg} must be of shape [1] for quant_mode=0, got {list(t.shape)}")
    elif scale is not None:
        h = x.size(1)
        _check(scale.dim() == 2 and scale.size(1) == h and scale.size(0) in (1, expert_num),
               f"{name}: scale must be [1, {h}] or [expert_num={expert_num}, {h}] for quant_mode=1, "
               f"got {list(scale.shape)}")


@_op("npu_moe_init_routing_quant(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, "
     "int active_num=1024, int expert_capacity=0, int expert_num=256, int drop_pad_mode=0, "
     "int expert_tokens_num_mode=0, bool expert_tokens_before_capacity_flag=False, int quant_mode=1) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_moe_init_routing_quant(x, expert_idx, *, scale=None, offset=None, active_num=1024, expert_capacity=0,
                                expert_num=256, drop_pad_mode=0, expert_tokens_num_mode=0,
                                expert_tokens_before_capacity_flag=False, quant_mode=1):
    """(expanded_x, expanded_row_idx, expert_token_cumsum_or_count, expert_tokens_before_capacity,
    expanded_scale). The N * K flat indices s = n * K + k sorted stably by expert give rows
    d = 0, 1, ... holding x[s // K], quantized to int8.
    drop_pad_mode 0: expanded_x [N * K, H] (active_num > 0: its first min(active_num, N * K)
    rows); expanded_row_idx[s] = d (int32); expert_token_cumsum_or_count (int32 [expert_num])
    the cumulative (expert_tokens_num_mode 1) or plain (2) token counts per expert, None for 0.
    drop_pad_mode 1: expanded_x [expert_num, expert_capacity, H]; the j-th token of expert e goes to
    slot (e, j) if j < expert_capacity (expanded_row_idx[s] = e * capacity + j), else it is dropped
    (expanded_row_idx[s] = -1); free slots are zeros. expert_tokens_before_capacity (int32
    [expert_num]): the counts before dropping, with expert_tokens_before_capacity_flag.
    expanded_scale: the per-row float32 scales of dynamic quantization (quant_mode 1; 0 for a free
    slot), None for static quantization (quant_mode 0)."""
    name = "npu_moe_init_routing_quant"
    _check(x.dim() == 2, f"Input tensor 'x' must be 2-dimensional, but got dimension {x.dim()}")
    _check(expert_idx.dim() == 2,
           f"Input tensor 'expert_idx' must be 2-dimensional, but got dimension {expert_idx.dim()}")
    _check(x.size(0) == expert_idx.size(0),
           f"The number of rows in input 'x' ({x.size(0)}) must match the number of rows in 'expert_idx' "
           f"({expert_idx.size(0)}).")
    _check(drop_pad_mode in (0, 1), f"Parameter 'drop_pad_mode' must be 0 or 1, but got: {drop_pad_mode}")
    _check(quant_mode in (0, 1), f"Parameter 'quant_mode' must be 0 or 1, but got: {quant_mode}")
    _check(expert_tokens_num_mode in (0, 1, 2),
           f"Parameter 'expert_tokens_num_mode' must be 0, 1, or 2, but got: {expert_tokens_num_mode}")
    _check(x.dtype in (*_HALF_TYPES, torch.float32), f"{name}: x must be float16, bfloat16 or float32, got {x.dtype}")
    _check(expert_idx.dtype == torch.int32, f"{name}: expert_idx must be int32, got {expert_idx.dtype}")
    _check(active_num >= 0 and expert_capacity >= 0 and expert_num >= 0,
           f"{name}: active_num ({active_num}), expert_capacity ({expert_capacity}) and expert_num "
           f"({expert_num}) must not be negative")
    dropping = drop_pad_mode == 1
    counting = not dropping and expert_tokens_num_mode > 0
    if dropping:
        _check(expert_capacity > 0 and expert_num > 0,
               f"{name}: drop_pad_mode=1 needs expert_capacity > 0 and expert_num > 0, got {expert_capacity} "
               f"and {expert_num}")
    elif counting:
        _check(expert_num > 0, f"{name}: expert_tokens_num_mode={expert_tokens_num_mode} needs expert_num > 0")
    _check_moe_quant_scales(name, x, scale, offset, quant_mode, expert_num)

    n, k = expert_idx.shape
    flat = expert_idx.reshape(-1).long()
    top = int(flat.max()) if flat.numel() else -1
    _check(flat.numel() == 0 or int(flat.min()) >= 0, f"{name}: expert_idx must not be negative")
    # Expert ids index the per-expert outputs and smooth scales: they must then be below expert_num.
    bounded = dropping or counting or (quant_mode == 1 and scale is not None and scale.size(0) > 1)
    _check(not bounded or top < expert_num,
           f"{name}: expert_idx must be in [0, expert_num={expert_num}), got an expert {top}")
    # Every row is routed: an expert range covering all ids keeps the N * K rows.
    end = max(expert_num, top + 1, 1)

    def route(active, tokens_type, row_idx_type):
        return torch.ops.npu.npu_moe_init_routing_v2(
            x, expert_idx, scale=scale, offset=offset, active_num=active, expert_num=expert_num,
            drop_pad_mode=0, expert_tokens_num_type=tokens_type, expert_tokens_num_flag=True,
            quant_mode=quant_mode, active_expert_range=[0, end], row_idx_type=row_idx_type)

    if not dropping:
        # expert_tokens_num_mode 1 (cumsum) is npu_moe_init_routing_v2's type 0, 2 (count) its type 1.
        tokens_type = 0 if expert_tokens_num_mode == 1 else 1
        expanded_x, expanded_row_idx, tokens, expanded_scale = route(active_num, tokens_type, 0)
        tokens = tokens.to(torch.int32) if counting else None
        return expanded_x, expanded_row_idx, tokens, None, expanded_scale if quant_mode == 1 else None

    # Drop/pad: all rows quantized in sorted order (order[d] = s), then each expert's first
    # expert_capacity rows placed in its slots.
    rows, order, counts, row_scale = route(0, 1, 1)
    order = order.long()
    experts = flat[order]
    first = counts.cumsum(0) - counts  # each expert's first sorted row
    slot = torch.arange(n * k, device=x.device) - first[experts]
    kept = slot < expert_capacity
    dest = (experts * expert_capacity + slot)[kept]
    expanded_x = rows.new_zeros((expert_num * expert_capacity, x.size(1)))
    expanded_x[dest] = rows[kept]
    expanded_row_idx = torch.full((n * k,), -1, dtype=torch.int32, device=x.device)
    expanded_row_idx[order[kept]] = dest.to(torch.int32)
    expanded_scale = None
    if quant_mode == 1:
        expanded_scale = row_scale.new_zeros(expert_num * expert_capacity)
        expanded_scale[dest] = row_scale[kept]
    before = counts.to(torch.int32) if expert_tokens_before_capacity_flag else None
    return (expanded_x.view(expert_num, expert_capacity, x.size(1)), expanded_row_idx, None, before,
            expanded_scale)
