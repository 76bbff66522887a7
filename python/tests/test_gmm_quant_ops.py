"""npu_grouped_matmul_swiglu_quant(_v2) (torch_npu/_gmm_quant_ops.py) against a float64
reference of op-plugin's documented formula written here, in each weight layout, plus the
argument checks."""
import pytest
import torch

import torch_npu


@pytest.fixture(autouse=True)
def _internal_format():
    old = torch.npu.config.allow_internal_format
    torch.npu.config.allow_internal_format = True
    yield
    torch.npu.config.allow_internal_format = old


# ---- the reference and the test's own layouts --------------------------------------------------

def ref_gmm_swiglu_quant(x, w, w_scale, x_scale, sizes, *, assist=None, smooth=None):
    """x [M, K] and w [E, K, N] integer values; w_scale [E, N] or [E, G, N]; sizes: rows per group.
    With assist (A8W4): C = Σ_g ((x - 8)_g . W_g) w_scale[g] + assist[e], times x_scale (the MSD
    formula: 16 high + low = x - 8); else C = (x . W) x_scale w_scale. Then SwiGLU (first half
    activated), smooth, and per-row int8 quantisation with scale max|S| / 127."""
    m, n = x.shape[0], w.shape[-1]
    out = torch.zeros(m, n // 2, dtype=torch.int8)
    scale = torch.zeros(m)
    start = 0
    for e, rows in enumerate(sizes):
        xe = x[start:start + rows].double()
        ws = w_scale[e].double()
        ws = ws.unsqueeze(0) if ws.dim() == 1 else ws
        gs = x.shape[1] // ws.shape[0]
        c = torch.zeros(rows, n, dtype=torch.float64)
        for g in range(ws.shape[0]):
            xg = xe[:, g * gs:(g + 1) * gs] - (8 if assist is not None else 0)
            c += (xg @ w[e, g * gs:(g + 1) * gs].double()) * ws[g]
        if assist is not None:
            c += assist[e].double()
        c = c * x_scale[start:start + rows].double().unsqueeze(-1)
        act, gate = c.chunk(2, -1)
        s = act / (1 + torch.exp(-act)) * gate
        if smooth is not None:
            s = s * smooth[e].double()
        amax = s.abs().amax(-1, keepdim=True)
        out[start:start + rows] = torch.round(s / (amax / 127)).to(torch.int8)
        scale[start:start + rows] = (amax / 127).squeeze(-1).float()
        start += rows
    return out, scale


def pack_int4(values):
    """[..., 8 c] integers in [-8, 7] -> int32 [..., c], eight nibbles a word, the lowest first."""
    nib = (values.long() & 0xF).reshape(*values.shape[:-1], -1, 8)
    word = sum(nib[..., i] << (4 * i) for i in range(8))
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def nz_tiles(w, c0):
    """[E, K, N] -> FRACTAL_NZ tiles [E, N/c0, K/16, 16, c0] (zero-padded)."""
    e, k, n = w.shape
    kp, np_ = -(-k // 16) * 16, -(-n // c0) * c0
    padded = torch.zeros(e, kp, np_, dtype=w.dtype)
    padded[:, :k, :n] = w
    return padded.reshape(e, kp // 16, 16, np_ // c0, c0).permute(0, 3, 1, 2, 4).contiguous()


def uint64_scale(s):
    """float32 scales as torch_npu's uint64 ones: the float's bits in the low 32 bits of an int64."""
    return s.float().view(torch.int32).long() & 0xFFFFFFFF


def cumsum_list(sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0)


def check(got, want):
    out, scale = got
    rout, rscale = want
    assert out.dtype == torch.int8 and scale.dtype == torch.float32
    assert out.shape == rout.shape and scale.shape == rscale.shape
    # float32 against float64: a value on a rounding boundary may land one step apart
    diff = (out.cpu().int() - rout.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01
    torch.testing.assert_close(scale.cpu(), rscale, rtol=1e-5, atol=0)


def a8w8_data(e, m, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (e, k, n), dtype=torch.int8, generator=g)
    return x, w, torch.rand(e, n, generator=g) * 0.01 + 0.001, torch.rand(m, generator=g) + 0.1


def int4_weight(e, k, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (e, k, n), dtype=torch.int8, generator=g)


# ---- A8W8 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("group_list_type", [0, 1])
def test_v2_a8w8_5d_tiles(group_list_type):
    e, m, k, n = 3, 12, 64, 64
    x, w, ws, xs = a8w8_data(e, m, k, n)
    sizes = [5, 0, 4]  # an empty group; the last 3 rows belong to none
    gl = cumsum_list(sizes) if group_list_type == 0 else torch.tensor(sizes)
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(
        x.npu(), [nz_tiles(w, 32).npu()], [ws.npu()], xs.npu(), gl.npu(), dequant_dtype=torch.float32,
        group_list_type=group_list_type)
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, sizes))
    assert not got[0][9:].cpu().any() and not got[1][9:].cpu().any()


def test_v2_a8w8_format_cast_weight_and_bf16_scale():
    e, m, k, n = 2, 10, 48, 96
    x, w, ws, xs = a8w8_data(e, m, k, n, seed=3)
    ws = ws.bfloat16()
    weight = torch_npu.npu_format_cast(w.npu(), 29)
    assert torch_npu.get_npu_format(weight) == torch_npu.Format.FRACTAL_NZ
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(x.npu(), [weight], [ws.npu()], xs.npu(),
                                                       cumsum_list([6, 4]).npu())
    check(got, ref_gmm_swiglu_quant(x, w, ws.float(), xs, [6, 4]))


def test_v1_a8w8_nz_view_of_format_cast_weight():
    # The 5-D view of a FRACTAL_NZ [E, K, N] tensor is that tensor's weight.
    e, m, k, n = 2, 9, 64, 128
    x, w, ws, xs = a8w8_data(e, m, k, n, seed=5)
    weight = torch_npu.npu_format_cast(w.npu(), 29).view(e, n // 32, k // 16, 16, 32)
    out, scale, offset = torch_npu.npu_grouped_matmul_swiglu_quant(x.npu(), weight, cumsum_list([4, 5]).npu(),
                                                                    ws.npu(), xs.npu())
    check((out, scale), ref_gmm_swiglu_quant(x, w, ws, xs, [4, 5]))
    assert offset.shape == () and offset.dtype == torch.float32 and offset.item() == 0


def test_tiles_cast_to_nz_stay_tiles():
    # A 5-D tensor of tiles cast to FRACTAL_NZ holds the same tiles (its storage is 5-D, no view).
    e, m, k, n = 2, 6, 32, 64
    x, w, ws, xs = a8w8_data(e, m, k, n, seed=8)
    weight = torch_npu.npu_format_cast(nz_tiles(w, 32).npu(), 29)
    assert torch_npu.get_npu_format(weight) == torch_npu.Format.FRACTAL_NZ and weight.dim() == 5
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(x.npu(), [weight], [ws.npu()], xs.npu(),
                                                       cumsum_list([1, 5]).npu())
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [1, 5]))


def test_a8w8_padded_tiles():
    # K and N off the 16 x 32 blocks: the tiles' padding is dropped.
    e, m, k, n = 2, 7, 40, 36
    x, w, ws, xs = a8w8_data(e, m, k, n, seed=7)
    tiles = nz_tiles(w, 32)
    assert list(tiles.shape) == [e, 2, 3, 16, 32]
    out, scale, _ = torch_npu.npu_grouped_matmul_swiglu_quant(x.npu(), tiles.npu(), cumsum_list([3, 4]).npu(),
                                                              ws.npu(), xs.npu())
    check((out, scale), ref_gmm_swiglu_quant(x, w, ws, xs, [3, 4]))


def test_large_k_accumulates_exactly():
    # |Σ x w| beyond 2^24: the int32 accumulation is exact.
    e, m, k, n = 1, 3, 2048, 32
    x = torch.full((m, k), 127, dtype=torch.int8)
    x[1] = -128
    w = torch.full((e, k, n), 127, dtype=torch.int8)
    w[0, :, 16:] = torch.randint(-128, 128, (k, 16), dtype=torch.int8)
    w[0, 0, :16] = torch.arange(16, dtype=torch.int8)
    ws, xs = torch.full((e, n), 1e-6), torch.ones(m)
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(x.npu(), [nz_tiles(w, 32).npu()], [ws.npu()], xs.npu(),
                                                       torch.tensor([m]).npu())
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [m]))


