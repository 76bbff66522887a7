"""Behaviour found missing or different by running Huawei's own test files (test/contrib,
test/optim, test/test_*.py): torch_npu's shapes, numerics and semantics, checked against
references computed here."""

import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_npu
import torch_npu.contrib.function as cf
import torch_npu.contrib.module as cm
from conftest import run_python


# ---- npu_giou: [n, 1] as torch_npu (op-plugin permutes the kernel's [1, n]) -----------------

def _giou_ref(b, g):  # boxes as rows, xywh
    def corners(t):
        return t[:, 0] - t[:, 2] / 2, t[:, 1] - t[:, 3] / 2, t[:, 0] + t[:, 2] / 2, t[:, 1] + t[:, 3] / 2
    ax1, ay1, ax2, ay2 = corners(b)
    bx1, by1, bx2, by2 = corners(g)
    inter = (torch.min(ax2, bx2) - torch.max(ax1, bx1)).clamp(min=0) * \
        (torch.min(ay2, by2) - torch.max(ay1, by1)).clamp(min=0)
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    outer = (torch.max(ax2, bx2) - torch.min(ax1, bx1)) * (torch.max(ay2, by2) - torch.min(ay1, by1))
    return inter / union - (outer - union) / outer


def test_giou_has_torch_npus_shape_and_backward():
    # Huawei's test/contrib/test_iou.py::test_npu_giou: expected [[0.5], [0.0111], [-0.2523]]
    box1 = torch.tensor([[0, 0, 10, 10], [10, 10, 20, 20], [32, 32, 38, 42]], dtype=torch.float32)
    box2 = torch.tensor([[0, 0, 10, 20], [0, 10, 10, 10], [10, 10, 20, 20]], dtype=torch.float32)
    out = cf.npu_giou(box1.npu(), box2.npu())
    assert out.shape == (3, 1)
    torch.testing.assert_close(out.cpu()[:, 0], _giou_ref(box1, box2))
    torch.testing.assert_close(out.cpu(), torch.tensor([[0.5], [0.0111], [-0.2523]]), atol=1e-4, rtol=0)
    # The backward takes the [n, 1] gradient (random boxes: no ties between corners).
    g = torch.Generator().manual_seed(1)
    box1, box2 = torch.rand(5, 4, generator=g) + 0.5, torch.rand(5, 4, generator=g) + 0.5
    b, bc = box1.npu().requires_grad_(), box1.clone().requires_grad_()
    w = torch.randn(5, 1, generator=g)
    (cf.npu_giou(b, box2.npu()) * w.npu()).sum().backward()
    (_giou_ref(bc, box2)[:, None] * w).sum().backward()
    torch.testing.assert_close(b.grad.cpu(), bc.grad, atol=1e-5, rtol=1e-5)
    # torch_npu.npu_giou itself: boxes as columns, [n, 1]; is_cross: [n, m].
    cols = torch.rand(4, 6) + 0.2
    assert torch_npu.npu_giou(cols.npu(), cols.npu(), True, False, 0).shape == (6, 1)
    assert torch_npu.npu_giou(cols.npu(), cols[:, :4].contiguous().npu(), True, True, 0).shape == (6, 4)


# ---- npu_weight_quant_batchmatmul: the antiquantisation rounds in x's dtype ------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weight_quant_dequantises_in_x_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    m, k, n = 8, 2048, 64
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randint(-8, 8, (k, n), dtype=torch.int8, generator=g)
    scale = torch.randn(n, generator=g).to(dtype)
    offset = torch.randn(n, generator=g).to(dtype)
    out = torch_npu.npu_weight_quant_batchmatmul(x.npu(), w.npu(), scale.npu(), offset.npu()).cpu()
    # Huawei's test/contrib/test_linear_weight_quant.py reference: (w + offset) * scale in x's
    # dtype, then a float32 matmul rounded to x's dtype.
    ref = (x.float() @ ((w.to(dtype) + offset) * scale).float()).to(dtype)
    exact = (x.float() @ ((w.float() + offset.float()) * scale.float())).to(dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=2e-3)
    assert not torch.equal(ref, exact)  # the rounding is visible at this size
    assert (out == ref).float().mean() > 0.95


