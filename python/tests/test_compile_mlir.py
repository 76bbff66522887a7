"""torch.compile(..., options={"npu_backend": "mlir"}): npu graphs compiled through IREE.

Each distinct graph costs one iree-compile (~2-3 s here); the tests share a disk cache
(one temporary TORCHINDUCTOR_CACHE_DIR for the module), so a graph compiled once is loaded
from disk afterwards.
"""
import copy
import glob
import os
import re
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401
from torch_npu._inductor import mlir

from conftest import run_python

try:
    import iree.compiler  # noqa: F401
    import iree.runtime  # noqa: F401
    _HAVE_IREE = True
except ImportError:
    _HAVE_IREE = False

needs_iree = pytest.mark.skipif(not _HAVE_IREE, reason="iree-base-compiler/iree-base-runtime are not installed "
                                                       "(pip install iree-base-compiler==3.13.0 "
                                                       "iree-base-runtime==3.13.0)")
MLIR = {"npu_backend": "mlir"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("inductor_cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", path)
        mp.delenv(mlir.ENV_VAR, raising=False)
        yield path


@pytest.fixture(autouse=True)
def _fresh_dynamo(cache_dir):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _stats():
    from torch_npu._inductor.mlir import compiler

    return dict(compiler.stats)


def _delta(before):
    after = _stats()
    return {k: after[k] - before[k] for k in after}


class MLP(torch.nn.Module):
    def __init__(self, d=64, h=256):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))) + x


class NormBlock(torch.nn.Module):
    """Elementwise/normalisation-heavy: LayerNorm + GELU + residual, bias-dropout-add."""

    def __init__(self, d=256):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.bias = torch.nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x, residual):
        h = F.gelu(self.ln1(x)) + x
        h = F.dropout(h + self.bias, p=0.1, training=self.training) + residual
        return self.ln2(h) * torch.sigmoid(h)


def _assert_close(actual, expected, atol=1e-4, rtol=1e-4):
    assert actual.device.type == "npu"
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=rtol)


# ---- backend selection -------------------------------------------------------------

def test_resolve_priority_options_then_config_then_env(monkeypatch):
    import torch._inductor.config as config

    monkeypatch.delenv(mlir.ENV_VAR, raising=False)
    assert mlir.resolve_backend() == "default"
    monkeypatch.setenv(mlir.ENV_VAR, "mlir")
    assert mlir.resolve_backend() == "mlir"
    # A higher level wins: the lower one is not even consulted (an invalid value there
    # raises nothing).
    monkeypatch.setenv(mlir.ENV_VAR, "no-such-backend")
    with config.patch(npu_backend="mlir"):
        assert config.npu_backend == "mlir"
        assert mlir.resolve_backend() == "mlir"
    with config.patch(npu_backend="no-such-backend"):
        assert mlir.resolve_backend("mlir") == "mlir"
    monkeypatch.delenv(mlir.ENV_VAR)
    assert config.npu_backend == "default"
    assert mlir.resolve_backend("default") == "default"


@pytest.mark.parametrize("source", ["options", "config", "env"])
def test_bad_backend_value_is_a_clear_error(source, monkeypatch):
    import torch._inductor.config as config

    fn = torch.nn.Linear(4, 4).npu()
    x = torch.randn(2, 4).npu()
    expected = r"Unsupported npu_backend 'tvm' .*expected one of 'default', 'mlir'"
    if source == "options":
        with pytest.raises(ValueError, match=expected):
            torch.compile(fn, options={"npu_backend": "tvm"})
        return
    # (config.patch, not monkeypatch.setattr: undoing the latter deletes the config key)
    with config.patch(npu_backend="tvm" if source == "config" else "default"):
        if source == "env":
            monkeypatch.setenv(mlir.ENV_VAR, "tvm")
        with pytest.raises(Exception, match=expected):
            torch.compile(fn)(x)


def test_npu_backend_is_an_inductor_config_key():
    import torch._inductor.config as config

    assert "npu_backend" in config.get_config_copy()
    with pytest.raises(ValueError, match="Unsupported npu_backend 1"):
        torch.compile(torch.nn.Linear(2, 2), options={"npu_backend": 1})


