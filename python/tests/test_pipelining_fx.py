"""torch_npu.distributed.pipelining.pipeline: splitting a model into pipeline stages.

mode='fx' (torch.fx tracing, atomic units kept whole) is checked against the unsplit model:
the stages composed give the model's output and gradients, and a 2-rank hccl run of torch's
schedules gives the single-process loss, output and gradients. mode=None is torch's
export-based pipeline. Bad arguments raise errors naming the argument.
"""
import copy
import re

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx
from torch.distributed.pipelining import Pipe, Schedule1F1B, ScheduleGPipe, SplitPoint
from torch.distributed.pipelining._IR import aten_pipe_split_alias

import torch_npu  # noqa: F401
from torch_npu.distributed.pipelining import pipeline
from conftest import init_hccl_rank, spawn_ranks

D = 8


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 2 * dim)
        self.fc2 = torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    """Blocks between an input and an output layer; ``bias`` is only used at the end and
    ``mask``/``scale`` are non-tensor arguments."""

    def __init__(self, dim=D, n_blocks=3):
        super().__init__()
        self.embed = torch.nn.Linear(dim, dim)
        self.blocks = torch.nn.ModuleList([Block(dim) for _ in range(n_blocks)])
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x, bias, mask=None, scale=1.0):
        assert mask is None
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h)) * scale + bias


def _inputs(batch=4, device="cpu"):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(batch, D, generator=g).to(device), torch.randn(batch, D, generator=g).to(device))


def _compose(pipe, *args):
    """The stages run one after another as the pipe's graph wires them, autograd flowing through."""
    return fx.Interpreter(pipe.split_gm).run(*args)


def _call_module_targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


@pytest.mark.parametrize("atomic", [None, ["blocks.0", "blocks.2"]])
def test_fx_stages_compose_to_the_model(atomic):
    torch.manual_seed(0)
    model = Net().npu()
    ref = copy.deepcopy(model)
    x, bias = _inputs(device="npu")
    split = {"blocks.1": SplitPoint.BEGINNING, "blocks.2": SplitPoint.BEGINNING}
    pipe = pipeline(model, (x, bias), split_spec=split, mode="fx", atomic_units=atomic)
    assert isinstance(pipe, Pipe) and pipe.num_stages == 3

    # atomic units are one call each; other blocks are traced into
    stage0, stage1, stage2 = (pipe.get_stage_module(i) for i in range(3))
    if atomic:
        assert "blocks.0" in _call_module_targets(stage0)
        assert "blocks.2" in _call_module_targets(stage2)
        assert not any(t.startswith("blocks.0.") for t in _call_module_targets(stage0))
    else:
        assert "blocks.0.fc1" in _call_module_targets(stage0)
    assert "blocks.1.fc1" in _call_module_targets(stage1)
    # the first stage takes the model's tensor inputs; bias reaches the last stage from it
    assert [n.target for n in stage0.graph.nodes if n.op == "placeholder"] == ["x", "bias"]

    # every parameter/buffer is in exactly one stage, under its name in the model
    keys = [k for i in range(3) for k in pipe.get_stage_module(i).state_dict()]
    assert sorted(keys) == sorted(model.state_dict())

    out = _compose(pipe, x, bias)
    expected = ref(x, bias)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(pipe(x, bias), expected)  # Pipe.forward (stages detached)

    out.square().sum().backward()
    expected.square().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref.get_parameter(name).grad, msg=name)


def test_fx_non_tensor_inputs_are_fixed():
    torch.manual_seed(0)
    model = Net(n_blocks=2)
    x, bias = _inputs()
    pipe = pipeline(model, (x, bias, None), {"scale": 0.5}, split_spec={"blocks.1": SplitPoint.END},
                    mode="fx")
    for node in pipe.split_gm.graph.nodes:
        if node.op == "call_module":
            stage = pipe.split_gm.get_submodule(node.target)
            placeholders = [n for n in stage.graph.nodes if n.op == "placeholder"]
            assert len(placeholders) == len(node.args)
            assert all(isinstance(p.meta["val"], torch.Tensor) for p in placeholders)
    torch.testing.assert_close(pipe(x, bias), model(x, bias, None, scale=0.5))
    torch.testing.assert_close(pipe(x, bias=bias), model(x, bias, scale=0.5))


