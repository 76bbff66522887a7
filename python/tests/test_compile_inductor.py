"""torch.compile on npu through Inductor's C++ code generator (torch_npu._inductor).

Every compiled result is compared with the same module run eagerly on npu. Cold Inductor
compiles cost several seconds each on this machine, so shapes are small and each test
compiles one or two graphs; the Inductor cache goes to a fresh directory per session.
"""
import copy
import os
import re
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu
from conftest import run_python


pytestmark = pytest.mark.usefixtures("fresh_inductor_cache", "reset_dynamo")


def _code(fn, *args):
    """(result, generated wrapper + kernel source) of a compiled call."""
    from torch._inductor.utils import run_and_get_code

    out, sources = run_and_get_code(fn, *args)
    return out, "\n".join(sources)


def _close(actual, expected, atol=1e-4, rtol=1e-4):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=rtol)


# ---- registration ----------------------------------------------------------------------------
def test_import_does_not_load_dynamo_and_npu_backend_is_listed():
    r = run_python(
        "import sys, torch, torch_npu\n"
        "assert 'torch._dynamo' not in sys.modules, 'import torch_npu imported torch._dynamo'\n"
        "assert 'torch._inductor.codegen.cpp' not in sys.modules\n"
        "import torch._dynamo\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "print(get_interface_for_device('npu').__name__, 'npu' in torch._dynamo.list_backends())\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["NpuInterface", "True"]


def test_wheel_declares_the_dynamo_backends_as_entry_points():
    tools = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
    if not os.path.exists(os.path.join(tools, "build_wheel.py")):
        pytest.skip("tools/build_wheel.py is not next to the tests (installed wheel)")
    sys.path.insert(0, tools)
    try:
        import build_wheel
    finally:
        sys.path.remove(tools)
    dynamo_init = os.path.join(os.path.dirname(torch_npu.__file__), "dynamo", "__init__.py")
    with open(dynamo_init) as f:
        text = build_wheel.entry_points({"torch_npu/dynamo/__init__.py": f.read().encode()})
    assert "[torch_dynamo_backends]\nnpu = torch_npu.dynamo:npu_backend\n" in text
    assert "[torch.backends]\ntorch_npu = torch_npu:_autoload\n" in text


def test_missing_private_hook_names_the_torch_version():
    from torch_npu._inductor import registration

    with pytest.raises(ImportError, match=re.escape(f"torch {torch.__version__} does not provide")):
        registration._private("torch._inductor.codegen.common", "no_such_hook")


def test_npu_backend_rejects_unknown_option():
    with pytest.raises(Exception, match="no_such_option"):
        torch.compile(lambda x: x + 1, backend="npu", options={"no_such_option": 1})(torch.ones(2).npu())


def test_cpp_wrapper_is_refused_with_a_clear_error():
    fn = torch.compile(lambda x: torch.relu(x) + 1, options={"cpp_wrapper": True})
    with pytest.raises(Exception, match="does not support Inductor's cpp_wrapper"):
        fn(torch.ones(4).npu())


# ---- fusion and ordering with the stream -------------------------------------------------------
def _pointwise_chain(x, y):
    return torch.relu(x * y + 1.0) * torch.sigmoid(y)


def test_fusion_and_stream_ordering():
    """One kernel fuses the pointwise chain, and it runs after the queued work on its input.

    The input comes from a chain of big matmuls still queued on the stream when the compiled
    function is called; the generated kernel is launched on the same stream (through the
    entry appended to its source), so it reads the matmul's output once it is written.
    """
    g = torch.Generator().manual_seed(0)
    a = torch.randn(512, 512, generator=g).npu()
    b = (torch.randn(512, 512, generator=g) / 16).npu()
    compiled = torch.compile(_pointwise_chain)
    out, code = _code(compiled, a, b)
    _close(out, _pointwise_chain(a, b))
    kernels = set(re.findall(r"\bcpp_fused_\w+", code))
    assert len(kernels) == 1, kernels
    kernel = kernels.pop()
    assert all(op in kernel for op in ("add", "mul", "relu", "sigmoid")), kernel
    assert re.search(rf"npu_launch_host_kernel\(0, '{kernel}', {kernel}, ", code), "kernel not launched on the stream"
    assert 'extern "C" void npu_kernel_entry(const uintptr_t* args)' in code

    for _ in range(4):
        c = a @ b @ b @ b  # queued: still running when the compiled call starts
        out = compiled(c, b)
        _close(out, _pointwise_chain(c, b))


def test_fallback_list_keeps_listed_ops_out_of_the_kernels(monkeypatch):
    """NPU_INDUCTOR_FALLBACK_LIST (torch_npu's) for the default backend: listed operators run as
    calls of their npu kernels, the rest is fused; "allfallback" fuses nothing."""
    def fn(x, y):
        return torch.sigmoid(x + y) / (y.abs() + 1)

    x, y = torch.randn(8, 8).npu(), torch.randn(8, 8).npu()
    monkeypatch.setenv("NPU_INDUCTOR_FALLBACK_LIST", "aten.div")
    torch._dynamo.reset()
    out, code = _code(torch.compile(fn), x, y)
    _close(out, fn(x, y))
    assert "torch.ops.aten.div.Tensor" in code and re.search(r"\bcpp_fused_\w+", code), code
    assert not any("div" in k for k in re.findall(r"\bcpp_fused_\w+", code)), code
    monkeypatch.setenv("NPU_INDUCTOR_FALLBACK_LIST", "allfallback")
    torch._dynamo.reset()
    out, code = _code(torch.compile(fn), x, y)
    _close(out, fn(x, y))
    assert "cpp_fused" not in code and "torch.ops.aten.sigmoid.default" in code, code
    torch._dynamo.reset()


def test_event_record_inside_the_graph():
    """An event recorded between two kernels (an extern call without a device): the kernel
    before it is launched before the buffers it reads are freed."""
    def fn(x, y):
        x = x * y
        event = torch.npu.Event()
        event.record()
        return x + y

    x, y = torch.randn(4, 4).npu(), torch.randn(4, 4).npu()
    torch._dynamo.reset()
    out, code = _code(torch.compile(fn), x, y)
    _close(out, fn(x, y))
    call = code[code.index("def call"):]
    assert call.index("npu_launch_host_kernel(") < call.index("del arg0_1"), call


def test_philox_rand_on_npu_eager_and_compiled():
    """rngprims::philox_rand (CUDA only in torch): values from (seed, offset) alone, the same
    eager and compiled (Inductor lowers it as a call of the npu kernel)."""
    def fn(x, seed, offset):
        rand, step = torch.ops.rngprims.philox_rand(list(x.shape), seed, offset, None, x.device, x.dtype)
        return rand * 2.0 + x, step

    x = torch.ones(3, 5).npu()
    seed, offset = torch.tensor(1234).npu(), torch.tensor(0).npu()
    a, step = fn(x, seed, offset)
    b, _ = fn(x, seed, offset)
    c, _ = fn(x, seed, torch.tensor(16).npu())
    assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(a.cpu(), c.cpu())
    assert ((a.cpu() >= 1) & (a.cpu() < 3)).all() and int(step) == 16
    torch._dynamo.reset()
    compiled, _ = torch.compile(fn, fullgraph=True)(x, seed, offset)
    assert torch.equal(compiled.cpu(), a.cpu())


def test_inductor_cache_system_names_the_npu_device():
    from torch._inductor.codecache import CacheBase

    system = CacheBase.get_system()
    assert system["device"]["name"] == torch.npu.get_device_properties(0).name
    assert system["version"]["cann"] == torch.version.cann and len(system["hash"]) > 0


def test_compiled_call_does_not_wait_for_the_stream():
    """The generated kernel is queued behind the stream's work like an eager kernel, not run
    on the calling thread after waiting for that work: the call returns while it runs. (By
    default a large one, like an eager kernel, runs on the caller: runs_on_caller.)"""
    prev = torch_npu._C._npu_set_inline(False)
    try:
        _check_compiled_call_is_queued()
    finally:
        torch_npu._C._npu_set_inline(prev)


def _check_compiled_call_is_queued():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 1024, generator=g).npu()
    w = (torch.randn(1024, 1024, generator=g) / 32).npu()
    compiled = torch.compile(_pointwise_chain)
    compiled(x, w)
    torch.npu.synchronize()
    y = x @ w
    torch.npu._sleep(360_000_000)  # ~0.2 s queued: still running when the compiled call returns
    out = compiled(y, w)
    pending = not torch.npu.current_stream().query()
    _close(out, _pointwise_chain(y, w))
    assert pending, "the compiled call waited for the stream"