def test_zero_row_gives_zero():
    e, m, k, n = 1, 3, 32, 64
    x, w, ws, xs = a8w8_data(e, m, k, n, seed=9)
    x[1] = 0
    out, scale = torch_npu.npu_grouped_matmul_swiglu_quant_v2(x.npu(), [nz_tiles(w, 32).npu()], [ws.npu()],
                                                              xs.npu(), torch.tensor([m]).npu())
    assert not out[1].cpu().any() and scale[1].item() == 0
    check((out[::2], scale[::2]), tuple(t[::2] for t in ref_gmm_swiglu_quant(x, w, ws, xs, [m])))


# ---- A8W4 ----------------------------------------------------------------------------------------

def a8w4_data(e, m, k, n, groups=0, seed=11):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = int4_weight(e, k, n, seed)
    shape = (e, groups, n) if groups else (e, n)
    ws = torch.rand(shape, generator=g) * 0.02 + 0.001
    assist = torch.randn(e, n, generator=g) * 10
    return x, w, ws, torch.rand(m, generator=g) + 0.1, assist


def test_v1_a8w4_int32_packed_nz_view():
    # Huawei's layout: int4 pairs in an int8 [E, K, N/2] tensor cast to FRACTAL_NZ, viewed as int32
    # words [E, N/64, K/16, 16, 8]; bias is the weight assist matrix.
    e, m, k, n = 2, 8, 64, 128
    x, w, ws, xs, assist = a8w4_data(e, m, k, n)
    packed = pack_int4(w).view(torch.int8)  # [E, K, N/2] bytes, little-endian words
    weight = torch_npu.npu_format_cast(packed.npu(), 29).view(torch.int32).view(e, n // 64, k // 16, 16, 8)
    out, scale, _ = torch_npu.npu_grouped_matmul_swiglu_quant(x.npu(), weight, cumsum_list([3, 5]).npu(),
                                                              uint64_scale(ws).npu(), xs.npu(), bias=assist.npu())
    check((out, scale), ref_gmm_swiglu_quant(x, w, ws, xs, [3, 5], assist=assist))


@pytest.mark.parametrize("layout", ["nd", "nz3d", "tiles"])
def test_v2_a8w4_per_channel(layout):
    e, m, k, n = 2, 10, 64, 128
    x, w, ws, xs, assist = a8w4_data(e, m, k, n, seed=13)
    if layout == "nd":
        weight = pack_int4(w).npu()
    elif layout == "nz3d":
        weight = torch_npu.npu_format_cast(pack_int4(w).npu(), 29)
    else:
        weight = pack_int4(nz_tiles(w, 64)).npu()  # [E, N/64, K/16, 16, 8] words
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(
        x.npu(), [weight], [uint64_scale(ws).npu()], xs.npu(), cumsum_list([6, 4]).npu(),
        weight_assist_matrix=[assist.npu()], dequant_mode=0, dequant_dtype=torch.float32)
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [6, 4], assist=assist))


