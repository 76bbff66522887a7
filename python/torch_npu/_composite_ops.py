"""op-plugin's utility operators that are compositions of ATen operators.

``torch_npu.npu_dtype_cast``, ``npu_transpose``, ``npu_one_hot``, ``npu_max``, ... are, in
Huawei's op-plugin, thin wrappers over one or a few CANN kernels with the semantics of ATen
operators. Here they are ``torch.ops.npu`` operators with op-plugin's schemas whose kernels
are registered as CompositeImplicitAutograd: they run the equivalent ATen operators on the
npu tensors (each one an npu kernel on the stream), so autograd, torch.compile tracing and
the meta device work without code of their own. The fused operators with kernels of their
own are C++ (contrib/).

Schemas are op-plugin's (op_plugin_functions.yaml); ``int dtype`` arguments receive
``torch.dtype`` values as their ScalarType codes, as in torch_npu.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_lib = torch.library.Library("npu", "FRAGMENT")

# c10::ScalarType codes (an `int dtype` argument given a torch.dtype receives its code).
_SCALAR_TYPES = (
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
    torch.float64, torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.qint8,
    torch.quint8, torch.qint32, torch.bfloat16, torch.quint4x2, torch.quint2x4, torch.bits1x8,
    torch.bits2x4, torch.bits4x2, torch.bits8, torch.bits16, torch.float8_e5m2, torch.float8_e4m3fn,
    torch.float8_e5m2fnuz, torch.float8_e4m3fnuz, torch.uint16, torch.uint32, torch.uint64,
)


def _dtype(op: str, arg: str, code) -> torch.dtype:
    if isinstance(code, torch.dtype):
        return code
    if not isinstance(code, int) or not 0 <= code < len(_SCALAR_TYPES):
        raise TypeError(f"{op}: {arg} must be a torch.dtype, got {code!r}")
    return _SCALAR_TYPES[code]


def _op(schema: str):
    """Defines torch.ops.npu.<name> with op-plugin's schema; the function is its kernel."""
    name = schema.split("(", 1)[0]

    def register(fn):
        _lib.define(schema)
        _lib.impl(name, fn, "CompositeImplicitAutograd")
        return fn
    return register


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


# ---- casts, layout and shape ------------------------------------------------------------

@_op("npu_dtype_cast(Tensor self, int dtype, int? input_dtype=None) -> Tensor")
def _npu_dtype_cast(self, dtype, input_dtype=None):
    return self.to(_dtype("npu_dtype_cast", "dtype", dtype))


@_op("npu_dtype_cast_(Tensor(a!) self, Tensor src) -> Tensor(a!)")
def _npu_dtype_cast_(self, src):
    return self.copy_(src)


@_op("npu_transpose(Tensor self, int[] perm, bool require_contiguous=True) -> Tensor")
def _npu_transpose(self, perm, require_contiguous=True):
    _check(len(perm) == self.dim(), f"npu_transpose: perm must name each of the {self.dim()} dimensions "
                                    f"once, got {list(perm)}")
    return self.permute(perm).contiguous()


@_op("npu_broadcast(Tensor self, int[] size) -> Tensor")
def _npu_broadcast(self, size):
    return self.expand(size).contiguous()


@_op("npu_reshape(Tensor self, int[] shape, bool can_refresh=False) -> Tensor")
def _npu_reshape(self, shape, can_refresh=False):
    return self.reshape(shape).clone()


@_op("npu_slice(Tensor self, int[] offsets, int[] size) -> Tensor")
def _npu_slice(self, offsets, size):
    _check(len(offsets) == self.dim() and len(size) == self.dim(),
           f"npu_slice: offsets and size must have {self.dim()} entries (one per dimension), "
           f"got {list(offsets)} and {list(size)}")
    out = self
    for d, (o, n) in enumerate(zip(offsets, size)):
        out = out.narrow(d, o, n)
    return out.contiguous()


@_op("npu_indexing(Tensor self, int[] begin, int[] end, int[] strides, int begin_mask=0, int end_mask=0, "
     "int ellipsis_mask=0, int new_axis_mask=0, int shrink_axis_mask=0) -> Tensor")
