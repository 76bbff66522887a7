"""NPU storage formats: npu_format_cast, get_npu_format, empty_with_format, torch_npu.Format.

The storage of a tensor cast to FRACTAL_NZ / NC1HWC0 / FRACTAL_Z really holds the tiled,
zero-padded layout (checked here against a reference tiling written with plain torch),
its size follows torch_npu's rounding, and every operator gives on it the values it
gives on ND.
"""
import ctypes
import io
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu

ND, NCHW, NHWC, NC1HWC0, FRACTAL_Z, FRACTAL_NZ = 2, 0, 1, 3, 4, 29
NDC1HWC0, FRACTAL_Z_3D = 32, 33


def _ceil(n, b):
    return (n + b - 1) // b


# ---- reference tilings (plain torch on CPU) ---------------------------------------
def ref_nz(x):
    """[..., m, n] -> [..., n1, m1, 16, c0] with zero padding."""
    c0 = 32 if x.element_size() == 1 else 16
    *batch, m, n = x.shape
    m1, n1 = _ceil(m, 16), _ceil(n, c0)
    padded = torch.zeros(*batch, m1 * 16, n1 * c0, dtype=x.dtype)
    padded[..., :m, :n] = x
    split = padded.reshape(*batch, m1, 16, n1, c0)
    k = len(batch)
    return split.permute(*range(k), k + 2, k, k + 1, k + 3).contiguous()


def ref_nc1hwc0(x):
    n, c, h, w = x.shape
    c1 = _ceil(c, 16)
    padded = torch.zeros(n, c1 * 16, h, w, dtype=x.dtype)
    padded[:, :c] = x
    return padded.reshape(n, c1, 16, h, w).permute(0, 1, 3, 4, 2).contiguous()


def ref_fractal_z(x):
    n, c, h, w = x.shape
    n1, c1 = _ceil(n, 16), _ceil(c, 16)
    padded = torch.zeros(n1 * 16, c1 * 16, h, w, dtype=x.dtype)
    padded[:n, :c] = x
    t = padded.reshape(n1, 16, c1, 16, h, w).permute(2, 4, 5, 0, 1, 3)
    return t.reshape(c1 * h * w, n1, 16, 16).contiguous()


def physical(t, shape):
    """The physical bytes of t's storage, read as t's dtype in `shape`. (Device memory
    of the simulator is host memory; every tensor view of the storage, its
    untyped_storage() too, sees the base array's values instead, as kernels do.)"""
    torch.npu.synchronize()
    nbytes = t.untyped_storage().nbytes()
    raw = bytearray(ctypes.string_at(t.untyped_storage().data_ptr(), nbytes))
    return torch.frombuffer(raw, dtype=t.dtype).reshape(shape)


# ---- API -------------------------------------------------------------------------
def test_format_enum_and_default():
    assert torch_npu.Format.FRACTAL_NZ == 29 and torch_npu.Format.NC1HWC0 == 3
    x = torch.ones(2, 3).npu()
    fmt = torch_npu.get_npu_format(x)
    assert fmt == torch_npu.Format.ND and isinstance(fmt, torch_npu.Format)


@pytest.mark.parametrize("dtype,shape,storage_shape", [
    (torch.float16, (15, 17), (2, 1, 16, 16)),
    (torch.float32, (15, 17), (2, 1, 16, 16)),     # float32 tiles as float16 does
    (torch.bfloat16, (3, 33, 40), (3, 3, 3, 16, 16)),
    (torch.int8, (20, 40), (2, 2, 16, 32)),         # 1-byte types: c0 = 32
])
def test_nz_layout_and_size(dtype, shape, storage_shape):
    x = (torch.randn(shape) * 10).to(dtype)
    nz = torch_npu.npu_format_cast(x.npu(), FRACTAL_NZ)
    assert torch_npu.get_npu_format(nz) == FRACTAL_NZ
    assert nz.shape == x.shape and nz.dtype == dtype
    assert nz.untyped_storage().nbytes() == math.prod(storage_shape) * x.element_size()
    assert torch.equal(physical(nz, storage_shape), ref_nz(x))
    assert torch.equal(nz.cpu(), x)


def test_nc1hwc0_and_fractal_z_layouts():
    x = torch.randn(2, 20, 3, 5)
    t = torch_npu.npu_format_cast(x.npu(), NC1HWC0)
    assert torch_npu.get_npu_format(t) == NC1HWC0
    assert torch.equal(physical(t, (2, 2, 3, 5, 16)), ref_nc1hwc0(x))
    assert torch.equal(t.cpu(), x)
    w = torch.randn(18, 20, 3, 3)
    z = torch_npu.npu_format_cast(w.npu(), FRACTAL_Z)
    assert z.untyped_storage().nbytes() == 2 * 9 * 2 * 16 * 16 * 4
    assert torch.equal(physical(z, (2 * 9, 2, 16, 16)), ref_fractal_z(w))
    assert torch.equal(z.cpu(), w)


