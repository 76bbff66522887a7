"""torch_npu's custom dtypes (torch_npu._C._cd, torch_npu.hifloat8, ...), the HiFloat8 casts and
torch_npu.HiFloat8Tensor.

Checks: the DType numbers are aclDataType + 256 as Huawei's; the torch_npu.<dtype> exports; the
HiFloat8 decoding of all 256 codes against a reference written here from the format's definition
(prefix-coded dot field, sign-magnitude exponent, denormals); the encoding against a nearest-value
search over the decoded codes (ties away from zero, 1.25 * 2^15 and above to inf), round trips,
monotonicity, the format's extreme values; bit-exact agreement with Huawei's en_dtypes.hifloat8
(every float16 and bfloat16 bit pattern, a float32 sweep, float64) when en_dtypes is installed;
cast_to_fp8 / cast_to_fp8_noalloc / cast_from_fp8 (HiFloat8 and torch's float8 dtypes, argument
errors); the operators that take torch_npu.hifloat8 (npu_dtype_cast, npu_quantize,
npu_anti_quant, npu_rms_norm_quant, npu_add_rms_norm_quant, npu_moe_re_routing,
npu_moe_init_routing_v2); HiFloat8Tensor's methods, dispatch (views keep codes, copies encode,
other operators decode, in-place ones write back), autograd and pickling.
"""
import io
import math

import numpy as np
import pytest
import torch

import torch_npu
from torch_npu import _custom_dtype

# aclDataType values of CANN's acl_base.h; torch_npu's numbers are these + 256.
ACL_DATA_TYPES = {
    "float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "uint16": 7, "uint32": 8,
    "int64": 9, "uint64": 10, "float64": 11, "bool": 12, "string": 13, "complex64": 16, "complex128": 17,
    "bfloat16": 27, "int4": 29, "uint1": 30, "complex32": 33, "hifloat8": 34, "float8_e5m2": 35,
    "float8_e4m3fn": 36, "float8_e8m0fnu": 37, "float6_e3m2": 38, "float6_e2m3": 39,
    "float4_e2m1fn_x2": 40, "float4_e1m2fn_x2": 41,
}
cd = torch_npu._C._cd
HIF8 = torch_npu.hifloat8


