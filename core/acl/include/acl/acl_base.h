// Base types and error codes of the NPU simulator's ACL-style C API (AscendCL's
// acl/acl_base.h names and values). acl_rt.h includes it; torch_npu's wheel ships both
// (torch_npu/include/third_party/acl/inc/acl/) for C++ extensions.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef int aclError;
typedef void* aclrtStream;
typedef void* aclrtEvent;

// Error codes (values as in AscendCL).
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_STREAM_CONTEXT 107003
#define ACL_ERROR_RT_EVENT_NOT_RECORDED 107009  // elapsed time on an unrecorded event
#define ACL_ERROR_RT_DEVICE_TASK_ABORT 107022  // a task dropped by a device task abort (stop_device)
#define ACL_ERROR_RT_CAPTURE_DEPENDENCY 107024  // a capture would wait for work outside it
#define ACL_ERROR_RT_STREAM_CAPTURED 107027     // not allowed on a capturing stream
#define ACL_ERROR_RT_EVENT_CAPTURED 107028      // the event's latest record is being captured
#define ACL_ERROR_RT_STREAM_NOT_CAPTURED 107029 // capture end on a stream that does not capture
#define ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT 107030  // unsafe call while a capture forbids it
#define ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT 107031   // the default stream joining a capture
#define ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED 107036  // capture end on a joined stream
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_STREAM_TASK_FULL 207013   // not used by the simulator
#define ACL_ERROR_RT_AICORE_EXCEPTION 507015   // a task failed on a stream
#define ACL_ERROR_RT_INTERNAL_ERROR 507899
#define ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED 507903  // the capture failed earlier

#ifdef __cplusplus
}
#endif
