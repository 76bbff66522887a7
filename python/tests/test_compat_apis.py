"""torch_npu APIs that Huawei's own test files and user code call directly: legacy tensor
types and typed storages, torch_npu._C helpers, storage sizes and data-pointer moves, SoC
numbers, collect_env, torch_npu.unsupported_dtype."""
import textwrap
import unittest

import pytest
import torch

import torch_npu
from conftest import run_python


# ---------------------------------------------------------------- legacy tensor types

def test_legacy_tensor_types_construct_like_cpu_ones():
    F = torch.npu.FloatTensor
    assert repr(F) == "<class 'torch.npu.FloatTensor'>"
    for args in [(2, 3), (torch.Size([2, 3]),), ()]:
        ref = torch.FloatTensor(*args)
        got = F(*args)
        assert got.device == torch.device("npu", torch.npu.current_device())
        assert got.shape == ref.shape and got.dtype == ref.dtype
    data = [[1.5, 2.0], [3.0, -4.0]]
    torch.testing.assert_close(F(data).cpu(), torch.FloatTensor(data))
    torch.testing.assert_close(torch.npu.LongTensor([1, 2]).cpu(), torch.LongTensor([1, 2]))
    assert F(4, device=1).device == torch.device("npu", 1)
    assert torch.npu.HalfTensor(2).dtype == torch.float16
    with pytest.raises(RuntimeError, match="'device' must be an npu device"):
        F(2, device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword"):
        F(2, dtype=torch.float64)


def test_legacy_tensor_types_isinstance_and_type():
    x = torch.randn(3, 3)
    assert isinstance(x.npu(), torch.npu.FloatTensor)
    assert isinstance(x.double().npu(), torch.npu.DoubleTensor)
    assert isinstance(x.int().npu(), torch.npu.IntTensor)
    assert not isinstance(x.npu(), torch.npu.DoubleTensor)
    assert not isinstance(x, torch.npu.FloatTensor)          # a cpu tensor
    assert isinstance(x.npu().cpu(), torch.FloatTensor)
    y = x.npu().type(torch.npu.DoubleTensor)
    assert y.dtype == torch.float64 and y.device.type == "npu"
    torch.testing.assert_close(y.cpu(), x.double())
    assert x.npu().type() == "torch.npu.FloatTensor"


# ---------------------------------------------------------------- torch_npu._C helpers

def test_empty_strided_npu():
    t = torch_npu._C._empty_strided_npu((4, 4), (8, 1), torch.float16)
    ref = torch.empty_strided((4, 4), (8, 1), dtype=torch.float16)
    assert t.device == torch.device("npu", torch.npu.current_device())
    assert (t.shape, t.stride(), t.dtype) == (ref.shape, ref.stride(), ref.dtype)
    assert t.untyped_storage().nbytes() == ref.untyped_storage().nbytes()
    with torch.npu.device(1):
        assert torch_npu._C._empty_strided_npu((2,), (1,), torch.int8).device.index == 1
    with pytest.raises(TypeError, match="'dtype' must be a torch.dtype"):
        torch_npu._C._empty_strided_npu((2,), (1,), "float")
    with pytest.raises(RuntimeError, match="same length"):
        torch_npu._C._empty_strided_npu((2, 2), (1,), torch.float32)


def test_weak_ref_tensor_aliases_memory_and_format():
    base = torch.arange(40, dtype=torch.float32).npu()
    view = torch.as_strided(base, (2, 3), (10, 2), 5)
    weak = torch_npu._C._weak_ref_tensor(view)
    assert (weak.shape, weak.stride(), weak.storage_offset()) == ((2, 3), (10, 2), 5)
    assert weak.data_ptr() == view.data_ptr()
    torch.testing.assert_close(weak.cpu(), torch.arange(40.).as_strided((2, 3), (10, 2), 5))
    base.add_(1)                                    # writes through the original are visible
    torch.testing.assert_close(weak.cpu(), view.cpu())
    nz = torch_npu.npu_format_cast(torch.ones(4, 4).npu(), torch_npu.Format.FRACTAL_NZ)
    assert torch_npu.get_npu_format(torch_npu._C._weak_ref_tensor(nz)) == torch_npu.Format.FRACTAL_NZ


# ---------------------------------------------------------------- storage sizes

def test_get_storage_size():
    x = torch.zeros(3, 5).npu()
    assert torch_npu.get_storage_size(x) == 15
    assert torch_npu.get_storage_size(x[1]) == 15              # a view: its base's storage
    nz = torch_npu.npu_format_cast(x, torch_npu.Format.FRACTAL_NZ)
    assert torch_npu.get_storage_size(nz) == 16 * 16            # padded to one 16x16 fractal
    with pytest.raises(RuntimeError, match="expected 'self' to be an npu tensor"):
        torch_npu.get_storage_size(torch.zeros(2))
    assert torch.ops.npu.get_storage_size(nz) == 16 * 16  # the operator of torch_npu's schema


def test_combined_tensors_keep_their_storage_sizes():
    from torch_npu.utils import npu_combine_tensors, is_combined_tensor_valid

    ts = [torch.randn(2, 3).npu(), torch.randn(4).npu(), torch.randn(2, 2, 2).npu()]
    refs = [t.cpu() for t in ts]
    combined = npu_combine_tensors(ts)
    torch.testing.assert_close(combined.cpu(), torch.cat([r.reshape(-1) for r in refs]))
    ptr = combined.data_ptr()
    for t, ref in zip(ts, refs):
        assert torch_npu.get_storage_size(t) == ref.numel()
        assert t.data_ptr() == ptr
        ptr += ref.numel() * 4
        torch.testing.assert_close(t.cpu(), ref)
    assert is_combined_tensor_valid(combined, ts)
    combined.mul_(2)                                       # the tensors live in the buffer
    torch.testing.assert_close(ts[1].cpu(), refs[1] * 2)
    ts[0].data = torch.zeros(2, 3).npu()
    assert not is_combined_tensor_valid(combined, ts)


def test_npu_change_data_ptr():
    dst = torch.randn(2, 2).npu()
    src = torch.arange(10, dtype=torch.float32).npu()
    assert torch_npu.npu_change_data_ptr(dst, src, 3) == 0
    assert dst.data_ptr() == src.data_ptr() + 3 * 4
    torch.testing.assert_close(dst.cpu(), torch.arange(3., 7.).reshape(2, 2))
    dst.fill_(-1)                                          # writes land in src
    torch.testing.assert_close(src.cpu()[3:7], torch.full((4,), -1.))
    with pytest.raises(RuntimeError, match="Offsets overflow"):
        torch_npu.npu_change_data_ptr(torch.zeros(4).npu(), src, 7)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch_npu.npu_change_data_ptr(torch.zeros(2).npu().half(), src, 0)
    with pytest.raises(RuntimeError, match="equal or greater than zero"):
        torch_npu.npu_change_data_ptr(torch.zeros(2).npu(), src, -1)


def test_npu_change_data_ptr_keeps_src_alive_and_moves_the_whole_storage():
    """dst's storage (every view of it) points into src, whose memory stays dst's after src
    is deleted and its block could be reused; torch_npu's check would let index 6 of a
    10-element src through for a 5-element dst (it compares index + bytes with bytes)."""
    import gc

    dst = torch.zeros(4).npu()
    view = dst[1:]
    src = torch.arange(10, dtype=torch.float32).npu()
    torch.ops.npu.npu_change_data_ptr(dst, src, 2)
    del src
    gc.collect()
    torch.npu.empty_cache()
    others = [torch.full((10,), 7.0).npu() for _ in range(4)]  # noqa: F841 (would reuse a freed block)
    torch.testing.assert_close(dst.cpu(), torch.arange(2., 6.))
    torch.testing.assert_close(view.cpu(), torch.arange(3., 6.))
    with pytest.raises(RuntimeError, match="Offsets overflow, got: offset\\(index\\) 6, dst storage size 5"):
        torch_npu.npu_change_data_ptr(torch.zeros(5).npu(), torch.zeros(10).npu(), 6)
    with pytest.raises(RuntimeError, match="expected 'src' to be an npu tensor"):
        torch_npu.npu_change_data_ptr(dst, torch.zeros(10), 0)


def test_unsafe_empty_with_format_follows_allow_internal_format():
    nz = torch_npu.Format.FRACTAL_NZ
    make = torch.ops.npu.unsafe_empty_with_format
    assert torch.npu.config.allow_internal_format is False
    t = make([4, 32], dtype=torch.float16, device="npu", acl_format=nz)
    assert torch_npu.get_npu_format(t) == torch_npu.Format.ND  # the base format, with a warning
    assert t.shape == (4, 32) and t.dtype == torch.float16
    assert torch_npu.get_npu_format(make([4, 32], device="npu", acl_format=nz, keep_format=True)) == nz
    try:
        torch.npu.config.allow_internal_format = True
        assert torch.npu.config.allow_internal_format is True
        assert torch_npu.get_npu_format(make([4, 32], device="npu", acl_format=nz)) == nz
        torch.npu.set_option({"ALLOW_INTERNAL_FORMAT": "disable"})
        assert torch.npu.config.allow_internal_format is False
        assert torch_npu.get_npu_format(make([4, 32], device="npu", acl_format=nz)) == torch_npu.Format.ND
    finally:
        torch.npu.config.allow_internal_format = False
    with pytest.raises(TypeError, match="must be a bool"):
        torch.npu.config.allow_internal_format = "yes"
    # torch_npu's tests save the option with _C._npu_getOption (bytes, None if never set) and
    # restore it by assignment
    saved = torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT")
    assert saved == b"disable"
    torch.npu.config.allow_internal_format = True
    assert torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT") == b"enable"
    torch.npu.config.allow_internal_format = saved
    assert torch.npu.config.allow_internal_format is False
    torch.npu.config.allow_internal_format = None
    assert torch.npu.config.allow_internal_format is False
    assert torch_npu._C._npu_getOption("NO_SUCH_OPTION") is None
    with pytest.raises(TypeError, match="option_type must string"):
        torch_npu._C._npu_getOption(1)


def test_npu_format_cast_overloads_of_torch_npu_schema():
    a = torch.randn(4, 32).npu()
    cast = torch.ops.npu._npu_format_cast.aclnn(a, torch_npu.Format.FRACTAL_NZ, 1)
    assert torch_npu.get_npu_format(cast) == torch_npu.Format.FRACTAL_NZ
    torch.testing.assert_close(cast.cpu(), a.cpu())
    cast = torch.ops.npu._npu_format_cast.input_dtype(a, torch_npu.Format.FRACTAL_NZ, 1, 6)  # 6: float32
    torch.testing.assert_close(cast.cpu(), a.cpu())
    with pytest.raises(RuntimeError, match="input_dtype 5 differs from self's dtype"):
        torch.ops.npu._npu_format_cast.input_dtype(a, torch_npu.Format.FRACTAL_NZ, 1, 5)


# ---------------------------------------------------------------- SoC, CANN, env, allocator

def test_soc_version_follows_the_simulated_soc():
    code = textwrap.dedent("""
        import torch, torch_npu
        print(torch.npu.get_soc_version(), torch.npu.is_bf16_supported(),
              torch.npu.is_support_inf_nan())
    """)
    expected = {"Ascend910B1": "220 True True", "Ascend910B3": "223 True True",
                "Ascend910A": "102 False False", "Ascend310P3": "202 False False"}
    for soc, want in expected.items():
        out = run_python(code, env={"ASCEND_SIM_SOC": soc})
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[-2].strip() == want, (soc, out.stdout)


def test_collect_env_and_torch_version_cann():
    from torch_npu.utils import collect_env

    assert collect_env.get_cann_version() == torch_npu.utils.get_cann_version() == torch.version.cann
    info = collect_env.get_env_info()
    assert info.torch_version == torch.__version__
    assert info.torch_npu_version == torch_npu.__version__
    text = collect_env.pretty_str(info)
    assert f"Torch-npu version: {torch_npu.__version__}" in text
    assert f"CANN:\n{torch.version.cann}" in text


def test_allocator_backend_and_settings():
    assert torch.npu.get_allocator_backend() == "native"
    torch.npu.memory._set_allocator_settings("garbage_collection_threshold:0.9")
    with pytest.raises(TypeError, match="'settings' must be a str"):
        torch.npu.memory._set_allocator_settings(None)
    with pytest.raises(RuntimeError, match="unrecognized key"):
        torch.npu.memory._set_allocator_settings("no_such_key:1")


def test_memory_fraction_requires_a_float():
    with pytest.raises(TypeError, match="Invalid type.*'fraction' must be a float, got int"):
        torch.npu.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match="Invalid fraction value"):
        torch.npu.set_per_process_memory_fraction(2.0)