def reference_decode(code: int) -> float:
    """A HiFloat8 code's value, read field by field from its bit string."""
    if code == 0x80:
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    bits = format(code & 0x7F, "07b")
    for prefix, width in (("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0)):
        if bits.startswith(prefix):
            rest = bits[len(prefix):]
            break
    else:  # "0000": denormal, 2^(m - 23)
        m = int(bits[4:], 2)
        return 0.0 if m == 0 else sign * 2.0 ** (m - 23)
    exp_bits, man_bits = rest[:width], rest[width:]
    exponent = 0
    if width:
        magnitude = int("1" + exp_bits[1:], 2)  # implicit leading 1
        exponent = -magnitude if exp_bits[0] == "1" else magnitude
    if width == 4 and exp_bits == "0111" and man_bits == "1":
        return sign * math.inf
    return sign * (1 + int(man_bits, 2) / 2 ** len(man_bits)) * 2.0 ** exponent


REFERENCE = [reference_decode(c) for c in range(256)]


def reference_encode(values: torch.Tensor) -> torch.Tensor:
    """Codes of float32 values by a search over the decoded positive codes: the nearest one, a tie
    to the larger magnitude; 1.5 * 2^15 (where the next code would be) stands for inf."""
    table = sorted((v, c) for c, v in enumerate(REFERENCE) if c < 0x80 and math.isfinite(v))
    grid = torch.tensor([v for v, _ in table] + [1.5 * 2 ** 15], dtype=torch.float64)
    codes = torch.tensor([c for _, c in table] + [0x6F])
    a = values.double().abs()
    hi = torch.searchsorted(grid, a).clamp(max=len(grid) - 1)
    lo = (hi - 1).clamp(min=0)
    pick = torch.where(a - grid[lo] < grid[hi] - a, lo, hi)
    code = codes[pick]
    code = torch.where(a >= grid[-1], 0x6F, code)
    code = torch.where((values < 0) & (code != 0), code | 0x80, code)
    return torch.where(values.isnan(), 0x80, code).to(torch.uint8)


def encode(x: torch.Tensor) -> torch.Tensor:
    return cd.cast_to_fp8(x.npu(), cd.DType.hifloat8).cpu()


def decode(codes: torch.Tensor, otype=cd.DType.float32) -> torch.Tensor:
    return cd.cast_from_fp8(codes.npu(), cd.DType.hifloat8, otype).cpu()


ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


# ---- the numbers and their exports ------------------------------------------------------------

def test_dtype_numbers_are_acl_data_types_plus_256():
    for name, acl in ACL_DATA_TYPES.items():
        assert getattr(cd.DType, name) == acl + 256, name
        assert getattr(torch_npu, name) == acl + 256, name
    assert (torch_npu.hifloat8, torch_npu.float8_e5m2, torch_npu.float4_e1m2fn_x2) == (290, 291, 297)
    public = {n for n in dir(cd.DType) if not n.startswith("_")}
    assert public == set(ACL_DATA_TYPES)
    with pytest.raises(AttributeError):
        cd.DType.hifloat8 = 1
    with pytest.raises(TypeError, match="No constructor defined"):
        cd.DType()
    assert {"DType", "cast_to_fp8", "cast_to_fp8_noalloc", "cast_from_fp8"} <= set(dir(cd))
    assert torch_npu._C._cd_init() is None
    assert "HiFloat8Tensor" in torch_npu.__all__
    assert torch_npu.HiFloat8Tensor is torch_npu.utils.hif8_tensor._HiFloat8Tensor


# ---- HiFloat8: the format -----------------------------------------------------------------------

def test_decode_all_codes_matches_the_format_definition():
    for otype, dtype in ((cd.DType.float32, torch.float32), (cd.DType.float16, torch.float16),
                         (cd.DType.bfloat16, torch.bfloat16)):
        got = decode(ALL_CODES, otype)
        assert got.dtype == dtype
        expected = torch.tensor(REFERENCE, dtype=torch.float64).to(dtype)  # exact in all three
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def test_format_extremes():
    values = decode(torch.tensor([0x6E, 0x01, 0x07, 0x7E, 0x08, 0x6F, 0xEF, 0x00, 0x80], dtype=torch.uint8))
    assert values[:5].tolist() == [32768.0, 2.0 ** -22, 2.0 ** -16, 2.0 ** -15, 1.0]
    assert values[5] == math.inf and values[6] == -math.inf and values[7] == 0 and math.isnan(values[8])
    finite = decode(ALL_CODES)
    finite = finite[finite.isfinite()]
    assert finite.max() == 32768 and finite[finite > 0].min() == 2.0 ** -22
    # no negative zero: -0.0 and tiny negatives encode to 0x00
    assert encode(torch.tensor([-0.0, 0.0, -1e-30, -(2.0 ** -24)])).tolist() == [0, 0, 0, 0]


def test_every_code_round_trips():
    assert torch.equal(encode(decode(ALL_CODES)), ALL_CODES)
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(encode(decode(ALL_CODES).to(dtype)), ALL_CODES)


def _float32_sweep(random_count=200_000) -> torch.Tensor:
    """float32 values at every exponent: every 8-bit mantissa head with low bits 0, 1, all ones,
    the exact ties, and random bit patterns."""
    exps = torch.arange(256, dtype=torch.int64)
    heads = torch.arange(256, dtype=torch.int64)
    lows = torch.tensor([0, 1, 0x7FFF, 0x4000, 0x3FFF], dtype=torch.int64)
    mag = (exps.view(-1, 1, 1) << 23) | (heads.view(1, -1, 1) << 15) | lows.view(1, 1, -1)
    mag = mag.reshape(-1)
    gen = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 2 ** 32, (random_count,), generator=gen, dtype=torch.int64)
    bits = torch.cat([mag, mag | (1 << 31), rand])
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32)
    return bits.view(torch.float32)


