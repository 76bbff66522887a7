"""Environment report for bug reports, as torch_npu has it (``python -m torch_npu.utils.collect_env``).

It is PyTorch's ``torch.utils.collect_env`` report plus the torch_npu and CANN versions. The
CANN here is the simulated one, whatever ``$ASCEND_HOME_PATH`` names: the version is the one the
simulator reports (``torch_npu.utils.get_cann_version()``; the toolkit home torch_npu/cann
records the same in its ascend_toolkit_install.info).
"""
import os
import sys
from collections import namedtuple

import torch
from torch.utils import collect_env as _torch_env

import torch_npu

__all__ = ["SystemEnv", "get_cann_version", "get_torch_npu_version", "get_env_info",
           "get_pretty_env_info", "pretty_str", "check_directory_path_readable", "main",
           "get_torch_npu_install_path", "check_path_owner_consistent"]

SystemEnv = namedtuple("SystemEnv", [
    "torch_version", "torch_npu_version", "is_debug_build", "gcc_version", "clang_version",
    "cmake_version", "os", "libc_version", "python_version", "python_platform", "pip_version",
    "pip_packages", "conda_packages", "caching_allocator_config", "is_xnnpack_available",
    "cpu_info", "cann_version",
])


def check_directory_path_readable(path):
    r"""Raise RuntimeError unless ``path`` exists, is not a symbolic link and is readable."""
    if not os.path.exists(path):
        raise RuntimeError(f"The path does not exist: {path}")
    if os.path.islink(path):
        raise RuntimeError(f"Invalid path is a symbolic link: {path}")
    if not os.access(path, os.R_OK):
        raise RuntimeError(f"The path permission check failed: {path}")


def get_torch_npu_install_path():
    r"""The first site-packages directory of this interpreter (where torch_npu's wheel installs)."""
    import site

    packages = site.getsitepackages()
    return packages[0] if packages else ""


def check_path_owner_consistent(path: str):
    r"""Deprecated in torch_npu (it no longer checks the owner): raise RuntimeError if ``path``
    does not exist. Use :func:`check_directory_path_readable`."""
    import warnings

    warnings.warn("`torch_npu.utils.collect_env.check_path_owner_consistent(path)` is deprecated and no longer "
                  "performs path owner verification. Please use `check_directory_path_readable(path)` to check "
                  "whether the path exists.", FutureWarning, stacklevel=2)
    if not os.path.exists(path):
        raise RuntimeError(f"The path does not exist: {path}")


def get_cann_version():
    r"""The installed CANN toolkit version string, e.g. ``"8.5.0"`` (the simulated CANN's)."""
    from torch_npu.utils import get_cann_version as _component_version

    return _component_version("CANN")


def get_torch_npu_version():
    import torch_npu

    return torch_npu.__version__


def get_env_info():
    r"""Collect the report's fields (PyTorch's collectors plus torch_npu and CANN versions)."""
    run = _torch_env.run
    pip_version, pip_list = _torch_env.get_pip_packages(run)
    sys_version = sys.version.replace("\n", " ")
    return SystemEnv(
        torch_version=torch.__version__,
        torch_npu_version=get_torch_npu_version(),
        is_debug_build=str(torch.version.debug),
        python_version=f"{sys_version} ({sys.maxsize.bit_length() + 1}-bit runtime)",
        python_platform=_torch_env.get_python_platform(),
        pip_version=pip_version,
        pip_packages=pip_list,
        conda_packages=_torch_env.get_conda_packages(run),
        os=_torch_env.get_os(run),
        libc_version=_torch_env.get_libc_version(),
        gcc_version=_torch_env.get_gcc_version(run),
        clang_version=_torch_env.get_clang_version(run),
        cmake_version=_torch_env.get_cmake_version(run),
        caching_allocator_config=os.environ.get("PYTORCH_NPU_ALLOC_CONF", ""),
        is_xnnpack_available=_torch_env.is_xnnpack_available(),
        cpu_info=_torch_env.get_cpu_info(run),
        cann_version=get_cann_version(),
    )


_FORMAT = """
PyTorch version: {torch_version}
Torch-npu version: {torch_npu_version}
Is debug build: {is_debug_build}
OS: {os}
GCC version: {gcc_version}
Clang version: {clang_version}
CMake version: {cmake_version}
Libc version: {libc_version}

Python version: {python_version}
Python platform: {python_platform}
Is XNNPACK available: {is_xnnpack_available}

CPU:
{cpu_info}

CANN:
{cann_version}

Versions of relevant libraries:
{pip_packages}
{conda_packages}
""".strip()


def pretty_str(envinfo):
    r"""Format :func:`get_env_info`'s result as the text report."""
    fields = {}
    for key, value in envinfo._asdict().items():
        if value is True or value is False:
            value = "Yes" if value else "No"
        fields[key] = "Could not collect" if value is None else value
    for key, tag in (("pip_packages", f"[{envinfo.pip_version}] "), ("conda_packages", "[conda] ")):
        lines = (fields[key] or "No relevant packages").split("\n")
        fields[key] = "\n".join(tag + line for line in lines)
    return _FORMAT.format(**fields)


def _public_switches():
    """torch_npu's environment switches, one line each: name=value (meaning), the defaults marked."""
    lines = []
    for name, value, effective, mode in torch_npu._C._npu_public_envs():
        meaning = mode or "not a value it takes"
        lines.append(f"{name}={value} ({meaning})" if value else f"{name} unset: {effective} ({meaning})")
    return "\n".join(lines)


def get_pretty_env_info():
    return pretty_str(get_env_info()) + "\n\ntorch_npu switches:\n" + _public_switches()


def _add_collect_env_methods() -> None:
    """``torch.version.cann``, as torch_npu sets it at import."""
    torch.version.cann = get_cann_version()


def main():
    print("Collecting environment information...")
    print(get_pretty_env_info())


if __name__ == "__main__":
    main()
