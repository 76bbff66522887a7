"""torch_npu.contrib's modules and npu_ps_roi_pooling against plain-PyTorch references written
here: npu_ps_roi_pooling / PSROIPool (forward, backward, gradcheck), BiLSTM, FusedColorJitter,
FastSyncBatchNorm (one process and two ranks), NpuPreGenDropout, and the import paths of the
contrib members; errors for bad arguments."""
import math
import random
import warnings

import numpy as np
import pytest
import torch

import torch_npu
from torch_npu.contrib import module as cm


# ---- npu_ps_roi_pooling ------------------------------------------------------------------------

def ref_ps_roi_pool(x, rois, scale, gs, od):
    """R-FCN PSROIPooling written out bin by bin (differentiable in x)."""
    N, C, H, W = x.shape
    R = rois.shape[2]
    outs = []
    for b in range(N):
        for r in range(R):
            bid, x1, y1, x2, y2 = [float(v) for v in rois[b, :, r]]
            sw, sh = round(x1) * scale, round(y1) * scale
            ew, eh = (round(x2) + 1) * scale, (round(y2) + 1) * scale
            bw, bh = max(ew - sw, 0.1) / gs, max(eh - sh, 0.1) / gs
            vals = []
            for d in range(od):
                for i in range(gs):
                    for j in range(gs):
                        hs = min(max(math.floor(i * bh + sh), 0), H)
                        he = min(max(math.ceil((i + 1) * bh + sh), 0), H)
                        ws = min(max(math.floor(j * bw + sw), 0), W)
                        we = min(max(math.ceil((j + 1) * bw + sw), 0), W)
                        if he <= hs or we <= ws:
                            vals.append(x.new_zeros(()))
                        else:
                            vals.append(x[int(bid), (d * gs + i) * gs + j, hs:he, ws:we].mean())
            outs.append(torch.stack(vals).reshape(od, gs, gs))
    return torch.stack(outs)


def make_rois(N, R, H, W, scale, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rois = torch.empty(N, 5, R, dtype=dtype)
    for b in range(N):
        rois[b, 0] = torch.randint(0, N, (R,), generator=g).to(dtype)
        xy = torch.rand(2, R, generator=g) * torch.tensor([[W / scale], [H / scale]]) * 0.8
        wh = torch.rand(2, R, generator=g) * torch.tensor([[W / scale], [H / scale]]) * 0.6
        rois[b, 1:3] = xy
        rois[b, 3:5] = xy + wh
    return rois


@pytest.mark.parametrize("gs,od,scale", [(2, 2, 1.0), (3, 2, 0.5), (1, 3, 0.25)])
def test_ps_roi_pooling_forward(gs, od, scale):
    N, H, W, R = 2, 9, 11, 4
    x = torch.randn(N, od * gs * gs, H, W)
    rois = make_rois(N, R, H, W, scale, seed=gs)
    out = torch_npu.npu_ps_roi_pooling(x.npu(), rois.npu(), scale, gs, od)
    assert out.shape == (N * R, od, gs, gs)
    torch.testing.assert_close(out.cpu(), ref_ps_roi_pool(x, rois, scale, gs, od), rtol=1e-5, atol=1e-5)
    half = torch_npu.npu_ps_roi_pooling(x.half().npu(), rois.half().npu(), scale, gs, od)
    torch.testing.assert_close(half.cpu().float(), ref_ps_roi_pool(x.half().float(), rois.half().float(), scale, gs,
                                                                    od), rtol=1e-2, atol=1e-2)


def test_ps_roi_pooling_backward_matches_reference():
    N, gs, od, H, W, R, scale = 2, 2, 3, 8, 8, 3, 0.5
    x = torch.randn(N, od * gs * gs, H, W)
    rois = make_rois(N, R, H, W, scale, seed=7)
    gy = torch.randn(N * R, od, gs, gs)
    xr = x.clone().requires_grad_()
    ref_ps_roi_pool(xr, rois, scale, gs, od).backward(gy)
    xn = x.npu().requires_grad_()
    torch_npu.npu_ps_roi_pooling(xn, rois.npu(), scale, gs, od).backward(gy.npu())
    torch.testing.assert_close(xn.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)
    direct = torch.ops.npu.npu_ps_roi_pooling_backward(gy.npu(), rois.npu(), scale, gs, od, [H, W])
    torch.testing.assert_close(direct.cpu(), xr.grad, rtol=1e-5, atol=1e-5)


def test_ps_roi_pooling_gradcheck():
    rois = make_rois(2, 2, 5, 6, 1.0, seed=3, dtype=torch.float64).npu()
    x = torch.randn(2, 2 * 4, 5, 6, dtype=torch.float64).npu().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: torch_npu.npu_ps_roi_pooling(t, rois, 1.0, 2, 2), (x,))


