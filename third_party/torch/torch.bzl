"""Repository rule locating the PyTorch of the selected version pair.

Environment (set per pair in .bazelrc):
  NPU_PAIR    folder name under versions/, e.g. v2.13.0-8.5.0
  TORCH_VENV  venv holding that pair's torch (relative paths resolve against the workspace)
"""

def _torch_repo_impl(ctx):
    root = str(ctx.path(Label("//:WORKSPACE")).dirname)
    pair = ctx.os.environ.get("NPU_PAIR", "v2.13.0-8.5.0")
    venv = ctx.os.environ.get("TORCH_VENV", ".venv/pt213")
    if not venv.startswith("/"):
        venv = root + "/" + venv
    python = venv + "/bin/python"
    if not ctx.path(python).exists:
        fail("pair %s: no venv at %s; run `python3 tools/venv.py %s`" % (pair, venv, pair))
    probe = ctx.path(Label("//third_party/torch:probe.py"))
    res = ctx.execute([python, str(probe), root, pair], quiet = True)
    if res.return_code != 0:
        fail("pair %s cannot be built: %s" % (pair, res.stderr.strip()))
    info = {}
    for line in res.stdout.strip().split("\n"):
        k, v = line.split("=", 1)
        info[k] = v

    ctx.symlink(info["torch_include"], "torch_include")
    ctx.symlink(info["torch_lib"], "torch_lib")
    ctx.symlink(info["python_include"], "python_include")

    ctx.file("torch_info.bzl", "\n".join([
        'PAIR = "%s"' % info["pair"],
        'TORCH_VERSION = "%s"' % info["torch_version"],
        'CANN_VERSION = "%s"' % info["cann_version"],
        'POST = "%s"' % info["post"],
        'WHEEL_VERSION = "%s.post%s"' % (info["torch_version"], info["post"]),
        'PY_TAG = "%s"' % info["py_tag"],
        'PYTHON = "%s"' % info["python"],
        # For C++ test binaries: CUDA builds of torch pull libtorch_cuda.so and friends,
        # which Bazel's solib folder does not hold.
        'TORCH_LIB = "%s"' % info["torch_lib"],
        'CXX11_ABI = "%s"' % info["cxx11_abi"],
        "",
    ]))

    ctx.file("BUILD.bazel", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

exports_files(["torch_info.bzl"])

# ATen/c10 headers (no Python): what kernels and the runtime include.
cc_library(
    name = "headers",
    hdrs = glob(["torch_include/**/*.h", "torch_include/**/*.hpp"]),
    includes = ["torch_include", "torch_include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI={abi}"],
)

cc_library(
    name = "torch",
    srcs = [
        "torch_lib/libc10.so",
        "torch_lib/libtorch.so",
        "torch_lib/libtorch_cpu.so",
    ],
    deps = [":headers"],
)

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

# libtorch_python and Python headers: only for the bindings translation unit.
cc_library(
    name = "torch_python",
    srcs = ["torch_lib/libtorch_python.so"],
    deps = [":torch", ":python_headers"],
)

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(abi = info["cxx11_abi"], python = info["python"]))

torch_repository = repository_rule(
    implementation = _torch_repo_impl,
    local = True,
    environ = ["NPU_PAIR", "TORCH_VENV"],
)
