"""torch_npu.utils' Python APIs (FlopsCounter, save_async / serialization.load, thread affinity,
collect_env helpers, cpp_extension.NpuExtension, utils.profiler.Profile), the testing helpers,
torch_npu.distributed.run / distributed_c10d, profiler.analyse's worker pool and the error
codes of torch_npu.utils._error_code."""
import io
import os
import textwrap
import threading
import unittest
import warnings

import pytest
import torch

import torch_npu
from conftest import run_python


# ---------------------------------------------------------------- FlopsCounter

def test_flops_counter_counts_npu_matmul_conv_attention_and_backward():
    from torch_npu.utils import FlopsCounter

    fc = FlopsCounter()
    fc.start()
    try:
        a = torch.randn(4, 8, device="npu", requires_grad=True)
        b = torch.randn(8, 16, device="npu")
        (a @ b).sum().backward()                     # mm forward + mm for a's grad
        assert fc.get_flops() == [2 * 2 * 4 * 8 * 16] * 2
        fc.pause()
        torch.bmm(torch.randn(3, 4, 5, device="npu"), torch.randn(3, 5, 6, device="npu"))
        assert fc.get_flops() == [2048, 2048 + 2 * 3 * 4 * 5 * 6]   # traversed only
        fc.resume()
        torch.randn(4, 5) @ torch.randn(5, 6)          # cpu: not an npu operator
        assert fc.get_flops()[1] == 2048 + 720
        before = fc.get_flops()[0]
        conv = torch.nn.Conv2d(3, 4, 3, bias=False).npu()
        conv(torch.randn(2, 3, 8, 8, device="npu"))
        # out 2x4x6x6, kernel 4x3x3x3: batch * Cout * Cin * k*k * out spatial * 2
        assert fc.get_flops()[0] - before == 2 * 4 * 3 * 9 * 36 * 2
        before = fc.get_flops()[0]
        q = torch.randn(1, 2, 4, 8, device="npu")
        torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD")
        assert fc.get_flops()[0] - before == 2 * (1 * 2 * 4 * 8 * 4)   # torch_npu: no factor 2
    finally:
        fc.stop()
    assert fc.get_flops() == [0, 0]
    torch.randn(2, 2, device="npu") @ torch.randn(2, 2, device="npu")
    assert fc.get_flops() == [0, 0]                  # stopped: no longer counting



def test_flops_counter_counts_grouped_matmul_swiglu_quant_v2():
    """Its weight and weight_scale are one-tensor lists: M x K rows each meet one expert's N columns."""
    from torch_npu.utils import FlopsCounter

    m, k, n, e = 6, 32, 16, 2
    x = torch.randint(-8, 8, (m, k), dtype=torch.int8, device="npu")
    weight = torch.randint(-8, 8, (e, k, n), dtype=torch.int8, device="npu")
    weight_scale = torch.rand(e, n, device="npu")
    x_scale = torch.rand(m, device="npu")
    fc = FlopsCounter()
    fc.start()
    try:
        torch_npu.npu_grouped_matmul_swiglu_quant_v2(x, [weight], [weight_scale], x_scale,
                                                     torch.tensor([3, 6], device="npu"))
        assert fc.get_flops()[0] == 2 * m * k * n
    finally:
        fc.stop()

def test_flops_counter_deprecated_class_warns():
    from torch_npu.utils.flops_count import FlopsCounter

    with pytest.warns(FutureWarning, match="will be deprecated"):
        FlopsCounter()


# ---------------------------------------------------------------- save_async / load

def _join_saves():
    for t in threading.enumerate():
        if t.name == "torch_npu_save_async":
            t.join()


