"""torch_npu.optim._DistributedMuon: Muon with the single-matrix, Shard(1) (all-reduced Gram
matrix) and Shard(0) (owner rank orthogonalizes, broadcasts) paths; 2 hccl ranks for the
sharded ones."""

import pytest
import torch
import torch.distributed as dist

import torch_npu  # noqa: F401
from torch_npu.optim import _DistributedMuon
from torch_npu.optim.distributed_muon import (_adjust_lr, _newtonschulz_orthogonalize,
                                              _distributed_zeropower_via_newtonschulz)
from conftest import init_hccl_rank, spawn_ranks

COEF = (3.4445, -4.7750, 2.0315)


def test_matches_torch_muon_without_process_group():
    torch.manual_seed(0)
    w0 = torch.randn(24, 40)
    grads = [torch.randn(24, 40) for _ in range(3)]
    ours = w0.clone().to("npu")
    ref = w0.clone()
    opt = _DistributedMuon([ours], lr=1e-2, weight_decay=0.05)
    ref_opt = torch.optim.Muon([ref], lr=1e-2, weight_decay=0.05)
    for g in grads:
        ours.grad = g.to("npu")
        ref.grad = g.clone()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(ours.cpu(), ref, atol=1e-5, rtol=1e-5)
    assert "momentum_buffer" in opt.state[ours]


def test_orthogonalizes_and_keeps_its_input():
    torch.manual_seed(1)
    for shape in [(16, 48), (48, 16)]:
        g = torch.randn(*shape, device="npu", dtype=torch.bfloat16)
        before = g.clone()
        q = _newtonschulz_orthogonalize(g, COEF, 5, 1e-7).float()
        assert q.dtype == torch.float32 and q.shape == shape
        small = q @ q.T if shape[0] < shape[1] else q.T @ q
        # the quintic iteration gives singular values in about [0.7, 1.2]
        eig = torch.linalg.eigvalsh(small.cpu().double())
        assert eig.min() > 0.4 and eig.max() < 1.5, eig
        assert torch.equal(g, before)


def test_adjusted_learning_rate():
    assert _adjust_lr(0.1, None, (64, 16)) == pytest.approx(0.2)
    assert _adjust_lr(0.1, "original", (16, 64)) == pytest.approx(0.1)
    assert _adjust_lr(0.1, "match_rms_adamw", (16, 64)) == pytest.approx(0.1 * 0.2 * 8)
    # the step: p <- p * (1 - lr * wd) - adjusted_lr * O(nesterov momentum of grad)
    w = torch.zeros(64, 16, device="npu")
    w.grad = torch.randn(64, 16, device="npu")
    opt = _DistributedMuon([w], lr=0.1, weight_decay=0.0, adjust_lr_fn="match_rms_adamw",
                           nesterov=False, momentum=0.5)
    opt.step()
    expected = -0.1 * 0.2 * 8 * _newtonschulz_orthogonalize(0.5 * w.grad).float()
    torch.testing.assert_close(w, expected, atol=1e-6, rtol=1e-6)


def test_bad_arguments_raise():
    w = torch.randn(4, 4, device="npu")
    with pytest.raises(ValueError, match="only supports 2D parameters"):
        _DistributedMuon([torch.randn(8, device="npu")])
    with pytest.raises(ValueError, match="Adjust learning rate function bad is not supported"):
        _DistributedMuon([w], adjust_lr_fn="bad")
    with pytest.raises(ValueError, match="Learning rate should be >= 0"):
        _DistributedMuon([w], lr=-1.0)
    with pytest.raises(ValueError, match="momentum should be >= 0"):
        _DistributedMuon([w], momentum=-1.0)
    with pytest.raises(ValueError, match="weight decay should be >= 0"):
        _DistributedMuon([w], weight_decay=-1.0)
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        _DistributedMuon([w], lr=torch.tensor([1e-3, 1e-3]))
    with pytest.raises(ValueError, match="less than 100"):
        _newtonschulz_orthogonalize(w, COEF, 100)
    with pytest.raises(ValueError, match="exactly 3 values"):
        _newtonschulz_orthogonalize(w, (1.0, 2.0))
    with pytest.raises(ValueError, match="2D matrix"):
        _newtonschulz_orthogonalize(torch.randn(4, device="npu"))
    w.grad = torch.randn(4, 4, device="npu").to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        _DistributedMuon([w]).step()


