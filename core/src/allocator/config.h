// Sizes of the caching allocator and its configuration: the PYTORCH_NPU_ALLOC_CONF keys,
// their defaults and validation (torch_npu's NPUAllocatorConfig).
#pragma once

#include <torch_npu/core/npu_caching_allocator.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace torch_npu::NPUCachingAllocator::detail {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingAllocator::StatTypes;
using c10::CachingDeviceAllocator::BlockInfo;

constexpr size_t kMinBlockSize = 512;             // every size is a multiple of this
constexpr size_t kSmallSize = 1048576;            // largest "small" request (1 MiB)
constexpr size_t kSmallBuffer = 2097152;          // segment size of the small pool
constexpr size_t kLargeBuffer = 20971520;         // segment for requests < kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10485760;       // requests from here get their own size
constexpr size_t kRoundLarge = 2097152;           // large segments round up to this
constexpr size_t kMaxRequest = 1ULL << 60;        // 1 EiB: beyond is always an OOM
constexpr size_t kMB = 1048576;
constexpr int kMaxWorkerScan = 32;                // pending-marker blocks a worker skips

const char* const kConfEnv = "PYTORCH_NPU_ALLOC_CONF";

// ---------------------------------------------------------------------------------
// Configuration (PYTORCH_NPU_ALLOC_CONF)
// ---------------------------------------------------------------------------------

// torch_npu pads every request by this much before rounding it (its AddPadSize: only an
// Ascend950 with CANN >= 9.1.0 drops the padding; no simulated SoC is one).
constexpr size_t kPadSize = 32;
// roundup_power2_divisions covers 16 power-of-two intervals from 1 MiB: interval i holds
// the sizes in [2^i MiB, 2^(i+1) MiB) (the first also everything below, the last
// everything above), as c10's AcceleratorAllocatorConfig that torch_npu uses.
constexpr size_t kRoundUpPowerOfTwoIntervals = 16;
constexpr size_t kRoundUpPowerOfTwoStartLog2 = 20;  // 1 MiB

inline size_t floor_log2(size_t v) { return 63 - static_cast<size_t>(__builtin_clzll(v)); }

struct Config {
  size_t max_split_size = std::numeric_limits<size_t>::max();
  // max_non_split_rounding_mb: a free block of at least max_split_size serves a request
  // of at least max_split_size only when it is less than this much bigger (default: the
  // large segment size).
  size_t max_non_split_rounding_size = kLargeBuffer;
  // large_segment_size_mb: the segment of a request in (1 MiB, 10 MiB), and the page of
  // the large pool's expandable segments.
  size_t large_segment_size = kLargeBuffer;
  // segment_size_mb (deprecated by torch_npu): the page of the large pool's expandable
  // segments when large_segment_size_mb is not set; 0: unset.
  size_t segment_size = 0;
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  size_t base_addr_aligned_kb = 16;  // accepted (real torch_npu key); no effect here
  bool page_size_1g = false;         // accepted (real torch_npu key); no effect here
  // per_process_memory_fraction: set_per_process_memory_fraction for every device; < 0: unset.
  double memory_fraction = -1.0;
  // throw_on_npumalloc_oom (torch_npu): a segment allocation past the memory fraction is
  // rejected before reaching the driver and counted in num_oom_rejections. The fraction
  // check itself always applies here (the simulator's driver never aborts).
  bool throw_on_npumalloc_oom = false;
  // roundup_power2_divisions: the divisions of each interval (0 or 1: plain 512 B rounding).
  std::vector<size_t> divisions = std::vector<size_t>(kRoundUpPowerOfTwoIntervals, 0);
  // The pinned-host allocator's (npu_hooks.cpp), as CUDA's: blocks larger than
  // pinned_max_cached_size go back to the host when freed instead of being cached;
  // requests up to both limits are rounded up to a power of two (more reuse).
  size_t pinned_max_cached_size = std::numeric_limits<size_t>::max();
  size_t pinned_max_round_threshold = std::numeric_limits<size_t>::max();
  // pin_memory_expandable_segments: torch_npu's expandable pinned-host pool. The pinned
  // allocator here is the same either way; as in torch_npu, NPUGraph capture refuses it.
  bool pin_memory_expandable_segments = false;

  size_t roundup_divisions(size_t size) const {
    const size_t log = floor_log2(size);
    size_t index = log > kRoundUpPowerOfTwoStartLog2 ? log - kRoundUpPowerOfTwoStartLog2 : 0;
    index = std::min(index, kRoundUpPowerOfTwoIntervals - 1);
    return divisions[index];
  }

  // The page of the large pool's expandable segments: large_segment_size_mb if set, else
  // segment_size_mb if set, else 20 MiB (torch_npu's get_custom_expandable_segment_size).
  size_t expandable_large_page() const {
    if (large_segment_size != kLargeBuffer) return large_segment_size;
    return segment_size > 0 ? segment_size : kLargeBuffer;
  }
};

inline bool is_pow2(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Parses a PYTORCH_NPU_ALLOC_CONF string; keys it does not set keep their value in `prev`
// (torch.npu.memory._set_allocator_settings) or their default.
Config parse_config(const std::string& conf, const Config* prev = nullptr);

}  // namespace torch_npu::NPUCachingAllocator::detail