def _npu_indexing(self, begin, end, strides, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                  shrink_axis_mask=0):
    """TensorFlow's StridedSlice (one begin/end/stride per leading dimension; bit i of a mask
    applies to dimension i)."""
    _check(len(begin) == len(end) == len(strides) <= self.dim(),
           f"npu_indexing: begin, end and strides must have the same length, at most {self.dim()}; "
           f"got {len(begin)}, {len(end)} and {len(strides)}")
    _check(ellipsis_mask == 0 and new_axis_mask == 0,
           "npu_indexing: ellipsis_mask and new_axis_mask are not supported (must be 0)")
    index = []
    for d, (b, e, s) in enumerate(zip(begin, end, strides)):
        _check(s > 0, f"npu_indexing: strides[{d}] must be positive, got {s}")
        if shrink_axis_mask >> d & 1:
            index.append(b)
            continue
        index.append(slice(None if begin_mask >> d & 1 else b, None if end_mask >> d & 1 else e, s))
    return self[tuple(index)].contiguous()


@_op("npu_stride_copy(Tensor self, int[] shape, int[] stride, Scalar storage_offset) -> Tensor")
def _npu_stride_copy(self, shape, stride, storage_offset):
    return self.as_strided(shape, stride, int(storage_offset)).clone()


@_op("npu_pad(Tensor input, int[] paddings) -> Tensor")
def _npu_pad(input, paddings):
    """paddings: (before, after) pairs from the first dimension on (F.pad's order reversed)."""
    _check(len(paddings) % 2 == 0 and len(paddings) // 2 <= input.dim(),
           f"npu_pad: paddings must hold (before, after) pairs for at most {input.dim()} dimensions, "
           f"got {list(paddings)}")
    pairs = [paddings[i:i + 2] for i in range(0, len(paddings), 2)]
    return F.pad(input, [p for pair in reversed(pairs) for p in pair], "constant", 0)


@_op("npu_bmmV2(Tensor self, Tensor mat2, int[] output_sizes) -> Tensor")
def _npu_bmmV2(self, mat2, output_sizes):
    return torch.matmul(self, mat2)


@_op("npu_stride_add(Tensor self, Tensor other, Scalar offset1, Scalar offset2, Scalar c1_len) -> Tensor")
def _npu_stride_add(self, other, offset1, offset2, c1_len):
    """5HD tensors [N, C1, H, W, C0]: self[:, offset1:] + other[:, offset2:], each zero-padded
    along C1 to 16 * c1_len."""
    def take(x, offset):
        x = x[:, int(offset):]
        pad = 16 * int(c1_len) - x.size(1)
        _check(pad >= 0, f"npu_stride_add: c1_len={c1_len} is too small for {x.size(1)} channel blocks")
        return torch.cat([x, x.new_zeros((x.size(0), pad) + tuple(x.shape[2:]))], 1)
    return take(self, offset1) + take(other, offset2)


@_op("one_(Tensor(a!) self) -> Tensor(a!)")
def _one_(self):
    return self.fill_(1)


# ---- reductions and sorting ------------------------------------------------------------

@_op("npu_max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)")
def _npu_max(self, dim, keepdim=False):
    values, indices = torch.max(self, dim, keepdim)
    return values, indices.to(torch.int32)


@_op("npu_min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)")
def _npu_min(self, dim, keepdim=False):
    values, indices = torch.min(self, dim, keepdim)
    return values, indices.to(torch.int32)


@_op("npu_sort_v2(Tensor self, int dim=-1, bool descending=False) -> Tensor")
def _npu_sort_v2(self, dim=-1, descending=False):
    return torch.sort(self, dim=dim, descending=descending).values


# ---- activations and normalisation ------------------------------------------------------

@_op("fast_gelu(Tensor self) -> Tensor")
def _fast_gelu(self):
    return torch.ops.npu.npu_fast_gelu(self)


