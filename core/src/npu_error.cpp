#include "torch_npu/core/npu_error.h"

#include "torch_npu/csrc/core/npu/register/OptionsManager.h"

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "acl/acl_rt.h"

namespace torch_npu {
namespace {

const char* submodule_name(SubModule m) {
  switch (m) {
    case SubModule::PTA: return "PTA";
    case SubModule::OPS: return "OPS";
    case SubModule::DIST: return "DIST";
    case SubModule::GRAPH: return "GRAPH";
    case SubModule::PROF: return "PROF";
  }
  return "UNKNOWN";
}

const char* code_text(ErrCode c) {
  switch (c) {
    case ErrCode::SUCCESS: return "success";
    case ErrCode::PARAM: return "invalid parameter";
    case ErrCode::TYPE: return "invalid type";
    case ErrCode::VALUE: return "invalid value";
    case ErrCode::PTR: return "invalid pointer";
    case ErrCode::INTERNAL: return "internal error";
    case ErrCode::MEMORY: return "memory error";
    case ErrCode::NOT_SUPPORT: return "feature not supported";
    case ErrCode::NOT_FOUND: return "resource not found";
    case ErrCode::UNAVAIL: return "resource unavailable";
    case ErrCode::SYSCALL: return "system call failed";
    case ErrCode::TIMEOUT: return "timeout error";
    case ErrCode::PERMISSION: return "permission error";
    case ErrCode::ACL: return "call acl api failed";
    case ErrCode::HCCL: return "call hccl api failed";
    case ErrCode::GE: return "call ge api failed";
  }
  return "unknown error";
}

}  // namespace

std::string format_error_code(SubModule submodule, ErrCode code) {
  if (c10_npu::option::OptionsManager::IsCompactErrorOutput()) return "";
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (localtime_r(&now, &local) != nullptr) std::strftime(when, sizeof(when), "%Y-%m-%d-%H:%M:%S", &local);
  int32_t device = -1;
  if (aclrtGetDevice(&device) != ACL_SUCCESS) device = -1;  // the calling thread's device
  const char* rank = std::getenv("RANK");
  const long rank_id = rank != nullptr ? std::strtol(rank, nullptr, 10) : -1;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "\n[ERROR] %s (PID:%d, Device:%d, RankID:%ld) ERR%02d%03d %s %s", when,
                static_cast<int>(getpid()), device, rank_id, static_cast<int>(submodule), static_cast<int>(code),
                submodule_name(submodule), code_text(code));
  return buf;
}

}  // namespace torch_npu