def test_encode_is_nearest_with_ties_away():
    x = _float32_sweep()
    assert torch.equal(encode(x), reference_encode(x))
    # ties between neighbours of each exponent width, and at the range ends
    ties = torch.tensor([1.0625, 1.3125, 15.5, 7.75, 240.0, 2.0 ** -23, 1.5 * 2 ** -22, 1.5 * 2 ** -16,
                         40960.0, 40959.996, -1.0625, -40960.0])
    assert decode(encode(ties)).tolist() == [1.125, 1.375, 16.0, 8.0, 256.0, 2.0 ** -22, 2.0 ** -21, 2.0 ** -15,
                                             math.inf, 32768.0, -1.125, -math.inf]


def test_encode_is_monotonic():
    x = torch.sort(_float32_sweep(50_000))[0]
    x = x[x.isfinite()]
    values = decode(encode(x)).double()
    assert bool((values[1:] >= values[:-1]).all())


def test_half_precision_inputs_encode_as_their_float32_values():
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    for dtype in (torch.float16, torch.bfloat16):
        x = bits.view(dtype)
        assert torch.equal(encode(x), encode(x.float())), dtype
    assert torch.equal(encode(torch.tensor([1, 17, -3, 300])), encode(torch.tensor([1.0, 17.0, -3.0, 300.0])))


# ---- the oracle: Huawei's en_dtypes -------------------------------------------------------------

def _en_dtypes():
    try:
        from en_dtypes import hifloat8
    except ImportError as e:  # tools/venv.py installs it in every pair's venv
        pytest.skip(f"en_dtypes (Huawei's numpy dtypes, the HiFloat8 oracle) cannot be imported: {e}")
    return hifloat8


def test_bit_exact_with_en_dtypes():
    hifloat8 = _en_dtypes()
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflow casts are part of the sweep
        _compare_with_en_dtypes(hifloat8)


def _compare_with_en_dtypes(hifloat8):
    codes = np.arange(256, dtype=np.uint8).view(hifloat8)
    for np_dtype, otype in ((np.float32, cd.DType.float32), (np.float16, cd.DType.float16)):
        expected = codes.astype(np_dtype)
        got = decode(ALL_CODES, otype).numpy()
        assert got.tobytes() == expected.tobytes(), np_dtype  # NaN bits included
    # every float16 bit pattern, encoded from float16
    f16 = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = encode(torch.from_numpy(f16.copy()))
    assert np.array_equal(got.numpy(), f16.astype(hifloat8).view(np.uint8))
    # every bfloat16 bit pattern (en_dtypes takes their float32 values)
    bf16 = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = encode(bf16)
    assert np.array_equal(got.numpy(), bf16.float().numpy().astype(hifloat8).view(np.uint8))
    # a float32 sweep
    x = _float32_sweep(1_000_000)
    assert np.array_equal(encode(x).numpy(), x.numpy().astype(hifloat8).view(np.uint8))
    # float64 goes through float32 first (so a value just below a float32 tie rounds away)
    d = np.array([1.0625 - 2 ** -40, 2.0 ** -23 - 2 ** -60, 40960.0 - 2 ** -20, 3.0e38, 1e300], dtype=np.float64)
    assert np.array_equal(encode(torch.from_numpy(d)).numpy(), d.astype(hifloat8).view(np.uint8))


# ---- cast_to_fp8 / cast_to_fp8_noalloc / cast_from_fp8 ----------------------------------------

