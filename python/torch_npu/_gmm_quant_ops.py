"""op-plugin's fused grouped matmul + SwiGLU + quantisation operators of the MoE FFN.

``torch_npu.npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale, *,
bias=None, offset=None) -> (output, output_scale, output_offset)`` and
``torch_npu.npu_grouped_matmul_swiglu_quant_v2(x, weight, weight_scale, x_scale, group_list, *, ...)
-> (output, output_scale)``: the rows of x [M, K] are split into E groups by group_list
(cumulative row ends, or row counts with ``group_list_type=1``); the rows of group e go
through expert e's weight:

    C = (X_e . W_e) * x_scale[row] * w_scale[e]          (dequantisation, float32)
    act, gate = split(C)                                  (halves of N)
    S = swish(act) * gate                                 (swish(a) = a / (1 + exp(-a)))
    output_scale[row] = max|S[row]| / 127
    output[row] = round(S[row] / output_scale[row])       (int8, [M, N / 2])

The modes of the Atlas A2 / A3 (Ascend910B) kernels:

* A8W8: int8 x, int8 weight; weight_scale [E, N] per output channel.
* A8W4 (MSD): int8 x, int4 weight (int32 words of eight 4-bit values, the lowest nibble
  first); weight_scale [E, N] (per channel) or [E, K_group_num, N] (per group along K), and
  the offline weight assist matrix [E, N] (``weight_assist_matrix``; ``bias`` for the first
  operator). x is split into int4 halves x_high = floor(x / 16), x_low = (x & 0xF) - 8, each
  multiplied by the weight and scaled per group; C = (16 C_high + C_low + assist[e]) * x_scale.
* A4W4 (v2 only): int4 x and weight (int32-packed); weight_scale [E, N]; ``smooth_scale``
  [E, N / 2] or [E] multiplies S before the quantisation.

weight_scale may be float32 / float16 / bfloat16, or int64 holding a float32 in its low
32 bits (the uint64 scales of torch_npu, as npu_trans_quant_param packs them).

Weight layouts: [E, K, N] (ND, or FRACTAL_NZ from ``torch_npu.npu_format_cast(w, 29)``:
an NZ tensor's values are its logical ones), or 5-D FRACTAL_NZ [E, N / c0, K / 16, 16, c0]
(c0 = 32 int8 values, or 8 int32 words = 64 int4 values). A 5-D tensor holds the tiles
themselves (W[e, k, n] = w[e, n // c0, k // 16, k % 16, n % c0]), except a 5-D view of a 3-D
FRACTAL_NZ tensor (``npu_format_cast(w, 29).view(E, N // 32, K // 16, 16, 32)``), whose
storage is that tensor's: its weight is the 3-D tensor. The logical N comes from
weight_scale, as in op-plugin.

Integer products accumulate exactly (int32, as the cube unit); the rest is float32. Rows past
the last group are not computed: their output and output_scale are 0. The Ascend950 modes (MX
quantisation, float8 / hifloat8 / float4 operands and outputs) raise NotImplementedError: the
simulated device is an Ascend910B.

Schemas are op-plugin's (op_plugin_functions.yaml).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_npu import _custom_dtype as _cdt
from torch_npu._composite_ops import _check, _int8_matmul, _op, _unpack_int4

_V1 = "npu_grouped_matmul_swiglu_quant"
_V2 = "npu_grouped_matmul_swiglu_quant_v2"

_FRACTAL_NZ = 29
_SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)
# CANN's limits of the Atlas A2 / A3 kernels (op-plugin's docs): N at most 10240, K below 65536
# (A8W8) or 20000 (A8W4, A4W4), at most 1024 groups.
_MAX_N = 10240
_MAX_K = {"A8W8": 65536, "A8W4": 20000, "A4W4": 20000}
_MAX_GROUPS = 1024
# quant_dtype values whose output is a float format (Ascend950's per-token quantisation).
_FLOAT_OUTPUTS = (torch.float8_e5m2, torch.float8_e4m3fn)
_NEEDS_950 = "needs an Ascend950; the simulated device is an Ascend910B"


def _is_nz(t: torch.Tensor) -> bool:
    """Whether t's storage is in FRACTAL_NZ (an npu tensor with a real storage)."""
    return (t.device.type == "npu" and not torch._subclasses.fake_tensor.is_fake(t)
            and torch.ops.npu.get_npu_format(t) == _FRACTAL_NZ)