@_op("npu_gelu(Tensor self, *, str approximate='none') -> Tensor")
def _npu_gelu(self, approximate="none"):
    _check(approximate in ("none", "tanh"), f"npu_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return F.gelu(self, approximate=approximate)


@_op("npu_silu(Tensor self) -> Tensor")
def _npu_silu(self):
    return F.silu(self)


@_op("npu_silu_(Tensor(a!) self) -> Tensor(a!)")
def _npu_silu_(self):
    return F.silu(self, inplace=True)


@_op("npu_mish(Tensor self) -> Tensor")
def _npu_mish(self):
    return F.mish(self)


@_op("npu_layer_norm_eval(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
     "float eps=1e-05) -> Tensor")
def _npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(input, normalized_shape, weight, bias, eps)


@_op("npu_gemma_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
def _npu_gemma_rms_norm(self, gamma, epsilon=1e-6):
    """Gemma's RMSNorm: x / rms(x) * (1 + gamma), computed in float; rstd as npu_rms_norm's."""
    dims = list(range(self.dim() - gamma.dim(), self.dim()))
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + epsilon)
    return (x * rstd * (1.0 + gamma.float())).to(self.dtype), rstd


@_op("npu_add_layer_norm(Tensor x1, Tensor x2, Tensor gamma, Tensor beta, float epsilon=1e-05, "
     "bool additional_output=False) -> (Tensor, Tensor, Tensor, Tensor)")
def _npu_add_layer_norm(x1, x2, gamma, beta, epsilon=1e-5, additional_output=False):
    """y = LayerNorm(x1 + x2) over gamma's dimensions; also mean and rstd (float, reduced
    dimensions kept as 1) and the sum x."""
    x = x1 + x2
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    rstd = torch.rsqrt(xf.var(dims, unbiased=False, keepdim=True) + epsilon)
    y = ((xf - mean) * rstd * gamma.float() + beta.float()).to(x1.dtype)
    return y, mean, rstd, x


@_op("npu_deep_norm(Tensor x, Tensor gx, Tensor beta, Tensor gamma, float alpha=0.3, float epsilon=1e-06) "
     "-> (Tensor, Tensor, Tensor)")
def _npu_deep_norm(x, gx, beta, gamma, alpha=0.3, epsilon=1e-6):
    """DeepNorm: LayerNorm(alpha * x + gx) * gamma + beta; returns (mean, rstd, y)."""
    z = (x.float() * alpha + gx.float())
    dims = list(range(z.dim() - gamma.dim(), z.dim()))
    mean = z.mean(dims, keepdim=True)
    rstd = torch.rsqrt(z.var(dims, unbiased=False, keepdim=True) + epsilon)
    y = ((z - mean) * rstd * gamma.float() + beta.float()).to(x.dtype)
    return mean, rstd, y


@_op("npu_softmax_cross_entropy_with_logits(Tensor self, Tensor labels) -> Tensor")
def _npu_softmax_cross_entropy_with_logits(self, labels):
    return -(labels * F.log_softmax(self, dim=-1)).sum(-1)


@_op("npu_masked_softmax_with_rel_pos_bias(Tensor x, Tensor? atten_mask, Tensor relative_pos_bias, "
     "float scale_value=1.0, int inner_precision_mode=0) -> Tensor")
def _npu_masked_softmax_with_rel_pos_bias(x, atten_mask, relative_pos_bias, scale_value=1.0,
                                          inner_precision_mode=0):
    y = x * scale_value if scale_value != 1.0 else x
    if atten_mask is not None:
        y = y + atten_mask
    y = y + relative_pos_bias
    return F.softmax(y.float(), dim=-1).to(x.dtype)


@_op("npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor")
def _npu_interleave_rope(x, cos, sin):
    """Rotary embedding of interleaved pairs: the last dimension's (even, odd) elements are
    regrouped as (first half, second half), then x * cos + rotate_half(x) * sin."""
    d = x.size(-1)
    _check(d % 2 == 0, f"npu_interleave_rope: the last dimension of x must be even, got {d}")
    xs = x.unflatten(-1, (d // 2, 2)).transpose(-1, -2).reshape(x.shape)
    rotated = torch.cat([-xs[..., d // 2:], xs[..., :d // 2]], -1)
    return (xs * cos + rotated * sin).to(x.dtype)


# ---- one-hot, scatter and masks ---------------------------------------------------------

@_op("npu_one_hot(Tensor self, int num_classes=-1, int depth=1, Scalar on_value=1, Scalar off_value=0) -> Tensor")
def _npu_one_hot(self, num_classes=-1, depth=1, on_value=1, off_value=0):
    """out[..., j] = on_value where self == j, else off_value, for j < depth (float32)."""
    _check(depth >= 1, f"npu_one_hot: depth must be >= 1, got {depth}")
    classes = torch.arange(depth, device=self.device)
    hit = self.unsqueeze(-1) == classes
    on = torch.full((), float(on_value), device=self.device)
    off = torch.full((), float(off_value), device=self.device)
    return torch.where(hit, on, off)


@_op("scatter_update(Tensor self, Tensor indices, Tensor updates, int axis) -> Tensor")
def _scatter_update(self, indices, updates, axis):
    return _scatter_update_(self.clone(), indices, updates, axis)


@_op("scatter_update_(Tensor(a!) self, Tensor indices, Tensor updates, int axis) -> Tensor(a!)")
def _scatter_update_(self, indices, updates, axis):
    """KV-cache update: for each batch row b, updates[b] is written into self[b] at position
    indices[b] of dimension `axis` (-1 or -2); indices [B] or [B, 2] (batch row, position)."""
    _check(axis in (-1, -2, self.dim() - 1, self.dim() - 2),
           f"scatter_update: axis must be -1 or -2, got {axis}")
    _check(indices.dim() in (1, 2), f"scatter_update: indices must be 1-D [B] or 2-D [B, 2], got {indices.dim()}-D")
    axis = axis % self.dim()
    length = updates.size(axis)
    rows = indices.tolist()
    for b, row in enumerate(rows):
        target, start = (row[0], row[1]) if indices.dim() == 2 else (b, row)
        self[target].narrow(axis - 1, start, length).copy_(updates[b])
    return self


@_op("npu_scatter_nd_update(Tensor self, Tensor indices, Tensor updates) -> Tensor")
def _npu_scatter_nd_update(self, indices, updates):
    return _npu_scatter_nd_update_(self.clone(), indices, updates)


@_op("npu_scatter_nd_update_(Tensor(a!) self, Tensor indices, Tensor updates) -> Tensor(a!)")
def _npu_scatter_nd_update_(self, indices, updates):
    """TensorFlow's ScatterNdUpdate: indices [..., K] address self's first K dimensions."""
    k = indices.size(-1)
    _check(k <= self.dim(), f"npu_scatter_nd_update: indices' last dimension ({k}) exceeds self's rank {self.dim()}")
    self[tuple(indices.long().unbind(-1))] = updates.to(self.dtype)
    return self


@_op("npu_scatter(Tensor self, Tensor indices, Tensor updates, int dim) -> Tensor")
def _npu_scatter(self, indices, updates, dim):
    """Writes updates[i] at self[i, indices[i]] along dim (0 or 1 of a 2-D self)."""
    out = self.clone()
    _check(self.dim() == 2 and dim in (0, 1), f"npu_scatter: expected a 2-D self and dim 0 or 1, got "
                                              f"{self.dim()}-D and dim={dim}")
    return out.scatter_(dim, indices.long().unsqueeze(dim), updates.unsqueeze(dim))


@_op("npu_masked_fill_range(Tensor self, Tensor start, Tensor end, Tensor value, int axis=-1) -> Tensor")
def _npu_masked_fill_range(self, start, end, value, axis=-1):
    """start/end [V, B]: for each value i and batch row j, positions start[i, j]:end[i, j] along
    `axis` are set to value[i] -- within row j of dimension 0 when axis is the last dimension,
    else across the whole tensor."""
    _check(start.dim() == 2 and start.shape == end.shape and value.numel() == start.size(0),
           f"npu_masked_fill_range: start and end must be [V, B] with V = value.numel(), got "
           f"{list(start.shape)}, {list(end.shape)} and {value.numel()} values")
    out = self.clone()
    axis = axis % self.dim()
    per_row = self.dim() > 1 and axis == self.dim() - 1
    starts, ends, values = start.tolist(), end.tolist(), value.tolist()
    for i, v in enumerate(values):
        for j, (s, e) in enumerate(zip(starts[i], ends[i])):
            if e > s:
                target = out.select(0, j).narrow(axis - 1, s, e - s) if per_row else out.narrow(axis, s, e - s)
                target.fill_(v)
    return out


# ---- dropout with bit masks -----------------------------------------------------------------

_BIT_WEIGHTS = tuple(1 << i for i in range(8))


def _bits(device):
    return torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=device)


@_op("npu_dropout_gen_mask(int[] size, float p, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
     "bool? pin_memory=None) -> Tensor")
def _npu_dropout_gen_mask(size, p, *, dtype=None, layout=None, device=None, pin_memory=None):
    """A keep mask for a tensor of `size`: one bit per element (set: keep, with probability
    1 - p), lowest bit first, the element count rounded up to 128: uint8 [ceil(n/128) * 16]."""
    _check(0.0 <= p <= 1.0, f"npu_dropout_gen_mask: p must be in [0, 1], got {p}")
    n = math.prod(size)
    keep = (torch.rand((n + 127) // 128 * 128, device=device) >= p).to(torch.uint8)
    return (keep.view(-1, 8) * _bits(keep.device)).sum(-1, dtype=torch.uint8)


@_op("npu_dropout_do_mask(Tensor self, Tensor mask, float p) -> (Tensor, Tensor)")
def _npu_dropout_do_mask(self, mask, p):
    """self * keep / (1 - p), keep from npu_dropout_gen_mask's bits; returns (out, mask)."""
    _check(mask.dtype == torch.uint8 and mask.numel() * 8 >= self.numel(),
           f"npu_dropout_do_mask: mask must be uint8 with a bit per element of self ({self.numel()}), "
           f"got {mask.dtype} with {mask.numel() * 8} bits")
    keep = mask.reshape(-1).unsqueeze(-1).bitwise_and(_bits(mask.device)).ne(0).reshape(-1)[:self.numel()]
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return self * keep.view(self.shape).to(self.dtype) * scale, mask


@_op("_npu_dropout(Tensor self, float p) -> (Tensor, Tensor)")
def _npu_dropout_op(self, p):
    mask = _npu_dropout_gen_mask(list(self.shape), p, device=self.device)
    return _npu_dropout_do_mask(self, mask, p)


# ---- recurrent cells -------------------------------------------------------------------------

@_op("npu_lstm_cell(Tensor input, Tensor w_ih, Tensor w_hh, Tensor h, Tensor c, Tensor? b_ih=None, "
     "Tensor? b_hh=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_lstm_cell(input, w_ih, w_hh, h, c, b_ih=None, b_hh=None):
    """One LSTM step with weights [in, 4H] / [H, 4H] (gate columns in torch's i, f, g, o
    order); returns (y, h, c, i, j, f, o, tanh(c)) with j the cell candidate g."""
    gates = input @ w_ih + h @ w_hh
    for b in (b_ih, b_hh):
        if b is not None:
            gates = gates + b
    i, f, g, o = gates.chunk(4, -1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c_next = f * c + i * g
    tanh_c = torch.tanh(c_next)
    h_next = o * tanh_c
    return h_next, h_next, c_next, i, g, f, o, tanh_c


# ---- bits ---------------------------------------------------------------------------------

@_op("npu_sign_bits_pack(Tensor self, int size) -> Tensor")
def _npu_sign_bits_pack(self, size):
    """1-bit signs of a 1-D float tensor (>= 0 -> 1), 8 per uint8, lowest bit first, zero-
    padded to whole bytes; shape [size, bytes / size]."""
    _check(self.dim() == 1, f"npu_sign_bits_pack: self must be 1-D, got {self.dim()}-D")
    bits = (self >= 0).to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=self.device)
    packed = (bits.view(-1, 8) * weights).sum(-1, dtype=torch.uint8)
    _check(packed.numel() % size == 0, f"npu_sign_bits_pack: {packed.numel()} bytes do not split into size={size} rows")
    return packed.view(size, -1)


@_op("npu_sign_bits_unpack(Tensor input, int size, ScalarType dtype) -> Tensor")
def _npu_sign_bits_unpack(input, size, dtype):
    """Inverse of npu_sign_bits_pack: each bit becomes +1 (set) or -1, shape [size, -1]."""
    _check(input.dtype == torch.uint8, f"npu_sign_bits_unpack: input must be uint8, got {input.dtype}")
    _check(dtype in (torch.float16, torch.float32), f"npu_sign_bits_unpack: dtype must be float16 or float32, got {dtype}")
    mask = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=input.device)
    bits = input.reshape(-1).unsqueeze(-1).bitwise_and(mask).ne(0).reshape(-1)
    out = bits.to(dtype) * 2 - 1
    _check(out.numel() % size == 0, f"npu_sign_bits_unpack: {out.numel()} values do not split into size={size} rows")
    return out.view(size, -1)


# ---- quantization --------------------------------------------------------------------------

def _unpack_int4(x):
    """int32 words holding 8 signed 4-bit values each, lowest nibble first."""
    shifts = torch.arange(0, 32, 4, device=x.device, dtype=torch.int32)
    nibbles = (x.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF
    nibbles = torch.where(nibbles >= 8, nibbles - 16, nibbles)
    return nibbles.flatten(-2)


@_op("npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, int? dst_dtype=None, int? src_dtype=None) -> Tensor")
def _npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    """(x + offset) * scale in dst_dtype (default float16); int32 x holds packed int4 values."""
    out_dtype = torch.float16 if dst_dtype is None else _dtype("npu_anti_quant", "dst_dtype", dst_dtype)
    _check(out_dtype in (torch.float16, torch.bfloat16),
           f"npu_anti_quant: dst_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
    _check(x.dtype in (torch.int8, torch.int32), f"npu_anti_quant: x must be int8 or int32 (packed int4), got {x.dtype}")
    values = (_unpack_int4(x) if x.dtype == torch.int32 else x).float()
    if offset is not None:
        values = values + offset.float()
    return (values * scale.float()).to(out_dtype)


_QUANT_RANGE = {torch.int8: (-128, 127), torch.qint8: (-128, 127), torch.quint8: (0, 255), torch.uint8: (0, 255),
                torch.qint32: (-2 ** 31, 2 ** 31 - 1), torch.int32: (-2 ** 31, 2 ** 31 - 1)}
_QUANT_STORAGE = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}


@_op("npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, bool div_mode=True) -> Tensor")
def _npu_quantize(self, scales, zero_points, dtype, axis=1, div_mode=True):
    """round(self / scales + zero_points) (div_mode) or round(self * scales + zero_points),
    saturated to dtype; per-channel scales broadcast along `axis`."""
    target = _dtype("npu_quantize", "dtype", dtype)
    _check(target in _QUANT_RANGE, f"npu_quantize: dtype must be one of torch.qint8, torch.quint8, torch.qint32, "
                                   f"torch.int8, torch.uint8, torch.int32; got {target}")
    shape = [1] * self.dim()
    if scales.numel() > 1:
        shape[axis % self.dim()] = -1
    s = scales.float().reshape(shape)
    x = self.float() / s if div_mode else self.float() * s
    if zero_points is not None:
        x = x + zero_points.float().reshape(shape)
    lo, hi = _QUANT_RANGE[target]
    return torch.round(x).clamp(lo, hi).to(_QUANT_STORAGE.get(target, target))


@_op("npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, int? dst_type=None, "
     "str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)")
def _npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                       dst_type_max=0.0):
    """Symmetric per-token int8 quantization: scale = max|x| / 127 per row of the last dimension
    (after the optional smooth_scales), y = round(x / scale). Returns (y, scale as float32)."""
    target = torch.int8 if dst_type is None else _dtype("npu_dynamic_quant", "dst_type", dst_type)
    _check(target == torch.int8, f"npu_dynamic_quant: only dst_type=torch.int8 is simulated, got {target}")
    _check(quant_mode == "pertoken", f"npu_dynamic_quant: only quant_mode='pertoken' is simulated, got {quant_mode!r}")
    _check(group_index is None, "npu_dynamic_quant: group_index (MoE groups) is not simulated")
    x = input.float()
    if smooth_scales is not None:
        x = x * smooth_scales.float()
    scale = x.abs().amax(-1) / 127.0
    y = torch.round(x / scale.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)).clamp(-128, 127)
    return y.to(torch.int8), scale


# ---- boxes ---------------------------------------------------------------------------------

def _corners(boxes, trans):
    """[4, N] boxes as (x1, y1, x2, y2) rows; trans: given as (center x, center y, w, h)."""
    if trans:
        x, y, w, h = boxes.unbind(0)
        return x - w / 2, y - h / 2, x + w / 2, y + h / 2
    return boxes.unbind(0)


def _distance_iou(self, gtboxes, trans, is_cross, mode, complete):
    """DIoU (complete=False) or CIoU of boxes [4, N] vs gtboxes [4, M]: [M, N] when is_cross,
    else [1, N] one-to-one (M == N)."""
    name = "npu_ciou" if complete else "npu_diou"
    _check(self.dim() == 2 and self.size(0) == 4 and gtboxes.dim() == 2 and gtboxes.size(0) == 4,
           f"{name}: self and gtboxes must be [4, N] boxes, got {list(self.shape)} and {list(gtboxes.shape)}")
    _check(mode in (0, 1), f"{name}: mode must be 0 (iou) or 1 (iof), got {mode}")
    eps = 1e-10
    px1, py1, px2, py2 = _corners(self.float(), trans)
    gx1, gy1, gx2, gy2 = _corners(gtboxes.float(), trans)
    if is_cross:  # rows: gt boxes, columns: boxes
        px1, py1, px2, py2 = (t.unsqueeze(0) for t in (px1, py1, px2, py2))
        gx1, gy1, gx2, gy2 = (t.unsqueeze(1) for t in (gx1, gy1, gx2, gy2))
    else:
        _check(self.size(1) == gtboxes.size(1), f"{name}: is_cross=False needs as many gtboxes as boxes, "
                                                f"got {gtboxes.size(1)} and {self.size(1)}")
    inter = ((torch.min(px2, gx2) - torch.max(px1, gx1)).clamp(min=0)
             * (torch.min(py2, gy2) - torch.max(py1, gy1)).clamp(min=0))
    w1, h1, w2, h2 = px2 - px1, py2 - py1, gx2 - gx1, gy2 - gy1
    denom = (w1 * h1 + w2 * h2 - inter if mode == 0 else w2 * h2) + eps
    iou = inter / denom
    cw = torch.max(px2, gx2) - torch.min(px1, gx1)
    ch = torch.max(py2, gy2) - torch.min(py1, gy1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((px1 + px2 - gx1 - gx2) ** 2 + (py1 + py2 - gy1 - gy2) ** 2) / 4
    out = iou - rho2 / c2
    if complete:
        v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)) ** 2
        alpha = v / ((1 + eps) - iou + v)
        out = out - v * alpha
    return (out if is_cross else out.unsqueeze(0)).to(self.dtype)


@_op("npu_diou(Tensor self, Tensor gtboxes, bool trans=False, bool is_cross=False, int mode=0) -> Tensor")
def _npu_diou(self, gtboxes, trans=False, is_cross=False, mode=0):
    return _distance_iou(self, gtboxes, trans, is_cross, mode, complete=False)


@_op("npu_ciou(Tensor self, Tensor gtboxes, bool trans=False, bool is_cross=True, int mode=0, "
     "bool atan_sub_flag=False) -> Tensor")
def _npu_ciou(self, gtboxes, trans=False, is_cross=True, mode=0, atan_sub_flag=False):
    return _distance_iou(self, gtboxes, trans, is_cross, mode, complete=True)


@_op("npu_bounding_box_encode(Tensor anchor_box, Tensor ground_truth_box, float means0, float means1, "
     "float means2, float means3, float stds0, float stds1, float stds2, float stds3) -> Tensor")
def _npu_bounding_box_encode(anchor_box, ground_truth_box, means0, means1, means2, means3, stds0, stds1, stds2,
                             stds3):
    """Deltas (dx, dy, dw, dh) of ground-truth boxes relative to anchors [N, 4] (x1, y1, x2,
    y2; widths count both edges, +1), normalised by means and stds (mmdetection's legacy
    bbox2delta)."""
    a, g = anchor_box.float(), ground_truth_box.float()
    aw, ah = a[:, 2] - a[:, 0] + 1.0, a[:, 3] - a[:, 1] + 1.0
    gw, gh = g[:, 2] - g[:, 0] + 1.0, g[:, 3] - g[:, 1] + 1.0
    ax, ay = (a[:, 0] + a[:, 2]) * 0.5, (a[:, 1] + a[:, 3]) * 0.5
    gx, gy = (g[:, 0] + g[:, 2]) * 0.5, (g[:, 1] + g[:, 3]) * 0.5
    deltas = torch.stack([(gx - ax) / aw, (gy - ay) / ah, torch.log(gw / aw), torch.log(gh / ah)], -1)
    means = deltas.new_tensor([means0, means1, means2, means3])
    stds = deltas.new_tensor([stds0, stds1, stds2, stds3])
    return ((deltas - means) / stds).to(anchor_box.dtype)


@_op("npu_bounding_box_decode(Tensor rois, Tensor deltas, float means0, float means1, float means2, float means3, "
     "float stds0, float stds1, float stds2, float stds3, int[1] max_shape, float wh_ratio_clip) -> Tensor")
def _npu_bounding_box_decode(rois, deltas, means0, means1, means2, means3, stds0, stds1, stds2, stds3, max_shape,
                             wh_ratio_clip):
    """Boxes [N, 4] from rois and deltas (mmdetection's delta2bbox), clipped to max_shape
    (height, width) (mmdetection's legacy delta2bbox)."""
    r, d = rois.float(), deltas.float()
    means = d.new_tensor([means0, means1, means2, means3])
    stds = d.new_tensor([stds0, stds1, stds2, stds3])
    d = d * stds + means
    limit = abs(math.log(wh_ratio_clip))
    dw, dh = d[:, 2].clamp(-limit, limit), d[:, 3].clamp(-limit, limit)
    pw, ph = r[:, 2] - r[:, 0] + 1.0, r[:, 3] - r[:, 1] + 1.0
    px, py = (r[:, 0] + r[:, 2]) * 0.5, (r[:, 1] + r[:, 3]) * 0.5
    gw, gh = pw * dw.exp(), ph * dh.exp()
    gx, gy = px + pw * d[:, 0], py + ph * d[:, 1]
    x1, y1 = gx - gw * 0.5 + 0.5, gy - gh * 0.5 + 0.5
    x2, y2 = gx + gw * 0.5 - 0.5, gy + gh * 0.5 - 0.5
    if max_shape is not None and len(max_shape) >= 2:
        h, w = max_shape[0], max_shape[1]
        x1, x2 = x1.clamp(0, w - 1), x2.clamp(0, w - 1)
        y1, y2 = y1.clamp(0, h - 1), y2.clamp(0, h - 1)
    return torch.stack([x1, y1, x2, y2], -1).to(rois.dtype)


# ---- convolution ---------------------------------------------------------------------------

@_op("npu_convolution(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
     "int groups) -> Tensor")
def _npu_convolution(input, weight, bias, stride, padding, dilation, groups):
    return torch.convolution(input, weight, bias, stride, padding, dilation, False, [0] * len(padding), groups)


@_op("npu_conv2d(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
     "int groups) -> Tensor")
def _npu_conv2d(input, weight, bias, stride, padding, dilation, groups):
    _check(input.dim() == 4, f"npu_conv2d: input must be 4-D (N, C, H, W), got {input.dim()}-D")
    return _npu_convolution(input, weight, bias, stride, padding, dilation, groups)


@_op("npu_conv3d(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
     "int groups) -> Tensor")
def _npu_conv3d(input, weight, bias, stride, padding, dilation, groups):
    _check(input.dim() == 5, f"npu_conv3d: input must be 5-D (N, C, D, H, W), got {input.dim()}-D")
    return _npu_convolution(input, weight, bias, stride, padding, dilation, groups)


@_op("npu_convolution_transpose(Tensor input, Tensor weight, Tensor? bias, int[] padding, int[] output_padding, "
     "int[] stride, int[] dilation, int groups) -> Tensor")
def _npu_convolution_transpose(input, weight, bias, padding, output_padding, stride, dilation, groups):
    return torch.convolution(input, weight, bias, stride, padding, dilation, True, output_padding, groups)


@_op("npu_conv_transpose2d(Tensor input, Tensor weight, Tensor? bias, int[] padding, int[] output_padding, "
     "int[] stride, int[] dilation, int groups) -> Tensor")
def _npu_conv_transpose2d(input, weight, bias, padding, output_padding, stride, dilation, groups):
    _check(input.dim() == 4, f"npu_conv_transpose2d: input must be 4-D (N, C, H, W), got {input.dim()}-D")
    return _npu_convolution_transpose(input, weight, bias, padding, output_padding, stride, dilation, groups)


# ---- MoE routing ---------------------------------------------------------------------------

@_op("npu_moe_compute_expert_tokens(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor")
def _npu_moe_compute_expert_tokens(sorted_expert_for_source_row, num_expert):
    """For each expert e, the number of rows routed to experts 0..e (the end of e's rows in
    the expert-sorted order), in the input's dtype."""
    experts = torch.arange(num_expert, device=sorted_expert_for_source_row.device,
                           dtype=sorted_expert_for_source_row.dtype)
    return torch.searchsorted(sorted_expert_for_source_row, experts, right=True).to(
        sorted_expert_for_source_row.dtype)


@_op("npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, "
     "Tensor? scales, Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0, "
     "int? k=1) -> Tensor")
def _npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                              export_for_source_row, drop_pad_mode=0, k=1):
    """out[i] = skip1[i] + skip2[i] + sum_j scales[i, j] * (rows[dst[j * N + i]] + bias[expert[i, j]]),
    undoing npu_moe_init_routing's expansion (dst: expanded_src_to_dst_row, k-major)."""
    _check(drop_pad_mode in (0, None), f"npu_moe_finalize_routing: only drop_pad_mode=0 is simulated, got {drop_pad_mode}")
    if scales is not None:
        k = scales.size(1)
    n = expanded_src_to_dst_row.numel() // k
    rows = expanded_permuted_rows.float()[expanded_src_to_dst_row.long().view(k, n)]  # [k, N, H]
    if bias is not None:
        rows = rows + bias.float()[export_for_source_row.long().t()]
    weights = scales.float().t().unsqueeze(-1) if scales is not None else 1.0
    out = (rows * weights).sum(0)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.float()
    return out.to(expanded_permuted_rows.dtype)


# ---- sampling ------------------------------------------------------------------------------

@_op("npu_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor")
def _npu_top_k_top_p(logits, p=None, k=None):
    """Logits [B, V] with every token outside the top k (per row) and outside the nucleus of
    probability p (per row; the most probable token always stays) set to -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=False, stable=True)
    vocab = logits.size(-1)
    if k is not None:
        kth = (vocab - k.long()).clamp(0, vocab - 1).unsqueeze(-1)
        threshold = sorted_logits.gather(-1, kth)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < threshold, float("-inf"))
    if p is not None:
        cumulative = sorted_logits.float().softmax(-1).cumsum(-1)
        drop = cumulative <= (1 - p.float()).unsqueeze(-1)
        drop[..., -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return sorted_logits.scatter(-1, order, sorted_logits)
