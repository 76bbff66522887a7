// torch_npu's environment options for C++ extensions (c10_npu::option, torch_npu's path and
// names). The mode tables name what each value of torch_npu's public switches means; the
// OptionsManager getters read a switch once, refuse a value outside its table, and are what
// this runtime itself consults. describe_public_envs() lists every switch with its value
// (torch_npu.utils.collect_env prints it).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "torch_npu/csrc/core/npu/NPUMacros.h"

namespace c10_npu {
namespace option {

static std::unordered_map<int32_t, std::string> getHcclZeroCopyMode() {
  std::unordered_map<int32_t, std::string> hcclZeroCopyMode = {{0, "close"}, {1, "open"}};
  return hcclZeroCopyMode;
}

static std::unordered_map<int32_t, std::string> getInfNanMode() {
  std::unordered_map<int32_t, std::string> infNanMode = {{0, "max"}, {1, "inf_nan"}};
  return infNanMode;
}

static std::unordered_map<int32_t, std::string> getDisableInfNanMode() {
  std::unordered_map<int32_t, std::string> disableInfNanMode = {{0, "enable"}, {1, "disable"}};
  return disableInfNanMode;
}

static std::unordered_map<int32_t, std::string> getCombinedEnableMode() {
  std::unordered_map<int32_t, std::string> combinedEnableMode = {{0, "close"}, {1, "open"}};
  return combinedEnableMode;
}

static std::unordered_map<int32_t, std::string> getLaunchBlockingMode() {
  std::unordered_map<int32_t, std::string> launchBlockingMode = {{0, "disable"}, {1, "enable"}};
  return launchBlockingMode;
}

static std::unordered_map<int32_t, std::string> getAsyncErrorHandlingMode() {
  std::unordered_map<int32_t, std::string> asyncErrorHandlingMode = {
      {0, "NoHandling"}, {1, "TearDown"}, {2, "CleanUpOnly"}, {3, "SkipCleanUp"}};
  return asyncErrorHandlingMode;
}

static std::unordered_map<int32_t, std::string> getDesyncDebugMode() {
  std::unordered_map<int32_t, std::string> desyncDebugMode = {{0, "close"}, {1, "open"}};
  return desyncDebugMode;
}

static std::unordered_map<int32_t, std::string> getLogLevelMode() {
  std::unordered_map<int32_t, std::string> logLevelMode = {
      {0, "debug"}, {1, "info"}, {2, "warning"}, {3, "error"}, {4, "null"}};
  return logLevelMode;
}

static std::unordered_map<int32_t, std::string> getMemoryCacheMode() {
  std::unordered_map<int32_t, std::string> memoryCacheMode = {{0, "open"}, {1, "close"}};
  return memoryCacheMode;
}

static std::unordered_map<int32_t, std::string> getTaskQueueEnableMode() {
  std::unordered_map<int32_t, std::string> taskQueueEnableMode = {{0, "close"}, {1, "level 1"}, {2, "level 2"}};
  return taskQueueEnableMode;
}

// One public switch as describe_public_envs() reports it.
struct PublicEnv {
  std::string name;
  std::string value;  // as set, or "" when unset
  int32_t effective;  // the value in force (the default when unset)
  std::string mode;   // its meaning from the switch's table, "" for a value outside it
};

class C10_NPU_API OptionsManager {
 public:
  // ASCEND_LAUNCH_BLOCKING=1: every kernel runs before its launch returns (the task
  // queue is off whatever TASK_QUEUE_ENABLE says).
  static bool CheckBlockingEnable();
  // TASK_QUEUE_ENABLE: 0 kernels run inline, 1 and 2 (default 1) they queue on their stream.
  static uint32_t GetTaskQueueEnable();
  // TORCH_NPU_FALLBACK_CPU_DISABLE=1 turns the CPU fallback of operators without an npu kernel off.
  static bool IsCpuFallbackEnable();
  // TORCH_NPU_COMPACT_ERROR_OUTPUT=1: errors without torch_npu's error-code suffix.
  static bool IsCompactErrorOutput();
  // Every public switch of torch_npu: TASK_QUEUE_ENABLE, ASCEND_LAUNCH_BLOCKING,
  // INF_NAN_MODE_ENABLE, INF_NAN_MODE_FORCE_DISABLE, COMBINED_ENABLE,
  // TORCH_HCCL_ASYNC_ERROR_HANDLING, TORCH_HCCL_DESYNC_DEBUG, ASCEND_GLOBAL_LOG_LEVEL,
  // PYTORCH_NO_NPU_MEMORY_CACHING, TORCH_HCCL_ZERO_COPY.
  static std::vector<PublicEnv> describe_public_envs();

 private:
  // The integer value of env_str (its default when unset); raises when the value is not
  // in `modes`, naming the variable and the values it takes.
  static int32_t GetModeOption(const char* env_str, int32_t defaultVal,
                               const std::unordered_map<int32_t, std::string>& modes);
};

}  // namespace option
}  // namespace c10_npu
