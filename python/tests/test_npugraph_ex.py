"""torch.npu.npugraph_ex: compile_fx, register_replacement, the compile cache and the scopes."""
import os
import textwrap

import pytest
import torch
import torch_npu  # noqa: F401
from torch._functorch.aot_autograd import aot_module_simplified

from conftest import run_python

npugraph_ex = torch.npu.npugraph_ex


def _aot_backend(compiled_graphs, options=None):
    """A custom backend compiling its forward graph with npugraph_ex.compile_fx."""
    def fw_compiler(gm, example_inputs):
        runner = npugraph_ex.compile_fx(gm, example_inputs, options)
        compiled_graphs.append((gm, runner))
        return runner

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler)

    return backend


def test_compile_fx_matches_eager_and_replays_an_npu_graph():
    torch._dynamo.reset()
    graphs = []
    f = torch.compile(lambda a, b: (a * b + 1).relu() @ b, backend=_aot_backend(graphs), fullgraph=True, dynamic=False)
    a, b = torch.randn(4, 4).npu(), torch.randn(4, 4).npu()
    for _ in range(3):
        a.normal_()
        assert torch.allclose(f(a, b).cpu(), ((a * b + 1).relu() @ b).cpu())
    (gm, runner), = graphs
    entry, = runner.entries.values()  # captured once, replayed since
    assert isinstance(entry[1], torch.npu.NPUGraph)


def test_compile_fx_clone_input_false_reads_the_callers_tensors():
    gm = torch.fx.symbolic_trace(lambda a, b: a + b)
    runner = npugraph_ex.compile_fx(gm, None, {"clone_input": False})
    a, b = torch.ones(3).npu(), torch.ones(3).npu()
    assert runner(a, b).tolist() == [2.0] * 3
    a.fill_(5)  # same addresses: the graph replays and reads the new values
    assert runner(a, b).tolist() == [6.0] * 3
    assert len(runner.entries) == 1
    c = torch.full((3,), 2.0).npu()  # another address: another capture
    assert runner(c, b).tolist() == [3.0] * 3
    assert len(runner.entries) == 2


def test_compile_fx_bad_arguments():
    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    with pytest.raises(TypeError, match="gm"):
        npugraph_ex.compile_fx(lambda a: a)
    with pytest.raises(TypeError, match="example_inputs"):
        npugraph_ex.compile_fx(gm, 3)
    with pytest.raises(ValueError, match="unknown option"):
        npugraph_ex.compile_fx(gm, [], {"no_such_option": 1})
    with pytest.raises(TypeError, match="clone_input"):
        npugraph_ex.compile_fx(gm, [], {"clone_input": "no"})


def test_backend_accepts_clone_input():
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: x + y, backend="npugraph_ex", options={"clone_input": False},
                      fullgraph=True, dynamic=False)
    x = torch.ones(1, dtype=torch.int32).npu()
    assert f(x, x).item() == 2


def _double_neg(x, y):
    return torch.add(torch.neg(torch.neg(x)), y)


def _plain_add(x, y):
    return torch.add(x, y)


def test_register_replacement_changes_the_compiled_graph():
    inputs = (torch.empty(8, device="npu"), torch.empty(8, device="npu"))
    assert npugraph_ex.register_replacement(_double_neg, _plain_add, inputs)
    torch._dynamo.reset()
    graphs = []
    f = torch.compile(lambda x, y: (torch.neg(torch.neg(x)) + y) * 2, backend=_aot_backend(graphs),
                      fullgraph=True, dynamic=False)
    x, y = torch.randn(8).npu(), torch.randn(8).npu()
    assert torch.allclose(f(x, y).cpu(), ((x + y) * 2).cpu())
    (gm, _), = graphs
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.neg.default not in targets
    assert torch.ops.aten.add.Tensor in targets


