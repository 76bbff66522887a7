"""torch_npu.contrib's helper functions and classes: channel_shuffle's index-select functions,
ModulatedDeformConv2dFunction, focus.fast_slice, anchor_generator.box_dtype_check, the extra
MultiheadAttention methods and the (*args, **kwargs) entry points of fused_attention /
matmul_transpose."""
import pytest
import torch

import torch_npu
from torch_npu.contrib import module as m
from torch_npu.contrib.module import channel_shuffle as cs


def _reference_shuffle(x1, x2, groups=2):
    x = torch.cat([x1, x2], 1)
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


@pytest.mark.parametrize("split_shuffle", [True, False])
def test_channel_shuffle_functions_forward_and_backward(split_shuffle):
    x1 = torch.randn(2, 4, 3, 3, device="npu", requires_grad=True)
    x2 = torch.randn(2, 4, 3, 3, device="npu", requires_grad=True)
    mod = m.ChannelShuffle(8, split_shuffle=split_shuffle).npu().train()
    out = mod(x1, x2)
    ref = _reference_shuffle(x1.detach().cpu(), x2.detach().cpu())
    got = torch.cat(out, 1) if split_shuffle else out
    torch.testing.assert_close(got.detach().cpu(), ref)
    assert mod.bp_index1.device.type == "npu" and mod.bp_index1.dtype == torch.int32   # check_self
    weights = torch.randn(got.shape)
    (got * weights.npu()).sum().backward()
    # the gradient of a permutation is the inverse permutation of the weights
    w1, w2 = weights[:, 0::2], weights[:, 1::2]
    torch.testing.assert_close(x1.grad.cpu(), w1)
    torch.testing.assert_close(x2.grad.cpu(), w2)
    mod.eval()
    with torch.no_grad():
        got_eval = mod(x1, x2)
    got_eval = torch.cat(got_eval, 1) if split_shuffle else got_eval
    torch.testing.assert_close(got_eval.cpu(), ref)


def test_indexselect_module_functions():
    x1, x2 = torch.randn(1, 2, 2, 2), torch.randn(1, 2, 2, 2)
    idx = torch.tensor([0, 2, 1, 3])
    torch.testing.assert_close(cs.indexselect_full_implementation_forward(x1, x2, idx), _reference_shuffle(x1, x2))
    a, b = cs.indexselect_half_implementation_forward(x1, x2, idx[:2], idx[2:])
    torch.testing.assert_close(torch.cat([a, b], 1), _reference_shuffle(x1, x2))
    x1.requires_grad_()
    out = cs.IndexSelectFullImplementation.apply(x1, x2, idx, torch.tensor([0, 2]), torch.tensor([1, 3]))
    out.sum().backward()
    torch.testing.assert_close(x1.grad, torch.ones_like(x1))


def test_modulated_deform_conv2d_function_matches_the_module():
    torch.manual_seed(0)
    mod = m.ModulatedDeformConv(4, 6, 3, stride=1, padding=1, pack=False).npu()
    x = torch.randn(2, 4, 5, 5, device="npu", requires_grad=True)
    offset = (torch.randn(2, 18, 5, 5) * 0.5).npu().requires_grad_()
    mask = torch.rand(2, 9, 5, 5, device="npu", requires_grad=True)
    ref = mod((x, offset, mask))
    ref.sum().backward()
    ref_grads = [t.grad.clone() for t in (x, offset, mask, mod.weight)]
    for t in (x, offset, mask, mod.weight):
        t.grad = None
    from torch_npu.contrib.module.deform_conv import ModulatedDeformConv2dFunction

    out = ModulatedDeformConv2dFunction.apply(x, offset, mask, mod.weight, mod.bias, True, 1, 1, 1, 1, 1)
    torch.testing.assert_close(out.cpu(), ref.detach().cpu(), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    for got, want in zip((x.grad, offset.grad, mask.grad, mod.weight.grad), ref_grads):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-3, atol=1e-3)


def test_fast_slice_and_box_dtype_check():
    from torch_npu.contrib.function.anchor_generator import box_dtype_check
    from torch_npu.contrib.module.focus import fast_slice

    x = torch.arange(16.).view(1, 1, 4, 4)
    parts = fast_slice(x)
    assert [p[0, 0].tolist() for p in parts] == [[[0., 2.], [8., 10.]], [[4., 6.], [12., 14.]],
                                                 [[1., 3.], [9., 11.]], [[5., 7.], [13., 15.]]]
    assert box_dtype_check(torch.ones(2, 4, dtype=torch.int64)).dtype == torch.float32
    h = torch.ones(2, 4, dtype=torch.half)
    assert box_dtype_check(h) is h
    boxes = torch.tensor([[0, 0, 10, 10]], device="npu")
    flags = torch_npu.contrib.npu_single_level_responsible_flags((2, 2), boxes, (8, 8), 3)
    assert flags.shape == (12,)