def test_casts_to_and_from_torch_float8():
    x = torch.randn(4, 8) * 100
    for name, dtype in (("float8_e5m2", torch.float8_e5m2), ("float8_e4m3fn", torch.float8_e4m3fn)):
        code = getattr(cd.DType, name)
        out = cd.cast_to_fp8(x.npu(), code)
        assert out.dtype == dtype and out.device.type == "npu"
        assert torch.equal(out.cpu().view(torch.uint8), x.to(dtype).view(torch.uint8))
        back = cd.cast_from_fp8(out, code, cd.DType.bfloat16)
        assert torch.equal(back.cpu(), x.to(dtype).to(torch.bfloat16))
        # uint8 bytes read as the float8 format
        raw = x.to(dtype).view(torch.uint8).npu()
        assert torch.equal(cd.cast_from_fp8(raw, code, cd.DType.float32).cpu(), x.to(dtype).float())
    # a ScalarType code is taken too (torch_npu's GetAclDataType)
    assert cd.cast_to_fp8(x.npu(), 5).dtype == torch.float16
    assert cd.cast_to_fp8(torch.empty(0, 3).npu(), HIF8).shape == (0, 3)


def test_cast_to_fp8_noalloc_writes_into_output():
    x = torch.randn(3, 5)
    out = torch.zeros(3, 5, dtype=torch.uint8).npu()
    assert cd.cast_to_fp8_noalloc(x.npu(), out, HIF8) is None
    assert torch.equal(out.cpu(), encode(x))
    signed = torch.zeros(3, 5, dtype=torch.int8).npu()  # a 1-byte output holds the codes as they are
    cd.cast_to_fp8_noalloc(x.npu(), signed, HIF8)
    assert torch.equal(signed.cpu().view(torch.uint8), encode(x))
    with pytest.raises(RuntimeError, match="output must have input's shape"):
        cd.cast_to_fp8_noalloc(x.npu(), torch.zeros(15, dtype=torch.uint8).npu(), HIF8)
    with pytest.raises(RuntimeError, match="output must hold torch_npu.hifloat8"):
        cd.cast_to_fp8_noalloc(x.npu(), torch.zeros(3, 5).npu(), HIF8)


def test_cast_argument_errors():
    x = torch.randn(2).npu()
    with pytest.raises(TypeError, match=r"cast_to_fp8\(\): incompatible function arguments"):
        cd.cast_to_fp8(x, torch.float16)
    with pytest.raises(TypeError):
        cd.cast_to_fp8(x, otype=HIF8)  # positional only, as the binding
    with pytest.raises(TypeError, match="cast_from_fp8"):
        cd.cast_from_fp8(x, HIF8)
    with pytest.raises(TypeError, match="must be a torch.dtype or a torch_npu dtype"):
        cd.cast_to_fp8(x, 1000)
    with pytest.raises(NotImplementedError, match="torch_npu.float4_e1m2fn_x2 is not supported by the NPU simulator"):
        cd.cast_to_fp8(x, torch_npu.float4_e1m2fn_x2)
    with pytest.raises(RuntimeError, match="1-byte codes"):
        cd.cast_from_fp8(x, HIF8, cd.DType.float32)


# ---- operators that take torch_npu.hifloat8 -----------------------------------------------------

def test_npu_dtype_cast_custom_dtypes():
    x = torch.randn(4, 6) * 10
    codes = torch_npu.npu_dtype_cast(x.npu(), torch_npu.hifloat8)
    assert codes.dtype == torch.uint8 and torch.equal(codes.cpu(), encode(x))
    back = torch_npu.npu_dtype_cast(codes, torch.float16, input_dtype=torch_npu.hifloat8)
    assert torch.equal(back.cpu(), decode(encode(x)).half())
    assert torch_npu.npu_dtype_cast(x.npu(), torch_npu.bfloat16).dtype == torch.bfloat16
    e4m3 = torch_npu.npu_dtype_cast(x.npu(), torch_npu.float8_e4m3fn)
    assert torch.equal(e4m3.cpu().view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))
    with pytest.raises(NotImplementedError, match="torch_npu.float6_e3m2"):
        torch_npu.npu_dtype_cast(x.npu(), torch_npu.float6_e3m2)
    # int4: pairs of values' low nibbles (op-plugin's test_dtype_cast_int4: [1, 2, 3, 4] -> [33, 67])
    packed = torch_npu.npu_dtype_cast(torch.tensor([1, 2, 3, 4, -1, 7], dtype=torch.int32).npu(), dtype=torch_npu.int4,
                                      input_dtype=torch.int32)
    assert packed.dtype == torch.uint8 and packed.cpu().tolist() == [0x21, 0x43, 0x7F]
    with pytest.raises(RuntimeError, match="last dim input shape must be divisible by 2"):
        torch_npu.npu_dtype_cast(torch.ones(3, dtype=torch.int32).npu(), torch_npu.int4)