def test_second_device_and_side_stream():
    """A graph on npu:1 allocates there, and waits for the current stream of npu:1 (a side stream)."""
    if torch.npu.device_count() < 2:
        pytest.skip("needs 2 npu devices")

    def fn(x, w):
        return torch.relu(x @ w).sum(0) * 2 + 1

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=g).to("npu:1")
    w = (torch.randn(256, 256, generator=g) / 16).to("npu:1")
    compiled = torch.compile(fn)
    stream = torch.npu.Stream("npu:1")
    with torch.npu.stream(stream):
        y = x @ w @ w  # queued on the side stream
        out = compiled(y, w)
        expected = fn(y, w)
    stream.synchronize()
    assert out.device == torch.device("npu:1")
    _close(out, expected)


def _kernel_sources(code):
    """The C++ sources of the kernels in generated code, without torch_npu's stream entry."""
    sources = re.findall(r"async_compile\.cpp_pybinding\((.*?)'''\)", code, flags=re.S)
    return [src.split("// torch_npu: the kernel called from an npu stream")[0].strip() for src in sources]


def test_npu_graph_gets_the_cpu_graphs_kernel():
    """A LayerNorm + GELU + residual block compiles to the same C++ kernel on npu as on cpu.

    Inductor picks some rules by ``device.type == "cpu"``; npu takes the same ones (here the
    two-sum variance instead of Welford's update for a 1024-element LayerNorm row), so the
    npu kernel is the cpu kernel plus the entry that launches it on the stream.
    """
    def block(x, r, w, b, bias):
        return r + (F.gelu(F.layer_norm(x, (1024,), w, b)) + bias)

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(64, 1024, generator=g), torch.randn(64, 1024, generator=g), torch.rand(1024, generator=g),
            torch.randn(1024, generator=g), torch.randn(1024, generator=g)]
    out_cpu, code_cpu = _code(torch.compile(block), *args)
    torch._dynamo.reset()
    out_npu, code_npu = _code(torch.compile(block), *[a.npu() for a in args])
    _close(out_npu, out_cpu, atol=1e-5, rtol=1e-5)
    _close(out_npu, block(*args), atol=1e-4, rtol=1e-4)
    assert "Welford" not in code_npu
    assert _kernel_sources(code_cpu) and _kernel_sources(code_npu) == _kernel_sources(code_cpu)
    assert "npu_kernel_entry" in code_npu


