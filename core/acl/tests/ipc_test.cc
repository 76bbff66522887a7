// Inter-process memory sharing: a forked child (which had not used the runtime before the
// fork) imports memory the parent exported, sees the parent's bytes and writes bytes the
// parent sees; pid validation; same-process import; argument errors.
#include <stdint.h>
#include <sys/wait.h>

#include <string>

#include "check.h"

static const size_t kMiB = size_t(1) << 20;

static bool ReadAll(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

// The child: reads two keys from `in`; imports the first (allowed), checks the parent's
// pattern, adds 1 to every byte, closes; the second key must be refused. Exit code 0 = ok.
static int Child(int in) {
  char allowed[ACL_IPC_HANDLE_SIZE], refused[ACL_IPC_HANDLE_SIZE];
  if (!ReadAll(in, allowed, sizeof allowed) || !ReadAll(in, refused, sizeof refused)) return 10;
  if (aclrtSetDevice(0) != ACL_SUCCESS) return 11;
  void* p = nullptr;
  if (aclrtIpcMemImportByKey(&p, allowed, ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS) != ACL_SUCCESS) return 12;
  std::string host(kMiB, 0);
  if (aclrtMemcpy(&host[0], kMiB, p, kMiB, ACL_MEMCPY_DEVICE_TO_HOST) != ACL_SUCCESS) return 13;
  for (size_t i = 0; i < kMiB; ++i)
    if (host[i] != static_cast<char>(i % 251)) return 14;
  for (auto& c : host) c = static_cast<char>(c + 1);
  if (aclrtMemcpy(p, kMiB, host.data(), kMiB, ACL_MEMCPY_HOST_TO_DEVICE) != ACL_SUCCESS) return 15;
  if (aclrtIpcMemClose(allowed) != ACL_SUCCESS) return 16;
  void* q = nullptr;
  if (aclrtIpcMemImportByKey(&q, refused, 0) != ACL_ERROR_INVALID_PARAM) return 17;
  if (!Contains(aclGetRecentErrMsg(), "not allowed to import")) return 18;
  return 0;
}

static void TestAcrossProcesses() {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[1]);
    _exit(Child(fds[0]));
  }
  close(fds[0]);
  CHECK_OK(aclrtSetDevice(0));
  void* mem = nullptr;
  CHECK_OK(aclrtMalloc(&mem, 4 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  std::string host(kMiB, 0);
  for (size_t i = 0; i < kMiB; ++i) host[i] = static_cast<char>(i % 251);
  char* shared = static_cast<char*>(mem) + 2 * kMiB;
  CHECK_OK(aclrtMemcpy(shared, kMiB, host.data(), kMiB, ACL_MEMCPY_HOST_TO_DEVICE));
  char allowed[ACL_IPC_HANDLE_SIZE], refused[ACL_IPC_HANDLE_SIZE];
  CHECK_OK(aclrtIpcMemGetExportKey(shared, kMiB, allowed, sizeof allowed, ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT));
  int32_t pid = child;
  CHECK_OK(aclrtIpcMemSetImportPid(allowed, &pid, 1));
  CHECK_OK(aclrtIpcMemGetExportKey(mem, kMiB, refused, sizeof refused, ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT));
  CHECK(write(fds[1], allowed, sizeof allowed) == static_cast<ssize_t>(sizeof allowed));
  CHECK(write(fds[1], refused, sizeof refused) == static_cast<ssize_t>(sizeof refused));
  close(fds[1]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  std::string back(kMiB, 0);
  CHECK_OK(aclrtMemcpy(&back[0], kMiB, shared, kMiB, ACL_MEMCPY_DEVICE_TO_HOST));
  bool incremented = true;
  for (size_t i = 0; i < kMiB; ++i) incremented &= back[i] == static_cast<char>(i % 251 + 1);
  CHECK(incremented);
  CHECK_OK(aclrtIpcMemClose(allowed));  // exporter side: withdraws the key (and its pid list)
  CHECK_OK(aclrtIpcMemClose(refused));
  CHECK_RC(aclrtIpcMemSetImportPid(allowed, &pid, 1), ACL_ERROR_INVALID_PARAM);
  CHECK_OK(aclrtFree(mem));
}

static void TestSameProcessAndErrors() {
  CHECK_OK(aclrtSetDevice(1));
  void* mem = nullptr;
  CHECK_OK(aclrtMalloc(&mem, 2 * kMiB, ACL_MEM_MALLOC_HUGE_FIRST));
  char key[ACL_IPC_HANDLE_SIZE];
  CHECK_OK(aclrtIpcMemGetExportKey(mem, 2 * kMiB, key, sizeof key,
                                   ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION));
  void *a = nullptr, *b = nullptr;
  CHECK_OK(aclrtIpcMemImportByKey(&a, key, 0));
  CHECK_OK(aclrtIpcMemImportByKey(&b, key, 0));  // the same mapping, counted twice
  CHECK(a == b && a != mem);
  CHECK_OK(aclrtMemset(mem, 2 * kMiB, 7, 2 * kMiB));
  CHECK_EQ(static_cast<char*>(a)[2 * kMiB - 1], 7);
  CHECK_OK(aclrtMemcpy(a, 16, "imported memory", 16, ACL_MEMCPY_HOST_TO_DEVICE));  // a device pointer
  CHECK(memcmp(mem, "imported memory", 16) == 0);
  CHECK_RC(aclrtMemcpy(static_cast<char*>(a) + 2 * kMiB - 8, 16, "0123456789abcdef", 16,
                       ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);  // past its end
  // A range that does not start on a page (a small block of the caching allocator).
  char inner[ACL_IPC_HANDLE_SIZE];
  char* unaligned = static_cast<char*>(mem) + 1000;
  CHECK_OK(aclrtIpcMemGetExportKey(unaligned, 100, inner, sizeof inner,
                                   ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION));
  void* c = nullptr;
  CHECK_OK(aclrtIpcMemImportByKey(&c, inner, 0));
  CHECK_EQ(static_cast<char*>(c)[0], 7);
  CHECK_OK(aclrtMemcpy(c, 6, "inner", 6, ACL_MEMCPY_HOST_TO_DEVICE));
  CHECK(memcmp(unaligned, "inner", 6) == 0);
  CHECK_RC(aclrtMemcpy(static_cast<char*>(c) + 96, 8, "01234567", 8, ACL_MEMCPY_HOST_TO_DEVICE),
           ACL_ERROR_INVALID_PARAM);  // past its end, though inside the mapped page
  CHECK_OK(aclrtIpcMemClose(inner));  // unmapped
  CHECK_OK(aclrtIpcMemClose(inner));  // withdrawn
  int32_t pid = 1;
  CHECK_RC(aclrtIpcMemSetImportPid(key, &pid, 1), ACL_ERROR_INVALID_PARAM);  // no validation to configure
  CHECK_OK(aclrtIpcMemClose(key));
  CHECK_OK(aclrtIpcMemClose(key));   // second import released: unmapped
  CHECK_OK(aclrtIpcMemClose(key));   // then the exporter's withdrawal
  CHECK_RC(aclrtIpcMemClose(key), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "neither exported nor imported"));

  char small[8];
  CHECK_RC(aclrtIpcMemGetExportKey(mem, kMiB, small, sizeof small, 1), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "too small"));
  CHECK_RC(aclrtIpcMemGetExportKey(mem, 4 * kMiB, key, sizeof key, 1), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "not inside one aclrtMalloc allocation"));
  char host[64];
  CHECK_RC(aclrtIpcMemGetExportKey(host, 8, key, sizeof key, 1), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtIpcMemGetExportKey(mem, kMiB, key, sizeof key, 5), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtIpcMemImportByKey(&a, "not a key", 0), ACL_ERROR_INVALID_PARAM);
  CHECK_RC(aclrtIpcMemImportByKey(&a, "aclsim-ipc:999999999:0:3:0:2097152:0", 0), ACL_ERROR_INVALID_PARAM);
  CHECK(Contains(aclGetRecentErrMsg(), "gone"));
  CHECK_RC(aclrtIpcMemImportByKey(&a, "aclsim-ipc:1:7:3:0:2097152:0", 0), ACL_ERROR_RT_INVALID_DEVICEID);
  CHECK_OK(aclrtFree(mem));
}

int main() {
  setenv("ASCEND_SIM_DEVICE_COUNT", "2", 1);
  setenv("ASCEND_SIM_HBM_BYTES", "64M", 1);
  TestAcrossProcesses();
  TestSameProcessAndErrors();
  return Finish();
}