def test_device_argument_errors_use_torch_wording():
    from torch_npu.npu import _get_device_index

    with pytest.raises(RuntimeError, match="Invalid device string"):
        _get_device_index("npu0", optional=True)
    with pytest.raises(ValueError, match="Expected a npu device, but got: cpu"):
        torch.npu.synchronize("cpu")


def test_skip_if_not_gte_cann_version():
    from torch_npu.testing.common_utils import SkipIfNotGteCANNVersion

    ran = []
    SkipIfNotGteCANNVersion("8.0.RC1")(lambda: ran.append(1))()
    assert ran == [1]
    with pytest.raises(unittest.SkipTest, match="Only run on 99.0.0 or greater"):
        SkipIfNotGteCANNVersion("99.0.0")(lambda: None)()


def test_grad_scaler_skips_every_optimizer_of_an_overflowing_iteration():
    from torch_npu.npu.amp import GradScaler

    torch.manual_seed(0)
    m0, m1 = torch.nn.Linear(4, 4).npu(), torch.nn.Linear(4, 4).npu()
    o0, o1 = torch.optim.SGD(m0.parameters(), lr=1.0), torch.optim.SGD(m1.parameters(), lr=1.0)
    before = [p.detach().cpu().clone() for p in [*m0.parameters(), *m1.parameters()]]
    scaler = GradScaler(init_scale=128.0)
    x = torch.randn(2, 4).npu()
    scaler.scale((m0(x) + m1(x)).sum()).backward()
    m0.weight.grad.fill_(float("inf"))            # only m0's gradients overflow
    scaler.unscale_(o0)
    scaler.step(o0)
    scaler.step(o1)                               # skipped too: the iteration overflowed
    scaler.update()
    for p, ref in zip([*m0.parameters(), *m1.parameters()], before):
        torch.testing.assert_close(p.detach().cpu(), ref)
    assert scaler.get_scale() == 64.0
    # The next, clean iteration steps both optimizers again.
    o0.zero_grad()
    o1.zero_grad()
    scaler.scale((m0(x) + m1(x)).sum()).backward()
    scaler.step(o0)
    scaler.step(o1)
    assert not torch.equal(m1.weight.detach().cpu(), before[2])
    assert not torch.equal(m0.weight.detach().cpu(), before[0])


