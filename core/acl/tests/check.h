// Tiny test helpers (no gtest here): CHECK keeps going, REQUIRE stops the test.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "acl/acl_rt.h"

static std::atomic<int> g_passed{0}, g_failed{0};

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (cond) {                                                                  \
      ++g_passed;                                                                \
    } else {                                                                     \
      ++g_failed;                                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                            \
  } while (0)

#define CHECK_EQ(a, b)                                                             \
  do {                                                                             \
    const auto va_ = (a);                                                          \
    const auto vb_ = (b);                                                          \
    if (va_ == vb_) {                                                              \
      ++g_passed;                                                                  \
    } else {                                                                       \
      ++g_failed;                                                                  \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n",    \
                   __FILE__, __LINE__, #a, #b, static_cast<long long>(va_),         \
                   static_cast<long long>(vb_));                                    \
    }                                                                              \
  } while (0)

// Expects `expr` to return `code`; prints the recent error message otherwise.
#define CHECK_RC(expr, code)                                                     \
  do {                                                                           \
    aclError rc_ = (expr);                                                       \
    if (rc_ == (code)) {                                                         \
      ++g_passed;                                                                \
    } else {                                                                     \
      ++g_failed;                                                                \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d (recent error: %s)\n", \
              __FILE__, __LINE__, #expr, rc_, (int)(code), aclGetRecentErrMsg()); \
    }                                                                            \
  } while (0)

#define CHECK_OK(expr) CHECK_RC(expr, ACL_SUCCESS)

#define REQUIRE(cond)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      fprintf(stderr, "%d passed, %d failed\n", g_passed.load(), g_failed.load() + 1); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static inline bool Contains(const char* s, const char* sub) {
  return s != nullptr && strstr(s, sub) != nullptr;
}

// Resident set size in bytes (includes shared/memfd pages), from /proc/self/statm.
static inline size_t RssBytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  fclose(f);
  return resident * (size_t)sysconf(_SC_PAGESIZE);
}

static inline int Finish() {
  printf("%d passed, %d failed\n", g_passed.load(), g_failed.load());
  return g_failed.load() == 0 ? 0 : 1;
}
