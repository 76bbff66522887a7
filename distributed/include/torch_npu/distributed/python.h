// Python bindings of HCCL, called by torch_npu._C's module init (python/csrc/module.cpp).
#pragma once

#include <Python.h>

namespace torch_npu::distributed {

// Adds torch_npu._C._distributed_c10d (ProcessGroupHCCL, ProcessGroupHCCL.Options).
void init_python_bindings(PyObject* module);

}  // namespace torch_npu::distributed
