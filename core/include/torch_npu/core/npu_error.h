#pragma once

// torch_npu's error codes: the suffix torch_npu appends to its error messages,
// "\n[ERROR] <time> (PID:<pid>, Device:<d>, RankID:<r>) ERR<submodule:2><code:3> <SUBMODULE> <what>",
// e.g. ops_error(ErrCode::PARAM) ends with "ERR01001 OPS invalid parameter". Empty with
// TORCH_NPU_COMPACT_ERROR_OUTPUT=1. The Python side is torch_npu/utils/_error_code.py.

#include <string>

namespace torch_npu {

enum class SubModule : int { PTA = 0, OPS = 1, DIST = 2, GRAPH = 3, PROF = 4 };

enum class ErrCode : int {
  SUCCESS = 0,
  PARAM = 1,
  TYPE = 2,
  VALUE = 3,
  PTR = 4,
  INTERNAL = 5,
  MEMORY = 6,
  NOT_SUPPORT = 7,
  NOT_FOUND = 8,
  UNAVAIL = 9,
  SYSCALL = 10,
  TIMEOUT = 11,
  PERMISSION = 12,
  ACL = 100,
  HCCL = 200,
  GE = 300,
};

std::string format_error_code(SubModule submodule, ErrCode code);
inline std::string pta_error(ErrCode code) { return format_error_code(SubModule::PTA, code); }
inline std::string ops_error(ErrCode code) { return format_error_code(SubModule::OPS, code); }
inline std::string dist_error(ErrCode code) { return format_error_code(SubModule::DIST, code); }

}  // namespace torch_npu
