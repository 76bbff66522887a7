"""torch_npu.testing: compatibility with tests written for Huawei's torch_npu."""

import tempfile
import textwrap
import unittest

import numpy as np
import pytest
import torch

from conftest import run_python
from torch_npu.testing import common_distributed, common_utils, decorator, testcase


def _run_case(case_cls):
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case_cls)
    result = unittest.TestResult()
    suite.run(result)
    return result


def test_create_common_tensor():
    cpu, npu = common_utils.create_common_tensor([np.float32, 0, (4, 5)], -2, 3)
    assert cpu.device.type == "cpu" and npu.device == torch.device("npu:0")
    assert cpu.dtype == npu.dtype == torch.float32 and cpu.shape == (4, 5)
    assert torch.equal(cpu, npu.cpu())
    assert cpu.min() >= -2 and cpu.max() <= 3
    cpu16, npu16 = common_utils.create_common_tensor([np.float16, -1, [3]], 0, 1, device="npu:1")
    assert npu16.dtype == torch.float16 and npu16.device.index == 1
    cpu_i, npu_i = common_utils.create_common_tensor([torch.int32, 2, 6], 0, 10)
    assert npu_i.dtype == torch.int32 and torch.equal(cpu_i, npu_i.cpu())
    with pytest.raises(TypeError, match="'item'"):
        common_utils.create_common_tensor([np.float32, (2, 2)], 0, 1)
    # Huawei's tests pass extra entries (e.g. [np.float32, 0, [1024], True]): ignored, as torch_npu's.
    cpu_x, npu_x = common_utils.create_common_tensor([np.float32, 0, [1024], True], 0, 1)
    assert cpu_x.shape == (1024,) and torch.equal(cpu_x, npu_x.cpu())


def test_create_dtype_tensor_and_broadcast_helper():
    cpu, npu = common_utils.create_dtype_tensor((3, 3), torch.int32, no_zero=True)
    assert (cpu != 0).all() and torch.equal(cpu, npu.cpu())
    outs = common_utils.test_2args_broadcast(torch.add)
    for cpu_out, npu_out in outs:
        np.testing.assert_allclose(cpu_out, npu_out, rtol=1e-6)


def test_get_and_set_npu_device(monkeypatch):
    monkeypatch.delenv("SET_NPU_DEVICE", raising=False)
    assert common_utils.get_npu_device() == "npu:0"
    monkeypatch.setenv("SET_NPU_DEVICE", "3")
    assert common_utils.get_npu_device() == "npu:3"
    assert common_utils.set_npu_device() == "npu:3"
    assert torch.npu.current_device() == 3
    monkeypatch.setenv("SET_NPU_DEVICE", "gpu")
    with pytest.raises(ValueError, match="SET_NPU_DEVICE"):
        common_utils.get_npu_device()


def test_testcase_assertions():
    class Case(testcase.TestCase):
        def test_rtol_ok(self):
            cpu, npu = common_utils.create_common_tensor([np.float32, 0, (16,)], -1, 1)
            self.assertRtolEqual(cpu, npu)
            self.assertRtolEqual(cpu.numpy(), (npu * (1 + 1e-6)).cpu().numpy())
            self.assertRtolEqual(cpu.half(), npu.half() + 1e-4)
            self.assertRtolEqual(1.0, 1.00001)
            self.assertRtolEqual([cpu, cpu], [npu, npu])
            self.assertRtolEqual(cpu > 0, (npu > 0).cpu())

        def test_rtol_value_error(self):
            self.assertRtolEqual(torch.ones(100), torch.ones(100, device="npu") * 1.01)

        def test_rtol_dtype_error(self):
            self.assertRtolEqual(torch.ones(3), torch.ones(3, dtype=torch.float16))

        def test_rtol_shape_error(self):
            self.assertRtolEqual(torch.ones(3), torch.ones(4))

        def test_equal_mixed_devices_and_dtypes(self):
            cpu = torch.arange(6.0).reshape(2, 3)
            self.assertEqual(cpu, cpu.to("npu"))
            self.assertEqual(cpu, cpu.to("npu").half())
            self.assertEqual(cpu, cpu.to("npu") + 1e-3, 1e-2)
            self.assertEqual(cpu, cpu.to("npu") + 1e-3, prec=1e-2)
            self.assertEqual(3, 3.0)
            self.assertEqual([1, 2], (1, 2), "a message")

        def test_equal_fails_beyond_prec(self):
            cpu = torch.zeros(4)
            self.assertEqual(cpu, cpu.to("npu") + 0.1, prec=1e-2, message="custom text")

        def test_setup_selected_device(self):
            self.assertEqual(self.npu_device, "npu:0")

    result = _run_case(Case)
    failed = {test.id().rsplit(".", 1)[1]: text for test, text in result.failures}
    assert not result.errors, result.errors
    assert set(failed) == {"test_rtol_value_error", "test_rtol_dtype_error",
                           "test_rtol_shape_error", "test_equal_fails_beyond_prec"}
    assert "result error" in failed["test_rtol_value_error"]
    assert "dtype error" in failed["test_rtol_dtype_error"]
    assert "shape error" in failed["test_rtol_shape_error"]
    assert "custom text" in failed["test_equal_fails_beyond_prec"]
    assert result.testsRun == 7