def test_v2_a8w4_per_group():
    e, m, k, n, groups = 2, 9, 128, 64, 4
    x, w, ws, xs, assist = a8w4_data(e, m, k, n, groups=groups, seed=17)
    weight = torch_npu.npu_format_cast(pack_int4(w).npu(), 29)
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(
        x.npu(), [weight], [uint64_scale(ws).npu()], xs.npu(), torch.tensor([2, 7]).npu(),
        weight_assist_matrix=[assist.npu()], dequant_mode=1, group_list_type=1)
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [2, 7], assist=assist))


def test_a8w4_with_offline_assist_equals_the_dequantised_matmul():
    # assist = 8 Σ_k W w_scale restores x = 16 high + low + 8: the result is that of x . (W w_scale).
    e, m, k, n, groups = 1, 6, 64, 64, 2
    x, w, ws, xs, _ = a8w4_data(e, m, k, n, groups=groups, seed=19)
    assist = 8 * (w.double().reshape(e, groups, k // groups, n).sum(2) * ws.double()).sum(1)
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(
        x.npu(), [pack_int4(w).npu()], [ws.npu()], xs.npu(), torch.tensor([m]).npu(),
        weight_assist_matrix=[assist.float().npu()], dequant_mode=1)
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [m]))


# ---- A4W4 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("smooth_shape", ["full", "per_expert"])
@pytest.mark.parametrize("tiles", [False, True])
def test_v2_a4w4(smooth_shape, tiles):
    e, m, k, n = 2, 7, 64, 128
    g = torch.Generator().manual_seed(23)
    x = torch.randint(-8, 8, (m, k), dtype=torch.int8, generator=g)
    w = int4_weight(e, k, n, seed=23)
    ws, xs = torch.rand(e, n, generator=g) * 0.01, torch.rand(m, generator=g) + 0.5
    smooth = torch.rand((e, n // 2) if smooth_shape == "full" else (e,), generator=g) + 0.5
    weight = pack_int4(nz_tiles(w, 64) if tiles else w)
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(
        pack_int4(x).npu(), [weight.npu()], [uint64_scale(ws).npu()], xs.npu(), cumsum_list([3, 4]).npu(),
        smooth_scale=smooth.npu())
    ref_smooth = smooth if smooth_shape == "full" else smooth.unsqueeze(-1)
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [3, 4], smooth=ref_smooth))