# ---- silu_backward: one rounding (the kernel), not PyTorch's decomposition ------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_silu_backward_matches_cpu_kernel(dtype):
    x = (torch.rand(4096) * 20 - 10).to(dtype)
    xc = x.clone().requires_grad_()
    F.silu(xc).sum().backward()
    xn = x.npu().requires_grad_()
    F.silu(xn).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, atol=0, rtol=0)
    # Huawei's test_activations.py::test_silu: the float32 gradient rounded once.
    xf = x.float().requires_grad_()
    (xf * torch.sigmoid(xf)).sum().backward()
    torch.testing.assert_close(xn.grad.cpu().float(), xf.grad.to(dtype).float(), atol=0, rtol=1e-2)


def test_silu_double_backward():
    x = torch.randn(5, dtype=torch.double).npu().requires_grad_()
    assert torch.autograd.gradgradcheck(F.silu, (x,))


# ---- NpuDropPath: torch_npu's pre-generated random tensors ----------------------------------

def test_drop_path_without_ensemble_keeps_input():
    cm.NpuDropPath.task_dict.clear()
    x = torch.randn(6, 3, 4).npu()
    dp = cm.NpuDropPath(0.5).train()
    assert dp(x) is x and dp(x) is x  # torch_npu drops only with pre-generated tensors
    assert cm.NpuDropPath(0.0).train()(x) is x
    assert dp.eval()(x) is x
    with pytest.raises(RuntimeError, match="Tensor"):
        dp.train()([1, 2])
    with pytest.raises(ValueError, match="drop_prob"):
        cm.NpuDropPath(None)


def test_drop_path_ensemble_drops_whole_samples():
    cm.NpuDropPath.task_dict.clear()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = cm.NpuDropPath(0.5)

        def forward(self, x):
            return self.drop(x)

    model = Block().npu().train()
    cm.NpuDropPath.enable_droppath_ensemble(model)
    assert isinstance(cm.NpuDropPath.droppath_stream, torch.npu.Stream)
    x = torch.randn(64, 3, 5).npu()
    assert torch.equal(model(x).cpu(), x.cpu())  # first pass: registers what it needs
    kept = 0
    for _ in range(4):
        y, xc = model(x).cpu(), x.cpu()
        per_sample = y.flatten(1)
        dropped = (per_sample == 0).all(1)
        torch.testing.assert_close(y[~dropped], xc[~dropped] * 2)  # kept samples scaled by 1/keep
        kept += int((~dropped).sum())
        assert 0 < int(dropped.sum()) < 64
    assert 64 < kept < 192  # of 4 x 64 samples, about half kept
    cm.NpuDropPath.task_dict.clear()


def test_channel_shuffle_takes_more_channels_than_in_channels():
    # Huawei's test_channel_shuffle.py: ChannelShuffle(2) on two 2-channel inputs shuffles
    # the first two channels of the concatenation.
    x = torch.randn(2, 2, 3, 3)
    out = cm.ChannelShuffle(2, split_shuffle=False)(x.npu(), x.npu()).cpu()
    ref = x.view(2, 2, 1, 3, 3).transpose(1, 2).reshape(2, 2, 3, 3)
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="in_channels"):
        cm.ChannelShuffle(8)(x.npu(), x.npu())


def test_multihead_attention_private_helpers():
    from torch_npu.contrib.module.multihead_attention import _MHAConfig, _NpuLinear
    _MHAConfig.set_fussion()
    assert _MHAConfig.use_fussion_mha
    lin = _NpuLinear(10, 20)
    x = torch.randn(5, 10)
    torch.testing.assert_close(lin(x), x @ lin.weight.t() + lin.bias)
    assert lin(torch.randn(2, 5, 10)).shape == (2, 5, 20)
    with pytest.raises(RuntimeError, match="2-D or 3-D"):
        lin(torch.randn(5, 10, 3, 1))


