"""Sparse tensors on npu (ops/src/sparse.cpp): COO and compressed (CSR, CSC, BSR, BSC)
tensors whose members are npu tensors, each operator compared with the same operator on
CPU sparse tensors."""
import pytest
import torch
import torch_npu  # noqa: F401


def _dense(shape=(5, 6), density=0.4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    return x * (torch.rand(shape, generator=g) < density)


def _coo(shape=(5, 6), seed=0, coalesced=True):
    """An (uncoalesced unless `coalesced`) COO tensor on the cpu with duplicate indices."""
    s = _dense(shape, seed=seed).to_sparse()
    if coalesced:
        return s
    i, v = s._indices(), s._values()
    return torch.sparse_coo_tensor(torch.cat([i, i], 1), torch.cat([v, v * 0.5]), shape)


def _npu(x):
    return x.to("npu")


def _assert_same(npu, cpu):
    """Same layout, metadata and values (densified) as the CPU result."""
    assert npu.device.type == "npu", npu.device
    assert npu.layout == cpu.layout
    assert npu.shape == cpu.shape and npu.dtype == cpu.dtype
    back = npu.cpu()
    if cpu.layout == torch.sparse_coo:
        assert back.sparse_dim() == cpu.sparse_dim() and back.dense_dim() == cpu.dense_dim()
        assert back.is_coalesced() == cpu.is_coalesced()
        assert back._indices().device.type == "cpu"
        torch.testing.assert_close(back._indices(), cpu._indices())
        torch.testing.assert_close(back._values(), cpu._values())
    if cpu.layout != torch.strided:
        back, cpu = back.to_dense(), cpu.to_dense()
    torch.testing.assert_close(back, cpu)


# ---- creation and transfer ----

def test_sparse_coo_tensor_on_npu_matches_cpu():
    i = torch.tensor([[0, 1, 1, 3], [2, 0, 2, 1]])
    v = torch.tensor([3.0, 4.0, 5.0, -1.0])
    cpu = torch.sparse_coo_tensor(i, v, (4, 3))
    npu = torch.sparse_coo_tensor(i, v, (4, 3), device="npu")
    assert npu._indices().device.type == "npu" and npu._values().device.type == "npu"
    assert npu._nnz() == 4 and npu.sparse_dim() == 2 and npu.dense_dim() == 0
    _assert_same(npu, cpu)
    # from npu members
    npu2 = torch.sparse_coo_tensor(i.npu(), v.npu(), (4, 3))
    assert npu2.device.type == "npu"
    _assert_same(npu2, cpu)
    empty = torch.sparse_coo_tensor(size=(2, 3), device="npu")
    assert empty._nnz() == 0 and empty.device.type == "npu"
    _assert_same(empty, torch.sparse_coo_tensor(size=(2, 3)))


def test_sparse_coo_with_dims_and_tensors():
    i = torch.tensor([[0, 2], [1, 1]])
    v = torch.randn(2, 3)  # a dense dimension
    make = torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors
    cpu = make(2, 1, (3, 2, 3), i, v, dtype=torch.float32, layout=torch.sparse_coo)
    npu = make(2, 1, (3, 2, 3), i.npu(), v.npu(), dtype=torch.float32, layout=torch.sparse_coo, device="npu")
    assert npu.dense_dim() == 1 and npu._values().shape == (2, 3)
    _assert_same(npu, cpu)


@pytest.mark.parametrize("to", ["npu", "method", "to"])
def test_cpu_to_npu_and_back(to):
    cpu = _coo(coalesced=False)
    npu = {"npu": lambda: cpu.npu(), "method": lambda: cpu.to(device="npu"), "to": lambda: cpu.to("npu:0")}[to]()
    assert npu.device == torch.device("npu:0") and npu.layout == torch.sparse_coo
    assert not npu.is_coalesced()
    _assert_same(npu, cpu)


def test_csr_transfer_and_members():
    cpu = _dense().to_sparse_csr()
    npu = cpu.npu()
    assert npu.layout == torch.sparse_csr and npu.device.type == "npu"
    for name in ("crow_indices", "col_indices", "values"):
        m = getattr(npu, name)()
        assert m.device.type == "npu"
        torch.testing.assert_close(m.cpu(), getattr(cpu, name)())
    _assert_same(npu, cpu)
    csr = torch.sparse_csr_tensor(cpu.crow_indices(), cpu.col_indices(), cpu.values(), cpu.shape, device="npu")
    _assert_same(csr, cpu)


@pytest.mark.parametrize("layout", ["coo", "coo_sparse_dim", "csr", "csc", "bsr", "bsc"])
def test_to_sparse_on_npu(layout):
    x = _dense((4, 6))
    conv = {
        "coo": lambda t: t.to_sparse(),
        "coo_sparse_dim": lambda t: t.to_sparse(1),
        "csr": lambda t: t.to_sparse_csr(),
        "csc": lambda t: t.to_sparse_csc(),
        "bsr": lambda t: t.to_sparse_bsr((2, 3)),
        "bsc": lambda t: t.to_sparse_bsc((2, 2)),
    }[layout]
    npu, cpu = conv(x.npu()), conv(x)
    _assert_same(npu, cpu)
    # back to strided on the npu
    dense = npu.to_dense()
    assert dense.device.type == "npu" and dense.layout == torch.strided
    torch.testing.assert_close(dense.cpu(), x)
    # sparse -> another sparse layout on the npu
    if layout == "coo":
        _assert_same(npu.to_sparse_csr(), cpu.to_sparse_csr())
    if layout == "csr":
        _assert_same(npu.to_sparse(), cpu.to_sparse())


def test_members_coalesce_and_views():
    cpu = _coo(coalesced=False)
    npu = cpu.npu()
    assert not npu.is_coalesced()
    with pytest.raises(RuntimeError, match="coalesced"):
        npu.indices()  # the CPU raises as well
    c_npu, c_cpu = npu.coalesce(), cpu.coalesce()
    assert c_npu.is_coalesced()
    _assert_same(c_npu, c_cpu)
    torch.testing.assert_close(c_npu.indices().cpu(), c_cpu.indices())
    torch.testing.assert_close(c_npu.values().cpu(), c_cpu.values())
    # _values() is a view of the npu member: writing it changes the tensor
    c_npu._values().mul_(2)
    c_cpu._values().mul_(2)
    _assert_same(c_npu, c_cpu)


# ---- arithmetic ----

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_sparse_sparse_binary(op):
    a, b = _coo(seed=1, coalesced=False), _coo(seed=2)
    _assert_same(BINARY[op](a.npu(), b.npu()), BINARY[op](a, b))


@pytest.mark.parametrize("op", ["add", "sub", "add_alpha"])
def test_sparse_dense_binary(op):
    s, d = _coo(seed=3, coalesced=False), torch.randn(5, 6)
    _assert_same(BINARY[op](d.npu(), s.npu()), BINARY[op](d, s))
    # sparse (+|-) dense: the CPU refuses, and so does the npu, with the CPU's message
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        BINARY[op](s, d)
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        BINARY[op](s.npu(), d.npu())


def test_mul_by_dense_and_scalar():
    s, d = _coo(seed=4), torch.randn(5, 6)
    _assert_same(s.npu() * d.npu(), s * d)
    _assert_same(s.npu() * 3.0, s * 3.0)
    _assert_same(s.npu() / 2.0, s / 2.0)


@pytest.mark.parametrize("op", ["neg", "abs", "sin", "tanh", "sqrt_abs", "relu", "sign", "expm1", "log1p_abs",
                                "floor", "trunc", "square"])
def test_unary(op):
    f = {"sqrt_abs": lambda t: t.abs().sqrt(), "log1p_abs": lambda t: t.abs().log1p(),
         "square": lambda t: t.pow(2)}.get(op, lambda t: getattr(torch, op)(t))
    s = _coo(seed=5)
    _assert_same(f(s.npu()), f(s))


def test_unary_csr():
    s = _dense(seed=6).to_sparse_csr()
    for f in (torch.neg, torch.sin, torch.abs):
        _assert_same(f(s.npu()), f(s))


def test_sum():
    s = _coo(seed=7, coalesced=False)
    n = s.npu()
    torch.testing.assert_close(torch.sparse.sum(n).cpu(), torch.sparse.sum(s))
    _assert_same(torch.sparse.sum(n, dim=1), torch.sparse.sum(s, dim=1))
    torch.testing.assert_close(n.sum().cpu(), s.sum())


def test_in_place():
    a, b = _coo(seed=8), _coo(seed=9)
    na, nb = a.npu(), b.npu()
    na.add_(nb)
    a.add_(b)
    _assert_same(na, a)
    na.mul_(2.0)
    a.mul_(2.0)
    _assert_same(na, a)
    na.zero_()
    a.zero_()
    _assert_same(na, a)
    # dense += sparse (what an optimizer does with a sparse gradient)
    d = torch.randn(5, 6)
    nd = d.npu()
    nd.add_(nb, alpha=-0.1)
    d.add_(b, alpha=-0.1)
    torch.testing.assert_close(nd.cpu(), d)


def test_copy_between_devices():
    src = _coo(seed=10, coalesced=False)
    dst = torch.sparse_coo_tensor(size=(5, 6), device="npu")
    dst.copy_(src)
    _assert_same(dst, src)
    back = torch.sparse_coo_tensor(size=(5, 6))
    back.copy_(dst)
    _assert_same(back.npu(), src)


# ---- matrix products ----

def test_sparse_mm_and_addmm():
    s, d, bias = _coo(seed=11), torch.randn(6, 3), torch.randn(5, 3)
    ns, nd, nbias = s.npu(), d.npu(), bias.npu()
    _assert_same(torch.sparse.mm(ns, nd), torch.sparse.mm(s, d))
    _assert_same(torch.mm(ns, nd), torch.mm(s, d))
    _assert_same(ns @ nd, s @ d)
    _assert_same(torch.addmm(nbias, ns, nd, beta=0.5, alpha=2.0), torch.addmm(bias, s, d, beta=0.5, alpha=2.0))
    _assert_same(torch.sparse.addmm(nbias, ns, nd), torch.sparse.addmm(bias, s, d))
    # sparse x sparse
    t = _coo((6, 4), seed=12)
    _assert_same(torch.sparse.mm(ns, t.npu()), torch.sparse.mm(s, t))
    # CSR x dense
    c = s.to_sparse_csr()
    _assert_same(c.npu() @ nd, c @ d)


def test_sampled_addmm():
    mask = _dense((4, 5), seed=13).to_sparse_csr()
    m1, m2 = torch.randn(4, 3), torch.randn(3, 5)
    cpu = torch.sparse.sampled_addmm(mask, m1, m2, beta=0.5, alpha=2.0)
    npu = torch.sparse.sampled_addmm(mask.npu(), m1.npu(), m2.npu(), beta=0.5, alpha=2.0)
    _assert_same(npu, cpu)


# ---- autograd ----

def test_autograd_through_sparse_mm():
    s = _coo(seed=14)
    d = torch.randn(6, 3, requires_grad=True)
    nd = d.detach().npu().requires_grad_()
    torch.sparse.mm(s, d).pow(2).sum().backward()
    torch.sparse.mm(s.npu(), nd).pow(2).sum().backward()
    torch.testing.assert_close(nd.grad.cpu(), d.grad)


def test_autograd_to_sparse_to_dense():
    x = _dense(seed=15).requires_grad_()
    nx = x.detach().npu().requires_grad_()
    (x.to_sparse() * 3.0).to_dense().sin().sum().backward()
    (nx.to_sparse() * 3.0).to_dense().sin().sum().backward()
    torch.testing.assert_close(nx.grad.cpu(), x.grad)


def test_embedding_sparse_sgd_training_matches_cpu():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Embedding(20, 8, sparse=True), torch.nn.Linear(8, 1))
    npu_model = torch.nn.Sequential(torch.nn.Embedding(20, 8, sparse=True), torch.nn.Linear(8, 1))
    npu_model.load_state_dict(cpu_model.state_dict())
    npu_model.npu()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.0) for m in (cpu_model, npu_model)]
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        idx = torch.randint(0, 20, (4, 3), generator=g)
        target = torch.randn(4, 3, 1, generator=g)
        for model, opt, dev in ((cpu_model, opts[0], "cpu"), (npu_model, opts[1], "npu")):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(idx.to(dev)), target.to(dev))
            loss.backward()
            grad = model[0].weight.grad
            assert grad.is_sparse and grad.device.type == dev
            opt.step()
    weight = npu_model[0].weight
    assert weight.device.type == "npu" and weight.layout == torch.strided
    torch.testing.assert_close(weight.detach().cpu(), cpu_model[0].weight.detach())
    torch.testing.assert_close(npu_model[1].weight.detach().cpu(), cpu_model[1].weight.detach())