def test_register_replacement_extra_check_can_refuse():
    def search(x, y):
        return torch.sub(torch.neg(torch.neg(x)), y)

    def replace(x, y):
        return torch.sub(x, y)

    seen = []

    def never(match):
        seen.append(match)
        return False

    inputs = (torch.empty(8, device="npu"), torch.empty(8, device="npu"))
    npugraph_ex.register_replacement(search, replace, inputs, extra_check=never)
    torch._dynamo.reset()
    graphs = []
    f = torch.compile(lambda x, y: torch.neg(torch.neg(x)) - y, backend=_aot_backend(graphs), fullgraph=True)
    x, y = torch.randn(8).npu(), torch.randn(8).npu()
    assert torch.allclose(f(x, y).cpu(), (x - y).cpu())
    (gm, _), = graphs
    assert seen  # the pattern matched, the check refused it
    assert [n.target for n in gm.graph.nodes].count(torch.ops.aten.neg.default) == 2
    with pytest.raises(TypeError, match="search_fn"):
        npugraph_ex.register_replacement(None, replace, inputs)


_CACHE_SCRIPT = textwrap.dedent("""
    import sys
    import torch, torch_npu

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(4, 2)
            self.cached = torch.npu.npugraph_ex.inference.cache_compile(self.prompt, cache_dir=sys.argv[1])

        def prompt(self, x, kv):
            return self.linear(x["data"]) + kv[0], x["data"].sum()

    model = Model().npu()
    x = {"data": torch.arange(12.).reshape(3, 4).npu()}
    kv = [torch.ones(3, 2).npu()]
    for scale in (1.0, 2.0):
        x["data"].mul_(scale)
        out = model.cached(x, kv)
        ref = model.prompt(x, kv)
        assert all(torch.allclose(a.cpu(), b.cpu()) for a, b in zip(out, ref)), (out, ref)
    print(model.cached._compiled[0], model.cached.path)
""")


def test_cache_compile_writes_then_reuses_the_cache(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(_CACHE_SCRIPT)
    code = f"import sys; sys.argv = ['model.py', {str(tmp_path / 'cache')!r}]; exec(open({str(script)!r}).read())"
    first = run_python(code)
    assert first.returncode == 0, first.stderr
    kind, path = first.stdout.split()
    assert kind == "dynamo"
    assert os.path.isfile(path) and os.path.basename(path) == "compiled_module"
    rel = os.path.relpath(path, tmp_path / "cache").split(os.sep)
    assert rel[0].startswith("Model_dynamic_aclgraphcache_") and rel[1:] == ["prompt", "compiled_module"]
    mtime = os.path.getmtime(path)
    second = run_python(code)  # a new process: the cache, no Dynamo
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["cache", path]
    assert os.path.getmtime(path) == mtime


def test_readable_cache(tmp_path, capsys):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)
            self.cached = npugraph_ex.inference.cache_compile(self.decode, dynamic=False, cache_dir=str(tmp_path))

        def decode(self, x):
            return self.linear(x).relu()

    model = Model().npu()
    x = torch.randn(2, 2).npu()
    assert torch.allclose(model.cached(x).cpu(), model.decode(x).cpu())
    path = model.cached.path
    assert "_static_aclgraphcache_" in path
    out_file = tmp_path / "decode.py"
    text = npugraph_ex.inference.readable_cache(path, file=str(out_file))
    assert "def forward" in text and "L['x']" in text and "relu" in text
    assert out_file.read_text() == text
    assert text.strip() in capsys.readouterr().out
    assert npugraph_ex.inference.readable_cache(path, print_output=False) == text
    assert capsys.readouterr().out == ""
    with pytest.raises(FileNotFoundError, match="cache_bin"):
        npugraph_ex.inference.readable_cache(str(tmp_path / "missing"))


def test_cache_compile_bad_arguments():
    with pytest.raises(TypeError, match="func"):
        npugraph_ex.inference.cache_compile(lambda x: x)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="dynamic"):
        npugraph_ex.inference.cache_compile(model.forward, dynamic=1)
    with pytest.raises(ValueError, match="global_rank"):
        npugraph_ex.inference.cache_compile(model.forward, global_rank=-1)
    with pytest.raises(ValueError, match="unknown option"):
        npugraph_ex.inference.cache_compile(model.forward, no_such_option=1)