def test_fx_split_inside_a_traced_block_and_by_policy():
    torch.manual_seed(0)
    model = Net(n_blocks=2)
    x, bias = _inputs()
    expected = model(x, bias)
    # a boundary between fc1 and fc2 of block 0: its residual input crosses to stage 1
    pipe = pipeline(model, (x, bias), split_spec={"blocks.0.fc1": SplitPoint.END}, mode="fx")
    assert pipe.num_stages == 2
    torch.testing.assert_close(pipe(x, bias), expected)

    calls = []

    def policy(gm):
        calls.append(gm)
        first = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "blocks.1")
        with gm.graph.inserting_before(first):
            gm.graph.call_function(aten_pipe_split_alias, ())
        gm.recompile()
        return gm

    pipe = pipeline(model, (x, bias), split_policy=policy, mode="fx", atomic_units=["blocks.1"])
    assert len(calls) == 1 and pipe.num_stages == 2
    assert _call_module_targets(pipe.get_stage_module(1))[0] == "blocks.1"
    torch.testing.assert_close(pipe(x, bias), expected)

    # no split point: one stage
    assert pipeline(model, (x, bias), mode="fx").num_stages == 1


def test_fx_tracing_leaves_model_state_alone():
    class WithState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(D, D)
            self.bn = torch.nn.BatchNorm1d(D)
            self.drop = torch.nn.Dropout(0.5)
            self.out = torch.nn.Linear(D, D)

        def forward(self, x):
            return self.out(self.drop(self.bn(self.lin(x))))

    torch.manual_seed(0)
    model = WithState().npu()
    x = torch.randn(4, D, device="npu")
    running = model.bn.running_mean.clone()
    cpu_rng, npu_rng = torch.get_rng_state(), torch.npu.get_rng_state()
    pipe = pipeline(model, (x,), split_spec={"out": SplitPoint.BEGINNING}, mode="fx")
    assert pipe.num_stages == 2
    assert torch.equal(model.bn.running_mean, running) and model.bn.num_batches_tracked.item() == 0
    assert torch.equal(torch.get_rng_state(), cpu_rng) and torch.equal(torch.npu.get_rng_state(), npu_rng)

    # a model on the meta device splits too (shapes from meta tensors)
    with torch.device("meta"):
        meta_model = Net(n_blocks=2)
    pipe = pipeline(meta_model, _inputs(batch=2), split_spec={"blocks.1": SplitPoint.BEGINNING}, mode="fx")
    placeholder = next(n for n in pipe.get_stage_module(1).graph.nodes if n.op == "placeholder")
    assert placeholder.meta["val"].shape == (2, D)


def test_export_mode_is_torch_pipeline():
    torch.manual_seed(0)
    model = Net(n_blocks=2)
    x, bias = _inputs()
    expected = model(x, bias)
    for mode in (None, "export"):
        pipe = pipeline(copy.deepcopy(model), (x, bias), split_spec={"blocks.1": SplitPoint.BEGINNING},
                        mode=mode)
        assert pipe.num_stages == 2
        (out,) = pipe(x, bias)  # torch's exported stages return a flat tuple
        torch.testing.assert_close(out, expected)