# ---- zero copy ----

def test_sparse_ops_move_no_bytes_between_host_and_device():
    x, d = _dense((64, 64), seed=18).npu(), torch.randn(64, 8).npu()
    # (A dense npu tensor's to_sparse_csr() takes torch_npu's CPU fallback, as in torch_npu.)
    csr = x.to_sparse_csr()
    torch.npu.synchronize()
    copied = lambda: (torch_npu._C._npu_copiedBytes(1), torch_npu._C._npu_copiedBytes(2))  # H2D, D2H
    before = copied()
    s = x.to_sparse()
    t = (s + s * 2.0).coalesce()
    y = torch.sparse.mm(t, d)
    z = torch.sparse.sampled_addmm(csr, x, x)
    dense = t.to_dense()
    torch.npu.synchronize()
    assert copied() == before, "sparse npu ops moved bytes between host and device"
    torch.testing.assert_close(dense.cpu(), x.cpu() * 3)
    torch.testing.assert_close(y.cpu(), (x.cpu() * 3) @ d.cpu())
    assert z.values().device.type == "npu"


def test_results_live_on_their_device():
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices")
    cpu = _coo(seed=19, coalesced=False)
    npu1 = cpu.to("npu:1")
    out = (npu1 + npu1).coalesce()
    assert out.device == torch.device("npu:1") and out._values().device == torch.device("npu:1")
    _assert_same(out, (cpu + cpu).coalesce())
    csr = npu1.to_sparse_csr()
    assert csr.values().device == torch.device("npu:1")
    _assert_same(csr, cpu.to_sparse_csr())