@needs_iree
@pytest.mark.parametrize("source", ["options", "config", "env"])
def test_three_ways_select_mlir(source, monkeypatch):
    import torch._inductor.config as config

    torch.manual_seed(0)
    m = MLP().npu().eval()
    x = torch.randn(8, 64).npu()
    options = MLIR if source == "options" else None
    if source == "env":
        monkeypatch.setenv(mlir.ENV_VAR, "mlir")
    before = _stats()
    with torch.no_grad(), config.patch(npu_backend="mlir" if source == "config" else "default"):
        y = torch.compile(m, options=options)(x)
        _assert_close(y, m(x))
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 1 and d["fallbacks"] == 0, d


# ---- correctness ---------------------------------------------------------------------

@needs_iree
def test_mlp_matches_eager():
    torch.manual_seed(0)
    m = MLP().npu().eval()
    c = torch.compile(m, options=MLIR)
    before = _stats()
    with torch.no_grad():
        for _ in range(3):  # compiled once, then reused with fresh inputs
            x = torch.randn(8, 64).npu()
            _assert_close(c(x), m(x))
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 1 and d["fallbacks"] == 0, d


@needs_iree
def test_norm_block_matches_eager():
    torch.manual_seed(0)
    m = NormBlock().npu().eval()
    x, r = torch.randn(32, 256).npu(), torch.randn(32, 256).npu()
    before = _stats()
    with torch.no_grad():
        _assert_close(torch.compile(m, options=MLIR)(x, r), m(x, r))
    assert _delta(before)["fallbacks"] == 0


class TransformerBlock(torch.nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = MLP(d, 4 * d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = [z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v)]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return self.mlp(self.ln2(x)) + x


class ResNetBlock(torch.nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.Conv2d(c, c, 3, padding=1)
        self.bn1, self.bn2 = torch.nn.BatchNorm2d(c), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


@needs_iree
@pytest.mark.parametrize("name", ["transformer_sdpa", "resnet_block"])
def test_model_blocks_match_eager(name):
    torch.manual_seed(0)
    if name == "transformer_sdpa":
        m, x = TransformerBlock(), torch.randn(2, 16, 64)
    else:
        m, x = ResNetBlock(), torch.randn(2, 8, 16, 16)
        for bn in (m.bn1, m.bn2):  # non-trivial running statistics
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
    m = m.eval()
    with torch.no_grad():
        expected = m(x)
        before = _stats()
        _assert_close(torch.compile(m.npu(), options=MLIR)(x.npu()), expected)
    assert _delta(before)["fallbacks"] == 0


@needs_iree
def test_adamw_training_steps_match_eager():
    torch.manual_seed(0)
    ref = TransformerBlock(32, 2).npu()
    m = copy.deepcopy(ref)
    opts = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in (m, ref)]
    step = torch.compile(m, options=MLIR)
    before = _stats()
    for _ in range(3):
        x = torch.randn(2, 8, 32).npu()
        losses = []
        for model, opt in ((step, opts[0]), (ref, opts[1])):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            losses.append(loss.detach())
        _assert_close(losses[0], losses[1])
        for p, q in zip(m.parameters(), ref.parameters()):
            _assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-3)
        for opt in opts:
            opt.step()
    assert _delta(before)["fallbacks"] == 0
    # Adam divides by sqrt(v): on near-zero gradients, float noise moves a parameter by up
    # to lr; a wrong gradient would be off by about lr (1e-2) everywhere.
    for p, q in zip(m.parameters(), ref.parameters()):
        _assert_close(p, q, atol=3e-3, rtol=1e-3)


@needs_iree
def test_training_step_matches_eager():
    torch.manual_seed(0)
    ref = MLP(32, 64).npu()
    m = copy.deepcopy(ref)
    x = torch.randn(4, 32).npu()
    before = _stats()
    loss = torch.compile(m, options=MLIR)(x).square().mean()
    loss.backward()
    ref_loss = ref(x).square().mean()
    ref_loss.backward()
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 2 and d["fallbacks"] == 0, d  # forward and backward
    _assert_close(loss, ref_loss)
    for p, q in zip(m.parameters(), ref.parameters()):
        _assert_close(p.grad, q.grad)


@needs_iree
def test_no_copies_and_weights_by_reference():
    """Inputs, weights and results are npu memory IREE reads and writes in place: a call
    moves no bytes between host and device, and in-place weight updates are seen."""
    torch.manual_seed(0)
    m = MLP(16, 32).npu().eval()
    c = torch.compile(m, options=MLIR)
    x = torch.randn(4, 16).npu()
    with torch.no_grad():
        c(x)
        copied = [torch_npu._C._npu_copiedBytes(kind) for kind in (1, 2, 3)]  # H2D, D2H, D2D
        y = c(x)
        assert [torch_npu._C._npu_copiedBytes(kind) for kind in (1, 2, 3)] == copied
        assert y.device.type == "npu"
        m.fc2.weight.mul_(2)
        _assert_close(c(x), m(x))