def test_bad_arguments():
    model = Net(n_blocks=2)
    x, bias = _inputs()
    args = (x, bias)
    cases = [
        (dict(module=lambda t: t, mb_args=args), TypeError, "module"),
        (dict(mb_args=args, mode="jit"), ValueError, "mode"),
        (dict(mb_args=args, atomic_units=["blocks.0"]), ValueError, "atomic_units"),
        (dict(mb_args=args, mode="export", atomic_units=[]), ValueError, "atomic_units"),
        (dict(mb_args=args, split_spec={"blocks.1": SplitPoint.BEGINNING}, split_policy=lambda g: g, mode="fx"),
         ValueError, "split_spec or split_policy"),
        (dict(mb_args=x, mode="fx"), TypeError, "mb_args"),
        (dict(mb_args=args, mb_kwargs=[1], mode="fx"), TypeError, "mb_kwargs"),
        (dict(mb_args=(x,), mode="fx"), TypeError, "mb_args/mb_kwargs"),
        (dict(mb_args=((x, bias),), mode="fx"), TypeError, "mb_args/mb_kwargs"),
        (dict(mb_args=args, mode="fx", atomic_units=["blocks.7"]), ValueError, "atomic_units entry 'blocks.7'"),
        (dict(mb_args=args, mode="fx", atomic_units="blocks.0"), TypeError, "atomic_units"),
        (dict(mb_args=args, mode="fx", split_spec={"nope": SplitPoint.END}), ValueError, "split_spec key 'nope'"),
        (dict(mb_args=args, mode="fx", split_spec={"head": "END"}), ValueError, "split_spec['head']"),
        (dict(mb_args=args, mode="fx", split_spec={"blocks.0.fc1": SplitPoint.END}, atomic_units=["blocks.0"]),
         ValueError, "inside atomic unit 'blocks.0'"),
        (dict(mb_args=args, mode="fx", split_policy="auto"), TypeError, "split_policy"),
        (dict(mb_args=args, mode="fx", split_policy=lambda gm: None), TypeError, "split_policy"),
    ]
    for kwargs, exc, text in cases:
        kwargs.setdefault("module", model)
        with pytest.raises(exc, match="pipeline: .*" + re.escape(text)):
            pipeline(**kwargs)

    class Pair(torch.nn.Module):
        def forward(self, x):
            return x + 1, x * 2

    class Sum(torch.nn.Module):
        def forward(self, pair):
            return pair[0] + pair[1]

    class PairNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pair, self.sum, self.unused = Pair(), Sum(), torch.nn.Linear(D, D)

        def forward(self, x):
            return self.sum(self.pair(x))

    net = PairNet()
    with pytest.raises(ValueError, match="pipeline: value 'pair' .*tuple.* cross a stage boundary"):
        pipeline(net, (x,), split_spec={"sum": SplitPoint.BEGINNING}, mode="fx",
                 atomic_units=["pair", "sum"])
    with pytest.raises(ValueError, match="split_spec key 'unused' names a module that forward never calls"):
        pipeline(net, (x,), split_spec={"unused": SplitPoint.BEGINNING}, mode="fx")


# ---- two ranks over hccl ----------------------------------------------------------------------

def _w_schedules(rank, world, port):
    import torch_npu  # noqa: F401  (spawned interpreters start fresh)
    init_hccl_rank(rank, world, port)
    dev = torch.device("npu", rank)
    microbatches = 4
    x, bias = _inputs(batch=8, device=dev)
    target = torch.randn(8, D, generator=torch.Generator().manual_seed(2)).to(dev)
    loss_fn = torch.nn.MSELoss(reduction="sum")
    for schedule_cls in (ScheduleGPipe, Schedule1F1B):
        torch.manual_seed(0)
        model = Net().to(dev)
        ref = copy.deepcopy(model)
        pipe = pipeline(model, (x[:2], bias[:2]), split_spec={"blocks.2": SplitPoint.BEGINNING},
                        mode="fx", atomic_units=["blocks.0", "blocks.2"])
        stage = pipe.build_stage(rank, dev)
        schedule = schedule_cls(stage, microbatches, loss_fn=loss_fn, scale_grads=False)
        losses = []
        if rank == 0:
            schedule.step(x, bias)
        else:
            out = schedule.step(target=target, losses=losses)

        expected = ref(x, bias)
        ref_loss = loss_fn(expected, target)
        ref_loss.backward()
        if rank == world - 1:
            torch.testing.assert_close(out, expected)
            assert len(losses) == microbatches
            torch.testing.assert_close(sum(losses), ref_loss)
        names = sorted(name for name, _ in stage.submod.named_parameters())
        for name, p in stage.submod.named_parameters():
            torch.testing.assert_close(p.grad, ref.get_parameter(name).grad, msg=f"{schedule_cls.__name__} {name}")
        gathered = [None] * world
        dist.all_gather_object(gathered, names)
        assert sorted(sum(gathered, [])) == sorted(name for name, _ in ref.named_parameters())
        assert any(n.startswith("blocks.2.") for n in gathered[1]) and "embed.weight" in gathered[0]
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_fx_pipeline_schedules_on_two_ranks():
    spawn_ranks(_w_schedules, 2)
