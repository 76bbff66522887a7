#include "torch_npu/ops/fft_plan_cache.h"

#include <c10/util/Exception.h>
#include <algorithm>
#include <list>
#include <mutex>

namespace torch_npu::ops::fft_plan_cache {
namespace {

constexpr int64_t kDefaultCapacity = 10;  // torch_npu's
constexpr int64_t kMinCapacity = 1;
constexpr int64_t kMaxCapacity = 99;

struct Cache {
  std::mutex mutex;
  int64_t capacity = kDefaultCapacity;
  std::list<PlanKey> plans;  // least recently used first
};

Cache& cache() {
  static Cache* c = new Cache();  // outlives every thread that runs an FFT
  return *c;
}

}  // namespace

void use(const PlanKey& key) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = std::find(c.plans.begin(), c.plans.end(), key);
  if (it != c.plans.end()) {
    c.plans.splice(c.plans.end(), c.plans, it);
    return;
  }
  while (static_cast<int64_t>(c.plans.size()) >= c.capacity) c.plans.pop_front();
  c.plans.push_back(key);
}

int64_t size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return static_cast<int64_t>(c.plans.size());
}

int64_t max_size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.capacity;
}

void set_max_size(int64_t n) {
  TORCH_CHECK(n >= kMinCapacity && n <= kMaxCapacity, "invalid value of cache_size, expected ", kMinCapacity,
              " to ", kMaxCapacity, ", got ", n);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.capacity = n;
  while (static_cast<int64_t>(c.plans.size()) > c.capacity) c.plans.pop_front();
}

void clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.plans.clear();
}

}  // namespace torch_npu::ops::fft_plan_cache