# ---- models ------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d=64, hidden=256):
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


def test_mlp_matmuls_stay_extern_calls():
    torch.manual_seed(0)
    model = MLP().npu().eval()
    x = torch.randn(32, 64).npu()
    with torch.no_grad():
        out, code = _code(torch.compile(model), x)
        _close(out, model(x))
    assert "extern_kernels.addmm" in code
    assert re.search(r"cpp_fused_\w*gelu", code), "GELU was not generated as a C++ kernel"
    assert re.search(r"cpp_fused_\w*native_layer_norm", code), "LayerNorm (a reduction) was not fused"


class Block(nn.Module):
    """A pre-norm transformer block; attention by SDPA or torch_npu.npu_fusion_attention."""

    def __init__(self, d=64, heads=4, fused_attention=False):
        super().__init__()
        self.heads, self.fused = heads, fused_attention
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            attn = torch_npu.npu_fusion_attention(q, k, v, self.heads, "BNSD", scale=(d // self.heads) ** -0.5,
                                                  next_tockens=0, sparse_mode=0,
                                                  atten_mask=self.causal_mask(s, x.device))[0]
        else:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))

    @staticmethod
    def causal_mask(s, device):
        # npu_fusion_attention's mask: True where attention is *not* allowed.
        return torch.ones(s, s, dtype=torch.bool, device=device).triu(1)


