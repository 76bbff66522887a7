#pragma once

// torch_npu's FFT plan cache (torch.npu.backends.fft_plan_cache): a process-wide LRU list of
// the plans the FFT operators (_fft_c2c, _fft_r2c, _fft_c2r and their out= forms) use, one per
// distinct transform, capacity 10 by default (1 to 99).
//
// A plan here is the transform's description (kind, signal sizes, direction, dtype). The
// transforms themselves run through ATen's CPU FFT on the host aliases of the npu tensors,
// which plans each call itself; the cache records the plans a device would hold, with
// torch_npu's size / capacity / eviction / clear semantics.

#include <c10/core/ScalarType.h>
#include <cstdint>
#include <vector>

namespace torch_npu::ops::fft_plan_cache {

enum class Kind : int8_t { C2C, R2C, C2R };

struct PlanKey {
  Kind kind;
  std::vector<int64_t> signal_sizes;  // the transformed dimensions' sizes (c2r: the output's)
  bool forward;
  c10::ScalarType dtype;  // the input's
  bool operator==(const PlanKey& other) const {
    return kind == other.kind && signal_sizes == other.signal_sizes && forward == other.forward &&
           dtype == other.dtype;
  }
};

// Looks the plan up (it becomes the most recently used) or creates it, evicting the least
// recently used plan when the cache is full.
void use(const PlanKey& key);
int64_t size();
int64_t max_size();
// 1 <= n <= 99 (checked: the error names the argument); drops the least recently used plans
// beyond n.
void set_max_size(int64_t n);
void clear();

}  // namespace torch_npu::ops::fft_plan_cache