def test_alloc_conf_per_process_memory_fraction_and_torch_npu_keys():
    code = textwrap.dedent("""
        import torch, torch_npu
        total = torch.npu.get_device_properties(0).total_memory
        torch.empty(int(total * 0.05), dtype=torch.int8, device="npu")     # within 10%
        try:
            torch.empty(int(total * 0.2), dtype=torch.int8, device="npu")
            print("NO-OOM")
        except torch.OutOfMemoryError as err:
            print("OOM", "out of memory" in str(err))
    """)
    out = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "per_process_memory_fraction:0.1,"
                                "multi_stream_lazy_reclaim:True,release_lock_on_npumalloc:False"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("OOM True"), out.stdout
    for bad, expected in (("per_process_memory_fraction:2.0", "in \\[0.0, 1.0\\]"),
                          ("multi_stream_lazy_reclaim:yes", "True or False")):
        out = run_python("import torch, torch_npu; torch.zeros(4, device='npu')",
                         env={"PYTORCH_NPU_ALLOC_CONF": bad})
        assert out.returncode != 0
        import re
        assert re.search(expected, out.stderr), out.stderr


def test_sdp_switches_select_the_attention_kernel():
    q = torch.randn(1, 2, 8, 16)
    ref = torch.softmax(q @ q.transpose(-1, -2) / 4.0, dim=-1) @ q
    qn = q.npu()
    with torch.npu.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False):
        assert not torch.npu.flash_sdp_enabled() and torch.npu.math_sdp_enabled()
        assert not torch.npu.mem_efficient_sdp_enabled()
        out = torch.nn.functional.scaled_dot_product_attention(qn, qn, qn)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    assert torch.npu.flash_sdp_enabled() == torch.backends.cuda.flash_sdp_enabled()
    with pytest.raises(TypeError, match="'enabled' must be a bool"):
        torch.npu.enable_math_sdp(1)
    with pytest.warns(UserWarning, match="preferred_linalg_library"):
        assert torch.npu.preferred_linalg_library() == torch._C._LinalgBackend.Default