@needs_iree
def test_waits_for_queued_work_on_the_stream():
    """The input is produced by a chain of kernels still queued on the stream when the
    compiled function is called: IREE must see their result, not the buffer's old bytes."""
    torch.manual_seed(0)
    f = torch.compile(lambda a: torch.tanh(a) * 2 + 1, options=MLIR)
    big_cpu = torch.randn(1024, 1024)
    big = big_cpu.npu()
    f(big)  # compile first, so that nothing below waits for the compiler
    for rep in range(2):
        expected = big_cpu.clone()
        for _ in range(6):
            expected = expected @ big_cpu / (32 + rep)
        expected = torch.tanh(expected) * 2 + 1
        a = big.clone()
        for _ in range(6):  # ~0.1 s of queued work; nothing synchronizes before f
            a = a @ big / (32 + rep)
        _assert_close(f(a), expected, atol=1e-3, rtol=1e-3)


@needs_iree
def test_graph_without_inputs_returns_npu_constants():
    """A constant-only graph: IREE cannot write it into the npu output buffer (a
    discard-write fill), so its results come back through the copying entry point."""
    f = torch.compile(lambda: torch.ones(3, device="npu") * 2, options=MLIR)
    for _ in range(2):
        _assert_close(f(), torch.full((3,), 2.0))


# ---- fallback ------------------------------------------------------------------------