def test_5d_formats_round_trip():
    x = torch.randn(2, 17, 3, 4, 5)
    for fmt in (NDC1HWC0, FRACTAL_Z_3D):
        t = torch_npu.npu_format_cast(x.npu(), fmt)
        assert torch_npu.get_npu_format(t) == fmt
        assert torch.equal(t.cpu(), x)
        assert torch.equal(torch_npu.npu_format_cast(t, ND).cpu(), x)


def test_round_trips_and_same_format():
    x = torch.randn(15, 17).half()
    nz = torch_npu.npu_format_cast(x.npu(), FRACTAL_NZ)
    assert torch_npu.npu_format_cast(nz, FRACTAL_NZ).data_ptr() == nz.data_ptr()
    back = torch_npu.npu_format_cast(nz, ND)
    assert torch_npu.get_npu_format(back) == ND and torch.equal(back.cpu(), x)
    nd = torch.randn(4, 8).npu()
    assert torch_npu.npu_format_cast(nd, ND).data_ptr() == nd.data_ptr()
    # npu_format_cast(src, dst): dst's format
    assert torch_npu.get_npu_format(torch_npu.npu_format_cast(x.npu(), nz)) == FRACTAL_NZ
    # labels: NCHW / NHWC record the format over plain bytes
    lab = torch_npu.npu_format_cast(torch.ones(2, 2).npu(), NCHW)
    assert torch_npu.get_npu_format(lab) == NCHW and torch.equal(lab.cpu(), torch.ones(2, 2))


def test_inplace_cast():
    x = torch.randn(15, 17)
    t = x.npu()
    torch_npu.npu_format_cast_(t, FRACTAL_NZ)
    assert torch_npu.get_npu_format(t) == FRACTAL_NZ and torch.equal(t.cpu(), x)
    torch_npu.npu_format_cast_(t, ND)
    assert torch_npu.get_npu_format(t) == ND and torch.equal(t.cpu(), x)
    ptr = t.untyped_storage().data_ptr()
    torch_npu.npu_format_cast_(t, ND)
    assert t.untyped_storage().data_ptr() == ptr
    # Tensor overload: src's values into self, which keeps its format
    dst = torch_npu.npu_format_cast(torch.zeros(15, 17).npu(), FRACTAL_NZ)
    torch_npu.npu_format_cast_(dst, x.npu())
    assert torch_npu.get_npu_format(dst) == FRACTAL_NZ and torch.equal(dst.cpu(), x)


def test_vectors_stay_nd_and_bad_formats():
    v = torch_npu.npu_format_cast(torch.randn(12).npu(), FRACTAL_NZ)
    assert torch_npu.get_npu_format(v) == ND
    with pytest.raises(RuntimeError, match="acl_format 7"):
        torch_npu.npu_format_cast(torch.randn(4, 4).npu(), 7)
    with pytest.raises(RuntimeError, match="at most 4 dimensions"):
        torch_npu.npu_format_cast(torch.randn(1, 2, 3, 4, 5).npu(), NC1HWC0)
    with pytest.raises(RuntimeError, match="5-dimensional"):
        torch_npu.npu_format_cast(torch.randn(2, 3, 4, 5).npu(), NDC1HWC0)
    with pytest.raises(RuntimeError, match="npu tensor"):
        torch_npu.get_npu_format(torch.randn(2))


def test_empty_with_format():
    t = torch_npu.empty_with_format((4, 33, 7, 7), dtype=torch.float16, device="npu:0", acl_format=NC1HWC0)
    assert t.shape == (4, 33, 7, 7) and t.dtype == torch.float16
    assert torch_npu.get_npu_format(t) == NC1HWC0
    assert t.untyped_storage().nbytes() == 4 * 3 * 7 * 7 * 16 * 2
    t.fill_(1.5)
    assert torch.equal(t.cpu(), torch.full((4, 33, 7, 7), 1.5, dtype=torch.float16))
    assert torch_npu.get_npu_format(torch_npu.empty_with_format((3, 3))) == ND
    with pytest.raises(RuntimeError, match="npu device"):
        torch_npu.empty_with_format((2, 2), device="cpu", acl_format=FRACTAL_NZ)


