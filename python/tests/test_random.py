"""torch.npu random number generation state."""

import pytest
import torch

import torch_npu


def test_manual_seed_makes_randn_reproducible():
    torch.npu.manual_seed(1234)
    a = torch.randn(64, device="npu")
    b = torch.rand(8, 8, device="npu")
    torch.npu.manual_seed(1234)
    assert torch.equal(a.cpu(), torch.randn(64, device="npu").cpu())
    assert torch.equal(b.cpu(), torch.rand(8, 8, device="npu").cpu())
    torch.npu.manual_seed(4321)
    assert not torch.equal(a.cpu(), torch.randn(64, device="npu").cpu())
    assert torch.npu.initial_seed() == 4321


def test_torch_manual_seed_seeds_all_npus():
    torch.manual_seed(7)
    a0 = torch.randn(16, device="npu:0").cpu()
    a3 = torch.randn(16, device="npu:3").cpu()
    torch.manual_seed(7)
    assert torch.equal(a0, torch.randn(16, device="npu:0").cpu())
    assert torch.equal(a3, torch.randn(16, device="npu:3").cpu())
    for idx in range(torch.npu.device_count()):
        with torch.npu.device(idx):
            assert torch.npu.initial_seed() == 7


def test_manual_seed_only_touches_current_device():
    torch.npu.manual_seed_all(11)
    with torch.npu.device(1):
        torch.npu.manual_seed(99)
        assert torch.npu.initial_seed() == 99
    assert torch.npu.initial_seed() == 11


def test_get_and_set_rng_state():
    torch.npu.manual_seed(5)
    state = torch.npu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    first = torch.randn(32, device="npu").cpu()
    torch.npu.set_rng_state(state)
    assert torch.equal(first, torch.randn(32, device="npu").cpu())
    # device arguments in all spellings
    with torch.npu.device(2):
        torch.npu.manual_seed(6)
    s2 = torch.npu.get_rng_state("npu:2")
    assert torch.equal(s2, torch.npu.get_rng_state(2))
    assert torch.equal(s2, torch.npu.get_rng_state(torch.device("npu", 2)))
    x = torch.randn(8, device="npu:2").cpu()
    torch.npu.set_rng_state(s2, device=2)
    assert torch.equal(x, torch.randn(8, device="npu:2").cpu())


def test_set_rng_state_of_torch_npu_on_ascend():
    # The state is torch_npu's: the seed and the Philox offset, 16 bytes. A checkpoint written on
    # Ascend (or here) restores exactly, in any process; the seed alone (8 bytes) is manual_seed.
    ascend = torch.tensor([1234, 48], dtype=torch.int64).view(torch.uint8)
    torch.npu.set_rng_state(ascend)
    assert torch.npu.initial_seed() == 1234
    first = torch.randn(16, device="npu").cpu()
    assert torch.npu.get_rng_state().view(torch.int64).tolist() == [1234, 64]  # 16 numbers drawn
    torch.npu.set_rng_state(ascend)
    assert torch.equal(first, torch.randn(16, device="npu").cpu())
    torch.npu.manual_seed(1234)
    assert not torch.equal(first, torch.randn(16, device="npu").cpu())  # offset 0: other numbers
    torch.npu.set_rng_state(torch.tensor([77], dtype=torch.int64).view(torch.uint8))
    assert torch.npu.initial_seed() == 77 and torch.npu.get_rng_state().view(torch.int64).tolist() == [77, 0]
    with pytest.raises(RuntimeError, match="of 16 bytes"):
        torch.npu.set_rng_state(torch.zeros(12, dtype=torch.uint8))


def test_state_in_another_process_continues_the_same_numbers():
    # (seed, offset) is the whole state: a state saved here continues in a fresh process with the
    # numbers this one draws next (resuming training from a checkpoint reproduces its dropout)
    import subprocess
    import sys

    torch.npu.manual_seed(9)
    torch.randn(100, device="npu")
    state = torch.npu.get_rng_state()
    here = torch.rand(8, device="npu").cpu()
    code = ("import torch, torch_npu, sys\n"
            "torch.npu.set_rng_state(torch.tensor(%r, dtype=torch.uint8))\n"
            "print(torch.rand(8, device='npu').cpu().tolist())\n" % state.tolist())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert torch.equal(torch.tensor(eval(out.stdout.strip().splitlines()[-1])), here)


def test_rng_state_all():
    states = torch.npu.get_rng_state_all()
    assert len(states) == torch.npu.device_count()
    draws = [torch.randn(4, device=f"npu:{i}").cpu() for i in range(len(states))]
    torch.npu.set_rng_state_all(states)
    again = [torch.randn(4, device=f"npu:{i}").cpu() for i in range(len(states))]
    assert all(torch.equal(a, b) for a, b in zip(draws, again))


def test_seed_and_seed_all():
    torch.npu.seed()
    assert isinstance(torch.npu.initial_seed(), int)
    torch.npu.seed_all()
    seeds = set()
    for idx in range(torch.npu.device_count()):
        with torch.npu.device(idx):
            seeds.add(torch.npu.initial_seed())
    assert len(seeds) == 1


def test_default_generators_and_explicit_generator():
    gens = torch.npu.default_generators
    assert len(gens) == torch.npu.device_count()
    assert all(g.device == torch.device("npu", i) for i, g in enumerate(gens))
    g = torch.Generator("npu").manual_seed(3)
    a = torch.randn(16, generator=g, device="npu").cpu()
    g.manual_seed(3)
    assert torch.equal(a, torch.randn(16, generator=g, device="npu").cpu())


def test_dropout_is_seeded():
    x = torch.ones(1000, device="npu")
    torch.npu.manual_seed(0)
    a = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.npu.manual_seed(0)
    assert torch.equal(a, torch.nn.functional.dropout(x, 0.5).cpu())


def test_bad_arguments():
    with pytest.raises(TypeError, match="'seed'"):
        torch.npu.manual_seed("abc")
    with pytest.raises(TypeError, match="'seed'"):
        torch.npu.manual_seed_all(None)
    with pytest.raises(TypeError, match="'new_state'"):
        torch.npu.set_rng_state(torch.zeros(4))
    with pytest.raises(TypeError, match="'new_state'"):
        torch.npu.set_rng_state([1, 2, 3])
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.get_rng_state(42)


def test_freeze_rng_state_covers_npu():
    from torch_npu.testing.common_utils import freeze_rng_state

    torch.npu.manual_seed(8)
    expected = torch.randn(8, device="npu").cpu()
    torch.npu.manual_seed(8)
    with freeze_rng_state():
        torch.randn(100, device="npu")
    assert torch.equal(expected, torch.randn(8, device="npu").cpu())
    assert torch_npu.npu.random.get_rng_state is torch.npu.get_rng_state