def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    """float32 values of a scale: float tensors as they are, int64 ones the float32 of their
    low 32 bits (torch_npu's uint64 scales)."""
    if scale.dtype != torch.int64:
        return scale.float()
    low = scale & 0xFFFFFFFF
    low = torch.where(low >= 2 ** 31, low - 2 ** 32, low)  # the two's complement int32 of the bits
    return low.to(torch.int32).view(torch.float32)


def _nz_shape(int4: bool) -> str:
    return "[E, N/64, K/16, 16, 8] (int32 words of int4)" if int4 else "[E, N/32, K/16, 16, 32] (int8)"


def _logical_weight(name: str, weight: torch.Tensor, k: int, n: int, int4: bool) -> torch.Tensor:
    """The integer values [E, K, N] (an int8 tensor; int4 values in [-8, 7]) that weight holds."""
    # A 5-D view of a 3-D FRACTAL_NZ tensor shares that tensor's storage: its weight is that tensor.
    root = weight._base
    if weight.dim() == 5 and root is not None and root.dim() == 3 and _is_nz(weight):
        weight = root if root.dtype == weight.dtype else root.view(weight.dtype)
    if weight.dim() == 3:
        values = _unpack_int4(weight).to(torch.int8) if int4 else weight
        _check(values.size(1) == k and values.size(2) == n,
               f"{name}: weight [E, K, N] must have K = {k} (x's) and N = {n} (weight_scale's)"
               f"{' (N/8 int32 words of int4)' if int4 else ''}, got {list(weight.shape)}")
        return values
    c0 = 64 if int4 else 32
    e, n1, k1 = weight.shape[:3]
    _check(list(weight.shape[3:]) == [16, c0 // 8 if int4 else c0] and k1 == -(-k // 16) and n1 == -(-n // c0),
           f"{name}: a 5-D FRACTAL_NZ weight must be {_nz_shape(int4)} with K = {k} (x's) and N = {n} "
           f"(weight_scale's), i.e. {[e, -(-n // c0), -(-k // 16), 16, c0 // 8 if int4 else c0]}, "
           f"got {list(weight.shape)}")
    tiles = _unpack_int4(weight).to(torch.int8) if int4 else weight
    # [E, N/c0, K/16, 16, c0] -> [E, K/16, 16, N/c0, c0] -> [E, K, N] (the tiles' padding dropped)
    return tiles.permute(0, 2, 3, 1, 4).reshape(e, k1 * 16, n1 * c0)[:, :k, :n]


def _group_sizes(name: str, group_list: torch.Tensor, experts: int, rows: int, cumulative: bool) -> list:
    """Row counts of the E groups."""
    _check(group_list.dim() == 1 and group_list.dtype == torch.int64,
           f"{name}: group_list must be a 1-D int64 tensor, got {group_list.dtype} of shape {list(group_list.shape)}")
    _check(group_list.numel() == experts,
           f"{name}: group_list must have one entry per expert (weight's first dimension, {experts}), "
           f"got {group_list.numel()}")
    values = group_list.tolist()
    sizes = [v - p for p, v in zip([0] + values[:-1], values)] if cumulative else values
    _check(all(s >= 0 for s in sizes) and sum(sizes) <= rows,
           f"{name}: group_list must be {'non-decreasing cumulative row ends' if cumulative else 'row counts'} "
           f"(non-negative) covering at most x's {rows} rows, got {values}")
    return sizes


def _scaled_matmul(a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Σ_g (a[:, K_g] . w[K_g]) * scale[g] in float32: scale [N] (per channel) or [G, N] (per
    group: G equal parts of K); each product accumulates exactly in int32."""
    if scale.dim() == 1:
        return _int8_matmul(a, w).float() * scale
    size = a.size(1) // scale.size(0)
    out = None
    for g in range(scale.size(0)):
        part = _int8_matmul(a[:, g * size:(g + 1) * size], w[g * size:(g + 1) * size]).float() * scale[g]
        out = part if out is None else out + part
    return out


def _compute(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, x_scale: torch.Tensor, sizes: list,
             mode: str, assist, smooth):
    """The int8 output [M, N/2] and float32 output_scale [M] for the logical integer x [M, K],
    w [E, K, N] and float32 scales (see the module docstring)."""
    m, n = x.size(0), w.size(-1)
    out = torch.zeros(m, n // 2, dtype=torch.int8, device=x.device)
    out_scale = torch.zeros(m, dtype=torch.float32, device=x.device)
    start = 0
    for e, rows in enumerate(sizes):
        if rows == 0:
            continue
        xe, we, xs = x[start:start + rows], w[e].clone(), x_scale[start:start + rows].unsqueeze(-1)
        if mode == "A8W4":
            # MSD: int8 x as two int4 halves, x = 16 * high + low + 8; the assist matrix (8 * Σ_k w *
            # w_scale, made offline) restores the + 8.
            high = torch.div(xe, 16, rounding_mode="floor")
            low = (xe.to(torch.int32) & 0xF) - 8
            c = _scaled_matmul(high, we, w_scale[e]) * 16 + _scaled_matmul(low, we, w_scale[e]) + assist[e]
            c = c * xs
        else:
            c = _int8_matmul(xe, we).float() * xs * w_scale[e]
        act, gate = c.chunk(2, -1)
        s = F.silu(act) * gate
        if smooth is not None:
            s = s * smooth[e]
        amax = s.abs().amax(-1, keepdim=True)
        q_scale = amax / 127.0
        # A row of zeros has scale 0 and quantises to 0 (no 0 / 0).
        q = torch.where(amax > 0, torch.round(s / q_scale), torch.zeros_like(s))
        out[start:start + rows] = q.clamp(-128, 127).to(torch.int8)
        out_scale[start:start + rows] = q_scale.squeeze(-1)
        start += rows
    return out, out_scale


def _run(name, x, weight, weight_scale, x_scale, group_list, *, cumulative=True, assist=None, smooth=None,
         per_group=None):
    """Checks the inputs, decodes the weight and scales and computes (output, output_scale).
    per_group: None to take it from weight_scale's rank (npu_grouped_matmul_swiglu_quant), else
    whether dequant_mode asks for per-group scales."""
    _check(x.dim() == 2, f"{name}: x must be 2-D [M, K], got {x.dim()}-D {list(x.shape)}")
    _check(x.dtype in (torch.int8, torch.int32),
           f"{name}: x must be int8 (A8W8, A8W4) or int32 words of int4 (A4W4), got {x.dtype}")
    _check(weight.dtype in (torch.int8, torch.int32),
           f"{name}: weight must be int8 (A8W8) or int32 words of int4 (A8W4, A4W4), got {weight.dtype}")
    int4_x, int4_w = x.dtype == torch.int32, weight.dtype == torch.int32
    _check(int4_w or not int4_x, f"{name}: an int4 x (int32) needs an int4 weight (int32, A4W4), got {weight.dtype}")
    _check(weight.dim() in (3, 5), f"{name}: weight must be 3-D [E, K, N] (ND or FRACTAL_NZ) or 5-D FRACTAL_NZ "
                                   f"{_nz_shape(int4_w)}, got {weight.dim()}-D {list(weight.shape)}")
    mode = "A4W4" if int4_x else "A8W4" if int4_w else "A8W8"
    m, k = x.size(0), x.size(1) * (8 if int4_x else 1)
    _check(k < _MAX_K[mode], f"{name}: K (x's last dimension{', 8 int4 a word' if int4_x else ''}) must be less "
                             f"than {_MAX_K[mode]} in the {mode} mode, got {k}")

    _check(weight_scale.dtype in _SCALE_DTYPES, f"{name}: weight_scale must be float32, float16, bfloat16 or int64 "
                                                f"(uint64 scales), got {weight_scale.dtype}")
    if per_group is None:
        per_group = weight_scale.dim() == 3
    experts = weight.size(0)
    _check(weight_scale.dim() == (3 if per_group else 2) and weight_scale.size(0) == experts,
           f"{name}: weight_scale must be {'[E, K_group_num, N] (per group)' if per_group else '[E, N] (per channel)'}"
           f" with E = {experts} (weight's first dimension), got {list(weight_scale.shape)}")
    n = weight_scale.size(-1)  # the logical N (an NZ or packed weight's tail is not N)
    _check(n % 2 == 0 and 0 < n <= _MAX_N, f"{name}: N (weight_scale's last dimension) must be even and at most "
                                           f"{_MAX_N}, got {n}")
    if per_group:
        _check(mode == "A8W4", f"{name}: per-group weight scales (dequant_mode=1, weight_scale [E, K_group_num, N]) "
                               f"are only supported with int8 x and int4 weights (A8W4), not in the {mode} mode")
        groups = weight_scale.size(1)
        _check(groups > 0 and k % groups == 0, f"{name}: K_group_num (weight_scale's dimension 1, {groups}) must "
                                               f"divide K ({k})")
    _check(x_scale.dim() == 1 and x_scale.size(0) == m and x_scale.dtype == torch.float32,
           f"{name}: x_scale must be float32 [M] with M = {m} (x's rows), got {x_scale.dtype} {list(x_scale.shape)}")
    _check(experts <= _MAX_GROUPS, f"{name}: at most {_MAX_GROUPS} groups are supported, got {experts}")
    sizes = _group_sizes(name, group_list, experts, m, cumulative)

    if mode == "A8W4":
        _check(assist is not None, f"{name}: the A8W4 mode (int4 weight) needs the weight assist matrix "
                                   f"[E, N] = [{experts}, {n}]")
        _check(assist.dtype == torch.float32 and list(assist.shape) == [experts, n],
               f"{name}: the weight assist matrix must be float32 [E, N] = [{experts}, {n}], got {assist.dtype} "
               f"{list(assist.shape)}")
    if smooth is not None:
        _check(smooth.dtype == torch.float32 and (list(smooth.shape) in ([experts], [experts, n // 2])),
               f"{name}: smooth_scale must be float32 [E, N/2] = [{experts}, {n // 2}] or [E] = [{experts}], got "
               f"{smooth.dtype} {list(smooth.shape)}")
        smooth = smooth.float().reshape(experts, -1)

    xv = _unpack_int4(x).to(torch.int8) if int4_x else x
    w = _logical_weight(name, weight, k, n, int4_w)
    return _compute(xv, w, _scale_values(weight_scale), x_scale.float(), sizes, mode, assist, smooth)


@_op("npu_grouped_matmul_swiglu_quant(Tensor x, Tensor weight, Tensor group_list, Tensor weight_scale, "
     "Tensor x_scale, *, Tensor? bias=None, Tensor? offset=None) -> (Tensor, Tensor, Tensor)")
def _npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale, *, bias=None, offset=None):
    """Grouped matmul, dequantisation, SwiGLU and per-token int8 quantisation (module docstring)
    of int8 x [M, K] with a FRACTAL_NZ (or ND) weight: A8W8 (int8 weight) or A8W4 (int32 words
    of int4, weight_scale [E, N] or [E, K_group_num, N], bias the float32 weight assist matrix
    [E, N]). group_list: cumulative row ends. Returns (output int8 [M, N/2], output_scale float32
    [M], output_offset: a float32 scalar, 0 for the symmetric quantisation)."""
    name = _V1
    _check(x.dtype == torch.int8, f"{name}: x must be int8, got {x.dtype}")
    _check(offset is None, f"{name}: offset (asymmetric dequantisation) is not supported: pass None")
    if weight.dtype != torch.int32:
        _check(bias is None, f"{name}: bias (the A8W4 weight assist matrix) is only used with int4 weights "
                             f"(int32): pass None with an int8 weight")
    out, scale = _run(name, x, weight, weight_scale, x_scale, group_list, assist=bias)
    return out, scale, torch.zeros((), dtype=torch.float32, device=x.device)


def _dtype_name(code) -> str:
    return _cdt.to_string(code) if isinstance(code, int) else str(code)


def _check_v2_dtypes(x_dtype, weight_dtype, weight_scale_dtype, x_scale_dtype):
    """op-plugin's checks of the dtype overrides (Ascend950 formats), then NotImplementedError."""
    name = _V2
    low_bit = (_cdt.DType.float4_e2m1fn_x2, _cdt.DType.float4_e1m2fn_x2, _cdt.DType.hifloat8)
    for arg, value in (("x_dtype", x_dtype), ("weight_dtype", weight_dtype)):
        _check(value is None or value in low_bit,
               f"The optional parameter {arg} only supports torch_npu.float4_e2m1fn_x2, torch_npu.float4_e1m2fn_x2, "
               f"torch_npu.hifloat8, or None, but the actual value is {_dtype_name(value)}.")
    _check((x_dtype is None) == (weight_dtype is None),
           "The optional parameter x_dtype and weight_dtype should both be torch_npu.float4_e2m1fn_x2, "
           "torch_npu.float4_e1m2fn_x2torch_npu.hifloat8, or None.")
    for arg, value in (("weight_scale_dtype", weight_scale_dtype), ("x_scale_dtype", x_scale_dtype)):
        _check(value is None or value == _cdt.DType.float8_e8m0fnu,
               f"The optional parameter {arg} only supports float8_e8m0fnu or None, but the actual value is "
               f"{_dtype_name(value)}.")
    for arg, value in (("x_dtype", x_dtype), ("weight_dtype", weight_dtype),
                       ("weight_scale_dtype", weight_scale_dtype), ("x_scale_dtype", x_scale_dtype)):
        if value is not None:
            raise NotImplementedError(f"{name}: {arg}={_dtype_name(value)} (MX quantisation / hifloat8 / float4 "
                                      f"operands) {_NEEDS_950}: pass None")


def _quant_dtype_is_int8(code) -> bool:
    """quant_dtype: None, 0 (the documented default) or torch.int8 give int8; the float formats are
    Ascend950's."""
    if code is None or code == 0 or code == torch.int8 or code == _cdt.SCALAR_TYPES.index(torch.int8) \
            or code == _cdt.DType.int8:
        return True
    floats = (_cdt.DType.hifloat8, _cdt.DType.float8_e5m2, _cdt.DType.float8_e4m3fn,
              _cdt.DType.float4_e2m1fn_x2, _cdt.DType.float4_e1m2fn_x2,
              *(_cdt.SCALAR_TYPES.index(t) for t in _FLOAT_OUTPUTS), *_FLOAT_OUTPUTS)
    if code in floats:
        raise NotImplementedError(f"{_V2}: quant_dtype={_dtype_name(code)} (float8 / hifloat8 / float4 output) "
                                  f"{_NEEDS_950}: the Atlas A2 / A3 kernels give int8")
    return False


@_op("npu_grouped_matmul_swiglu_quant_v2(Tensor x, Tensor[] weight, Tensor[] weight_scale, Tensor x_scale, "
     "Tensor group_list, *, Tensor? smooth_scale=None, Tensor[]? weight_assist_matrix=None, Tensor? bias=None, "
     "int? dequant_mode=0, int? dequant_dtype=0, int? quant_mode=0, int? quant_dtype=1, int? group_list_type=0, "
     "int[]? tuning_config=None, int? x_dtype=None, int? weight_dtype=None, int? weight_scale_dtype=None, "
     "int? x_scale_dtype=None) -> (Tensor, Tensor)")
def _npu_grouped_matmul_swiglu_quant_v2(x, weight, weight_scale, x_scale, group_list, *, smooth_scale=None,
                                        weight_assist_matrix=None, bias=None, dequant_mode=0, dequant_dtype=0,
                                        quant_mode=0, quant_dtype=1, group_list_type=0, tuning_config=None,
                                        x_dtype=None, weight_dtype=None, weight_scale_dtype=None,
                                        x_scale_dtype=None):
    """Grouped matmul, dequantisation, SwiGLU and per-token int8 quantisation (module docstring):
    A8W8, A8W4 (weight_assist_matrix [E, N]; dequant_mode 0 per channel, 1 per group with
    weight_scale [E, K_group_num, N]) and A4W4 (smooth_scale). weight and weight_scale: lists of
    one tensor [E, ...]; group_list: cumulative row ends (group_list_type 0) or row counts (1);
    tuning_config (the expected rows per expert) only tunes the kernel. Returns (output int8
    [M, N/2], output_scale float32 [M])."""
    name = _V2
    _check(len(weight) > 0, f"The size of weight should be greater than 0, current size is {len(weight)}")
    _check(len(weight_scale) > 0,
           f"The size of weight_scale should be greater than 0, current size is {len(weight_scale)}")
    _check(len(weight) == 1, f"The size of weight should be 1, current size is {len(weight)}")
    _check(len(weight_scale) == 1, f"The size of weight_scale should be 1, current size is {len(weight_scale)}")
    _check(x.dim() >= 2, f"The x dim should greater than 2, but the actual value is {x.dim()}")
    _check(weight_scale[0].dim() > 0, "The weight_scale[0] is empty.")
    _check(weight[0].dim() > 0, "The weight[0] is empty.")
    _check_v2_dtypes(x_dtype, weight_dtype, weight_scale_dtype, x_scale_dtype)
    if x.dtype in _FLOAT_OUTPUTS or weight[0].dtype in _FLOAT_OUTPUTS:
        raise NotImplementedError(f"{name}: float8 x / weight {_NEEDS_950} (got {x.dtype} and {weight[0].dtype})")

    dequant_mode = 0 if dequant_mode is None else dequant_mode
    quant_mode = 0 if quant_mode is None else quant_mode
    group_list_type = 0 if group_list_type is None else group_list_type
    if dequant_mode == 2 or quant_mode == 2:
        raise NotImplementedError(f"{name}: MX quantisation (dequant_mode / quant_mode 2) {_NEEDS_950}")
    _check(dequant_mode in (0, 1), f"{name}: dequant_mode must be 0 (per-channel weight scales) or 1 (per-group, "
                                   f"A8W4), got {dequant_mode}")
    _check(quant_mode == 0, f"{name}: quant_mode must be 0 (per-token) on the Atlas A2 / A3 kernels, got {quant_mode}")
    _check(dequant_dtype in (None, 0, _cdt.SCALAR_TYPES.index(torch.float32), _cdt.DType.float32),
           f"{name}: dequant_dtype must be 0 or torch.float32 (the dequantisation runs in float32) on the "
           f"Atlas A2 / A3 kernels, got {_dtype_name(dequant_dtype)}")
    _check(_quant_dtype_is_int8(quant_dtype), f"{name}: quant_dtype must be torch.int8 (the default), got "
                                              f"{_dtype_name(quant_dtype)}")
    _check(group_list_type in (0, 1), f"{name}: group_list_type must be 0 (cumsum) or 1 (count), "
                                      f"got {group_list_type}")
    _check(bias is None, f"{name}: bias is reserved: only None is supported")

    w, int4_w = weight[0], weight[0].dtype == torch.int32
    assist = None
    if weight_assist_matrix is not None:
        _check(len(weight_assist_matrix) == 1, f"{name}: weight_assist_matrix must be a list of one tensor [E, N], "
                                               f"got {len(weight_assist_matrix)}")
        _check(int4_w and x.dtype == torch.int8, f"{name}: weight_assist_matrix is only used in the A8W4 mode (int8 "
                                                 f"x, int4 weight): pass None")
        assist = weight_assist_matrix[0]
    if smooth_scale is not None:
        _check(x.dtype == torch.int32, f"{name}: smooth_scale is only used in the A4W4 mode (int4 x): pass None")
    return _run(name, x, w, weight_scale[0], x_scale, group_list, cumulative=group_list_type == 0, assist=assist,
                smooth=smooth_scale, per_group=dequant_mode == 1)
