"""The Python tests (python/tests) of each Bazel package, so that `bazel test //custom_ops/...`
runs the tests of the fused operators. They are tagged "python" (`--test_tag_filters=-python`: the C++ tests
only, as nox's test-matrix runs them before pytest on the installed wheel). The files stay in python/tests (they share conftest.py and data/);
//python:python_tests runs the ones no package claims here (among them the tests of the Python
torch_npu.contrib, test_contrib*.py, which lives in //python)."""

# package -> its test files under python/tests
COMPONENT_TESTS = {
    "custom_ops": [
        "test_bad_args.py",
        "test_bert_attention.py",
        "test_contrib_quant.py",
        "test_fused_ops.py",
        "test_fusion_attention.py",
        "test_infer_attention.py",
        "test_moe_ops.py",
        "test_vision_ops.py",
    ],
    "core": [
        "test_allocator_conf.py",
        "test_async_exactness.py",
        "test_async_fuzz.py",
        "test_execution.py",
        "test_memory.py",
        "test_memory_api.py",
        "test_npu_smi.py",
        "test_random.py",
        "test_stream_ordered_memory.py",
        "test_streams_events.py",
    ],
    "distributed": [
        "test_hccl.py",
        "test_hccl_api.py",
        "test_hccl_multihost.py",
    ],
    "ops": [
        "ops/test_op_conformance.py",
        "test_fft_plan_cache.py",
        "test_formats.py",
        "test_nested.py",
        "test_nn_ops.py",
        "test_op_support.py",
        "test_quantized.py",
        "test_sparse.py",
        "test_sparse_backward.py",
    ],
}

def claimed_python_tests():
    """Every file some package's python_tests runs (//python:python_tests skips them)."""
    out = []
    for files in COMPONENT_TESTS.values():
        out += files
    return out

def component_python_tests(name, package):
    """A py_test of `package`: pytest on its files of python/tests, with the tests' shared
    modules (conftest.py, helpers) and data."""
    files = COMPONENT_TESTS[package]
    native.py_test(
        name = name,
        size = "large",
        srcs = ["//tools:run_pytest.py", "//python:test_support"] + ["//python:tests/" + f for f in files],
        args = ["python/tests/" + f for f in files],
        data = ["//python:test_data"],
        legacy_create_init = False,
        main = "//tools:run_pytest.py",
        tags = ["python"],
        deps = ["//python:torch_npu"],
    )
