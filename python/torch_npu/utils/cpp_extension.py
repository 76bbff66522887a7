"""torch_npu.utils.cpp_extension.NpuExtension: a setuptools Extension for C++ code on npu.

As torch_npu's: the Extension compiles against torch_npu's headers (``torch_npu/include``,
``torch_npu/include/third_party/acl/inc``: AscendCL's ``acl/acl.h``, ``acl_base.h``,
``acl_rt.h`` with the simulator's runtime API, and ``torch_npu/csrc/core/npu/
NPUCachingAllocator.h``) and PyTorch's, and links ``torch_npu/lib``'s ``libtorch_npu``
(which resolves to ``torch_npu._C``) and PyTorch's libraries. Operators written with
PyTorch's C++ API (``TORCH_LIBRARY``, ``TORCH_LIBRARY_IMPL(..., PrivateUse1, ...)``,
``at::Tensor``) build and run on npu tensors; of torch_npu's own ``torch_npu/csrc`` headers
only the allocator API is shipped.
"""
import os

import torch_npu

__all__ = ["NpuExtension"]

PYTORCH_NPU_INSTALL_PATH = os.path.dirname(os.path.realpath(torch_npu.__file__))


def NpuExtension(name, sources, *args, **kwargs):
    r"""Create a :class:`setuptools.Extension` for C++ with torch_npu's and PyTorch's include
    and library directories and libraries; arguments are forwarded to setuptools.Extension.
    Build it with ``torch.utils.cpp_extension.BuildExtension``."""
    import setuptools
    import torch.utils.cpp_extension as torch_extension

    torch_npu_dir = PYTORCH_NPU_INSTALL_PATH
    include_dirs = list(kwargs.get("include_dirs", []))
    include_dirs.append(os.path.join(torch_npu_dir, "include"))
    include_dirs.append(os.path.join(torch_npu_dir, "include", "third_party", "acl", "inc"))
    hccl = os.path.join(torch_npu_dir, "include", "third_party", "hccl", "inc")
    if os.path.isdir(hccl):
        include_dirs.append(hccl)
    include_dirs += torch_extension.include_paths()
    kwargs["include_dirs"] = include_dirs

    library_dirs = list(kwargs.get("library_dirs", []))
    library_dirs.append(os.path.join(torch_npu_dir, "lib"))
    library_dirs += torch_extension.library_paths()
    libraries = list(kwargs.get("libraries", []))
    libraries += ["c10", "torch", "torch_cpu", "torch_python", "torch_npu"]
    kwargs["library_dirs"] = library_dirs
    kwargs["libraries"] = libraries
    kwargs["language"] = "c++"
    return setuptools.Extension(name, sources, *args, **kwargs)
