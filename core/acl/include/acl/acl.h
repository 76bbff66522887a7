// AscendCL's umbrella header, as torch_npu's C++ extensions include it: the base types
// (acl_base.h) and the runtime API of the NPU simulator (acl_rt.h: aclInit, aclFinalize,
// devices, memory, streams, events).
#pragma once

#include "acl_base.h"
#include "acl_rt.h"
