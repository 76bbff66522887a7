// torch_npu's initialisation API for C++ programs (torch_npu's path and names): a libtorch
// program (no Python) links -ltorch_npu and calls init_npu before using npu tensors.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "torch_npu/csrc/core/npu/NPUMacros.h"

namespace torch_npu {

// Initialises the runtime and makes `device_index` current ("npu:1" or a Device also work).
TORCH_NPU_API void init_npu(const c10::DeviceIndex device_index = 0);
TORCH_NPU_API void init_npu(const std::string& device_str);
TORCH_NPU_API void init_npu(const at::Device& device);
// Waits for all devices' work and releases the cached device memory.
TORCH_NPU_API void finalize_npu();

}  // namespace torch_npu

namespace torch {
namespace npu {

// Waits for the work of device_index (-1: the current device).
TORCH_NPU_API void synchronize(int64_t device_index = -1);

}  // namespace npu
}  // namespace torch

namespace c10 {
namespace npu {

C10_NPU_API DeviceIndex current_device();

}  // namespace npu
}  // namespace c10