def test_setup_seeds_rng(monkeypatch):
    draws = []

    class Case(testcase.TestCase):
        def test_a(self):
            draws.append(torch.rand(3))

        def test_b(self):
            draws.append(torch.rand(3))

    monkeypatch.setenv("SEED", "123")
    result = _run_case(Case)
    assert result.wasSuccessful()
    assert torch.equal(draws[0], draws[1])


def test_setup_leaves_sparse_invariant_checks_alone():
    seen = []

    class Case(testcase.TestCase):
        def test_state(self):
            seen.append(torch.sparse.check_sparse_tensor_invariants.is_enabled())
            # Invalid CSR indices (2-D col_indices) build without the checks, as on torch_npu.
            torch.sparse_compressed_tensor(torch.tensor([0, 1, 2]), torch.tensor([[0], [1]]),
                                           torch.tensor([1.0, 2.0]), size=(2, 2),
                                           layout=torch.sparse_csr)

    assert not torch.sparse.check_sparse_tensor_invariants.is_enabled()
    assert _run_case(Case).wasSuccessful()
    torch.sparse.check_sparse_tensor_invariants.enable()
    try:
        result = _run_case(Case)
        assert torch.sparse.check_sparse_tensor_invariants.is_enabled()  # restored
    finally:
        torch.sparse.check_sparse_tensor_invariants.disable()
    assert seen == [False, True]
    assert len(result.errors) == 1 and "dimensionalities" in result.errors[0][1]


def test_instantiate_tests_with_dtypes_and_formats():
    calls = []

    @decorator.instantiate_tests
    class Case(testcase.TestCase):
        @decorator.Dtypes(torch.float, torch.half)
        @decorator.Formats(0, 29)
        def test_add(self, device, dtype, npu_format):
            calls.append((device, dtype, npu_format))
            cpu, npu = common_utils.create_common_tensor(
                [np.float32 if dtype == torch.float else np.float16, npu_format, (2, 3)], 0, 1)
            self.assertRtolEqual(cpu + cpu, (npu + npu).cpu())

        @decorator.Dtypes(torch.int32)
        def test_neg(self, dtype):
            calls.append(("-", dtype))

    names = sorted(n for n in dir(Case) if n.startswith("test_"))
    assert names == ["test_add_float16_0", "test_add_float16_29", "test_add_float32_0",
                     "test_add_float32_29", "test_neg_int32"]
    result = _run_case(Case)
    assert result.wasSuccessful(), result.failures + result.errors
    assert ("npu", torch.half, 29) in calls and ("-", torch.int32) in calls
    with pytest.raises(RuntimeError, match="No dtypes"):
        decorator.Dtypes()
    with pytest.raises(RuntimeError, match="Unknown dtype"):
        decorator.Dtypes("float")


def test_skip_decorators():
    ran = []

    class Case(testcase.TestCase):
        @common_utils.SupportedDevices(["Ascend910B"])
        def test_on_910b(self):
            ran.append("910b")

        @common_utils.SupportedDevices(["Ascend310P"])
        def test_on_310p(self):
            ran.append("310p")

        @common_utils.skipIfUnsupportMultiNPU(2)
        def test_two_npus(self):
            ran.append("two")

        @common_distributed.skipIfUnsupportMultiNPU(64)
        def test_many_npus(self):
            ran.append("many")

        @common_utils.SkipIfNoLapack()
        def test_lapack(self):
            ran.append("lapack")

        @common_utils.SkipIfNoLatestTorch()
        def test_latest(self):
            ran.append("latest")

    result = _run_case(Case)
    assert result.wasSuccessful()
    skipped = {test.id().rsplit(".", 1)[1]: reason for test, reason in result.skipped}
    assert {"910b", "two", "lapack"} <= set(ran)
    assert "test_on_310p" in skipped and "Ascend910B" in skipped["test_on_310p"]
    assert "test_many_npus" in skipped and "64" in skipped["test_many_npus"]
    assert ("latest" in ran) == (common_utils._torch_release() >= common_utils.LATEST_TORCH_VERSION)