def test_a4w4_matches_npu_quantize_packing():
    # Huawei's preparation: int4 values packed by npu_quantize(..., torch.quint4x2, ...).
    e, m, k, n = 1, 5, 64, 64
    g = torch.Generator().manual_seed(29)
    x = torch.randint(-8, 8, (m, k), dtype=torch.int8, generator=g)
    w = int4_weight(e, k, n, seed=29)
    ws, xs, smooth = torch.rand(e, n, generator=g) * 0.01, torch.rand(m, generator=g), torch.rand(e, n // 2)
    one = torch.tensor([1.0]).npu()
    xq = torch_npu.npu_quantize(x.float().npu(), one, None, torch.quint4x2, -1, False)
    wq = torch_npu.npu_quantize(w.float().npu(), one, None, torch.quint4x2, -1, False)
    got = torch_npu.npu_grouped_matmul_swiglu_quant_v2(xq, [wq], [ws.npu()], xs.npu(), torch.tensor([m]).npu(),
                                                       smooth_scale=smooth.npu())
    check(got, ref_gmm_swiglu_quant(x, w, ws, xs, [m], smooth=smooth))


# ---- bad input -----------------------------------------------------------------------------------

def v2_args(e=2, m=4, k=32, n=64):
    x, w, ws, xs = a8w8_data(e, m, k, n)
    return x.npu(), [nz_tiles(w, 32).npu()], [ws.npu()], xs.npu(), cumsum_list([2, 2]).npu()


def v2(args, **kwargs):
    return torch_npu.npu_grouped_matmul_swiglu_quant_v2(*args, **kwargs)


def test_v2_bad_lists_and_shapes():
    x, w, ws, xs, gl = v2_args()
    with pytest.raises(RuntimeError, match="The size of weight should be 1, current size is 2"):
        v2((x, w * 2, ws, xs, gl))
    with pytest.raises(RuntimeError, match="The size of weight_scale should be greater than 0"):
        v2((x, w, [], xs, gl))
    with pytest.raises(RuntimeError, match="The x dim should greater than 2"):
        v2((x[0], w, ws, xs, gl))
    with pytest.raises(RuntimeError, match=r"x_scale must be float32 \[M\] with M = 4"):
        v2((x, w, ws, xs[:3], gl))
    with pytest.raises(RuntimeError, match="group_list must have one entry per expert"):
        v2((x, w, ws, xs, gl[:1]))
    with pytest.raises(RuntimeError, match="non-decreasing cumulative row ends"):
        v2((x, w, ws, xs, torch.tensor([3, 1]).npu()))
    with pytest.raises(RuntimeError, match="covering at most x's 4 rows"):
        v2((x, w, ws, xs, torch.tensor([3, 3]).npu()), group_list_type=1)
    with pytest.raises(RuntimeError, match=r"weight_scale must be \[E, N\] \(per channel\)"):
        v2((x, w, [ws[0][:1]], xs, gl))
    with pytest.raises(RuntimeError, match=r"5-D FRACTAL_NZ weight must be \[E, N/32, K/16, 16, 32\]"):
        v2((x, [w[0][..., :16]], ws, xs, gl))
    with pytest.raises(RuntimeError, match="weight must be 3-D"):
        v2((x, [w[0][0]], ws, xs, gl))
    with pytest.raises(RuntimeError, match="weight must be int8"):
        v2((x, [w[0].float()], ws, xs, gl))
    with pytest.raises(RuntimeError, match="x must be int8"):
        v2((x.float(), w, ws, xs, gl))


def test_v2_bad_modes():
    args = v2_args()
    with pytest.raises(RuntimeError, match="only supports float8_e8m0fnu or None"):
        v2(args, weight_scale_dtype=torch_npu.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="x_dtype and weight_dtype should both be"):
        v2(args, x_dtype=torch_npu.hifloat8)
    with pytest.raises(NotImplementedError, match="Ascend950"):
        v2(args, weight_scale_dtype=torch_npu.float8_e8m0fnu)
    with pytest.raises(NotImplementedError, match="Ascend950"):
        v2(args, dequant_mode=2, quant_mode=2)
    with pytest.raises(NotImplementedError, match="Ascend950"):
        v2(args, quant_dtype=torch.float8_e5m2)
    with pytest.raises(RuntimeError, match="dequant_dtype must be 0 or torch.float32"):
        v2(args, dequant_dtype=torch.int32)
    with pytest.raises(RuntimeError, match="group_list_type must be 0"):
        v2(args, group_list_type=2)
    with pytest.raises(RuntimeError, match="bias is reserved"):
        v2(args, bias=torch.zeros(2, 64, dtype=torch.int32).npu())
    with pytest.raises(RuntimeError, match="smooth_scale is only used in the A4W4 mode"):
        v2(args, smooth_scale=torch.ones(2, 32).npu())
    with pytest.raises(RuntimeError, match="weight_assist_matrix is only used in the A8W4 mode"):
        v2(args, weight_assist_matrix=[torch.ones(2, 64).npu()])
    with pytest.raises(RuntimeError, match=r"per-group weight scales .* only supported .*\(A8W4\)"):
        x, w, ws, xs, gl = args
        v2((x, w, [ws[0].unsqueeze(1)], xs, gl), dequant_mode=1)


def test_a8w4_bad_inputs():
    e, m, k, n = 2, 4, 64, 64
    x, w, ws, xs, assist = a8w4_data(e, m, k, n)
    args = (x.npu(), [pack_int4(w).npu()], [uint64_scale(ws).npu()], xs.npu(), cumsum_list([2, 2]).npu())
    with pytest.raises(RuntimeError, match="A8W4 mode .* needs the weight assist matrix"):
        v2(args)
    with pytest.raises(RuntimeError, match=r"weight assist matrix must be float32 \[E, N\] = \[2, 64\]"):
        v2(args, weight_assist_matrix=[assist[:, :32].npu()])
    with pytest.raises(RuntimeError, match="K_group_num .* must divide K"):
        v2(args[:2] + ([torch.ones(e, 3, n).npu()],) + args[3:], weight_assist_matrix=[assist.npu()],
           dequant_mode=1)
    with pytest.raises(RuntimeError, match=r"N/8 int32 words of int4"):
        v2(args[:1] + ([pack_int4(w[..., :32]).npu()],) + args[2:], weight_assist_matrix=[assist.npu()])


def test_v1_bad_inputs():
    x, w, ws, xs = a8w8_data(2, 4, 32, 64)
    args = (x.npu(), nz_tiles(w, 32).npu(), cumsum_list([2, 2]).npu(), ws.npu(), xs.npu())
    with pytest.raises(RuntimeError, match="offset .* is not supported"):
        torch_npu.npu_grouped_matmul_swiglu_quant(*args, offset=torch.zeros(2, 64).npu())
    with pytest.raises(RuntimeError, match="bias .* is only used with int4 weights"):
        torch_npu.npu_grouped_matmul_swiglu_quant(*args, bias=torch.zeros(2, 64).npu())
    with pytest.raises(RuntimeError, match="x must be int8"):
        torch_npu.npu_grouped_matmul_swiglu_quant(pack_int4(x).npu(), *args[1:])
    with pytest.raises(RuntimeError, match="N .* must be even"):
        torch_npu.npu_grouped_matmul_swiglu_quant(*args[:3], ws[:, :63].npu(), args[4])
