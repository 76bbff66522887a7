"""Lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d``, ...) moved to npu before their first
forward, and ``Module.npu()`` keeping parameter objects, as on cuda (see
``torch_npu._patches._lazy_modules_to_npu``)."""

import pytest
import torch
import torch.nn as nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

import torch_npu  # noqa: F401

MOVES = {"npu()": lambda m: m.npu(), "to('npu')": lambda m: m.to("npu")}


def lazy_model():
    return nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5))


def batch(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(6, 3, 7, 7, generator=gen), torch.randn(6, 5, generator=gen)


@pytest.mark.parametrize("move", MOVES.values(), ids=list(MOVES))
def test_lazy_module_moves_uninitialized(move):
    model = lazy_model()
    params = list(model.parameters())
    moved = move(model)
    assert moved is model
    # Still the same, still uninitialized parameter objects, now on npu (cuda's behaviour;
    # before, .npu() raised and .to("npu") replaced them with empty ordinary Parameters).
    assert [p is q for p, q in zip(params, model.parameters())] == [True] * 4
    for p in model.parameters():
        assert isinstance(p, UninitializedParameter) and p.device.type == "npu"
    bn = nn.LazyBatchNorm1d().npu()
    assert isinstance(bn.running_mean, UninitializedBuffer) and bn.running_mean.is_npu


@pytest.mark.parametrize("move", MOVES.values(), ids=list(MOVES))
def test_lazy_module_initializes_on_npu_and_trains(move):
    torch.manual_seed(0)
    model = move(lazy_model())
    x, target = batch(1)
    out = model(x.npu())
    # The first forward materialized the parameters on npu with the right shapes.
    shapes = {name: (p.device.type, tuple(p.shape)) for name, p in model.named_parameters()}
    assert shapes == {"0.weight": ("npu", (4, 3, 3, 3)), "0.bias": ("npu", (4,)),
                      "3.weight": ("npu", (5, 100)), "3.bias": ("npu", (5,))}
    assert not any(isinstance(p, UninitializedParameter) for p in model.parameters())
    # Seeded initialization on npu is reproducible.
    torch.manual_seed(0)
    again = move(lazy_model())
    again(x.npu())
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p, q)

    # The same lazy module on cpu, given the npu-initialized weights (loading a state dict
    # materializes lazy parameters), computes the same forward and backward.
    reference = lazy_model()
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_out = reference(x)
    torch.testing.assert_close(out.cpu(), ref_out)
    nn.functional.mse_loss(out, target.npu()).backward()
    nn.functional.mse_loss(ref_out, target).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)

    # An optimizer created afterwards trains the npu module as it trains the cpu one.
    model.zero_grad(), reference.zero_grad()
    losses = []
    for module in (model, reference):
        device = next(module.parameters()).device
        opt = torch.optim.Adam(module.parameters(), lr=1e-2)
        history = []
        for step in range(20):
            opt.zero_grad()
            loss = nn.functional.mse_loss(module(x.to(device)), target.to(device))
            loss.backward()
            opt.step()
            history.append(loss.item())
        losses.append(history)
    npu_losses, cpu_losses = losses
    assert npu_losses[-1] < 0.5 * npu_losses[0]
    assert npu_losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


def test_module_npu_keeps_parameter_objects():
    # As Module.cuda(): the parameters are moved in place (param.data = moved), so an
    # optimizer built before the move keeps training the module's parameters.
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    model.npu()
    assert all(p is q and q.is_npu for p, q in zip(params, model.parameters()))
    x = torch.randn(8, 4)
    model(x.npu()).square().sum().backward()
    opt.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).square().sum().backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q)


def test_has_compatible_shallow_copy_type():
    compatible = torch._has_compatible_shallow_copy_type
    cpu, npu = torch.ones(2), torch.ones(2, device="npu")
    sparse_cpu = torch.ones(2, 2).to_sparse()
    sparse_npu = sparse_cpu.npu()
    # dense with dense and sparse with sparse, across cpu and npu (as across cpu and cuda)
    assert compatible(cpu, npu) and compatible(npu, cpu) and compatible(npu, npu)
    assert compatible(sparse_cpu, sparse_npu) and compatible(sparse_npu, sparse_cpu)
    assert not compatible(npu, sparse_npu) and not compatible(sparse_npu, npu)
    assert not compatible(cpu, sparse_npu) and not compatible(sparse_npu, cpu)
    assert not compatible(torch.ones(2, device="meta"), npu)
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        npu.data = sparse_npu
