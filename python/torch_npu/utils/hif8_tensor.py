"""``torch_npu.HiFloat8Tensor``: a tensor whose values are stored as HiFloat8 codes.

It presents itself with a nominal dtype (float32, float16 or bfloat16) and shape; ``_data``
holds the HiFloat8 codes (uint8, on an npu). ``to_hifloat8(t)`` encodes a tensor,
``from_hifloat8(dtype)`` (and ``float()``, ``half()``, ``bfloat16()``, ``cpu()``) decodes it
(the casts of ``torch_npu._C._cd``, bit-exact HiFloat8). ``view``, ``reshape``, ``transpose``,
``contiguous``, ``clone``, slicing and ``detach`` keep the codes (views share them); a copy into
it encodes; every other operator decodes its HiFloat8 arguments to their nominal dtype and runs
on those values, an in-place one writing its result back as codes. Autograd passes gradients
through the casts unchanged (in the nominal dtype), as torch_npu's does.
"""
from __future__ import annotations

__all__ = []

from typing import Any, Dict, Optional, Tuple

import torch
from torch.utils._pytree import tree_map

from torch_npu import _custom_dtype as _cd
from torch_npu.utils._error_code import ErrCode, pta_error

aten = torch.ops.aten

# torch dtype -> the torch_npu dtype number the casts take.
_NOMINAL = {
    torch.uint8: _cd.DType.uint8,
    torch.int32: _cd.DType.int32,
    torch.float32: _cd.DType.float32,
    torch.float16: _cd.DType.float16,
    torch.bfloat16: _cd.DType.bfloat16,
}


def _nominal_code(dtype: torch.dtype) -> int:
    if dtype not in _NOMINAL:
        raise TypeError(f"HiFloat8Tensor: cannot decode to {dtype}; expected one of "
                        f"{', '.join(str(d) for d in _NOMINAL)}" + pta_error(ErrCode.TYPE))
    return _NOMINAL[dtype]


def _decode(tensor: _HiFloat8Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The values of ``tensor`` in ``dtype`` (its nominal dtype by default), a plain tensor."""
    dtype = tensor.dtype if dtype is None else dtype
    data = tensor._data
    flat = data.contiguous().view(1, -1).detach()
    return _cd.cast_from_fp8(flat, _cd.DType.hifloat8, _nominal_code(dtype)).view(data.size())


def _encode(tensor: torch.Tensor) -> torch.Tensor:
    """The HiFloat8 codes (uint8) of ``tensor``'s values, in its shape."""
    return _cd.cast_to_fp8(tensor.reshape(1, -1), _cd.DType.hifloat8).view(tensor.size())


class _FromHiFloat8Func(torch.autograd.Function):
    """HiFloat8Tensor -> plain tensor of ``dtype``; the gradient passes through."""

    @staticmethod
    def forward(ctx, tensor, dtype=None):
        ctx.input_dtype = tensor.dtype
        return _decode(tensor, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.input_dtype), None


class _ToHiFloat8Func(torch.autograd.Function):
    """plain tensor -> HiFloat8Tensor (on an npu, nominal dtype float32/float16/bfloat16); the
    gradient passes through."""

    @staticmethod
    def forward(ctx, tensor):
        ctx.input_device = tensor.device
        ctx.input_dtype = tensor.dtype
        tensor = tensor.contiguous().npu().detach()
        if tensor.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            tensor = tensor.float()
        return _HiFloat8Tensor(data=_encode(tensor), dtype=tensor.dtype)

    @staticmethod
    def backward(ctx, grad):
        if isinstance(grad, _HiFloat8Tensor):
            grad = _decode(grad)
        return grad.to(device=ctx.input_device, dtype=ctx.input_dtype)


class _IdentityFunc(torch.autograd.Function):
    """``tensor`` itself, or (with ``init_kwargs``) a new HiFloat8Tensor built from them and
    ``tensor``'s attributes; the gradient passes through in the input's dtype."""

    @staticmethod
    def forward(ctx, tensor, init_kwargs: Optional[Dict[str, Any]] = None):
        ctx.input_dtype = tensor.dtype
        if init_kwargs is None:
            return tensor
        kwargs = dict(init_kwargs)
        kwargs.setdefault("data", tensor._data)
        kwargs.setdefault("dtype", tensor.dtype)
        return _HiFloat8Tensor(**kwargs)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.input_dtype), None


def _reshaped(grad, shape, method):
    if isinstance(grad, _HiFloat8Tensor):
        return _HiFloat8Tensor.make_like(grad, data=getattr(grad._data, method)(shape))
    return getattr(grad, method)(shape)


