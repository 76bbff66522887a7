"""``torch_npu._C._cd``: torch_npu's custom dtype constants and its FP8 casts.

Huawei's torch_npu numbers the data types of CANN that PyTorch lacks (HiFloat8, FP6, FP4, ...)
as their AscendCL ``aclDataType`` value plus 256, and gives every ``aclDataType`` such a number:
``DType.hifloat8 == 34 + 256 == 290``, ``DType.float32 == 0 + 256``. They are exported as
``torch_npu.<name>`` (``torch_npu.hifloat8``) and passed to the ``int`` dtype arguments of the
operators, which read a number >= 256 as a custom dtype and a smaller one as a
``c10::ScalarType`` (what a ``torch.dtype`` becomes). A tensor of a dtype torch lacks is held in
a torch dtype of its size: HiFloat8 codes in ``torch.uint8``.

HiFloat8 (Ascend HiF8, arXiv 2409.16626) is implemented here with torch operators, so the casts
run as npu kernels on npu tensors. A code is ``S | dot field | exponent | mantissa``: the prefix
code ``11``/``10``/``01``/``001``/``0001`` gives exponent widths 4/3/2/1/0 (mantissa 1/2/3/3/3
bits); an exponent is sign-magnitude with an implicit leading 1 (width w: magnitudes 2^(w-1) ..
2^w - 1); ``0000`` is the denormal mode, 2^(m - 23) for m = 1..7. ``0x00`` is zero (there is no
negative zero), ``0x80`` NaN, ``0x6F``/``0xEF`` +-inf: normal values span 2^-15 .. 2^15, denormals
2^-22 .. 2^-16. Encoding follows Huawei's ``en_dtypes.hifloat8`` (the reference the tests compare
with, bit for bit): float32 rounded to the nearest code, ties away from zero; the mantissa width is
that of the value's own exponent (a carry gives a power of two, exact at the next exponent);
|x| >= 1.25 * 2^15 becomes inf (no saturation: 1.5 * 2^15 would be the code after the largest,
which is the inf code); |x| in [2^-23, 2^-22) becomes 2^-22, anything smaller 0; NaN (either
sign) becomes 0x80; float64 is first rounded to float32, as en_dtypes does (so a float64 just
below a tie can round away, where the paper's direct rounding would not).
"""
from __future__ import annotations

import torch

_OFFSET = 256

# aclDataType values (CANN's acl_base.h; the same numbers as GE's DataType).
_ACL = {
    "float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "uint16": 7,
    "uint32": 8, "int64": 9, "uint64": 10, "float64": 11, "bool": 12, "string": 13,
    "complex64": 16, "complex128": 17, "bfloat16": 27, "int4": 29, "uint1": 30, "complex32": 33,
    "hifloat8": 34, "float8_e5m2": 35, "float8_e4m3fn": 36, "float8_e8m0fnu": 37,
    "float6_e3m2": 38, "float6_e2m3": 39, "float4_e2m1fn_x2": 40, "float4_e1m2fn_x2": 41,
}

# c10::ScalarType codes (an `int` dtype argument given a torch.dtype receives its code).
SCALAR_TYPES = (
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
    torch.float64, torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.qint8,
    torch.quint8, torch.qint32, torch.bfloat16, torch.quint4x2, torch.quint2x4, torch.bits1x8,
    torch.bits2x4, torch.bits4x2, torch.bits8, torch.bits16, torch.float8_e5m2, torch.float8_e4m3fn,
    torch.float8_e5m2fnuz, torch.float8_e4m3fnuz, torch.uint16, torch.uint32, torch.uint64,
    *(getattr(torch, f"uint{n}") for n in range(1, 8)), *(getattr(torch, f"int{n}") for n in range(1, 8)),
    torch.float8_e8m0fnu, torch.float4_e2m1fn_x2,
)


class _ReadOnly(type):
    def __setattr__(cls, name, value):
        raise AttributeError(f"can't set attribute '{name}'")


class DType(metaclass=_ReadOnly):
    """The custom dtype numbers (read-only class attributes), ``aclDataType + 256``."""

    def __new__(cls, *args, **kwargs):
        raise TypeError("torch_npu._C._cd.DType: No constructor defined!")


for _name, _acl in _ACL.items():
    type.__setattr__(DType, _name, _acl + _OFFSET)