# ---- operators on formatted tensors ------------------------------------------------
def _nz(x):
    return torch_npu.npu_format_cast(x.npu(), FRACTAL_NZ)


def test_ops_read_formatted_inputs():
    a, b = torch.randn(20, 33), torch.randn(33, 18)
    torch.testing.assert_close(torch.mm(_nz(a), _nz(b)).cpu(), a @ b)
    torch.testing.assert_close((_nz(a) * 2 + 1).cpu(), a * 2 + 1)
    torch.testing.assert_close(_nz(a).sum(dim=0).cpu(), a.sum(dim=0))
    torch.testing.assert_close(torch.cat([_nz(a), a.npu()]).cpu(), torch.cat([a, a]))


def test_linear_with_nz_weight_and_views():
    x, w, bias = torch.randn(5, 18), torch.randn(33, 18), torch.randn(33)
    out = F.linear(x.npu(), _nz(w), bias.npu())
    torch.testing.assert_close(out.cpu(), F.linear(x, w, bias))
    nz = _nz(w)
    torch.testing.assert_close(nz.t().contiguous().cpu(), w.t().contiguous())
    torch.testing.assert_close(nz[3:7, 2:].cpu(), w[3:7, 2:])
    torch.testing.assert_close(torch_npu.npu_format_cast(nz.t(), ND).cpu(), w.t())
    assert nz[4, 5].item() == w[4, 5].item()


def test_inplace_ops_keep_the_format():
    x = torch.randn(17, 20)
    t = _nz(x)
    t.mul_(2).add_(1)
    assert torch_npu.get_npu_format(t) == FRACTAL_NZ
    torch.testing.assert_close(t.cpu(), x * 2 + 1)
    t[2:5, :3] = 0                      # a write into a view of the tiled storage
    ref = x * 2 + 1
    ref[2:5, :3] = 0
    torch.testing.assert_close(t.cpu(), ref)
    t.copy_(torch.ones(17, 20))         # host -> device into NZ
    assert torch.equal(t.cpu(), torch.ones(17, 20))
    assert torch.equal(physical(t, (2, 2, 16, 16)), ref_nz(torch.ones(17, 20)))


def test_out_argument_in_nz_and_resize():
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    out = _nz(torch.zeros(16, 16))
    torch.add(a.npu(), b.npu(), out=out)
    assert torch_npu.get_npu_format(out) == FRACTAL_NZ
    torch.testing.assert_close(out.cpu(), a + b)
    out2 = _nz(torch.zeros(4, 4))
    torch.add(a.npu(), b.npu(), out=out2)   # resized by the kernel: becomes ND
    torch.testing.assert_close(out2.cpu(), a + b)
    assert torch_npu.get_npu_format(out2) == ND