class _ViewFunc(torch.autograd.Function):
    """A view of new ``shape`` over the same codes (over the same elements for a plain tensor)."""

    @staticmethod
    def forward(ctx, tensor, shape=None):
        ctx.shape = tensor.shape
        if shape is None:
            return tensor
        if isinstance(tensor, _HiFloat8Tensor):
            return _HiFloat8Tensor.make_like(tensor, data=tensor._data.view(*shape))
        return tensor.view(*shape)

    @staticmethod
    def backward(ctx, grad):
        return _reshaped(grad, ctx.shape, "view"), None


class _ReshapeFunc(torch.autograd.Function):
    """``reshape``: a view where the strides allow, else a copy of the codes."""

    @staticmethod
    def forward(ctx, tensor, shape=None):
        ctx.shape = tensor.shape
        if shape is None:
            return tensor
        if isinstance(tensor, _HiFloat8Tensor):
            return _HiFloat8Tensor.make_like(tensor, data=tensor._data.reshape(*shape))
        return tensor.reshape(*shape)

    @staticmethod
    def backward(ctx, grad):
        return _reshaped(grad, ctx.shape, "reshape"), None


class _TransposeFunc(torch.autograd.Function):
    """Swaps dimensions ``dim0`` and ``dim1`` (a view over the same codes)."""

    @staticmethod
    def forward(ctx, tensor, dim0, dim1):
        ctx.dims = (dim0, dim1)
        if isinstance(tensor, _HiFloat8Tensor):
            return _HiFloat8Tensor.make_like(tensor, data=tensor._data.transpose(dim0, dim1))
        return tensor.transpose(dim0, dim1)

    @staticmethod
    def backward(ctx, grad):
        dim0, dim1 = ctx.dims
        if isinstance(grad, _HiFloat8Tensor):
            grad = _HiFloat8Tensor.make_like(grad, data=grad._data.transpose(dim0, dim1))
        else:
            grad = grad.transpose(dim0, dim1)
        return grad, None, None