@needs_iree
def test_unsupported_graph_falls_back_with_one_warning():
    def fn(a):  # IREE has no lowering for the Hurwitz zeta function
        return torch.special.zeta(a.abs() + 2, 2.0) * 3 + a

    x = torch.rand(16).npu()
    before = _stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = torch.compile(fn, options=MLIR)
        y1 = c(x)
        y2 = c(x * 2)
    ours = [w for w in caught if "MLIR backend" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "falling back to the default backend" in str(ours[0].message)
    assert "special_zeta" in str(ours[0].message)
    assert _delta(before)["fallbacks"] == 1
    _assert_close(y1, fn(x.cpu()))
    _assert_close(y2, fn((x * 2).cpu()))


# ---- disk cache ------------------------------------------------------------------------

@needs_iree
def test_cache_hit_in_a_fresh_process(tmp_path):
    code = textwrap.dedent("""
        import glob, os, torch, torch_npu
        from torch_npu._inductor.mlir import compiler
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.SiLU(), torch.nn.Linear(48, 8)).npu()
        x = torch.randn(4, 16).npu()
        with torch.no_grad():
            y = torch.compile(m, options={"npu_backend": "mlir"})(x)
            torch.testing.assert_close(y.cpu(), m(x).cpu(), atol=1e-4, rtol=1e-4)
        files = sorted(glob.glob(os.path.join(compiler.cache_dir(), "*.vmfb")))
        print("STATS", compiler.stats["compiled"], compiler.stats["cache_hits"], len(files))
    """)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        out = run_python(code, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(re.search(r"STATS (\d+) (\d+) (\d+)", out.stdout).groups())
    assert runs[0] == ("1", "0", "1")  # cold: compiled and stored
    assert runs[1] == ("0", "1", "1")  # warm: loaded from the stored module, nothing compiled


# ---- fusion ------------------------------------------------------------------------------

@needs_iree
def test_interpreter_exit_releases_iree_quietly(tmp_path):
    """A function compiled for two shapes keeps both modules in Dynamo's cache until the end
    of finalization; without the runtime's exit hook IREE's nanobind bindings printed a
    "leaked instances" report there. After the hook, a compiled graph refuses to run."""
    code = textwrap.dedent("""
        import atexit, sys, torch, torch_npu
        assert "torch_npu._inductor.mlir.runtime" not in sys.modules
        def after_release():  # registered first, so it runs after the runtime's own hook
            try:
                c(x, w)
            except RuntimeError as err:
                print("AFTER", err, flush=True)
        atexit.register(after_release)
        from torch_npu._inductor.mlir import runtime
        def f(x, w):
            return x @ w.t()
        c = torch.compile(f, options={"npu_backend": "mlir"}, dynamic=False)
        for n in (8, 16):
            x, w = torch.randn(n, 32).npu(), torch.randn(32, 32).npu()
            torch.testing.assert_close(c(x, w).cpu(), (x.cpu() @ w.cpu().t()), atol=1e-4, rtol=1e-4)
        print("LOADED", len(runtime._loaded), flush=True)
    """)
    out = run_python(code, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED 2" in out.stdout
    assert "released at interpreter exit" in out.stdout
    assert "leaked" not in out.stderr, out.stderr[-3000:]


@needs_iree
def test_dispatch_fuses_matmul_with_its_epilogue(tmp_path, monkeypatch):
    """IREE's dumped dispatch sources: the first Linear's matmul and GELU are one kernel."""
    from torch_npu._inductor.mlir import compiler

    monkeypatch.setenv(compiler.EXTRA_FLAGS_ENV, f"--iree-hal-dump-executable-sources-to={tmp_path}")
    torch.manual_seed(0)
    m = MLP(32, 64).npu().eval()
    x = torch.randn(8, 32).npu()
    with torch.no_grad():
        _assert_close(torch.compile(m, options=MLIR)(x), m(x))
    dispatches = glob.glob(os.path.join(str(tmp_path), "*dispatch*.mlir"))
    assert dispatches
    fused = []
    for path in dispatches:
        with open(path) as f:
            src = f.read()
        # GELU(x) = x/2 (1 + erf(x/sqrt 2)); at -O2 IREE writes x @ W^T as a linalg.generic
        # contraction (two parallel dimensions, one reduction) instead of linalg.matmul.
        contraction = "linalg.matmul" in src or 'iterator_types = ["parallel", "parallel", "reduction"]' in src
        if contraction and "math.erf" in src:
            fused.append(path)
        assert "linalg.pack" not in src, path
    assert fused, dispatches
    # Weights are arguments: executables that re-pack them (data tiling's "__encoding_*"
    # dispatches, linalg.pack) would copy every weight matrix on every call.
    assert not glob.glob(os.path.join(str(tmp_path), "*encoding*")), os.listdir(str(tmp_path))


@needs_iree
def test_layer_norm_reductions_are_vectorized(tmp_path, monkeypatch):
    """IREE's default -O0 keeps the order of floating-point additions, so a row sum
    becomes a chain of scalar adds (~1.35x slower LayerNorm + GELU block); the backend
    compiles at -O2, which lets LLVM reassociate: each vector reduction is ``reassoc``."""
    from torch_npu._inductor.mlir import compiler

    monkeypatch.setenv(compiler.EXTRA_FLAGS_ENV, f"--iree-hal-dump-executable-intermediates-to={tmp_path}")
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 256, generator=g), torch.rand(256, generator=g) + 0.5, torch.randn(256, generator=g)

    def fn(x, w, b):
        return F.gelu(F.layer_norm(x, (256,), w, b))

    with torch.no_grad():
        _assert_close(torch.compile(fn, options=MLIR)(x.npu(), w.npu(), b.npu()), fn(x, w, b))
    text = ""
    for path in glob.glob(os.path.join(str(tmp_path), "*.optimized.ll")):
        with open(path) as f:
            text += f.read()
    flags = re.findall(r"call ([a-z ]*)float @llvm\.vector\.reduce\.fadd", text)
    assert flags, "no vector reduction in the LayerNorm dispatch"
    assert all("reassoc" in f for f in flags), flags


@needs_iree
def test_compile_flags_are_part_of_the_cache_key(tmp_path, monkeypatch):
    from torch_npu._inductor.mlir import compiler

    def fn(a):
        return torch.tanh(a) * 2 + a

    x = torch.randn(8, 8).npu()
    compiled = []
    for extra in ("a", "b", "a"):  # extra iree-compile flags: two distinct keys, then a hit
        monkeypatch.setenv(compiler.EXTRA_FLAGS_ENV, f"--iree-hal-dump-executable-sources-to={tmp_path / extra}")
        torch._dynamo.reset()
        before = _stats()
        _assert_close(torch.compile(fn, options=MLIR)(x), fn(x.cpu()))
        compiled.append((_delta(before)["compiled"], _delta(before)["cache_hits"]))
    assert compiled == [(1, 0), (1, 0), (0, 1)]
    assert glob.glob(str(tmp_path / "b" / "*.mlir"))  # the second key really ran iree-compile


@needs_iree
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_iree_workers_follow_the_intra_op_threads(tmp_path):
    # A small graph runs on the calling thread (local-sync: no workers); a large one on one
    # IREE worker per intra-op thread (torch.set_num_threads, as the stream workers), each
    # pinned to one core.
    code = textwrap.dedent("""
        import os, torch, torch_npu
        from torch_npu._inductor.mlir import runtime
        torch.set_num_threads(int(os.environ["THREADS"]))
        def workers():
            tids = [t for t in os.listdir("/proc/self/task")
                    if open(f"/proc/self/task/{t}/comm").read().startswith("iree-worker")]
            return len(tids), sorted(len(os.sched_getaffinity(int(t))) for t in tids)
        f = torch.compile(lambda a: torch.tanh(a) + 1, options={"npu_backend": "mlir"}, dynamic=False)
        small = torch.randn(8, 8).npu()
        torch.testing.assert_close(f(small).cpu(), torch.tanh(small.cpu()) + 1)
        print("SMALL", sorted(runtime._devices), workers())
        large = torch.randn(runtime.SMALL_GRAPH_ELEMENTS // 256 + 1, 256).npu()
        torch.testing.assert_close(f(large).cpu(), torch.tanh(large.cpu()) + 1)
        print("LARGE", sorted(runtime._devices), workers())
    """)
    for threads, expected in (("1", "LARGE ['local-sync', 'local-task'] (1, [1])"),
                              ("2", "LARGE ['local-sync', 'local-task'] (2, [1, 1])")):
        out = run_python(code, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "THREADS": threads})
        assert out.returncode == 0, out.stderr[-3000:]
        assert "SMALL ['local-sync'] (0, [])" in out.stdout, out.stdout
        assert expected in out.stdout, out.stdout


@needs_iree
def test_iree_driver_follows_the_work():
    from torch_npu._inductor.mlir import compiler, runtime

    assert runtime.driver_for(runtime.SMALL_GRAPH_ELEMENTS) == "local-sync"
    assert runtime.driver_for(runtime.SMALL_GRAPH_ELEMENTS + 1) == "local-task"
    assert runtime.driver_for(None) == "local-task"
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda a, b: torch.mm(a, b) + 1, tracing_mode="fake")(torch.empty(64, 1024), torch.empty(1024, 4096))
    out = torch.empty(64, 4096)
    # 262144 result elements alone would be small; the matmul's 2^28 multiply-adds are not
    assert compiler._work(gm, [out]) == 64 * 4096 + 64 * 1024 * 4096
    conv = make_fx(lambda x, w: torch.conv2d(x, w), tracing_mode="fake")(torch.empty(1, 3, 8, 8), torch.empty(4, 3, 3, 3))
    assert compiler._work(conv, [torch.empty(1, 4, 6, 6)]) is None


