"""op-plugin's utility operators that are compositions of ATen operators.

``torch_npu.npu_dtype_cast``, ``npu_transpose``, ``npu_one_hot``, ``npu_max``, ... are, in
Huawei's op-plugin, thin wrappers over one or a few CANN kernels with the semantics of ATen
operators. Here they are ``torch.ops.npu`` operators with op-plugin's schemas whose kernels
are registered as CompositeImplicitAutograd: they run the equivalent ATen operators on the
npu tensors (each one an npu kernel on the stream), so autograd, torch.compile tracing and
the meta device work without code of their own. The fused operators with kernels of their
own are C++ (custom_ops/).

Schemas are op-plugin's (op_plugin_functions.yaml); ``int dtype`` arguments receive
``torch.dtype`` values as their ScalarType codes, as in torch_npu.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from torch_npu import _custom_dtype as _cdt

_lib = torch.library.Library("npu", "FRAGMENT")

# c10::ScalarType codes (an `int dtype` argument given a torch.dtype receives its code).
_SCALAR_TYPES = _cdt.SCALAR_TYPES
_HIFLOAT8 = _cdt.HIFLOAT8


def _dtype(op: str, arg: str, code) -> torch.dtype:
    """The torch.dtype an `int dtype` argument names: a ScalarType code, or a torch_npu dtype number
    (torch_npu.float16, torch_npu.float8_e4m3fn, ...) of a dtype torch has. torch_npu.hifloat8 and
    the other formats torch lacks raise here: the operators that take them check for them first."""
    if isinstance(code, torch.dtype):
        return code
    if _cdt.is_custom(code):
        dtype = _cdt.torch_dtype(code)
        if dtype is None:
            raise NotImplementedError(f"{op}: {arg}={_cdt.to_string(code)} is not supported by this operator "
                                      f"in the NPU simulator")
        return dtype
    if not isinstance(code, int) or not 0 <= code < len(_SCALAR_TYPES):
        raise TypeError(f"{op}: {arg} must be a torch.dtype, got {code!r}")
    return _SCALAR_TYPES[code]


def _op(schema: str, lib: torch.library.Library = _lib, keys=("CompositeImplicitAutograd",)):
    """Defines torch.ops.npu.<name> (or the operator of `lib`'s namespace) with op-plugin's
    schema; the function is its kernel, for dispatch `keys`. The dispatcher hands a Python
    kernel whatever it was given for a `Tensor` argument (None included), so the kernel
    first checks that each required tensor is one."""
    name = schema.split("(", 1)[0]
    arguments = torch._C.parse_schema(f"{lib.ns}::{schema}").arguments
    tensors = [(i, a.name) for i, a in enumerate(arguments) if isinstance(a.type, torch.TensorType)]

    def register(fn):
        @functools.wraps(fn)
        def kernel(*args, **kwargs):
            for i, arg in tensors:
                value = kwargs[arg] if arg in kwargs else args[i] if i < len(args) else None
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"{name}: {arg} must be a Tensor, got {type(value).__name__}")
            return fn(*args, **kwargs)
        lib.define(schema)
        for key in keys:
            lib.impl(name, kernel, key)
        return fn
    return register


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


# ---- casts, layout and shape ------------------------------------------------------------

@_op("npu_dtype_cast(Tensor self, int dtype, int? input_dtype=None) -> Tensor")
def _npu_dtype_cast(self, dtype, input_dtype=None):
    """self (read as input_dtype when given: torch_npu.hifloat8 reads uint8 codes) converted to dtype
    (a torch.dtype or a torch_npu dtype: torch_npu.hifloat8 gives uint8 codes; torch_npu.int4 uint8
    bytes of two values' low 4 bits along the last dimension, the first in the low nibble)."""
    if input_dtype is None and not _cdt.is_custom(dtype):
        return self.to(_dtype("npu_dtype_cast", "dtype", dtype))
    if dtype == _cdt.DType.int4:
        _check(self.dim() >= 1 and self.size(-1) % 2 == 0,
               "The last dim input shape must be divisible by 2 if output dtype is torch_npu.float4_e2m1fn_x2, "
               "torch_npu.float4_e1m2fn_x2 or torch_npu.int4")
        nibbles = _cdt.values_of(self, input_dtype, "npu_dtype_cast", "input_dtype").to(torch.int64) & 0xF
        return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).to(torch.uint8)
    return _cdt.cast(self, dtype, input_dtype, op="npu_dtype_cast", arg="dtype")


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


@_op("npu_slice.out(Tensor self, int[] offsets, int[] size, *, Tensor(a!) out) -> Tensor(a!)")
def _npu_slice_out(self, offsets, size, *, out):
    """npu_slice into ``out`` (resized to the slice's shape; its dtype must be self's)."""
    result = _npu_slice(self, offsets, size)
    _check(out.dtype == self.dtype, f"npu_slice: out must have self's dtype {self.dtype}, got {out.dtype}")
    _check(out.device == self.device, f"npu_slice: out must be on self's device {self.device}, got {out.device}")
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


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


# ---- repeat_interleave's gradients ------------------------------------------------------
# As op-plugin's derivatives: aten.repeat_interleave.self_int on npu is differentiated by
# npu.repeat_interleave_backward_int (an operator DTensor can shard), not by torch's
# decomposition into index_select.

def _low_precision_accumulator(t):
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


@_op("repeat_interleave_backward_int(Tensor grad, Tensor self, SymInt repeats, int? dim=None) -> Tensor",
     keys=("CompositeExplicitAutograd",))
def _repeat_interleave_backward_int(grad, self, repeats, dim=None):
    """The gradient of repeat_interleave(self, repeats, dim): the `repeats` copies of each element
    in grad summed (in float32 for float16/bfloat16, rounded once)."""
    if dim is None:
        shape, axis = (self.numel(), repeats), 1
    else:
        d = dim % max(self.dim(), 1)
        shape, axis = tuple(self.shape[:d]) + (self.size(d), repeats) + tuple(self.shape[d + 1:]), d + 1
    _check(grad.numel() == math.prod(shape),
           f"repeat_interleave_backward_int: grad has {grad.numel()} elements, expected {math.prod(shape)} "
           f"(self {list(self.shape)} repeated {repeats} times along dim {dim})")
    summed = grad.reshape(shape).sum(axis, dtype=_low_precision_accumulator(grad))
    return summed.to(grad.dtype).reshape(self.shape)


@_op("repeat_interleave_backward_tensor(Tensor grad, Tensor self, Tensor repeats, int? dim=None) -> Tensor",
     keys=("CompositeExplicitAutograd",))
def _repeat_interleave_backward_tensor(grad, self, repeats, dim=None):
    """The gradient of repeat_interleave(self, repeats, dim) for per-element repeats: grad's
    copies of each element summed (in float32 for float16/bfloat16, rounded once)."""
    source = self.reshape(-1) if dim is None else self
    d = 0 if dim is None else dim % max(self.dim(), 1)
    rows = torch.repeat_interleave(torch.arange(source.size(d), device=grad.device), repeats.to(grad.device))
    _check(grad.dim() == source.dim() and grad.size(d) == rows.numel(),
           f"repeat_interleave_backward_tensor: grad {list(grad.shape)} does not match self {list(self.shape)} "
           f"repeated {rows.numel()} times in all along dim {dim}")
    acc = _low_precision_accumulator(grad)
    summed = torch.zeros(source.shape, dtype=acc, device=grad.device).index_add_(d, rows, grad.to(acc))
    return summed.to(grad.dtype).reshape(self.shape)


_lib.impl("repeat_interleave_backward_tensor", lambda grad, self, *args: grad.new_empty(self.shape), "Meta")


def _repeat_interleave_backward_setup(ctx, inputs, output):
    grad, _, ctx.repeats, ctx.dim = inputs
    ctx.grad_shape = grad.shape


def _repeat_interleave_backward_formula(ctx, gradgrad):  # the adjoint of summing the copies: repeating
    again = torch.repeat_interleave(gradgrad, ctx.repeats, ctx.dim)
    return again.reshape(ctx.grad_shape), None, None, None


for _name in ("repeat_interleave_backward_int", "repeat_interleave_backward_tensor"):
    torch.library.register_autograd(f"npu::{_name}", _repeat_interleave_backward_formula,
                                    setup_context=_repeat_interleave_backward_setup, lib=_lib)


class _RepeatInterleaveInt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, self, repeats, dim, output_size):
        ctx.save_for_backward(self)
        ctx.repeats, ctx.dim = repeats, dim
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.repeat_interleave.self_int(self, repeats, dim, output_size=output_size)

    @staticmethod
    def backward(ctx, grad):
        self, = ctx.saved_tensors
        return torch.ops.npu.repeat_interleave_backward_int(grad, self, ctx.repeats, ctx.dim), None, None, None


_aten_lib = torch.library.Library("aten", "IMPL")
_aten_lib.impl("repeat_interleave.self_int",
               lambda self, repeats, dim=None, *, output_size=None:
               _RepeatInterleaveInt.apply(self, repeats, dim, output_size), "AutogradPrivateUse1")


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

# An npu operator, as torch_npu's (a cpu tensor: "Could not run 'npu::fast_gelu' with arguments
# from the 'CPU' backend"); its gradient is npu_fast_gelu's.
@_op("fast_gelu(Tensor self) -> Tensor", keys=("AutogradPrivateUse1", "PrivateUse1", "Meta"))
def _fast_gelu(self):
    return torch.ops.npu.npu_fast_gelu(self)