class _HiFloat8Tensor(torch.Tensor):
    """A tensor of nominal dtype ``dtype`` whose values are the HiFloat8 codes of ``data``.

    Parameters
    ----------
    data: torch.Tensor
        the HiFloat8 codes, a tensor of 1-byte elements (uint8) that does not require grad;
        moved to the current npu if it is elsewhere.
    dtype: torch.dtype, default torch.float32
        the nominal dtype: what operators see after decoding.
    """

    def __new__(cls, *, data: torch.Tensor, dtype: torch.dtype = torch.float32):
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"HiFloat8Tensor: data must be a Tensor, got {type(data).__name__}"
                            + pta_error(ErrCode.TYPE))
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"HiFloat8Tensor: dtype must be a torch.dtype, got {type(dtype).__name__}"
                            + pta_error(ErrCode.TYPE))
        if data.element_size() != 1:
            raise ValueError(f"HiFloat8Tensor requires data buffer with 8-bit dtype (got dtype={data.dtype})"
                             + pta_error(ErrCode.VALUE))
        if data.requires_grad:
            raise ValueError("HiFloat8Tensor requires non-differentiable data buffer" + pta_error(ErrCode.VALUE))
        if not data.is_npu:
            data = data.npu()
        self = torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(), dtype=dtype,
            layout=data.layout, requires_grad=False, device=data.device)
        self._data = data
        return self

    @classmethod
    def make_like(cls, tensor: _HiFloat8Tensor, *, data: torch.Tensor, **kwargs) -> _HiFloat8Tensor:
        """A HiFloat8Tensor over ``data`` with ``tensor``'s attributes (its nominal dtype) unless
        ``kwargs`` give others."""
        kwargs.setdefault("dtype", tensor.dtype)
        return _HiFloat8Tensor(data=data, **kwargs)

    def __repr__(self, *, tensor_contents=None):
        return f"HiFloat8Tensor(data={_decode(self)})"

    def from_hifloat8(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values as a plain tensor of ``dtype`` (the nominal dtype by default)."""
        return _FromHiFloat8Func.apply(self, dtype)

    @classmethod
    def to_hifloat8(cls, tensor: torch.Tensor):
        """``tensor`` encoded as a HiFloat8Tensor on an npu; its nominal dtype is tensor's
        (float32 for a dtype other than float32, float16 and bfloat16)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"to_hifloat8: tensor must be a Tensor, got {type(tensor).__name__}"
                            + pta_error(ErrCode.TYPE))
        return _ToHiFloat8Func.apply(tensor)

    def float(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.float32)

    def bfloat16(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.bfloat16)

    def half(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.float16)

    def cpu(self) -> torch.Tensor:
        return self.from_hifloat8().cpu()

    def clone(self) -> _HiFloat8Tensor:
        return _IdentityFunc.apply(self, {"data": self._data.detach().clone()})

    def view(self, *shape: Tuple[int]) -> _HiFloat8Tensor:
        return _ViewFunc.apply(self, shape)

    def reshape(self, *shape: Tuple[int]) -> _HiFloat8Tensor:
        return _ReshapeFunc.apply(self, shape)

    def contiguous(self, *, memory_format: torch.memory_format = torch.contiguous_format) -> _HiFloat8Tensor:
        """``self`` if its codes are contiguous in ``memory_format``, else a copy that is."""
        if self._data.is_contiguous(memory_format=memory_format):
            return self
        return _IdentityFunc.apply(self, {"data": self._data.detach().contiguous(memory_format=memory_format)})

    def to_dtype(self, dtype: torch.dtype) -> _HiFloat8Tensor:
        """A HiFloat8Tensor over the same codes with nominal dtype ``dtype``."""
        return _HiFloat8Tensor.make_like(self, data=self._data, dtype=dtype)

    def transpose(self, dim0, dim1):
        return _TransposeFunc.apply(self, dim0, dim1)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == aten.copy_.default:
            dst, src = args[0], args[1]
            _copy(dst, src)
            return dst
        if func in (aten.slice.Tensor, aten.view.default):
            tensor = args[0]
            return _HiFloat8Tensor.make_like(tensor, data=func(tensor._data, *args[1:], **kwargs))
        if func == aten.detach.default:
            return _HiFloat8Tensor.make_like(args[0], data=args[0]._data)

        def unwrap(t):
            return _decode(t) if isinstance(t, _HiFloat8Tensor) else t

        new_args, new_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        out = func(*new_args, **new_kwargs)
        if not func._schema.is_mutable:
            return out
        # In-place or out= operator: it wrote the decoded copies; encode them back into the
        # HiFloat8 tensors the schema marks as written, and return those.
        written = {}
        for i, schema_arg in enumerate(func._schema.arguments):
            if schema_arg.alias_info is None or not schema_arg.alias_info.is_write:
                continue
            if i < len(args) and not schema_arg.kwarg_only:
                original, new = args[i], new_args[i]
            elif schema_arg.name in kwargs:
                original, new = kwargs[schema_arg.name], new_kwargs[schema_arg.name]
            else:
                continue
            if isinstance(original, _HiFloat8Tensor):
                original.copy_(new)
            written[id(new)] = original
        if isinstance(out, (tuple, list)):
            return type(out)(written.get(id(o), o) for o in out)
        return written.get(id(out), out)

    @classmethod
    def _make_in_reduce_ex(cls, data: torch.Tensor, dtype: torch.dtype) -> _HiFloat8Tensor:
        """Rebuilds a pickled HiFloat8Tensor (``__reduce_ex__`` needs positional arguments)."""
        return _HiFloat8Tensor(data=data, dtype=dtype)

    def __reduce_ex__(self, protocol: int) -> tuple:
        return _HiFloat8Tensor._make_in_reduce_ex, (self._data, self.dtype)

    def _get_data(self) -> _HiFloat8Tensor:
        return super().data

    def _set_data(self, tensor: torch.Tensor) -> None:
        """``t.data = x`` encodes x into t's codes."""
        with torch.no_grad():
            self.copy_(tensor)

    data = property(_get_data, _set_data)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Straight to __torch_dispatch__ (no subclass wrapping of results).
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` where one of them is a HiFloat8Tensor: codes are copied as they are,
    values are encoded into a HiFloat8 destination and decoded out of a HiFloat8 source."""
    for name, t in (("into", dst), ("from", src)):
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"Attempted to copy {name} something that isn't a PyTorch tensor"
                               + pta_error(ErrCode.TYPE))
    dst_hif8, src_hif8 = isinstance(dst, _HiFloat8Tensor), isinstance(src, _HiFloat8Tensor)
    if dst_hif8 and src_hif8:
        dst._data.copy_(src._data)
    elif src_hif8:
        dst.copy_(_decode(src))
    elif dst_hif8:
        src = src.expand(dst.size()).to(device=dst.device, memory_format=torch.contiguous_format)
        dst._data.copy_(_encode(src))
    else:
        raise RuntimeError("Using HiFloat8Tensor copy logic, but no HiFloat8Tensor found" + pta_error(ErrCode.INTERNAL))