HIFLOAT8 = DType.hifloat8
_NAMES = {code: f"torch_npu.{name}" for name, code in ((n, a + _OFFSET) for n, a in _ACL.items())}

# The torch dtype that holds each custom dtype (torch_npu's convert_to_scalar_type of the
# aclDataType): the dtype itself where torch has it, uint8 for the byte formats torch lacks;
# None where there is none (string, int4, uint1).
_HOLDER = {
    DType.float32: torch.float32, DType.float16: torch.float16, DType.int8: torch.int8,
    DType.int32: torch.int32, DType.uint8: torch.uint8, DType.int16: torch.int16,
    DType.uint16: torch.uint16, DType.uint32: torch.uint32, DType.int64: torch.int64,
    DType.uint64: torch.uint64, DType.float64: torch.float64, DType.bool: torch.bool,
    DType.string: None, DType.complex64: torch.complex64, DType.complex128: torch.complex128,
    DType.bfloat16: torch.bfloat16, DType.int4: None, DType.uint1: None,
    DType.complex32: torch.complex32, DType.hifloat8: torch.uint8,
    DType.float8_e5m2: torch.float8_e5m2, DType.float8_e4m3fn: torch.float8_e4m3fn,
    DType.float8_e8m0fnu: torch.float8_e8m0fnu, DType.float6_e3m2: torch.uint8,
    DType.float6_e2m3: torch.uint8, DType.float4_e2m1fn_x2: torch.float4_e2m1fn_x2,
    DType.float4_e1m2fn_x2: torch.uint8,
}
# Custom dtypes whose values torch cannot compute with: only HiFloat8 is converted here.
_NOT_SIMULATED = (DType.string, DType.int4, DType.uint1, DType.float6_e3m2, DType.float6_e2m3,
                  DType.float4_e2m1fn_x2, DType.float4_e1m2fn_x2)


def is_custom(code) -> bool:
    """Whether an ``int`` dtype argument is a torch_npu custom dtype (>= 256)."""
    return isinstance(code, int) and not isinstance(code, bool) and code >= _OFFSET


def to_string(code: int) -> str:
    """torch_npu's name of a dtype number: ``torch_npu.hifloat8``, or the ScalarType's name."""
    if is_custom(code):
        return _NAMES.get(code, "Unknown dtype")
    if isinstance(code, int) and 0 <= code < len(SCALAR_TYPES):
        return str(SCALAR_TYPES[code])
    return repr(code)


def torch_dtype(code: int):
    """The torch dtype that a custom dtype number names (torch_npu.float16 -> torch.float16,
    torch_npu.float8_e4m3fn -> torch.float8_e4m3fn), None for a format torch lacks (held in
    another dtype, as HiFloat8 in uint8) and for a number that is no dtype."""
    if code in (DType.hifloat8, DType.float6_e3m2, DType.float6_e2m3, DType.float4_e2m1fn_x2,
                DType.float4_e1m2fn_x2):
        return None
    return _HOLDER.get(code)


def holder_dtype(code, op: str, arg: str) -> torch.dtype:
    """The torch dtype of a tensor of dtype ``code`` (a torch.dtype, a ScalarType code or a custom
    dtype number): HiFloat8 is uint8. Raises for an unknown number or one without a holder."""
    if isinstance(code, torch.dtype):
        return code
    if isinstance(code, int) and not isinstance(code, bool):
        if 0 <= code < len(SCALAR_TYPES):
            return SCALAR_TYPES[code]
        if code in _HOLDER:
            if _HOLDER[code] is None:
                raise RuntimeError(f"{op}: {arg}={_NAMES[code]} has no torch dtype to hold it")
            return _HOLDER[code]
    raise TypeError(f"{op}: {arg} must be a torch.dtype or a torch_npu dtype (torch_npu._C._cd.DType.*), "
                    f"got {code!r}")


def _check_simulated(code, op: str, arg: str) -> None:
    if code in _NOT_SIMULATED:
        raise NotImplementedError(
            f"{op}: {arg}={_NAMES[code]} is not supported by the NPU simulator (its values are not "
            f"simulated); the simulated custom dtypes are torch_npu.hifloat8, torch_npu.float8_e5m2, "
            f"torch_npu.float8_e4m3fn and torch_npu.float8_e8m0fnu")


# ---- HiFloat8 --------------------------------------------------------------------------------