@_op("npu_gelu(Tensor self, *, str approximate='none') -> Tensor")
def _npu_gelu(self, approximate="none"):
    _check(approximate in ("none", "tanh"), f"npu_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return F.gelu(self, approximate=approximate)


@_op("npu_gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor")
def _npu_gelu_backward(grad_output, self, approximate="none"):
    _check(approximate in ("none", "tanh"),
           f"npu_gelu_backward: approximate must be 'none' or 'tanh', got {approximate!r}")
    return torch.ops.aten.gelu_backward(grad_output, self, approximate=approximate)


@_op("npu_gelu_mul(Tensor input, *, str approximate='none') -> Tensor")
def _npu_gelu_mul(input, approximate="none"):
    """gelu(a) * b of input's last dimension halves a, b (GeGLU's gating)."""
    _check(approximate in ("none", "tanh"), f"npu_gelu_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    _check(input.dim() >= 1 and input.shape[-1] % 2 == 0,
           f"npu_gelu_mul: the last dimension of input must be even, got shape {list(input.shape)}")
    a, b = input.chunk(2, -1)
    return F.gelu(a, approximate=approximate) * b


@_op("npu_gather_sparse_index(Tensor input, Tensor index) -> Tensor")
def _npu_gather_sparse_index(input, index):
    """Rows of input (an embedding table [N, *]) selected by index: [*index.shape, *input.shape[1:]]."""
    _check(input.dim() >= 1, "npu_gather_sparse_index: input must have at least one dimension")
    _check(not index.is_floating_point() and not index.is_complex(),
           f"npu_gather_sparse_index: index must be an integer tensor, got {index.dtype}")
    return input.index_select(0, index.reshape(-1).long()).reshape(*index.shape, *input.shape[1:])


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


@_op("batch_norm_reduce(Tensor input, float eps) -> (Tensor, Tensor)")
def _batch_norm_reduce(input, eps):
    """Per-channel (dimension 1) sum and sum of squares of input [N, C, ...], both float32 [C];
    eps is not used (it is part of the schema)."""
    _check(input.dim() >= 2, f"batch_norm_reduce: input must have more than 1 dimension (N, C, ...), "
                             f"got a {input.dim()}-dim input tensor")
    x = input.float()
    dims = [0] + list(range(2, x.dim()))
    return x.sum(dims), x.pow(2).sum(dims)


@_op("batch_norm_gather_stats_update(Tensor input, Tensor mean, Tensor invstd, Tensor? running_mean, "
     "Tensor? running_var, float momentum, float eps, Tensor counts) -> (Tensor, Tensor)")
def _batch_norm_gather_stats_update(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """SyncBatchNorm's gather step from per-device sums: mean holds each device's per-channel sums
    [D, C], invstd their sums of squares [D, C] (batch_norm_reduce's results), counts the element
    count of each device [D]. Returns the global mean and 1 / sqrt(var + eps) (the biased
    variance) in mean's dtype, computed in float32, and moves running_mean / running_var (when
    given) toward them by momentum, in place."""
    _check(input.dim() > 1, "batch_norm_gather_stats_update: the dim of input tensor [input] must be more than 1, "
                            f"got {input.dim()}")
    _check(mean.shape == invstd.shape and mean.dim() == 2 and mean.size(0) == counts.numel(),
           f"batch_norm_gather_stats_update: expected mean and invstd of shape [devices, channels] and counts of "
           f"[devices], got {list(mean.shape)}, {list(invstd.shape)} and {list(counts.shape)}")
    total = counts.float().sum()
    mean_all = mean.float().sum(0) / total
    var = invstd.float().sum(0) / total - mean_all * mean_all
    invstd_all = torch.rsqrt(var + eps)
    for running, value in ((running_mean, mean_all), (running_var, var)):
        if running is not None:
            running.copy_(momentum * value + (1 - momentum) * running.float())
    return mean_all.to(mean.dtype), invstd_all.to(mean.dtype)


@_op("npu_ifmr(Tensor data, Tensor data_min, Tensor data_max, Tensor cumsum, float min_percentile, "
     "float max_percentile, float search_start, float search_end, float search_step, bool with_offset) "
     "-> (Tensor, Tensor)")
def _npu_ifmr(data, data_min, data_max, cumsum, min_percentile, max_percentile, search_start, search_end,
              search_step, with_offset):
    """IFMR (input feature map reconstruction) int8 calibration: from data's histogram (cumsum:
    the cumulative counts of its bins between data_min and data_max) the clipping range at the
    percentiles, then, for each factor of arange(search_start, search_end, search_step) applied to
    it, the int8 quantization's squared reconstruction error of data; returns the scale and offset
    of the best factor, shaped and typed like data_min (offset 0 without with_offset)."""
    _check(cumsum.dim() == 1 and cumsum.numel() > 0, "npu_ifmr: cumsum must be a non-empty 1-D tensor of the "
                                                      f"histogram's cumulative counts, got shape {list(cumsum.shape)}")
    _check(search_step > 0 and search_end > search_start,
           f"npu_ifmr: expected search_start < search_end and search_step > 0, got {search_start}, {search_end}, "
           f"{search_step}")
    x = data.float().reshape(-1)
    lo, hi = data_min.float().reshape(-1)[0], data_max.float().reshape(-1)[0]
    bins = cumsum.numel()
    cdf = cumsum.float() / x.numel()
    max_init = (cdf < max_percentile).sum().float() / bins * (hi - lo) + lo
    min_init = (cdf < 1 - min_percentile).sum().float() / bins * (hi - lo) + lo
    steps = torch.arange(search_start, search_end, search_step, dtype=torch.float32, device=x.device)
    if with_offset:
        max_list = max_init.clamp(min=0) * steps
        min_list = min_init.clamp(max=0).expand_as(steps)
        scale = (max_list - min_list) / 255
        scale = torch.where(scale < 1.192092896e-07, torch.ones_like(scale), scale)
        offset = -(torch.round(min_list / scale) + 128)
    else:
        scale = torch.maximum(max_init.abs(), min_init.abs()) * steps / 127
        offset = torch.zeros_like(scale)
    loss = torch.stack([((torch.round(x / s) + o).clamp(-128, 127) - o).mul(s).sub(x).square().sum()
                        for s, o in zip(scale, offset)])
    best = torch.argmin(loss)
    return (scale[best].reshape(data_min.shape).to(data_min.dtype),
            offset[best].reshape(data_min.shape).to(data_min.dtype))


@_op("npu_renorm_backward(Tensor grad, Tensor self, Scalar p, int dim, Scalar maxnorm) -> Tensor")
def _npu_renorm_backward(grad, self, p, dim, maxnorm):
    """The gradient of torch.renorm(self, p, dim, maxnorm) with respect to self for the output
    gradient grad (PyTorch's renorm derivative, taken on a detached copy of self)."""
    _check(grad.shape == self.shape, f"npu_renorm_backward: grad of shape {list(grad.shape)} does not match self "
                                     f"of shape {list(self.shape)}")
    with torch.enable_grad():
        x = self.detach().requires_grad_()
        return torch.autograd.grad(torch.renorm(x, p, dim, maxnorm), x, grad)[0]


@_op("copy_memory_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)")
def _copy_memory_(self, src, non_blocking=False):
    """torch_npu's raw device-to-device copy (the DDP reducer's bucket gather): the first
    min(self.numel(), storage room) elements of memory from src's start are written from self's
    start, whatever the two tensors' shapes and strides; then, unless non_blocking, the stream is
    synchronized. Tensors in a private storage format are copied by value of their base arrays."""
    _check(src.device.type == "npu" and self.device.type == "npu", "copy_memory_ only support npu tensor")
    _check(src.dtype == self.dtype, "input tensors of copy_memory_ should have same dtype")
    _check(src.device.index == self.device.index, "input tensors of copy_memory_ should have same device index")
    room = lambda t: t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()  # noqa: E731
    n = min(self.numel(), room(self))
    _check(n <= min(src.numel(), room(src)), f"copy_memory_: src holds fewer than the {n} elements to copy")
    dst_flat = self.as_strided((n,), (1,), self.storage_offset())
    dst_flat.copy_(src.as_strided((n,), (1,), src.storage_offset()), non_blocking=non_blocking)
    if not non_blocking:
        torch.npu.current_stream(self.device).synchronize()
    return self


@_op("npu_add_layer_norm(Tensor x1, Tensor x2, Tensor gamma, Tensor beta, float epsilon=1e-05, "
     "bool additional_output=False) -> (Tensor, Tensor, Tensor, Tensor)")
def _npu_add_layer_norm(x1, x2, gamma, beta, epsilon=1e-5, additional_output=False):
    """y = LayerNorm(x1 + x2) over gamma's dimensions; also mean and rstd (float, reduced
    dimensions kept as 1) and the sum x. y and x have the sum's dtype (float32 when x1 and x2
    are float16 and float32, either way round)."""
    x = x1 + x2
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    rstd = torch.rsqrt(xf.var(dims, unbiased=False, keepdim=True) + epsilon)
    y = ((xf - mean) * rstd * gamma.float() + beta.float()).to(x.dtype)
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


@_op("npu_random_choice_with_mask(Tensor x, int count=256, int seed=0, int seed2=0) -> (Tensor, Tensor)")
def _npu_random_choice_with_mask(x, count=256, seed=0, seed2=0):
    """The indices of x's true elements, shuffled: int32 [count, x.dim()] (count 0: all of them),
    rows past the true elements 0, and mask [count] saying which rows are indices. The shuffle
    draws from a generator seeded with (seed, seed2) when either is set, else from the npu
    generator (torch_npu's shuffle is its kernel's own)."""
    name = "npu_random_choice_with_mask"
    _check(x.dtype == torch.bool, f"{name}: x must be bool, got {x.dtype}")
    _check(count >= 0, f"{name}: count must be >= 0, got {count}")
    indices = torch.nonzero(x).to(torch.int32)
    generator = None
    if seed or seed2:
        generator = torch.Generator(device=x.device)
        generator.manual_seed(((seed2 & 0xFFFFFFFF) << 32) | (seed & 0xFFFFFFFF))
    order = torch.randperm(indices.size(0), generator=generator, device=x.device)
    rows = indices.size(0) if count == 0 else count
    taken = min(rows, indices.size(0))
    chosen = indices.new_zeros(rows, indices.size(1))
    chosen[:taken] = indices[order[:taken]]
    mask = torch.zeros(rows, dtype=torch.bool, device=x.device)
    mask[:taken] = True
    return chosen, mask


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


def _check_dropout_p(name, p):
    _check(0.0 <= p <= 1.0, f"{name}: dropout probability p has to be between 0 and 1, but got {p}")


@_op("_dropout_with_byte_mask(Tensor self, float p) -> (Tensor, Tensor)")
def _dropout_with_byte_mask_op(self, p):
    """Dropout with a byte mask: mask (uint8, self's shape) is 1 where an element is kept
    (probability 1 - p); returns (self * mask / (1 - p), mask)."""
    _check_dropout_p("_dropout_with_byte_mask", p)
    _check(self.is_floating_point(), f"_dropout_with_byte_mask: self must be floating point, got {self.dtype}")
    mask = (torch.rand(self.shape, device=self.device) >= p).to(torch.uint8)
    return _dropout_with_byte_mask_backward(self, mask, p), mask


@_op("_dropout_with_byte_mask_backward(Tensor grad_output, Tensor mask, float p) -> Tensor")
def _dropout_with_byte_mask_backward(grad_output, mask, p):
    """grad_output * mask / (1 - p) (0 where p is 1): the same masking as the forward pass."""
    _check(mask.dtype == torch.uint8, f"_dropout_with_byte_mask_backward: mask must be torch.uint8, got {mask.dtype}")
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return grad_output * mask.to(grad_output.dtype) * scale


@_op("dropout_with_byte_mask(Tensor self, float p, bool train) -> Tensor")
def _dropout_with_byte_mask(self, p, train):
    """self itself when not training, p is 0 or self is empty; zeros when p is 1."""
    _check_dropout_p("dropout_with_byte_mask", p)
    _check(self.device.type == "npu", f"dropout_with_byte_mask: self must be an npu tensor, got {self.device}")
    if p == 0 or not train or self.numel() == 0:
        return self
    if p == 1:
        return self * 0
    return _dropout_with_byte_mask_op(self, p)[0]


# ---- multi-head attention --------------------------------------------------------------------

@_op("npu_multi_head_attention(Tensor query, Tensor key, Tensor value, Tensor query_weight, Tensor key_weight, "
     "Tensor value_weight, Tensor attn_mask, Tensor out_proj_weight, Tensor? query_bias, Tensor? key_bias, "
     "Tensor? value_bias, Tensor? out_proj_bias, Tensor? dropout_mask, int attn_head_num, int attn_dim_per_head, "
     "int src_len, int tgt_len, float dropout_prob, bool softmax_use_float) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_multi_head_attention(query, key, value, query_weight, key_weight, value_weight, attn_mask, out_proj_weight,
                              query_bias, key_bias, value_bias, out_proj_bias, dropout_mask, attn_head_num,
                              attn_dim_per_head, src_len, tgt_len, dropout_prob, softmax_use_float):
    """fairseq's multi-head attention in one operator (CANN's MultiHeadAttention). query [B * tgt_len, E],
    key and value [B * src_len, E] (rows batch-major), E = attn_head_num * attn_dim_per_head; the weights
    [E, E] (nn.Linear's layout, any float dtype: the projections accumulate in float32); attn_mask is
    added to the scores and broadcasts to [B, heads, tgt_len, src_len]. dropout_mask: a keep mask of one
    bit per score (npu_dropout_gen_mask's); without it one is drawn when dropout_prob > 0. Returns, in
    query's dtype: y [B * tgt_len, E] (the output projection), the dropout mask (uint8
    [B * heads * tgt_len * src_len / 8]), query_res (the projected queries times attn_dim_per_head ** -0.5),
    key_res, value_res [B, heads, len, attn_dim_per_head], attn_scores (the softmax, float32 with
    softmax_use_float), attn_res (after dropout) [B, heads, tgt_len, src_len] and context [B * tgt_len, E].
    Only y is meant to be differentiated (autograd runs through the composition)."""
    name = "npu_multi_head_attention"
    _check(tgt_len > 0 and src_len > 0 and attn_head_num > 0 and attn_dim_per_head > 0,
           f"{name}: tgt_len, src_len, attn_head_num, attn_dim_per_head should not equal zero.")
    _check(tgt_len % 16 == 0 and src_len % 16 == 0 and attn_head_num % 16 == 0 and attn_dim_per_head % 16 == 0,
           f"{name}: tgt_len, src_len, attn_head_num, attn_dim_per_head should align to 16.")
    _check(query.dim() >= 1 and key.dim() >= 1 and value.dim() >= 1,
           f"{name}: query, key, value should be at least 1d.")
    _check(0.0 <= dropout_prob <= 1.0, f"{name}: dropout_prob must be in [0, 1], got {dropout_prob}")
    heads, dim, embed = attn_head_num, attn_dim_per_head, attn_head_num * attn_dim_per_head
    _check(query.dim() == 2 and query.size(0) % tgt_len == 0 and query.size(1) == embed,
           f"{name}: query must be [batch * tgt_len, attn_head_num * attn_dim_per_head] = [B * {tgt_len}, {embed}], "
           f"got {list(query.shape)}")
    batch = query.size(0) // tgt_len
    for arg, t in (("key", key), ("value", value)):
        _check(t.dim() == 2 and t.size(0) == batch * src_len,
               f"{name}: {arg} must be [batch * src_len, features] = [{batch * src_len}, *], got {list(t.shape)}")
    dtype = query.dtype

    def project(x, weight, bias):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float())

    def heads_of(x, length):
        return x.view(batch, length, heads, dim).transpose(1, 2)

    q = heads_of(project(query, query_weight, query_bias) * dim ** -0.5, tgt_len)
    k = heads_of(project(key, key_weight, key_bias), src_len)
    v = heads_of(project(value, value_weight, value_bias), src_len)
    scores = torch.matmul(q, k.transpose(-2, -1)) + attn_mask.float()
    probs = torch.softmax(scores, -1)
    count = batch * heads * tgt_len * src_len
    if dropout_mask is None:
        if dropout_prob > 0:
            dropout_mask = _npu_dropout_gen_mask([count], dropout_prob, device=query.device)[:count // 8]
        else:
            dropout_mask = torch.full((count // 8,), 255, dtype=torch.uint8, device=query.device)
    _check(dropout_mask.dtype == torch.uint8 and dropout_mask.numel() * 8 >= count,
           f"{name}: dropout_mask must be uint8 with a bit per attention score ({count}), "
           f"got {dropout_mask.dtype} with {dropout_mask.numel() * 8} bits")
    attn = probs
    if dropout_prob > 0:
        keep = dropout_mask.reshape(-1)[:count // 8, None].bitwise_and(_bits(query.device)).ne(0)
        scale = 0.0 if dropout_prob >= 1.0 else 1.0 / (1.0 - dropout_prob)
        attn = probs * keep.view(probs.shape).to(probs.dtype) * scale
    context = torch.matmul(attn, v).transpose(1, 2).reshape(batch * tgt_len, embed)
    y = project(context, out_proj_weight, out_proj_bias)
    return (y.to(dtype), dropout_mask, q.to(dtype), k.to(dtype), v.to(dtype),
            probs if softmax_use_float else probs.to(dtype), attn.to(dtype), context.to(dtype))


@_op("npu_attn_softmax_(Tensor(a!) self) -> Tensor(a!)")
def _npu_attn_softmax_(self):
    """softmax over the last dimension, in place (computed in float)."""
    return self.copy_(torch.softmax(self.float(), -1))


@_op("npu_attn_softmax_backward_(Tensor(a!) self, Tensor grad_output, Tensor values) -> Tensor(a!)")
def _npu_attn_softmax_backward_(self, grad_output, values):
    """self (a softmax output p of attention scores) becomes the scores' gradient, given the
    gradient grad_output of p @ values: p * (g - sum(g * p)) with g = grad_output @ values^T."""
    _check(grad_output.dim() == values.dim() == self.dim() and grad_output.shape[-1] == values.shape[-1]
           and values.shape[-2] == self.shape[-1] and grad_output.shape[-2] == self.shape[-2],
           f"npu_attn_softmax_backward_: expected self [.., S1, S2], grad_output [.., S1, H] and values "
           f"[.., S2, H], got {list(self.shape)}, {list(grad_output.shape)} and {list(values.shape)}")
    p = self.float()
    g = grad_output.float() @ values.float().transpose(-1, -2)
    return self.copy_(p * (g - (g * p).sum(-1, keepdim=True)))


# ---- fused attention, later interfaces ------------------------------------------------------
# npu_fusion_attention_v2 / _v3 and their grads are npu_fusion_attention(_grad) (custom_ops/src/
# attention.cpp) with other argument forms: v2 adds query_rope/key_rope (a second part of each
# head whose scores add to the first's) and pse_type; v3 takes the sequence lengths and returns
# the dropout seed and offset as tensors (int64 [1] on the host, as torch_npu outside graph
# capture).

_PSE_INSIDE_SCALE, _PSE_OUTSIDE_SCALE = 0, 1


def _cat_heads(x, extra, head_num, layout):
    """x's heads followed by extra's along the head dimension (BSH/SBH: per head)."""
    if extra is None:
        return x
    if layout in ("BSH", "SBH"):
        a, b = x.shape[:2]
        return torch.cat([x.reshape(a, b, head_num, -1), extra.reshape(a, b, head_num, -1)], -1).reshape(a, b, -1)
    return torch.cat([x, extra], -1)


def _split_heads(dx, extra, head_num, layout):
    """Inverse of _cat_heads(x, extra, ...): (the first part of each head, extra's part)."""
    if layout in ("BSH", "SBH"):
        a, b = dx.shape[:2]
        width = extra.shape[-1] // head_num
        per_head = dx.reshape(a, b, head_num, -1)
        return (per_head[..., :-width].reshape(a, b, -1), per_head[..., -width:].reshape(a, b, -1))
    width = extra.shape[-1]
    return dx[..., :-width], dx[..., -width:]


def _rope_inputs(name, query, key, query_rope, key_rope, head_num, layout):
    _check((query_rope is None) == (key_rope is None),
           f"{name}: query_rope and key_rope must be given together, got query_rope "
           f"{'None' if query_rope is None else 'a tensor'} and key_rope {'None' if key_rope is None else 'a tensor'}")
    key_heads = head_num
    if layout in ("BSH", "SBH") and query_rope is not None:
        d = query.shape[2] // head_num
        key_heads = key.shape[2] // d
    return (_cat_heads(query, query_rope, head_num, layout), _cat_heads(key, key_rope, key_heads, layout),
            key_heads)


def _v2_pse(name, pse, pse_type, scale, q_start_idx, kv_start_idx):
    """pse in npu_fusion_attention's form (added inside the scale)."""
    _check(pse_type in (_PSE_INSIDE_SCALE, _PSE_OUTSIDE_SCALE) or pse is None,
           f"{name}: pse_type {pse_type} (ALiBi generated from slopes in pse) is not simulated; "
           f"use pse_type 0 (pse inside the scale) or 1 (pse added to the scaled scores)")
    _check(q_start_idx is None and kv_start_idx is None or pse_type in (2, 3),
           f"{name}: q_start_idx and kv_start_idx apply to pse_type 2 and 3 only")
    if pse is None or pse_type == _PSE_INSIDE_SCALE:
        return pse
    return pse / scale


@_op("npu_fusion_attention_v2(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, *, "
     "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? query_rope=None, "
     "Tensor? key_rope=None, float scale=1., float keep_prob=1., int pre_tokens=2147483647, "
     "int next_tokens=2147483647, int inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None, "
     "int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, "
     "int pse_type=1, int[]? q_start_idx=None, int[]? kv_start_idx=None, str softmax_layout=\"\", "
     "Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, int offset=0) "
     "-> (Tensor, Tensor, Tensor, Tensor, int, int, int)")
def _npu_fusion_attention_v2(query, key, value, head_num, input_layout, *, pse=None, padding_mask=None,
                             atten_mask=None, query_rope=None, key_rope=None, scale=1.0, keep_prob=1.0,
                             pre_tokens=2147483647, next_tokens=2147483647, inner_precise=0, prefix=None,
                             actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                             sync=False, pse_type=1, q_start_idx=None, kv_start_idx=None, softmax_layout="",
                             sink=None, dropout_mask=None, seed=0, offset=0):
    """npu_fusion_attention with query_rope / key_rope (scores scale * (Q K^T + Q_rope K_rope^T))
    and pse_type (1, the default: pse added to the scaled scores; 0: inside the scale, as v1)."""
    name = "npu_fusion_attention_v2"
    layout = input_layout.upper()
    q, k, _ = _rope_inputs(name, query, key, query_rope, key_rope, head_num, layout)
    return torch.ops.npu.npu_fusion_attention(
        q, k, value, head_num, input_layout, _v2_pse(name, pse, pse_type, scale, q_start_idx, kv_start_idx),
        padding_mask, atten_mask, scale, keep_prob, pre_tokens, next_tokens, inner_precise, prefix,
        actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync, softmax_layout, sink,
        dropout_mask, seed, offset)


@_op("npu_fusion_attention_grad_v2(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
     "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
     "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, "
     "Tensor? query_rope=None, Tensor? key_rope=None, float scale_value=1., float keep_prob=1., "
     "int pre_tokens=2147483647, int next_tokens=2147483647, int inner_precise=0, int seed=0, int offset=0, "
     "int numels=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, "
     "int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, int pse_type=1, int[]? q_start_idx=None, "
     "int[]? kv_start_idx=None, str softmax_layout=\"\", Tensor? sink=None) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_fusion_attention_grad_v2(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                                  atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                                  attention_in=None, query_rope=None, key_rope=None, scale_value=1.0,
                                  keep_prob=1.0, pre_tokens=2147483647, next_tokens=2147483647, inner_precise=0,
                                  seed=0, offset=0, numels=0, prefix=None, actual_seq_qlen=None,
                                  actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                                  pse_type=1, q_start_idx=None, kv_start_idx=None, softmax_layout="", sink=None):
    """The backward of npu_fusion_attention_v2: (dq, dk, dv, dpse, dq_rope, dk_rope, dsink)."""
    name = "npu_fusion_attention_grad_v2"
    layout = input_layout.upper()
    q, k, key_heads = _rope_inputs(name, query, key, query_rope, key_rope, head_num, layout)
    dq, dk, dv, dpse, dsink = torch.ops.npu.npu_fusion_attention_grad(
        q, k, value, dy, head_num, input_layout,
        pse=_v2_pse(name, pse, pse_type, scale_value, q_start_idx, kv_start_idx), padding_mask=padding_mask,
        atten_mask=atten_mask, softmax_max=softmax_max, softmax_sum=softmax_sum, softmax_in=softmax_in,
        attention_in=attention_in, scale_value=scale_value, keep_prob=keep_prob, pre_tockens=pre_tokens,
        next_tockens=next_tokens, inner_precise=inner_precise, seed=seed, offset=offset, numels=numels,
        prefix=prefix, actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode,
        gen_mask_parallel=gen_mask_parallel, sync=sync, softmax_layout=softmax_layout, sink=sink)
    dq_rope = dk_rope = query.new_empty([0])
    if query_rope is not None:
        dq, dq_rope = _split_heads(dq, query_rope, head_num, layout)
        dk, dk_rope = _split_heads(dk, key_rope, key_heads, layout)
    if pse is not None and pse_type == _PSE_OUTSIDE_SCALE:
        dpse = dpse / scale_value
    return dq, dk, dv, dpse, dq_rope, dk_rope, dsink


def _lengths(x):
    return None if x is None else [int(v) for v in x.tolist()]


def _host_long(value):
    return torch.tensor([value], dtype=torch.int64)


@_op("npu_fusion_attention_v3(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
     "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
     "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, SymInt[]? prefix=None, "
     "Tensor? actual_seq_qlen=None, Tensor? actual_seq_kvlen=None, int sparse_mode=0, "
     "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_fusion_attention_v3(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                             atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                             next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                             actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                             softmax_layout="", sink=None):
    """npu_fusion_attention with the sequence lengths as tensors; returns (attention_score,
    softmax_max, softmax_sum, softmax_out, seed, offset), seed and offset int64 [1] tensors."""
    out, smax, ssum, softmax_out, seed, offset, _ = torch.ops.npu.npu_fusion_attention(
        query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale, keep_prob, pre_tockens,
        next_tockens, inner_precise, prefix, _lengths(actual_seq_qlen), _lengths(actual_seq_kvlen), sparse_mode,
        gen_mask_parallel, sync, softmax_layout, sink)
    return out, smax, ssum, softmax_out, _host_long(seed), _host_long(offset)


@_op("npu_fusion_attention_grad_v3(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
     "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
     "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, "
     "float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, "
     "int inner_precise=0, Tensor? seed=None, Tensor? offset=None, SymInt[]? prefix=None, "
     "Tensor? actual_seq_qlen=None, Tensor? actual_seq_kvlen=None, int sparse_mode=0, "
     "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_fusion_attention_grad_v3(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                                  atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                                  attention_in=None, scale_value=1.0, keep_prob=1.0, pre_tockens=2147483647,
                                  next_tockens=2147483647, inner_precise=0, seed=None, offset=None, prefix=None,
                                  actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                                  gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """The backward of npu_fusion_attention_v3 (seed and offset as its forward returned them)."""
    _check(keep_prob >= 1.0 or (seed is not None and offset is not None),
           "npu_fusion_attention_grad_v3: with keep_prob < 1, seed and offset (npu_fusion_attention_v3's "
           "outputs 4 and 5) are required")
    return torch.ops.npu.npu_fusion_attention_grad(
        query, key, value, dy, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
        softmax_max=softmax_max, softmax_sum=softmax_sum, softmax_in=softmax_in, attention_in=attention_in,
        scale_value=scale_value, keep_prob=keep_prob, pre_tockens=pre_tockens, next_tockens=next_tockens,
        inner_precise=inner_precise, seed=0 if seed is None else int(seed.reshape(-1)[0]),
        offset=0 if offset is None else int(offset.reshape(-1)[0]), prefix=prefix,
        actual_seq_qlen=_lengths(actual_seq_qlen), actual_seq_kvlen=_lengths(actual_seq_kvlen),
        sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync, softmax_layout=softmax_layout,
        sink=sink)


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


def _lstm_mask(name, seq_mask, steps, batch, hidden):
    """npu_lstm's seq_mask (with flag_seq) as a float32 [T, B, H] mask: an int32 [B] holds each
    sequence's length, a float16 / float32 [T, B, H] the mask itself."""
    if seq_mask.dim() == 1 and not seq_mask.is_floating_point():
        _check(seq_mask.numel() == batch, f"{name}: seq_mask of sequence lengths must have {batch} entries "
                                          f"(one per batch row), got {list(seq_mask.shape)}")
        steps_ = torch.arange(steps, device=seq_mask.device)
        valid = steps_[:, None] < seq_mask.to(torch.int64)[None, :]
        return valid.to(torch.float32)[..., None].expand(steps, batch, hidden)
    _check(seq_mask.is_floating_point() and list(seq_mask.shape) == [steps, batch, hidden],
           f"{name}: seq_mask must be the int32 sequence lengths [{batch}] or a float mask "
           f"[{steps}, {batch}, {hidden}], got {seq_mask.dtype} {list(seq_mask.shape)}")
    return seq_mask.float()


def _lstm_check(name, input, weight, bias, h, c):
    """(T, B, input size I, hidden size H) of npu_lstm's arguments, checked."""
    _check(input.dim() == 3, f"{name}: input must be [T, B, I] (time major), got {list(input.shape)}")
    steps, batch, features = input.shape
    _check(bias.dim() == 1 and bias.numel() % 4 == 0 and bias.numel() > 0,
           f"{name}: bias must be 1-D [4 * hidden_size], got {list(bias.shape)}")
    hidden = bias.numel() // 4
    _check(list(weight.shape) == [features + hidden, 4 * hidden],
           f"{name}: weight must be [input_size + hidden_size, 4 * hidden_size] = "
           f"[{features + hidden}, {4 * hidden}] (w_ih and w_hh transposed and stacked), got {list(weight.shape)}")
    for arg, t in (("h", h), ("c", c)):
        _check(t.numel() == batch * hidden and t.size(-1) == hidden,
               f"{name}: {arg} must be the initial state [1, {batch}, {hidden}], got {list(t.shape)}")
    return steps, batch, features, hidden


def _lstm_run(input, weight, bias, mask, h, c, reverse):
    """npu_lstm's recurrence in float32 (DynamicRNN, gate order i, f, j, o): per step t (T - 1
    down to 0 when reverse) gates = x_t W_x + h W_h + b; c_t = f c + i j; h_t = o tanh(c_t).
    With a mask m_t: c_t = c + m (c_t - c), y_t = m o tanh(c_t), h_t = h + m (y_t - h).
    Returns the float32 [T, B, H] sequences (y, h, c, i, j, f, o, tanh(c))."""
    steps, batch, features = input.shape
    hidden = bias.numel() // 4
    w = weight.float()
    w_x, w_h = w[:features], w[features:]
    projected = (input.float().reshape(steps * batch, features) @ w_x + bias.float()).reshape(steps, batch, -1)
    h_prev, c_prev = h.float().reshape(batch, hidden), c.float().reshape(batch, hidden)
    outs = [[None] * steps for _ in range(8)]
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        i, f, j, o = (projected[t] + h_prev @ w_h).chunk(4, -1)
        i, f, j, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(j), torch.sigmoid(o)
        c_t = f * c_prev + i * j
        if mask is not None:
            c_t = c_prev + mask[t] * (c_t - c_prev)
        tanh_c = torch.tanh(c_t)
        y_t = o * tanh_c
        h_t = y_t
        if mask is not None:
            y_t = y_t * mask[t]
            h_t = h_prev + mask[t] * (y_t - h_prev)
        for seq, value in zip(outs, (y_t, h_t, c_t, i, j, f, o, tanh_c)):
            seq[t] = value
        h_prev, c_prev = h_t, c_t
    return tuple(torch.stack(seq) for seq in outs)


def _lstm_grad(grad_y, grad_h, grad_c, input, weight, mask, h0, c0, h_out, c_out, i, j, f, o, tanh_c, reverse):
    """Backpropagation through npu_lstm's recurrence from its saved sequences: gradients of the
    outputs y, h, c ([T, B, H] each, or None) -> (input, weight, bias, h0, c0) gradients, float32."""
    steps, batch, features = input.shape
    hidden = h_out.size(-1)
    w = weight.float()
    w_x, w_h = w[:features], w[features:]
    h0, c0 = h0.float().reshape(batch, hidden), c0.float().reshape(batch, hidden)
    h_out, c_out, i, j, f, o, tanh_c = (t.float() for t in (h_out, c_out, i, j, f, o, tanh_c))
    d_gates = [None] * steps
    dh, dc = h0.new_zeros(batch, hidden), c0.new_zeros(batch, hidden)
    for t in (range(steps) if reverse else range(steps - 1, -1, -1)):
        prev = t + 1 if reverse else t - 1
        c_prev = c_out[prev] if 0 <= prev < steps else c0
        if grad_h is not None:
            dh = dh + grad_h[t].float()
        if grad_c is not None:
            dc = dc + grad_c[t].float()
        gy = grad_y[t].float() if grad_y is not None else None
        m = mask[t] if mask is not None else None
        # h_t = y_t = o tanh(c_t) (masked: y_t = m o tanh(c_t), h_t = h + m (y_t - h))
        d_out = dh if m is None else m * m * dh
        if gy is not None:
            d_out = d_out + (gy if m is None else m * gy)
        dh_pass = None if m is None else (1 - m) * dh
        dc = dc + d_out * o[t] * (1 - tanh_c[t] * tanh_c[t])
        dc_new, dc_pass = (dc, None) if m is None else (m * dc, (1 - m) * dc)
        d_gates[t] = torch.cat([dc_new * j[t] * i[t] * (1 - i[t]), dc_new * c_prev * f[t] * (1 - f[t]),
                                dc_new * i[t] * (1 - j[t] * j[t]), d_out * tanh_c[t] * o[t] * (1 - o[t])], -1)
        dh = d_gates[t] @ w_h.t()
        dc = dc_new * f[t]
        if m is not None:
            dh, dc = dh + dh_pass, dc + dc_pass
    d_gates = torch.stack(d_gates).reshape(steps * batch, 4 * hidden)
    h_prevs = torch.cat([h_out[1:], h0[None]]) if reverse else torch.cat([h0[None], h_out[:-1]])
    rows = torch.cat([input.float().reshape(steps * batch, features), h_prevs.reshape(steps * batch, hidden)], 1)
    d_input = (d_gates @ w_x.t()).reshape(steps, batch, features)
    return d_input, rows.t() @ d_gates, d_gates.sum(0), dh, dc


@_op("npu_lstm(Tensor input, Tensor weight, Tensor bias, Tensor seq_mask, Tensor h, Tensor c, bool has_biases, "
     "int num_layers, float dropout, bool train, bool bidirectional, bool batch_first, bool flag_seq, bool direction) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", keys=("CompositeExplicitAutograd",))
def _npu_lstm(input, weight, bias, seq_mask, h, c, has_biases, num_layers, dropout, train, bidirectional,
              batch_first, flag_seq, direction):
    """One LSTM layer over a time-major sequence (CANN's DynamicRNN, as torch_npu's nn.LSTM runs
    each layer and direction): input [T, B, I], weight [I + H, 4H] (w_ih and w_hh transposed and
    stacked: cat([w_ih.t(), w_hh.t()])), bias [4H] (b_ih + b_hh; always added: pass zeros without
    biases), initial states h, c [1, B, H]; gate columns in torch's i, f, g (here j), o order.
    flag_seq: seq_mask masks the steps (int32 lengths [B] or a float mask [T, B, H]): a masked step
    keeps the states and outputs y = 0. direction: REDIRECTIONAL, the steps run from T - 1 down
    to 0 (outputs stay at their time index). has_biases, num_layers, dropout, bidirectional and
    batch_first describe the calling module and do not change this single layer (as in torch_npu).
    Returns (y, h, c, i, j, f, o, tanh(c)), each [T, B, H] (h and c at every step) in input's
    dtype, computed in float32. Differentiable in input, weight, bias, h and c through y, h and c
    (npu_lstm_backward's computation); the gate outputs are not differentiable."""
    name = "npu_lstm"
    steps, batch, _, hidden = _lstm_check(name, input, weight, bias, h, c)
    mask = _lstm_mask(name, seq_mask, steps, batch, hidden) if flag_seq else None
    return tuple(t.to(input.dtype) for t in _lstm_run(input, weight, bias, mask, h, c, bool(direction)))


def _npu_lstm_setup_context(ctx, inputs, output):
    input, weight, bias, seq_mask, h, c = inputs[:6]
    ctx.flag_seq, ctx.direction = bool(inputs[12]), bool(inputs[13])
    ctx.mark_non_differentiable(*output[3:])
    ctx.save_for_backward(input, weight, bias, seq_mask, h, c, *output[1:])


def _npu_lstm_backward_formula(ctx, grad_y, grad_h, grad_c, *_):
    input, weight, bias, seq_mask, h, c, h_out, c_out, i, j, f, o, tanh_c = ctx.saved_tensors
    steps, batch, hidden = h_out.shape
    mask = _lstm_mask("npu_lstm", seq_mask, steps, batch, hidden) if ctx.flag_seq else None
    dx, dw, db, dh, dc = _lstm_grad(grad_y, grad_h, grad_c, input, weight, mask, h, c, h_out, c_out, i, j, f, o,
                                    tanh_c, ctx.direction)
    return (dx.to(input.dtype), dw.to(weight.dtype), db.to(bias.dtype), None, dh.reshape(h.shape).to(h.dtype),
            dc.reshape(c.shape).to(c.dtype)) + (None,) * 8


torch.library.register_autograd("npu::npu_lstm", _npu_lstm_backward_formula, setup_context=_npu_lstm_setup_context,
                                lib=_lib)


@_op("npu_lstm_backward(Tensor? grady, Tensor? gradh, Tensor? gradc, Tensor input, Tensor weight, Tensor bias, "
     "Tensor hx, Tensor cx, Tensor y_output, Tensor h_output, Tensor c_output, Tensor i, Tensor j, Tensor f, "
     "Tensor o, Tensor tanhc) -> (Tensor, Tensor, Tensor, Tensor, Tensor)", keys=("CompositeExplicitAutograd",))
def _npu_lstm_backward(grady, gradh, gradc, input, weight, bias, hx, cx, y_output, h_output, c_output, i, j, f, o,
                       tanhc):
    """The gradients (input, weight, bias, hx, cx) of an unmasked, forward-direction npu_lstm
    from its outputs (CANN's DynamicRNNGrad): grady [T, B, H] for every step; of gradh and gradc
    only the last step (the final states) is used, as torch_npu's kernel does. hx, cx [1, B, H];
    the gradients of hx and cx come back [1, B, H]."""
    name = "npu_lstm_backward"
    steps, batch, _, hidden = _lstm_check(name, input, weight, bias, hx, cx)
    for arg, t in (("grady", grady), ("gradh", gradh), ("gradc", gradc), ("y_output", y_output),
                   ("h_output", h_output), ("c_output", c_output), ("i", i), ("j", j), ("f", f), ("o", o),
                   ("tanhc", tanhc)):
        if t is not None:
            _check(list(t.shape) == [steps, batch, hidden],
                   f"{name}: {arg} must be [{steps}, {batch}, {hidden}] as npu_lstm's outputs, got {list(t.shape)}")

    def last_step(g):
        if g is None:
            return None
        only = torch.zeros_like(g)
        only[-1] = g[-1]
        return only

    dx, dw, db, dh, dc = _lstm_grad(grady, last_step(gradh), last_step(gradc), input, weight, None, hx, cx, h_output,
                                    c_output, i, j, f, o, tanhc, False)
    return (dx.to(input.dtype), dw.to(weight.dtype), db.to(bias.dtype), dh.reshape(1, batch, hidden).to(hx.dtype),
            dc.reshape(1, batch, hidden).to(cx.dtype))


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


# (`int dtype` where op-plugin has `ScalarType dtype`: torch's boxing of a Python kernel reads a
# ScalarType argument's code as an index without a bound, so a bad code crashed the process)
@_op("npu_sign_bits_unpack(Tensor input, int size, int dtype) -> Tensor")
def _npu_sign_bits_unpack(input, size, dtype):
    """Inverse of npu_sign_bits_pack: each bit becomes +1 (set) or -1, shape [size, -1]."""
    dtype = _dtype("npu_sign_bits_unpack", "dtype", dtype)
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


def _pack_int4(values):
    """Integers in [-8, 7] [..., 8 c] -> int32 words [..., c] of 8 signed 4-bit values, lowest nibble first."""
    nibbles = (values.to(torch.int64) & 0xF).unflatten(-1, (-1, 8))
    word = (nibbles << torch.arange(0, 32, 4, device=values.device, dtype=torch.int64)).sum(-1)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


@_op("npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, int? dst_dtype=None, int? src_dtype=None) -> Tensor")
def _npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    """(x + offset) * scale in dst_dtype (default float16); int32 x holds packed int4 values, uint8
    x HiFloat8 codes, float8 x its values."""
    out_dtype = torch.float16 if dst_dtype is None else _dtype("npu_anti_quant", "dst_dtype", dst_dtype)
    _check(out_dtype in (torch.float16, torch.bfloat16),
           f"npu_anti_quant: dst_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
    src_of = {torch.uint8: _HIFLOAT8, torch.int8: torch.int8, torch.float8_e4m3fn: torch.float8_e4m3fn,
              torch.float8_e5m2: torch.float8_e5m2}
    _check(x.dtype in src_of or x.dtype == torch.int32,
           "Input x must be int8, int32, hifloat8, float8_e5m2 or float8_e4m3fn")
    if src_dtype is not None:
        if x.dtype == torch.int32:
            _check(src_dtype in (torch.quint4x2, _SCALAR_TYPES.index(torch.quint4x2), _cdt.DType.int4),
                   "The datatype of x is int32, src_dtype must be int4")
        else:
            given = src_dtype if src_dtype == _HIFLOAT8 else _dtype("npu_anti_quant", "src_dtype", src_dtype)
            _check(given == src_of[x.dtype], "The datatype of x must match src_dtype")
    if x.dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
        _check(scale.dtype == torch.float32 and (offset is None or offset.dtype == torch.float32),
               "When x datatype is hifloat8, float8_e5m2 or float8_e4m3fn, scale_dtype and offset_dtype is only "
               "support float")
    if x.dtype == torch.int32:
        values = _unpack_int4(x).float()
    elif x.dtype == torch.uint8:
        values = _cdt.hifloat8_decode(x)
    else:
        values = x.float()
    if offset is not None:
        values = values + offset.float()
    return (values * scale.float()).to(out_dtype)


_QUANT_RANGE = {torch.int8: (-128, 127), torch.qint8: (-128, 127), torch.quint8: (0, 255), torch.uint8: (0, 255),
                torch.qint32: (-2 ** 31, 2 ** 31 - 1), torch.int32: (-2 ** 31, 2 ** 31 - 1)}
_QUANT_STORAGE = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}


@_op("npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, bool div_mode=True) -> Tensor")
def _npu_quantize(self, scales, zero_points, dtype, axis=1, div_mode=True):
    """round(self / scales + zero_points) (div_mode) or round(self * scales + zero_points),
    saturated to dtype; per-channel scales broadcast along `axis`. torch.quint4x2 (div_mode=False):
    int4 values packed eight to an int32 along the last dimension, the lowest nibble first.
    torch_npu.hifloat8 (uint8 codes), torch.float8_e4m3fn and torch.float8_e5m2: the value
    self / scales + zero_points (or self * scales + ...) cast to the format, not rounded to integers."""
    target = _HIFLOAT8 if dtype == _HIFLOAT8 else _dtype("npu_quantize", "dtype", dtype)
    int4 = target == torch.quint4x2 and not div_mode
    to_float = target in (_HIFLOAT8, torch.float8_e4m3fn, torch.float8_e5m2)
    _check(target in _QUANT_RANGE or int4 or to_float,
           f"npu_quantize: dtype must be one of torch.qint8, torch.quint8, torch.qint32, torch.int8, torch.uint8, "
           f"torch.int32, torch_npu.hifloat8, torch.float8_e4m3fn, torch.float8_e5m2 (or torch.quint4x2 with "
           f"div_mode=False); got {_cdt.to_string(dtype) if isinstance(dtype, int) else target}")
    if int4:
        _check(self.dim() >= 1 and self.size(-1) % 8 == 0, "Input shape last dim must be divded by 8")
    if not div_mode and axis >= -1:
        axis = -1  # op-plugin's AscendQuant path quantizes along the last dimension unless axis < -1
    shape = [1] * self.dim()
    if scales.numel() > 1:
        shape[axis % self.dim()] = -1
    s = scales.float().reshape(shape)
    x = self.float() / s if div_mode else self.float() * s
    if zero_points is not None:
        x = x + zero_points.float().reshape(shape)
    if int4:
        return _pack_int4(torch.round(x).clamp(-8, 7))
    if to_float:
        return _cdt.cast(x, target, op="npu_quantize")
    lo, hi = _QUANT_RANGE[target]
    return torch.round(x).clamp(lo, hi).to(_QUANT_STORAGE.get(target, target))


# FLOAT4_E2M1 codes of the float32 values it holds, by the value's top 10 bits (sign, exponent, 1 mantissa bit).
_FP4_E2M1 = {0x00000000: 0, 0x3F000000: 1, 0x3F800000: 2, 0x3FC00000: 3, 0x40000000: 4, 0x40400000: 5,
             0x40800000: 6, 0x40C00000: 7, 0x80000000: 8, 0xBF000000: 9, 0xBF800000: 10, 0xBFC00000: 11,
             0xC0000000: 12, 0xC0400000: 13, 0xC0800000: 14, 0xC0C00000: 15}


@_op("npu_convert_weight_to_int4pack(Tensor weight, int inner_k_tiles=0) -> Tensor")
def _npu_convert_weight_to_int4pack(weight, inner_k_tiles=0):
    """int32 weights holding int4 values [..., k, n] (2-D or 3-D, contiguous, n a multiple of 8) ->
    int32 [..., k, n // 8]: eight values' low 4 bits to a word, the lowest nibble first. float32
    weights holding FLOAT4_E2M1 values are packed as their 4-bit codes (0 for other values). A
    FRACTAL_NZ weight gives a FRACTAL_NZ result (int32 blocks of 16 x 8)."""
    _check(weight.is_contiguous(), "weight should be contiguous")
    _check(weight.dim() in (2, 3), f"weight shape only support dim num 2/3, but it is {weight.dim()}")
    _check(weight.dtype in (torch.int32, torch.float32),
           f"weight dtype only support int32 and float32, but it is {weight.dtype}")
    _check(all(s > 0 for s in weight.shape), "weight dim should be greater than 0")
    _check(weight.size(-1) % 8 == 0, f"weight last dim should be the multiple of 8, but it is {weight.size(-1)}")
    values = weight
    if weight.dtype == torch.float32:
        top = weight.view(torch.int32).to(torch.int64) & 0xFFC00000
        values = torch.zeros_like(top)
        for bits, code in _FP4_E2M1.items():
            values = torch.where(top == bits, code, values)
    packed = _pack_int4(values)
    nz = not torch._subclasses.fake_tensor.is_fake(weight) and torch.ops.npu.get_npu_format(weight) == 29
    if nz:
        packed = torch.ops.npu.npu_format_cast(packed, 29, customize_dtype=torch.int32)
    return packed if weight.dtype == torch.int32 else packed.view(torch.float32)


def _row_groups(group_index, rows: int, device):
    """For each of `rows` rows, the group g with group_index[g - 1] <= r < group_index[g] (group_index:
    cumulative row ends of MoE groups); rows past the last end get len(group_index)."""
    return torch.searchsorted(group_index.to(torch.int64).reshape(-1), torch.arange(rows, device=device), right=True)


def _dynamic_quant_input(name, input, smooth_scales, group_index, dst_type, quant_mode):
    """npu_dynamic_quant(_asymmetric)'s checks and its float32 input after the smooth scales:
    (x, int4). With group_index, row r takes smooth_scales[g] for its MoE group g."""
    target = torch.int8 if dst_type is None else _dtype(name, "dst_type", dst_type)
    _check(target in (torch.int8, torch.quint4x2),
           f"{name}: only dst_type=torch.int8 or torch.quint4x2 (int4) is simulated, got {target}")
    _check(quant_mode == "pertoken", f"{name}: only quant_mode='pertoken' is simulated, got {quant_mode!r}")
    _check(input.dim() > 1, "Input shape dim should be greater than 1")
    int4 = target == torch.quint4x2
    if int4:
        _check(input.size(-1) % 8 == 0, "Input shape last dim must be divded by 8 when int4 quantization")
    x = input.float()
    if group_index is not None:
        _check(smooth_scales is not None and smooth_scales.dim() == 2 and smooth_scales.size(0) == group_index.numel()
               and smooth_scales.size(1) == input.size(-1),
               f"{name}: group_index needs smooth_scales of shape [groups = {group_index.numel()}, {input.size(-1)}]")
        rows = x.reshape(-1, x.size(-1))
        group = _row_groups(group_index, rows.size(0), x.device)
        inside = (group < group_index.numel()).unsqueeze(-1)
        factor = smooth_scales.float()[group.clamp(max=group_index.numel() - 1)]
        x = torch.where(inside, rows * factor, rows).reshape(x.shape)
    elif smooth_scales is not None:
        x = x * smooth_scales.float()
    return x, int4


@_op("npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, int? dst_type=None, "
     "str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)")
def _npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                       dst_type_max=0.0):
    """Symmetric per-token quantization: scale = max|x| / 127 (int8) or / 7 (torch.quint4x2: int4
    values packed eight to an int32 along the last dimension, the lowest nibble first) per row of the
    last dimension, after the optional smooth_scales, y = round(x / scale). With group_index (the
    cumulative row ends of MoE groups, int32), row r takes smooth_scales[g] for the group g with
    group_index[g - 1] <= r < group_index[g]. Returns (y, scale as float32)."""
    x, int4 = _dynamic_quant_input("npu_dynamic_quant", input, smooth_scales, group_index, dst_type, quant_mode)
    top = 7.0 if int4 else 127.0
    scale = x.abs().amax(-1) / top
    y = torch.round(x / scale.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)).clamp(-top - 1, top)
    return (_pack_int4(y) if int4 else y.to(torch.int8)), scale


@_op("npu_dynamic_quant_asymmetric(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
     "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor, Tensor)")
def _npu_dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None,
                                  quant_mode="pertoken", dst_type_max=0.0):
    """Asymmetric per-token quantization (smooth scales and MoE groups as npu_dynamic_quant):
    scale = (max - min) / 255 (int8) or / 15 (int4), offset = 127 (7) - max / scale,
    y = round(x / scale + offset). Returns (y, scale, offset), the last two float32."""
    x, int4 = _dynamic_quant_input("npu_dynamic_quant_asymmetric", input, smooth_scales, group_index, dst_type,
                                   quant_mode)
    top, levels = (7.0, 15.0) if int4 else (127.0, 255.0)
    hi, lo = x.amax(-1), x.amin(-1)
    scale = (hi - lo) / levels
    safe = scale.clamp_min(torch.finfo(torch.float32).tiny)
    offset = top - hi / safe
    y = torch.round(x / safe.unsqueeze(-1) + offset.unsqueeze(-1)).clamp(-top - 1, top)
    return (_pack_int4(y) if int4 else y.to(torch.int8)), scale, offset


@_op("npu_group_quant(Tensor x, Tensor scale, Tensor group_index, *, Tensor? offset=None, ScalarType? dst_dtype=None) "
     "-> Tensor")
def _npu_group_quant(x, scale, group_index, *, offset=None, dst_dtype=None):
    """Per MoE group quantization of the rows of x [S, H]: row r of group e (group_index: cumulative
    row ends) is round(x[r] * scale[e] + offset), saturated to int8 (dst_dtype torch.int8 / torch.qint8,
    the default) or to int4 packed eight to an int32 (torch.quint4x2). Rows past the last end take
    the last group's scale."""
    target = torch.int8 if dst_dtype is None else dst_dtype
    if target == torch.qint8:
        target = torch.int8
    _check(target in (torch.int8, torch.quint4x2), "dst_dtype must be Int8 or Int4")
    _check(x.dim() == 2 and scale.dim() == 2 and scale.size(1) == x.size(1) and group_index.dim() == 1
           and group_index.numel() == scale.size(0),
           f"npu_group_quant: expected x [S, H], scale [E, H] and group_index [E], got {list(x.shape)}, "
           f"{list(scale.shape)} and {list(group_index.shape)}")
    int4 = target == torch.quint4x2
    if int4:
        _check(x.size(-1) % 8 == 0, "input shape last dim must be divded by 8")
    group = _row_groups(group_index, x.size(0), x.device).clamp(max=scale.size(0) - 1)
    y = x.float() * scale.float()[group]
    if offset is not None:
        y = y + offset.float().reshape(-1)
    top = 7.0 if int4 else 127.0
    y = torch.round(y).clamp(-top - 1, top)
    return _pack_int4(y) if int4 else y.to(torch.int8)


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


# npu_conv2d and its backward are operators of their own below autograd (not decompositions into
# aten.convolution) so that DTensor sees them and applies their sharding (distributed/tensor).
@_op("npu_conv2d(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
     "int groups) -> Tensor", keys=("CompositeExplicitAutograd",))
def _npu_conv2d(input, weight, bias, stride, padding, dilation, groups):
    _check(input.dim() == 4, f"npu_conv2d: input must be 4-D (N, C, H, W), got {input.dim()}-D")
    return _npu_convolution(input, weight, bias, stride, _conv2d_padding("npu_conv2d", padding), dilation, groups)


def _npu_conv2d_setup_context(ctx, inputs, output):
    input, weight, bias, ctx.stride, ctx.padding, ctx.dilation, ctx.groups = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None


def _npu_conv2d_backward_formula(ctx, grad):
    input, weight = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    args = (ctx.stride, _conv2d_padding("npu_conv2d", ctx.padding), ctx.dilation, False, [0, 0], ctx.groups, mask)
    if torch.is_grad_enabled():  # create_graph: aten's backward is itself differentiable
        grads = torch.ops.aten.convolution_backward(grad, input, weight, [weight.size(0)], *args)
    else:
        grads = torch.ops.npu.npu_conv2d_backward(input, grad, weight, ctx.stride, ctx.padding, ctx.dilation,
                                                  ctx.groups, mask)
    return tuple(g if m else None for g, m in zip(grads, mask)) + (None,) * 4


torch.library.register_autograd("npu::npu_conv2d", _npu_conv2d_backward_formula,
                                setup_context=_npu_conv2d_setup_context, lib=_lib)


def _conv2d_padding(op, padding):
    """op-plugin's 2-D convolutions read padding[0] (height) and padding[1] (width); a longer
    list (torch_npu callers pass [top, bottom, left, right] as (0, 0, 0, 0)) has its rest ignored."""
    _check(len(padding) >= 2, f"{op}: padding has to contain at least 2 elements, but got {len(padding)}")
    return list(padding[:2])


@_op("npu_conv2d_backward(Tensor input, Tensor grad_output, Tensor weight, int[] stride, int[] padding, "
     "int[] dilation, int groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)", keys=("CompositeExplicitAutograd",))
def _npu_conv2d_backward(input, grad_output, weight, stride, padding, dilation, groups, output_mask):
    """Gradients of npu_conv2d for input, weight and bias (each only where output_mask asks; the
    others are returned empty)."""
    _check(input.dim() == 4, f"npu_conv2d_backward: input must be 4-D (N, C, H, W), got {input.dim()}-D")
    padding = _conv2d_padding("npu_conv2d_backward", padding)
    grads = torch.ops.aten.convolution_backward(grad_output, input, weight, [weight.size(0)], stride, padding,
                                                dilation, False, [0, 0], groups, list(output_mask))
    return tuple(g if g is not None else input.new_empty(0) for g in grads)


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
    """out[i] = skip1[i] + skip2[i] + sum_j scales[i, j] * (rows[dst(i, j)] + bias[expert[i, j]]),
    undoing npu_moe_init_routing's expansion. drop_pad_mode 0/2 (dropless): rows [N*K, H];
    1/3 (drop-pad): rows [E, C, H] and dst -1 for a dropped token, whose row counts as zeros
    (its bias still adds). dst(i, j) = expanded_src_to_dst_row[j * N + i] for modes 0/1 (by
    column) and [i * K + j] for 2/3 (by row)."""
    name = "npu_moe_finalize_routing"
    mode = 0 if drop_pad_mode is None else drop_pad_mode
    _check(mode in (0, 1, 2, 3), f"{name}: drop_pad_mode must be in [0, 3], got {mode}")
    dropping = mode in (1, 3)
    _check(expanded_permuted_rows.dim() == (3 if dropping else 2),
           f"{name}: expanded_permuted_rows must be {'[E, C, H]' if dropping else '[NUM_ROWS * K, H]'} "
           f"for drop_pad_mode={mode}, got {list(expanded_permuted_rows.shape)}")
    _check(expanded_src_to_dst_row.dim() == 1,
           f"{name}: expanded_src_to_dst_row must be 1-D, got {expanded_src_to_dst_row.dim()}-D")
    _check(skip1 is not None or skip2 is None, f"{name}: skip2 must be None when skip1 is None")
    if scales is not None:
        k = scales.size(1)
    elif export_for_source_row is not None and export_for_source_row.dim() == 2:
        k = export_for_source_row.size(1)
    k = k or 1
    n = expanded_src_to_dst_row.numel() // k
    flat_rows = expanded_permuted_rows.float().reshape(-1, expanded_permuted_rows.size(-1))
    dst = expanded_src_to_dst_row.long()
    dst = dst.view(k, n) if mode in (0, 1) else dst.view(n, k).t()  # [k, N]
    dropped = dst < 0
    rows = flat_rows[dst.clamp_min(0)].masked_fill(dropped.unsqueeze(-1), 0.0)  # [k, N, H]
    if bias is not None:
        _check(export_for_source_row is not None, f"{name}: bias needs expert_for_source_row")
        rows = rows + bias.float()[export_for_source_row.long().reshape(n, k).t()]
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


# ---- MoE gating, permutation and re-routing ------------------------------------------------

def _top_k_desc(x, k):
    """Indices of the k largest entries of each row, ties to the lower index (stable)."""
    return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :k]


@_op("npu_moe_gating_top_k_softmax_v2(Tensor x, *, int k=1, Tensor? finished=None, int? renorm=0, "
     "bool? output_softmax=False) -> (Tensor, Tensor, Tensor)")
def _npu_moe_gating_top_k_softmax_v2(x, *, k=1, finished=None, renorm=0, output_softmax=False):
    """Gating [..., E]: renorm=0: p = softmax(x) (float), y = the top k of p; renorm=1: the top
    k of x, y = softmax over those k. Indices int32; rows with finished[row] set get index E.
    The third output is the full softmax (float32) when renorm=0 and output_softmax, else empty."""
    _check(renorm in (0, 1, None), f"npu_moe_gating_top_k_softmax_v2: renorm must be 0 or 1, got {renorm}")
    _check(1 <= k <= x.size(-1), f"npu_moe_gating_top_k_softmax_v2: k must be in [1, {x.size(-1)}], got {k}")
    probs = F.softmax(x.float(), dim=-1)
    if renorm == 1:
        indices = _top_k_desc(x, k)
        y = F.softmax(x.gather(-1, indices).float(), dim=-1)
    else:
        indices = _top_k_desc(probs, k)
        y = probs.gather(-1, indices)
    indices = indices.to(torch.int32)
    if finished is not None:
        indices = indices.masked_fill(finished.reshape(x.shape[:-1]).bool().unsqueeze(-1), x.size(-1))
    softmax = probs if (renorm in (0, None) and output_softmax) else x.new_empty(0, dtype=torch.float32)
    return y.to(x.dtype), indices, softmax


@_op("npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, Tensor? tid2eid=None, "
     "int k_group=1, int group_count=1, int group_select_mode=0, int renorm=0, int norm_type=0, bool out_flag=False, "
     "float routed_scaling_factor=1.0, float eps=1e-20) -> (Tensor, Tensor, Tensor)")
def _npu_moe_gating_top_k(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1,
                          group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0,
                          eps=1e-20):
    """Grouped top-k gating of x [N, E]: p = softmax(x) (norm_type 0) or sigmoid(x) (1); the
    experts are split into group_count groups, ranked by p + bias's group maximum
    (group_select_mode 0) or sum of its two largest (1), and only the best k_group groups stay;
    the k best experts of p + bias among them give expert_idx (int32) and y = p[expert_idx]
    (divided by its sum + eps for sigmoid), times routed_scaling_factor. Hash mode: expert_idx
    = tid2eid[input_ids]. Third output: p (float32) when out_flag, else empty."""
    name = "npu_moe_gating_top_k"
    _check(x.dim() == 2, f"{name}: x must be 2-D [tokens, experts], got {x.dim()}-D")
    _check(norm_type in (0, 1), f"{name}: norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")
    _check(renorm == 0, f"{name}: renorm must be 0, got {renorm}")
    _check(group_select_mode in (0, 1), f"{name}: group_select_mode must be 0 or 1, got {group_select_mode}")
    n, experts = x.shape
    _check(group_count >= 1 and experts % group_count == 0,
           f"{name}: group_count ({group_count}) must divide the number of experts ({experts})")
    _check(1 <= k_group <= group_count, f"{name}: k_group must be in [1, group_count={group_count}], got {k_group}")
    _check((input_ids is None) == (tid2eid is None), f"{name}: input_ids and tid2eid must be given together")
    p = F.softmax(x.float(), -1) if norm_type == 0 else torch.sigmoid(x.float())
    if input_ids is not None:
        indices = tid2eid[input_ids.long()].long()
    else:
        scores = p if bias is None else p + bias.float()
        if group_count > 1:
            grouped = scores.view(n, group_count, -1)
            group_score = (grouped.amax(-1) if group_select_mode == 0
                           else grouped.topk(min(2, grouped.size(-1)), -1).values.sum(-1))
            dropped = torch.ones(n, group_count, dtype=torch.bool, device=x.device)
            dropped.scatter_(1, _top_k_desc(group_score, k_group), False)
            scores = grouped.masked_fill(dropped.unsqueeze(-1), float("-inf")).view(n, experts)
        _check(1 <= k <= experts, f"{name}: k must be in [1, {experts}], got {k}")
        indices = _top_k_desc(scores, k)
    y = p.gather(-1, indices)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    norm_out = p if out_flag else x.new_empty(0, dtype=torch.float32)
    return y.to(x.dtype), indices.to(torch.int32), norm_out


@_op("npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, "
     "int active_num=-1, int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
     "bool expert_tokens_num_flag=False, int quant_mode=-1, int[2] active_expert_range=[], int row_idx_type=0, "
     "int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)")
def _npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1,
                             expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                             quant_mode=-1, active_expert_range=(), row_idx_type=0, x_dtype=None):
    """Expands x [N, H] by its top-k experts expert_idx [N, k] and sorts the N*k rows by expert
    (stable): expanded_x[d] = x[s // k] for the d-th sorted flat index s, keeping only experts
    in active_expert_range [start, end) (default [0, expert_num)) and at most active_num rows
    (<= 0: all). expanded_row_idx (int32): row_idx_type 0: for each flat index s its row d
    (-1 if dropped); 1: for each row d its flat index s. expert_tokens (int64, per expert of
    the range): cumulative counts (type 0), counts (1), or (expert, count) pairs (2).
    quant_mode -1: expanded_scale = scale[s // k] per row (float32; empty without scale);
    0: expanded_x = round(x * scale + offset) as int8 (float16 arithmetic); 1: per-row dynamic
    int8 of x * scale[expert - start] (smooth scales, optional), expanded_scale = max|row| / 127."""
    name = "npu_moe_init_routing_v2"
    _check(x.dim() == 2 and expert_idx.dim() == 2 and expert_idx.size(0) == x.size(0),
           f"{name}: x must be [N, H] and expert_idx [N, k], got {list(x.shape)} and {list(expert_idx.shape)}")
    _check(drop_pad_mode == 0, f"{name}: only drop_pad_mode=0 (dropless) is simulated, got {drop_pad_mode}")
    _check(quant_mode in (-1, 0, 1), f"{name}: quant_mode must be -1 (none), 0 (static int8) or 1 (dynamic int8); "
                                     f"the float8 / hifloat8 / mx modes are not simulated, got {quant_mode}")
    _check(row_idx_type in (0, 1), f"{name}: row_idx_type must be 0 (gather) or 1 (scatter), got {row_idx_type}")
    _check(expert_tokens_num_type in (0, 1, 2), f"{name}: expert_tokens_num_type must be 0, 1 or 2, "
                                                f"got {expert_tokens_num_type}")
    k = expert_idx.size(1)
    flat = expert_idx.reshape(-1).long()
    if len(active_expert_range) == 0:
        _check(expert_num > 0 or not expert_tokens_num_flag,
               f"{name}: expert_num or active_expert_range is needed to count expert tokens")
        start, end = 0, (expert_num if expert_num > 0 else int(flat.max()) + 1 if flat.numel() else 0)
    else:
        _check(len(active_expert_range) == 2 and active_expert_range[0] < active_expert_range[1],
               f"{name}: active_expert_range must be [start, end) with start < end, got {list(active_expert_range)}")
        start, end = active_expert_range
    in_range = (flat >= start) & (flat < end)
    # experts below the range sort last (experts past it sort after it by value), so the kept
    # rows are a prefix of the order
    order = torch.argsort(flat.masked_fill(flat < start, torch.iinfo(torch.int64).max), stable=True)
    kept = int(in_range.sum())
    rows = kept if active_num <= 0 else min(active_num, kept)
    sources = order[:rows]
    expanded_x = x[sources // k]
    if row_idx_type == 1:
        expanded_row_idx = order.to(torch.int32)
    else:
        expanded_row_idx = torch.full_like(flat, -1, dtype=torch.int32)
        expanded_row_idx[order[:kept]] = torch.arange(kept, device=x.device, dtype=torch.int32)
    counts = torch.bincount(flat[in_range] - start, minlength=end - start)
    if not expert_tokens_num_flag:
        tokens = x.new_empty(0, dtype=torch.int64)
    elif expert_tokens_num_type == 0:
        tokens = counts.cumsum(0)
    elif expert_tokens_num_type == 1:
        tokens = counts
    else:
        present = counts.nonzero().flatten()
        tokens = torch.stack([present + start, counts[present]], -1)
    expanded_scale = x.new_empty(0, dtype=torch.float32)
    if quant_mode == -1:
        if scale is not None:
            expanded_scale = scale.float()[sources // k]
    elif quant_mode == 0:  # static: one scale and offset, applied in float16
        _check(scale is not None and offset is not None, f"{name}: quant_mode=0 needs scale and offset")
        q = expanded_x.half() * scale.reshape(-1)[0].half() + offset.reshape(-1)[0].half()
        expanded_x = torch.round(q.float()).clamp(-128, 127).to(torch.int8)
    else:  # dynamic per row, after the optional smooth scale ([1, H] or one row per expert of the range)
        xf = expanded_x.float()
        if scale is not None:
            smooth = scale.float().reshape(-1, x.size(1))
            xf = xf * (smooth if smooth.size(0) == 1 else smooth[flat[sources] - start])
        row_scale = xf.abs().amax(-1, keepdim=True) / 127.0
        # an all-zero row quantises to zeros (scale 0), as npu_dynamic_quant's
        expanded_x = torch.round(xf / row_scale.clamp_min(torch.finfo(torch.float32).tiny)).clamp(-128, 127).to(
            torch.int8)
        expanded_scale = row_scale.reshape(-1)
    return expanded_x, expanded_row_idx, tokens.to(torch.int64), expanded_scale


@_op("npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, bool padded_mode=False) "
     "-> (Tensor, Tensor)")
def _npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """Megatron's MoE permute: the N*topk (token, expert) pairs of indices [N] or [N, topk],
    stably sorted by expert; permuted_tokens[d] = tokens[s // topk] for the d-th sorted flat
    index s (the first num_out_tokens rows). sorted_indices (int32) maps each flat index s to
    its row d (the inverse permutation)."""
    _check(not padded_mode, "npu_moe_token_permute: padded_mode=True is not supported (as in torch_npu)")
    _check(indices.dim() in (1, 2), f"npu_moe_token_permute: indices must be [N] or [N, topk], got {indices.dim()}-D")
    topk = 1 if indices.dim() == 1 else indices.size(1)
    order = torch.argsort(indices.reshape(-1), stable=True)
    if num_out_tokens is not None and num_out_tokens > 0:
        order = order[:num_out_tokens]
    permuted = tokens.index_select(0, order // topk)
    sorted_indices = torch.argsort(torch.argsort(indices.reshape(-1), stable=True), stable=True)
    return permuted, sorted_indices.to(torch.int32)


@_op("npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, "
     "bool padded_mode=False, int[]? restore_shape=None) -> Tensor")
def _npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """Undoes npu_moe_token_permute: out[i] = sum_j probs[i, j] * permuted_tokens[sorted_indices[i * topk + j]]
    (topk = probs.size(1), or 1 without probs); rows past permuted_tokens' end (dropped) add 0."""
    _check(not padded_mode, "npu_moe_token_unpermute: padded_mode=True is not supported (as in torch_npu)")
    topk = 1 if probs is None else probs.size(-1)
    _check(sorted_indices.numel() % topk == 0, f"npu_moe_token_unpermute: sorted_indices ({sorted_indices.numel()}) "
                                               f"must hold topk={topk} entries per token")
    index = sorted_indices.long()
    rows = permuted_tokens.size(0)
    valid = index < rows
    gathered = permuted_tokens.index_select(0, index.clamp(max=max(rows - 1, 0)))
    gathered = gathered * valid.unsqueeze(-1).to(gathered.dtype)
    gathered = gathered.view(-1, topk, permuted_tokens.size(-1))
    if probs is not None:
        gathered = gathered * probs.reshape(-1, topk, 1).to(gathered.dtype)
    return gathered.sum(1)


@_op("npu_moe_re_routing(Tensor tokens, Tensor expert_token_num_per_rank, *, Tensor? per_token_scales=None, "
     "int expert_token_num_type=1, int idx_type=0, int? tokens_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)")
def _npu_moe_re_routing(tokens, expert_token_num_per_rank, *, per_token_scales=None, expert_token_num_type=1,
                        idx_type=0, tokens_dtype=None):
    """tokens [A, H] arrive grouped by source rank, then expert (block (i, j) holds
    expert_token_num_per_rank[i, j] rows); regroups them by expert, then rank.
    permute_token_idx (int32, gather index): permute_tokens[d] = tokens[permute_token_idx[d]];
    expert_token_num: tokens per expert (count mode)."""
    name = "npu_moe_re_routing"
    _check(tokens.dim() > 1, "tokens dim should larger than 1")
    _check(expert_token_num_per_rank.dim() > 1, "expert_token_num_per_rank dim should larger than 1")
    if tokens_dtype is not None:
        # The rows are moved as they are, so HiFloat8 codes and packed FP4 pairs need nothing more.
        _check(tokens_dtype in (_HIFLOAT8, _cdt.DType.float4_e2m1fn_x2, _cdt.DType.float4_e1m2fn_x2),
               f"The optional parameter tokens_dtype only supports hifloat8, float4_e2m1fn_x2, float4_e1m2fn_x2 or "
               f"None, but now is {_cdt.to_string(tokens_dtype)}.")
        _check(tokens.element_size() == 1, f"{name}: tokens_dtype={_cdt.to_string(tokens_dtype)} needs 1-byte "
                                           f"tokens (uint8), got {tokens.dtype}")
    _check(expert_token_num_type == 1, f"{name}: only expert_token_num_type=1 (count) is supported, "
                                       f"got {expert_token_num_type}")
    _check(idx_type == 0, f"{name}: only idx_type=0 (gather index) is supported, got {idx_type}")
    counts = expert_token_num_per_rank
    _check(counts.dim() == 2, f"{name}: expert_token_num_per_rank must be 2-D [ranks, experts], got {counts.dim()}-D")
    _check(int(counts.sum()) == tokens.size(0), f"{name}: expert_token_num_per_rank sums to {int(counts.sum())}, "
                                                f"but tokens has {tokens.size(0)} rows")
    flat = counts.reshape(-1).long()
    # block b = (rank, expert) of each source row, then a stable sort by (expert, rank)
    block = torch.repeat_interleave(torch.arange(flat.numel(), device=tokens.device), flat)
    ranks, experts = counts.shape
    key = (block % experts) * ranks + block // experts
    idx = torch.argsort(key, stable=True)
    scales = (per_token_scales[idx] if per_token_scales is not None
              else tokens.new_empty(0, dtype=torch.float32))
    return tokens[idx], scales, idx.to(torch.int32), counts.sum(0)


# ---- LLM fused losses, norms and quantized activations ---------------------------------------

# binary_cross_entropy_with_logits on npu is differentiated as op-plugin's derivatives do, by
# npu_binary_cross_entropy_with_logits_backward: one kernel computing in float32 for
# float16/bfloat16 (rounded once), not torch's formula of float16 elementwise steps.

def _bce_with_logits_scale(grad_output, x, weight, reduction):
    scale = grad_output.to(x.dtype)
    if weight is not None:
        scale = scale * weight.to(x.dtype)
    return scale / x.numel() if reduction == 1 else scale  # at::Reduction::Mean


@_op("npu_binary_cross_entropy_with_logits_backward(Tensor grad_output, Tensor self, Tensor target, "
     "Tensor? weight_opt, Tensor? pos_weight_opt, int reduction) -> Tensor", keys=("CompositeExplicitAutograd",))
def _npu_binary_cross_entropy_with_logits_backward(grad_output, self, target, weight_opt, pos_weight_opt, reduction):
    """The gradient of binary_cross_entropy_with_logits in self: (sigmoid(x) - t), or with
    pos_weight p ((p t + 1 - t) sigmoid(x) - p t), times weight, grad_output (and 1 / numel for
    "mean"), computed in float32 for float16/bfloat16."""
    _check(reduction in (0, 1, 2), f"npu_binary_cross_entropy_with_logits_backward: reduction must be 0 (none), "
                                   f"1 (mean) or 2 (sum), got {reduction}")
    wide = _low_precision_accumulator(self)
    x, t = self.to(wide), target.to(wide)
    if pos_weight_opt is None:
        grad = torch.sigmoid(x) - t
    else:
        pt = pos_weight_opt.to(wide) * t
        grad = (pt + 1 - t) * torch.sigmoid(x) - pt
    return (grad * _bce_with_logits_scale(grad_output, x, weight_opt, reduction)).to(self.dtype)


class _BinaryCrossEntropyWithLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, self, target, weight, pos_weight, reduction):
        ctx.save_for_backward(self, target, weight, pos_weight)
        ctx.reduction = reduction
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.binary_cross_entropy_with_logits(self, target, weight, pos_weight, reduction)

    @staticmethod
    def backward(ctx, grad):
        x, t, weight, pos_weight = ctx.saved_tensors
        # create_graph: the same formula as differentiable steps, else the one operator
        backward = (_npu_binary_cross_entropy_with_logits_backward if torch.is_grad_enabled()
                    else torch.ops.npu.npu_binary_cross_entropy_with_logits_backward)
        grad_x = grad_t = None
        if ctx.needs_input_grad[0]:
            grad_x = backward(grad, x, t, weight, pos_weight, ctx.reduction)
        if ctx.needs_input_grad[1]:  # d/dt = -x + (p - 1) softplus(-x), in float32 for float16/bfloat16
            xf = x.to(_low_precision_accumulator(x))
            grad_t = -xf if pos_weight is None else -xf + (pos_weight.to(xf.dtype) - 1) * F.softplus(-xf)
            grad_t = (grad_t * _bce_with_logits_scale(grad, xf, weight, ctx.reduction)).to(t.dtype)
        return grad_x, grad_t, None, None, None


_aten_lib.impl("binary_cross_entropy_with_logits",
               lambda self, target, weight=None, pos_weight=None, reduction=1:
               _BinaryCrossEntropyWithLogits.apply(self, target, weight, pos_weight, reduction), "AutogradPrivateUse1")


# cdist's gradient for p = inf goes to the coordinates whose |x1 - x2| reaches the distance.
# For float16/bfloat16 the distance is rounded; aclnn computes in float32 and takes every
# coordinate with |x1 - x2| >= the rounded distance (none where its rounding went up, those
# above it where it went down), where ATen's kernel asks for equality with it.
def _cdist_backward(grad, x1, x2, p, cdist):
    if p != math.inf or x1.dtype not in (torch.float16, torch.bfloat16):
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten._cdist_backward(grad, x1, x2, p, cdist)
    diff = x1.float().unsqueeze(-2) - x2.float().unsqueeze(-3)
    reaches = diff.abs() >= cdist.float().unsqueeze(-1)
    return (grad.float().unsqueeze(-1) * diff.sign() * reaches).sum(-2).to(x1.dtype)


_aten_lib.impl("_cdist_backward", _cdist_backward, "AutogradPrivateUse1")


# renorm as aclnnRenorm, which also takes p = 0 (a slice's "norm" is then its count of
# non-zero elements; ATen refuses it: "non-positive-norm not supported"). Other p run the op
# table's kernel; their gradient, and all of p = 0, are ATen's steps written out: the norm of
# each slice along `dim` in the accumulate type, the factor maxnorm / (norm + 1e-7) where the
# norm exceeds maxnorm (else 1) in self's dtype, self * factor (a count has no gradient).
def _renorm_steps(self, p, dim, maxnorm):
    p, maxnorm = float(p), float(maxnorm)
    _check(p >= 0, "renorm: negative-norm not supported")
    _check(maxnorm >= 0, f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    _check(self.dim() > 1, f"renorm: input needs at least 2 dimensions, got {self.dim()} dimensions")
    d = dim % self.dim()
    others = [i for i in range(self.dim()) if i != d]
    acc = _low_precision_accumulator(self)
    if p == 0:
        norm = (self != 0).sum(others, keepdim=True, dtype=acc)
    else:
        norm = torch.linalg.vector_norm(self, p, dim=others, keepdim=True, dtype=acc)
    factor = torch.where(norm > maxnorm, maxnorm / (norm + 1e-7), torch.ones_like(norm))
    return self * factor.to(self.dtype)


class _Renorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, self, p, dim, maxnorm):
        ctx.save_for_backward(self)
        ctx.args = (p, dim, maxnorm)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.renorm(self, p, dim, maxnorm)

    @staticmethod
    def backward(ctx, grad):
        (self,) = ctx.saved_tensors
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            x = self if create_graph else self.detach().requires_grad_()
            (grad_self,) = torch.autograd.grad(_renorm_steps(x, *ctx.args), x, grad, create_graph=create_graph)
        return grad_self, None, None, None


def _renorm(self, p, dim, maxnorm):
    return _renorm_steps(self, p, dim, maxnorm) if float(p) == 0 else _Renorm.apply(self, p, dim, maxnorm)


def _renorm_(self, p, dim, maxnorm):
    if float(p) != 0 and not (self.requires_grad and torch.is_grad_enabled()):
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.renorm_(self, p, dim, maxnorm)
    return self.copy_(_renorm(self.clone(), p, dim, maxnorm))


def _renorm_out(self, p, dim, maxnorm, *, out):
    _check(not (self.requires_grad and torch.is_grad_enabled()),
           "renorm(): functions with out=... arguments don't support automatic differentiation, but one of the "
           "arguments requires grad.")
    if float(p) != 0:
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.renorm.out(self, p, dim, maxnorm, out=out)
    result = _renorm_steps(self, p, dim, maxnorm)
    out.resize_(result.shape)
    return out.copy_(result)


for _name, _kernel in (("renorm", _renorm), ("renorm_", _renorm_), ("renorm.out", _renorm_out)):
    _aten_lib.impl(_name, _kernel, "AutogradPrivateUse1")


def _check_cross_entropy_args(name, reduction, scores_name, scores, target):
    _check(reduction in ("mean", "sum", "none"),
           f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    _check(scores.dim() == 2 and target.dim() == 1 and target.size(0) == scores.size(0),
           f"{name}: {scores_name} must be [N, C] and target [N], got {list(scores.shape)} and {list(target.shape)}")


@_op("npu_cross_entropy_loss(Tensor input, Tensor target, Tensor? weight=None, str reduction='mean', "
     "int ignore_index=-100, float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0, bool return_zloss=False) "
     "-> (Tensor, Tensor, Tensor, Tensor)", keys=("CompositeExplicitAutograd",))
def _npu_cross_entropy_loss(input, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                            lse_square_scale_for_zloss=0.0, return_zloss=False):
    """Cross entropy of logits input [N, C] (computed in float) with class targets [N], as
    F.cross_entropy (weight, ignore_index, label_smoothing). Returns (loss, log_prob [N, C],
    zloss, lse_for_zloss): with return_zloss, zloss = lse_square_scale_for_zloss * lse^2
    (lse = logsumexp of each row, ignored rows 0) reduced like the loss, else both empty."""
    _check_cross_entropy_args("npu_cross_entropy_loss", reduction, "input", input, target)
    logits = input.float()
    log_prob = F.log_softmax(logits, -1)
    w = None if weight is None else weight.float()
    loss = F.nll_loss(log_prob, target.long(), w, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing > 0:
        loss = F.cross_entropy(logits, target.long(), w, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)
    if return_zloss:
        lse = torch.logsumexp(logits, -1)
        z = lse_square_scale_for_zloss * lse.pow(2) * (target != ignore_index)
        kept = (target != ignore_index).sum().clamp_min(1)
        zloss = z.sum() / kept if reduction == "mean" else z.sum() if reduction == "sum" else z
        zloss, lse_for_zloss = zloss.to(input.dtype), lse
    else:
        zloss, lse_for_zloss = input.new_empty(0), input.new_empty(0, dtype=torch.float32)
    loss = loss.reshape(1) if reduction != "none" else loss
    return loss.to(input.dtype), log_prob.to(input.dtype), zloss, lse_for_zloss


@_op("npu_cross_entropy_loss_backward(Tensor grad_loss, Tensor log_prob, Tensor target, Tensor? weight=None, "
     "Tensor? grad_zloss=None, Tensor? lse_for_zloss=None, str reduction='mean', int ignore_index=-100, "
     "float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0) -> Tensor", keys=("CompositeExplicitAutograd",))
def _npu_cross_entropy_loss_backward(grad_loss, log_prob, target, weight=None, grad_zloss=None, lse_for_zloss=None,
                                     reduction="mean", ignore_index=-100, label_smoothing=0.0,
                                     lse_square_scale_for_zloss=0.0):
    """The gradient of npu_cross_entropy_loss's input from its log_prob (and lse_for_zloss for the
    z-loss): per row, d loss / d log_prob is -(1 - label_smoothing) w[t] at the target and
    -label_smoothing w[c] / C everywhere, scaled by the reduction; through log_softmax,
    grad - softmax * sum(grad). Computed in float32."""
    _check_cross_entropy_args("npu_cross_entropy_loss_backward", reduction, "log_prob", log_prob, target)
    lp = log_prob.float()
    rows, classes = lp.shape
    kept = target.long() != ignore_index
    tgt = torch.where(kept, target.long(), 0)
    w = lp.new_ones(classes) if weight is None else weight.float()
    target_weight = w[tgt] * kept

    def per_row(grad, total):  # the reduction's scale of each row's loss
        grad = grad.float()
        if reduction == "none":
            return grad.reshape(rows)
        scale = grad.reshape(-1)[0]
        return scale.expand(rows) / total if reduction == "mean" else scale.expand(rows)

    d_lp = torch.zeros_like(lp).scatter_(1, tgt[:, None], -(1 - label_smoothing) * target_weight[:, None])
    if label_smoothing > 0:
        d_lp -= label_smoothing / classes * w[None, :] * kept[:, None]
    d_lp *= per_row(grad_loss, target_weight.sum())[:, None]
    softmax = lp.exp()
    grad = d_lp - softmax * d_lp.sum(1, keepdim=True)
    if grad_zloss is not None and lse_for_zloss is not None and lse_for_zloss.numel() > 0:
        z = per_row(grad_zloss, kept.sum().clamp_min(1)) * 2 * lse_square_scale_for_zloss * lse_for_zloss.float()
        grad += (z * kept)[:, None] * softmax
    return grad.to(log_prob.dtype)


def _npu_cross_entropy_loss_setup_context(ctx, inputs, output):
    _, target, weight, ctx.reduction, ctx.ignore_index, ctx.label_smoothing, ctx.zloss_scale, _ = inputs
    ctx.mark_non_differentiable(output[1], output[3])  # as op-plugin: log_prob and lse_for_zloss are not
    ctx.save_for_backward(output[1], target, weight, output[3])


def _npu_cross_entropy_loss_backward_formula(ctx, grad_loss, _grad_log_prob, grad_zloss, _grad_lse):
    log_prob, target, weight, lse = ctx.saved_tensors
    grad = torch.ops.npu.npu_cross_entropy_loss_backward(
        grad_loss, log_prob, target, weight, grad_zloss if lse.numel() > 0 else None, lse if lse.numel() > 0 else None,
        ctx.reduction, ctx.ignore_index, ctx.label_smoothing, ctx.zloss_scale)
    return (grad,) + (None,) * 7


torch.library.register_autograd("npu::npu_cross_entropy_loss", _npu_cross_entropy_loss_backward_formula,
                                setup_context=_npu_cross_entropy_loss_setup_context, lib=_lib)


@_op("npu_fused_cross_entropy_loss_with_max_sum(Tensor logits_max, Tensor sum_exp_logits, Tensor predicted_logits, "
     "*, float? label_smoothing=0.0, Tensor? input=None, Tensor? weight=None, Tensor? vocab_parallel_logits=None) "
     "-> (Tensor, Tensor)")
def _npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp_logits, predicted_logits, *, label_smoothing=0.0,
                                               input=None, weight=None, vocab_parallel_logits=None):
    """Vocabulary-parallel cross entropy from the (all-reduced) row statistics [N]:
    loss = log(sum_exp_logits) - predicted_logits; with vocab_parallel_logits [N, V] also
    softmax = exp(logits - logits_max) / sum_exp_logits (float32), else None."""
    name = "npu_fused_cross_entropy_loss_with_max_sum"
    _check(label_smoothing in (None, 0.0), f"{name}: only label_smoothing=0.0 is supported, got {label_smoothing}")
    _check(input is None and weight is None, f"{name}: input and weight must be None")
    _check(logits_max.dim() == 1 and logits_max.shape == sum_exp_logits.shape == predicted_logits.shape,
           f"{name}: logits_max, sum_exp_logits and predicted_logits must be 1-D of one shape, got "
           f"{list(logits_max.shape)}, {list(sum_exp_logits.shape)} and {list(predicted_logits.shape)}")
    loss = torch.log(sum_exp_logits.float()) - predicted_logits.float()
    softmax = None
    if vocab_parallel_logits is not None:
        _check(vocab_parallel_logits.dim() == 2 and vocab_parallel_logits.size(0) == logits_max.size(0),
               f"{name}: vocab_parallel_logits must be [{logits_max.size(0)}, V], got "
               f"{list(vocab_parallel_logits.shape)}")
        shifted = vocab_parallel_logits.float() - logits_max.float().unsqueeze(-1)
        softmax = shifted.exp() / sum_exp_logits.float().unsqueeze(-1)
    return loss, softmax


# The vocabulary-parallel cross entropy of a linear head (Megatron's), around its all-reduces:
# npu_fused_linear_online_max_sum before, npu_fused_cross_entropy_loss_with_max_sum after, and
# the gradients of input and weight. target_mask has a bit per row, set where the target is
# not in this rank's slice of the vocabulary; the bits of a byte are its rows in order, the
# first the most significant (op-plugin's 0b(maskBit[8k:8k+8])), the last byte padded with ones.

_MASK_SHIFTS = tuple(range(7, -1, -1))


def _pack_target_mask(mask):
    pad = -mask.numel() % 8
    bits = torch.cat([mask.to(torch.uint8), mask.new_ones(pad, dtype=torch.uint8)]).view(-1, 8)
    weights = torch.tensor([1 << s for s in _MASK_SHIFTS], dtype=torch.uint8, device=mask.device)
    return (bits * weights).sum(-1, dtype=torch.uint8)


def _unpack_target_mask(packed, rows):
    shifts = torch.tensor(_MASK_SHIFTS, dtype=torch.uint8, device=packed.device)
    return ((packed.view(-1, 1) >> shifts) & 1).view(-1)[:rows].bool()


@_op("npu_fused_linear_online_max_sum(Tensor input, Tensor weight, Tensor target, int vocab_start_index, "
     "int vocab_end_index, bool return_logits=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def _npu_fused_linear_online_max_sum(input, weight, target, vocab_start_index, vocab_end_index, return_logits=False):
    """logits = input [N, H] @ weight [V, H]^T (float32 accumulation); per row its max, the sum
    of exp(logits - max), the shifted logit of the target where it is in [vocab_start_index,
    vocab_end_index] (else 0), target_mask (bits, see above), masked_target (the target's index
    in the slice, 0 outside it) and, with return_logits, the logits in input's dtype (else None)."""
    name = "npu_fused_linear_online_max_sum"
    _check(input.dim() == 2 and weight.dim() == 2 and input.size(1) == weight.size(1),
           f"{name}: input [N, H] and weight [V, H] must share H, got {list(input.shape)} and {list(weight.shape)}")
    _check(input.dtype == weight.dtype and input.dtype in (torch.float16, torch.bfloat16),
           f"{name}: input and weight must be both float16 or both bfloat16, got {input.dtype} and {weight.dtype}")
    _check(target.dim() == 1 and target.size(0) == input.size(0) and target.dtype in (torch.int32, torch.int64),
           f"{name}: target must be int32/int64 [{input.size(0)}], got {target.dtype} {list(target.shape)}")
    _check(0 <= vocab_start_index <= vocab_end_index,
           f"{name}: expected 0 <= vocab_start_index <= vocab_end_index, got {vocab_start_index} and {vocab_end_index}")
    logits = input.float() @ weight.float().t()
    logits_max = logits.amax(-1)
    shifted = logits - logits_max.unsqueeze(-1)
    outside = (target < vocab_start_index) | (target > vocab_end_index)
    masked_target = torch.where(outside, torch.zeros_like(target), target - vocab_start_index)
    picked = shifted.gather(1, masked_target.long().clamp_max(max(weight.size(0) - 1, 0)).unsqueeze(1)).squeeze(1)
    predicted = torch.where(outside, torch.zeros_like(picked), picked)
    parallel_logits = logits.to(input.dtype) if return_logits else None  # None as torch_npu's
    return (logits_max, shifted.exp().sum(-1), predicted, _pack_target_mask(outside), masked_target,
            parallel_logits)


@_op("npu_fused_linear_cross_entropy_loss_with_max_sum_backward(Tensor grad, Tensor input, Tensor weight, "
     "Tensor target_mask, Tensor masked_target, float label_smoothing=0.0, Tensor? logits_max=None, "
     "Tensor? sum_exp_logits=None, Tensor? softmax=None) -> (Tensor, Tensor)")
def _npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask, masked_target,
                                                               label_smoothing=0.0, logits_max=None,
                                                               sum_exp_logits=None, softmax=None):
    """The gradients of input and weight: d logits = (softmax - one_hot(masked_target) for the rows
    whose target is in this slice) * grad; input's = d logits @ weight, weight's = d logits^T @ input.
    softmax [N, V] given (the fast form) or recomputed from logits_max and sum_exp_logits."""
    name = "npu_fused_linear_cross_entropy_loss_with_max_sum_backward"
    _check(label_smoothing == 0.0, f"{name}: only label_smoothing=0.0 is supported, got {label_smoothing}")
    rows = input.size(0)
    _check(grad.dim() == 1 and grad.size(0) == rows and masked_target.shape == grad.shape,
           f"{name}: grad and masked_target must be [{rows}], got {list(grad.shape)} and {list(masked_target.shape)}")
    _check(target_mask.dtype == torch.uint8 and target_mask.numel() * 8 >= rows,
           f"{name}: target_mask must be uint8 with a bit per row ({(rows + 7) // 8} bytes), got "
           f"{target_mask.dtype} {list(target_mask.shape)}")
    if softmax is None:
        _check(logits_max is not None and sum_exp_logits is not None,
               f"{name}: without softmax, logits_max and sum_exp_logits are required")
        logits = input.float() @ weight.float().t()
        softmax = (logits - logits_max.float().unsqueeze(-1)).exp() / sum_exp_logits.float().unsqueeze(-1)
    d_logits = softmax.float().clone()
    inside = (~_unpack_target_mask(target_mask, rows)).float()
    d_logits.scatter_add_(1, masked_target.long().unsqueeze(1), -inside.unsqueeze(1))
    d_logits *= grad.float().unsqueeze(-1)
    return (d_logits @ weight.float()).to(input.dtype), (d_logits.t() @ input.float()).to(input.dtype)


@_op("npu_group_norm_silu(Tensor input, Tensor? weight, Tensor? bias, int group, float eps=0.00001) "
     "-> (Tensor, Tensor, Tensor)")
def _npu_group_norm_silu(input, weight, bias, group, eps=1e-5):
    """silu(GroupNorm(input)) of input [N, C, *]; also the per-(N, group) mean and rstd, as
    aten.native_group_norm."""
    _check(input.dim() >= 2 and group >= 1 and input.size(1) % group == 0,
           f"npu_group_norm_silu: group ({group}) must divide the channels of input {list(input.shape)}")
    n, c = input.shape[:2]
    y, mean, rstd = torch.native_group_norm(input, weight, bias, n, c, input[0, 0].numel(), group, eps)
    return F.silu(y), mean, rstd


@_op("npu_group_norm_swish(Tensor input, int num_groups, Tensor weight, Tensor bias, float? eps=1e-5, "
     "float? swish_scale=1.0) -> (Tensor, Tensor, Tensor)")
def _npu_group_norm_swish(input, num_groups, weight, bias, eps=1e-5, swish_scale=1.0):
    """swish(GroupNorm(input)) = y * sigmoid(swish_scale * y) of input [N, C, *]; also the
    per-(N, group) mean and rstd, as aten.native_group_norm."""
    _check(input.dim() >= 2 and num_groups >= 1 and input.size(1) % num_groups == 0,
           f"npu_group_norm_swish: num_groups ({num_groups}) must divide the channels of input {list(input.shape)}")
    n, c = input.shape[:2]
    eps = 1e-5 if eps is None else eps
    scale = 1.0 if swish_scale is None else swish_scale
    y, mean, rstd = torch.native_group_norm(input, weight, bias, n, c, input[0, 0].numel(), num_groups, eps)
    return y * torch.sigmoid(scale * y), mean, rstd


def _add_rms_norm_v2(name, x1, x2, gamma, epsilon):
    """(rstd, y, x): x = x1 + x2, y = x * rstd * gamma in float over gamma's dimensions."""
    _check(x1.shape == x2.shape and gamma.dim() <= x1.dim() and x1.shape[x1.dim() - gamma.dim():] == gamma.shape,
           f"{name}: expected x1 and x2 of one shape ending in gamma's {list(gamma.shape)}, got "
           f"{list(x1.shape)} and {list(x2.shape)}")
    x = (x1.float() + x2.float())
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + epsilon)
    return rstd, (x * rstd * gamma.float()).to(x1.dtype), x.to(x1.dtype)


@_op("npu_add_rms_norm_v2(Tensor(a!) x1, Tensor(b!) x2, Tensor gamma, float epsilon=1e-06) -> Tensor")
def _npu_add_rms_norm_v2(x1, x2, gamma, epsilon=1e-6):
    """AddRmsNorm in place: x2 becomes x1 + x2 and x1 the normalised sum times gamma; returns
    rstd (float32, the normalised dimensions kept as 1)."""
    rstd, y, x = _add_rms_norm_v2("npu_add_rms_norm_v2", x1, x2, gamma, epsilon)
    x1.copy_(y)
    x2.copy_(x)
    return rstd


@_op("npu_add_rms_norm_v2_functional(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
     "-> (Tensor, Tensor, Tensor)")
def _npu_add_rms_norm_v2_functional(x1, x2, gamma, epsilon=1e-6):
    """npu_add_rms_norm_v2 without the writes: (rstd, what x1 would hold, what x2 would hold)."""
    return _add_rms_norm_v2("npu_add_rms_norm_v2_functional", x1, x2, gamma, epsilon)


@_op("npu_add_rms_norm_cast(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
     "-> (Tensor, Tensor, Tensor, Tensor)")
def _npu_add_rms_norm_cast(x1, x2, gamma, epsilon=1e-6):
    """x = x1 + x2; y = x / rms(x) * gamma over gamma's dimensions, computed in float.
    Returns (y as float32, y in x1's dtype, rstd (float, reduced dimensions kept), x)."""
    x = x1 + x2
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
    y = xf * rstd * gamma.float()
    return y, y.to(x1.dtype), rstd, x


def _quantize_int8(y, scale, offset, div_mode, name):
    """round(y / scale + offset) (div_mode) or round(y * scale + offset), saturated to int8."""
    _check(scale is not None, f"{name}: a quantization scale is required")
    q = y / scale.float() if div_mode else y * scale.float()
    if offset is not None:
        q = q + offset.float()
    return torch.round(q).clamp(-128, 127).to(torch.int8)


def _int8_only(name, arg, code):
    if code is not None:
        target = _dtype(name, arg, code)
        _check(target in (torch.int8, torch.qint8), f"{name}: only {arg}=torch.int8 is simulated, got {target}")


# The float formats the norm-quant operators also give, with the largest value they saturate to.
_FLOAT_QUANT_MAX = {_HIFLOAT8: 32768.0, torch.float8_e5m2: 57344.0, torch.float8_e4m3fn: 448.0}


def _quant_target(name, arg, code):
    """None for int8 (the default), else torch_npu.hifloat8, torch.float8_e5m2 or torch.float8_e4m3fn."""
    if code is None:
        return None
    target = _HIFLOAT8 if code == _HIFLOAT8 else _dtype(name, arg, code)
    if target in (torch.int8, torch.qint8):
        return None
    _check(target in _FLOAT_QUANT_MAX, f"{name}: {arg} must be torch.int8, torch_npu.hifloat8, torch.float8_e5m2 "
                                       f"or torch.float8_e4m3fn, got {_cdt.to_string(code)}")
    return target


def _quantize_to(y, scale, offset, div_mode, target, name):
    """_quantize_int8 (target None), or y / scale + offset (y * scale + offset without div_mode)
    saturated to the float format's range and cast to it (HiFloat8: uint8 codes)."""
    if target is None:
        return _quantize_int8(y, scale, offset, div_mode, name)
    _check(scale is not None, f"{name}: a quantization scale is required")
    q = y / scale.float() if div_mode else y * scale.float()
    if offset is not None:
        q = q + offset.float()
    top = _FLOAT_QUANT_MAX[target]
    return _cdt.cast(q.clamp(-top, top), target, op=name)


@_op("npu_rms_norm_quant(Tensor x, Tensor gamma, Tensor beta, Tensor scale, Tensor offset, float epsilon=1e-06, *, "
     "int? dst_dtype=None) -> Tensor")
def _npu_rms_norm_quant(x, gamma, beta, scale, offset, epsilon=1e-6, *, dst_dtype=None):
    """int8 quantization of RMSNorm(x) * gamma + beta (normalised over the last dimension; gamma
    and beta [D] or [1, D]): round(y / scale + offset), in x's shape. dst_dtype torch_npu.hifloat8
    (uint8 codes), torch.float8_e5m2 or torch.float8_e4m3fn: y / scale + offset saturated to the
    format's largest value and cast to it."""
    target = _quant_target("npu_rms_norm_quant", "dst_dtype", dst_dtype)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.float() + beta.float()
    return _quantize_to(y, scale, offset, True, target, "npu_rms_norm_quant").reshape(x.shape)


@_op("npu_add_rms_norm_quant(Tensor x1, Tensor x2, Tensor gamma, Tensor scales1, Tensor? zero_points1, "
     "Tensor? beta=None, Tensor? scales2=None, Tensor? zero_points2=None, *, int axis=-1, float epsilon=1e-06, "
     "bool div_mode=True, int? dst_type=None) -> (Tensor, Tensor, Tensor)")
def _npu_add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta=None, scales2=None, zero_points2=None, *,
                            axis=-1, epsilon=1e-6, div_mode=True, dst_type=None):
    """x = x1 + x2; y = RMSNorm(x) * gamma (+ beta) in float; y1 (and y2, with scale 1 when scales2
    is None, as op-plugin's golden) = round(y / scales + zero_points) as int8 (y * scales without
    div_mode), both in x's shape as torch_npu allocates them; dst_type
    torch_npu.hifloat8 / torch.float8_e5m2 / torch.float8_e4m3fn: the unrounded value saturated to the
    format's range and cast to it (HiFloat8: uint8 codes). Returns (y1, y2, x)."""
    name = "npu_add_rms_norm_quant"
    _check(axis == -1, f"{name}: only axis=-1 is supported, got {axis}")
    target = _quant_target(name, "dst_type", dst_type)
    x = x1 + x2
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon) * gamma.float()
    if beta is not None:
        y = y + beta.float()
    y1 = _quantize_to(y, scales1, zero_points1, div_mode, target, name)
    y2 = _quantize_to(y, scales2 if scales2 is not None else torch.ones((), device=y.device), zero_points2,
                      div_mode, target, name)
    return y1, y2, x


@_op("npu_swiglu_quant(Tensor x, *, Tensor? smooth_scales=None, Tensor? offsets=None, Tensor? group_index=None, "
     "bool activate_left=False, int quant_mode=0, int group_list_type=0, ScalarType? dst_type=None) "
     "-> (Tensor, Tensor)")
def _npu_swiglu_quant(x, *, smooth_scales=None, offsets=None, group_index=None, activate_left=False, quant_mode=0,
                      group_list_type=0, dst_type=None):
    """SwiGLU of x [N, 2H] (a, b = halves; silu(a) * b with activate_left, else a * silu(b)),
    then per-row-group smooth_scales (and offsets, static mode) and int8 quantization.
    quant_mode 0 (static): round(y * s + o); 1 (dynamic): scale = 127 / max|y * s| per row,
    round(y * s * scale), returning scale (float32). group_index: group ends (type 0) or sizes
    (type 1) along the rows, one smooth_scales row each."""
    name = "npu_swiglu_quant"
    _check(quant_mode in (0, 1), f"{name}: quant_mode must be 0 (static) or 1 (dynamic), got {quant_mode}")
    _check(group_list_type in (0, 1), f"{name}: group_list_type must be 0 (cumsum) or 1 (count), got {group_list_type}")
    _check(dst_type in (None, torch.int8), f"{name}: only dst_type=torch.int8 is simulated, got {dst_type}")
    _check(x.size(-1) % 2 == 0, f"{name}: the last dimension of x must be even, got {x.size(-1)}")
    a, b = x.float().chunk(2, -1)
    y = F.silu(a) * b if activate_left else a * F.silu(b)
    if group_index is not None:
        group = _group_rows(group_index, y.size(0), group_list_type == 0, name)
        covered = group.numel()
        s = torch.ones_like(y)
        o = torch.zeros_like(y)
        if smooth_scales is not None:
            s[:covered] = smooth_scales.float()[group]
        if offsets is not None and quant_mode == 0:
            o[:covered] = offsets.float()[group]
        y = y * s + o
    else:
        if smooth_scales is not None:
            y = y * smooth_scales.float()
        if offsets is not None and quant_mode == 0:
            y = y + offsets.float()
    if quant_mode == 1:
        scale = 127.0 / y.abs().amax(-1)
        y = y * scale.unsqueeze(-1)
    else:
        scale = x.new_empty(0, dtype=torch.float32)
    return torch.round(y).clamp(-128, 127).to(torch.int8), scale


@_op("npu_mrope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, *, "
     "int[]? mrope_section=None, str? rotary_mode='half', str? cache_mode='default') -> (Tensor, Tensor)")
def _npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
               cache_mode="default"):
    """vLLM's (M)RoPE with a cos/sin cache [max_pos, rotary_dim] (cos | sin halves) on query
    [T, heads * head_size] and key: the first rotary_dim channels of each head rotate, the rest
    pass. positions [T]: plain RoPE; [m, T] (m = len(mrope_section), 3 or 4): MRoPE, the
    cos/sin halves assembled from the m position rows -- 'default': consecutive sections
    (section i from row i); 'interleave': channel c from row c % 3 for c < 3 * mrope_section[1],
    else row 0. rotary_mode 'half' (NeoX: halves) or 'interleave' (GPT-J: even/odd pairs)."""
    name = "npu_mrope"
    mode = {"half": "half", "interleave": "interleave", "interleaved": "interleave"}.get(rotary_mode or "half")
    _check(mode is not None, f"{name}: rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    _check(cache_mode in (None, "default", "interleave"),
           f"{name}: cache_mode only support default or interleave (torch_npu's wording), got {cache_mode!r}")
    rotary_dim = cos_sin_cache.size(-1)
    half = rotary_dim // 2
    _check(rotary_dim % 2 == 0 and rotary_dim <= head_size,
           f"{name}: cos_sin_cache's last dimension ({rotary_dim}) must be even and <= head_size ({head_size})")
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, -1)  # [T, half] or [m, T, half]
    if positions.dim() == 2:
        m = positions.size(0)
        _check(mrope_section is not None and len(mrope_section) == m,
               f"{name}: 2-D positions [{m}, T] need mrope_section with {m} entries, got {mrope_section}")
        if cache_mode == "interleave":
            rows = torch.zeros(half, dtype=torch.long, device=cos.device)
            for r in (1, 2):
                rows[r:mrope_section[1] * 3:3] = r
        else:
            _check(sum(mrope_section) == half, f"{name}: mrope_section must sum to rotary_dim / 2 = {half}, "
                                               f"got {list(mrope_section)}")
            rows = torch.repeat_interleave(torch.arange(m, device=cos.device),
                                           torch.tensor(list(mrope_section), device=cos.device))
        channel = torch.arange(half, device=cos.device)
        cos, sin = cos[rows, :, channel].t(), sin[rows, :, channel].t()  # [T, half]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)

    def rotate(x):
        shaped = x.reshape(x.size(0), -1, head_size).float()
        rot, rest = shaped[..., :rotary_dim], shaped[..., rotary_dim:]
        x1, x2 = rot.chunk(2, -1) if mode == "half" else (rot[..., ::2], rot[..., 1::2])
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        rot = torch.cat((o1, o2), -1) if mode == "half" else torch.stack((o1, o2), -1).flatten(-2)
        return torch.cat((rot, rest), -1).reshape(x.shape).to(x.dtype)
    return rotate(query), rotate(key)