# ---- dynamic shapes ------------------------------------------------------------------------

def _mlir_warnings(caught):
    return [str(w.message) for w in caught if "MLIR backend" in str(w.message)]


@needs_iree
def test_dynamic_shapes_one_module_serves_all_sizes():
    """dynamic=True: the graph's batch size is a symbol (``s0``, an integer graph input);
    IREE compiles it once with a dynamic dimension, and every size runs that module."""
    torch.manual_seed(0)
    m = MLP().npu().eval()
    c = torch.compile(m, options=MLIR, dynamic=True)
    before = _stats()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 8, 17, 64, 3):
            x = torch.randn(n, 64).npu()
            y = c(x)
            assert y.shape == (n, 64)
            _assert_close(y, m(x))
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 1 and d["fallbacks"] == 0, d
    assert not _mlir_warnings(caught)


@needs_iree
def test_automatic_dynamic_recompile_goes_through_iree():
    """Without dynamic=True, a second size makes Dynamo recompile with symbolic sizes (its
    "automatic dynamic"); that graph used to fall back to Inductor, now IREE takes it, and
    later sizes reuse it. Here two sizes become symbolic (batch and sequence). (Not with
    F.scaled_dot_product_attention: npu's SDPA specializes all its sizes while Dynamo traces.)"""
    torch.manual_seed(0)
    m = NormBlock(64).npu().eval()
    c = torch.compile(m, options=MLIR)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = _stats()
        for b, t in ((2, 16), (3, 16), (4, 9)):  # static, then symbolic graphs (Dynamo's choice)
            x, r = torch.randn(b, t, 64).npu(), torch.randn(b, t, 64).npu()
            _assert_close(c(x, r), m(x, r))
        d = _delta(before)
        assert d["compiled"] + d["cache_hits"] >= 2 and d["fallbacks"] == 0, d
        before = _stats()
        for b, t in ((5, 7), (3, 24), (6, 12)):  # served by the symbolic graph: no compile
            x, r = torch.randn(b, t, 64).npu(), torch.randn(b, t, 64).npu()
            _assert_close(c(x, r), m(x, r))
        assert _delta(before) == {"compiled": 0, "cache_hits": 0, "fallbacks": 0}
    assert not _mlir_warnings(caught)