def test_npu_quantize_to_hifloat8_and_float8():
    x, scales = torch.randn(4, 8) * 50, torch.rand(8) + 0.5
    got = torch_npu.npu_quantize(x.npu(), scales.npu(), None, torch_npu.hifloat8, -1, True)
    assert got.dtype == torch.uint8 and torch.equal(got.cpu(), encode(x / scales))
    got = torch_npu.npu_quantize(x.npu(), scales.npu(), None, torch.float8_e4m3fn, -1, False)
    assert torch.equal(got.cpu().view(torch.uint8), (x * scales).to(torch.float8_e4m3fn).view(torch.uint8))


def test_npu_anti_quant_reads_hifloat8_and_float8():
    codes = encode(torch.randn(3, 8) * 4)
    scale, offset = torch.rand(8) + 0.5, torch.randn(8)
    got = torch_npu.npu_anti_quant(codes.npu(), scale.npu(), offset=offset.npu(), dst_dtype=torch.bfloat16,
                                   src_dtype=torch_npu.hifloat8)
    assert torch.equal(got.cpu(), ((decode(codes) + offset) * scale).bfloat16())
    e5m2 = torch.randn(3, 8).to(torch.float8_e5m2)
    got = torch_npu.npu_anti_quant(e5m2.npu(), scale.npu())
    torch.testing.assert_close(got.cpu(), (e5m2.float() * scale).half())
    with pytest.raises(RuntimeError, match="The datatype of x must match src_dtype"):
        torch_npu.npu_anti_quant(codes.npu(), scale.npu(), src_dtype=torch.int8)
    with pytest.raises(RuntimeError, match="scale_dtype and offset_dtype is only support float"):
        torch_npu.npu_anti_quant(codes.npu(), scale.half().npu())