def test_conv_and_batchnorm_with_formats():
    x, w = torch.randn(2, 20, 8, 8), torch.randn(18, 20, 3, 3)
    y = F.conv2d(torch_npu.npu_format_cast(x.npu(), NC1HWC0), torch_npu.npu_format_cast(w.npu(), FRACTAL_Z),
                 padding=1)
    torch.testing.assert_close(y.cpu(), F.conv2d(x, w, padding=1), atol=1e-4, rtol=1e-4)
    bn = torch.nn.BatchNorm2d(20)
    bn_npu = torch.nn.BatchNorm2d(20).npu()
    for name in ("running_mean", "running_var"):
        setattr(bn_npu, name, torch_npu.npu_format_cast(getattr(bn_npu, name), NC1HWC0))
    out = bn_npu(torch_npu.npu_format_cast(x.npu(), NC1HWC0))
    torch.testing.assert_close(out.cpu(), bn(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn_npu.running_mean.cpu(), bn.running_mean)
    assert torch_npu.get_npu_format(bn_npu.running_mean) == NC1HWC0


def test_autograd_through_cast():
    w = torch.randn(6, 20, requires_grad=True)
    wn = w.detach().npu().requires_grad_()
    y = torch_npu.npu_format_cast(wn, FRACTAL_NZ)
    assert y.requires_grad
    (y * torch.arange(20.).npu()).sum().backward()
    torch.testing.assert_close(wn.grad.cpu(), torch.arange(20.).expand(6, 20))


def test_training_step_with_nz_weight():
    torch.manual_seed(0)
    ref = torch.nn.Linear(18, 33)
    model = torch.nn.Linear(18, 33).npu()
    model.load_state_dict(ref.state_dict())
    model.weight.data = torch_npu.npu_format_cast(model.weight.data, FRACTAL_NZ)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(7, 18)
    for _ in range(2):
        for m, o, inp in ((ref, opt_ref, x), (model, opt, x.npu())):
            o.zero_grad()
            m(inp).pow(2).mean().backward()
            o.step()
    assert torch_npu.get_npu_format(model.weight) == FRACTAL_NZ
    torch.testing.assert_close(model.weight.cpu(), ref.weight, atol=1e-6, rtol=1e-5)


def test_compile_traces_format_cast():
    def f(x):
        return torch_npu.npu_format_cast(x, FRACTAL_NZ) * 2

    x = torch.randn(8, 16).npu()
    out = torch.compile(f, backend="eager")(x)
    torch.testing.assert_close(out.cpu(), x.cpu() * 2)


def test_views_of_other_dtypes_read_the_base_array():
    x = torch.randn(15, 17)
    nz = _nz(x)
    assert torch.equal(nz.view(torch.int32).cpu(), x.view(torch.int32))
    raw = nz.untyped_storage().cpu()          # base array's bytes, zeros after them
    base = torch.frombuffer(bytearray(bytes(raw)), dtype=torch.float32)
    assert torch.equal(base[:x.numel()].reshape(15, 17), x)
    assert torch.all(base[x.numel():] == 0)


@pytest.mark.parametrize("fmt", [FRACTAL_NZ, NC1HWC0, NCHW])
def test_save_and_load_keep_values_and_format(fmt):
    x = torch.randn(4, 20, 3, 5)
    t = torch_npu.npu_format_cast(x.npu(), fmt)
    buf = io.BytesIO()
    torch.save({"t": t, "view": t[1]}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert torch.equal(loaded["t"].cpu(), x) and torch.equal(loaded["view"].cpu(), x[1])
    assert torch_npu.get_npu_format(loaded["t"]) == fmt
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["t"].device.type == "cpu" and torch.equal(on_cpu["t"], x)


def test_deepcopy_keeps_the_tiled_format():
    import copy

    x = torch_npu.npu_format_cast(torch.rand(3, 5).npu(), 29)
    y = copy.deepcopy(x)
    assert torch_npu.get_npu_format(y) == 29 and torch.equal(y.cpu(), x.cpu())
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    x5 = torch_npu.npu_format_cast(torch.rand(2, 3, 4, 4).npu(), 3)
    y5 = copy.deepcopy(x5)
    assert torch_npu.get_npu_format(y5) == 3 and torch.equal(y5.cpu(), x5.cpu())
    # a base and its view in one deepcopy: the copies share the one (NZ) copied storage
    d = copy.deepcopy({"base": x, "view": x[1:]})
    assert torch_npu.get_npu_format(d["view"]) == 29
    assert d["view"].untyped_storage().data_ptr() == d["base"].untyped_storage().data_ptr()
    d["base"].fill_(7.0)
    assert torch.equal(d["view"].cpu(), torch.full((2, 5), 7.0)) and not torch.equal(x[1:].cpu(), d["view"].cpu())
    # ND tensors and CPU tensors are copied as before
    nd = torch.rand(4).npu()
    assert torch_npu.get_npu_format(copy.deepcopy(nd)) == 2
    assert torch.equal(copy.deepcopy(torch.ones(3)), torch.ones(3))


def test_nz_cast_keeps_nd_on_a_storage_set_as_bytes():
    # As torch_npu's storage desc: a storage made as bytes takes its shape from the first set_
    # onto it; a 1-D shape (set_(storage), storage.copy_) keeps ND under a FRACTAL_NZ cast.
    src = torch.arange(16.0).reshape(4, 4)
    s = torch.UntypedStorage(src.untyped_storage().size(), device="npu")
    s.copy_(src.untyped_storage())
    vec = torch.empty([], device="npu").set_(s)
    assert torch_npu.get_npu_format(torch_npu.npu_format_cast(vec, 29)) == 2
    mat = torch.empty([], device="npu").set_(s, 0, [4, 4], [4, 1])
    cast = torch_npu.npu_format_cast(mat, 29)
    assert torch_npu.get_npu_format(cast) == 2
    torch.testing.assert_close(cast.cpu(), src)
    # the first set_ covering the whole storage as a matrix gives it that shape
    fresh = torch.UntypedStorage(64, device="npu")
    mat2 = torch.empty([], device="npu").set_(fresh, 0, [4, 4], [4, 1])
    assert torch_npu.get_npu_format(torch_npu.npu_format_cast(mat2, 29)) == 29
    # tensors from factories are unaffected
    assert torch_npu.get_npu_format(torch_npu.npu_format_cast(torch.randn(4, 4).npu(), 29)) == 29
