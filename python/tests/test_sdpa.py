"""F.scaled_dot_product_attention on npu runs the fused attention kernel (the overrideable
SDPA backend) and matches PyTorch's CPU result, forward and backward; FlexAttention on npu;
torch.backends.npu's SDP switches."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_npu  # noqa: F401

B, N, S1, S2, D = 2, 4, 37, 45, 16
S = S1


def _run(device, q, k, v, grad, **kwargs):
    q, k, v = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    mask = kwargs.pop("attn_mask", None)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(device), **kwargs)
    out.backward(grad.to(device))
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


def _inputs(dtype=torch.float32, n_kv=N, s2=S2):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, N, S1, D, generator=g)
    k = torch.randn(B, n_kv, s2, D, generator=g)
    v = torch.randn(B, n_kv, s2, D, generator=g)
    grad = torch.randn(B, N, S1, D, generator=g)
    return [t.to(dtype) for t in (q, k, v, grad)]


def _masks():
    g = torch.Generator().manual_seed(1)
    return {
        "none": {},
        "causal": {"is_causal": True},
        "scale": {"scale": 0.3},
        "bool_4d": {"attn_mask": torch.rand(B, 1, S1, S2, generator=g) > 0.3},
        "bool_padding": {"attn_mask": torch.rand(B, 1, 1, S2, generator=g) > 0.2},
        "bool_2d": {"attn_mask": torch.rand(S1, S2, generator=g) > 0.5},
        "float_4d": {"attn_mask": torch.randn(B, 1, S1, S2, generator=g)},
        "float_2d": {"attn_mask": torch.randn(S1, S2, generator=g)},
    }


@pytest.mark.parametrize("case", list(_masks()))
def test_matches_cpu_float32(case):
    q, k, v, grad = _inputs()
    kwargs = _masks()[case]
    expected = _run("cpu", q, k, v, grad, **dict(kwargs))
    actual = _run("npu", q, k, v, grad, **dict(kwargs))
    for name, e, a in zip(("out", "dq", "dk", "dv"), expected, actual):
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4, msg=lambda m: f"{case} {name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_cpu_half(dtype):
    q, k, v, grad = _inputs(dtype)
    expected = _run("cpu", q.float(), k.float(), v.float(), grad.float(), is_causal=True)
    actual = _run("npu", q, k, v, grad, is_causal=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    for e, a in zip(expected, actual):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), e, atol=tol * 4, rtol=tol)


def test_grouped_query_attention():
    q, k, v, grad = _inputs(n_kv=2)
    expected = _run("cpu", q, k, v, grad, enable_gqa=True)
    actual = _run("npu", q, k, v, grad, enable_gqa=True)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v, grad = _inputs()
    mask = torch.ones(S1, S2, dtype=torch.bool)
    mask[3] = False
    expected = _run("cpu", q, k, v, grad, attn_mask=mask)
    actual = _run("npu", q, k, v, grad, attn_mask=mask)
    for e, a in zip(expected, actual):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4)
    assert actual[0][:, :, 3].abs().max() == 0


def test_runs_the_fused_kernel_without_the_score_matrix():
    q, k, v, _ = [t.npu() for t in _inputs()]
    with torch.autograd.profiler.profile() as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    names = {e.name for e in prof.function_events}
    assert "npu::npu_fusion_attention" in names
    assert "aten::_scaled_dot_product_attention_math" not in names
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value


def test_math_backend_still_selectable_and_unsupported_inputs_fall_back():
    q, k, v, grad = _inputs()
    expected = _run("cpu", q, k, v, grad)
    with sdpa_kernel([SDPBackend.MATH]):
        actual = _run("npu", q, k, v, grad)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4)
    # 3-D inputs and a value head size other than the query's take the math path.
    q3 = torch.randn(3, 10, 8)
    torch.testing.assert_close(F.scaled_dot_product_attention(q3.npu(), q3.npu(), q3.npu()).cpu(),
                               F.scaled_dot_product_attention(q3, q3, q3), atol=2e-5, rtol=1e-4)
    v_wide = torch.randn(B, N, S2, 2 * D)
    qn, kn = q.npu(), k.npu()
    torch.testing.assert_close(F.scaled_dot_product_attention(qn, kn, v_wide.npu()).cpu(),
                               F.scaled_dot_product_attention(q, k, v_wide), atol=2e-5, rtol=1e-4)


def test_dropout_forward_and_backward_use_one_mask():
    # With a fixed seed the output is linear in v: out = A v for the dropped-out
    # probabilities A. v = identity reads A off; v's gradient must then be A^T grad.
    s2 = D
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, S1, D, generator=g).npu()
    k = torch.randn(1, 1, s2, D, generator=g).npu()
    v = torch.randn(1, 1, s2, D, generator=g).npu().requires_grad_()
    grad = torch.randn(1, 1, S1, D, generator=g).npu()
    torch.manual_seed(7)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    out.backward(grad)
    torch.manual_seed(7)
    a = F.scaled_dot_product_attention(q, k, torch.eye(s2).view(1, 1, s2, s2).npu(), dropout_p=0.4)
    zeros = (a == 0).float().mean().item()
    assert 0.2 < zeros < 0.6, f"dropout 0.4 zeroed {zeros:.2f} of the probabilities"
    torch.testing.assert_close(out.cpu(), (a @ v.detach()).cpu(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v.grad.cpu(), (a.transpose(-1, -2) @ grad).cpu(), atol=1e-5, rtol=1e-4)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(3)
    q, k, v = [torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64).npu().requires_grad_() for _ in range(3)]
    mask = torch.randn(5, 5, generator=g, dtype=torch.float64).npu().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (q, k, v, mask))


def test_results_keep_the_inputs_layout():
    # Models make q/k/v as view(B, S, N, D).transpose(1, 2); PyTorch's meta functions (and
    # so compiled graphs) expect the output and gradients in the inputs' layout.
    g = torch.Generator().manual_seed(4)
    q, k, v = [torch.randn(B, S, N, D, generator=g).transpose(1, 2) for _ in range(3)]
    grad = torch.randn(B, N, S, D, generator=g)
    expected = _run("cpu", q, k, v, grad, is_causal=True)
    qn, kn, vn = [t.npu().requires_grad_() for t in (q, k, v)]
    kn_bnsd = kn.detach().contiguous().requires_grad_()  # one input in the other layout
    out = F.scaled_dot_product_attention(qn, kn_bnsd, vn, is_causal=True)
    assert out.stride() == q.stride()
    out.backward(grad.npu())
    assert qn.grad.stride() == q.stride() and vn.grad.stride() == v.stride()
    assert kn_bnsd.grad.stride() == kn_bnsd.stride()
    for e, a in zip(expected, (out, qn.grad, kn_bnsd.grad, vn.grad)):
        torch.testing.assert_close(a.detach().cpu(), e, atol=2e-5, rtol=1e-4)


def test_dynamic_shapes_keep_one_graph():
    # The backend choice reads the sizes symbolically: torch.compile(dynamic=True) traces one
    # graph for every sequence length instead of specializing on the first one.
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(attend, backend=counter, dynamic=True)
    for s in (8, 12, 20):
        q, k, v = (torch.randn(2, 4, s, 16) for _ in range(3))
        out = compiled(q.npu(), k.npu(), v.npu())
        torch.testing.assert_close(out.cpu(), attend(q, k, v), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1


# ---- FlexAttention on npu -------------------------------------------------------------------

def test_flex_attention_runs_on_npu_and_under_autocast(monkeypatch):
    from torch.nn.attention import flex_attention as fa

    # The operator's eager implementation (no internal torch.compile): quick and exact.
    monkeypatch.setattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out = fa.flex_attention(q.npu(), k.npu(), v.npu())
    assert out.device.type == "npu" and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), ref)

    with torch.autocast("npu", dtype=torch.bfloat16):
        low = fa.flex_attention(q.npu(), k.npu(), v.npu())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float().cpu(), ref, rtol=2e-2, atol=2e-2)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = fa.create_block_mask(causal, 2, 4, 16, 16, device="npu")
    out = fa.flex_attention(q.npu(), k.npu(), v.npu(), block_mask=mask)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.cpu(), ref)
    # Other devices are still checked by PyTorch's validation.
    with pytest.raises(ValueError, match="FlexAttention is only supported"):
        fa.flex_attention(q.to("meta"), k.to("meta"), v.to("meta"))


# ---- torch.backends.npu has torch_npu's SDPA switches ---------------------------------------

def test_torch_backends_npu_sdp_switches():
    import warnings

    backends = torch.backends.npu
    for name in ("sdp_kernel", "flash_sdp_enabled", "enable_flash_sdp", "mem_efficient_sdp_enabled",
                 "enable_mem_efficient_sdp", "math_sdp_enabled", "enable_math_sdp", "preferred_linalg_library"):
        assert callable(getattr(backends, name)), name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = (backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(), backends.math_sdp_enabled())
        with backends.sdp_kernel(enable_flash=False, enable_mem_efficient=False):
            assert not backends.flash_sdp_enabled() and not backends.mem_efficient_sdp_enabled()
            assert torch._C._get_flash_sdp_enabled() is False  # the global flags PyTorch's SDPA reads
        assert (backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
                backends.math_sdp_enabled()) == before
    assert backends.enabled is True  # the op-library switch is still there