def test_with_comms_single_process():
    import torch.distributed as dist

    seen = {}

    class Fake:
        rank = 0
        world_size = 1
        file_name = tempfile.NamedTemporaryFile(delete=False).name

        @common_distributed.with_comms
        def run(self):
            seen["initialized"] = dist.is_initialized()
            seen["device_type"] = self.device_type
            t = torch.ones(3, device=self.device_type)
            dist.all_reduce(t)
            seen["sum"] = t.sum().item()

    Fake().run()
    assert seen["initialized"] and seen["sum"] == 3
    expected = "npu" if common_distributed.hccl_available() else "cpu"
    assert seen["device_type"] == expected
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="not supported"):
        common_distributed.init_pg(backend="mpi")


def test_run_tests_entry_point(tmp_path):
    script = tmp_path / "test_sample.py"
    script.write_text(textwrap.dedent("""
        import torch
        import torch_npu
        from torch_npu.testing.testcase import TestCase, run_tests

        class TestSample(TestCase):
            def test_add(self):
                x = torch.ones(3, device="npu")
                self.assertRtolEqual((x + x).cpu(), torch.full((3,), 2.0))

            def test_equal(self):
                self.assertEqual(torch.ones(2), torch.ones(2, device="npu"))

        if __name__ == "__main__":
            run_tests()
    """))
    code = f"import runpy, sys; sys.argv = [{str(script)!r}]; runpy.run_path({str(script)!r}, run_name='__main__')"
    # CI= unset: under CI=true torch's run_tests writes XML reports through xmlrunner.
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "CI": ""})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Ran 2 tests" in output and "OK" in output


def test_get_cycles_per_ms_matches_the_simulated_clock():
    from torch_npu.testing.common_utils import get_cycles_per_ms
    cycles = get_cycles_per_ms()
    # 1.8 GHz AI Core: 1.8e6 cycles a millisecond; a descheduled sleep only lowers it
    assert 0.5e6 < cycles <= 1.9e6


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


def test_assert_equal_compares_storages_by_elements():
    tc = testcase.TestCase()
    cpu = torch.arange(6, dtype=torch.int16)
    tc.assertEqual(cpu.untyped_storage(), cpu.npu().untyped_storage())  # bytes, across devices
    tc.assertEqual(cpu.storage(), cpu.npu().storage())                  # typed: elements
    tc.assertEqual(cpu.float().storage(), cpu.float().npu().storage(), prec=0.0)
    with pytest.raises(AssertionError):
        tc.assertEqual(cpu.untyped_storage(), (cpu + 1).npu().untyped_storage())
    with pytest.raises(AssertionError):  # 12 bytes against 24
        tc.assertEqual(cpu.untyped_storage(), cpu.int().untyped_storage())


def test_assert_equal_takes_empty_containers_as_equal():
    tc = testcase.TestCase()
    tc.assertEqual([], {})  # torch_npu: length, then elements
    tc.assertEqual((), set())
    tc.assertEqual({}.keys(), [])
    with pytest.raises(AssertionError):
        tc.assertEqual([], {"a": 1})
    with pytest.raises(AssertionError):
        tc.assertEqual([], "")  # a string is no container here


def test_assert_equal_compares_dict_views_with_sequences_in_order():
    tc = testcase.TestCase()
    d = {"Model ID": "899", "Task ID": "9469", "Op Name": "MatMul"}
    tc.assertEqual(d.keys(), list(d.keys()))  # torch_npu: iterables element by element
    tc.assertEqual(d.values(), ("899", "9469", "MatMul"))
    tc.assertEqual(d.items(), [("Model ID", "899"), ("Task ID", "9469"), ("Op Name", "MatMul")])
    with pytest.raises(AssertionError):  # the order counts
        tc.assertEqual(d.keys(), ["Task ID", "Model ID", "Op Name"])
    with pytest.raises(AssertionError):
        tc.assertEqual(d.keys(), ["Model ID", "Task ID"])