@pytest.mark.parametrize("fused_attention", [
    pytest.param(False, id="sdpa"),
    pytest.param(True, id="npu_fusion_attention"),
])
def test_transformer_block_forward_and_backward(fused_attention):
    torch.manual_seed(0)
    eager = Block(fused_attention=fused_attention).npu()
    compiled = copy.deepcopy(eager)
    x = torch.randn(2, 16, 64).npu()

    def step(fn):
        out = fn(x)
        out.square().mean().backward()
        return out

    out, code = _code(step, torch.compile(compiled))
    _close(out, step(eager))
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_c.grad.cpu(), p_e.grad.cpu(), atol=1e-5, rtol=1e-4, msg=name)
    if fused_attention:  # the custom op and its backward stay calls into torch_npu
        assert "npu.npu_fusion_attention.default(" in code
        assert "npu.npu_fusion_attention_grad.default(" in code


def test_custom_ops_trace_into_one_graph():
    """torch_npu's fused ops (fake impls in _fused_ops.py) stay calls inside one Inductor graph."""
    def fn(x, w, cos, sin):
        y = torch_npu.npu_rms_norm(x, w)[0]
        z = torch_npu.npu_swiglu(torch.cat([y, y * 2], -1))
        return torch_npu.npu_rotary_mul(z.view(2, 8, 4, 16), cos, sin).relu() + 1

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 8, 64, generator=g).npu(), torch.rand(64, generator=g).npu(),
            torch.randn(1, 8, 1, 16, generator=g).npu(), torch.randn(1, 8, 1, 16, generator=g).npu()]
    out, code = _code(torch.compile(fn, fullgraph=True), *args)
    _close(out, fn(*args))
    for op in ("npu_rms_norm", "npu_swiglu", "npu_rotary_mul"):
        assert f"torch.ops.npu.{op}.default(" in code, op


class ResBlock(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


def test_resnet_block():
    torch.manual_seed(0)
    model = ResBlock().npu().eval()
    for bn in (model.bn1, model.bn2):  # non-trivial running statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 16, 12, 12).npu()
    with torch.no_grad():
        out, code = _code(torch.compile(model), x)
        _close(out, model(x))
    assert "extern_kernels.convolution" in code


def test_training_step_adamw_matches_eager():
    """A compiled module (forward and backward by Inductor) trained with AdamW for 2 steps."""
    torch.manual_seed(0)
    eager = MLP().npu()
    compiled = MLP().npu()
    compiled.load_state_dict(eager.state_dict())
    # eps well above the rounding differences of fused vs unfused gradients (~1e-9): with the
    # default 1e-8, an element whose gradient is ~1e-9 moves by +-lr on either side.
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2, eps=1e-4)
    opt_c = torch.optim.AdamW(compiled.parameters(), lr=1e-2, eps=1e-4)
    step = torch.compile(compiled)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, target = torch.randn(32, 64, generator=g).npu(), torch.randn(32, 64, generator=g).npu()
        for model, fn, opt in ((eager, eager, opt_e), (compiled, step, opt_c)):
            opt.zero_grad()
            F.mse_loss(fn(x), target).backward()
            opt.step()
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_c.cpu(), p_e.cpu(), atol=1e-5, rtol=1e-4, msg=name)


def test_dynamic_shapes_compile_once():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")

    def fn(x, w):
        return F.silu(x @ w) * x.sum(-1, keepdim=True)

    compiled = torch.compile(fn, backend=counter, dynamic=True)
    w = torch.randn(32, 32).npu()
    for rows in (8, 24):
        x = torch.randn(rows, 32).npu()
        _close(compiled(x, w), fn(x, w))
    assert counter.frame_count == 1