@needs_iree
def test_dynamic_result_shapes_are_computed_per_call():
    """Results whose sizes are expressions of the symbols (2*s0, s0*s1, s0 - 1) and a size
    used as a value: the output buffers get each call's shapes."""
    def fn(x, y):
        n = x.shape[0]
        both = torch.cat([x, x * 2], 0)                # [2*s0, s1]
        flat = (x + 1).reshape(-1) * n                 # [s0*s1], a size as a scalar
        diff = x[1:] - x[:-1]                          # [s0 - 1, s1]
        return both, flat, diff, torch.tanh(y)         # y: its own symbols

    c = torch.compile(fn, options=MLIR, dynamic=True)
    before = _stats()
    for n, k in ((5, 3), (9, 7), (4, 16)):  # (n = 2 would recompile: x[1:] has 1 row)
        x, y = torch.randn(n, k), torch.randn(k + 1, 2)
        got = c(x.npu(), y.npu())
        for a, e in zip(got, fn(x, y)):
            assert a.shape == e.shape
            _assert_close(a, e)
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 1 and d["fallbacks"] == 0, d



def test_result_shapes_evaluate_symbols_from_the_inputs():
    import sympy
    from torch_npu._inductor.mlir.runtime import ResultShapes

    s0, s1, u0 = sympy.symbols("s0 s1 u0", integer=True, positive=True)
    sources = {s0: (1, 0), s1: (0, None)}  # s0: input 1's dim 0; s1: input 0 (an integer)
    shapes = ResultShapes([(2 * s0, 4), (s0 * s1 - 1,)], [s0 + s1, 7], sources)
    assert not shapes.static
    args = [5, torch.empty(3, 2)]
    assert shapes(args) == ([(6, 4), (14,)], [8, 7])
    assert shapes(args) is shapes(args)  # computed once per set of sizes
    assert shapes([2, torch.empty(10, 2)]) == ([(20, 4), (19,)], [12, 7])
    # A size no input carries (data-dependent): shapes unknown, IREE allocates the results.
    assert ResultShapes([(u0,)], [], sources)(args) == (None, [])
    static = ResultShapes([(3, 4)], [], {})
    assert static.static and static([]) == ([(3, 4)], [])
    with pytest.raises(ValueError, match="integer outputs"):
        ResultShapes([], [u0], sources)

@needs_iree
def test_dynamic_training_steps_match_eager():
    """Forward and backward with a symbolic batch size: the forward returns the size the
    backward needs (an integer output), both graphs are compiled once for all sizes."""
    torch.manual_seed(0)
    ref = MLP(32, 64).npu()
    m = copy.deepcopy(ref)
    step = torch.compile(m, options=MLIR, dynamic=True)
    before = _stats()
    for n in (4, 11, 6):
        x = torch.randn(n, 32).npu()
        for model in (step, ref):
            model.zero_grad()
            model(x).square().mean().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            _assert_close(p.grad, q.grad)
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 2 and d["fallbacks"] == 0, d  # forward, backward


@needs_iree
def test_cache_key_covers_the_symbolic_signature():
    """A dynamic graph's key names its symbolic sizes: another size hits the same module
    (after a Dynamo reset), and the static graph of the same code is a module of its own."""
    def fn(a):
        return torch.sigmoid(a) * a + 1

    hits = []
    for dynamic, n in ((True, 6), (True, 10), (False, 6)):
        torch._dynamo.reset()
        before = _stats()
        x = torch.randn(n, 12)
        _assert_close(torch.compile(fn, options=MLIR, dynamic=dynamic)(x.npu()), fn(x))
        d = _delta(before)
        hits.append((d["compiled"] + d["cache_hits"], d["cache_hits"]))
    assert hits == [(1, 0), (1, 1), (1, 0)], hits