def test_ps_roi_pooling_op_plugin_example():
    # op-plugin's own test: every bin falls outside the 1x1 map, so the output is zeros.
    roi = torch.tensor([[[1], [2], [3], [4], [5]], [[6], [7], [8], [9], [10]]], dtype=torch.float16).npu()
    x = torch.arange(1, 17, dtype=torch.float16).reshape(2, 8, 1, 1).npu().requires_grad_()
    out = torch_npu.npu_ps_roi_pooling(x, roi, 0.5, 2, 2)
    assert out.shape == (2, 2, 2, 2) and out.abs().sum().item() == 0
    out.backward(torch.ones_like(out))
    assert x.grad.abs().sum().item() == 0


def test_psroipool_module():
    m = cm.PSROIPool(pooled_height=3, pooled_width=3, spatial_scale=0.5, group_size=3, output_dim=2)
    assert "group_size=3" in repr(m)
    x = torch.randn(1, 18, 10, 10)
    rois = make_rois(1, 3, 10, 10, 0.5, seed=1)
    torch.testing.assert_close(m(x.npu(), rois.npu()).cpu(), ref_ps_roi_pool(x, rois, 0.5, 3, 2))
    with pytest.raises(ValueError, match="group_size"):
        cm.PSROIPool(pooled_height=7, pooled_width=5, group_size=7)


def test_ps_roi_pooling_bad_args():
    x = torch.randn(1, 8, 4, 4).npu()
    rois = torch.tensor([[[0.], [0.], [0.], [2.], [2.]]]).npu()
    with pytest.raises(RuntimeError, match="channels"):
        torch_npu.npu_ps_roi_pooling(x, rois, 1.0, 2, 3)
    with pytest.raises(RuntimeError, match="rois"):
        torch_npu.npu_ps_roi_pooling(x, rois[:, :4], 1.0, 2, 2)
    with pytest.raises(RuntimeError, match="group_size"):
        torch_npu.npu_ps_roi_pooling(x, rois, 1.0, 0, 2)
    bad = torch.tensor([[[5.], [0.], [0.], [2.], [2.]]]).npu()
    with pytest.raises(RuntimeError, match="batch index"):
        torch_npu.npu_ps_roi_pooling(x, bad, 1.0, 2, 2).cpu()


# ---- modules -----------------------------------------------------------------------------------

def test_bilstm_matches_bidirectional_lstm():
    # On the CPU: torch.nn.LSTM on npu needs aten::_thnn_fused_lstm_cell (ATen's LSTM cell
    # for non-CPU devices), which the NPU op table lacks; see test_bilstm_on_npu.
    torch.manual_seed(0)
    with pytest.warns(FutureWarning):
        m = cm.BiLSTM(6, 5)
    m = m.double()
    ref = torch.nn.LSTM(6, 5, bidirectional=True).double()
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(ref, name).copy_(getattr(m.fw_rnn, name))
            getattr(ref, name + "_reverse").copy_(getattr(m.bw_rnn, name))
    x = torch.randn(7, 3, 6, dtype=torch.float64)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, _ = ref(xr)
    y = m(xm)
    assert y.shape == (7, 3, 10)
    torch.testing.assert_close(y, y_ref)
    gy = torch.randn(7, 3, 10, dtype=torch.float64)
    y_ref.backward(gy)
    y.backward(gy)
    torch.testing.assert_close(xm.grad, xr.grad)
    with pytest.raises(ValueError, match="seq_len"):
        m(torch.randn(3, 6))