# ---- torch_npu.utils._error_code ------------------------------------------------------------

def test_error_code_suffix(monkeypatch):
    from torch_npu.utils._error_code import ErrCode, ops_error, pta_error
    monkeypatch.delenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", raising=False)
    msg = ops_error(ErrCode.VALUE)
    assert msg.startswith("\n[ERROR] ") and msg.endswith("ERR01003 OPS invalid value")
    assert "PID:" in msg and "RankID:-1" in msg
    assert pta_error(ErrCode.ACL).endswith("ERR00100 PTA call acl api failed")
    assert ErrCode.NOT_SUPPORT.code == 7 and ErrCode.NOT_SUPPORT.msg == "feature not supported"
    monkeypatch.setenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", "1")
    assert ops_error(ErrCode.VALUE) == ""


# ---- process-level behaviour (fresh interpreters) -------------------------------------------

def test_import_does_not_start_runtime_and_fork_children_use_npu():
    code = textwrap.dedent("""
        import os, torch, torch_npu
        assert not torch_npu.npu.is_initialized(), "import started the runtime"
        assert torch.npu.is_available() and torch.npu.device_count() > 0
        assert not torch_npu.npu.is_initialized(), "a device query started the runtime"
        pid = os.fork()
        if pid == 0:
            ok = torch.equal((torch.ones(3, device="npu") * 2).cpu(), torch.full((3,), 2.))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status))
        torch.npu.manual_seed(7)
        a = torch.randn(4, device="npu")
        assert torch_npu.npu.is_initialized()
        torch.npu.manual_seed(7)
        assert torch.equal(a.cpu(), torch.randn(4, device="npu").cpu())
        print("OK")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "CHILD 0" in result.stdout and "OK" in result.stdout


def test_host_allocator_is_registered():
    code = textwrap.dedent("""
        import torch, torch_npu
        t = torch.empty(1 << 16).pin_memory()
        assert t.is_pinned()
        torch.accelerator.memory.empty_host_cache()  # crashed without npu's HostAllocator
        torch._C._accelerator_emptyHostCache()
        del t
        print("OK")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_testing_runner_keeps_numpy_seed():
    # torch_npu's TestCase/run_tests seed torch and random, not numpy: Huawei's test files
    # seed numpy in __main__ and compare with stored data made from that seed.
    code = textwrap.dedent("""
        import sys, numpy as np, torch, torch_npu
        from torch_npu.testing.testcase import TestCase, run_tests
        class T(TestCase):
            def test_a(self):
                assert np.random.randint(1 << 30) == EXPECTED
                assert torch.equal(torch.rand(2), torch.manual_seed(666) and torch.rand(2))
        np.random.seed(35)
        EXPECTED = np.random.randint(1 << 30)
        np.random.seed(35)
        run_tests(argv=[sys.argv[0]])
    """)
    # CI unset: under CI=true torch's run_tests writes XML reports through xmlrunner.
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "CI": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stderr


def test_transfer_to_npu_profiler_kernel_device():
    code = textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore")
        import torch, torch_npu
        from torch_npu.contrib import transfer_to_npu
        from torch.autograd.profiler_util import Kernel
        assert Kernel("model_inference", "cuda", 11).device == "npu"
        assert Kernel(name="k", device="cuda:1", duration=2) == ("k", "npu:1", 2)
        assert Kernel("k", "cpu", 3).device == "cpu"
        print("OK")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_unsupported_dtype_list():
    # MindSpeed filters torch's dtypes with torch_npu.unsupported_dtype.
    assert torch_npu.unsupported_dtype == [torch.quint8, torch.quint4x2, torch.quint2x4, torch.qint32,
                                           torch.qint8]
    valid = [d for d in vars(torch).values() if isinstance(d, torch.dtype) and d not in torch_npu.unsupported_dtype]
    assert torch.float32 in valid and torch.qint8 not in valid