def hifloat8_encode(x: torch.Tensor) -> torch.Tensor:
    """The HiFloat8 codes (uint8, x's shape and device) of the values of ``x``: see the module
    docstring for the rounding. Integer and float64 inputs go through float32 first."""
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    bits = x.contiguous().view(torch.int32)
    negative = bits < 0
    mag = bits & 0x7FFFFFFF
    nan = mag > 0x7F800000
    exp = (mag >> 23) - 127
    aexp = exp.abs()
    # Mantissa width at the value's exponent: 3 bits for |e| <= 3, 2 for 4..7, 1 for 8..15, none
    # in the denormal range (powers of two) and beyond.
    width = torch.where(aexp <= 3, 3, torch.where(aexp <= 7, 2, torch.where(aexp <= 15, 1, 0)))
    drop = 23 - width
    # Ties away from zero: add half a unit of the kept width, then clear the dropped bits.
    rounded = (mag + (1 << (drop - 1))) & -(1 << drop)
    e = (rounded >> 23) - 127
    ae = e.abs()
    es = (e < 0).to(torch.int32)
    m3 = (rounded >> 20) & 7
    code = torch.where(e == 0, 0x08 | m3, 0)
    code = torch.where(ae == 1, 0x10 | (es << 3) | m3, code)
    code = torch.where((ae >= 2) & (ae <= 3), 0x20 | (es << 4) | ((ae - 2) << 3) | m3, code)
    code = torch.where((ae >= 4) & (ae <= 7), 0x40 | (es << 4) | ((ae - 4) << 2) | ((rounded >> 21) & 3), code)
    # Exponent 15 with the mantissa bit set (1.5 * 2^15) is the inf code 0x6F itself.
    code = torch.where((ae >= 8) & (ae <= 15), 0x60 | (es << 4) | ((ae - 8) << 1) | ((rounded >> 22) & 1), code)
    code = torch.where((e >= -22) & (e <= -16), e + 23, code)  # denormals 2^-22 .. 2^-16
    code = torch.where(e >= 16, 0x6F, code)  # overflow and inf
    code = torch.where(exp == -23, 1, code)  # [2^-23, 2^-22): at or past the tie with 0
    code = torch.where(exp <= -24, 0, code)  # zero, float32 denormals, anything below 2^-23
    code = torch.where(negative & (code != 0), code | 0x80, code)
    code = torch.where(nan, 0x80, code)
    return code.to(torch.uint8)