def test_save_async_writes_on_a_thread_and_load_restores_npu_tensors(tmp_path):
    from torch_npu.utils import save_async
    from torch_npu.utils.serialization import load

    x = torch.arange(12, dtype=torch.float32, device="npu").reshape(3, 4) * 2
    model = torch.nn.Linear(4, 2).npu()
    path = tmp_path / "ck.pt"
    seen = []
    real_save = torch.save

    def spy(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real_save(*args, **kwargs)

    torch.save = spy
    try:
        save_async({"x": x, "state": model.state_dict(), "step": 7}, str(path), model=model)
        _join_saves()
    finally:
        torch.save = real_save
    assert seen == ["torch_npu_save_async"]
    assert not os.path.exists(str(path) + ".tmp")
    got = load(str(path))
    assert got["step"] == 7 and got["x"].device.type == "npu"
    torch.testing.assert_close(got["x"].cpu(), x.cpu())
    torch.testing.assert_close(got["state"]["weight"].cpu(), model.weight.detach().cpu())
    assert load(str(path), map_location="cpu")["x"].device.type == "cpu"
    # the model's backward still works with the save stream's hook, and the model pickles
    model(torch.randn(5, 4, device="npu")).sum().backward()
    save_async(model, str(tmp_path / "m.pt"))
    _join_saves()
    m2 = load(str(tmp_path / "m.pt"), weights_only=False)
    torch.testing.assert_close(m2.weight.detach().cpu(), model.weight.detach().cpu())
    with pytest.raises(RuntimeError, match="_use_new_zipfile_serialization"):
        save_async(x, str(path), _use_new_zipfile_serialization=False)


def test_legacy_save_of_npu_tensors_raises_naming_npu_storage_impl(tmp_path):
    path = str(tmp_path / "legacy.pt")
    with pytest.warns(UserWarning, match="not recommended for NPU tensors"):
        with pytest.raises(RuntimeError, match="NPUStorageImpl"):
            torch.save({"w": torch.randn(5).npu()}, path, _use_new_zipfile_serialization=False)
    # cpu tensors still save in the legacy format, and load onto npu through map_location
    x = torch.randn(5)
    with pytest.warns(UserWarning):
        torch.save(x, path, _use_new_zipfile_serialization=False)
    for where in ["npu:0", {"cpu": "npu:0"}, lambda storage, loc: storage.to(device="npu:0")]:
        y = torch.load(path, map_location=where, weights_only=False)
        assert str(y.device) == "npu:0"
        torch.testing.assert_close(y.cpu(), x)
    # an npu storage written outside a legacy save (torch.distributed's streaming format)
    buf = io.BytesIO()
    torch.randn(3).npu().untyped_storage()._write_file(buf, False, False, 1)
    assert len(buf.getvalue()) == 12


# ---------------------------------------------------------------- thread affinity

@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_set_and_reset_thread_affinity_bind_the_calling_thread():
    code = textwrap.dedent("""
        import os, threading, torch_npu
        from torch_npu.utils import set_thread_affinity, reset_thread_affinity
        default = os.sched_getaffinity(0)
        set_thread_affinity([0, 0])
        assert os.sched_getaffinity(0) == {0}, os.sched_getaffinity(0)
        other = []
        t = threading.Thread(target=lambda: other.append(os.sched_getaffinity(0))); t.start(); t.join()
        reset_thread_affinity()
        assert os.sched_getaffinity(0) == default
        set_thread_affinity([[0, 0], [0, 0]]); assert os.sched_getaffinity(0) == {0}
        set_thread_affinity(None); assert os.sched_getaffinity(0) == default
        for bad in ([3, 1], [-1, 2], "0-3", [[0, 1, 2]]):
            try:
                set_thread_affinity(bad)
            except ValueError:
                pass
            else:
                raise AssertionError(bad)
        print("ok")
    """)
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---------------------------------------------------------------- collect_env, cpp_extension, Profile

def test_collect_env_helpers(tmp_path):
    import site

    from torch_npu.utils import collect_env

    assert collect_env.get_torch_npu_install_path() == site.getsitepackages()[0]
    with pytest.warns(FutureWarning):
        collect_env.check_path_owner_consistent(str(tmp_path))
    with pytest.warns(FutureWarning), pytest.raises(RuntimeError, match="does not exist"):
        collect_env.check_path_owner_consistent(str(tmp_path / "missing"))


def test_npu_extension_has_torch_build_settings():
    import torch.utils.cpp_extension as ext

    from torch_npu.utils.cpp_extension import NpuExtension

    e = NpuExtension("my_ext", ["a.cpp"], include_dirs=["/x"], extra_compile_args=["-g"])
    assert e.name == "my_ext" and e.sources == ["a.cpp"] and e.language == "c++"
    assert e.include_dirs[0] == "/x" and set(ext.include_paths()) <= set(e.include_dirs)
    assert {"c10", "torch", "torch_cpu", "torch_python"} <= set(e.libraries)
    assert set(ext.library_paths()) <= set(e.library_dirs)
    assert all(os.path.isdir(d) for d in e.include_dirs[1:])


def test_utils_profiler_profile_is_a_singleton_profiling_one_step(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys, torch, torch_npu
        from torch_npu.utils.profiler import Profile
        p = Profile(start_step=2, save_path={str(tmp_path)!r}, profile_type="TORCH")
        assert Profile() is p
        x = torch.randn(8, 8, device="npu")
        p.start(); x @ x; p.end()               # step 1: not profiled
        assert os.listdir({str(tmp_path)!r}) == []
        p.start(); x @ x
        try:
            p.end()                               # step 2: written, then torch_npu exits
        except SystemExit:
            files = os.listdir({str(tmp_path)!r})
            assert len(files) == 1 and files[0].startswith("torch_prof_"), files
            print("exited")
    """)
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip() == "exited", r.stderr


# ---------------------------------------------------------------- torch_npu.testing helpers

def test_testing_baseline_and_testcase_helpers(tmp_path):
    from torch_npu.testing.common_utils import Baseline, SkipIfNotRegistered
    from torch_npu.testing.decorator import feed_data
    from torch_npu.testing.testcase import TestCase

    path = tmp_path / "perf.json"
    b = Baseline(str(path))
    assert b.get_baseline("op") is None
    b.set_baseline("op", 1.5)
    b.save_baseline()
    assert Baseline(str(path)).get_baseline("op") == 1.5

    skip = SkipIfNotRegistered()("no caffe2")
    with pytest.raises(unittest.SkipTest):
        skip(lambda: None)()

    class T(TestCase):
        def runTest(self):
            pass

    t = T()
    i = torch.tensor([[0, 0, 1], [1, 1, 0]])
    v = torch.tensor([1., 2., 3.])
    s = torch.sparse_coo_tensor(i, v, (2, 2))
    c = t.safeCoalesce(s)
    torch.testing.assert_close(c.to_dense(), torch.tensor([[0., 3.], [3., 0.]]))
    with t.maybeWarnsRegex(UserWarning, "expected"):
        warnings.warn("expected warning")
    with pytest.raises(AssertionError, match="unexpected warnings"):
        with t.maybeWarnsRegex(UserWarning, "expected"):
            warnings.warn("something else")
    t.assertNotWarn(lambda: None)
    with pytest.raises(AssertionError):
        t.assertNotWarn(lambda: warnings.warn("w"))
    t.assertObjectIn(v, [i, v])
    with pytest.raises(AssertionError):
        t.assertObjectIn(v.clone(), [i, v])

    def f(self, a, b=0):
        return a + b

    g = feed_data(f, "test_f_1", 1, b=2)
    assert g.__name__ == "test_f_1" and g(None) == 3


def test_testing_instantiate_ops_tests_expands_per_op_dtype_and_format():
    from torch_npu.testing.decorator import Dtypes, Formats, instantiate_ops_tests

    class FakeOp:
        name = "add"
        dtypesIfNPU = {torch.float32}
        formats = (2,)

        def get_decorators(self, *args):
            return []

    @instantiate_ops_tests([FakeOp()])
    class C:
        @Dtypes(torch.float16, torch.float32)
        @Formats(0, 29)
        def test_x(self, dtype, npu_format, op):
            return dtype, npu_format, op.name

    names = sorted(n for n in dir(C) if n.startswith("test_"))
    assert names == ["test_x_add_float16_0", "test_x_add_float16_29", "test_x_add_float32_0", "test_x_add_float32_29"]
    assert C().test_x_add_float16_29() == (torch.float16, 29, "add")


def test_sample_inputs_helpers_make_samples():
    from torch_npu.testing.common_methods_invocations import sample_inputs_median_custom

    samples = list(sample_inputs_median_custom(None, "cpu", torch.float32, False))
    assert [tuple(s.input.shape) for s in samples[:2]] == [(2, 0), (0, 2)] and len(samples) > 2


# ---------------------------------------------------------------- distributed, profiler.analyse

def test_distributed_availability_and_run_parse_args():
    import torch_npu.distributed as d
    from torch_npu.distributed import distributed_c10d, run

    assert d.is_available() == ("hccl" in torch.distributed.Backend.backend_list)
    assert distributed_c10d.is_hccl_available() is True
    # on torch.distributed too, as torch_npu puts them (test/distributed's files call them there)
    assert torch.distributed.is_hccl_available is d.is_hccl_available is distributed_c10d.is_hccl_available
    assert torch.distributed.reinit_process_group is distributed_c10d.reinit_process_group
    args = run.parse_args(["--nproc_per_node", "2", "--enable_tiered_parallel_tcpstore", "true", "t.py", "--x"])
    assert (args.nproc_per_node, args.enable_tiered_parallel_tcpstore) == ("2", "true")
    assert args.training_script == "t.py" and args.training_script_args == ["--x"]
    assert run.parse_args(["t.py"]).enable_tiered_parallel_tcpstore == "false"


def test_profiler_analyse_parses_several_runs_with_a_worker_pool(tmp_path):
    import torch_npu.profiler as prof
    from torch_npu.profiler.profiler_interface import supported_activities

    assert supported_activities() == {prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU}
    x = torch.randn(16, 16, device="npu")
    for _ in range(2):
        with prof.profile(on_trace_ready=prof.tensorboard_trace_handler(str(tmp_path), analyse_flag=False)):
            x @ x
    runs = [d for d in os.listdir(tmp_path) if d.endswith("_ascend_pt")]
    assert len(runs) == 2
    with pytest.raises(ValueError, match="max_process_number"):
        prof.analyse(str(tmp_path), max_process_number=0)
    prof.analyse(str(tmp_path), max_process_number=4)
    for d in runs:
        assert os.path.isfile(os.path.join(tmp_path, d, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))


# ---------------------------------------------------------------- matmul_checksum

def test_matmul_checksum_detects_a_corrupted_result_only_when_it_persists():
    a = torch.randn(8, 16, device="npu")
    b = torch.randn(16, 32, device="npu")
    c = a @ b
    assert torch_npu.matmul_checksum(a, b, c).device.type == "npu"
    assert not torch_npu.matmul_checksum(a, b, c).item()
    bad = c.clone()
    bad[3, 5] += 100.0                     # a fault: found, recomputed into bad -> means differ
    assert torch_npu.matmul_checksum(a, b, bad).item()
    torch.testing.assert_close(bad.cpu(), c.cpu())   # recomputed in place
    with pytest.raises(TypeError):
        torch_npu.matmul_checksum(a.cpu(), b, c)


# ---------------------------------------------------------------- distributed.fsdp

def test_fsdp_fully_shard_shards_npu_parameters():
    code = textwrap.dedent("""
        import tempfile, torch, torch_npu, torch.distributed as dist
        from torch_npu.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor
        torch.npu.set_device(0)
        dist.init_process_group("hccl", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).npu()
        assert fully_shard(m) is m
        assert all(isinstance(p, DTensor) and p.device.type == "npu" for p in m.parameters())
        m(torch.randn(4, 8, device="npu")).sum().backward()
        assert all(p.grad is not None for p in m.parameters())
        assert fully_shard.state(m) is not None
        dist.destroy_process_group()
        print("ok")
    """)
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---------------------------------------------------------------- _path_manager, _dynamo

def test_path_manager_makes_and_removes(tmp_path):
    from torch_npu.utils._path_manager import PathManager

    d = tmp_path / "a" / "b"
    PathManager.make_dir_safety(str(d))
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o750
    PathManager.make_dir_safety(str(d))  # exists: nothing to do
    f = d / "data.bin"
    PathManager.create_file_safety(str(f))
    assert f.is_file() and (f.stat().st_mode & 0o777) == 0o640
    PathManager.check_input_file_path(str(f))
    PathManager.check_input_directory_path(str(d))
    with pytest.raises(RuntimeError, match="is a file path"):
        PathManager.check_input_directory_path(str(f))
    with pytest.raises(RuntimeError, match="is a directory path"):
        PathManager.check_input_file_path(str(d))
    assert PathManager.check_path_is_readable(str(f)) and PathManager.check_path_is_writeable(str(d))
    PathManager.check_directory_path_writeable(str(d))
    PathManager.remove_file_safety(str(f))
    PathManager.remove_file_safety(str(f))  # already gone: nothing to do
    assert not f.exists()
    PathManager.remove_path_safety(str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()
    with pytest.raises(RuntimeError, match="does not exist"):
        PathManager.check_directory_path_readable(str(tmp_path / "a"))


def test_path_manager_warns_about_links_and_odd_names(tmp_path):
    from torch_npu.utils._path_manager import PathManager

    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PathManager.check_input_directory_path(str(link))
        PathManager.check_input_directory_path(str(tmp_path / "a*b"))
        PathManager.check_input_directory_path("x" * 300)
    messages = [str(w.message) for w in caught]
    assert any("symbolic link" in m for m in messages)
    assert any(m.startswith("Invalid input path:") for m in messages)
    assert any("exceeds the limit" in m for m in messages)
    with pytest.raises(RuntimeError, match="Failed to remove path"):
        PathManager.remove_path_safety(str(link))  # rmtree refuses a link
    with pytest.raises(TypeError, match="path must be a str"):
        PathManager.check_input_file_path(3)


def test_utils_dynamo_registers_the_npu_device_interface():
    from torch._dynamo.device_interface import get_interface_for_device

    from torch_npu.utils._dynamo import _dynamo_register_interface_for_device

    _dynamo_register_interface_for_device()
    interface = get_interface_for_device("npu")
    assert get_interface_for_device("npu:0") is interface
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        assert interface.get_raw_stream(0) == s.npu_stream == torch_npu._C._npu_getCurrentRawStream(0)


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
