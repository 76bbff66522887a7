// torch_npu's accelerator hooks for C++ extensions (torch_npu's path and names).
#pragma once

#include <ATen/core/Generator.h>

#include "torch_npu/csrc/core/npu/NPUMacros.h"

namespace c10_npu {

struct C10_NPU_API NPUHooksInterface {
  virtual ~NPUHooksInterface() = default;
  // The default random generator of npu:device_index.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index);
};

}  // namespace c10_npu