def hifloat8_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values (``dtype``) of the HiFloat8 codes ``codes`` (a 1-byte tensor: uint8 or int8);
    exact in float32, float16 and bfloat16."""
    c = codes.contiguous().view(torch.uint8).to(torch.int32)
    low = c & 0x7F
    d4, d3, d2, d1 = low >= 0x60, low >= 0x40, low >= 0x20, low >= 0x10
    denormal = low < 0x08
    es = torch.where(d2, (low >> 4) & 1, (low >> 3) & 1) & d1.to(torch.int32)
    mag = torch.where(d4, 8 + ((low >> 1) & 7),
                      torch.where(d3, 4 + ((low >> 2) & 3), torch.where(d2, 2 + ((low >> 3) & 1), d1.to(torch.int32))))
    width = torch.where(d4, 1, torch.where(d3, 2, 3))
    mant = low & ((1 << width) - 1)
    exp = torch.where(es == 1, -mag, mag)
    exp = torch.where(denormal, low - 23, exp)
    mant = torch.where(denormal, 0, mant)
    bits = ((exp + 127) << 23) | (mant << (23 - width))
    bits = torch.where(low == 0, 0, torch.where(low == 0x6F, 0x7F800000, bits))
    value = bits.to(torch.int32).view(torch.float32)
    value = torch.where(c >= 0x80, -value, value)
    value = torch.where(c == 0x80, float("nan"), value)
    return value if dtype == torch.float32 else value.to(dtype)


# ---- casts -----------------------------------------------------------------------------------

def values_of(x: torch.Tensor, code, op: str, arg: str) -> torch.Tensor:
    """The values of ``x`` read as dtype ``code`` (None: x's own dtype): HiFloat8 codes decoded to
    float32, another dtype of x's element size reinterpreted (as an aclTensor of that dtype would
    read the memory)."""
    if code is None or isinstance(code, torch.dtype) and code == x.dtype:
        return x
    _check_simulated(code, op, arg)
    dtype = holder_dtype(code, op, arg)
    if code == HIFLOAT8:
        if x.element_size() != 1:
            raise RuntimeError(f"{op}: a torch_npu.hifloat8 input holds 1-byte codes (torch.uint8 or torch.int8), "
                               f"got {x.dtype}")
        return hifloat8_decode(x)
    if dtype == x.dtype:
        return x
    if dtype.itemsize != x.element_size() or dtype.is_complex != x.dtype.is_complex:
        raise RuntimeError(f"{op}: {arg}={to_string(code)} cannot read a {x.dtype} tensor (element size "
                           f"{x.element_size()}, {to_string(code)} needs {dtype.itemsize})")
    return x.contiguous().view(dtype)


def cast(x: torch.Tensor, dst, src=None, op: str = "cast", arg: str = "dtype") -> torch.Tensor:
    """``x`` (read as dtype ``src``, None: its own) converted to dtype ``dst`` (a torch.dtype, a
    ScalarType code or a torch_npu dtype number): HiFloat8 results are uint8 codes; the torch dtypes
    convert as ``Tensor.to`` does."""
    _check_simulated(dst, op, arg)
    dtype = holder_dtype(dst, op, arg)
    values = values_of(x, src, op, "input_dtype")
    if dst == HIFLOAT8:
        if values.is_complex():
            raise RuntimeError(f"{op}: cannot cast a complex tensor to torch_npu.hifloat8")
        return hifloat8_encode(values)
    return values.to(dtype)


def _int_arg(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad_arguments(name: str, signature: str, args) -> TypeError:
    """pybind11's error for a call whose arguments match no overload (torch_npu's _cd functions
    are pybind11 bindings with positional arguments)."""
    shown = ", ".join(f"{type(a).__module__}.{type(a).__qualname__}" if isinstance(a, torch.Tensor) else repr(a)
                      for a in args)
    return TypeError(f"{name}(): incompatible function arguments. The following argument types are supported:\n"
                     f"    1. {signature}\n\nInvoked with: {shown}")


def cast_to_fp8(input, otype, /):
    """``input`` converted to dtype ``otype`` (a torch_npu dtype number, e.g. ``DType.hifloat8``,
    or a ScalarType code): a new tensor of input's shape."""
    if not isinstance(input, torch.Tensor) or not _int_arg(otype):
        raise _bad_arguments("cast_to_fp8", "(arg0: torch.Tensor, arg1: int) -> torch.Tensor", (input, otype))
    if input.numel() == 0:
        return torch.empty_like(input, dtype=holder_dtype(otype, "cast_to_fp8", "otype"))
    return cast(input, otype, op="cast_to_fp8", arg="otype")


def cast_to_fp8_noalloc(input, output, otype, /):
    """Writes ``input`` converted to dtype ``otype`` into ``output`` (same shape; a tensor of
    otype's size, e.g. uint8 for HiFloat8 codes). Returns None."""
    if not isinstance(input, torch.Tensor) or not isinstance(output, torch.Tensor) or not _int_arg(otype):
        raise _bad_arguments("cast_to_fp8_noalloc", "(arg0: torch.Tensor, arg1: torch.Tensor, arg2: int) -> None",
                             (input, output, otype))
    if input.shape != output.shape:
        raise RuntimeError(f"cast_to_fp8_noalloc: output must have input's shape {tuple(input.shape)}, "
                           f"got {tuple(output.shape)}")
    result = cast(input, otype, op="cast_to_fp8_noalloc", arg="otype")
    if result.dtype != output.dtype:
        if result.element_size() != output.element_size():
            raise RuntimeError(f"cast_to_fp8_noalloc: output must hold {to_string(otype)} "
                               f"({result.dtype}), got {output.dtype}")
        result = result.view(output.dtype)
    with torch.no_grad():
        output.copy_(result)


def cast_from_fp8(input, itype, otype, /):
    """``input`` read as dtype ``itype`` (``DType.hifloat8``: uint8 codes) converted to dtype
    ``otype``: a new tensor of input's shape."""
    if not isinstance(input, torch.Tensor) or not _int_arg(itype) or not _int_arg(otype):
        raise _bad_arguments("cast_from_fp8", "(arg0: torch.Tensor, arg1: int, arg2: int) -> torch.Tensor",
                             (input, itype, otype))
    return cast(input, otype, itype, op="cast_from_fp8", arg="otype")


def _cd_init():
    """torch_npu's initialiser of the ``_cd`` submodule (already in place here)."""
    return None
