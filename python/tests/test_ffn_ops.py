"""torch_npu.npu_ffn against plain-PyTorch references written here from the documented formulas:
float16 (high precision / high performance) and bfloat16 FFN, MoE expert groups (expert_tokens and
expert_tokens_index), the GLU activations, weight-only int8 quantization (antiquant) and full int8
quantization with float16 / bfloat16 outputs; shapes under FakeTensorMode and errors for bad
arguments."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

F16, BF16 = torch.float16, torch.bfloat16


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, scale=1.0, dtype=F16):
    return (torch.randn(shape, generator=gen(seed)) * scale).to(dtype)


def int8(*shape, seed=0, lo=-128, hi=128):
    return torch.randint(lo, hi, shape, generator=gen(seed), dtype=torch.int8)


# ---- reference activations (float32) ---------------------------------------------------------

def ref_act(name, h):
    def gelu_tanh(v):
        return 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))

    plain = {
        "fastgelu": lambda v: v / (1 + torch.exp(-1.702 * v)),
        "gelu": gelu_tanh,
        "relu": lambda v: torch.clamp(v, min=0),
        "silu": lambda v: v / (1 + torch.exp(-v)),
    }
    if name in plain:
        return plain[name](h)
    half = h.shape[-1] // 2
    gate = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu"}[name]
    return h[..., :half] * plain[gate](h[..., half:])


def rnd(t, dtype):
    return t.to(dtype).float()


def ref_float_ffn(x, w1, w2, act, b1=None, b2=None, mm1_dtype=None, out_dtype=F16):
    """act(x @ w1 + b1) -> out_dtype, @ w2 + b2 -> out_dtype; mm1_dtype rounds x @ w1 + b1 first."""
    h = x.float() @ w1.float()
    if b1 is not None:
        h = h + b1.float()
    if mm1_dtype is not None:
        h = rnd(h, mm1_dtype)
    a = rnd(ref_act(act, h), out_dtype)
    y = a @ w2.float()
    if b2 is not None:
        y = y + b2.float()
    return y.to(out_dtype)


def split_ref(x, counts, per_expert):
    return torch.cat([per_expert(xe, e) for e, xe in enumerate(x.split(counts)) if xe.shape[0]])


def close(out, ref, rtol=2e-3, atol=2e-3):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().float(), ref.float(), rtol=rtol, atol=atol)


# ---- float16 / bfloat16 -----------------------------------------------------------------------

@pytest.mark.parametrize("act", ["fastgelu", "gelu", "relu", "silu"])
@pytest.mark.parametrize("precise", [0, 1])
def test_float16_no_experts(act, precise):
    x = randn(2, 3, 32, seed=1)  # 3-D x: rows are all but the last dimension
    w1, w2 = randn(32, 48, seed=2, scale=0.2), randn(48, 32, seed=3, scale=0.2)
    b1, b2 = randn(48, seed=4, scale=0.5), randn(32, seed=5, scale=0.5)
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), act, bias1=b1.npu(), bias2=b2.npu(),
                            inner_precise=precise)
    ref = ref_float_ffn(x, w1, w2, act, b1, b2, mm1_dtype=F16 if precise == 1 else None)
    assert out.device.type == "npu" and out.shape == (2, 3, 32)
    close(out, ref)


def test_float16_high_precision_keeps_mm1_in_float32():
    # w2 = I: y is the float16 activation itself, which differs between the two modes where
    # silu(h) and silu(float16(h)) round to different float16 values
    x, w1, w2 = randn(64, 16, seed=70, scale=2.0), randn(16, 16, seed=71, scale=0.5), torch.eye(16, dtype=F16)
    hp = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "silu", inner_precise=0).cpu()
    hf = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "silu", inner_precise=1).cpu()
    ref_hp, ref_hf = ref_float_ffn(x, w1, w2, "silu"), ref_float_ffn(x, w1, w2, "silu", mm1_dtype=F16)
    assert (ref_hp != ref_hf).sum() > 100
    assert torch.equal(hp, ref_hp) and torch.equal(hf, ref_hf)


def test_bfloat16_experts_with_float32_bias():
    counts = [3, 0, 5, 2]
    x = randn(10, 16, seed=6, dtype=BF16)
    w1, w2 = randn(4, 16, 24, seed=7, scale=0.3, dtype=BF16), randn(4, 24, 16, seed=8, scale=0.3, dtype=BF16)
    b1, b2 = randn(4, 24, seed=9, dtype=torch.float32), randn(4, 16, seed=10, dtype=torch.float32)
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "silu", expert_tokens=counts, bias1=b1.npu(),
                            bias2=b2.npu())
    ref = split_ref(x, counts, lambda xe, e: ref_float_ffn(xe, w1[e], w2[e], "silu", b1[e], b2[e], out_dtype=BF16))
    close(out, ref, rtol=1e-2, atol=1e-2)


def test_expert_tokens_and_index_agree():
    counts = [4, 1, 0, 3]
    x = randn(8, 16, seed=11)
    w1, w2 = randn(4, 16, 32, seed=12, scale=0.3), randn(4, 32, 16, seed=13, scale=0.3)
    by_count = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "gelu", expert_tokens=counts, inner_precise=1)
    ends = [4, 5, 5, 8]
    by_index = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "gelu", expert_tokens_index=ends, inner_precise=1)
    ref = split_ref(x, counts, lambda xe, e: ref_float_ffn(xe, w1[e], w2[e], "gelu", mm1_dtype=F16))
    close(by_count, ref)
    assert torch.equal(by_count.cpu(), by_index.cpu())


@pytest.mark.parametrize("act", ["geglu", "swiglu", "reglu", "SwiGLU"])
def test_glu_activations(act):
    x = randn(5, 16, seed=14)
    w1, w2 = randn(16, 64, seed=15, scale=0.3), randn(32, 16, seed=16, scale=0.3)  # N1 = 2 * K2
    b1 = randn(64, seed=17, scale=0.3)
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), act, bias1=b1.npu(), inner_precise=1)
    close(out, ref_float_ffn(x, w1, w2, act.lower(), b1, mm1_dtype=F16))


def test_host_weights_and_empty_x():
    x = randn(4, 16, seed=18)
    w1, w2 = randn(16, 8, seed=19, scale=0.3), randn(8, 16, seed=20, scale=0.3)
    out = torch_npu.npu_ffn(x.npu(), w1, w2, "relu")  # weights left on the host
    close(out, ref_float_ffn(x, w1, w2, "relu"))
    empty = torch_npu.npu_ffn(x[:0].npu(), w1.npu(), w2.npu(), "relu")
    assert empty.shape == (0, 16) and empty.dtype == F16


# ---- weight-only int8 quantization ------------------------------------------------------------

def ref_dequant(w, scale, offset, dtype):
    return rnd(rnd(w.float() + offset.float(), dtype) * scale.float(), dtype)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_antiquant_experts(dtype):
    counts = [2, 4]
    x = randn(6, 32, seed=21, scale=0.5, dtype=dtype)
    w1, w2 = int8(2, 32, 16, seed=22, lo=-9, hi=9), int8(2, 16, 32, seed=23, lo=-9, hi=9)
    s1, s2 = randn(2, 16, seed=24, scale=0.05, dtype=dtype), randn(2, 32, seed=25, scale=0.05, dtype=dtype)
    o1, o2 = randn(2, 16, seed=26, scale=0.5, dtype=dtype), randn(2, 32, seed=27, scale=0.5, dtype=dtype)
    bias_dtype = F16 if dtype == F16 else torch.float32
    b1 = randn(2, 16, seed=28, scale=0.1, dtype=bias_dtype)
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "fastgelu", expert_tokens=counts, bias1=b1.npu(),
                            antiquant_scale1=s1.npu(), antiquant_scale2=s2.npu(), antiquant_offset1=o1.npu(),
                            antiquant_offset2=o2.npu())

    def expert(xe, e):
        dw1, dw2 = ref_dequant(w1[e], s1[e], o1[e], dtype), ref_dequant(w2[e], s2[e], o2[e], dtype)
        # float16: the first product is float16 before the activation; bfloat16 keeps float32
        return ref_float_ffn(xe, dw1, dw2, "fastgelu", b1[e], mm1_dtype=F16 if dtype == F16 else None,
                             out_dtype=dtype)

    close(out, split_ref(x, counts, expert), rtol=1e-2 if dtype == BF16 else 2e-3, atol=1e-2)


# ---- full int8 quantization -------------------------------------------------------------------

def fp19(t):
    return (t.float().contiguous().view(torch.int32) & -8192).view(torch.float32)


def ref_quant_ffn(x, w1, w2, act, scale, offset, d1, d2, b1=None, b2=None, out_dtype=F16):
    """Documented: ((act((x @ w1 + b1) * d1) * scale + offset) @ w2 + b2) * d2, with the kernel's
    float16 stages for float16 output; float64 products are exact for these int8 sizes."""
    acc = x.double() @ w1.double()
    if b1 is not None:
        acc = acc + b1.double()
    if out_dtype == F16:
        h = rnd(acc.float() * fp19(d1), F16)
        a = rnd(ref_act(act, h), F16)
        q = rnd(a * rnd(scale.float(), F16), F16)
        q = rnd(q + rnd(offset.float(), F16), F16)
    else:
        a = ref_act(act, acc.float() * d1.float())
        if scale.numel() > 1:  # per channel: float16 arithmetic
            q = rnd(rnd(rnd(a, F16) * rnd(scale.float(), F16), F16) + rnd(offset.float(), F16), F16)
        else:
            q = a * scale.float() + offset.float()
    q = torch.round(q).clamp(-128, 127)
    acc2 = q.double() @ w2.double()
    if b2 is not None:
        acc2 = acc2 + b2.double()
    d2f = fp19(d2) if out_dtype == F16 else d2.float()
    return (acc2.float() * d2f).to(out_dtype)


def test_quant_float16_trans_quant_param_scales():
    x, w1, w2 = int8(16, 32, seed=30), int8(32, 24, seed=31), int8(24, 32, seed=32)
    d1 = torch.rand(24, generator=gen(33)) * 0.004 + 0.001
    d2 = torch.rand(32, generator=gen(34)) * 0.004 + 0.001
    scale, offset = torch.tensor([0.05]), torch.tensor([1.0])
    b1 = torch.randint(-500, 500, (24,), generator=gen(35), dtype=torch.int32)
    b2 = torch.randint(-500, 500, (32,), generator=gen(36), dtype=torch.int32)
    p1, p2 = torch_npu.npu_trans_quant_param(d1.npu()), torch_npu.npu_trans_quant_param(d2.npu())
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "gelu", bias1=b1.npu(), bias2=b2.npu(), scale=scale.npu(),
                            offset=offset.npu(), deq_scale1=p1, deq_scale2=p2)
    ref = ref_quant_ffn(x, w1, w2, "gelu", scale, offset, d1, d2, b1, b2)
    assert out.dtype == F16
    close(out, ref, rtol=1e-3, atol=1e-3)
    # float32 scales give the same result: the fixpipe reads them as FP19 too
    out32 = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "gelu", bias1=b1.npu(), bias2=b2.npu(),
                              scale=scale.npu(), offset=offset.npu(), deq_scale1=d1.npu(), deq_scale2=d2.npu(),
                              output_dtype=F16)
    assert torch.equal(out.cpu(), out32.cpu())
    # and so do uint64 ones (the same bits)
    u1, u2 = p1.cpu().view(torch.uint64).npu(), p2.cpu().view(torch.uint64).npu()
    out64 = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "gelu", bias1=b1.npu(), bias2=b2.npu(),
                              scale=scale.npu(), offset=offset.npu(), deq_scale1=u1, deq_scale2=u2)
    assert torch.equal(out.cpu(), out64.cpu())


def test_quant_float16_experts_per_channel_scale():
    counts = [5, 3]
    x, w1, w2 = int8(8, 16, seed=40), int8(2, 16, 32, seed=41), int8(2, 32, 16, seed=42)
    d1 = torch.rand(2, 32, generator=gen(43)) * 0.01 + 0.002
    d2 = torch.rand(2, 16, generator=gen(44)) * 0.01 + 0.002
    scale = torch.rand(2, 32, generator=gen(45)) * 0.1 + 0.01
    offset = torch.tensor([0.0, -2.0])
    p1 = torch_npu.npu_trans_quant_param(d1.reshape(-1).npu()).reshape(2, 32)
    p2 = torch_npu.npu_trans_quant_param(d2.reshape(-1).npu()).reshape(2, 16)
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "silu", expert_tokens=counts, scale=scale.npu(),
                            offset=offset.npu(), deq_scale1=p1, deq_scale2=p2)
    ref = split_ref(x, counts, lambda xe, e: ref_quant_ffn(xe, w1[e], w2[e], "silu", scale[e], offset[e],
                                                           d1[e], d2[e]))
    close(out, ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("per_channel", [False, True])
def test_quant_bfloat16_output(per_channel):
    x, w1, w2 = int8(12, 16, seed=50), int8(16, 24, seed=51), int8(24, 16, seed=52)
    d1 = (torch.rand(24, generator=gen(53)) * 0.01 + 0.002).to(BF16)
    d2 = (torch.rand(16, generator=gen(54)) * 0.01 + 0.002).to(BF16)
    scale = torch.rand(24, generator=gen(55)) * 0.1 + 0.01 if per_channel else torch.tensor([0.03])
    offset = torch.tensor([0.5])
    out = torch_npu.npu_ffn(x.npu(), w1.npu(), w2.npu(), "relu", scale=scale.npu(), offset=offset.npu(),
                            deq_scale1=d1.npu(), deq_scale2=d2.npu(), output_dtype=BF16)
    ref = ref_quant_ffn(x, w1, w2, "relu", scale, offset, d1, d2, out_dtype=BF16)
    close(out, ref, rtol=8e-3, atol=1e-2)


def test_fake_tensor_shapes():
    with FakeTensorMode():
        x = torch.empty(2, 7, 16, dtype=torch.int8)
        w1, w2 = torch.empty(16, 8, dtype=torch.int8), torch.empty(8, 16, dtype=torch.int8)
        d1, d2 = torch.empty(8, dtype=BF16), torch.empty(16, dtype=BF16)
        y = torch.ops.npu.npu_ffn(x, w1, w2, "gelu", scale=torch.empty(1), offset=torch.empty(1), deq_scale1=d1,
                                  deq_scale2=d2, output_dtype=BF16)
        assert y.shape == (2, 7, 16) and y.dtype == BF16
        xf = torch.empty(6, 16, dtype=F16)
        y = torch.ops.npu.npu_ffn(xf, torch.empty(3, 16, 8, dtype=F16), torch.empty(3, 8, 16, dtype=F16), "relu",
                                  expert_tokens=[1, 2, 3])
        assert y.shape == (6, 16) and y.dtype == F16


# ---- bad arguments ----------------------------------------------------------------------------

def _floats():
    return randn(4, 16, seed=60).npu(), randn(16, 8, seed=61).npu(), randn(8, 16, seed=62).npu()


def _experts():
    return randn(4, 16, seed=63).npu(), randn(2, 16, 8, seed=64).npu(), randn(2, 8, 16, seed=65).npu()


def _quant_args(**over):
    args = dict(scale=torch.tensor([0.1]).npu(), offset=torch.tensor([0.0]).npu(),
                deq_scale1=torch.rand(8).npu(), deq_scale2=torch.rand(16).npu())
    args.update(over)
    return args


def _ints():
    return int8(4, 16).npu(), int8(16, 8).npu(), int8(8, 16).npu()


@pytest.mark.parametrize("call, match", [
    (lambda: torch_npu.npu_ffn(*_floats(), "tanh"), "activation type tanh is not supported"),
    (lambda: torch_npu.npu_ffn(*_experts(), "relu", expert_tokens=[2, 2], expert_tokens_index=[2, 4]),
     "should not have the value simultaneously"),
    (lambda: torch_npu.npu_ffn(*_experts(), "relu", expert_tokens=[2, 1]), r"total number of expert tokens \(3\)"),
    (lambda: torch_npu.npu_ffn(*_experts(), "relu", expert_tokens=[5, -1]), "smaller than zero"),
    (lambda: torch_npu.npu_ffn(*_experts(), "relu", expert_tokens_index=[3, 2]), "should not be decremental"),
    (lambda: torch_npu.npu_ffn(*_experts(), "relu", expert_tokens=[4] + [0] * 256), "at most 256 experts"),
    (lambda: torch_npu.npu_ffn(*_experts(), "relu", expert_tokens=[1, 1, 2]), "one matrix per expert"),
    (lambda: torch_npu.npu_ffn(*_floats()[:1], *_experts()[1:], "relu"), "weight1 must have 2 dimensions"),
    (lambda: torch_npu.npu_ffn(randn(4, 12).npu(), *_floats()[1:], "relu"), "The k of x and weight should be equal"),
    (lambda: torch_npu.npu_ffn(randn(16).npu(), *_floats()[1:], "relu"), "x shape dims should be 2~8"),
    (lambda: torch_npu.npu_ffn(randn(*[1] * 8, 16).npu(), *_floats()[1:], "relu"), "x shape dims should be 2~8"),
    (lambda: torch_npu.npu_ffn(randn(4, 16).npu(), randn(16, 8).npu(), randn(6, 16).npu(), "relu"),
     r"weight1's N \(8\) must equal weight2's K \(6\)"),
    (lambda: torch_npu.npu_ffn(randn(4, 16).npu(), randn(16, 8).npu(), randn(8, 12).npu(), "relu"),
     r"weight2's N \(12\) must equal weight1's K \(16\)"),
    (lambda: torch_npu.npu_ffn(*_floats(), "swiglu", inner_precise=1), "GLU activation needs"),
    (lambda: torch_npu.npu_ffn(randn(4, 16).npu(), randn(16, 16).npu(), randn(8, 16).npu(), "geglu"),
     "supports only float16 x and weights, inner_precise=1"),
    (lambda: torch_npu.npu_ffn(*_floats(), "relu", inner_precise=2), "inner_precise must be 0"),
    (lambda: torch_npu.npu_ffn(*(t.to(BF16) for t in _floats()), "relu", inner_precise=1),
     "only support high precision"),
    (lambda: torch_npu.npu_ffn(_floats()[0], *(t.to(BF16) for t in _floats()[1:]), "relu"),
     "weight1 must have x's dtype"),
    (lambda: torch_npu.npu_ffn(_floats()[0], _floats()[1], _floats()[2].to(BF16), "relu"),
     "weight1 and weight2 must have the same dtype"),
    (lambda: torch_npu.npu_ffn(_floats()[0].float(), *_floats()[1:], "relu"), "x must be float16 or bfloat16 or int8"),
    (lambda: torch_npu.npu_ffn(*_floats(), "relu", bias1=torch.zeros(8).npu()), "bias1 must be float16"),
    (lambda: torch_npu.npu_ffn(*_floats(), "relu", bias2=torch.zeros(8, dtype=F16).npu()),
     r"bias2 must have shape \[16\]"),
    (lambda: torch_npu.npu_ffn(*_floats(), "relu", **_quant_args()), "cannot be given with torch.float16 x"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(deq_scale2=None)), "missing deq_scale2"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(), output_dtype=torch.float32),
     "output_dtype must be torch.float16 or torch.bfloat16"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(), output_dtype=BF16),
     "deq_scale1 must be bfloat16 for torch.bfloat16 output"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(deq_scale2=torch.zeros(16, dtype=torch.int64).npu())),
     "deq_scale1 and deq_scale2 must have the same dtype"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(scale=torch.ones(3).npu())), "scale must have shape"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(scale=torch.ones(8).npu())),
     "per-channel scale needs deq_scale1"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(offset=torch.zeros(2).npu())),
     r"offset must have shape \[1\]"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(scale=torch.ones(1, dtype=F16).npu())),
     "scale must be float32"),
    (lambda: torch_npu.npu_ffn(*_ints(), "relu", **_quant_args(), antiquant_scale1=torch.ones(8, dtype=F16).npu()),
     "antiquant_scale1 cannot be given with int8 x"),
    (lambda: torch_npu.npu_ffn(_floats()[0], *_ints()[1:], "relu", antiquant_scale1=torch.ones(8, dtype=F16).npu()),
     "missing antiquant_scale2, antiquant_offset1, antiquant_offset2"),
    (lambda: torch_npu.npu_ffn(_floats()[0], *_ints()[1:], "relu",
                               **{n: torch.ones(8 if n.endswith("1") else 16, dtype=BF16).npu()
                                  for n in ("antiquant_scale1", "antiquant_scale2", "antiquant_offset1",
                                            "antiquant_offset2")}),
     "antiquant_scale1 must be float16 .x's dtype."),
    (lambda: torch_npu.npu_ffn(_floats()[0], *_ints()[1:], "relu",
                               **{n: torch.ones(4, dtype=F16).npu()
                                  for n in ("antiquant_scale1", "antiquant_scale2", "antiquant_offset1",
                                            "antiquant_offset2")}),
     r"antiquant_scale1 must have shape \[8\]"),
    (lambda: torch_npu.npu_ffn(_floats()[0], *_ints()[1:], "relu", **_quant_args()),
     "cannot be given with torch.int8 weights"),
    (lambda: torch_npu.npu_ffn(_ints()[0], *_floats()[1:], "relu", **_quant_args()),
     "int8 x .quantization. needs int8 weights"),
])
def test_bad_arguments(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


def test_required_tensor_must_be_a_tensor():
    with pytest.raises(TypeError, match="weight2 must be a Tensor"):
        torch.ops.npu.npu_ffn(randn(2, 16).npu(), randn(16, 8).npu(), None, "relu")
