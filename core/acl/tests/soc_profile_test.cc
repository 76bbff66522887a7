// ASCEND_SIM_SOC selects a profile; an empty ASCEND_RT_VISIBLE_DEVICES means "all";
// ASCEND_SIM_HBM_BYTES accepts suffixes.
#include "check.h"

int main() {
  setenv("ASCEND_SIM_SOC", "Ascend310P3", 1);
  setenv("ASCEND_RT_VISIBLE_DEVICES", "", 1);
  setenv("ASCEND_SIM_DEVICE_COUNT", "3", 1);
  setenv("ASCEND_SIM_HBM_BYTES", "1536MiB", 1);

  uint32_t n = 0;
  CHECK_OK(aclrtGetDeviceCount(&n));
  CHECK(n == 3);
  CHECK(strcmp(aclrtGetSocName(), "Ascend310P3") == 0);
  CHECK(aclsimDeviceCapacity(2) == (size_t(1536) << 20));
  size_t free_b = 0, total = 0;
  CHECK_OK(aclrtSetDevice(2));
  CHECK_OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total));
  CHECK(total == (size_t(1536) << 20) && free_b == total);
  void* p = nullptr;
  CHECK_RC(aclrtMalloc(&p, size_t(2) << 30, ACL_MEM_MALLOC_HUGE_FIRST),
           ACL_ERROR_RT_MEMORY_ALLOCATION);
  CHECK(Contains(aclGetRecentErrMsg(), "device 2"));
  return Finish();
}
