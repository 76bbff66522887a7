"""The op table (ops/npu_native_functions.yaml) at work: unsupported operators, the CPU
fallback, dtype restrictions, torch.npu.is_op_supported and the op-support CLI."""
import os
import textwrap
import warnings

import pytest
import torch

import torch_npu
from torch_npu import _op_table
from torch_npu.npu import op_support

from conftest import run_python

NEEDS_CANN_91 = "linalg_lstsq.out"  # gated to CANN >= 9.1 in the yaml, and a CPU fallback on torch_npu anyway


@pytest.fixture
def no_cpu_fallback():
    before = torch.npu.get_cpu_fallback()
    torch.npu.set_cpu_fallback(False)
    yield
    torch.npu.set_cpu_fallback(before)


def test_table_matches_this_pair():
    assert _op_table.TORCH == torch_npu.version.torch_version
    assert _op_table.CANN == torch_npu.version.cann_version
    assert "add.out" in _op_table.SUPPORTED and "mm.out" in _op_table.SUPPORTED
    assert "npu_rms_norm" in _op_table.CUSTOM and _op_table.CUSTOM["npu_rms_norm"] is True
    # The CANN ranges of the table make the pairs differ.
    cann91 = tuple(int(p) for p in _op_table.CANN.split(".")) >= (9, 1)
    # torch_npu registers no npu kernel for linalg_lstsq.out, so it falls back on every CANN;
    # the table says so rather than naming the CANN level
    assert NEEDS_CANN_91 not in _op_table.SUPPORTED
    assert ("needs CANN >=9.1" in _op_table.UNSUPPORTED[NEEDS_CANN_91]) == (not cann91)


def test_every_supported_operator_has_an_npu_kernel():
    """A supported overload either has a PrivateUse1 kernel of its own (generated or native)
    or a composite kernel that serves every backend."""
    missing = []
    for name in _op_table.SUPPORTED:
        qualified = "aten::" + name
        if not torch._C._dispatch_has_kernel(qualified):
            continue  # an overload of another torch release
        if not any(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
                   for key in ("PrivateUse1", "CompositeExplicitAutograd",
                               "CompositeExplicitAutogradNonFunctional")):
            missing.append(name)
    assert missing == []


def test_is_op_supported():
    assert torch.npu.is_op_supported("aten::add.Tensor")
    assert torch.npu.is_op_supported(torch.ops.aten.add.Tensor)
    assert torch.npu.is_op_supported("aten::addmm")
    assert torch.npu.is_op_supported("npu_rms_norm")
    assert torch.npu.is_op_supported("npu::npu_rms_norm")
    assert not torch.npu.is_op_supported("npu::does_not_exist")
    assert not torch.npu.is_op_supported("aten::not_an_op") and not torch.npu.is_op_supported("foo::bar")
    assert not torch.npu.is_op_supported("aten::add.no_such_overload")
    lib = torch.library.Library("npu_op_support_test", "DEF")  # another library's operator
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    assert torch.npu.is_op_supported("npu_op_support_test::twice")  # its CPU kernel runs zero-copy
    assert torch.npu.is_op_supported("aten::quantize_per_tensor")  # quantized npu tensors: ops/src/quantized.cpp
    assert not torch.npu.is_op_supported("aten::quantize_per_tensor_dynamic")
    assert torch.npu.is_op_supported("aten::linalg_lstsq") == (NEEDS_CANN_91 in _op_table.SUPPORTED)
    assert "torch_npu has no npu kernel" in op_support.unsupported_reason("aten::quantize_per_tensor_dynamic")
    with pytest.raises(TypeError, match="op must be"):
        torch.npu.is_op_supported(3)


@pytest.mark.skipif(NEEDS_CANN_91 in _op_table.SUPPORTED, reason="linalg_lstsq is supported on this pair")
def test_unsupported_operator_raises_with_what_to_do(no_cpu_fallback):
    a, b = torch.randn(4, 3).npu(), torch.randn(4, 2).npu()
    with pytest.raises(NotImplementedError) as err:
        torch.linalg.lstsq(a, b)
    text = str(err.value)
    assert "aten::linalg_lstsq.out is not supported on NPU" in text
    assert torch_npu.__version__ in text and _op_table.CANN in text
    assert "The operator 'aten::linalg_lstsq.out' would execute its main computation on CPU" in text
    assert "CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1" in text


