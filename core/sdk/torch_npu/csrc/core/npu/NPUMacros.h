// Export macros of torch_npu's C++ API (torch_npu's names). Everything the SDK headers
// declare is defined in torch_npu/_C.so and reached through -ltorch_npu.
#pragma once

#define C10_NPU_API __attribute__((visibility("default")))
#define C10_NPU_EXPORT C10_NPU_API
#define TORCH_NPU_API C10_NPU_API
