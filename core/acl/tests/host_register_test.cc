// aclrtHostRegister / aclrtHostUnregister: registered host memory is device memory of the
// current device for copies, memsets, kernels and aclsimPointerDevice, costs no device
// memory, and stops being device memory when unregistered; bad arguments fail.
#include <stdint.h>

#include "check.h"

static const size_t kMiB = size_t(1) << 20;

static size_t FreeBytes() {
  size_t f = 0, t = 0;
  aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
  return f;
}

static int AddOne(void* data, char*, size_t) {
  float* p = static_cast<float*>(data);
  for (int i = 0; i < 256; ++i) p[i] += 1.0f;
  return 0;
}

static void TestRegisterUseUnregister() {
  CHECK_OK(aclrtSetDevice(1));
  const size_t free_before = FreeBytes();
  void* host = nullptr;
  CHECK_OK(aclrtMallocHost(&host, kMiB));
  CHECK(aclsimPointerDevice(host) == -1);
  void* dev = nullptr;
  CHECK_OK(aclrtHostRegister(host, kMiB, ACL_HOST_REGISTER_MAPPED, &dev));
  CHECK(dev == host);
  CHECK(aclsimPointerDevice(dev) == 1);
  CHECK(aclsimPointerDevice(static_cast<char*>(dev) + kMiB - 1) == 1);
  CHECK(aclsimPointerDevice(static_cast<char*>(dev) + kMiB) == -1);
  CHECK(FreeBytes() == free_before);  // host memory: no device memory used

  float src[256];
  for (int i = 0; i < 256; ++i) src[i] = static_cast<float>(i);
  CHECK_OK(aclrtMemcpy(dev, sizeof(src), src, sizeof(src), ACL_MEMCPY_HOST_TO_DEVICE));
  aclrtStream s = nullptr;
  CHECK_OK(aclrtCreateStream(&s));
  CHECK_OK(aclsimLaunchKernel(s, AddOne, dev, "add_one"));
  CHECK_OK(aclrtSynchronizeStream(s));
  float out[256] = {};
  CHECK_OK(aclrtMemcpy(out, sizeof(out), dev, sizeof(out), ACL_MEMCPY_DEVICE_TO_HOST));
  CHECK(out[0] == 1.0f && out[255] == 256.0f);
  CHECK(static_cast<float*>(host)[7] == 8.0f);  // the same bytes, seen from the host
  // A copy running past the registered range is refused.
  CHECK_RC(aclrtMemcpy(static_cast<char*>(dev) + kMiB - 4, 8, src, 8, ACL_MEMCPY_HOST_TO_DEVICE),
           ACL_ERROR_INVALID_PARAM);

  // Overlapping registrations and device memory are refused.
  void* again = nullptr;
  CHECK_RC(aclrtHostRegister(static_cast<char*>(host) + 64, 64, ACL_HOST_REGISTER_MAPPED, &again),
           ACL_ERROR_INVALID_PARAM);
  void* d = nullptr;
  CHECK_OK(aclrtMalloc(&d, kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_RC(aclrtHostRegister(d, kMiB, ACL_HOST_REGISTER_MAPPED, &again), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtFree(d));

  CHECK_RC(aclrtHostUnregister(static_cast<char*>(host) + 64), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtHostUnregister(host));
  CHECK(aclsimPointerDevice(host) == -1);
  CHECK_RC(aclrtMemcpy(host, 8, src, 8, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtHostUnregister(host), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtFreeHost(host));
  CHECK_OK(aclrtDestroyStream(s));
  CHECK_OK(aclrtSetDevice(0));
}

static void TestBadArguments() {
  char buf[64];
  void* dev = nullptr;
  CHECK_RC(aclrtHostRegister(nullptr, 64, ACL_HOST_REGISTER_MAPPED, &dev), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtHostRegister(buf, 0, ACL_HOST_REGISTER_MAPPED, &dev), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtHostRegister(buf, 64, ACL_HOST_REGISTER_MAPPED, nullptr), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtHostRegister(buf, 64, static_cast<aclrtHostRegisterType>(7), &dev), ACL_ERROR_INVALID_PARAM);
  CHECK(strstr(aclGetRecentErrMsg(), "invalid type") != nullptr);
  CHECK_RC(aclrtHostUnregister(nullptr), ACL_ERROR_INVALID_PARAM);
}

int main() {
  setenv("ASCEND_SIM_HBM_BYTES", "64M", 1);
  setenv("ASCEND_SIM_DEVICE_COUNT", "2", 1);
  unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  TestRegisterUseUnregister();
  TestBadArguments();
  return Finish();
}