@pytest.mark.skipif(NEEDS_CANN_91 in _op_table.SUPPORTED, reason="linalg_lstsq is supported on this pair")
def test_cpu_fallback_runs_on_the_cpu(no_cpu_fallback):
    a, b = torch.randn(5, 3), torch.randn(5, 2)
    torch.npu.set_cpu_fallback(True)
    assert torch.npu.get_cpu_fallback()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.linalg.lstsq(a.npu(), b.npu()).solution
        second = torch.linalg.lstsq(a.npu(), b.npu()).solution
    assert first.device.type == "npu"
    torch.testing.assert_close(first.cpu(), torch.linalg.lstsq(a, b).solution)
    torch.testing.assert_close(second.cpu(), first.cpu())
    # As torch_npu's TORCH_NPU_WARN, the warning goes to stderr, not through Python's warnings.
    assert not [w for w in caught if "will fall back" in str(w.message)]


def test_operators_torch_npu_does_not_register_take_the_cpu_fallback():
    """ops/torch_npu_registered_ops.txt decides: an overload of the table that torch_npu has no
    NPU kernel for has no PrivateUse1 kernel here either, and is reported as a CPU fallback."""
    assert "fmax.out" in _op_table.CPU_FALLBACK and "fmin.out" in _op_table.CPU_FALLBACK
    assert _op_table.CPU_FALLBACK <= set(_op_table.UNSUPPORTED)
    assert not _op_table.CPU_FALLBACK & _op_table.SUPPORTED
    for name in _op_table.CPU_FALLBACK:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"), name
    assert "torch_npu registers no NPU kernel" in op_support.unsupported_reason("aten::fmax.out")
    # Structured operators torch_npu registers in functional form compute through their
    # out= overload here: it counts as registered (gelu_backward -> gelu_backward.grad_input).
    assert "gelu_backward.grad_input" in _op_table.SUPPORTED
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::gelu_backward.grad_input", "PrivateUse1")
    # Hand-written kernels stay only where torch_npu registers the overload.
    for name in ("_to_sparse_csr", "multilabel_margin_loss_backward", "_embedding_bag_backward"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"), name


_FMAX_TWICE = textwrap.dedent("""
    import torch, torch_npu
    x = torch.tensor([1.0, float("nan"), 3.0]).npu()
    y = torch.tensor([2.0, 4.0, float("nan")]).npu()
    for _ in range(2):
        out = torch.empty_like(x)
        torch.fmax(x, y, out=out)
        print(out.device, out.cpu().tolist())
    print(torch.fmin(x, y).cpu().tolist())
""")


def test_fmax_falls_back_with_torch_npus_warning_on_stderr():
    env = {"TORCH_NPU_FALLBACK_CPU_DISABLE": "0"}
    result = run_python(_FMAX_TWICE, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["npu:0 [2.0, 4.0, 3.0]", "npu:0 [2.0, 4.0, 3.0]", "[1.0, 4.0, 3.0]"]
    text = ("CAUTION: The operator 'aten::fmax.out' is not currently supported on the NPU backend and will fall back "
            "to run on the CPU. This may have performance implications. (function npu_cpu_fallback)")
    assert result.stderr.count(text) == 1  # once per operator
    assert result.stderr.count("'aten::fmin.out' is not currently supported") == 1


def test_fmax_fallback_disabled_raises_torch_npus_error():
    result = run_python(_FMAX_TWICE, env={"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"})
    assert result.returncode != 0 and "npu:0" not in result.stdout
    assert ("The operator 'aten::fmax.out' would execute its main computation on CPU through dispatcher backend "
            "fallback because no kernel is registered for the NPU PrivateUse1 backend, but CPU fallback is "
            "disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1.") in result.stderr
    assert "NotImplementedError" in result.stderr and "will fall back" not in result.stderr


_CSR_SUM = textwrap.dedent("""
    import torch, torch_npu
    dense = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    csr = dense.to_sparse_csr().npu()
    for _ in range(2):
        s = torch.ops.aten._sparse_csr_sum.dim_dtype(csr, [1], True, dtype=None)
        p = torch.ops.aten._sparse_csr_prod.dim_dtype(csr, [1], True, dtype=None)
        print(s.device, s.to_dense().cpu().flatten().tolist(), p.to_dense().cpu().flatten().tolist())
""")


@pytest.mark.parametrize("disable", ["0", "1"])
def test_sparse_csr_sum_and_prod_copy_to_the_cpu_as_torch_npu(disable):
    result = run_python(_CSR_SUM, env={"TORCH_NPU_FALLBACK_CPU_DISABLE": disable})
    if disable == "1":
        assert result.returncode != 0
        assert ("The operator 'aten::_sparse_csr_sum.dim_dtype' would execute its main computation on CPU through "
                "explicit CPU kernel because torch_npu currently provides only a CPU implementation for this Sparse "
                "CSR reduction, but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1.") in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["npu:0 [3.0, 7.0] [2.0, 12.0]"] * 2
    for op in ("sum", "prod"):
        assert result.stderr.count(
            "CPU fallback is allowed because TORCH_NPU_FALLBACK_CPU_DISABLE=0. Since the NPU interface does not support "
            f"operator 'aten::_sparse_csr_{op}.dim_dtype', the operator will fall back to CPU.") == 1


_LSTSQ_TWICE = textwrap.dedent("""
    import torch, torch_npu
    print(torch.npu.get_cpu_fallback())
    a = torch.eye(3).npu()
    for _ in range(2):
        print(torch.linalg.lstsq(a, a).solution.device)
""")


@pytest.mark.skipif(NEEDS_CANN_91 in _op_table.SUPPORTED, reason="linalg_lstsq is supported on this pair")
@pytest.mark.parametrize("value", [None, "0"])
def test_cpu_fallback_is_the_default_as_in_torch_npu(value):
    env = {} if value is None else {"TORCH_NPU_FALLBACK_CPU_DISABLE": value}
    if value is None and "TORCH_NPU_FALLBACK_CPU_DISABLE" in os.environ:
        pytest.skip("TORCH_NPU_FALLBACK_CPU_DISABLE is set for the test run")
    result = run_python(_LSTSQ_TWICE, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "npu:0", "npu:0"]
    assert result.stderr.count("CAUTION: The operator 'aten::linalg_lstsq.out' is not currently supported on the "
                               "NPU backend and will fall back to run on the CPU") == 1


@pytest.mark.skipif(NEEDS_CANN_91 in _op_table.SUPPORTED, reason="linalg_lstsq is supported on this pair")
def test_cpu_fallback_disabled_from_the_environment():
    result = run_python(_LSTSQ_TWICE, env={"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"})
    assert result.returncode != 0
    assert "False" in result.stdout
    assert "CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1" in result.stderr
    assert "aten::linalg_lstsq.out" in result.stderr and "will fall back" not in result.stderr


def test_dtype_restriction_names_the_dtype():
    ints = torch.ones(2, 2, dtype=torch.int64).npu()
    with pytest.raises(RuntimeError, match=r"aten::mm.out does not support Long on NPU .* it takes"):
        torch.mm(ints, ints)
    x = torch.randn(3, 3).npu()
    torch.testing.assert_close((x @ x).cpu(), x.cpu() @ x.cpu())


def test_float64_matmul_family_runs_on_npu():
    """mm, bmm, addmm, baddbmm, addbmm take float64 as torch_npu's (Huawei's nn and optim tests run
    float64 multi-head attention, spectral norm and optimizers on npu)."""
    a, b, c = (torch.randn(2, 3, 3, dtype=torch.float64) for _ in range(3))
    m = torch.randn(3, 3, dtype=torch.float64)
    for fn, args in ((torch.mm, (a[0], b[0])), (torch.bmm, (a, b)), (torch.addmm, (m, a[0], b[0])),
                     (torch.baddbmm, (c, a, b)), (torch.addbmm, (m, a, b))):
        out = fn(*(t.npu() for t in args))
        assert out.dtype == torch.float64
        torch.testing.assert_close(out.cpu(), fn(*args))
    assert "float64" in _op_table.DTYPES["mm.out"]


def test_unsupported_ops_of_a_model():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    found = op_support.unsupported_ops_of(model, torch.randn(2, 4))
    assert found == {}

    def uses_lstsq(a, b):
        return torch.linalg.lstsq(a, b).solution

    found = op_support.unsupported_ops_of(uses_lstsq, torch.randn(4, 3), torch.randn(4, 2))
    # The functional overload is reported: it reaches the NPU through linalg_lstsq.out.
    assert bool(found) == (NEEDS_CANN_91 not in _op_table.SUPPORTED)
    assert all("linalg_lstsq.out" in why for why in found.values())


def test_cli_lists_unsupported_operators(tmp_path):
    script = tmp_path / "model.py"
    script.write_text("import torch\nprint(torch.linalg.lstsq(torch.randn(4, 3), torch.randn(4, 2)).solution.shape)\n")
    result = run_python(f"from torch_npu.npu import op_support; raise SystemExit(op_support._main([{str(script)!r}]))")
    expect_missing = NEEDS_CANN_91 not in _op_table.SUPPORTED
    assert _op_table.UNSUPPORTED[NEEDS_CANN_91].split(":")[0] in result.stdout, result.stdout + result.stderr
    assert "not supported on NPU" in result.stdout
    assert result.returncode == (1 if expect_missing else 0)
