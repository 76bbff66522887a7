"""op-plugin's fused feed-forward operator ``torch_npu.npu_ffn`` (aclnnFFNV2).

``npu_ffn(x, weight1, weight2, activation, *, expert_tokens, expert_tokens_index, bias1, bias2,
scale, offset, deq_scale1, deq_scale2, antiquant_scale1, antiquant_scale2, antiquant_offset1,
antiquant_offset2, inner_precise, output_dtype)`` computes a transformer FFN block,
``y = activation(x @ W1 + b1) @ W2 + b2``, on x's rows (x [..., K1], 2 to 8 dimensions; y
[..., N2]). Without expert tokens the weights are [K1, N1] / [K2, N2] and the biases [N1] / [N2];
with them (MoE FFN) x's rows are split into consecutive groups, one per expert, and group e uses
weight1[e] [K1, N1], weight2[e] [K2, N2], bias1[e], bias2[e]. ``expert_tokens`` gives the group
sizes, ``expert_tokens_index`` their cumulative ends (at most 256 experts; the sizes add up to
the number of rows).

The scenario follows the dtypes, as in CANN's FFN kernel:

* float16 x and weights: inner_precise=0 (high precision, the default) keeps x @ W1 + b1 in
  float32 for the activation; inner_precise=1 (high performance) rounds it to float16 first. The
  activation's result is float16 (the second matmul's input), y is float16. bias float16.
* bfloat16 x and weights: as high precision (inner_precise must be 0); y bfloat16, bias float32.
* float16 / bfloat16 x with int8 weights (weight-only quantization): each weight is dequantized
  per output channel into x's dtype, ``W = (W_int8 + antiquant_offset) * antiquant_scale``
  (antiquant parameters [N] / [E, N], x's dtype, both operations rounded to it), then as above
  (float16: x @ W1 + b1 rounded to float16 before the activation; bfloat16: kept in float32).
* int8 x and weights (full quantization): ``y = ((act((x @ W1 + b1) * deq_scale1) * scale +
  offset) @ W2 + b2) * deq_scale2`` with int32 products and biases. ``output_dtype`` (float16 by
  default, or bfloat16) is y's dtype. For float16 y the dequantization scales are float32, or
  int64 / uint64 holding a float32 in their low 32 bits (npu_trans_quant_param's packing); the
  cube's fixpipe reads them as FP19 (the float32's top 19 bits), the dequantized first product is
  float16, the activation float16 and the requantization ``round(a * scale + offset)`` runs in
  float16 arithmetic. For bfloat16 y they are bfloat16, the dequantized product and the
  activation float32, the requantization float32 (float16 with per-channel scales, as the kernel
  does). scale is per tensor ([1] / [E]) or per channel ([N1] / [E, N1]); offset [1] / [E].

Activations (case-insensitive): ``fastgelu`` (x * sigmoid(1.702 x)), ``gelu`` (the tanh
approximation Ascend C's Gelu uses), ``relu``, ``silu``, and the gated ``geglu`` / ``swiglu`` /
``reglu``, which split x @ W1 + b1 into halves a | b along N1 and give a * act(b) (N1 = 2 * K2;
float16 high performance only, without experts). The others need N1 = K2. All need K1 = N2 and
K1, K2 <= 65535.

Arithmetic is float32 (int8 products exact, as the cube's int32 accumulation) with the roundings
to float16 / bfloat16 the kernel makes between its stages. The operator is a ``torch.ops.npu``
operator with op-plugin's schema, composed of ATen operators (CompositeImplicitAutograd, as
``_composite_ops``); tensors on another device than x (host weights, scales) are moved to x's.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from torch_npu._composite_ops import _check, _dtype, _int8_matmul, _op

_NAME = "npu_ffn"
_ACTIVATIONS = ("fastgelu", "relu", "silu", "gelu", "geglu", "swiglu", "reglu")
_GLU = ("geglu", "swiglu", "reglu")
_MAX_EXPERTS = 256
_MAX_K = 65535
_HIGH_PRECISION, _HIGH_PERFORMANCE = 0, 1
_FP19_MASK = -8192  # 0xFFFFE000 as an int32: the float32 bits the fixpipe's FP19 scale keeps


# ---- activations ------------------------------------------------------------------------------

def _plain_activation(name: str, h: torch.Tensor) -> torch.Tensor:
    if name == "fastgelu":
        return h * torch.sigmoid(1.702 * h)
    if name == "relu":
        return torch.relu(h)
    if name == "silu":
        return F.silu(h)
    return F.gelu(h, approximate="tanh")  # Ascend C's Gelu


def _activate(name: str, h: torch.Tensor) -> torch.Tensor:
    """The activation of float32 h; a GLU gates the first half of N1 by the second's activation."""
    if name not in _GLU:
        return _plain_activation(name, h)
    a, b = h.chunk(2, dim=-1)
    gate = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu"}[name]
    return a * _plain_activation(gate, b)