def test_graph_break_falls_back_to_eager():
    """``.item()`` and ``print`` in the middle split the function; results stay correct."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("npu")

    def fn(x):
        y = torch.tanh(x) * 3
        scale = y.abs().max().item()  # graph break
        print("scale", round(scale, 3))  # graph break
        return torch.sin(y / scale) + 1

    x = torch.randn(100).npu()
    out = torch.compile(fn, backend=counter)(x)
    _close(out, fn(x))
    assert counter.frame_count == 2


def test_compiled_flex_attention_takes_the_cpp_template():
    """Inductor sent npu's flex_attention to its Triton templates ("Torch not compiled with
    CUDA enabled"); for inference it takes the C++ template, as cpu does."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 128, 128, device="npu")
    compiled = torch.compile(flex_attention)
    with torch.no_grad():
        out = compiled(q.npu(), k.npu(), v.npu(), block_mask=mask)
    assert out.device.type == "npu"
    _close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("gqa", [False, True])
def test_compiled_flex_attention_trains_on_npu(gqa):
    """The C++ template is inference only ("torch.compile on CPU only supports inference",
    transformers' test_flex_attention_with_grads on every model); a compiled flex_attention
    that needs gradients takes its dense form on npu and matches the eager operator."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    heads_kv = 2 if gqa else 4
    q = torch.randn(2, 4, 64, 16)
    k, v = torch.randn(2, heads_kv, 64, 16), torch.randn(2, heads_kv, 64, 16)
    bias = torch.randn(4).npu()  # a buffer the score_mod captures

    def score_mod(score, b, h, qi, ki):
        return score + bias[h] + (qi - ki) * 0.01

    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 64, 64, device="npu")

    def run(fn):
        inputs = [t.npu().requires_grad_() for t in (q, k, v)]
        out = fn(*inputs, score_mod=score_mod, block_mask=mask, enable_gqa=gqa)
        (out * out).sum().backward()
        return [out.detach().cpu()] + [t.grad.cpu() for t in inputs]

    eager = run(flex_attention)
    compiled = run(torch.compile(flex_attention, fullgraph=True))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(g.abs().sum() > 0 for g in compiled[1:])


# ---- random numbers in compiled kernels ---------------------------------------------------------
def _philox_uniform(seed: int, offsets):
    """Reference for Inductor's ``normalized_rand_cpu(seed, offset)`` (cpp_prefix.h) in numpy:
    the first word of Philox4x32-10 with key (seed, 0) and counter (offset, 0, 0, 0), its low
    31 bits scaled to [0, 1)."""
    import numpy as np

    m32 = np.uint64(0xFFFFFFFF)
    c0 = offsets.astype(np.uint64) & m32
    c1 = np.zeros_like(c0)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(0)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    return (c0 & np.uint64(0x7FFFFFFF)).astype(np.float32) * np.float32(4.6566127342e-10)


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_compiled_rand_is_inductors_philox(device):
    """Random numbers in compiled kernels are exactly Inductor's: on cpu the stock per-lane
    ``normalized_rand_cpu`` loop (which checks the numpy reference), on npu the lanes-at-once
    form torch_npu emits (``codegen.vectorized_rand``), vectorized body and scalar tail alike.

    The kernel's seed is the one value the compiled graph draws with ``randint`` from the
    device's generator; re-seeding and drawing it the same way gives it to the reference.
    """
    import numpy as np

    fn = torch.compile(lambda x: torch.rand_like(x) + x)
    x = torch.zeros(4099, device=device)  # 4096 vectorized elements and a scalar tail of 3
    torch.manual_seed(123)
    torch.npu.manual_seed(123)
    out, code = _code(fn, x)
    if device == "npu":
        assert "0xD2511F53u" in code, "the npu kernel does not use the vectorized Philox"
    torch.manual_seed(123)
    torch.npu.manual_seed(123)
    seed = torch.randint(-2 ** 63, 2 ** 63 - 1, [1], device=device).item()
    expected = _philox_uniform(seed, np.arange(x.numel()))
    assert torch.equal(out.cpu(), torch.from_numpy(expected))
    assert 0.45 < float(out.mean()) < 0.55


def test_dropout_in_a_compiled_block():
    """Training-mode dropout in a fused kernel: the kept share is 1 - p, kept values are scaled
    by 1 / (1 - p), and a second call draws a different mask."""
    def block(x, bias):
        return F.dropout(F.gelu(x) + bias, p=0.25, training=True)

    x = torch.randn(256, 1024).npu()
    bias = torch.randn(1024).npu()
    compiled = torch.compile(block)
    out1, out2 = compiled(x, bias), compiled(x, bias)
    full = F.gelu(x) + bias
    for out in (out1, out2):
        kept = out != 0
        assert 0.73 < kept.float().mean().item() < 0.77
        _close(out[kept], (full / 0.75)[kept])
    assert not torch.equal(out1 != 0, out2 != 0)


def test_torch_npu_codegen_is_in_the_fx_graph_cache_key():
    """Inductor's FX graph cache key covers torch_npu's code generation: its device custom
    pass for npu hashes the modules that shape the generated code."""
    from torch._inductor.codegen.common import custom_backend_passes, init_backend_registration
    from torch_npu._inductor import codegen

    torch.compile(lambda x: x + 1)(torch.ones(2).npu())  # registers Inductor's npu backend
    init_backend_registration()
    key = custom_backend_passes["npu"]
    assert isinstance(key, codegen.NpuCodegenKey)
    assert re.fullmatch(r"[0-9a-f]{64}", key.uuid())


# ---- NPU graph capture of generated kernels ----------------------------------------------------
def test_graph_captures_kernel_with_a_float_argument():
    """A generated kernel taking a float by value is recorded by ``torch.npu.graph``.

    Inductor passes a Python float input as a 0-dim CPU tensor (``const double*``), and
    reads ``t.item()`` in a kernel from ``t`` itself; a float it cannot fold into a tensor
    read (here the fill value of ``torch.full``, from ``.item()`` of a CPU scalar with
    ``capture_scalar_outputs``) is an unbacked float symbol, which the wrapper computes and
    the kernel takes by value (``const float``). As on CUDA graphs, a replay uses the value
    the capture launched with, and reads the input tensors' current contents.
    """
    def fn(x, scale):
        return torch.relu(x - torch.full(x.shape, scale.item(), device=x.device)) * 2

    static_x = torch.randn(4, 300).npu()
    scale = torch.tensor(1.5)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = torch.compile(fn, fullgraph=True)
        with torch.no_grad():
            out, code = _code(compiled, static_x, scale)
            _close(out, fn(static_x, scale))
            kernels = re.findall(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\((\[.*?\])", code)
            assert any("'const float'" in types for _, types in kernels), kernels  # a float by value
            g = torch.npu.NPUGraph()
            with torch.npu.graph(g):
                static_y = compiled(static_x, scale)
    assert g._num_tasks() >= 1
    scale.fill_(-7.0)  # read at capture: the replays keep 1.5
    previous = None
    for _ in range(3):
        x = torch.randn(4, 300)
        static_x.copy_(x)
        g.replay()
        got = static_y.cpu()
        _close(got, torch.relu(x - 1.5) * 2, atol=1e-6, rtol=1e-6)
        assert previous is None or not torch.equal(got, previous)
        previous = got


def test_compiled_index_out_of_bounds_raises_instead_of_aborting():
    # Inductor checks indirect indices inside the kernel; in a parallel (OpenMP) kernel a failed
    # check terminated the process (transformers' T5 flex-attention score_mod indexes a size-1
    # batch dimension with the batch index). Kernels with such checks run serially on npu and
    # the failure is a RuntimeError; valid indices give eager's result, reductions included.
    from conftest import run_python

    code = """
import torch, torch_npu
torch.manual_seed(0)
table = torch.randn(10, 64).npu()
def f(idx):
    rows = table[idx] * 2
    return rows.sum(-1), rows.sum()
compiled = torch.compile(f)
idx = torch.randint(0, 10, (4096,)).npu()
scale = (table[idx] * 2).abs().sum().item()  # float32 sums in other orders differ by ~1e-7 of this
for got, want in zip(compiled(idx), f(idx)):
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=1e-5 * scale)
bad = idx.clone()
bad[100] = 50
try:
    compiled(bad)
    torch.npu.synchronize()
    print("NO ERROR")
except RuntimeError as e:
    print("RAISED", "index out of bounds" in str(e))
"""
    res = run_python(code)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "RAISED True", res.stdout + res.stderr[-2000:]