# ---- 2 ranks -------------------------------------------------------------------------------

def _init(rank, world, port):
    import torch_npu  # noqa: F401
    init_hccl_rank(rank, world, port)


def _w_sharded_paths(rank, world, port):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    _init(rank, world, port)
    try:
        mesh = init_device_mesh("npu", (world,))
        pg = mesh.get_group()
        # the Gram-matrix all-reduce gives the single-matrix result, tall and wide
        for m, n in [(16, 32), (32, 16)]:
            torch.manual_seed(3)
            x = torch.randn(m, n, device="npu", dtype=torch.bfloat16)
            local = x.chunk(world, dim=1)[rank].clone()
            q = _distributed_zeropower_via_newtonschulz(local, COEF, 5, 1e-7, pg)
            ref = _newtonschulz_orthogonalize(x).chunk(world, dim=1)[rank]
            assert (q.float() - ref.float()).abs().max() < 0.1
        # two steps of every path (33 rows: an uneven Shard(0)) against process_group=None
        torch.manual_seed(4)
        shapes = [(33, 20), (20, 40), (12, 12)]
        ws = [torch.randn(*s, device="npu") for s in shapes]
        gs = [[torch.randn(*s, device="npu") for s in shapes] for _ in range(2)]
        refs = [w.clone() for w in ws]
        ref_opt = _DistributedMuon(refs, lr=1e-2, weight_decay=0.1)
        def shard(t, d):  # the global shape given: the shards may be uneven
            return DTensor.from_local(t.chunk(world, dim=d)[rank].clone(), mesh, [Shard(d)],
                                      shape=t.shape, stride=t.stride())
        dts = [shard(w, d) for w, d in zip(ws, [0, 1, 0])]
        opt = _DistributedMuon(dts, lr=1e-2, weight_decay=0.1, process_group=pg)
        for step in range(2):
            for p, g in zip(refs, gs[step]):
                p.grad = g.clone()
            for p, g, d in zip(dts, gs[step], [0, 1, 0]):
                p.grad = shard(g, d)
            ref_opt.step()
            opt.step()
        for dt, ref, d in zip(dts, refs, [0, 1, 0]):
            full = dt.full_tensor()
            assert full.shape == ref.shape
            tol = 1e-6 if d == 0 else 2e-3  # Shard(0): the owner's result, bit for bit
            torch.testing.assert_close(full, ref, atol=tol, rtol=0)
    finally:
        dist.destroy_process_group()


def test_sharded_paths_match_single_matrix():
    spawn_ranks(_w_sharded_paths, 2)


def _w_fsdp2(rank, world, port, shard_dim, result_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    _init(rank, world, port)
    try:
        mesh = init_device_mesh("npu", (world,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8, bias=False)).to("npu")
        kw = {"shard_placement_fn": lambda p: Shard(shard_dim)}
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        opt = _DistributedMuon(model.parameters(), lr=2e-2, process_group=mesh.get_group())
        for step in range(3):
            torch.manual_seed(10 + step)
            x, y = torch.randn(8, 16).npu(), torch.randn(8, 8).npu()  # drawn on the CPU: independent of the npu generator
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        full = [p.full_tensor().cpu() for p in model.parameters()]
        if rank == 0:
            torch.save(full, result_path)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("shard_dim", [0, 1])
def test_fsdp2_matches_single_process(tmp_path, shard_dim):
    path = str(tmp_path / "w.pt")
    spawn_ranks(_w_fsdp2, 2, shard_dim, path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8, bias=False)).to("npu")
    opt = _DistributedMuon(model.parameters(), lr=2e-2)
    for step in range(3):
        torch.manual_seed(10 + step)
        x, y = torch.randn(8, 16).npu(), torch.randn(8, 8).npu()  # drawn on the CPU: independent of the npu generator
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    for got, ref in zip(torch.load(path), model.parameters()):
        torch.testing.assert_close(got, ref.detach().cpu(), atol=5e-3, rtol=0)
