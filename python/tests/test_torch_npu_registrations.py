"""tools/torch_npu_registrations.py (which ATen overloads Huawei's torch_npu gives an NPU kernel)
on a miniature Ascend/pytorch + op-plugin tree, and the list it derived,
ops/torch_npu_registered_ops.txt."""
import os
import re
import sys
import textwrap

import pytest

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(REPO, "tools", "torch_npu_registrations.py")
DATA = os.path.join(REPO, "ops", "torch_npu_registered_ops.txt")

pytestmark = pytest.mark.skipif(not os.path.exists(TOOL) or not os.path.exists(DATA),
                                reason="tools/ and ops/ are not next to the tests (installed wheel)")


@pytest.fixture(scope="module")
def tool():
    sys.path.insert(0, os.path.dirname(TOOL))
    try:
        import torch_npu_registrations
    finally:
        sys.path.remove(os.path.dirname(TOOL))
    return torch_npu_registrations


@pytest.fixture(scope="module")
def torch_info(tool):
    return tool.Torch()


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


ALL = [f"v2.{i}" for i in range(1, 16)]


def test_version_specs(tool):
    assert tool.versions("all_version", ALL) == ALL
    assert tool.versions(["v2.13", "newest"], ALL) == ["v2.13", "v2.14", "v2.15"]
    assert tool.versions(["v2.1", "v2.3"], ALL) == ["v2.1", "v2.2", "v2.3"]
    assert tool.versions("v2.1, v2.2", ALL) == ["v2.1", "v2.2"]
    assert tool.versions("v2.2", ALL) == ["v2.2"]
    assert tool.versions(None, ALL) == []


@pytest.fixture(scope="module")
def mini(tmp_path_factory, tool, torch_info):
    """A miniature pair of checkouts exercising each registration rule for the running torch."""
    root = tmp_path_factory.mktemp("hw")
    pta, plugin = str(root / "pytorch"), str(root / "op-plugin")
    here = "v" + torch_info.version
    before = ALL[ALL.index(here) - 1]
    write(plugin, tool.OP_PLUGIN_YAML, f"""\
        all_version: [{", ".join(ALL)}]
        official:
          - func: _adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor
            op_api: all_version
          - func: fmax.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
            op_api: [v2.1, {before}]
          - func: gelu.out(Tensor self, *, str approximate='none', Tensor(a!) out) -> Tensor(a!)
            dvm: all_version
          - func: add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)
            op_api: all_version
            sparse: [{here}, newest]
          - func: linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor
            op_api: all_version
        custom:
          - func: npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
            op_api: all_version
        symint:
          - func: _adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor
            op_api: all_version
        quant:
          - func: dequantize.self(Tensor self) -> Tensor
            acl_op: [v2.2, newest]
        autograd:
          - func: _thnn_fused_gru_cell(Tensor input_gates, Tensor hidden_gates, Tensor hx, Tensor? input_bias=None, Tensor? hidden_bias=None) -> (Tensor, Tensor)
            op_api: all_version
        """)
    write(plugin, tool.DERIVATIVES_YAML, f"""\
        all_version: [{", ".join(ALL)}]
        backward:
        - name: gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
          self: npu_gather_backward(grad, self.sym_sizes(), dim, index, sparse_grad)
          version: all_version
        - name: kl_div(Tensor self, Tensor target, int reduction=Mean, *, bool log_target=False) -> Tensor
          self: kl_div_backward(grad, self, target, reduction, log_target)
          version: [v2.1, {before}]
        """)
    write(pta, tool.PTA_YAML, """\
        backend: NPU
        cpp_namespace: at_npu::native
        supported:
          - view
          - func: clone
            op_api: True
          - func: resize_as_
            device_check: NoCheck
          - func: t
            exposed: True
        custom:
          - func: npu_format_cast(Tensor self, int acl_format) -> Tensor
        """)
    write(pta, tool.STUBS, """\
        def _quantized_extra_impls() -> list[str]:
            return ['m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));']


        def unrelated():
            pass

        SPECIAL_REGISTERS = {
            "nestedtensor": SpecialRegisterConfig(
                extra_impls=[
                    'm.impl("values", TORCH_FN(at::native::values_nested));',
                ],
            ),
        }
        """)
    write(pta, "torch_npu/csrc/aten/ops/SparseCsrReductionFallbackKernelNpu.cpp", """\
        TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
          m.impl("_sparse_csr_sum.dim_dtype", TORCH_FN(sum_on_cpu));
        }
        """)
    write(pta, "torch_npu/csrc/aten/Other.cpp", """\
        TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
          m.impl("mm", TORCH_FN(autocast_mm));
        }
        TORCH_LIBRARY_IMPL(aten, CPU, m) {
          m.impl("true_divide.Tensor", TORCH_FN(cpu_div));
        }
        TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
          m.impl(TORCH_SELECTIVE_NAME("aten::fmin.out"), TORCH_FN(npu_fmin));
        }
        """)
    write(plugin, "test/Registers.cpp", """\
        TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
          m.impl("hypot.out", TORCH_FN(test_only));
        }
        """)
    return pta, plugin, tool.collect(pta, plugin, torch_info)