def test_limit_core_num_eager_sets_and_restores_the_stream_limit():
    stream = torch.npu.current_stream()
    before = torch.npu.get_stream_limit(stream)
    with npugraph_ex.scope.limit_core_num(4, 5):
        assert torch.npu.get_stream_limit(stream) == {"cube_core_num": 4, "vector_core_num": 5}
        with npugraph_ex.scope.limit_core_num(2, 3):
            assert torch.npu.get_stream_limit(stream) == {"cube_core_num": 2, "vector_core_num": 3}
        assert torch.npu.get_stream_limit(stream) == {"cube_core_num": 4, "vector_core_num": 5}
    assert torch.npu.get_stream_limit(stream) == before
    other = torch.npu.Stream()
    with npugraph_ex.scope.limit_core_num(1, 1, stream=other):
        assert torch.npu.get_stream_limit(other) == {"cube_core_num": 1, "vector_core_num": 1}
        assert torch.npu.get_stream_limit(stream) == before
    assert torch.npu.get_stream_limit(other) == before
    with pytest.raises(ValueError, match="op_aicore_num"):
        npugraph_ex.scope.limit_core_num(0, 1)
    with pytest.raises(TypeError, match="op_vectorcore_num"):
        npugraph_ex.scope.limit_core_num(1, "2")
    with pytest.raises(TypeError, match="stream"):
        npugraph_ex.scope.limit_core_num(1, 1, stream=3)


def test_deterministic_scope_sets_and_restores():
    assert not torch.are_deterministic_algorithms_enabled()
    with npugraph_ex.scope.deterministic(1):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch_npu.npu._deterministic_level == 1
        with npugraph_ex.scope.deterministic(0):
            assert not torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch_npu.npu._deterministic_level == 0
    with pytest.raises(ValueError, match="level"):
        npugraph_ex.scope.deterministic(3)
    with pytest.raises(RuntimeError):  # restored even when the block raises
        with npugraph_ex.scope.deterministic(2):
            raise RuntimeError("boom")
    assert not torch.are_deterministic_algorithms_enabled()


def test_scopes_inside_a_compiled_graph():
    torch._dynamo.reset()
    seen = {}

    def spy(a, b):
        seen["limit"] = torch.npu.get_stream_limit(torch.npu.current_stream())
        seen["det"] = torch.are_deterministic_algorithms_enabled()
        return a @ b

    def fn(a, b):
        with npugraph_ex.scope.limit_core_num(4, 5):
            with npugraph_ex.scope.deterministic(1):
                mm = a @ b
        return mm, a + b

    graphs = []
    f = torch.compile(fn, backend=_aot_backend(graphs), fullgraph=True, dynamic=False)
    a, b = torch.randn(8, 8).npu(), torch.randn(8, 8).npu()
    before = torch.npu.get_stream_limit(torch.npu.current_stream())
    mm, add = f(a, b)
    assert torch.allclose(mm.cpu(), (a @ b).cpu()) and torch.allclose(add.cpu(), (a + b).cpu())
    assert torch.npu.get_stream_limit(torch.npu.current_stream()) == before
    assert not torch.are_deterministic_algorithms_enabled()
    (gm, _), = graphs
    scoped = {n.target: n.meta.get("npugraph_ex_scope") for n in gm.graph.nodes if n.op == "call_function"}
    assert scoped[torch.ops.aten.mm.default] == {"_op_aicore_num": "4", "_op_vectorcore_num": "5",
                                                 "_deterministic_level": "1"}
    assert scoped[torch.ops.aten.add.Tensor] is None
    # the backend by name: same results, no graph break
    torch._dynamo.reset()
    g = torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=False)
    mm2, add2 = g(a, b)
    assert torch.allclose(mm2.cpu(), mm.cpu()) and torch.allclose(add2.cpu(), add.cpu())
    # the scope operators apply the limits when they run (eagerly, and at graph capture)
    torch.ops.npugraph_ex.scope_enter(["_op_aicore_num", "_op_vectorcore_num"], ["3", "4"])
    try:
        spy(a, b)
    finally:
        torch.ops.npugraph_ex.scope_exit()
    assert seen["limit"] == {"cube_core_num": 3, "vector_core_num": 4}
