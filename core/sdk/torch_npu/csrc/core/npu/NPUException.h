// torch_npu's error checks for C++ extensions (torch_npu's path and names).
// NPU_CHECK_ERROR(aclrtXxx(...)) raises a c10::Error with AscendCL's message
// (aclGetRecentErrMsg) when the call does not return ACL_SUCCESS.
#pragma once

#include <c10/util/Exception.h>

#include "torch_npu/csrc/core/npu/NPUMacros.h"
#if __has_include("third_party/acl/inc/acl/acl_base.h")
#include "third_party/acl/inc/acl/acl_base.h"
#else
#include <acl/acl_base.h>
#endif

namespace c10_npu {

// The message of the last AscendCL error of this thread (empty when there was none).
C10_NPU_API const char* c10_npu_get_error_message();
// Raises for err != ACL_SUCCESS, naming `expr` and the error code.
[[noreturn]] C10_NPU_API void raise_acl_error(aclError err, const char* expr, const char* file, int line);

}  // namespace c10_npu

#define NPU_CHECK_ERROR(err_code, ...)                                            \
  do {                                                                            \
    auto npu_check_error_status_ = (err_code);                                    \
    if (npu_check_error_status_ != ACL_SUCCESS) {                                 \
      ::c10_npu::raise_acl_error(npu_check_error_status_, #err_code, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
