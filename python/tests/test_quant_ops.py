"""op-plugin's fused quantizing operators (python/torch_npu/_quant_ops.py):
npu_add_rms_norm_dynamic_quant and npu_moe_init_routing_quant against references written
here from the documented formulas, on the CPU in float32, and their argument checks."""
import pytest
import torch

import torch_npu


# ---- npu_add_rms_norm_dynamic_quant ---------------------------------------------------------

def _rms_ref(x1, x2, gamma, beta, eps):
    """x = x1 + x2 (as stored in x1's dtype), y = x / sqrt(mean(x^2) + eps) * gamma + beta in float32."""
    x = (x1.float() + x2.float()).to(x1.dtype)
    xf = x.float()
    y = xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + eps) * gamma.float()
    if beta is not None:
        y = y + beta.float()
    return x, y


def _dyn_quant_ref(y, smooth, top):
    """Symmetric per-row quantization: scale = max|y * smooth| / top, q = round(y * smooth / scale)."""
    v = y if smooth is None else y * smooth.float()
    scale = v.abs().amax(-1) / top
    q = torch.round(v / scale.unsqueeze(-1)).clamp(-top - 1, top)
    return q, scale


def _unpack_int4(words):
    """int32 words [..., c] -> [..., 8 c] signed 4-bit values, lowest nibble first."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    nib = torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], -1)
    return torch.where(nib >= 8, nib - 16, nib).flatten(-2)


def _assert_quant_close(q, expected):
    # y's row reduction may round differently from the reference's: a value on a .5 boundary can
    # move by one step, nothing more
    diff = (q.cpu().to(torch.int32) - expected.to(torch.int32)).abs()
    assert int(diff.max()) <= 1
    assert (diff == 0).float().mean() > 0.98


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_add_rms_norm_dynamic_quant_two_branches(dtype):
    torch.manual_seed(0)
    x1, x2 = torch.randn(2, 3, 32, dtype=dtype), torch.randn(2, 3, 32, dtype=dtype)
    gamma = (torch.rand(32) + 0.5).to(dtype)
    beta = (torch.randn(32) * 0.1).to(dtype)
    s1, s2 = (torch.rand(32) + 0.5).to(dtype), (torch.rand(32) + 0.5).to(dtype)
    eps = 1e-5
    y1, y2, x_out, scale1, scale2 = torch_npu.npu_add_rms_norm_dynamic_quant(
        x1.npu(), x2.npu(), gamma.npu(), smooth_scale1=s1.npu(), smooth_scale2=s2.npu(), beta=beta.npu(),
        epsilon=eps, output_mask=[True, True])
    x, y = _rms_ref(x1, x2, gamma, beta, eps)
    assert x_out.dtype == dtype and torch.equal(x_out.cpu(), x)
    for q, scale, smooth in ((y1, scale1, s1), (y2, scale2, s2)):
        q_ref, scale_ref = _dyn_quant_ref(y, smooth, 127.0)
        assert q.dtype == torch.int8 and q.shape == (2, 3, 32)
        assert scale.dtype == torch.float32 and scale.shape == (2, 3)
        torch.testing.assert_close(scale.cpu(), scale_ref, rtol=1e-5, atol=1e-7)
        _assert_quant_close(q, q_ref)
    # the two smooth scales differ, so do the branches
    assert not torch.equal(y1.cpu(), y2.cpu())


def test_add_rms_norm_dynamic_quant_output_mask_and_defaults():
    torch.manual_seed(1)
    x1, x2 = torch.randn(4, 16, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16)
    gamma = torch.rand(16, dtype=torch.float16) + 0.5
    s1 = torch.rand(16, dtype=torch.float16) + 0.5
    n1, n2, ng, ns = x1.npu(), x2.npu(), gamma.npu(), s1.npu()
    _, y = _rms_ref(x1, x2, gamma, None, 1e-6)

    # no output_mask, no smooth scales: branch 1 only (y itself); branch 2 placeholders are 0-dim
    y1, y2, _, scale1, scale2 = torch_npu.npu_add_rms_norm_dynamic_quant(n1, n2, ng)
    q_ref, scale_ref = _dyn_quant_ref(y, None, 127.0)
    torch.testing.assert_close(scale1.cpu(), scale_ref, rtol=1e-5, atol=1e-7)
    _assert_quant_close(y1, q_ref)
    assert y2.shape == () and y2.dtype == torch.int8 and scale2.shape == () and scale2.dtype == torch.float32

    # no output_mask, smooth_scale1 only: still one branch
    y1, y2, _, scale1, scale2 = torch_npu.npu_add_rms_norm_dynamic_quant(n1, n2, ng, smooth_scale1=ns)
    q_ref, scale_ref = _dyn_quant_ref(y, s1, 127.0)
    _assert_quant_close(y1, q_ref)
    torch.testing.assert_close(scale1.cpu(), scale_ref, rtol=1e-5, atol=1e-7)
    assert y2.numel() == 1 and scale2.numel() == 1

    # output_mask [False, True]: the second branch, without smooth scale
    y1, y2, _, scale1, scale2 = torch_npu.npu_add_rms_norm_dynamic_quant(n1, n2, ng, output_mask=[False, True])
    q_ref, scale_ref = _dyn_quant_ref(y, None, 127.0)
    assert y1.shape == () and scale1.shape == ()
    _assert_quant_close(y2, q_ref)
    torch.testing.assert_close(scale2.cpu(), scale_ref, rtol=1e-5, atol=1e-7)


def test_add_rms_norm_dynamic_quant_int4():
    torch.manual_seed(2)
    x1, x2 = torch.randn(3, 16, dtype=torch.float16), torch.randn(3, 16, dtype=torch.float16)
    gamma = torch.rand(16, dtype=torch.float16) + 0.5
    _, y = _rms_ref(x1, x2, gamma, None, 1e-6)
    q_ref, scale_ref = _dyn_quant_ref(y, None, 7.0)
    for y_dtype in (torch.quint4x2, torch_npu.int4):
        y1, y2, _, scale1, _ = torch_npu.npu_add_rms_norm_dynamic_quant(x1.npu(), x2.npu(), gamma.npu(),
                                                                        y_dtype=y_dtype)
        assert y1.dtype == torch.int32 and y1.shape == (3, 2) and y2.dtype == torch.int32
        torch.testing.assert_close(scale1.cpu(), scale_ref, rtol=1e-5, atol=1e-7)
        _assert_quant_close(_unpack_int4(y1.cpu()), q_ref)


def test_add_rms_norm_dynamic_quant_bad_input():
    x = torch.randn(2, 16, dtype=torch.float16).npu()
    g = torch.ones(16, dtype=torch.float16).npu()
    s = torch.ones(16, dtype=torch.float16).npu()
    op = torch_npu.npu_add_rms_norm_dynamic_quant
    with pytest.raises(RuntimeError, match="at least one of y1 and y2 must be output"):
        op(x, x, g, output_mask=[False, False])
    with pytest.raises(RuntimeError, match=r"smooth_scale1 is given, so output_mask\[0\] must be True"):
        op(x, x, g, smooth_scale1=s, output_mask=[False, True])
    with pytest.raises(RuntimeError, match=r"smooth_scale2 is given, so output_mask\[1\] must be True"):
        op(x, x, g, smooth_scale2=s, output_mask=[True, False])
    with pytest.raises(RuntimeError, match="smooth_scale2 needs smooth_scale1"):
        op(x, x, g, smooth_scale2=s)
    with pytest.raises(RuntimeError, match="The x1 should be in 2~8D"):
        op(x[0], x[0], g)
    with pytest.raises(RuntimeError, match="The shape of x1 and x2 must be the same"):
        op(x, x[:1], g)
    with pytest.raises(RuntimeError, match="x1 must be float16 or bfloat16"):
        op(x.float(), x.float(), g.float())
    with pytest.raises(RuntimeError, match="x2 must have x1's dtype"):
        op(x, x.bfloat16(), g)
    with pytest.raises(RuntimeError, match=r"gamma must be a 1-D torch.float16 tensor of x1's last dimension \(16\)"):
        op(x, x, g[:8])
    with pytest.raises(RuntimeError, match="beta must be a 1-D"):
        op(x, x, g, beta=s.float())
    with pytest.raises(RuntimeError, match="divisible by 8 if y dtype is torch_npu.int4"):
        op(x[:, :12], x[:, :12], g[:12], y_dtype=torch.quint4x2)
    with pytest.raises(RuntimeError, match="y_dtype must be torch.int8"):
        op(x, x, g, y_dtype=torch.float16)
    with pytest.raises(TypeError, match="gamma must be a Tensor"):
        op(x, x, None)


# ---- npu_moe_init_routing_quant ---------------------------------------------------------------

def _moe_ref(x, idx, scale, offset, quant_mode):
    """The rows x[s // K] of the flat indices s sorted stably by expert, each quantized to int8, with
    (sorted flat indices, their experts, per-row dynamic scales or None)."""
    n, k = idx.shape
    flat = idx.reshape(-1).tolist()
    order = sorted(range(n * k), key=lambda s: (flat[s], s))
    rows, scales = [], []
    for s in order:
        row = x[s // k]
        if quant_mode == 0:  # float16 arithmetic, as the kernel
            v = (row.half() * scale.half()[0] + offset.half()[0]).float()
            rows.append(torch.round(v).clamp(-128, 127).to(torch.int8))
        else:
            v = row.float()
            if scale is not None:
                v = v * scale[0 if scale.size(0) == 1 else flat[s]]
            sc = v.abs().max() / 127
            rows.append(torch.round(v / sc).clamp(-128, 127).to(torch.int8))
            scales.append(sc)
    q = torch.stack(rows)
    return order, [flat[s] for s in order], q, (torch.stack(scales) if scales else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_moe_init_routing_quant_dropless_dynamic(dtype):
    torch.manual_seed(3)
    n, k, h, experts = 5, 3, 16, 6
    x = torch.randn(n, h).to(dtype)
    idx = torch.randint(0, experts, (n, k), dtype=torch.int32)
    smooth = torch.rand(experts, h) + 0.5
    for scale in (None, smooth, smooth[:1]):
        order, sorted_experts, q, scales = _moe_ref(x, idx, scale, None, 1)
        for mode in (1, 2):
            ex, row_idx, tokens, before, ex_scale = torch_npu.npu_moe_init_routing_quant(
                x.npu(), idx.npu(), scale=None if scale is None else scale.npu(), active_num=0,
                expert_num=experts, expert_tokens_num_mode=mode, quant_mode=1)
            assert ex.dtype == torch.int8 and torch.equal(ex.cpu(), q)
            expected_idx = torch.empty(n * k, dtype=torch.int32)
            expected_idx[torch.tensor(order)] = torch.arange(n * k, dtype=torch.int32)
            assert row_idx.dtype == torch.int32 and torch.equal(row_idx.cpu(), expected_idx)
            counts = torch.tensor([sorted_experts.count(e) for e in range(experts)], dtype=torch.int32)
            assert tokens.dtype == torch.int32
            assert torch.equal(tokens.cpu(), counts.cumsum(0).int() if mode == 1 else counts)
            assert before is None
            torch.testing.assert_close(ex_scale.cpu(), scales, rtol=1e-6, atol=0)


def test_moe_init_routing_quant_static_and_active():
    torch.manual_seed(4)
    n, k, h, experts = 4, 2, 8, 4
    x = torch.randn(n, h)
    idx = torch.randint(0, experts, (n, k), dtype=torch.int32)
    scale, offset = torch.tensor([20.0]), torch.tensor([0.5])
    order, _, q, _ = _moe_ref(x, idx, scale, offset, 0)
    # active_num 5 < N * K: the first 5 sorted rows; expert ids past expert_num are fine without counts
    ex, row_idx, tokens, before, ex_scale = torch_npu.npu_moe_init_routing_quant(
        x.npu(), idx.npu(), scale=scale.npu(), offset=offset.npu(), active_num=5, expert_num=2, quant_mode=0)
    assert ex.shape == (5, h) and torch.equal(ex.cpu(), q[:5])
    expected_idx = torch.empty(n * k, dtype=torch.int32)
    expected_idx[torch.tensor(order)] = torch.arange(n * k, dtype=torch.int32)
    assert torch.equal(row_idx.cpu(), expected_idx)
    assert tokens is None and before is None and ex_scale is None


@pytest.mark.parametrize("quant_mode", [0, 1])
def test_moe_init_routing_quant_drop_pad(quant_mode):
    torch.manual_seed(5)
    n, k, h, experts, capacity = 6, 2, 8, 3, 2
    x = torch.randn(n, h, dtype=torch.float16)
    idx = torch.tensor([[0, 1], [0, 2], [0, 1], [2, 0], [1, 2], [2, 1]], dtype=torch.int32)
    scale = torch.tensor([10.0]) if quant_mode == 0 else torch.rand(experts, h) + 0.5
    offset = torch.tensor([-1.0]) if quant_mode == 0 else None
    order, sorted_experts, q, scales = _moe_ref(x, idx, scale, offset, quant_mode)
    # each expert's first `capacity` sorted rows, in slots e * capacity + j; the others dropped
    ex_ref = torch.zeros(experts * capacity, h, dtype=torch.int8)
    scale_ref = torch.zeros(experts * capacity)
    idx_ref = torch.full((n * k,), -1, dtype=torch.int32)
    seen = [0] * experts
    for d, (s, e) in enumerate(zip(order, sorted_experts)):
        if seen[e] < capacity:
            slot = e * capacity + seen[e]
            ex_ref[slot] = q[d]
            idx_ref[s] = slot
            if scales is not None:
                scale_ref[slot] = scales[d]
        seen[e] += 1
    ex, row_idx, tokens, before, ex_scale = torch_npu.npu_moe_init_routing_quant(
        x.npu(), idx.npu(), scale=scale.npu(), offset=None if offset is None else offset.npu(),
        expert_capacity=capacity, expert_num=experts, drop_pad_mode=1, expert_tokens_num_mode=1,
        expert_tokens_before_capacity_flag=True, quant_mode=quant_mode)
    assert ex.shape == (experts, capacity, h) and torch.equal(ex.cpu().reshape(-1, h), ex_ref)
    assert torch.equal(row_idx.cpu(), idx_ref)
    assert tokens is None  # the counts of dropless mode only
    assert before.dtype == torch.int32 and before.tolist() == seen
    if quant_mode == 1:
        torch.testing.assert_close(ex_scale.cpu(), scale_ref, rtol=1e-6, atol=0)
    else:
        assert ex_scale is None


def test_moe_init_routing_quant_bad_input():
    x = torch.randn(4, 8).npu()
    idx = torch.randint(0, 4, (4, 2), dtype=torch.int32).npu()
    op = torch_npu.npu_moe_init_routing_quant
    with pytest.raises(RuntimeError, match="Input tensor 'x' must be 2-dimensional, but got dimension 1"):
        op(x[0], idx)
    with pytest.raises(RuntimeError, match="Input tensor 'expert_idx' must be 2-dimensional"):
        op(x, idx[0])
    with pytest.raises(RuntimeError, match=r"number of rows in input 'x' \(4\) must match .* \(3\)"):
        op(x, idx[:3])
    with pytest.raises(RuntimeError, match="Parameter 'drop_pad_mode' must be 0 or 1, but got: 2"):
        op(x, idx, drop_pad_mode=2)
    with pytest.raises(RuntimeError, match="Parameter 'quant_mode' must be 0 or 1, but got: -1"):
        op(x, idx, quant_mode=-1)
    with pytest.raises(RuntimeError, match="Parameter 'expert_tokens_num_mode' must be 0, 1, or 2, but got: 3"):
        op(x, idx, expert_tokens_num_mode=3)
    with pytest.raises(RuntimeError, match="expert_idx must be int32"):
        op(x, idx.long())
    with pytest.raises(RuntimeError, match="x must be float16, bfloat16 or float32"):
        op(x.double(), idx)
    with pytest.raises(RuntimeError, match="quant_mode=0\\) needs scale and offset"):
        op(x, idx, scale=torch.ones(1).npu(), quant_mode=0)
    with pytest.raises(RuntimeError, match=r"offset must be of shape \[1\] for quant_mode=0"):
        op(x, idx, scale=torch.ones(1).npu(), offset=torch.zeros(2).npu(), quant_mode=0)
    with pytest.raises(RuntimeError, match=r"scale must be \[1, 8\] or \[expert_num=4, 8\]"):
        op(x, idx, scale=torch.ones(2, 8).npu(), expert_num=4)
    with pytest.raises(RuntimeError, match="scale must be float32"):
        op(x, idx, scale=torch.ones(1, 8, dtype=torch.float16).npu())
    with pytest.raises(RuntimeError, match="drop_pad_mode=1 needs expert_capacity > 0"):
        op(x, idx, drop_pad_mode=1, expert_num=4)
    with pytest.raises(RuntimeError, match=r"expert_idx must be in \[0, expert_num=2\)"):
        op(x, idx.clamp(min=3), expert_num=2, expert_tokens_num_mode=2)
    with pytest.raises(RuntimeError, match="expert_idx must not be negative"):
        op(x, idx - 5)
    with pytest.raises(RuntimeError, match="must not be negative"):
        op(x, idx, active_num=-1)