def test_embedding_bag_sparse_grad_matches_cpu():
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(30, 4, mode="sum", sparse=True)
    nbag = torch.nn.EmbeddingBag(30, 4, mode="sum", sparse=True).npu()
    nbag.load_state_dict(bag.state_dict())
    idx = torch.randint(0, 30, (6, 5))
    bag(idx).pow(2).sum().backward()
    nbag(idx.npu()).pow(2).sum().backward()
    _assert_same(nbag.weight.grad, bag.weight.grad)


# ---- bad input ----

def test_mixed_devices_raise():
    s = _coo(seed=16)
    with pytest.raises(RuntimeError, match="same device"):
        s.npu() + s
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(5, 6).npu().add_(s)
    with pytest.raises(RuntimeError, match="same device"):
        torch.sparse.mm(s.npu(), torch.randn(6, 2))
    i, v = s._indices(), s._values()
    with pytest.raises(RuntimeError, match="same device"):
        torch.sparse_coo_tensor(i.npu(), v, s.shape)
    with pytest.raises(RuntimeError, match="same device"):
        torch.sparse_coo_tensor(i, v.npu(), s.shape)
    with pytest.raises(RuntimeError, match="same device"):
        torch.sparse.sampled_addmm(_dense((5, 5)).to_sparse_csr().npu(), torch.ones(5, 2), torch.ones(2, 5).npu())
    if torch.npu.device_count() > 1:
        with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
            s.npu() + s.to("npu:1")