def test_deterministic_with_backward_region():
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        x = torch.randn(3, requires_grad=True)
        seen = []
        h = torch.npu.enable_deterministic_with_backward(x.npu())
        assert torch.are_deterministic_algorithms_enabled()
        h = h * 2
        h.register_hook(lambda g: seen.append(torch.are_deterministic_algorithms_enabled()))
        y = torch.npu.disable_deterministic_with_backward(h)
        assert not torch.are_deterministic_algorithms_enabled()
        y.sum().backward()
        assert seen == [True]                      # the region's backward ran deterministic
        assert not torch.are_deterministic_algorithms_enabled()
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    finally:
        torch.use_deterministic_algorithms(previous)


def test_aclnn_allow_hf32_is_the_conv_switch():
    previous = torch.npu.conv.allow_hf32
    try:
        torch.npu.conv.allow_hf32 = False
        assert torch.npu.aclnn.allow_hf32 is False
        with torch.npu.aclnn.flags(allow_hf32=True):
            assert torch.npu.conv.allow_hf32 is True
        assert torch.npu.conv.allow_hf32 is False
        torch.npu.aclnn.allow_hf32 = True
        assert torch.npu.conv.allow_hf32 is True
    finally:
        torch.npu.conv.allow_hf32 = previous


def test_current_raw_stream():
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        assert torch_npu._C._npu_getCurrentRawStream(torch.npu.current_device()) == s.npu_stream
    assert torch_npu._C._npu_getCurrentRawStreamNoWait(0) == torch.npu.current_stream(0).npu_stream