def test_bilstm_on_npu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        m = cm.BiLSTM(4, 3)
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(m.npu()(x.npu()).cpu(), m.cpu()(x), rtol=1e-4, atol=1e-5)


def yiq_hue_saturation(hue, saturation):
    """RGB (row vectors) -> YIQ -> rotate IQ by the hue angle, scale by saturation -> RGB."""
    t = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    a = hue * 255. * math.pi / 180.
    rot = np.array([[1, 0, 0], [0, saturation * math.cos(a), -saturation * math.sin(a)],
                    [0, saturation * math.sin(a), saturation * math.cos(a)]])
    return (np.linalg.inv(t) @ rot @ t).T


def test_fused_color_jitter_matrix_and_transform():
    with pytest.warns(FutureWarning):
        jitter = cm.FusedColorJitter(brightness=0.3, contrast=0.2, saturation=0.4, hue=0.1)
    apply = jitter.transformer
    for hue, sat in [(0.0, 1.0), (0.05, 0.6), (-0.1, 1.3)]:
        np.testing.assert_allclose(apply.hue_saturation_matrix(hue, sat), yiq_hue_saturation(hue, sat), atol=6e-3)
    img = np.random.RandomState(0).uniform(0, 255, (5, 4, 3)).astype(np.float32)
    random.seed(123)
    out = jitter(img)
    random.seed(123)
    h = random.uniform(-0.1, 0.1)
    s = random.uniform(0.6, 1.4)
    c = random.uniform(0.8, 1.2)
    b = random.uniform(0.7, 1.3)
    ref = (img.reshape(-1, 3) @ yiq_hue_saturation(h, s) * b * c + (1 - c) * b * 127.5).reshape(5, 4, 3)
    assert out.dtype == np.float32 and out.shape == img.shape
    np.testing.assert_allclose(out, ref.clip(0, 255), atol=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="hue"):
            cm.FusedColorJitter(hue=(0.2, 0.9))
        with pytest.raises(TypeError):
            cm.FusedColorJitter(brightness="x")


def test_fast_sync_batchnorm_single_process_equals_batchnorm():
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(4)
    m = cm.FastSyncBatchNorm(4)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-1, 1)
    m.load_state_dict(ref.state_dict())
    m = m.npu()
    x = torch.randn(3, 4, 5, 5)
    xr, xn = x.clone().requires_grad_(), x.npu().requires_grad_()
    for _ in range(2):
        yr, yn = ref(xr), m(xn)
        torch.testing.assert_close(yn.cpu(), yr.detach(), rtol=1e-5, atol=1e-5)
    gy = torch.randn_like(x)
    yr.backward(gy)
    yn.backward(gy.npu())
    torch.testing.assert_close(xn.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.weight.grad.cpu(), ref.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.running_mean.cpu(), ref.running_mean)
    torch.testing.assert_close(m.running_var.cpu(), ref.running_var)
    m.eval(), ref.eval()
    torch.testing.assert_close(m(x.npu()).cpu(), ref(x), rtol=1e-5, atol=1e-5)
    converted = cm.FastSyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    assert isinstance(converted[0], torch.nn.SyncBatchNorm)


def _sync_bn_rank(rank, world, port, x, gy, state, kind):
    import torch.distributed as dist

    import torch_npu  # noqa: F401  (spawned interpreters start fresh)
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # torch's own SyncBatchNorm runs the batch_norm_stats/... kernels of ops/src/sync_batch_norm.cpp
        m = cm.FastSyncBatchNorm(x.size(1)) if kind == "fast" else torch.nn.SyncBatchNorm(x.size(1))
        m.load_state_dict(state)
        m = m.npu()
        chunk = x.chunk(world)[rank].npu().requires_grad_()
        y = m(chunk)
        y.backward(gy.chunk(world)[rank].npu())
        ref = torch.nn.BatchNorm2d(x.size(1))
        ref.load_state_dict(state)
        xr = x.clone().requires_grad_()
        yr = ref(xr)
        yr.backward(gy)
        torch.testing.assert_close(y.detach().cpu(), yr.detach().chunk(world)[rank], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(chunk.grad.cpu(), xr.grad.chunk(world)[rank], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m.running_mean.cpu(), ref.running_mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.running_var.cpu(), ref.running_var, rtol=1e-4, atol=1e-5)
        assert int(m.num_batches_tracked) == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["fast", "torch"])