def _round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 t rounded to dtype (float16 / bfloat16), returned as float32."""
    return t.to(dtype).float()


# ---- argument checks --------------------------------------------------------------------------

def _expert_groups(x_rows: int, expert_tokens, expert_tokens_index):
    """Per-expert row counts (None without experts), after op-plugin's and CANN's checks."""
    _check(expert_tokens is None or expert_tokens_index is None,
           "expert_tokens and expert_tokens_index should not have the value simultaneously.")
    values = expert_tokens if expert_tokens is not None else expert_tokens_index
    if values is None or len(values) == 0:  # an empty list means no experts, as in CANN
        return None
    values = [int(v) for v in values]
    _check(len(values) <= _MAX_EXPERTS, f"{_NAME}: at most {_MAX_EXPERTS} experts are supported, got "
                                        f"{len(values)} expert tokens")
    if expert_tokens is not None:
        for v in values:
            _check(v >= 0, f"{_NAME}: expert_tokens should not be smaller than zero, but {v} is found.")
        counts = values
    else:
        counts, previous = [], 0
        for v in values:
            _check(v >= 0, f"{_NAME}: expert_tokens_index should not be smaller than zero, but {v} is found.")
            _check(v >= previous, f"{_NAME}: expert_tokens_index should not be decremental, but two consecutive "
                                  f"numbers {previous} and {v} are found.")
            counts.append(v - previous)
            previous = v
    _check(sum(counts) == x_rows,
           f"{_NAME}: the total number of expert tokens ({sum(counts)}) should be equal to the product of all x "
           f"dimensions excluding the last one ({x_rows})")
    return counts


def _check_dtype(arg: str, t, allowed, what: str = "") -> None:
    if t is None:
        return
    names = " or ".join(str(d).replace("torch.", "") for d in allowed)
    _check(t.dtype in allowed, f"{_NAME}: {arg} must be {names}{what}, got {str(t.dtype).replace('torch.', '')}")


def _check_per_expert(arg: str, t, experts, n: int, n_name: str) -> None:
    """t is [n] without experts, [E, n] with them."""
    if t is None:
        return
    want = [n] if experts is None else [len(experts), n]
    _check(list(t.shape) == want,
           f"{_NAME}: {arg} must have shape {want} ([{n_name}]" + ("" if experts is None else f" per expert")
           + f"), got {list(t.shape)}")


def _check_shapes(x, weight1, weight2, glu, experts):
    _check(2 <= x.dim() <= 8, f"x shape dims should be 2~8, but it is {x.dim()}")
    want = 2 if experts is None else 3
    for arg, w in (("weight1", weight1), ("weight2", weight2)):
        _check(w.dim() == want, f"{_NAME}: {arg} must have {want} dimensions ("
                                + ("[K, N] without experts" if experts is None else "[E, K, N] with experts")
                                + f"), got shape {list(w.shape)}")
    k1, n1 = weight1.shape[-2:]
    k2, n2 = weight2.shape[-2:]
    _check(x.size(-1) == k1, f"The k of x and weight should be equal. but x_k_dim is {x.size(-1)}, "
                             f"wight1_k_dim is {k1}")
    _check(k1 <= _MAX_K and k2 <= _MAX_K, f"{_NAME}: the k of weight1 ({k1}) and of weight2 ({k2}) should both be "
                                          f"at most {_MAX_K}")
    _check(n2 == k1, f"{_NAME}: weight2's N ({n2}) must equal weight1's K ({k1}): y has x's last dimension")
    if glu:
        _check(n1 % 2 == 0 and k2 == n1 // 2, f"{_NAME}: a GLU activation needs weight1's N even and weight2's K "
                                              f"half of it, got N1 = {n1} and K2 = {k2}")
    else:
        _check(n1 == k2, f"{_NAME}: weight1's N ({n1}) must equal weight2's K ({k2})")
    if experts is not None:
        for arg, w in (("weight1", weight1), ("weight2", weight2)):
            _check(w.size(0) == len(experts), f"{_NAME}: {arg} must hold one matrix per expert ({len(experts)}), "
                                              f"got {w.size(0)}")
    return n1, n2


def _none_given(what: str, **tensors) -> None:
    given = [name for name, t in tensors.items() if t is not None]
    _check(not given, f"{_NAME}: {', '.join(given)} cannot be given {what}")


def _fp19_scale(deq: torch.Tensor) -> torch.Tensor:
    """A float16-output dequantization scale as the fixpipe applies it: a float32 (or the float32
    in the low 32 bits of an int64 / uint64) truncated to FP19, as float32."""
    if deq.dtype in (torch.int64, torch.uint64):
        low = deq.view(torch.int64) & 0xFFFFFFFF
        bits = torch.where(low >= 2 ** 31, low - 2 ** 32, low).to(torch.int32)  # the same 32 bits, signed
    else:
        bits = deq.float().contiguous().view(torch.int32)
    return (bits & _FP19_MASK).view(torch.float32)


# ---- the operator -----------------------------------------------------------------------------

@_op("npu_ffn(Tensor x, Tensor weight1, Tensor weight2, str activation, *, int[]? expert_tokens=None, "
     "int[]? expert_tokens_index=None, Tensor? bias1=None, Tensor? bias2=None, Tensor? scale=None, "
     "Tensor? offset=None, Tensor? deq_scale1=None, Tensor? deq_scale2=None, Tensor? antiquant_scale1=None, "
     "Tensor? antiquant_scale2=None, Tensor? antiquant_offset1=None, Tensor? antiquant_offset2=None, "
     "int? inner_precise=None, ScalarType? output_dtype=None) -> Tensor")
def _npu_ffn(x, weight1, weight2, activation, *, expert_tokens=None, expert_tokens_index=None, bias1=None,
             bias2=None, scale=None, offset=None, deq_scale1=None, deq_scale2=None, antiquant_scale1=None,
             antiquant_scale2=None, antiquant_offset1=None, antiquant_offset2=None, inner_precise=None,
             output_dtype=None):
    """y = activation(x @ W1 + b1) @ W2 + b2 per expert group of x's rows; see the module docstring
    for the float16 / bfloat16, weight-quantized and int8-quantized scenarios."""
    act = activation.lower()
    _check(act in _ACTIVATIONS, f"{_NAME}: the activation type {activation} is not supported by ffn operator, "
                                f"expected one of {', '.join(_ACTIVATIONS)}")
    glu = act in _GLU
    precise = _HIGH_PRECISION if inner_precise is None else int(inner_precise)
    _check(precise in (_HIGH_PRECISION, _HIGH_PERFORMANCE),
           f"{_NAME}: inner_precise must be 0 (high precision) or 1 (high performance), got {precise}")
    _check(x.dim() >= 1, f"x shape dims should be 2~8, but it is {x.dim()}")
    rows = math.prod(x.shape[:-1])
    experts = _expert_groups(rows, expert_tokens, expert_tokens_index)
    n1, n2 = _check_shapes(x, weight1, weight2, glu, experts)

    _check_dtype("x", x, (torch.float16, torch.bfloat16, torch.int8))
    _check(weight1.dtype == weight2.dtype, f"{_NAME}: weight1 and weight2 must have the same dtype, got "
                                           f"{weight1.dtype} and {weight2.dtype}")
    _check_dtype("weight1", weight1, (torch.float16, torch.bfloat16, torch.int8))
    quant = dict(scale=scale, offset=offset, deq_scale1=deq_scale1, deq_scale2=deq_scale2)
    antiquant = dict(antiquant_scale1=antiquant_scale1, antiquant_scale2=antiquant_scale2,
                     antiquant_offset1=antiquant_offset1, antiquant_offset2=antiquant_offset2)

    # The scenario, with CANN's dtype rules for it.
    if glu:
        _check(x.dtype == torch.float16 and weight1.dtype == torch.float16 and precise == _HIGH_PERFORMANCE
               and experts is None,
               f"{_NAME}: activation {activation} (a GLU) supports only float16 x and weights, inner_precise=1 "
               f"(high performance) and no expert tokens")
    if x.dtype == torch.int8:
        mode, y_dtype, bias_dtype = "quant", None, torch.int32
        _check(weight1.dtype == torch.int8, f"{_NAME}: int8 x (quantization) needs int8 weights, got {weight1.dtype}")
    elif weight1.dtype == torch.int8:
        mode, y_dtype = "antiquant", x.dtype
        bias_dtype = torch.float16 if x.dtype == torch.float16 else torch.float32
    else:
        _check(weight1.dtype == x.dtype, f"{_NAME}: weight1 must have x's dtype {x.dtype}, got {weight1.dtype}")
        mode, y_dtype = "float", x.dtype
        bias_dtype = torch.float16 if x.dtype == torch.float16 else torch.float32
        _check(x.dtype == torch.float16 or precise == _HIGH_PRECISION,
               f"{_NAME}: FFN bfloat16 is only support high precision now! (inner_precise must be 0, got {precise})")
    _check_dtype("bias1", bias1, (bias_dtype,), f" for {x.dtype} x and {weight1.dtype} weights")
    _check_dtype("bias2", bias2, (bias_dtype,), f" for {x.dtype} x and {weight1.dtype} weights")
    _check_per_expert("bias1", bias1, experts, n1, "N1")
    _check_per_expert("bias2", bias2, experts, n2, "N2")

    if mode == "quant":
        _none_given("with int8 x (quantization)", **antiquant)
        missing = [name for name, t in quant.items() if t is None]
        _check(not missing, f"{_NAME}: int8 x (quantization) needs scale, offset, deq_scale1 and deq_scale2; "
                            f"missing {', '.join(missing)}")
        y_dtype = torch.float16 if output_dtype is None else _dtype(_NAME, "output_dtype", output_dtype)
        _check(y_dtype in (torch.float16, torch.bfloat16),
               f"{_NAME}: output_dtype must be torch.float16 or torch.bfloat16, got {y_dtype}")
        deq_allowed = (torch.bfloat16,) if y_dtype == torch.bfloat16 else (torch.int64, torch.uint64, torch.float32)
        _check_dtype("deq_scale1", deq_scale1, deq_allowed, f" for {y_dtype} output")
        _check(deq_scale2.dtype == deq_scale1.dtype, f"{_NAME}: deq_scale1 and deq_scale2 must have the same dtype, "
                                                     f"got {deq_scale1.dtype} and {deq_scale2.dtype}")
        _check_dtype("scale", scale, (torch.float32,))
        _check_dtype("offset", offset, (torch.float32,))
        _check_per_expert("deq_scale1", deq_scale1, experts, n1, "N1")
        _check_per_expert("deq_scale2", deq_scale2, experts, n2, "N2")
        count = 1 if experts is None else len(experts)
        _check(list(offset.shape) == [count], f"{_NAME}: offset must have shape [{count}] (one per "
                                              + ("tensor" if experts is None else "expert")
                                              + f"), got {list(offset.shape)}")
        per_tensor = [1] if experts is None else [count]
        per_channel = [n1] if experts is None else [count, n1]
        _check(list(scale.shape) in (per_tensor, per_channel),
               f"{_NAME}: scale must have shape {per_tensor} (per tensor) or {per_channel} (per channel), got "
               f"{list(scale.shape)}")
        channel_scale = list(scale.shape) == per_channel and per_channel != per_tensor
        _check(not channel_scale or deq_scale1.dtype != torch.float32,
               f"{_NAME}: per-channel scale needs deq_scale1 and deq_scale2 as int64 / uint64 (float16 output) or "
               f"bfloat16 (bfloat16 output), got float32")
    elif mode == "antiquant":
        _none_given(f"with {weight1.dtype} weights (weight-only quantization)", **quant)
        missing = [name for name, t in antiquant.items() if t is None]
        _check(not missing, f"{_NAME}: int8 weights with {x.dtype} x need antiquant_scale1, antiquant_scale2, "
                            f"antiquant_offset1 and antiquant_offset2; missing {', '.join(missing)}")
        for name, t in antiquant.items():
            _check_dtype(name, t, (x.dtype,), " (x's dtype)")
            _check_per_expert(name, t, experts, n1 if name.endswith("1") else n2, "N1" if name.endswith("1") else "N2")
    else:
        _none_given(f"with {x.dtype} x and weights (no quantization)", **quant, **antiquant)

    device = x.device
    on = (lambda t: None if t is None else t.to(device))  # noqa: E731  (host weights and scales)
    weight1, weight2, bias1, bias2 = on(weight1), on(weight2), on(bias1), on(bias2)
    scale, offset, deq_scale1, deq_scale2 = on(scale), on(offset), on(deq_scale1), on(deq_scale2)
    aq = {name: on(t) for name, t in antiquant.items()}
    x2 = x.reshape(rows, x.size(-1))

    def param(t, e):
        return None if t is None else (t if e is None else t[e])

    def float_ffn(xe, w1, w2, b1, b2):
        """float16 / bfloat16 path; w1, w2 float32 values of weights in x's dtype."""
        h = xe.float() @ w1
        if b1 is not None:
            h = h + b1.float()
        if x.dtype == torch.float16 and (mode == "antiquant" or precise == _HIGH_PERFORMANCE):
            h = _round_to(h, torch.float16)  # the first matmul's float16 output
        a = _round_to(_activate(act, h), y_dtype)  # the second matmul's input
        y = a @ w2
        if b2 is not None:
            y = y + b2.float()
        return y.to(y_dtype)

    def dequant_weight(w, s, o):
        # (w + offset) * scale, each operation rounded to x's dtype, as the kernel's weight cast
        return _round_to(_round_to(w.float() + o.float(), x.dtype) * s.float(), x.dtype)

    def quant_ffn(xe, e):
        fp16 = y_dtype == torch.float16
        acc = _int8_matmul(xe, param(weight1, e))
        if bias1 is not None:
            acc = acc + param(bias1, e)
        d1 = param(deq_scale1, e)
        d1 = _fp19_scale(d1) if fp16 else d1.float()
        h = acc.float() * d1
        if fp16:
            h = _round_to(h, torch.float16)  # the fixpipe's float16 output
        a = _activate(act, h)
        s = param(scale, e).float().reshape(-1)  # [1] or [N1]
        o = param(offset, e).float().reshape(-1)
        if fp16 or s.numel() > 1:  # requantization in float16 arithmetic (float32 for bfloat16 per tensor)
            q = _round_to(_round_to(a, torch.float16) * _round_to(s, torch.float16), torch.float16)
            q = _round_to(q + _round_to(o, torch.float16), torch.float16)
        else:
            q = a * s + o
        q = torch.round(q).clamp(-128, 127).to(torch.int8)
        acc2 = _int8_matmul(q, param(weight2, e))
        if bias2 is not None:
            acc2 = acc2 + param(bias2, e)
        d2 = param(deq_scale2, e)
        d2 = _fp19_scale(d2) if fp16 else d2.float()
        return (acc2.float() * d2).to(y_dtype)

    def expert_ffn(xe, e):
        if mode == "quant":
            return quant_ffn(xe, e)
        if mode == "antiquant":
            w1 = dequant_weight(param(weight1, e), param(aq["antiquant_scale1"], e), param(aq["antiquant_offset1"], e))
            w2 = dequant_weight(param(weight2, e), param(aq["antiquant_scale2"], e), param(aq["antiquant_offset2"], e))
        else:
            w1, w2 = param(weight1, e).float(), param(weight2, e).float()
        return float_ffn(xe, w1, w2, param(bias1, e), param(bias2, e))

    if experts is None:
        y = expert_ffn(x2, None)
    else:
        parts = [expert_ffn(xe, e) for e, xe in enumerate(x2.split(experts)) if xe.size(0) > 0]
        y = torch.cat(parts) if parts else x2.new_empty((0, n2), dtype=y_dtype)
    return y.reshape(*x.shape[:-1], n2)