class _HuaweiStyle(__import__("torch_npu.testing.testcase", fromlist=["TestCase"]).TestCase):
    def runTest(self):
        pass


def test_testcase_almost_equal_and_slow_equal():
    tc = _HuaweiStyle()
    a = torch.tensor([1.0, 2.0])
    tc.assertAlmostEqual(a, (a + 1e-4).npu(), places=3)          # cpu vs npu
    with pytest.raises(AssertionError):
        tc.assertAlmostEqual(a, (a + 1e-2).npu(), places=3)
    tc.assertTensorsSlowEqual(a, a + 1e-3, prec=1e-2)
    with pytest.raises(AssertionError):
        tc.assertTensorsSlowEqual(a, a + 1e-1, prec=1e-2)
    with pytest.raises(AssertionError):
        tc.assertTensorsSlowEqual(a, a.double(), prec=1.0)        # dtypes must match


def test_erase_stream_lets_memory_be_reused_at_once():
    side, main = torch.npu.Stream(), torch.npu.Stream()
    with torch.npu.stream(side):                       # keep `side` busy with queued work
        a = torch.randn(1024, 1024, device="npu")
        for _ in range(8):
            a = a @ a / 1024.0
    with torch.npu.stream(main):
        # main.synchronize(): the simulator reuses a block only once the kernels queued
        # on it are done, even on its own stream.
        t = torch.ones(256, 1024, device="npu")
        ptr = t.data_ptr()
        main.synchronize()
        t.record_stream(side)
        torch_npu.erase_stream(t, side)
        del t
        u = torch.zeros(256, 1024, device="npu")       # the same block, not held for `side`
        assert u.data_ptr() == ptr
        torch.testing.assert_close(u.cpu(), torch.zeros(256, 1024))
        del u
        main.synchronize()
        # Control: without erase_stream the block waits for `side`. If `side` is still busy
        # after the allocation, it was busy during it, so the block cannot have been reused.
        t = torch.ones(256, 1024, device="npu")
        ptr = t.data_ptr()
        main.synchronize()
        t.record_stream(side)
        del t
        v = torch.zeros(256, 1024, device="npu")
        if not side.query():
            assert v.data_ptr() != ptr
    torch.npu.synchronize()
    with pytest.raises(TypeError, match="'stream' must be a torch.npu.Stream"):
        torch_npu.erase_stream(v, None)
    with pytest.raises(ValueError, match="must be an npu tensor"):
        torch_npu.erase_stream(torch.zeros(2), side)


def test_unsupported_dtype_list():
    # MindSpeed filters torch's dtypes with torch_npu.unsupported_dtype.
    assert torch_npu.unsupported_dtype == [torch.quint8, torch.quint4x2, torch.quint2x4, torch.qint32,
                                           torch.qint8]
    valid = [d for d in vars(torch).values() if isinstance(d, torch.dtype) and d not in torch_npu.unsupported_dtype]
    assert torch.float32 in valid and torch.qint8 not in valid


# ---- torch.npu.<X>Storage legacy typed storages ---------------------------------------------

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