# round_mode codes 0..4: rint, round (numpy's: also half to even), floor, ceil, trunc
_ROUND_CODES = (torch.round, torch.round, torch.floor, torch.ceil, torch.trunc)


def _group_rows(group_index, rows, cumulative, name):
    """Group id of each of the first sum(sizes) rows for group sizes (or cumulative ends)."""
    sizes = group_index.long().reshape(-1)
    if cumulative:
        sizes = torch.diff(sizes, prepend=sizes.new_zeros(1))
    covered = int(sizes.sum())
    _check(covered <= rows and bool((sizes >= 0).all()),
           f"{name}: group_index must describe non-negative groups covering at most {rows} rows, got "
           f"{group_index.tolist()}")
    return torch.repeat_interleave(torch.arange(sizes.numel(), device=group_index.device), sizes,
                                   output_size=covered)


@_op("npu_dequant_swiglu_quant(Tensor x, *, Tensor? weight_scale=None, Tensor? activation_scale=None, "
     "Tensor? bias=None, Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? group_index=None, "
     "bool activate_left=False, int quant_mode=0, int? dst_type=None, int? round_mode=None, int? activate_dim=None, "
     "int swiglu_mode=0, float clamp_limit=7.0, float glu_alpha=1.702, float glu_bias=1.0) -> (Tensor, Tensor)")
