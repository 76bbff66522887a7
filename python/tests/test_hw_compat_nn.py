"""Behaviour found missing or different by running Huawei's own test/nn, test/trans_contiguous
and top-level test_*.py files: each case checks what torch_npu does against a reference
computed here."""

import pytest
import torch

import torch_npu  # noqa: F401


# ---- sparse COO add in float16 / bfloat16 (PyTorch's CPU kernel has none) --------------------

def _sparse(dtype, indices, values, size):
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values, dtype=dtype), size)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_add_in_reduced_precision(dtype):
    a = _sparse(dtype, [[0, 1, 3]], [[1.5, 2.0], [0.25, -1.0], [3.0, 4.0]], (5, 2))
    b = _sparse(dtype, [[1, 4]], [[2.0, 2.0], [-0.5, 8.0]], (5, 2))
    # Reference: the float sum rounded once to dtype.
    ref = (a.float().to_dense() + 3 * b.float().to_dense()).to(dtype)
    an, bn = a.npu(), b.npu()

    out = torch.add(an, bn, alpha=3)
    assert out.is_sparse and out.dtype == dtype and out.device.type == "npu"
    torch.testing.assert_close(out.to_dense().cpu(), ref, rtol=0, atol=0)

    res = torch.sparse_coo_tensor(size=(5, 2), dtype=dtype).npu()
    torch.add(an, bn, alpha=3, out=res)
    torch.testing.assert_close(res.to_dense().cpu(), ref, rtol=0, atol=0)

    an.add_(bn, alpha=3)
    torch.testing.assert_close(an.to_dense().cpu(), ref, rtol=0, atol=0)


def test_sparse_embedding_fp16_accumulates_gradients():
    # Huawei's test/nn/test_embedding.py::test_embedding_backward (float16): the second
    # backward adds two sparse float16 gradients.
    emb = torch.nn.Embedding(10, 3, sparse=True).half().npu()
    idx = torch.tensor([7, 1, 3, 1]).npu()
    emb(idx).sum().backward()
    emb(idx).sum().backward()
    dense = emb.weight.grad.to_dense().cpu().float()
    ref = torch.zeros(10, 3)
    for i in [7, 1, 3, 1]:
        ref[i] += 2
    torch.testing.assert_close(dense, ref)


# ---- profiles name a device copy aclnnInplaceCopy, as torch_npu's do -------------------------

def test_device_copy_is_named_aclnnInplaceCopy_in_profiles():
    from torch_npu.testing.common_utils import check_operators_in_prof

    x = torch.randn(2, 6, 9, 4)
    xn = x.npu()
    with torch.autograd.profiler.profile(use_device="npu") as prof:
        y = xn.permute(1, 0, 2, 3).contiguous()
    assert check_operators_in_prof(["aclnnInplaceCopy"], prof)
    torch.testing.assert_close(y.cpu(), x.permute(1, 0, 2, 3).contiguous())
    # Host <-> device copies are not device copies.
    with torch.autograd.profiler.profile(use_device="npu") as prof:
        x.npu().cpu()
    assert not check_operators_in_prof(["aclnnInplaceCopy"], prof)


# ---- FlexAttention on npu (Huawei's test/nn/test_npu_flexattention.py) ---------------------

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


# ---- nn.DataParallel across npu devices (torch._C._scatter & co., as torch_npu defines) ------

def test_data_parallel_over_npus_matches_single_device():
    if torch.npu.device_count() < 3:
        pytest.skip("needs 3 npu devices")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(8, 3)
    ref = model(x)
    ref.pow(2).sum().backward()
    grad_ref = model[0].weight.grad.clone()
    model.zero_grad()

    model = model.npu()
    dp = torch.nn.DataParallel(model, device_ids=[0, 1, 2])
    out = dp(x.npu())
    assert out.device == torch.device("npu", 0)
    torch.testing.assert_close(out.cpu(), ref)
    out.pow(2).sum().backward()
    torch.testing.assert_close(model[0].weight.grad.cpu(), grad_ref)