def test_sync_batchnorm_two_ranks_equals_batchnorm_on_the_whole_batch(kind):
    import socket

    import torch.multiprocessing as mp
    if torch.npu.device_count() < 2:
        pytest.skip("needs 2 npu devices")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-1, 1)
    x, gy = torch.randn(4, 3, 5, 5) * 2 + 1, torch.randn(4, 3, 5, 5)
    mp.spawn(_sync_bn_rank, args=(2, port, x, gy, ref.state_dict(), kind), nprocs=2, join=True)


def test_npu_pregen_dropout():
    p = 0.3
    drop = cm.NpuPreGenDropout(p, module_name="m")
    model = torch.nn.Sequential(drop).npu()
    x = torch.randn(200, 500).npu()
    with pytest.raises(RuntimeError, match="enable_dropout_ensemble"):
        cm.NpuPreGenDropout(0.77)(x)  # a probability registered after enable_dropout_ensemble
    torch.manual_seed(0)
    cm.NpuPreGenDropout.enable_dropout_ensemble(model)
    outs = [model(x).cpu() for _ in range(2)]
    xc = x.cpu()
    for y in outs:
        kept = y != 0
        torch.testing.assert_close(y[kept], xc[kept] / (1 - p))  # survivors scaled by 1 / (1 - p)
        assert abs((~kept).float().mean().item() - p) < 0.01  # 100k draws: sd of the rate ~0.0015
    assert not torch.equal(outs[0] != 0, outs[1] != 0)  # each forward consumes fresh masks
    mask = drop([(3, 4), torch.float32, "npu"])
    assert mask.shape == (3, 4) and mask.dtype == torch.bool
    model.eval()
    torch.testing.assert_close(model(x).cpu(), xc)
    with pytest.raises(RuntimeError):  # torch_npu's error type for a wrong input
        drop(3)


def test_members_importable_from_torch_npu_paths():
    import importlib
    for path, names in {
        "torch_npu.contrib": ["PSROIPool", "BiLSTM", "FusedColorJitter", "FastSyncBatchNorm", "LinearQuant",
                              "LinearA8W8Quant", "LinearWeightQuant", "npu_fast_condition_index_put"],
        "torch_npu.contrib.module": ["QuantConv2d", "DropoutWithByteMask", "NpuPreGenDropout"],
        "torch_npu.contrib.module._ensemble_dropout": ["NpuPreGenDropout"],
        "torch_npu.contrib.module.ps_roi_pooling": ["PSROIPool"],
        "torch_npu.contrib.module.bidirectional_lstm": ["BiLSTM"],
        "torch_npu.contrib.module.fusedcolorjitter": ["FusedColorJitter"],
        "torch_npu.contrib.module.linear_quant": ["LinearQuant"],
        "torch_npu.contrib.module.linear_a8w8_quant": ["LinearA8W8Quant"],
        "torch_npu.contrib.module.linear_weight_quant": ["LinearWeightQuant"],
        "torch_npu.contrib.module.quant_conv2d": ["QuantConv2d"],
        "torch_npu.contrib.module._batchnorm_with_int32_count": ["FastSyncBatchNorm", "FastBatchNorm2d"],
        "torch_npu.contrib.module.npu_modules": ["DropoutWithByteMask"],
        "torch_npu.contrib.function.npu_functional": ["dropout_with_byte_mask"],
        "torch_npu.contrib.function.index_op": ["npu_fast_condition_index_put"],
    }.items():
        mod = importlib.import_module(path)
        for name in names:
            assert hasattr(mod, name), f"{path}.{name}"
    assert torch.nn.DropoutWithByteMask is cm.DropoutWithByteMask
    for name in ("npu_ps_roi_pooling", "npu_quant_matmul", "npu_weight_quant_batchmatmul", "npu_quant_conv2d",
                 "npu_trans_quant_param"):
        assert getattr(torch_npu, name) is getattr(torch.ops.npu, name)