def _npu_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
                              quant_offset=None, group_index=None, activate_left=False, quant_mode=0, dst_type=None,
                              round_mode=None, activate_dim=None, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702,
                              glu_bias=1.0):
    """x [..., 2H] (int32 matmul accumulators, or float) split into row groups (group_index:
    sizes; default one group). int32 x: (x + int32 bias[g]) * weight_scale[g] * activation_scale
    [row] (+ float bias). SwiGLU of (a, b) = the (left, right) halves if activate_left, else
    (right, left), or (even, odd) channels for swiglu_mode 1: mode 0: silu(a) * b; modes 1 and
    2 (clamped GLU): a = min(a, clamp_limit), b = clamp(b, +-clamp_limit),
    a * sigmoid(glu_alpha * a) * (b + glu_bias).
    Quantization to int8: static (0): y / quant_scale[g] + quant_offset[g], scale output 0;
    dynamic (1): y * quant_scale[g], then per row y * 127 / max|y|, scale output max|y| / 127.
    round_mode 0..4: rint, round, floor, ceil, trunc. Rows past the groups give 0."""
    name = "npu_dequant_swiglu_quant"
    _check(quant_mode in (0, 1), f"{name}: quant_mode must be 0 (static) or 1 (dynamic), got {quant_mode}")
    _check(swiglu_mode in (0, 1, 2), f"{name}: swiglu_mode must be 0, 1 or 2, got {swiglu_mode}")
    _check(activate_dim in (None, -1, x.dim() - 1), f"{name}: only activate_dim=-1 is supported, got {activate_dim}")
    _int8_only(name, "dst_type", dst_type)
    _check(round_mode in (None, 0, 1, 2, 3, 4), f"{name}: round_mode must be 0..4, got {round_mode}")
    round_fn = _ROUND_CODES[round_mode or 0]
    width = x.size(-1)
    _check(width % 2 == 0, f"{name}: the last dimension of x must be even, got {width}")
    x2 = x.reshape(-1, width)
    rows = x2.size(0)
    g = (_group_rows(group_index, rows, False, name) if group_index is not None
         else torch.zeros(rows, dtype=torch.long, device=x.device))
    covered = g.numel()

    def per_group(t):  # 1-D tensors apply to every group
        t = t.float()
        return t.reshape(1, -1)[torch.zeros_like(g)] if t.dim() == 1 else t[g]

    res = x2[:covered]
    if x.dtype == torch.int32:
        if bias is not None and bias.dtype == torch.int32:
            res = res + per_group(bias).to(torch.int32)
        res = res.float()
        if weight_scale is not None:
            res = res * per_group(weight_scale)
        if activation_scale is not None:
            res = res * activation_scale.float().reshape(-1, 1)[:covered]
        if bias is not None and bias.dtype != torch.int32:
            res = res + bias.float()
    else:
        res = res.float()
    if swiglu_mode == 1:
        a, b = res[:, ::2], res[:, 1::2]
    else:
        left, right = res.chunk(2, -1)
        a, b = (left, right) if activate_left else (right, left)
    if swiglu_mode == 0:
        y = F.silu(a) * b
    else:  # the clamped GLU variant
        a, b = a.clamp(max=clamp_limit), b.clamp(-clamp_limit, clamp_limit)
        y = a * torch.sigmoid(glu_alpha * a) * (b + glu_bias)
    scale = torch.zeros(covered, device=x.device)
    if quant_mode == 0:
        if quant_scale is not None:
            y = y / (quant_scale.float()[g].unsqueeze(-1) if quant_scale.dim() == 1 else quant_scale.float()[g])
        if quant_offset is not None:
            y = y + (quant_offset.float()[g].unsqueeze(-1) if quant_offset.dim() == 1 else quant_offset.float()[g])
    else:
        if quant_scale is not None:
            y = y * per_group(quant_scale)
        amax = y.abs().amax(-1)
        scale = amax / 127.0
        y = y * (127.0 / amax).unsqueeze(-1)
    out = torch.zeros(rows, width // 2, dtype=torch.int8, device=x.device)
    out[:covered] = round_fn(y.clamp(-128, 127)).to(torch.int8)
    scales = torch.zeros(rows, device=x.device)
    scales[:covered] = scale
    return out.view(x.shape[:-1] + (width // 2,)), scales.view(x.shape[:-1])


@_op("npu_quant_scatter(Tensor self, Tensor indices, Tensor updates, Tensor quant_scales, "
     "Tensor? quant_zero_points=None, int axis=-2, int quant_axis=-1, str reduce='update', int? dst_type=None, "
     "str? round_mode='rint') -> Tensor")
def _npu_quant_scatter(self, indices, updates, quant_scales, quant_zero_points=None, axis=-2, quant_axis=-1,
                       reduce="update", dst_type=None, round_mode="rint"):
    return _npu_quant_scatter_(self.clone(), indices, updates, quant_scales, quant_zero_points, axis, quant_axis,
                               reduce, dst_type, round_mode)


@_op("npu_quant_scatter_(Tensor(a!) self, Tensor indices, Tensor updates, Tensor quant_scales, "
     "Tensor? quant_zero_points=None, int axis=-2, int quant_axis=-1, str reduce='update', int? dst_type=None, "
     "str? round_mode='rint') -> Tensor(a!)")
def _npu_quant_scatter_(self, indices, updates, quant_scales, quant_zero_points=None, axis=-2, quant_axis=-1,
                        reduce="update", dst_type=None, round_mode="rint"):
    """scatter_update_ of int8 self with updates quantized per channel of the last dimension:
    round(updates / quant_scales + quant_zero_points), saturated to int8."""
    name = "npu_quant_scatter"
    _check(reduce == "update", f"{name}: reduce must be 'update', got {reduce!r}")
    _check(quant_axis in (-1, updates.dim() - 1), f"{name}: only quant_axis=-1 is supported, got {quant_axis}")
    _check(round_mode in (None, "rint"), f"{name}: only round_mode='rint' is supported, got {round_mode!r}")
    _check(self.dtype == torch.int8, f"{name}: self must be int8, got {self.dtype}")
    _int8_only(name, "dst_type", dst_type)
    channels = updates.size(-1)
    _check(quant_scales.numel() == channels, f"{name}: quant_scales must hold one scale per channel of the last "
                                             f"dimension ({channels}), got {quant_scales.numel()}")
    zero = None if quant_zero_points is None else quant_zero_points.reshape(channels)
    quantized = _quantize_int8(updates.float(), quant_scales.reshape(channels), zero, True, name)
    return _scatter_update_(self, indices, quantized, axis)


def _int8_matmul(a, b):
    """Exact int32 product of int8 matrices (the cube unit's int32 accumulation): float32 matmuls
    over K-chunks of 1024, whose sums (|.| <= 1024 * 2^14 = 2^24) float32 holds exactly."""
    out = None
    for k in range(0, a.size(-1), 1024):
        part = (a[..., k:k + 1024].float() @ b[k:k + 1024].float()).to(torch.int32)
        out = part if out is None else out + part
    return out if out is not None else a.new_zeros(a.shape[:-1] + b.shape[-1:], dtype=torch.int32)


@_op("npu_grouped_matmul_finalize_routing(Tensor x, Tensor w, Tensor group_list, *, Tensor? scale=None, "
     "Tensor? bias=None, Tensor? offset=None, Tensor? pertoken_scale=None, Tensor? shared_input=None, "
     "Tensor? logit=None, Tensor? row_index=None, ScalarType? dtype=None, float? shared_input_weight=1.0, "
     "int? shared_input_offset=0, int? output_bs=0, int? group_list_type=1, int[]? tuning_config=None, "
     "int? x_dtype=None, int? w_dtype=None, int? scale_dtype=None, int? pertoken_scale_dtype=None) -> Tensor")
def _npu_grouped_matmul_finalize_routing(x, w, group_list, *, scale=None, bias=None, offset=None, pertoken_scale=None,
                                         shared_input=None, logit=None, row_index=None, dtype=None,
                                         shared_input_weight=1.0, shared_input_offset=0, output_bs=0,
                                         group_list_type=1, tuning_config=None, x_dtype=None, w_dtype=None,
                                         scale_dtype=None, pertoken_scale_dtype=None):
    """MoE expert FFN output + combine: the rows of x [M, K] split into groups by group_list
    (sizes, or cumulative ends with group_list_type 0); group e's rows times w[e] ([E, K, N]; int8
    products accumulate exactly) times scale[e] (per output channel) and pertoken_scale[row],
    plus bias[e]; each row then times logit[row] and summed into output row row_index[row];
    shared_input (times shared_input_weight) is added to rows shared_input_offset.... Output
    float32 [output_bs (or max(row_index) + 1), N]."""
    name = "npu_grouped_matmul_finalize_routing"
    _check(dtype in (None, torch.float32), f"{name}: dtype must be torch.float32, got {dtype}")
    _check(x_dtype is None and w_dtype is None and offset is None,
           f"{name}: only int8 (A8W8) and floating x / w are simulated (no x_dtype, w_dtype or offset)")
    _check(x.dim() == 2 and w.dim() == 3 and w.size(1) == x.size(1),
           f"{name}: x must be [M, K] and w [E, K, N], got {list(x.shape)} and {list(w.shape)}")
    _check(group_list_type in (0, 1, None), f"{name}: group_list_type must be 0 (cumsum) or 1 (count), "
                                            f"got {group_list_type}")
    _check(group_list.numel() == w.size(0), f"{name}: group_list must have one entry per expert ({w.size(0)}), "
                                            f"got {group_list.numel()}")
    m = x.size(0)
    g = _group_rows(group_list, m, group_list_type == 0, name)
    rows = g.numel()
    sizes = torch.bincount(g, minlength=w.size(0)).tolist()
    matmul = _int8_matmul if x.dtype == torch.int8 else (lambda a, b: a.float() @ b.float())
    prod = torch.cat([matmul(part, w[e]) for e, part in enumerate(x[:rows].split(sizes))]).float()
    if scale is not None:
        prod = prod * scale.float().reshape(w.size(0), -1)[g]
    if pertoken_scale is not None:
        prod = prod * pertoken_scale.float().reshape(-1)[:rows].unsqueeze(-1)
    if bias is not None:
        prod = prod + bias.float().reshape(w.size(0), -1)[g]
    if logit is not None:
        prod = prod * logit.float().reshape(-1)[:rows].unsqueeze(-1)
    target = (row_index.long().reshape(-1)[:rows] if row_index is not None
              else torch.arange(rows, device=x.device))
    batch = output_bs if output_bs else (int(target.max()) + 1 if rows else 0)
    out = torch.zeros(batch, w.size(-1), device=x.device)
    out.index_add_(0, target, prod)
    if shared_input is not None:
        start = shared_input_offset or 0
        out[start:start + shared_input.size(0)] += shared_input_weight * shared_input.float()
    return out


def _grouped_matmul_add(name, y, x, weight, group_list, transpose_x, transpose_weight, group_type,
                        group_list_type):
    """sum over each group's rows of x^T . weight, [G, K1, N] (the MoE weight gradient)."""
    _check(transpose_x and not transpose_weight and group_type == 2,
           f"{name}: only transpose_x=True, transpose_weight=False, group_type=2 (groups along the summed "
           f"dim M) is supported, as on Atlas A2/A3; got transpose_x={transpose_x}, "
           f"transpose_weight={transpose_weight}, group_type={group_type}")
    _check(group_list_type in (0, 1, None), f"{name}: group_list_type must be 0 (cumsum) or 1 (count), "
                                            f"got {group_list_type}")
    _check(x.dim() == 2 and weight.dim() == 2 and x.size(0) == weight.size(0),
           f"{name}: x must be [M, K] and weight [M, N] with the same M, got {list(x.shape)} and "
           f"{list(weight.shape)}")
    _check(x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype and y.dtype == torch.float32,
           f"{name}: x and weight must be float16 or bfloat16 (alike) and y float32, got {x.dtype}, "
           f"{weight.dtype} and {y.dtype}")
    groups = group_list.numel()
    _check(y.numel() == groups * x.size(1) * weight.size(1),
           f"{name}: y must hold {groups} groups of [{x.size(1)}, {weight.size(1)}], got {list(y.shape)}")
    g = _group_rows(group_list, x.size(0), group_list_type in (0, None), name)
    sizes = torch.bincount(g, minlength=groups).tolist()
    rows = g.numel()
    parts = [a.float().t() @ b.float() for a, b in zip(x[:rows].split(sizes), weight[:rows].split(sizes))]
    return torch.stack(parts).reshape(y.shape)


@_op("npu_grouped_matmul_add(Tensor self, Tensor x, Tensor weight, Tensor group_list, *, bool transpose_x=True, "
     "bool transpose_weight=False, int group_type=2, int? group_list_type=0) -> Tensor",
     keys=("CompositeExplicitAutograd",))
def _npu_grouped_matmul_add(self, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2,
                            group_list_type=0):
    """self + per group g: x[rows of g]^T . weight[rows of g] (float32 [G * K, N] or [G, K, N]); the
    rows of x [M, K] and weight [M, N] split by group_list (cumulative ends, or sizes with
    group_list_type 1)."""
    return self + _grouped_matmul_add("npu_grouped_matmul_add", self, x, weight, group_list, transpose_x,
                                      transpose_weight, group_type, group_list_type)


@_op("npu_grouped_matmul_add_(Tensor(a!) self, Tensor x, Tensor weight, Tensor group_list, *, "
     "bool transpose_x=True, bool transpose_weight=False, int group_type=2, int? group_list_type=0) -> Tensor(a!)",
     keys=("CompositeExplicitAutograd",))
def _npu_grouped_matmul_add_(self, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2,
                             group_list_type=0):
    """npu_grouped_matmul_add accumulated into self."""
    return self.add_(_grouped_matmul_add("npu_grouped_matmul_add_", self, x, weight, group_list, transpose_x,
                                         transpose_weight, group_type, group_list_type))


# (the group sizes are data: traced graphs see the result's geometry, self's)
_lib.impl("npu_grouped_matmul_add", lambda self, *args, **kwargs: torch.empty_like(self), "Meta")
_lib.impl("npu_grouped_matmul_add_", lambda self, *args, **kwargs: self, "Meta")


# ---- KV caches -------------------------------------------------------------------------------

def _scatter_paged(cache, tokens, slot_mapping, nz, name):
    """Writes token t into slot slot_mapping[t] (block slot // block_size, offset slot % block_size)
    of a paged cache: ND [blocks, block_size, ...] or NZ [blocks, C / c0, block_size, c0] (the
    token's C values in c0-wide rows). Negative slots are skipped."""
    slots = slot_mapping.reshape(-1).long()
    keep = slots >= 0
    slots, tokens = slots[keep], tokens[keep]
    block_size = cache.size(2) if nz else cache.size(1)
    blocks, offsets = slots // block_size, slots % block_size
    if nz:
        values = math.prod(tokens.shape[1:])
        _check(cache.dim() == 4 and values == cache.size(1) * cache.size(3),
               f"{name}: a PA_NZ cache must be [blocks, C / c0, block_size, c0] for tokens of C = {values} values, "
               f"got {list(cache.shape)}")
        cache[blocks, :, offsets, :] = tokens.reshape(tokens.size(0), cache.size(1), cache.size(3)).to(cache.dtype)
    else:
        cache[blocks, offsets] = tokens.reshape((tokens.size(0),) + tuple(cache.shape[2:])).to(cache.dtype)


def _check_pa_cache_mode(name, cache_mode, compress_lens, compress_seq_offsets, seq_lens):
    _check(cache_mode in (None, "Norm", "PA_NZ"), f"{name}: cache_mode must be 'Norm' or 'PA_NZ', got {cache_mode!r}")
    _check(compress_lens is None and compress_seq_offsets is None and seq_lens is None,
           f"{name}: compress_lens, compress_seq_offsets and seq_lens (compressed caches) are not simulated")
    return cache_mode == "PA_NZ"


@_op("npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
     "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, Tensor? seq_lens=None, "
     "str? cache_mode='PA_NZ') -> ()")
def _npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                             compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    """Paged-attention cache write: key[t] / value[t] ([T, heads, head_size]) go to slot
    slot_mapping[t] of key_cache / value_cache -- 'Norm': ND caches [blocks, block_size, heads,
    head_size]; 'PA_NZ': [blocks, heads * head_size / 16, block_size, 16]."""
    nz = _check_pa_cache_mode("npu_scatter_pa_kv_cache", cache_mode, compress_lens, compress_seq_offsets, seq_lens)
    _scatter_paged(key_cache, key, slot_mapping, nz, "npu_scatter_pa_kv_cache")
    _scatter_paged(value_cache, value, slot_mapping, nz, "npu_scatter_pa_kv_cache")


@_op("npu_scatter_pa_kv_cache_functional(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache, "
     "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, Tensor? seq_lens=None, "
     "str? cache_mode='PA_NZ') -> (Tensor, Tensor)")
def _npu_scatter_pa_kv_cache_functional(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                                        compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    """npu_scatter_pa_kv_cache on copies of the caches, which it returns."""
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    _npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, compress_lens=compress_lens,
                             compress_seq_offsets=compress_seq_offsets, seq_lens=seq_lens, cache_mode=cache_mode)
    return key_cache, value_cache



@_op("npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, Tensor k_cache, "
     "Tensor ckv_cache, *, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, "
     "Tensor? c_kv_offset=None, Tensor? v=None, float epsilon=1e-5, str cache_mode='Norm', bool is_output_kv=False) "
     "-> (Tensor, Tensor, Tensor, Tensor)")
def _npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                               c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                               cache_mode="Norm", is_output_kv=False):
    """DeepSeek MLA's KV path: kv [B, 1, S, 512 + 64] splits into c = kv[..., :512] and r =
    kv[..., 512:]; y = RMSNorm(c) * gamma (float); k = RoPE of r with its interleaved pairs
    regrouped as halves (npu_interleave_rope) with cos / sin [B, 1, S, 64]. k and y are written
    into k_cache / ckv_cache in place (as in torch_npu) -- 'Norm': caches [B, 1, L, *], row
    index[b, s] of batch b; 'PA' / 'PA_BNSD': caches [blocks, block_size, 1, *], global slot
    index[b * S + s]; negative indices are skipped. Returns (k_cache, ckv_cache, k, y), the last
    two empty unless is_output_kv."""
    name = "npu_kv_rmsnorm_rope_cache"
    _check(cache_mode in ("Norm", "PA", "PA_BNSD"), f"{name}: cache_mode must be 'Norm', 'PA' or 'PA_BNSD' "
                                                    f"(the NZ / block modes are not simulated), got {cache_mode!r}")
    _check(k_rope_scale is None and c_kv_scale is None and k_rope_offset is None and c_kv_offset is None and v is None,
           f"{name}: quantized caches (k_rope_scale, c_kv_scale, offsets) and v are not simulated")
    rms = gamma.numel()
    _check(kv.dim() == 4 and kv.size(1) == 1 and kv.size(-1) > rms,
           f"{name}: kv must be [B, 1, S, {rms} + rope_size], got {list(kv.shape)}")
    c = kv[..., :rms].float()
    y = (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.float()).to(kv.dtype)
    k = _npu_interleave_rope(kv[..., rms:].float(), cos.float(), sin.float()).to(kv.dtype)
    b, _, s, _ = kv.shape
    if cache_mode == "Norm":
        _check(index.shape == (b, s), f"{name}: Norm mode needs index [B, S] = [{b}, {s}], got {list(index.shape)}")
        batch = torch.arange(b, device=kv.device).unsqueeze(1).expand(b, s)
        keep = index >= 0
        rows, pos = batch[keep], index[keep].long()
        k_cache[rows, 0, pos] = k[:, 0][keep].to(k_cache.dtype)
        ckv_cache[rows, 0, pos] = y[:, 0][keep].to(ckv_cache.dtype)
    else:
        slots = index.reshape(-1).long()
        _check(slots.numel() == b * s, f"{name}: PA modes need index [B * S] = [{b * s}], got {list(index.shape)}")
        keep = slots >= 0
        k_cache.view(-1, k_cache.size(-1))[slots[keep]] = k.reshape(-1, k.size(-1))[keep].to(k_cache.dtype)
        ckv_cache.view(-1, ckv_cache.size(-1))[slots[keep]] = y.reshape(-1, rms)[keep].to(ckv_cache.dtype)
    if not is_output_kv:
        k, y = kv.new_empty(0), kv.new_empty(0)
    return k_cache, ckv_cache, k, y


# ---- detection helpers -------------------------------------------------------------------------

@_op("npu_grid_assign_positive(Tensor self, Tensor overlaps, Tensor box_responsible_flags, Tensor max_overlaps, "
     "Tensor argmax_overlaps, Tensor gt_max_overlaps, Tensor gt_argmax_overlaps, int num_gts, float pos_iou_thr, "
     "float min_pos_iou, bool gt_max_assign_all) -> Tensor")
def _npu_grid_assign_positive(self, overlaps, box_responsible_flags, max_overlaps, argmax_overlaps, gt_max_overlaps,
                              gt_argmax_overlaps, num_gts, pos_iou_thr, min_pos_iou, gt_max_assign_all):
    """mmdetection's GridAssigner positive step on assigned gt indices self [n] (overlaps [k, n]):
    responsible boxes with max_overlaps > pos_iou_thr get argmax_overlaps + 1; then each gt i
    (in order, later ones win) whose gt_max_overlaps[i] > min_pos_iou gets i + 1 at the
    responsible boxes of overlap equal to it (gt_max_assign_all) or at gt_argmax_overlaps[i]."""
    _check(overlaps.dim() == 2 and overlaps.size(1) == self.numel(),
           f"npu_grid_assign_positive: overlaps must be [gts, {self.numel()}], got {list(overlaps.shape)}")
    flags = box_responsible_flags.bool()
    out = torch.where((max_overlaps > pos_iou_thr) & flags, argmax_overlaps.to(self.dtype) + 1, self)
    gts = min(int(num_gts), overlaps.size(0))
    if gts == 0:
        return out
    if gt_max_assign_all:
        hit = overlaps[:gts] == gt_max_overlaps[:gts].unsqueeze(1)
    else:
        hit = F.one_hot(gt_argmax_overlaps[:gts].long(), self.numel()).bool()
    hit = hit & flags & (gt_max_overlaps[:gts] > min_pos_iou).unsqueeze(1)
    # the last gt claiming a box wins: its 1-based index is the column maximum
    ids = torch.arange(1, gts + 1, device=self.device).unsqueeze(1)
    winner = (hit * ids).amax(0)
    return torch.where(winner > 0, winner.to(self.dtype), out)


@_op("npu_yolo_boxes_encode(Tensor self, Tensor gt_bboxes, Tensor stride, bool performance_mode=False) -> Tensor")
def _npu_yolo_boxes_encode(self, gt_bboxes, stride, performance_mode=False):
    """mmdetection's YOLOBBoxCoder.encode of gt_bboxes against anchors self, both [N, 4]
    (x1, y1, x2, y2), stride [N]: centre offsets (gt - anchor) / stride + 0.5 clamped to
    [eps, 1 - eps] and log(gt size / anchor size) (ratio clamped >= eps), eps = 1e-6."""
    _check(self.dim() == 2 and self.size(1) == 4 and gt_bboxes.shape == self.shape,
           f"npu_yolo_boxes_encode: anchors and gt_bboxes must both be [N, 4], got {list(self.shape)} and "
           f"{list(gt_bboxes.shape)}")
    eps = 1e-6
    a, g = self.float(), gt_bboxes.float()
    s = stride.float()
    aw, ah = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
    gw, gh = g[:, 2] - g[:, 0], g[:, 3] - g[:, 1]
    dx = ((g[:, 0] + g[:, 2] - a[:, 0] - a[:, 2]) * 0.5 / s + 0.5).clamp(eps, 1 - eps)
    dy = ((g[:, 1] + g[:, 3] - a[:, 1] - a[:, 3]) * 0.5 / s + 0.5).clamp(eps, 1 - eps)
    dw = torch.log((gw / aw).clamp(min=eps))
    dh = torch.log((gh / ah).clamp(min=eps))
    return torch.stack([dx, dy, dw, dh], -1).to(self.dtype)


def _rotated_boxes(boxes, name, arg):
    """[B, 5, N] boxes (x1, y1, x2, y2, angle in degrees) as float centre, size and angle rows."""
    _check(boxes.dim() == 3 and boxes.size(1) == 5, f"{name}: {arg} must be [B, 5, N] boxes "
                                                    f"(x1, y1, x2, y2, angle), got {list(boxes.shape)}")
    x1, y1, x2, y2, angle = boxes.float().unbind(1)
    return (x1 + x2) * 0.5, (y1 + y2) * 0.5, x2 - x1, y2 - y1, angle


@_op("npu_rotated_box_encode(Tensor self, Tensor gt_bboxes, Tensor weight) -> Tensor")
def _npu_rotated_box_encode(self, gt_bboxes, weight):
    """Deltas of rotated gt boxes relative to anchors, both [B, 5, N] (x1, y1, x2, y2, angle in
    degrees): (dx, dy) = centre offset / anchor (w, h), (dw, dh) = log(gt size / anchor size),
    da = tan(gt angle) - tan(anchor angle); each times its weight [5]."""
    ax, ay, aw, ah, aa = _rotated_boxes(self, "npu_rotated_box_encode", "self")
    gx, gy, gw, gh, ga = _rotated_boxes(gt_bboxes, "npu_rotated_box_encode", "gt_bboxes")
    deltas = torch.stack([(gx - ax) / aw, (gy - ay) / ah, torch.log(gw / aw), torch.log(gh / ah),
                          torch.tan(torch.deg2rad(ga)) - torch.tan(torch.deg2rad(aa))], 1)
    return (deltas * weight.float().reshape(1, 5, 1)).to(self.dtype)


@_op("npu_rotated_box_decode(Tensor self, Tensor deltas, Tensor weight) -> Tensor")
def _npu_rotated_box_decode(self, deltas, weight):
    """Inverse of npu_rotated_box_encode: boxes [B, 5, N] (x1, y1, x2, y2, angle in degrees) from
    anchors and deltas (divided by weight [5]); angle = atan(tan(anchor angle) + da)."""
    ax, ay, aw, ah, aa = _rotated_boxes(self, "npu_rotated_box_decode", "self")
    _check(deltas.shape == self.shape, f"npu_rotated_box_decode: deltas must match the anchors' shape "
                                       f"{list(self.shape)}, got {list(deltas.shape)}")
    dx, dy, dw, dh, da = (deltas.float() / weight.float().reshape(1, 5, 1)).unbind(1)
    cx, cy = ax + dx * aw, ay + dy * ah
    w, h = aw * torch.exp(dw), ah * torch.exp(dh)
    angle = torch.rad2deg(torch.atan(torch.tan(torch.deg2rad(aa)) + da))
    return torch.stack([cx - w * 0.5, cy - h * 0.5, cx + w * 0.5, cy + h * 0.5, angle], 1).to(self.dtype)


def _rotated_corners(boxes, trans):
    """Corners [..., 4, 2] (counter-clockwise) of rotated boxes [..., 5]: (x_centre, y_centre, w, h,
    angle) or, with trans, (x1, y1, x2, y2, angle); angles in degrees."""
    if trans:
        x1, y1, x2, y2, angle = boxes.unbind(-1)
        x, y, w, h = (x1 + x2) * 0.5, (y1 + y2) * 0.5, x2 - x1, y2 - y1
    else:
        x, y, w, h, angle = boxes.unbind(-1)
    theta = torch.deg2rad(angle)
    cos, sin = torch.cos(theta), torch.sin(theta)
    half = torch.tensor([[-0.5, -0.5], [0.5, -0.5], [0.5, 0.5], [-0.5, 0.5]], dtype=boxes.dtype, device=boxes.device)
    dx, dy = half[:, 0] * w[..., None], half[:, 1] * h[..., None]
    return torch.stack([x[..., None] + cos[..., None] * dx - sin[..., None] * dy,
                        y[..., None] + sin[..., None] * dx + cos[..., None] * dy], -1)


def _cross(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points, corners, eps):
    """Whether points [..., P, 2] lie in the convex quadrilaterals corners [..., 4, 2] (ccw)."""
    edges = corners.roll(-1, -2) - corners
    rel = points[..., :, None, :] - corners[..., None, :, :]
    return (_cross(edges[..., None, :, :], rel) >= -eps).all(-1)


def _convex_intersection_area(a, b):
    """Areas of the intersections of convex quadrilaterals a and b [..., 4, 2] (ccw corners): the
    intersection polygon's vertices are the corners of each inside the other and the crossings of
    their edges; ordered by angle around their mean, the shoelace formula gives the area."""
    scale = torch.maximum(a.abs().amax((-1, -2)), b.abs().amax((-1, -2))).clamp_min(1.0)
    eps = 1e-6 * scale[..., None, None] ** 2
    in_a = _inside(b, a, eps)  # b's corners inside a
    in_b = _inside(a, b, eps)
    # edge i of a (p + t r) against edge j of b (q + u s)
    p, r = a[..., :, None, :], (a.roll(-1, -2) - a)[..., :, None, :]
    q, s = b[..., None, :, :], (b.roll(-1, -2) - b)[..., None, :, :]
    denom = _cross(r, s)
    parallel = denom.abs() <= 1e-12 * scale[..., None, None] ** 2
    safe = torch.where(parallel, torch.ones_like(denom), denom)
    t = _cross(q - p, s) / safe
    u = _cross(q - p, r) / safe
    hit = ~parallel & (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)
    crossings = (p + t[..., None] * r).flatten(-3, -2)
    points = torch.cat([a, b, crossings], -2)
    valid = torch.cat([in_b, in_a, hit.flatten(-2)], -1)
    return _convex_hull_area(points, valid)


def _convex_hull_area(points, valid):
    """Area of the convex polygon whose vertices are the valid ones of points [..., P, 2] (valid
    [..., P]; duplicates allowed): the vertices ordered by angle around their mean, then the
    shoelace formula; fewer than 3 vertices give 0."""
    count = valid.sum(-1, keepdim=True)
    weights = valid.to(points.dtype)[..., None]
    centre = (points * weights).sum(-2) / count.clamp_min(1)
    rel = points - centre[..., None, :]
    angle = torch.atan2(rel[..., 1], rel[..., 0]).masked_fill(~valid, float("inf"))
    order = angle.argsort(-1)
    rel = rel.gather(-2, order[..., None].expand_as(rel))
    ordered_valid = valid.gather(-1, order)
    # invalid points (sorted last) collapse onto the first vertex and add no area
    rel = torch.where(ordered_valid[..., None], rel, rel[..., :1, :])
    area = 0.5 * _cross(rel, rel.roll(-1, -2)).sum(-1)
    return torch.where(count.squeeze(-1) >= 3, area.abs(), torch.zeros_like(area))


def _check_rotated_box_sets(name, boxes, query_boxes, dims_message):
    """boxes [B, N, 5] and query_boxes [B, K, 5] of the same batch B."""
    shapes = f"self {list(boxes.shape)} and query_boxes {list(query_boxes.shape)}"
    _check(boxes.dim() == 3 and query_boxes.dim() == 3, f"{name}: {dims_message} (got {shapes})")
    _check(boxes.size(-1) == 5 and query_boxes.size(-1) == 5 and boxes.size(0) == query_boxes.size(0),
           f"{name}: self [B, N, 5] and query_boxes [B, K, 5] must be rotated boxes of the same batch, got {shapes}")


@_op("npu_rotated_overlaps(Tensor self, Tensor query_boxes, bool trans=False) -> Tensor")
def _npu_rotated_overlaps(self, query_boxes, trans=False):
    """Overlap (intersection) areas of rotated boxes: self [B, N, 5] and query_boxes [B, K, 5], each
    box (x_centre, y_centre, w, h, angle) or, with trans, (x1, y1, x2, y2, angle), angles in degrees.
    Returns [B, N, K] in self's dtype, computed in float32 as CANN's RotatedOverlaps."""
    name = "npu_rotated_overlaps"
    _check_rotated_box_sets(name, self, query_boxes, "boxes' dim should be equal to query_boxes' ndimension() "
                                                     "and equal to 3!")
    a = _rotated_corners(self.float(), trans)[:, :, None]
    b = _rotated_corners(query_boxes.float(), trans)[:, None, :]
    a, b = torch.broadcast_tensors(a, b)
    return _convex_intersection_area(a, b).to(self.dtype)


def _rotated_box_points(a, b, v_threshold, e_threshold):
    """The candidate vertices [..., 24, 2] of the intersection of rectangles a and b [..., 4, 2]
    (corners in order) and which of them count, by CANN's RotatedIou tests:
    a corner P of one box counts when it projects onto the other's sides AB and AD (from its
    corner A) within [v_threshold, |side|^2 - v_threshold] (a positive v_threshold drops corners
    on or near the border, a negative one accepts corners just outside); two sides AB and CD
    cross when cross(AC, AD) * cross(BC, BD) < e_threshold and cross(CA, CB) * cross(DA, DB)
    < e_threshold (0: proper crossings only; a positive e_threshold accepts touching and
    nearly crossing sides), at the point where their lines meet."""
    def inside(points, box):
        ab, ad = box[..., 1, :] - box[..., 0, :], box[..., 3, :] - box[..., 0, :]
        ap = points - box[..., :1, :]
        along_ab = (ap * ab[..., None, :]).sum(-1)
        along_ad = (ap * ad[..., None, :]).sum(-1)
        ab_ab, ad_ad = (ab * ab).sum(-1)[..., None], (ad * ad).sum(-1)[..., None]
        return ((along_ab >= v_threshold) & (along_ab + v_threshold <= ab_ab)
                & (along_ad >= v_threshold) & (along_ad + v_threshold <= ad_ad))

    p1, p2 = a[..., :, None, :], a.roll(-1, -2)[..., :, None, :]  # side i of a
    q1, q2 = b[..., None, :, :], b.roll(-1, -2)[..., None, :, :]  # side j of b
    crosses = ((_cross(q1 - p1, q2 - p1) * _cross(q1 - p2, q2 - p2) < e_threshold)
               & (_cross(p1 - q1, p2 - q1) * _cross(p1 - q2, p2 - q2) < e_threshold))
    r, s = p2 - p1, q2 - q1
    denom = _cross(r, s)
    crosses = crosses & (denom != 0)  # parallel sides have no single meeting point
    t = _cross(q1 - p1, s) / torch.where(denom == 0, torch.ones_like(denom), denom)
    meets = (p1 + t[..., None] * r).flatten(-3, -2)
    points = torch.cat([a, b, meets], -2)
    valid = torch.cat([inside(a, b), inside(b, a), crosses.flatten(-2)], -1)
    return points, valid


@_op("npu_rotated_iou(Tensor self, Tensor query_boxes, bool trans=False, int mode=0, bool is_cross=True, "
     "float v_threshold=0.0, float e_threshold=0.0) -> Tensor")
def _npu_rotated_iou(self, query_boxes, trans=False, mode=0, is_cross=True, v_threshold=0.0, e_threshold=0.0):
    """IoU (mode 0) or IoF (mode 1: the intersection over the area of self's box) of rotated
    boxes: self [B, N, 5] and query_boxes [B, K, 5], each box (x_centre, y_centre, w, h, angle)
    or, with trans, (x1, y1, x2, y2, angle), angles in degrees. is_cross: every box of self
    against every query box, [B, N, K]; otherwise one-to-one (box n against query box n, N == K),
    [B, N]. v_threshold and e_threshold relax (negative / positive) or tighten the corner-inside
    and side-crossing tests that find the intersection polygon, as CANN's RotatedIou does.
    Computed in float32 as CANN's kernel (ratio = intersection / (denominator + 1e-6), 0 where
    the denominator is not positive); returned in self's dtype."""
    name = "npu_rotated_iou"
    _check_rotated_box_sets(name, self, query_boxes, "self and query_boxes must be 3-D ([B, N, 5] and [B, K, 5]),")
    _check(mode in (0, 1), f"{name}: mode must be 0 (iou) or 1 (iof), got {mode}")
    _check(is_cross or self.size(1) == query_boxes.size(1),
           f"{name}: is_cross=False pairs box n with query box n and needs as many of each, "
           f"got {self.size(1)} and {query_boxes.size(1)}")
    boxes, query = self.float(), query_boxes.float()
    a, b = _rotated_corners(boxes, trans), _rotated_corners(query, trans)
    area_a, area_b = _rotated_box_area(boxes, trans), _rotated_box_area(query, trans)
    if is_cross:
        a, b = torch.broadcast_tensors(a[:, :, None], b[:, None, :])
        area_a, area_b = area_a[:, :, None], area_b[:, None, :]
    inter = _convex_hull_area(*_rotated_box_points(a, b, float(v_threshold), float(e_threshold)))
    denom = area_a + area_b - inter if mode == 0 else area_a.expand_as(inter)
    ratio = torch.where(denom > 0, inter / (denom + 1e-6), torch.zeros_like(inter))
    return ratio.to(self.dtype)


def _rotated_box_area(boxes, trans):
    """w * h of rotated boxes [..., 5] ((x2 - x1) * (y2 - y1) with trans)."""
    if trans:
        return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    return boxes[..., 2] * boxes[..., 3]


def _greedy_nms(boxes, scores, iou_threshold, limit):
    """Indices (by descending score, ties to the lower index) of the boxes [n, 4] greedy NMS keeps:
    each box survives unless its IoU with a kept, higher-scored box exceeds iou_threshold."""
    order = torch.argsort(scores, descending=True, stable=True)
    b = boxes[order]
    lo, hi = torch.minimum(b[:, :2], b[:, 2:]), torch.maximum(b[:, :2], b[:, 2:])
    area = (hi - lo).prod(-1)
    inter = (torch.minimum(hi[:, None], hi[None]) - torch.maximum(lo[:, None], lo[None])).clamp(min=0).prod(-1)
    iou = inter / (area[:, None] + area[None] - inter).clamp_min(1e-12)
    over = (iou > iou_threshold).tolist()
    kept = []
    for i in range(len(over)):
        if len(kept) == limit:
            break
        if not any(over[i][j] for j in kept):
            kept.append(i)
    return order[kept]


@_op("npu_batch_nms(Tensor self, Tensor scores, float score_threshold, float iou_threshold, int max_size_per_class, "
     "int max_total_size, bool change_coordinate_frame=False, bool transpose_box=False) "
     "-> (Tensor, Tensor, Tensor, Tensor)")
def _npu_batch_nms(self, scores, score_threshold, iou_threshold, max_size_per_class, max_total_size,
                   change_coordinate_frame=False, transpose_box=False):
    """Combined multi-class NMS (TensorFlow's CombinedNonMaxSuppression without a clip window):
    boxes [B, N, q, 4] ([B, q, 4, N] with transpose_box; q = 1 shared or one per class), scores
    [B, N, C]. Per batch and class: boxes scoring > score_threshold, greedy NMS at iou_threshold,
    at most max_size_per_class; then the max_total_size best over the classes. Returns boxes
    [B, max_total_size, 4], scores and classes [B, max_total_size] (zero padded) and the counts
    [B] (int32)."""
    name = "npu_batch_nms"
    boxes = self.permute(0, 3, 1, 2) if transpose_box else self
    _check(boxes.dim() == 4 and boxes.size(-1) == 4 and scores.dim() == 3 and boxes.shape[:2] == scores.shape[:2]
           and boxes.size(2) in (1, scores.size(2)),
           f"{name}: expected boxes [B, N, q, 4] (q = 1 or classes) and scores [B, N, classes], got "
           f"{list(self.shape)} and {list(scores.shape)}")
    batch, classes = scores.size(0), scores.size(2)
    out_boxes = self.new_zeros(batch, max_total_size, 4)
    out_scores = scores.new_zeros(batch, max_total_size)
    out_classes = scores.new_zeros(batch, max_total_size)
    counts = torch.zeros(batch, dtype=torch.int32, device=self.device)
    for b in range(batch):
        found_boxes, found_scores, found_classes = [], [], []
        for c in range(classes):
            cb = boxes[b, :, c if boxes.size(2) > 1 else 0].float()
            cs = scores[b, :, c].float()
            candidates = (cs > score_threshold).nonzero().flatten()
            keep = candidates[_greedy_nms(cb[candidates], cs[candidates], iou_threshold, max_size_per_class)]
            found_boxes.append(cb[keep])
            found_scores.append(cs[keep])
            found_classes.append(torch.full((keep.numel(),), float(c), device=self.device))
        all_scores = torch.cat(found_scores)
        best = torch.argsort(all_scores, descending=True, stable=True)[:max_total_size]
        n = best.numel()
        out_boxes[b, :n] = torch.cat(found_boxes)[best].to(self.dtype)
        out_scores[b, :n] = all_scores[best].to(scores.dtype)
        out_classes[b, :n] = torch.cat(found_classes)[best].to(scores.dtype)
        counts[b] = n
    return out_boxes, out_scores, out_classes, counts


# ---- MC2: collective communication fused with a matmul ----------------------------------------

def _hccl_group(name: str, hcom: str):
    """The process group whose hccl communicator is named hcom (get_hccl_comm_name's value)."""
    import torch.distributed as dist
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL
    _check(dist.is_initialized(), f"{name}: no process group is initialized (hcom {hcom!r})")
    for pg in list(dist.distributed_c10d._world.pg_map):
        try:
            backend = pg._get_backend(torch.device("npu"))
        except RuntimeError:
            continue
        if isinstance(backend, ProcessGroupHCCL) and backend.get_hccl_comm_name(pg.rank(), init_comm=False) == hcom:
            return pg
    raise RuntimeError(f"{name}: no hccl process group has the communicator name {hcom!r} "
                       f"(see ProcessGroupHCCL.get_hccl_comm_name)")


@_op("npu_all_gather_base_mm(Tensor self, Tensor x2, str hcom, int world_size, *, Tensor? bias=None, "
     "Tensor? x1_scale=None, Tensor? x2_scale=None, int gather_index=0, bool gather_output=True, int comm_turn=0, "
     "ScalarType? output_dtype=None, str? comm_mode=None) -> (Tensor, Tensor)")
def _npu_all_gather_base_mm(self, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None, gather_index=0,
                            gather_output=True, comm_turn=0, output_dtype=None, comm_mode=None):
    """All-gather of self [m, k] over the hccl group named hcom (rows of rank 0 first), then the
    matmul with x2 [k, n] (+ bias): returns (output [m * world_size, n], the gathered self, or an
    empty tensor without gather_output). With x2_scale the matmul is npu_quant_matmul's (int8
    inputs; x2_scale per column, x1_scale per row, gathered with self), in output_dtype
    (default bfloat16; float16 for int64 scales)."""
    import torch.distributed as dist
    name = "npu_all_gather_base_mm"
    _check(world_size in (2, 4, 8, 16, 32),
           f"world_size should be in [2, 4, 8, 16, 32], but the actual value is {world_size}.")
    _check(self.dim() == 2 and x2.dim() == 2, f"Both inputs of mm are required to be 2D, but the actual inputs are "
                                              f"{self.dim()}D and {x2.dim()}D.")
    _check(self.size(1) == x2.size(0), f"The K-axis in the two inputs of Matmul must be equal, but in reality, the "
                                       f"K-axis of x1 is {self.size(1)} and the K-axis of x2 is {x2.size(0)}.")
    _check(gather_index == 0, f"{name}: gather_index must be 0 (self is gathered), got {gather_index}")
    mode = "ai_cpu" if comm_mode is None else comm_mode
    _check(mode in ("aiv", "ai_cpu"), f"{name}: comm_mode must be 'aiv' or 'ai_cpu', got {comm_mode!r}")
    _check(x2_scale is None or mode != "ai_cpu", "When comm_mode is ai_cpu, quantization not supported.")
    group = _hccl_group(name, hcom)
    _check(dist.get_world_size(group) == world_size,
           f"{name}: world_size is {world_size} but the group {hcom!r} has {dist.get_world_size(group)} ranks")
    gathered = self.new_empty(self.size(0) * world_size, self.size(1))
    dist.all_gather_into_tensor(gathered, self.contiguous(), group=group)
    if x2_scale is None:
        out = torch.matmul(gathered, x2)
        if bias is not None:
            out = out + bias
    else:
        pertoken = None
        if x1_scale is not None:
            pertoken = x1_scale.new_empty(x1_scale.size(0) * world_size, *x1_scale.shape[1:])
            dist.all_gather_into_tensor(pertoken, x1_scale.contiguous(), group=group)
            pertoken = pertoken.reshape(-1)
        dtype = torch.float16 if x2_scale.dtype == torch.int64 else (output_dtype or torch.bfloat16)
        out = torch.ops.npu.npu_quant_matmul(gathered, x2, x2_scale.reshape(-1), pertoken_scale=pertoken, bias=bias,
                                             output_dtype=dtype)
    return out, (gathered if gather_output else self.new_empty(0))


_MM_ALL_REDUCE = "npu_mm_all_reduce_base"


def _mm_all_reduce_plan(x1, x2, *, reduce_op, bias, antiquant_scale, antiquant_offset, x3, dequant_scale,
                        pertoken_scale, comm_quant_scale_1, comm_quant_scale_2, antiquant_group_size, comm_turn,
                        group_sizes, y_dtype, x1_dtype, x2_dtype, dequant_scale_dtype, pertoken_scale_dtype,
                        comm_quant_mode, comm_mode):
    """npu_mm_all_reduce_base's argument checks (op-plugin's, with its messages where it has
    them); returns (mode, output shape, output dtype), mode "mm", "weight_quant" or "quant"."""
    name = _MM_ALL_REDUCE
    for arg, value in (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype), ("y_dtype", y_dtype),
                       ("dequant_scale_dtype", dequant_scale_dtype), ("pertoken_scale_dtype", pertoken_scale_dtype)):
        # float8 / hifloat8 / float4 matmuls (aclnnQuantMatmulAllReduceV4/V5) are Ascend950 features
        if value is not None:
            raise NotImplementedError(f"{name}: {arg} (hifloat8 / float8 / float4 operands) needs an Ascend950; the "
                                      f"simulated device is an Ascend910B: pass None")
    if x1.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or x2.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise NotImplementedError(f"{name}: float8 x1 / x2 need an Ascend950; the simulated device is an Ascend910B "
                                  f"(got {x1.dtype} and {x2.dtype})")
    if group_sizes:
        raise NotImplementedError(f"{name}: group_sizes (per-block quantisation) needs an Ascend950; the simulated "
                                  f"device is an Ascend910B: pass None")
    if comm_quant_mode != 0:
        raise NotImplementedError(f"{name}: comm_quant_mode {comm_quant_mode} needs an Ascend950; the simulated device "
                                  f"is an Ascend910B: pass 0")
    _check(x2.dim() == 2, f"x2 needs to be 2D, but got: {x2.dim()}D")
    _check(x1.dim() in (2, 3), f"{name}: x1 must be 2-D [m, k] or 3-D [b, s, k], got {x1.dim()}D")
    _check(x1.size(-1) == x2.size(0), f"K of x1 and x2 should be same, but they are x1_k: {x1.size(-1)}, "
                                      f"x2_k: {x2.size(0)}")
    _check(reduce_op == "sum", f"{name}: reduce_op only supports 'sum', got {reduce_op!r}")
    _check(comm_turn == 0, f"{name}: comm_turn only supports 0 (the default split), got {comm_turn}")
    _check(comm_mode in (None, "aiv", "ai_cpu"), f"{name}: comm_mode must be 'aiv' or 'ai_cpu', got {comm_mode!r}")
    x1_int, x2_int = not x1.is_floating_point(), not x2.is_floating_point()
    k, n = x2.shape
    if x1_int and x2_int:
        mode = "quant"
        _check(x1.dtype == torch.int8, "x1 must be an int8 tensor for quant.")
        _check(x2.dtype == torch.int8, "x2 must be an int8 tensor for quant.")
        _check(antiquant_scale is None and antiquant_offset is None,
               "when both dtype of x1 and dtype of x2 are equal to int8, antiquantScale, antiquantOffset should both "
               "be null")
        _check(dequant_scale is not None, f"{name}: int8 x1 and x2 need dequant_scale")
    elif x2_int:
        mode = "weight_quant"
        _check(x2.dtype == torch.int8, "x2 must be an int8 tensor for weight quant.")
        _check(dequant_scale is None, "when only dtype of x2 is equal to int8, dequantScale should be null")
        _check(antiquant_scale is not None, f"{name}: an int8 x2 with a float x1 needs antiquant_scale")
    elif not x1_int:
        mode = "mm"
        _check(antiquant_scale is None and antiquant_offset is None and dequant_scale is None,
               "when neither dtype of x1 or dtype of x2 is equal to int8, antiquantScale, antiquantOffset and "
               "dequantScale should all be null")
        _check(x1.dtype == x2.dtype, f"{name}: x1 and x2 must have the same dtype, got {x1.dtype} and {x2.dtype}")
    else:
        raise RuntimeError("when neither dtype of x1 or dtype of x2 is valid. ")
    _check(mode == "quant" or x1.dtype in (torch.float16, torch.bfloat16),
           f"{name}: x1 must be float16, bfloat16 or int8, got {x1.dtype}")
    out_dtype = torch.float16 if x1_int else x1.dtype
    if dequant_scale is not None and dequant_scale.dtype == torch.bfloat16:
        out_dtype = torch.bfloat16
    out_shape = list(x1.shape[:-1]) + [n]
    if x3 is not None:
        _check(list(x3.shape) == out_shape, f"x3 with shape {list(x3.shape)} doesn't match the output shape {out_shape}")
        _check(x3.dtype == out_dtype, f"x3 with dtype {x3.dtype} doesn't match the output dtype {out_dtype}")
    if bias is not None:
        want = torch.int32 if mode == "quant" else x1.dtype
        _check(bias.dim() == 1 and bias.size(0) == n and bias.dtype == want,
               f"{name}: bias must be 1-D [n = {n}] of dtype {want}, got {bias.dtype} {list(bias.shape)}")
    if pertoken_scale is not None:
        _check(dequant_scale is not None, "when has pertoken_scale, dequantScale shoulden't be null")
        _check(pertoken_scale.dim() == 1,
               f"pertoken_scale with shape {list(pertoken_scale.shape)} pertoken_scale dim should be 1.")
        _check(pertoken_scale.size(0) == math.prod(x1.shape[:-1]),
               f"pertoken_scale with shape {list(pertoken_scale.shape)} doesn't match the input shape {list(x1.shape)}")
        _check(pertoken_scale.dtype == torch.float32, f"pertoken_scale with dtype {pertoken_scale.dtype} doesn't "
                                                      f"match the output dtype {torch.float32}")
    if dequant_scale is not None:
        _check(dequant_scale.dtype in (torch.int64, torch.bfloat16, torch.float32)
               and dequant_scale.numel() in (1, n) and dequant_scale.dim() in (1, 2),
               f"{name}: dequant_scale must be int64 (npu_trans_quant_param's), bfloat16 or float32 of shape [1], "
               f"[n = {n}] or [1, n], got {dequant_scale.dtype} {list(dequant_scale.shape)}")
    if antiquant_offset is not None:
        _check(antiquant_scale is not None and antiquant_offset.shape == antiquant_scale.shape
               and antiquant_offset.dtype == antiquant_scale.dtype,
               f"{name}: antiquant_offset must have antiquant_scale's dtype and shape")
    if mode == "weight_quant":
        _check(antiquant_scale.dtype == x1.dtype,
               f"{name}: antiquant_scale must have x1's dtype {x1.dtype}, got {antiquant_scale.dtype}")
        _check(antiquant_group_size == 0 or (antiquant_group_size % 32 == 0 and 32 <= antiquant_group_size < k),
               f"{name}: antiquant_group_size must be 0 (no groups) or a multiple of 32 in [32, k - 1 = {k - 1}], "
               f"got {antiquant_group_size}")
    else:
        _check(antiquant_group_size == 0, f"{name}: antiquant_group_size is for an int8 x2 with a float x1 "
                                          f"(weight quantisation), got {antiquant_group_size}")
    _check((comm_quant_scale_1 is None) == (comm_quant_scale_2 is None),
           "comm_quant_scale_1 and comm_quant_scale_2 should both be null or not null")
    if comm_quant_scale_1 is not None:
        _check(mode == "quant", f"{name}: comm_quant_scale_1 and comm_quant_scale_2 (int8 communication) are only "
                                f"supported with int8 x1 and x2")
        s1, s2 = comm_quant_scale_1, comm_quant_scale_2
        _check((s1.dim() == 2 and s2.dim() == 2) or (s1.dim() == 1 and s2.dim() == 1),
               f"comm_quant_scale_1 and comm_quant_scale_2 both need to be 1D or 2D, but got: comm_quant_scale_1"
               f"{s1.dim()}D, comm_quant_scale_2{s2.dim()}D")
        _check(list(s1.shape) == list(s2.shape) and list(s1.shape) in ([n], [1, n]),
               f"comm_quant_scale_1 and comm_quant_scale_2 shape do not match [1,n] or [n], n={n}, comm_quant_scale_1 "
               f"shape: {list(s1.shape)}, comm_quant_scale_2 shape: {list(s2.shape)}")
        _check(s1.dtype == out_dtype and s2.dtype == out_dtype,
               f"comm_quant_scale_1 with dtype {s1.dtype}comm_quant_scale_2 with dtype {s2.dtype} doesn't match the "
               f"output dtype {out_dtype}")
    return mode, out_shape, out_dtype


def _int8_round(x):
    return torch.round(x).clamp_(-128, 127)


@_op("npu_mm_all_reduce_base(Tensor x1, Tensor x2, str hcom, *, str reduce_op='sum', Tensor? bias=None, "
     "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? x3=None, Tensor? dequant_scale=None, "
     "Tensor? pertoken_scale=None, Tensor? comm_quant_scale_1=None, Tensor? comm_quant_scale_2=None, "
     "int antiquant_group_size=0, int comm_turn=0, int[]? group_sizes=None, int? y_dtype=None, int? x1_dtype=None, "
     "int? x2_dtype=None, int? dequant_scale_dtype=None, int? pertoken_scale_dtype=None, int comm_quant_mode=0, "
     "str? comm_mode=None) -> Tensor", keys=("PrivateUse1",))
def _npu_mm_all_reduce_base(x1, x2, hcom, **kwargs):
    """matmul of x1 [m, k] or [b, s, k] with x2 [k, n] on every rank, then the sum over the hccl
    group whose communicator hcom names (get_hccl_comm_name's value; 1, 2, 4 or 8 ranks):
    output = all_reduce(x1 @ x2' + bias + x3) ([m, n] / [b, s, n]); bias and x3 are added on every
    rank before the sum. x2' is x2 for float16 / bfloat16 x1 and x2 (same dtype); for a float x1
    with an int8 x2 (weight quantisation) (x2 + antiquant_offset) * antiquant_scale, the
    parameters per tensor [1], per column [n] / [1, n] or per group of antiquant_group_size rows
    [ceil(k / group), n] (npu_weight_quant_batchmatmul's); for int8 x1 and x2 the int32 products
    (+ int32 bias) times dequant_scale (int64 from npu_trans_quant_param, bfloat16 or float32;
    [1] or [n]) and pertoken_scale ([m], float32) (npu_quant_matmul's), in float16 (bfloat16
    with a bfloat16 dequant_scale). With comm_quant_scale_1 and comm_quant_scale_2 (int8 x1 and
    x2 only) the sum travels as int8: each rank's result / comm_quant_scale_1 rounded to int8,
    summed, times comm_quant_scale_1 / comm_quant_scale_2 rounded to int8, times
    comm_quant_scale_2. reduce_op is 'sum' and comm_turn 0 (the only values the kernel takes);
    comm_mode ('aiv' / 'ai_cpu') picks the communication engine and does not change the result.
    x1_dtype, x2_dtype, y_dtype, the scale dtypes, group_sizes and comm_quant_mode (hifloat8 /
    float8 / float4 operands, per-block scales) are Ascend950 features and raise on the simulated
    Ascend910B. Inputs are in float32 until the result, which is reduced in the output dtype."""
    import torch.distributed as dist
    args = dict(_MM_ALL_REDUCE_DEFAULTS, **kwargs)
    mode, out_shape, out_dtype = _mm_all_reduce_plan(x1, x2, **args)
    group = _hccl_group(_MM_ALL_REDUCE, hcom)
    world = dist.get_world_size(group)
    _check(world in (1, 2, 4, 8), f"{_MM_ALL_REDUCE}: the group {hcom!r} has {world} ranks; the kernel supports 1, 2, "
                                  f"4 or 8 (hccs full mesh)")
    bias, x3 = args["bias"], args["x3"]
    x = x1.reshape(-1, x1.size(-1))
    if mode == "quant":
        y = torch.ops.npu.npu_quant_matmul(x, x2, args["dequant_scale"].reshape(-1), bias=bias,
                                           pertoken_scale=args["pertoken_scale"], output_dtype=out_dtype).float()
    elif mode == "weight_quant":
        y = torch.ops.npu.npu_weight_quant_batchmatmul(x, x2, args["antiquant_scale"],
                                                       antiquant_offset=args["antiquant_offset"], bias=bias,
                                                       antiquant_group_size=args["antiquant_group_size"]).float()
    else:
        y = x.float() @ x2.float()
        if bias is not None:
            y = y + bias.float()
    y = y.reshape(out_shape)
    if x3 is not None:
        y = y + x3.float()
    if args["comm_quant_scale_1"] is None:
        out = y.to(out_dtype)
        dist.all_reduce(out, group=group)
        return out
    s1 = args["comm_quant_scale_1"].reshape(-1).float()
    s2 = args["comm_quant_scale_2"].reshape(-1).float()
    summed = _int8_round(y.to(out_dtype).float() / s1)  # int8 values, summed exactly in float32
    dist.all_reduce(summed, group=group)
    return (_int8_round(summed * (s1 / s2)) * s2).to(out_dtype)


_MM_ALL_REDUCE_DEFAULTS = dict(
    reduce_op="sum", bias=None, antiquant_scale=None, antiquant_offset=None, x3=None, dequant_scale=None,
    pertoken_scale=None, comm_quant_scale_1=None, comm_quant_scale_2=None, antiquant_group_size=0, comm_turn=0,
    group_sizes=None, y_dtype=None, x1_dtype=None, x2_dtype=None, dequant_scale_dtype=None, pertoken_scale_dtype=None,
    comm_quant_mode=0, comm_mode=None)


def _npu_mm_all_reduce_base_meta(x1, x2, hcom, **kwargs):
    """Shape and dtype of npu_mm_all_reduce_base without a process group (meta / fake tensors)."""
    _, out_shape, out_dtype = _mm_all_reduce_plan(x1, x2, **dict(_MM_ALL_REDUCE_DEFAULTS, **kwargs))
    return x1.new_empty(out_shape, dtype=out_dtype)


_lib.impl(_MM_ALL_REDUCE, _npu_mm_all_reduce_base_meta, "Meta")


# ---- optimizers ------------------------------------------------------------------------------

@_op("npu_bert_apply_adam(Scalar lr, Scalar beta1, Scalar beta2, Scalar epsilon, Tensor grad, Scalar max_grad_norm, "
     "Scalar global_grad_norm, Scalar weight_decay, Scalar? step_size=None, int adam_mode=0) "
     "-> (Tensor var, Tensor m, Tensor v)")
def _npu_bert_apply_adam_functional(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                                    step_size=None, adam_mode=0):
    # as op-plugin's: the update needs the state, which only the out= form takes
    raise RuntimeError("npu_bert_apply_adam is not implemented for Tensor: pass the state as out=(var, m, v)")


@_op("npu_bert_apply_adam.out(Scalar lr, Scalar beta1, Scalar beta2, Scalar epsilon, Tensor grad, Scalar max_grad_norm, "
     "Scalar global_grad_norm, Scalar weight_decay, Scalar? step_size=None, int adam_mode=0, *, Tensor(a!)[] out) "
     "-> (Tensor, Tensor, Tensor)")
def _npu_bert_apply_adam_out(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                             step_size=None, adam_mode=0, *, out):
    """One BERT Adam step in place on the state out=(var, m, v) (CANN's ApplyAdamV2), in var's dtype.
    The state is one ``Tensor[] out`` argument, as torch_npu registers operators with several
    outputs, so ``out=(var, m, v)`` works from Python and from torch.jit.script.
    adam_mode 0 ("adam"): grad /= global_grad_norm when max_grad_norm > 0 and global_grad_norm > 1;
    m = beta1 m + (1 - beta1) grad; v = beta2 v + (1 - beta2) grad^2; u = m / (sqrt(v) + epsilon)
    (+ weight_decay * var when weight_decay > 0); var -= lr * u.
    adam_mode 1 ("mbart_adam"): no clipping; u = step_size * m / (sqrt(v) + epsilon)
    (+ weight_decay * lr * var when weight_decay > 0); var -= u."""
    _check(len(out) == 3, f"npu_bert_apply_adam: out must hold the state (var, m, v), got {len(out)} tensors")
    var, m, v = out
    name = "npu_bert_apply_adam"
    _check(adam_mode in (0, 1), f"{name}: adam_mode must be 0 (adam) or 1 (mbart_adam), got {adam_mode}")
    _check(adam_mode == 0 or step_size is not None, f"{name}: adam_mode 1 (mbart_adam) needs step_size")
    _check(var.dtype in (torch.float16, torch.float32), f"{name}: var must be float16 or float32, got {var.dtype}")
    for arg, t in (("m", m), ("v", v), ("grad", grad)):
        _check(t.shape == var.shape and t.dtype == var.dtype,
               f"{name}: {arg} must have var's shape {list(var.shape)} and dtype {var.dtype}, "
               f"got {list(t.shape)} and {t.dtype}")
    lr, beta1, beta2, epsilon = float(lr), float(beta1), float(beta2), float(epsilon)
    weight_decay, global_grad_norm = float(weight_decay), float(global_grad_norm)
    g = grad
    if adam_mode == 0 and float(max_grad_norm) > 0 and global_grad_norm > 1:
        g = g / global_grad_norm
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    update = m / (v.sqrt() + epsilon)
    if adam_mode == 0:
        if weight_decay > 0:
            update = update + weight_decay * var
        var.sub_(update, alpha=lr)
    else:
        update = update * float(step_size)
        if weight_decay > 0:
            update = update + weight_decay * lr * var
        var.sub_(update)
    return var, m, v
