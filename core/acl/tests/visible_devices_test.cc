// ASCEND_RT_VISIBLE_DEVICES / ASCEND_SIM_DEVICE_COUNT / ASCEND_SIM_SOC handling.
// The environment is read once, at the first API call: set it before (BUILD's `env`
// sets the same values; main() sets them too so the binary also runs standalone).
#include "check.h"

int main() {
  setenv("ASCEND_SIM_DEVICE_COUNT", "4", 1);
  // 3 and 1 are valid physical ids; "x", 99, -1 are invalid; the second 3 is a duplicate.
  setenv("ASCEND_RT_VISIBLE_DEVICES", " 3,1 ,x,99,3,-1", 1);
  setenv("ASCEND_SIM_SOC", "ascend910b4", 1);  // matched case-insensitively
  unsetenv("ASCEND_SIM_HBM_BYTES");

  // Before the runtime starts, aclsimVisibleDeviceCount reads the environment on each call
  // and starts nothing.
  CHECK(aclsimRuntimeStarted() == 0);
  CHECK(aclsimVisibleDeviceCount() == 2);
  setenv("ASCEND_RT_VISIBLE_DEVICES", "0", 1);
  CHECK(aclsimVisibleDeviceCount() == 1);
  unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  CHECK(aclsimVisibleDeviceCount() == 4);
  setenv("ASCEND_RT_VISIBLE_DEVICES", " 3,1 ,x,99,3,-1", 1);
  CHECK(aclsimRuntimeStarted() == 0);

  uint32_t n = 0;
  CHECK_OK(aclrtGetDeviceCount(&n));
  CHECK(n == 2);
  CHECK(aclsimRuntimeStarted() == 1);
  CHECK(strcmp(aclrtGetSocName(), "Ascend910B4") == 0);
  CHECK(aclsimDeviceCapacity(0) == (size_t(32) << 30));
  CHECK(aclsimDeviceCapacity(1) == (size_t(32) << 30));
  CHECK(aclsimDeviceCapacity(2) == 0);
  CHECK_OK(aclrtSetDevice(1));
  CHECK_RC(aclrtSetDevice(2), ACL_ERROR_RT_INVALID_DEVICEID);
  CHECK(Contains(aclGetRecentErrMsg(), "2 visible devices"));

  // Changing the environment after the first call has no effect.
  setenv("ASCEND_SIM_DEVICE_COUNT", "8", 1);
  unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  CHECK_OK(aclrtGetDeviceCount(&n));
  CHECK(n == 2);
  CHECK(aclsimVisibleDeviceCount() == 2);  // the runtime's, once it started

  void* p = nullptr;
  CHECK_OK(aclrtMalloc(&p, 1 << 20, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK(aclsimPointerDevice(p) == 1);
  CHECK_OK(aclrtFree(p));
  return Finish();
}