def test_bad_shapes_and_indices_raise_as_on_cpu():
    s = _coo(seed=20)
    with pytest.raises(RuntimeError, match="Expected dim 0 size 6, got 3"):
        torch.sparse.mm(s.npu(), torch.ones(3, 2).npu())
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        torch.sparse_coo_tensor(torch.tensor([[5], [0]]), torch.tensor([1.0]), (2, 2), device="npu",
                                check_invariants=True)


def test_unsupported_sparse_op_names_op_and_layout():
    s = _coo(seed=17).npu()
    with pytest.raises(NotImplementedError, match=r"aten::\w+.* sparse COO tensors on npu"):
        torch.cumsum(s, 0)
    with pytest.raises(NotImplementedError, match=r"aten::\w+.* sparse compressed .* tensors on npu"):
        torch.cumsum(_dense().to_sparse_csr().npu(), 0)


# ---- sparse COO add in float16 / bfloat16 (PyTorch's CPU kernel has none) --------------------

def _sparse(dtype, indices, values, size):
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values, dtype=dtype), size)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_add_in_reduced_precision(dtype):
    a = _sparse(dtype, [[0, 1, 3]], [[1.5, 2.0], [0.25, -1.0], [3.0, 4.0]], (5, 2))
    b = _sparse(dtype, [[1, 4]], [[2.0, 2.0], [-0.5, 8.0]], (5, 2))
    # Reference: the float sum rounded once to dtype.
    ref = (a.float().to_dense() + 3 * b.float().to_dense()).to(dtype)
    an, bn = a.npu(), b.npu()

    out = torch.add(an, bn, alpha=3)
    assert out.is_sparse and out.dtype == dtype and out.device.type == "npu"
    torch.testing.assert_close(out.to_dense().cpu(), ref, rtol=0, atol=0)

    res = torch.sparse_coo_tensor(size=(5, 2), dtype=dtype).npu()
    torch.add(an, bn, alpha=3, out=res)
    torch.testing.assert_close(res.to_dense().cpu(), ref, rtol=0, atol=0)

    an.add_(bn, alpha=3)
    torch.testing.assert_close(an.to_dense().cpu(), ref, rtol=0, atol=0)


