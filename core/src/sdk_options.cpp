// torch_npu's environment switches (core/sdk/torch_npu/csrc/core/npu/register/OptionsManager.h):
// the one place the runtime reads them.
#include "torch_npu/csrc/core/npu/register/OptionsManager.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "torch_npu/core/npu_error.h"

namespace c10_npu::option {

namespace {

struct Switch {
  const char* name;
  int32_t default_value;
  std::unordered_map<int32_t, std::string> (*modes)();
};

// torch_npu's public switches and their tables (the defaults are torch_npu's).
const Switch kPublicSwitches[] = {
    {"TASK_QUEUE_ENABLE", 1, getTaskQueueEnableMode},
    {"ASCEND_LAUNCH_BLOCKING", 0, getLaunchBlockingMode},
    {"INF_NAN_MODE_ENABLE", 1, getInfNanMode},
    {"INF_NAN_MODE_FORCE_DISABLE", 0, getDisableInfNanMode},
    {"COMBINED_ENABLE", 0, getCombinedEnableMode},
    {"TORCH_HCCL_ASYNC_ERROR_HANDLING", 1, getAsyncErrorHandlingMode},
    {"TORCH_HCCL_DESYNC_DEBUG", 0, getDesyncDebugMode},
    {"ASCEND_GLOBAL_LOG_LEVEL", 3, getLogLevelMode},
    {"PYTORCH_NO_NPU_MEMORY_CACHING", 0, getMemoryCacheMode},
    {"TORCH_HCCL_ZERO_COPY", 0, getHcclZeroCopyMode},
};

// The integer an environment value spells, as torch_npu's strtol (a non-number reads 0).
int32_t parse(const char* value) { return static_cast<int32_t>(std::strtol(value, nullptr, 10)); }

std::string allowed(const std::unordered_map<int32_t, std::string>& modes) {
  std::string out;
  for (int32_t v = 0; v < static_cast<int32_t>(modes.size()) + 1; ++v) {
    auto it = modes.find(v);
    if (it == modes.end()) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(v) + " (" + it->second + ")";
  }
  return out;
}

}  // namespace

int32_t OptionsManager::GetModeOption(const char* env_str, int32_t defaultVal,
                                      const std::unordered_map<int32_t, std::string>& modes) {
  const char* env_val = std::getenv(env_str);
  const int32_t value = (env_val != nullptr && *env_val) ? parse(env_val) : defaultVal;
  TORCH_CHECK(modes.count(value), env_str, " should be one of ", allowed(modes), ", got '", env_val, "'",
              torch_npu::pta_error(torch_npu::ErrCode::VALUE));
  return value;
}

bool OptionsManager::CheckBlockingEnable() {
  static const bool blocking = GetModeOption("ASCEND_LAUNCH_BLOCKING", 0, getLaunchBlockingMode()) != 0;
  return blocking;
}

uint32_t OptionsManager::GetTaskQueueEnable() {
  static const uint32_t level = [] {
    const auto requested = static_cast<uint32_t>(GetModeOption("TASK_QUEUE_ENABLE", 1, getTaskQueueEnableMode()));
    return CheckBlockingEnable() ? 0u : requested;
  }();
  return level;
}

bool OptionsManager::IsCpuFallbackEnable() {
  const char* v = std::getenv("TORCH_NPU_FALLBACK_CPU_DISABLE");
  return v == nullptr || parse(v) == 0;
}

bool OptionsManager::IsCompactErrorOutput() {
  // Read at each error: a program may set it after import.
  const char* v = std::getenv("TORCH_NPU_COMPACT_ERROR_OUTPUT");
  return v != nullptr && parse(v) != 0;
}

std::vector<PublicEnv> OptionsManager::describe_public_envs() {
  std::vector<PublicEnv> out;
  for (const Switch& s : kPublicSwitches) {
    const char* v = std::getenv(s.name);
    PublicEnv env{s.name, (v != nullptr) ? v : "", s.default_value, ""};
    if (v != nullptr && *v) env.effective = parse(v);
    const auto modes = s.modes();
    auto it = modes.find(env.effective);
    if (it != modes.end()) env.mode = it->second;
    out.push_back(std::move(env));
  }
  return out;
}

}  // namespace c10_npu::option