def test_multihead_attention_extra_methods():
    from torch_npu.contrib.module.multihead_attention import Matmul_transpose

    mha = m.MultiheadAttention(8, 2)
    x = torch.randn(3, 5, 8)
    y = mha.transpose_for_scores(x)
    torch.testing.assert_close(y, x.view(3, 5, 2, 4).permute(0, 2, 1, 3))
    mha.batch_size, mha.squence_length = 3, 5
    torch.testing.assert_close(mha.transpose_for_scores(x.reshape(15, 8)), y)
    w = torch.randn(2, 4, 4)
    assert mha.apply_sparse_mask(w, 4, 4, 1) is w
    packed = torch.randn(24, 8)
    bias = torch.randn(24)
    sd = {"enc.attn.in_proj_weight": packed, "enc.attn.in_proj_bias": bias, "enc.attn.out_proj.weight": 1}
    mha.upgrade_state_dict_named(sd, "enc.attn")
    assert "enc.attn.in_proj_weight" not in sd and "enc.attn.in_proj_bias" not in sd
    torch.testing.assert_close(sd["enc.attn.k_proj.weight"], packed[8:16])
    torch.testing.assert_close(sd["enc.attn.v_proj.bias"], bias[16:])
    a, b = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    torch.testing.assert_close(Matmul_transpose(a, b), a @ b.transpose(-2, -1))
    torch.testing.assert_close(torch_npu.contrib.matmul_transpose(tensor1=a, tensor2=b), a @ b.transpose(-2, -1))


def test_quant_noise_drops_blocks_in_training_only():
    from torch import nn
    from torch_npu.contrib.module.multihead_attention import _quant_noise

    torch.manual_seed(0)
    lin = nn.Linear(16, 8).npu()
    w = lin.weight.detach().clone()
    assert _quant_noise(lin, 0.5, 4) is lin
    lin.eval()
    lin(torch.randn(2, 16, device="npu"))
    torch.testing.assert_close(lin.weight.detach(), w)  # no noise in evaluation
    lin.train()
    lin(torch.randn(2, 16, device="npu"))
    blocks = lin.weight.detach().cpu().view(8, 4, 4)
    dropped = blocks.eq(0).all(-1)
    assert 0 < dropped.sum() < 32  # whole blocks of 4 inputs dropped, the rest scaled by 1 / (1 - p)
    torch.testing.assert_close(blocks[~dropped], (w.cpu().view(8, 4, 4) * 2)[~dropped])
    conv = _quant_noise(nn.Conv2d(4, 6, (2, 2)), 0.5, 4)
    conv(torch.randn(1, 4, 5, 5))
    kernels = conv.weight.detach().eq(0).flatten(2)
    assert torch.equal(kernels.all(-1), kernels.any(-1))  # whole kernels dropped
    assert _quant_noise(nn.Linear(10, 20), 0.0, 3).weight.shape == (20, 10)  # p <= 0: untouched, unchecked
    with pytest.raises(ValueError, match="multiple of block_size"):
        _quant_noise(nn.Linear(10, 20), 0.1, 3)
    with pytest.raises(ValueError, match="input channels"):
        _quant_noise(nn.Conv2d(10, 20, (1, 1)), 0.1, 3)
    with pytest.raises(ValueError, match="kernel size"):
        _quant_noise(nn.Conv2d(10, 20, (3, 3)), 0.1, 5)
    with pytest.raises(TypeError, match="Conv1d"):
        _quant_noise(nn.Conv1d(10, 10, 3), 0.1, 8)
    mha = m.MultiheadAttention(16, 2, q_noise=0.25, qn_block_size=8)
    assert all(len(p._forward_pre_hooks) == 1 for p in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj))
    assert not m.MultiheadAttention(16, 2).q_proj._forward_pre_hooks


def test_fused_attention_format_helpers():
    from torch_npu.contrib.function.fused_attention import _check_compatibility_once, _is_format_matched

    nz = [torch_npu.npu_format_cast(torch.randn(32, 32).npu(), 29) for _ in range(5)]
    nd = [torch.randn(32).npu() for _ in range(3)]
    assert _is_format_matched(nz + nd)
    assert not _is_format_matched(nz[:4] + nd + nz[:1])
    hidden = torch_npu.npu_format_cast(torch.randn(30, 1024).npu(), 29)  # 30 rows: not a multiple of 32
    mask = torch_npu.npu_format_cast(torch.randn(2, 1, 8, 8).npu(), 29)
    kernels = [torch_npu.npu_format_cast(torch.randn(1024, 1024).npu(), 29) for _ in range(3)]
    biases = [torch.randn(1024).npu() for _ in range(3)]
    for _ in range(2):  # every call is checked
        with pytest.raises(RuntimeError, match="shape of hidden_states not matches"):
            _check_compatibility_once(hidden, mask, *kernels, *biases)
    with pytest.raises(RuntimeError, match="format not matches"):
        _check_compatibility_once(hidden, mask, *kernels[:2], biases[0], *biases)