def test_norm_quant_to_hifloat8_saturates():
    x, gamma, beta = torch.randn(4, 32), torch.randn(32), torch.randn(32)
    scale, offset = torch.tensor([0.001]), torch.tensor([2.0])
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma + beta
    expected = encode((y / scale + offset).clamp(-32768, 32768))  # op-plugin's golden clips to the range
    got = torch_npu.npu_rms_norm_quant(x.npu(), gamma.npu(), beta.npu(), scale.npu(), offset.npu(),
                                       dst_dtype=torch_npu.hifloat8)
    assert torch.equal(got.cpu(), expected)
    assert not bool((decode(got.cpu()).abs() == math.inf).any())
    got = torch_npu.npu_rms_norm_quant(x.npu(), gamma.npu(), beta.npu(), scale.npu(), offset.npu(),
                                       dst_dtype=torch.float8_e4m3fn)
    assert torch.equal(got.cpu().view(torch.uint8),
                       (y / scale + offset).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    x2 = torch.randn(4, 32)
    y1, y2, xs = torch_npu.npu_add_rms_norm_quant(x.npu(), x2.npu(), gamma.npu(), scale.npu(), None,
                                                  dst_type=torch_npu.hifloat8)
    s = x + x2
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    assert y1.dtype == torch.uint8 and y2.dtype == torch.uint8
    assert torch.equal(y1.cpu(), encode((y / scale).clamp(-32768, 32768)))
    assert torch.equal(y2.cpu(), encode(y.clamp(-32768, 32768)))  # no scales2: scale 1
    with pytest.raises(RuntimeError, match="dst_dtype must be torch.int8, torch_npu.hifloat8"):
        torch_npu.npu_rms_norm_quant(x.npu(), gamma.npu(), beta.npu(), scale.npu(), offset.npu(),
                                     dst_dtype=torch.float16)


def test_moe_routing_moves_hifloat8_rows():
    tokens = encode(torch.randn(6, 16))
    counts = torch.tensor([[1, 2], [2, 1]], dtype=torch.int32)
    out, _, idx, _ = torch_npu.npu_moe_re_routing(tokens.npu(), counts.npu(), tokens_dtype=torch_npu.hifloat8)
    assert out.dtype == torch.uint8 and torch.equal(out.cpu(), tokens[idx.cpu().long()])
    with pytest.raises(RuntimeError, match="tokens_dtype only supports hifloat8"):
        torch_npu.npu_moe_re_routing(tokens.npu(), counts.npu(), tokens_dtype=torch_npu.float8_e5m2)
    expert_idx = torch.tensor([[1], [0], [1], [0], [0], [1]], dtype=torch.int32)
    expanded, row_idx, _, _ = torch_npu.npu_moe_init_routing_v2(tokens.npu(), expert_idx.npu(), expert_num=2,
                                                                active_num=6, x_dtype=torch_npu.hifloat8)
    order = torch.argsort(expert_idx.reshape(-1), stable=True)
    assert expanded.dtype == torch.uint8 and torch.equal(expanded.cpu(), tokens[order])


# ---- HiFloat8Tensor ---------------------------------------------------------------------------

H = torch_npu.HiFloat8Tensor


def test_huawei_test_hif8():
    # Huawei's test/npu/test_tensors.py::test_hif8 (an Ascend950 test there)
    tensor = torch.randn([2, 2], dtype=torch.float16).npu()
    hif8_tensor = H.to_hifloat8(tensor)
    assert hif8_tensor.dtype == torch.float16
    assert hif8_tensor._data.dtype == torch.uint8


def test_to_and_from_hifloat8():
    x = torch.randn(3, 4) * 8
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        h = H.to_hifloat8(x.to(dtype))  # a CPU tensor is moved to the npu
        assert isinstance(h, H) and h.dtype == dtype and h.shape == (3, 4) and h.device.type == "npu"
        assert torch.equal(h._data.cpu(), encode(x.to(dtype)))
        out = h.from_hifloat8()
        assert type(out) is torch.Tensor and out.dtype == dtype
        assert torch.equal(out.cpu(), decode(encode(x.to(dtype))).to(dtype))
    h = H.to_hifloat8(x)
    assert h.float().dtype == torch.float32 and h.half().dtype == torch.float16 and h.bfloat16().dtype == torch.bfloat16
    assert h.cpu().device.type == "cpu" and torch.equal(h.cpu(), decode(encode(x)))
    assert H.to_hifloat8(torch.arange(6)).dtype == torch.float32  # other dtypes: float32
    assert H.to_hifloat8(x.double()).dtype == torch.float32
    assert h.to_dtype(torch.float16).dtype == torch.float16 and h.to_dtype(torch.float16)._data is h._data
    assert repr(h).startswith("HiFloat8Tensor(data=tensor(")


def test_constructor_and_make_like():
    data = encode(torch.randn(2, 3))
    h = H(data=data, dtype=torch.bfloat16)
    assert h.dtype == torch.bfloat16 and h._data.device.type == "npu"
    assert H(data=data.npu()).dtype == torch.float32
    like = H.make_like(h, data=data.npu())
    assert like.dtype == torch.bfloat16
    assert H.make_like(h, data=data.npu(), dtype=torch.float16).dtype == torch.float16
    with pytest.raises(ValueError, match="requires data buffer with 8-bit dtype"):
        H(data=torch.zeros(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="non-differentiable data buffer"):
        H(data=torch.zeros(2, dtype=torch.float8_e5m2).requires_grad_())
    with pytest.raises(TypeError):
        H(data)  # keyword-only


def test_views_share_codes():
    x = torch.randn(4, 6)
    h = H.to_hifloat8(x)
    for v, ref in ((h.view(6, 4), x.view(6, 4)), (h.view((24,)), x.view(24)), (h.reshape(2, 12), x.reshape(2, 12)),
                   (h.transpose(0, 1), x.t()), (h[1:3], x[1:3]), (h.detach(), x)):
        assert isinstance(v, H) and v.shape == ref.shape
        assert v._data.untyped_storage().data_ptr() == h._data.untyped_storage().data_ptr()
        assert torch.equal(v.cpu(), decode(encode(ref)))
    t = h.transpose(0, 1)
    assert not t.is_contiguous()
    c = t.contiguous()
    assert isinstance(c, H) and c._data.is_contiguous() and torch.equal(c.cpu(), t.cpu())
    assert h.contiguous() is h
    cl = h.clone()
    assert isinstance(cl, H) and cl._data.data_ptr() != h._data.data_ptr() and torch.equal(cl.cpu(), h.cpu())


def test_dispatch_copies_and_operators():
    x = torch.randn(3, 4)
    h = H.to_hifloat8(x)
    # other operators decode: results are plain tensors of the nominal dtype
    s = h + 1
    assert type(s) is torch.Tensor and torch.equal(s.cpu(), decode(encode(x)) + 1)
    assert torch.equal(torch.matmul(h, h.transpose(0, 1).float()).cpu(),
                       decode(encode(x)) @ decode(encode(x)).t())
    # a copy into it encodes; out of it decodes; codes copy as they are
    y = torch.randn(3, 4)
    h.copy_(y.npu())
    assert torch.equal(h._data.cpu(), encode(y))
    plain = torch.empty(3, 4).npu()
    plain.copy_(h)
    assert torch.equal(plain.cpu(), decode(encode(y)))
    other = H.to_hifloat8(torch.zeros(3, 4))
    other.copy_(h)
    assert torch.equal(other._data.cpu(), h._data.cpu())
    h.copy_(torch.tensor(2.0).npu())  # broadcast
    assert torch.equal(h.cpu(), torch.full((3, 4), 2.0))
    # in-place operators write back as codes and return the tensor
    r = h.mul_(1.1)
    assert r is h and torch.equal(h._data.cpu(), encode(torch.full((3, 4), 2.0) * 1.1))
    # .data = t encodes t
    h.data = torch.ones(3, 4).npu()
    assert torch.equal(h.cpu(), torch.ones(3, 4))


def test_autograd_passes_gradients_through():
    x = torch.randn(3, 4, requires_grad=True)
    h = H.to_hifloat8(x)
    assert h.requires_grad
    (h.from_hifloat8() * 3).sum().backward()
    assert x.grad.device.type == "cpu" and torch.equal(x.grad, torch.full((3, 4), 3.0))
    x.grad = None
    H.to_hifloat8(x).view(12).float().sum().backward()
    assert torch.equal(x.grad, torch.ones(3, 4))
    x.grad = None
    (H.to_hifloat8(x).transpose(0, 1).float() * torch.arange(3.0).npu()).sum().backward()
    assert torch.equal(x.grad, torch.arange(3.0).view(3, 1).expand(3, 4))


def test_pickle_round_trip():
    h = H.to_hifloat8(torch.randn(2, 5)).to_dtype(torch.float16)
    rebuild, args = h.__reduce_ex__(2)
    again = rebuild(*args)
    assert isinstance(again, H) and again.dtype == torch.float16 and again._data is h._data
    buf = io.BytesIO()
    torch.save(h, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded, H) and torch.equal(loaded.cpu(), h.cpu())