def test_parallel_comm_primitives_on_npu():
    if torch.npu.device_count() < 3:
        pytest.skip("needs 3 npu devices")
    from torch.nn.parallel import comm

    t = torch.arange(20.0).view(10, 2)
    tn = t.npu()
    parts = comm.scatter(tn, [0, 2], chunk_sizes=[3, 7])
    assert [p.device.index for p in parts] == [0, 2] and [p.shape[0] for p in parts] == [3, 7]
    torch.testing.assert_close(parts[1].cpu(), t[3:])
    torch.testing.assert_close(comm.gather(parts, destination=1).cpu(), t)
    assert comm.gather(parts, destination=1).device == torch.device("npu", 1)
    assert comm.gather(parts, destination="cpu").device.type == "cpu"
    copies = comm.broadcast(tn, [0, 1, 2])
    assert copies[0] is tn and copies[2].device == torch.device("npu", 2)
    torch.testing.assert_close(copies[2].cpu(), t)
    coalesced = comm.broadcast_coalesced([tn, tn[0]], [0, 1])
    torch.testing.assert_close(coalesced[1][1].cpu(), t[0])
    out = [torch.empty(5, 2, device="npu:1"), torch.empty(5, 2, device="npu:2")]
    comm.scatter(tn, out=out)
    torch.testing.assert_close(out[1].cpu(), t[5:])
    dest = torch.empty(10, 2, device="npu:0")
    comm.gather(out, out=dest)
    torch.testing.assert_close(dest.cpu(), t)
    with pytest.raises(RuntimeError, match="do not sum"):
        comm.scatter(tn, [0, 1], chunk_sizes=[3, 3])


# ---- F.one_hot of int32 labels (torch_npu: any integer dtype, result in that dtype) ----------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
def test_one_hot_takes_integer_labels_of_any_dtype(dtype):
    labels = torch.tensor([[0, 2], [1, 4]])
    ref = torch.nn.functional.one_hot(labels)  # int64, 5 classes
    out = torch.nn.functional.one_hot(labels.to(dtype).npu())
    assert out.dtype == dtype and out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), ref.to(dtype))
    out = torch.nn.functional.one_hot(labels.to(dtype).npu(), num_classes=7)
    torch.testing.assert_close(out.cpu(), torch.nn.functional.one_hot(labels, 7).to(dtype))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_counts_integer_tensors(dtype):
    """As aclnnHistc and CUDA (transformers' MoE routing counts int32 expert ids with it):
    the counts in the input's dtype; CPU's kernel takes floating types only."""
    ids = torch.tensor([0, 0, 1, 3, 3, 3, 7], dtype=dtype)
    counts = torch.histc(ids.npu(), bins=4, min=0, max=3)
    assert counts.dtype == dtype and counts.device.type == "npu"
    assert counts.cpu().tolist() == [2, 1, 0, 3]  # 7 is outside [min, max]
    out = torch.empty(0, dtype=dtype, device="npu")
    assert torch.histc(ids.npu(), bins=4, min=0, max=3, out=out) is out
    assert out.cpu().tolist() == [2, 1, 0, 3]
    with pytest.raises(RuntimeError, match="expected out of dtype"):
        torch.histc(ids.npu(), bins=4, out=torch.empty(0, device="npu"))
    floats = torch.histc(ids.float().npu(), bins=4, min=0, max=3)
    assert floats.dtype == torch.float32 and floats.cpu().tolist() == [2, 1, 0, 3]


def test_one_hot_rejects_what_pytorch_rejects():
    f = torch.nn.functional.one_hot
    with pytest.raises(RuntimeError, match="integer type"):
        f(torch.tensor([0.0, 1.0]).npu())
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        f(torch.tensor([0, 3]).npu(), 3)
    with pytest.raises(RuntimeError, match="non-negative"):
        f(torch.tensor([-1, 0]).npu())
    with pytest.raises(RuntimeError, match="empty tensor"):
        f(torch.tensor([], dtype=torch.long).npu())
    assert f(torch.tensor([], dtype=torch.int32).npu(), 3).shape == (0, 3)


# ---- torch_npu.testing's assertEqual: 0-d vs one-element numpy arrays compare by value -------