@needs_iree
def test_dynamic_graph_iree_rejects_falls_back_with_one_warning():
    def fn(a):
        return torch.special.zeta(a.abs() + 2, 2.0) * 3 + a

    c = torch.compile(fn, options=MLIR, dynamic=True)
    before = _stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (16, 5, 9):
            x = torch.rand(n)
            _assert_close(c(x.npu()), fn(x))
    ours = _mlir_warnings(caught)
    assert len(ours) == 1 and "special_zeta" in ours[0], ours
    assert _delta(before)["fallbacks"] == 1



@needs_iree
@pytest.mark.parametrize("dynamic", [False, True])
def test_backward_iree_rejects_falls_back_with_one_warning(dynamic):
    """The forward compiles, the backward has an op torch-mlir cannot lower (reflection
    padding's backward): the backward is compiled while tracing, so its failure sends the
    whole graph to the default backend, with one warning, and the gradients are right."""
    def fn(x, w):
        return (F.pad(x, (2, 2, 2, 2), mode="reflect") * w).square().mean()

    torch.manual_seed(0)
    c = torch.compile(fn, options=MLIR, dynamic=dynamic)
    before = _stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 5) if dynamic else (2, 2):  # one graph (static: another size is another)
            x, w = torch.randn(n, 3, 8, 8), torch.randn(12, 12)
            got = [t.npu().requires_grad_() for t in (x, w)]
            ref = [t.clone().requires_grad_() for t in (x, w)]
            c(*got).backward()
            fn(*ref).backward()
            for a, e in zip(got, ref):
                _assert_close(a.grad, e.grad)
    ours = _mlir_warnings(caught)
    assert len(ours) == 1 and "reflection_pad2d_backward" in ours[0], ours
    assert _delta(before)["fallbacks"] == 1


# ---- NPU_INDUCTOR_FALLBACK_LIST ------------------------------------------------------------

def _aten_ops_run(fn, *args):
    """fn(*args) and the ATen ops that ran through the dispatcher (IREE's work does not).
    (The profiler, not a TorchDispatchMode: under one, Dynamo runs the function eagerly.)"""
    with torch.autograd.profiler.profile() as prof:
        result = fn(*args)
    return result, {e.name for e in prof.function_events if e.name.startswith("aten::")}


@needs_iree
@pytest.mark.parametrize("dynamic", [False, True])
def test_fallback_list_runs_listed_ops_as_aten(monkeypatch, dynamic):
    """As in Huawei's torch_npu: NPU_INDUCTOR_FALLBACK_LIST="aten.div" keeps the division
    out of the compiled code; the ops before and after it are compiled by IREE (two pieces)."""
    from torch_npu._inductor.mlir import compiler

    def fn(x, y):
        return torch.tanh(torch.sigmoid(x) / (y.abs() + 1)) * 2

    monkeypatch.setenv(compiler.FALLBACK_LIST_ENV, "aten.div")
    x, y = torch.randn(6, 8), torch.randn(6, 8)
    c = torch.compile(fn, options=MLIR, dynamic=dynamic)
    before = _stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _assert_close(c(x.npu(), y.npu()), fn(x, y))  # compiles
        got, seen = _aten_ops_run(c, x.npu(), y.npu())
        _assert_close(got, fn(x, y))
    assert "aten::div" in seen, seen
    assert not {"aten::tanh", "aten::sigmoid", "aten::abs", "aten::add"} & seen, seen
    d = _delta(before)
    assert d["compiled"] + d["cache_hits"] == 2 and d["fallbacks"] == 0, d
    assert not _mlir_warnings(caught)


@needs_iree
def test_fallback_list_allfallback_and_bad_names(monkeypatch):
    from torch_npu._inductor.mlir import compiler

    def fn(x):
        return torch.tanh(x) + 1

    x = torch.randn(5)
    monkeypatch.setenv(compiler.FALLBACK_LIST_ENV, "allfallback")
    before = _stats()
    c = torch.compile(fn, options=MLIR)
    _assert_close(c(x.npu()), fn(x))  # compiles
    got, seen = _aten_ops_run(c, x.npu())
    _assert_close(got, fn(x))
    assert {"aten::tanh", "aten::add"} <= seen, seen
    assert _delta(before) == {"compiled": 0, "cache_hits": 0, "fallbacks": 0}
    torch._dynamo.reset()
    monkeypatch.setenv(compiler.FALLBACK_LIST_ENV, "aten.div,aten.no_such_op")
    with pytest.raises(Exception, match="NPU_INDUCTOR_FALLBACK_LIST: cannot resolve the operator 'aten.no_such_op'"):
        torch.compile(fn, options=MLIR)(x.npu())