def test_rules(mini, tool):
    _, _, reg = mini
    op_yaml = "op-plugin:" + tool.OP_PLUGIN_YAML
    assert reg.regs["_adaptive_avg_pool2d"] == {("PrivateUse1", op_yaml)}
    # Version gates: a range that ends before this torch, and dvm alone, register nothing.
    assert "fmax.out" not in reg.regs and "gelu.out" not in reg.regs
    assert reg.keys("add.out") == {"PrivateUse1", "SparsePrivateUse1"}
    # A CompositeImplicitAutograd overload is also registered for AutogradPrivateUse1.
    assert ("AutogradPrivateUse1", "pytorch:" + tool.STUBS + "#composite-implicit") in reg.regs["linear"]
    assert reg.keys("dequantize.self") == {"QuantizedPrivateUse1"}
    assert reg.keys("_thnn_fused_gru_cell") == {"AutogradPrivateUse1"}
    # torch.ops.npu operators are not ATen overloads.
    assert "npu_rms_norm" not in reg.regs and "npu_format_cast" not in reg.regs
    assert reg.regs["view"] == {("PrivateUse1", "pytorch:" + tool.PTA_YAML)}
    assert ("PrivateUse1", "pytorch:" + tool.PTA_YAML) in reg.regs["clone"]
    assert reg.keys("resize_as_") == {"PrivateUse1"}
    assert "PrivateUse1" not in reg.keys("t")  # a mapping without op_api / device_check
    # derivatives.yaml: the autograd wrapper for the overload and its non-composite siblings.
    assert reg.keys("gather") == reg.keys("gather.out") == {"AutogradPrivateUse1"}
    assert "gather.dimname" not in reg.regs  # CompositeImplicitAutograd
    assert "kl_div" not in reg.regs  # derivative gated off for this torch
    assert ("SparsePrivateUse1", "pytorch:" + tool.STUBS + "#device-generic") in reg.regs["_nnz"]
    assert reg.keys("q_scale") == {"QuantizedPrivateUse1"}
    assert ("NestedTensorPrivateUse1", "pytorch:" + tool.STUBS + "#extra") in reg.regs["values"]
    assert reg.regs["_sparse_csr_sum.dim_dtype"] == {(
        "SparseCsrPrivateUse1",
        "pytorch:torch_npu/csrc/aten/ops/SparseCsrReductionFallbackKernelNpu.cpp#explicit-cpu")}
    assert reg.regs["fmin.out"] == {("PrivateUse1", "pytorch:torch_npu/csrc/aten/Other.cpp")}
    # Autocast and CPU registrations are no NPU kernels; test trees are not torch_npu.
    assert not {"PrivateUse1", "AutocastPrivateUse1"} & reg.keys("mm")
    assert "true_divide.Tensor" not in reg.regs
    assert "hypot.out" not in reg.regs


def test_output_and_table_classification(mini, tool, tmp_path):
    pta, plugin, reg = mini
    out = tmp_path / "registered.txt"
    tool.main(["--pytorch", pta, "--op-plugin", plugin, "--out", str(out)])
    lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert [line.split()[0] for line in lines] == sorted(reg.regs)
    assert "_adaptive_avg_pool2d  PrivateUse1(op-plugin:op_plugin/config/op_plugin_functions.yaml)" in lines

    table = tmp_path / "table.yaml"
    table.write_text("aten:\n  - _adaptive_avg_pool2d\n  - fmax.out\n  - fmax\n  - {op: dequantize.self, supported: false}\n"
                     "  - no_such_op\n")
    rows = tool.classify_table(reg, str(table))
    assert rows == [
        ("registered", "_adaptive_avg_pool2d", ""),
        ("fallback", "fmax.out", ""),
        ("composite", "fmax", "structured, computed by fmax.out (which falls back)"),
        ("other-key", "dequantize.self", "QuantizedPrivateUse1; ours: unsupported"),
        ("absent", "no_such_op", ""),
    ]


def test_committed_list():
    with open(DATA) as f:
        text = f.read()
    commits = re.findall(r"Ascend/(pytorch|op-plugin) ([0-9a-f]{40}) ", text)
    assert [repo for repo, _ in commits] == ["pytorch", "op-plugin"]
    rows = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, *regs = line.split()
        assert regs and all(re.fullmatch(r"\w+\((pytorch|op-plugin):[^()\s]+\)", r) for r in regs), line
        rows[name] = regs
    names = [line.split()[0] for line in text.splitlines() if not line.startswith("#")]
    assert names == sorted(set(names))
    assert "PrivateUse1(op-plugin:op_plugin/config/op_plugin_functions.yaml)" in rows["add.Tensor"]
    # Huawei's test_cpu_fallback_control: fmax.out takes the dispatcher's CPU fallback, the
    # CSR reductions have kernels of their own that copy to the CPU.
    assert "fmax.out" not in rows and "fmax" not in rows
    for op in ("_sparse_csr_sum.dim_dtype", "_sparse_csr_prod.dim_dtype"):
        assert rows[op] == ["SparseCsrPrivateUse1(pytorch:torch_npu/csrc/aten/ops/"
                            "SparseCsrReductionFallbackKernelNpu.cpp#explicit-cpu)"]
