"""torch_npu.jit.optimize: TorchScript rewrites onto npu fused operators (exact GELU -> npu::fast_gelu)."""
import pytest
import torch

import torch_npu
import torch_npu.jit
from torch_npu.jit.fusion_pass.fast_gelu import fast_gelu_pass


def _kinds(graph):
    return [n.kind() for n in graph.nodes()]


def test_function_gelu_becomes_fast_gelu():
    def f(x):
        return torch.nn.functional.gelu(x * 2)

    x = torch.rand(4, 4).npu()
    traced = torch.jit.trace(f, x, check_trace=False)
    torch_npu.jit.optimize(traced)  # before the first call, which fixes the execution plan
    kinds = _kinds(traced.graph)
    assert "npu::fast_gelu" in kinds and "aten::gelu" not in kinds
    torch.testing.assert_close(traced(x), torch_npu.fast_gelu(x * 2), atol=0, rtol=0)
    torch.testing.assert_close(traced(x), f(x), atol=0.02, rtol=0)  # fast_gelu approximates GELU


def test_module_and_submodules_are_rewritten_and_saved(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(),
                                torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(approximate="tanh"))).npu()
    x = torch.randn(2, 8).npu()
    traced = torch.jit.trace(model, x, check_trace=False)  # no call before optimize
    torch_npu.jit.optimize(traced)
    assert not traced.training
    sub = dict(traced.named_modules())
    assert "npu::fast_gelu" in _kinds(sub["1"].graph)
    assert "aten::gelu" in _kinds(sub["2.1"].graph)  # the tanh approximation is kept
    path = str(tmp_path / "m.pt")
    torch.jit.save(traced, path)
    loaded = torch.jit.load(path)
    torch.testing.assert_close(loaded(x), traced(x), atol=0, rtol=0)


def _exact_gelu(x):
    return torch.nn.functional.gelu(x)


def test_fast_gelu_pass_on_a_graph_and_bad_input():
    scripted = torch.jit.script(_exact_gelu)
    fast_gelu_pass(scripted.graph)
    assert "npu::fast_gelu" in _kinds(scripted.graph)
    with pytest.raises(TypeError, match="'jit_mod'"):
        torch_npu.jit.optimize(torch.nn.GELU())