@needs_iree
def test_output_code_names_the_iree_kernels(monkeypatch):
    """run_and_get_code (Inductor's output-code hook) sees the graph as it runs: its IREE modules
    as mlir_fused_<ops>_<n> kernels, and the ATen calls NPU_INDUCTOR_FALLBACK_LIST keeps out."""
    from torch._inductor.utils import run_and_get_code

    from torch_npu._inductor.mlir import compiler

    def fn(x, y):
        return torch.sigmoid(x + y) / (y.abs() + 1)

    x, y = torch.randn(4, 4).npu(), torch.randn(4, 4).npu()
    monkeypatch.delenv(compiler.FALLBACK_LIST_ENV, raising=False)
    got, codes = run_and_get_code(torch.compile(fn, options=MLIR), x, y)
    _assert_close(got, fn(x, y))
    assert len(codes) == 1 and "mlir_fused_add_sigmoid_abs_div_0" in codes[0], codes
    monkeypatch.setenv(compiler.FALLBACK_LIST_ENV, "aten.div")
    got, codes = run_and_get_code(torch.compile(fn, options=MLIR), x, y)
    _assert_close(got, fn(x, y))
    assert "mlir_fused_add_sigmoid_abs_0" in codes[0], codes  # the ops before the division
    assert "torch.ops.aten.div.Tensor(" in codes[0] and "mlir_fused_div" not in codes[0], codes
    monkeypatch.setenv(compiler.FALLBACK_LIST_ENV, "allfallback")
    got, codes = run_and_get_code(torch.compile(fn, options=MLIR), x, y)
    _assert_close(got, fn(x, y))
    assert "mlir_fused_" not in codes[0] and "torch.ops.aten.sigmoid.default(" in codes[0], codes


# ---- matmuls in the op library --------------------------------------------------------------

@needs_iree
@pytest.mark.parametrize("dynamic", [False, True])
def test_large_matmuls_run_in_the_op_library(monkeypatch, dynamic):
    """Linear layers from LIBRARY_MATMUL_MIN_MACS multiply-adds up run as aten::mm on npu, with
    the transposed weight passed as a view (no copy: no IREE piece reads the weight); bias, GELU
    and the residual add stay in IREE. A threshold above the matmuls keeps them in IREE."""
    from torch_npu._inductor.mlir import compiler

    torch.manual_seed(0)
    m = MLP(128, 512).npu().eval()  # 128 x 512 x 128 = 8M multiply-adds per matmul
    x = torch.randn(128, 128).npu()
    with torch.no_grad():
        ref = m(x)
        for threshold, in_library in ((None, True), (str(1 << 40), False)):
            if threshold is None:
                monkeypatch.delenv(compiler.LIBRARY_MATMUL_ENV, raising=False)
            else:
                monkeypatch.setenv(compiler.LIBRARY_MATMUL_ENV, threshold)
            torch._dynamo.reset()
            c = torch.compile(m, options=MLIR, dynamic=dynamic)
            before = _stats()
            _assert_close(c(x), ref)  # compiles
            got, seen = _aten_ops_run(c, x)
            _assert_close(got, ref)
            assert ("aten::mm" in seen) == in_library, (threshold, seen)
            assert not {"aten::gelu", "aten::add", "aten::clone", "aten::contiguous", "aten::copy_"} & seen, seen
            d = _delta(before)
            # two IREE pieces around the library matmuls (bias + GELU; bias + residual), else one module
            assert d["compiled"] + d["cache_hits"] == (2 if in_library else 1) and d["fallbacks"] == 0, d


@needs_iree
def test_library_matmul_threshold_must_be_a_count(monkeypatch):
    from torch_npu._inductor.mlir import compiler

    monkeypatch.setenv(compiler.LIBRARY_MATMUL_ENV, "lots")
    with pytest.raises(Exception, match="TORCH_NPU_MLIR_LIBRARY_MATMUL_MIN_MACS: expected a number of multiply-adds"):
        torch.compile(lambda x: x @ x, options=MLIR)(torch.randn(4, 4).npu())