def test_sparse_embedding_fp16_accumulates_gradients():
    # The second backward adds two sparse float16 gradients.
    emb = torch.nn.Embedding(10, 3, sparse=True).half().npu()
    idx = torch.tensor([7, 1, 3, 1]).npu()
    emb(idx).sum().backward()
    emb(idx).sum().backward()
    dense = emb.weight.grad.to_dense().cpu().float()
    ref = torch.zeros(10, 3)
    for i in [7, 1, 3, 1]:
        ref[i] += 2
    torch.testing.assert_close(dense, ref)


def test_sparse_fp16_gradients_accumulate_by_concatenation():
    # As CUDA's and torch_npu's kernels: the second backward concatenates (uncoalesced).
    for dtype in (torch.float16, torch.bfloat16):
        emb = torch.nn.Embedding(10, 3, sparse=True).to(dtype).npu()
        idx = torch.tensor([7, 1, 3]).npu()
        emb(idx).sum().backward()
        emb(idx).sum().backward()
        grad = emb.weight.grad
        assert not grad.is_coalesced()
        assert grad._indices().cpu().tolist() == [[7, 1, 3, 7, 1, 3]]
        assert grad._values().cpu().float().tolist() == [[1.0] * 3] * 6
    # more entries than elements: coalesced, so the sum stays bounded
    a = _sparse(torch.float16, [[0, 1, 0]], [1.0, 2.0, 3.0], (2,)).npu()
    out = torch.add(a, a, alpha=0.5)
    assert out._nnz() <= 2 and out.to_dense().cpu().tolist() == [6.0, 3.0]
    with pytest.raises(RuntimeError, match="same size"):
        torch.add(a, _sparse(torch.float16, [[0]], [1.0], (3,)).npu())


def test_embedding_bag_per_sample_weights_of_another_dtype_raise():
    bag = torch.nn.EmbeddingBag(5, 2, mode="sum").npu()
    idx, offsets = torch.tensor([3, 1, 1, 4]).npu(), torch.tensor([0, 2]).npu()
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Double"):
        bag(idx, offsets, torch.randn(4, dtype=torch.double).npu())
    with torch.no_grad():  # _embedding_bag_forward_only
        with pytest.raises(RuntimeError, match="expected scalar type Float but found Half"):
            bag(idx, offsets, torch.randn(4).half().npu())
    w = torch.randn(4).npu()
    ref = torch.nn.functional.embedding_bag(idx.cpu(), bag.weight.detach().cpu(), offsets.cpu(), mode="sum",
                                            per_sample_weights=w.cpu())
    torch.testing.assert_close(bag(idx, offsets, w).detach().cpu(), ref)
