// torch_npu's device functions for C++ extensions (c10_npu::, torch_npu's path and names).
// The current device is per host thread, as aclrtSetDevice's; the simulator has
// ASCEND_SIM_DEVICE_COUNT devices (8 by default).
#pragma once

#include <c10/core/Device.h>

#include "torch_npu/csrc/core/npu/NPUMacros.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace c10_npu {

C10_NPU_API c10::DeviceIndex device_count() noexcept;
// As device_count(), raising when there is no device.
C10_NPU_API c10::DeviceIndex device_count_ensure_non_zero();
// The current device through AscendCL's return code convention (ACL_SUCCESS or an error).
C10_NPU_API aclError GetDevice(int32_t* device);
C10_NPU_API aclError SetDevice(c10::DeviceIndex device);
C10_NPU_API c10::DeviceIndex current_device();
// Raises "Invalid device ordinal" style errors for a bad index.
C10_NPU_API void set_device(c10::DeviceIndex device);
// Waits for all work of the current device.
C10_NPU_API void device_synchronize();
// Makes `device` current and returns the previous one.
C10_NPU_API int ExchangeDevice(int device);

// torch.npu.set_sync_debug_mode: what a synchronising operation does (a copy to the host,
// .item(), a blocking copy from pageable memory, a stream synchronize): nothing, warn, or raise.
enum class SyncDebugMode { L_DISABLED = 0, L_WARN, L_ERROR };

class C10_NPU_API WarningState {
 public:
  void set_sync_debug_mode(SyncDebugMode level);
  SyncDebugMode get_sync_debug_mode();
};

C10_NPU_API WarningState& warning_state();
// Called by operators before they synchronise with the device: warns or raises per
// the sync debug mode.
C10_NPU_API void warn_or_error_on_sync();
// aclrtSynchronizeStream with the sync debug mode's check first.
C10_NPU_API void stream_synchronize(aclrtStream stream);

}  // namespace c10_npu