def test_testcase_assert_equal_0d_against_one_element_array():
    import numpy as np
    from torch_npu.testing.testcase import TestCase

    class _T(TestCase):
        def runTest(self):
            pass

    t = _T()
    t.assertEqual(torch.tensor([10]).numpy(), torch.tensor(10).numpy())
    t.assertEqual(np.array(3.0), np.array([3.0]))
    with pytest.raises(AssertionError):
        t.assertEqual(torch.tensor([10]).numpy(), torch.tensor(9).numpy())
    with pytest.raises(AssertionError):  # other shape mismatches still fail
        t.assertEqual(np.zeros(2), np.zeros((1, 2)))


# ---- torch.backends.npu has torch_npu's SDPA switches (Huawei's test_native_mha) ------------

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


# ---- torch.npu.<X>Storage legacy typed storages (Huawei's test_bool_storage) -----------------

@pytest.mark.parametrize("name,dtype", [("BoolStorage", torch.bool), ("FloatStorage", torch.float32),
                                        ("HalfStorage", torch.float16), ("LongStorage", torch.int64)])
def test_npu_legacy_storage_types(name, dtype):
    import warnings

    cls = getattr(torch.npu, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = cls(3)
        assert s.device.type == "npu" and s.dtype == dtype and s.size() == 3
        s.fill_(1)
        assert s.tolist() == torch.ones(3, dtype=dtype).tolist()
        t = torch.tensor([0, 1, 1], dtype=dtype, device="npu")
        assert isinstance(t.storage(), cls)
        assert not isinstance(t.cpu().storage(), cls)  # a CPU storage of that dtype is not one
        assert t.storage().tolist() == [0, 1, 1] or t.storage().tolist() == [False, True, True]
        s2 = cls([1, 0])
        assert s2.device.type == "npu" and s2.tolist() == torch.tensor([1, 0], dtype=dtype).tolist()
        with pytest.raises(RuntimeError, match="Not available for NPU storage"):
            cls.from_buffer(b"\x00")


# ---- int32 class targets and half_to_float softmax, as torch_npu's aclnn kernels take them ----

@pytest.mark.parametrize("loss", ["nll_loss", "nll_loss2d", "multilabel_margin_loss"])
def test_losses_take_int32_targets(loss):
    torch.manual_seed(0)
    if loss == "nll_loss":
        x, target = torch.randn(6, 5).log_softmax(1), torch.randint(0, 5, (6,))
        fn = torch.nn.functional.nll_loss
    elif loss == "nll_loss2d":
        x, target = torch.randn(2, 5, 3, 3).log_softmax(1), torch.randint(0, 5, (2, 3, 3))
        fn = torch.nn.functional.nll_loss
    else:
        x, target = torch.randn(4, 5), torch.tensor([[1, 2, -1, 0, 0]] * 4)
        fn = torch.nn.functional.multilabel_margin_loss
    expected_x = x.clone().requires_grad_()
    expected = fn(expected_x, target)
    expected.backward()
    npu_x = x.npu().requires_grad_()
    got = fn(npu_x, target.to(torch.int32).npu())
    torch.testing.assert_close(got.cpu(), expected.detach())
    if loss == "multilabel_margin_loss":
        # torch_npu registers no kernel for multilabel_margin_loss_backward: it takes the CPU
        # fallback, whose kernel wants int64 targets.
        got = fn(npu_x, target.npu())
    got.backward()
    torch.testing.assert_close(npu_x.grad.cpu(), expected_x.grad)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_half_to_float(log):
    x = torch.randn(4, 7, dtype=torch.float16)
    op = torch._log_softmax if log else torch._softmax
    npu_x = x.npu().requires_grad_()
    y = op(npu_x, 1, True)
    assert y.dtype == torch.float32
    ref_x = x.float().requires_grad_()
    ref = op(ref_x, 1, False)
    torch.testing.assert_close(y.detach().cpu(), ref.detach())
    weight = torch.randn(4, 7)
    (y * weight.npu()).sum().backward()
    (ref * weight).sum().backward()
    assert npu_x.grad.dtype == torch.float16
    torch.testing.assert_close(npu_x.grad.cpu(), ref_x.grad.half())
