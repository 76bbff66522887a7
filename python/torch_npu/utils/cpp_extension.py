"""torch_npu.utils.cpp_extension.NpuExtension: a setuptools Extension for C++ code on npu.

This torch_npu installs no C++ headers or library of its own (its kernels are in the
``torch_npu._C`` extension), so the Extension compiles against PyTorch's headers and links
PyTorch's libraries; torch_npu's ``include``/``lib`` directories are added where they exist.
Operators written with PyTorch's C++ API (``TORCH_LIBRARY``, ``TORCH_LIBRARY_IMPL(...,
PrivateUse1, ...)``, ``at::Tensor``) build and run on npu tensors; code that includes
torch_npu's own C++ headers (``torch_npu/csrc/...``) does not build here.
"""
import os

import torch_npu

__all__ = ["NpuExtension"]

PYTORCH_NPU_INSTALL_PATH = os.path.dirname(os.path.realpath(torch_npu.__file__))


def NpuExtension(name, sources, *args, **kwargs):
    r"""Create a :class:`setuptools.Extension` for C++ with PyTorch's (and torch_npu's, where
    installed) include and library directories and libraries; arguments are forwarded to
    setuptools.Extension. Build it with ``torch.utils.cpp_extension.BuildExtension``."""
    import setuptools
    import torch.utils.cpp_extension as torch_extension

    torch_npu_dir = PYTORCH_NPU_INSTALL_PATH
    include_dirs = list(kwargs.get("include_dirs", []))
    for sub in (("include",), ("include", "third_party", "acl", "inc"), ("include", "third_party", "hccl", "inc")):
        path = os.path.join(torch_npu_dir, *sub)
        if os.path.isdir(path):
            include_dirs.append(path)
    include_dirs += torch_extension.include_paths()
    kwargs["include_dirs"] = include_dirs

    library_dirs = list(kwargs.get("library_dirs", []))
    libraries = list(kwargs.get("libraries", []))
    npu_lib = os.path.join(torch_npu_dir, "lib")
    library_dirs += torch_extension.library_paths()
    libraries += ["c10", "torch", "torch_cpu", "torch_python"]
    if os.path.isfile(os.path.join(npu_lib, "libtorch_npu.so")):
        library_dirs.append(npu_lib)
        libraries.append("torch_npu")
    kwargs["library_dirs"] = library_dirs
    kwargs["libraries"] = libraries
    kwargs["language"] = "c++"
    return setuptools.Extension(name, sources, *args, **kwargs)
