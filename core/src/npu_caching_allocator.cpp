// NPU caching allocator: CUDA caching-allocator semantics on top of the simulator's
// aclrtMalloc/aclrtFree (or its virtual memory API with expandable segments). See
// npu_caching_allocator.h for the public contract.
//
// Structure (one DeviceCachingAllocator per device, each with its own mutex):
//  - A *segment* is one aclrtMalloc'ed range. It is carved into *blocks* kept in a
//    doubly linked list (prev/next) in address order. Free blocks live in one of two
//    pools (small: requests <= 1 MiB, 2 MiB segments; large: everything else), each an
//    ordered set keyed by (stream, size, address) so a best-fit lookup for a stream is a
//    lower_bound.
//  - Sizes are torch_npu's: a request is padded by 32 bytes and rounded up to 512 bytes
//    (or to its roundup_power2_divisions step), so a request is small up to 1 MiB - 32.
//  - malloc: process completed record_stream events, best-fit search, otherwise
//    aclrtMalloc a new segment; on failure release cached blocks (first only what is
//    needed among oversize blocks, then every unsplit cached segment) and retry, then
//    raise torch.OutOfMemoryError. A found block is split when the remainder is big
//    enough; frees coalesce with free neighbours.
//  - expandable_segments:True (CUDA's ExpandableSegment): instead of aclrtMalloc'ed
//    segments, each stream and pool gets a reserved virtual range (aclrtReserveMemAddress)
//    that grows by mapping pages of physical memory (2 MiB in the small pool, the large
//    segment size, 20 MiB by default, in the large one, as torch_npu; aclrtMallocPhysical +
//    aclrtMapMem) where the request needs them, merging them with the free blocks
//    around. Releasing cached memory (empty_cache, the OOM retry, gc) unmaps the whole
//    pages of free blocks, wherever they are, and a later request maps memory again at
//    the end of a range: free memory is never stranded between allocated segments.
//    Unmapped ranges are blocks too (mapped == false), in the pool's `unmapped` set.
//    Reserved bytes are mapped bytes; a "segment" (stats, snapshot) is a mapped run.
//  - record_stream: at free time an event is recorded on every other stream that used
//    the block; the block returns to its pool once all of them completed (checked
//    lazily at the next malloc, or waited for by empty_cache / the OOM path).
//  - Graph capture (CUDA's private pools): while a stream captures into an NPUGraph,
//    host allocations on the streams of that capture come from the graph's private pool
//    (its own small and large BlockPools, plain aclrtMalloc'ed segments), and blocks freed
//    there are reused only by captures into the same pool, in capture order. A pool lives
//    while a graph uses it (use_count); released, its free segments go back to the device
//    and the rest follows as the tensors holding them are freed. A block of a capturing
//    stream outside the pool, or used by a capturing stream, freed during a capture is
//    freed once the captures of the device ended (no event can be recorded on a
//    capturing stream, and it refuses queries).
//  - Free markers (no CUDA counterpart): a block freed while its stream still has queued
//    work gets an event recorded on that stream (unless a task of that stream frees it). The simulator's aclrtFree, unlike
//    cudaFree, does not synchronise (nor does aclrtUnmapMem), so memory is only
//    aclrtFree'd or unmapped once its markers completed (empty_cache / OOM / gc wait
//    for them). And since kernels here allocate at
//    *execution* time on stream workers, not at enqueue time like the host, a worker
//    allocation only reuses blocks whose marker completed (else a kernel queued before a
//    host free could be handed memory that later-queued kernels still read). Host
//    allocations reuse freed blocks at once, exactly as CUDA's allocator does.
//
// Threading: the allocator is called from host threads and from the simulator's stream
// worker threads (kernels allocate their outputs). Nothing blocks while holding a device
// mutex: waiting for events drops the lock, and worker threads never wait (they only
// consume events that already completed) since the event they would wait for may sit
// behind the kernel they are running.
#include <torch_npu/core/npu_caching_allocator.h>
#include <torch_npu/core/npu_stream.h>
#include <torch_npu/core/npu_task_queue.h>
#include <torch_npu/core/npu_trace.h>

#include <acl/acl_rt.h>

#include <c10/core/Allocator.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace torch_npu::NPUCachingAllocator {

namespace {

// attachAllocatorTraceTracker: callbacks that see every trace entry of every device, with
// or without the memory history; called under the device allocator's lock.
struct TraceTrackers {
  std::mutex mu;
  std::vector<AllocatorTraceTracker> callbacks;
  std::atomic<bool> any{false};
};
TraceTrackers& trace_trackers() {
  static auto* t = new TraceTrackers();
  return *t;
}
bool trace_tracked() { return trace_trackers().any.load(std::memory_order_acquire); }

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

size_t floor_log2(size_t v) { return 63 - static_cast<size_t>(__builtin_clzll(v)); }

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

bool is_pow2(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Splits on `sep` at bracket depth 0.
std::vector<std::string> split_top(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == sep && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Parses a whole non-negative integer; false on anything else.
bool parse_uint(const std::string& s, size_t* out) {
  if (s.empty() || s.size() > 18) return false;
  size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<size_t>(c - '0');
  }
  *out = v;
  return true;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0) return false;
  *out = v;
  return true;
}

[[noreturn]] void conf_error(const std::string& key, const std::string& value,
                             const std::string& expected) {
  TORCH_CHECK(false, kConfEnv, ": invalid value '", value, "' for key '", key,
              "': expected ", expected, ".");
}

// As c10's AcceleratorAllocatorConfig (torch_npu's parser) and its error texts: a single
// power of 2 sets every interval; a list [<size_mb>:<divisions>, ..., >:<divisions>] sets
// the interval holding <size_mb> MiB, the first entry also every interval below it, and
// `>` every interval after the previous entry's.
void parse_roundup(const std::string& value, Config* c) {
  const std::string key = "roundup_power2_divisions";
  const char* expected =
      "a power of 2 (e.g. roundup_power2_divisions:4) or a list of "
      "<size_mb>:<divisions> (e.g. [256:1,512:2,>:4])";
  auto& table = c->divisions;
  if (value.empty() || value.front() != '[') {
    size_t d = 0;
    if (!parse_uint(value, &d)) conf_error(key, value, expected);
    TORCH_CHECK_VALUE(is_pow2(d), "For roundups, the divisions has to be power of 2 ");
    std::fill(table.begin(), table.end(), d);
    return;
  }
  if (value.back() != ']') conf_error(key, value, expected);
  const std::string body = value.substr(1, value.size() - 2);
  size_t last_index = 0;
  bool first_value = true;
  for (const auto& item_raw : split_top(body, ',')) {
    const std::string item = trim(item_raw);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string::npos) conf_error(key, value, expected);
    const std::string k = trim(item.substr(0, colon));
    const std::string v = trim(item.substr(colon + 1));
    size_t d = 0;
    if (!parse_uint(v, &d)) conf_error(key, value, expected);
    TORCH_CHECK_VALUE(d == 0 || is_pow2(d),
                      "For roundups, the divisions has to be power of 2 or 0 to disable roundup ");
    if (k == ">") {
      std::fill(table.begin() + static_cast<std::ptrdiff_t>(std::min(last_index + 1, table.size())),
                table.end(), d);
      continue;
    }
    size_t boundary = 0;
    if (!parse_uint(k, &boundary)) conf_error(key, value, expected);
    TORCH_CHECK_VALUE(is_pow2(boundary), "For roundups, the intervals have to be power of 2 ");
    const size_t index = std::min(floor_log2(boundary), table.size() - 1);
    if (first_value) {
      std::fill(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(index), d);
      first_value = false;
    }
    table[index] = d;
    last_index = index;
  }
}

// A whole number of MiB (too large values saturate, as c10's).
size_t parse_mb(const std::string& key, const std::string& value) {
  size_t mb = 0;
  if (!parse_uint(value, &mb)) conf_error(key, value, "an integer number of MiB");
  return mb;
}

size_t mb_to_bytes(size_t mb) {
  return std::min(mb, std::numeric_limits<size_t>::max() / kMB) * kMB;
}

// `prev`: the configuration in use (allocator settings changed at run time), whose segment
// sizes stay unless `conf` sets them (c10's parser does not reset them either).
Config parse_config(const std::string& conf, const Config* prev = nullptr) {
  Config c;
  if (prev != nullptr) {
    c.large_segment_size = prev->large_segment_size;
    c.max_non_split_rounding_size = prev->large_segment_size;
    c.segment_size = prev->segment_size;
  }
  const std::string all = trim(conf);
  if (all.empty()) return c;
  std::vector<std::pair<std::string, std::string>> options;
  for (const auto& opt_raw : split_top(all, ',')) {
    const std::string opt = trim(opt_raw);
    if (opt.empty()) continue;
    const auto colon = opt.find(':');
    TORCH_CHECK(colon != std::string::npos, kConfEnv, ": option '", opt,
                "' is not of the form key:value (options are comma-separated "
                "key:value pairs, e.g. max_split_size_mb:128,expandable_segments:False).");
    options.emplace_back(trim(opt.substr(0, colon)), trim(opt.substr(colon + 1)));
  }
  // large_segment_size_mb first: the lower bounds of max_split_size_mb and
  // max_non_split_rounding_mb are the large segment size (as c10's parser).
  for (const auto& [key, value] : options) {
    if (key != "large_segment_size_mb") continue;
    const size_t min_mb = kMinLargeAlloc / kMB;
    const size_t mb = parse_mb(key, value);
    TORCH_CHECK_VALUE(mb > min_mb, "CachingAllocator option large_segment_size_mb must be > ",
                      min_mb, " MB");
    c.large_segment_size = mb_to_bytes(mb);
  }
  c.max_non_split_rounding_size = c.large_segment_size;
  bool segment_size_set = false;
  for (const auto& [key, value] : options) {
    if (key == "large_segment_size_mb") {
      continue;  // above
    } else if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
      const size_t min_mb = c.large_segment_size / kMB;
      const size_t mb = parse_mb(key, value);
      TORCH_CHECK_VALUE(mb >= min_mb, "CachingAllocator option ", key, " too small, must be >= ",
                        min_mb);
      (key == "max_split_size_mb" ? c.max_split_size : c.max_non_split_rounding_size) =
          mb_to_bytes(mb);
    } else if (key == "segment_size_mb") {
      TORCH_WARN_ONCE("`segment_size_mb` is deprecated, please use `large_segment_size_mb` instead.");
      size_t mb = 0;
      TORCH_CHECK(parse_uint(value, &mb), "CachingAllocator option segment_size_mb is invalid.");
      TORCH_CHECK(mb >= 20 && mb <= 512,
                  "CachingAllocator option segment_size_mb error, must be [20, 512], dtype is int");
      c.segment_size = mb * kMB;
      segment_size_set = true;
    } else if (key == "garbage_collection_threshold") {
      double t = 0;
      if (!parse_double(value, &t)) conf_error(key, value, "a number in (0.0, 1.0)");
      TORCH_CHECK_VALUE(t > 0.0 && t < 1.0,
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
      c.garbage_collection_threshold = t;
    } else if (key == "expandable_segments") {
      if (value == "True") {
        c.expandable_segments = true;
      } else if (value == "False") {
        c.expandable_segments = false;
      } else {
        conf_error(key, value, "True or False");
      }
    } else if (key == "roundup_power2_divisions") {
      parse_roundup(value, &c);
    } else if (key == "base_addr_aligned_kb") {
      size_t kb = 0;
      if (!parse_uint(value, &kb) || kb > 16) {
        conf_error(key, value, "an integer between 0 and 16");
      }
      c.base_addr_aligned_kb = kb;
    } else if (key == "page_size") {
      std::string v = value;
      for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (v != "1g" && v != "1gb") conf_error(key, value, "1g");
      c.page_size_1g = true;
    } else if (key == "per_process_memory_fraction") {
      double f = 0;
      if (!parse_double(value, &f) || !(f >= 0.0 && f <= 1.0)) {
        conf_error(key, value, "a number in [0.0, 1.0]");
      }
      c.memory_fraction = f;
    } else if (key == "throw_on_npumalloc_oom") {
      if (value == "True") {
        c.throw_on_npumalloc_oom = true;
      } else if (value == "False") {
        c.throw_on_npumalloc_oom = false;
      } else {
        conf_error(key, value, "True or False");
      }
    } else if (key == "pin_memory_expandable_segments") {
      if (value != "True" && value != "False") conf_error(key, value, "True or False");
      c.pin_memory_expandable_segments = value == "True";
    } else if (key == "multi_stream_lazy_reclaim" || key == "release_lock_on_npumalloc" ||
               key == "pinned_mem_register") {
      // Real torch_npu keys that only tune locking, event reclaim and host pinning, which the
      // simulator does not model: validated and accepted, no effect.
      if (value != "True" && value != "False") conf_error(key, value, "True or False");
    } else if (key == "pinned_max_cached_size_mb" || key == "pinned_max_round_threshold_mb") {
      size_t mb = 0;
      if (!parse_uint(value, &mb) || mb == 0) conf_error(key, value, "a positive integer number of MiB");
      const size_t bytes = mb > std::numeric_limits<size_t>::max() / kMB ? std::numeric_limits<size_t>::max()
                                                                          : mb * kMB;
      (key == "pinned_max_cached_size_mb" ? c.pinned_max_cached_size : c.pinned_max_round_threshold) = bytes;
    } else if (key == "pinned_reserve_segment_size_mb") {
      size_t mb = 0;  // accepted like the keys above; no effect
      if (!parse_uint(value, &mb)) conf_error(key, value, "an integer number of MiB");
    } else {
      TORCH_CHECK(false, kConfEnv, ": unrecognized key '", key,
                  "'. Expected one of: max_split_size_mb, max_non_split_rounding_mb, "
                  "large_segment_size_mb, segment_size_mb, garbage_collection_threshold, "
                  "expandable_segments, roundup_power2_divisions, base_addr_aligned_kb, "
                  "page_size, per_process_memory_fraction, throw_on_npumalloc_oom, multi_stream_lazy_reclaim, "
                  "release_lock_on_npumalloc, pinned_mem_register, "
                  "pin_memory_expandable_segments, pinned_reserve_segment_size_mb, pinned_max_cached_size_mb, "
                  "pinned_max_round_threshold_mb.");
    }
  }
  if (c.large_segment_size != kLargeBuffer && segment_size_set) {
    TORCH_WARN_ONCE(
        "Both `segment_size_mb` and `large_segment_size_mb` are set. "
        "`segment_size_mb` is deprecated. It is recommended to use only `large_segment_size_mb`.");
  }
  return c;
}

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

std::string format_size(uint64_t size) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (size <= 1024) {
    os << size << " bytes";
  } else if (size <= 1048576) {
    os << (static_cast<double>(size) / 1024.0) << " KiB";
  } else if (size <= 1073741824ULL) {
    os << (static_cast<double>(size) / 1048576.0) << " MiB";
  } else {
    os << (static_cast<double>(size) / 1073741824.0) << " GiB";
  }
  return os.str();
}

// Makes `device` current on this thread for the scope (no-op if it already is).
class DeviceSwitch {
 public:
  explicit DeviceSwitch(c10::DeviceIndex device) {
    int32_t cur = -1;
    if (aclrtGetDevice(&cur) != ACL_SUCCESS) cur = -1;
    prev_ = cur;
    if (cur != device) {
      NPU_CHECK(aclrtSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceSwitch() {
    if (switched_ && prev_ >= 0) (void)aclrtSetDevice(prev_);
  }
  DeviceSwitch(const DeviceSwitch&) = delete;
  DeviceSwitch& operator=(const DeviceSwitch&) = delete;

 private:
  int32_t prev_ = -1;
  bool switched_ = false;
};

// Events used by record_stream, recycled per device (never destroyed: an event may be
// waited on with no allocator lock held).
class EventPool {
 public:
  aclrtEvent get(c10::DeviceIndex device) {
    aclrtEvent e = try_get(device);
    if (e == nullptr) {
      DeviceSwitch sw(device);
      NPU_CHECK(aclrtCreateEvent(&e));  // reports the simulator's error
    }
    return e;
  }
  // nullptr if no event could be created.
  aclrtEvent try_get(c10::DeviceIndex device) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto& v = free_[device];
      if (!v.empty()) {
        aclrtEvent e = v.back();
        v.pop_back();
        return e;
      }
    }
    int32_t prev = -1;
    if (aclrtGetDevice(&prev) != ACL_SUCCESS) prev = -1;
    if (prev != device && aclrtSetDevice(device) != ACL_SUCCESS) return nullptr;
    aclrtEvent e = nullptr;
    if (aclrtCreateEvent(&e) != ACL_SUCCESS) e = nullptr;
    if (prev != device && prev >= 0) (void)aclrtSetDevice(prev);
    return e;
  }
  void put(c10::DeviceIndex device, aclrtEvent e) {
    std::lock_guard<std::mutex> g(mu_);
    free_[device].push_back(e);
  }

 private:
  std::mutex mu_;
  std::unordered_map<c10::DeviceIndex, std::vector<aclrtEvent>> free_;
};

EventPool& event_pool() {
  static auto* p = new EventPool();  // leaked on purpose (used until process exit)
  return *p;
}

// A stream that used a block (record_stream), resolved to its simulator handle.
struct StreamUse {
  aclrtStream stream;
  c10::DeviceIndex device;
  bool operator==(const StreamUse& o) const { return stream == o.stream; }
};

// ---------------------------------------------------------------------------------
// Blocks and pools
// ---------------------------------------------------------------------------------

struct BlockPool;
struct PrivatePool;
class ExpandableSegment;

struct Block {
  c10::DeviceIndex device;
  aclrtStream stream;  // allocation stream (all blocks of a segment share it)
  size_t size;
  size_t requested_size = 0;
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  int event_count = 0;               // outstanding record_stream events
  // Free marker: recorded on `stream` when the block was freed while the stream still
  // had queued work. Until it completes, that work may still touch the memory, so the
  // block may be reused by host-side (enqueue-time) allocations only, not by kernels
  // allocating at execution time on a stream worker, and it may not be aclrtFree'd.
  // A merged block keeps the newest marker (markers of one stream complete in order).
  aclrtEvent free_event = nullptr;
  uint64_t free_event_seq = 0;
  std::vector<StreamUse> stream_uses;  // streams recorded since allocation
  int64_t gc_count_base = 0;         // pool's get_free_block count when it entered the pool
  // Blocks of an expandable segment cover its whole address range; the unmapped ranges
  // are blocks too (mapped == false), kept in the pool's `unmapped` set.
  ExpandableSegment* expandable = nullptr;
  bool mapped = true;
  // Memory history (recordHistory): the stack of the allocation (of the free once freed,
  // when contexts of frees are recorded), and on a segment's first block the stack of
  // the segment's allocation.
  std::shared_ptr<c10::GatheredContext> context_when_allocated;
  std::shared_ptr<c10::GatheredContext> context_when_segment_allocated;

  Block(c10::DeviceIndex d, aclrtStream s, size_t sz, BlockPool* p, char* pt)
      : device(d), stream(s), size(sz), pool(p), ptr(pt) {}

  // Shares its mapped range (what the snapshot reports as a segment) with other blocks.
  bool is_split() const { return (prev && prev->mapped) || (next && next->mapped); }
  // In the pool, free for reuse or merging.
  bool is_free() const {
    return mapped && !allocated && event_count == 0 && stream_uses.empty();
  }
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    const auto sa = reinterpret_cast<uintptr_t>(a->stream);
    const auto sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

// Unmapped blocks by stream, then address.
struct BlockAddressLess {
  bool operator()(const Block* a, const Block* b) const {
    const auto sa = reinterpret_cast<uintptr_t>(a->stream);
    const auto sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BlockLess> blocks;
  std::set<Block*, BlockAddressLess> unmapped;  // of expandable segments
  const bool is_small;
  PrivatePool* owner = nullptr;  // the graph pool it belongs to, or nullptr
  int64_t get_free_blocks_call_count = 0;

  void insert(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    blocks.insert(b);
  }
  int64_t gc_count(const Block* b) const { return get_free_blocks_call_count - b->gc_count_base; }
};

// The memory of one or more NPUGraph captures (see the header comment).
struct PrivatePool {
  explicit PrivatePool(MempoolId_t id) : id(id), large(false), small(true) {
    large.owner = this;
    small.owner = this;
  }
  MempoolId_t id;
  BlockPool large;
  BlockPool small;
  int use_count = 1;    // graphs, MemPools (and captures under way) using it
  size_t segments = 0;  // aclrtMalloc'ed segments it holds
  bool use_on_oom = false;  // MemPool(use_on_oom=True): a last resort of other allocations
  bool no_split = false;    // MemPool(no_split=True): blocks are handed out whole
  std::shared_ptr<CustomAllocator> allocator;  // MemPool(allocator=...): serves its segments
};

// ---------------------------------------------------------------------------------
// Memory history settings (recordHistory), shared by the devices
// ---------------------------------------------------------------------------------

struct HistorySettings {
  std::atomic<bool> enabled{false};
  std::atomic<CreateContextFn> recorder{nullptr};
  std::atomic<int> when{static_cast<int>(RecordContext::NEVER)};
};

HistorySettings& history() {
  static auto* h = new HistorySettings();  // leaked on purpose (used until exit)
  return *h;
}

// The context (stack) of the calling thread if history records contexts at `level`.
// Never on stream workers: they run kernels, not user code.
std::shared_ptr<c10::GatheredContext> maybe_gather_context(RecordContext level) {
  HistorySettings& h = history();
  if (!h.enabled.load(std::memory_order_relaxed) ||
      h.when.load(std::memory_order_relaxed) < static_cast<int>(level)) {
    return nullptr;
  }
  CreateContextFn recorder = h.recorder.load(std::memory_order_acquire);
  if (recorder == nullptr || aclsimOnWorkerThread()) return nullptr;
  return recorder();
}

bool record_context_at(RecordContext level) {
  return history().when.load(std::memory_order_relaxed) >= static_cast<int>(level);
}

// True while `stream` takes part in a capture (it then refuses queries).
bool stream_capturing(aclrtStream stream) {
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  return aclmdlRICaptureGetInfo(stream, &status, nullptr) == ACL_SUCCESS &&
         status != ACL_MODEL_RI_CAPTURE_STATUS_NONE;
}

struct AllocParams {
  AllocParams(c10::DeviceIndex device, size_t size, aclrtStream stream, BlockPool* pool,
              size_t alloc_size)
      : search_key(device, stream, size, pool, nullptr), pool(pool), alloc_size(alloc_size) {}
  c10::DeviceIndex device() const { return search_key.device; }
  aclrtStream stream() const { return search_key.stream; }
  size_t size() const { return search_key.size; }

  Block search_key;
  BlockPool* pool;
  size_t alloc_size;
  Block* block = nullptr;
  StatTypes stat_types = {false};
  bool on_worker = false;  // allocating at execution time from a stream worker
  std::shared_ptr<c10::GatheredContext> context;  // memory history
};

// ---------------------------------------------------------------------------------
// Expandable segments (expandable_segments:True)
// ---------------------------------------------------------------------------------

aclrtPhysicalMemProp physical_prop(c10::DeviceIndex device) {
  aclrtPhysicalMemProp prop = {};
  prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
  prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
  prop.memAttr = ACL_HBM_MEM_HUGE;
  prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<uint32_t>(device);
  return prop;
}

// A virtual address range reserved for one stream and pool, backed on demand page by
// page. As torch_npu's, a page of the small pool is 2 MiB and one of the large pool the
// large segment size (20 MiB unless large_segment_size_mb or segment_size_mb say
// otherwise), rounded up to aclrtMemGetAllocationGranularity. Each page has its own physical handle
// so that any free page can be unmapped on its own and its memory mapped again
// wherever it is needed. The range is 1 1/8 of the device's capacity (as CUDA's), so a
// segment can keep growing at its end after pages in its middle were unmapped.
class ExpandableSegment {
 public:
  // nullptr when the address space cannot be reserved.
  static ExpandableSegment* create(c10::DeviceIndex device, size_t page_size) {
    aclrtPhysicalMemProp prop = physical_prop(device);
    size_t granularity = 0;
    NPU_CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM,
                                               &granularity));
    const size_t page = (std::max(page_size, granularity) + granularity - 1) / granularity * granularity;
    const size_t capacity = aclsimDeviceCapacity(device);
    const size_t pages = (capacity + capacity / 8 + page - 1) / page;
    void* ptr = nullptr;
    if (aclrtReserveMemAddress(&ptr, pages * page, 0, nullptr, 0) != ACL_SUCCESS) {
      return nullptr;
    }
    return new ExpandableSegment(device, static_cast<char*>(ptr), page, pages);
  }

  ~ExpandableSegment() { (void)aclrtReleaseMemAddress(ptr_); }  // everything is unmapped

  char* ptr() const { return ptr_; }
  size_t size() const { return handles_.size() * page_; }
  size_t round_up(size_t size) const { return (size + page_ - 1) / page_ * page_; }

  // Maps the pages covering [p, p + size) (p page aligned, all unmapped). False (nothing
  // mapped) when the device is out of memory.
  bool map(char* p, size_t size) {
    const size_t first = page_index(p), last = page_index(p + round_up(size));
    for (size_t i = first; i < last; ++i) {
      const aclError err = map_page(i);
      if (err != ACL_SUCCESS) {
        for (size_t j = first; j < i; ++j) unmap_page(j);
        if (err == ACL_ERROR_RT_MEMORY_ALLOCATION) return false;
        NPU_CHECK(err);
      }
    }
    return true;
  }

  // The pages entirely inside [p, p + size): {first byte, bytes} (bytes 0: none).
  std::pair<char*, size_t> whole_pages(char* p, size_t size) const {
    const size_t first = page_index(p + page_ - 1), last = page_index(p + size);
    return {ptr_ + first * page_, last > first ? (last - first) * page_ : 0};
  }

  // Unmaps whole_pages(p, size) and frees their memory; returns that range.
  std::pair<char*, size_t> unmap(char* p, size_t size) {
    const auto range = whole_pages(p, size);
    for (size_t i = page_index(range.first); i < page_index(range.first + range.second); ++i) {
      unmap_page(i);
    }
    return range;
  }

 private:
  ExpandableSegment(c10::DeviceIndex device, char* ptr, size_t page, size_t pages)
      : device_(device), ptr_(ptr), page_(page), handles_(pages, nullptr) {}

  size_t page_index(const char* p) const { return static_cast<size_t>(p - ptr_) / page_; }

  aclError map_page(size_t i) {
    const aclrtPhysicalMemProp prop = physical_prop(device_);
    aclrtDrvMemHandle h = nullptr;
    aclError err = aclrtMallocPhysical(&h, page_, &prop, 0);
    if (err != ACL_SUCCESS) return err;
    err = aclrtMapMem(ptr_ + i * page_, page_, 0, h, 0);
    if (err != ACL_SUCCESS) {
      (void)aclrtFreePhysical(h);
      return err;
    }
    handles_[i] = h;
    return ACL_SUCCESS;
  }

  // Like aclrtFree, unmapping does not synchronise: callers only unmap memory no queued
  // work can touch any more (see the free markers).
  void unmap_page(size_t i) {
    NPU_CHECK(aclrtUnmapMem(ptr_ + i * page_));
    NPU_CHECK(aclrtFreePhysical(handles_[i]));
    handles_[i] = nullptr;
  }

  const c10::DeviceIndex device_;
  char* const ptr_;
  const size_t page_;
  std::vector<aclrtDrvMemHandle> handles_;  // one per page, nullptr while unmapped
};

// ---------------------------------------------------------------------------------
// Per-device allocator
// ---------------------------------------------------------------------------------

class DeviceCachingAllocator {
 public:
  DeviceCachingAllocator(c10::DeviceIndex device, const Config* config)
      : device_(device), config_(config), large_(false), small_(true) {}

  std::mutex& mutex() { return mutex_; }

  Block* malloc(size_t orig_size, aclrtStream stream) {
    // Gathered before locking: it may wait for the GIL.
    auto context = maybe_gather_context(RecordContext::STATE);
    std::unique_lock<std::mutex> lock(mutex_);
    if (orig_size >= kMaxRequest) {
      stats_.num_ooms += 1;
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       "NPU out of memory. Tried to allocate more than 1EB memory.");
    }
    process_events();

    const size_t size = round_size(orig_size);
    const bool on_worker = aclsimOnWorkerThread() != 0;
    // Kernels allocate at execution time: never from a graph pool (what they allocate
    // is theirs, freed when they finish).
    BlockPool* pool = captures_.empty() || on_worker ? nullptr : capture_pool(stream, size);
    if (pool == nullptr) pool = size <= kSmallSize ? &small_ : &large_;
    AllocParams params(device_, size, stream, pool, allocation_size(size));
    params.stat_types = stat_types_for(*pool);
    params.on_worker = on_worker;
    params.context = context;

    bool found = get_free_block(params);
    if (!found) {
      if (set_fraction_ && config_->garbage_collection_threshold > 0.0) {
        garbage_collect_cached_blocks(lock);
      }
      found = alloc_block(params, false) ||
              (release_available_cached_blocks(params, lock) && alloc_block(params, false)) ||
              (release_cached_blocks(lock) && alloc_block(params, true));
    }
    if (!found && pool->owner == nullptr) found = get_free_block_of_oom_pools(params);
    if (!found && !on_worker && !in_kernel() && captures_.empty()) {
      // Tensors the host has freed may still be held by kernels queued before the free
      // (a task keeps its operands' storages until the host collects it): let them run
      // and go, then try again.
      lock.unlock();
      wait_device(device_);
      collect_finished_kernels();
      lock.lock();
      process_events();
      // (Part of the same request: not another retry in the statistics.)
      found = get_free_block(params) || alloc_block(params, false) ||
              (release_cached_blocks(lock) && alloc_block(params, false));
    }
    if (!found) {
      raise_oom(params.alloc_size, stream, params.context);  // throws
    }
    TORCH_INTERNAL_ASSERT(params.block != nullptr && params.block->ptr != nullptr);
    Block* block = alloc_found_block(params, orig_size, should_split(params.block, params.size()));
    block->context_when_allocated = std::move(context);
    if (C10_UNLIKELY(record_history_ || trace_tracked())) {
      record_trace(TraceEntry::ALLOC, block->ptr, orig_size, block->stream, *block->pool,
                   record_context_at(RecordContext::ALLOC) ? block->context_when_allocated : nullptr);
    }
    return block;
  }

  // Every free records a free marker when the block's stream has queued work (see the
  // header comment): queued kernels borrow the memory of the storages they use
  // (NPUCachingAllocator::freesInStreamOrder), so a block may be freed while they can
  // still touch it.
  void free(Block* block) {
    auto context = maybe_gather_context(RecordContext::ALL);
    std::lock_guard<std::mutex> lock(mutex_);
    if (C10_UNLIKELY(record_history_ || trace_tracked())) {
      record_trace(TraceEntry::FREE_REQUESTED, block->ptr, block->requested_size, block->stream,
                   *block->pool, context ? context : block->context_when_allocated);
    }
    block->context_when_allocated = std::move(context);
    block->allocated = false;
    const StatTypes types = stat_types_for(*block->pool);
    for_each_type(types, [&](size_t t) {
      stats_.allocation[t].decrease(1);
      stats_.allocated_bytes[t].decrease(block->size);
      stats_.requested_bytes[t].decrease(block->requested_size);
    });
    if (block->size >= config_->max_split_size) stats_.oversize_allocations.decrease(1);
    const auto size = block->size;
    const auto ptr = block->ptr;
    PrivatePool* owner = block->pool->owner;
    if (!captures_.empty() && capture_touches(block)) {
      if (owner != nullptr && block->stream_uses.empty() && stream_capturing(block->stream)) {
        free_block(block);  // reused by this capture's later allocations, in capture order
      } else {
        deferred_frees_.push_back(block);
      }
    } else {
      release_block_to_pool(block);
    }
    if (owner != nullptr && owner->use_count == 0) release_unused_pool(owner);
    c10::reportMemoryUsageToProfiler(
        ptr, -static_cast<int64_t>(size),
        static_cast<size_t>(stats_.allocated_bytes[0].current),
        static_cast<size_t>(stats_.reserved_bytes[0].current),
        c10::Device(c10::DeviceType::PrivateUse1, device_));
  }

  // ---- graph pools (NPUGraph capture) ----------------------------------------------

  void begin_allocate_to_pool(MempoolId_t id, std::function<bool(aclrtStream)> filter) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graph_pools_.find(id);
    if (it == graph_pools_.end()) {
      graph_pools_.emplace(id, std::make_unique<PrivatePool>(id));
    } else {
      it->second->use_count += 1;
    }
    captures_.emplace_back(id, std::move(filter));
  }

  void end_allocate_to_pool(MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = captures_.begin(); it != captures_.end(); ++it) {
      if (it->first == id) {
        captures_.erase(it);
        break;
      }
    }
    if (!captures_.empty()) return;
    std::vector<Block*> deferred;
    deferred.swap(deferred_frees_);
    for (Block* block : deferred) {
      if (capture_touches(block)) {  // a stream still captures (its capture ends later)
        deferred_frees_.push_back(block);
        continue;
      }
      PrivatePool* owner = block->pool->owner;
      release_block_to_pool(block);
      if (owner != nullptr && owner->use_count == 0) release_unused_pool(owner);
    }
  }

  void release_pool(MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graph_pools_.find(id);
    TORCH_CHECK(it != graph_pools_.end(), "NPU caching allocator: no graph memory pool (", id.first, ", ",
                id.second, ") on device ", static_cast<int>(device_));
    PrivatePool* pool = it->second.get();
    TORCH_INTERNAL_ASSERT(pool->use_count > 0);
    if (--pool->use_count == 0) release_unused_pool(pool);
  }

  // (use_count, segments) of a graph pool, for tests; (-1, 0) when it does not exist.
  std::pair<int, size_t> pool_info(MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graph_pools_.find(id);
    if (it == graph_pools_.end()) return {-1, 0};
    return {it->second->use_count, it->second->segments};
  }

  // torch.npu.MemPool: a private pool that exists as long as the MemPool holds it.
  void create_or_incref_pool(MempoolId_t id, bool use_on_oom, bool no_split,
                             std::shared_ptr<CustomAllocator> allocator) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graph_pools_.find(id);
    PrivatePool* pool = nullptr;
    if (it == graph_pools_.end()) {
      pool = graph_pools_.emplace(id, std::make_unique<PrivatePool>(id)).first->second.get();
    } else {
      pool = it->second.get();
      pool->use_count += 1;
    }
    pool->use_on_oom = pool->use_on_oom || use_on_oom;
    pool->no_split = pool->no_split || no_split;
    if (allocator) {
      TORCH_CHECK(pool->segments == 0 || pool->allocator == allocator,
                  "MemPool: pool (", id.first, ", ", id.second, ") already holds memory of another allocator");
      pool->allocator = std::move(allocator);
    }
  }

  // Returns the free cached segments of pool `id` to the device (memory tensors still
  // hold stays in the pool).
  void empty_pool_cache(MempoolId_t id) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (graph_pools_.find(id) == graph_pools_.end()) return;
    wait_before_release(lock, true, [&](const Block* b) {
      return b->pool->owner != nullptr && b->pool->owner->id == id;
    });
    process_events();
    auto it = graph_pools_.find(id);  // looked up again: the lock was dropped
    if (it == graph_pools_.end()) return;
    release_blocks(it->second->large);
    release_blocks(it->second->small);
    prune_pools();
  }

  // ---- memory history ----------------------------------------------------------------

  void record_history(bool enabled, size_t max_entries) {
    std::lock_guard<std::mutex> lock(mutex_);
    record_history_ = enabled;
    trace_max_ = std::max<size_t>(max_entries, 1);
    if (!enabled) {
      trace_.clear();
      trace_next_ = 0;
      auto drop = [](Block* b) {
        b->context_when_allocated.reset();
        b->context_when_segment_allocated.reset();
      };
      for (Block* b : active_blocks_) drop(b);
      for (BlockPool* pool : all_pools()) {
        for (Block* b : pool->blocks) drop(b);
      }
    } else {
      // Re-enabled, maybe with another size: the newest entries, oldest first.
      std::vector<TraceEntry> kept = ordered_trace();
      const size_t drop = kept.size() > trace_max_ ? kept.size() - trace_max_ : 0;
      trace_.assign(kept.begin() + static_cast<std::ptrdiff_t>(drop), kept.end());
      trace_next_ = 0;
    }
  }

  // The recorded entries, oldest first.
  std::vector<TraceEntry> traces() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ordered_trace();
  }

  void record_stream(Block* block, StreamUse use) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (use.stream == block->stream) return;
    if (std::find(block->stream_uses.begin(), block->stream_uses.end(), use) ==
        block->stream_uses.end()) {
      block->stream_uses.push_back(use);
    }
  }

  // torch_npu.erase_stream: forget a record_stream use of an allocated block, so that
  // freeing it does not wait for `use`'s stream.
  void erase_stream(Block* block, StreamUse use) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& uses = block->stream_uses;
    uses.erase(std::remove(uses.begin(), uses.end(), use), uses.end());
  }

  void empty_cache() {
    std::unique_lock<std::mutex> lock(mutex_);
    release_cached_blocks(lock);
  }

  size_t graph_pool_count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return graph_pools_.size();
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats s = stats_;
    s.max_split_size = static_cast<int64_t>(config_->max_split_size);
    return s;
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (StatArray* a : stat_arrays()) {
      for (auto& s : *a) s.reset_accumulated();
    }
    stats_.oversize_allocations.reset_accumulated();
    stats_.oversize_segments.reset_accumulated();
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_sync_all_streams = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
    stats_.num_oom_rejections = 0;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (StatArray* a : stat_arrays()) {
      for (auto& s : *a) s.reset_peak();
    }
    stats_.oversize_allocations.reset_peak();
    stats_.oversize_segments.reset_peak();
  }

  void set_memory_fraction(double fraction) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t total = aclsimDeviceCapacity(device_);
    allowed_memory_maximum_ =
        static_cast<size_t>(fraction * static_cast<double>(total));
    set_fraction_ = true;
  }

  // Segments of every pool, or only of pool `only` unless it is {0, 0}.
  void snapshot(std::vector<SegmentInfo>* out, MempoolId_t only = {0, 0}) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (record_history_ || trace_tracked()) {
      record_trace(TraceEntry::SNAPSHOT, nullptr, static_cast<size_t>(stats_.active_bytes[0].current),
                   nullptr, large_, nullptr);
    }
    const bool filter = only != MempoolId_t{0, 0};
    // A segment is a mapped run of blocks: a whole aclrtMalloc'ed segment, or a maximal
    // mapped range of an expandable segment (as CUDA reports them).
    auto is_head = [](const Block* b) { return b->prev == nullptr || !b->prev->mapped; };
    std::vector<const Block*> heads;
    for (const BlockPool* pool : all_pools()) {
      for (const Block* b : pool->blocks) {
        if (is_head(b)) heads.push_back(b);
      }
    }
    for (const Block* b : active_blocks_) {
      if (is_head(b)) heads.push_back(b);
    }
    std::sort(heads.begin(), heads.end(), [](const Block* a, const Block* b) {
      return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
    });
    for (const Block* head : heads) {
      const PrivatePool* owner = head->pool->owner;
      if (filter && (owner == nullptr || owner->id != only)) continue;
      SegmentInfo seg;
      seg.device = device_;
      if (owner != nullptr) seg.owner_private_pool_id = owner->id;
      seg.context_when_allocated = head->context_when_segment_allocated;
      seg.address = reinterpret_cast<size_t>(head->ptr);
      seg.stream = head->stream;
      seg.is_large = !head->pool->is_small;
      seg.is_expandable = head->expandable != nullptr;
      for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
        BlockInfo bi;
        bi.size = b->size;
        bi.requested_size = b->requested_size;
        bi.allocated = b->allocated;
        bi.active = b->allocated || b->event_count > 0 || !b->stream_uses.empty();
        bi.gc_counter = static_cast<int32_t>(b->pool->gc_count(b));
        bi.context_when_allocated = b->context_when_allocated;
        seg.total_size += bi.size;
        if (bi.allocated) seg.allocated_size += bi.size;
        if (bi.active) {
          seg.active_size += bi.size;
          seg.requested_size += bi.requested_size;
        }
        seg.blocks.push_back(std::move(bi));
      }
      out->push_back(std::move(seg));
    }
  }


 private:
  static const std::shared_ptr<CustomAllocator>& pool_allocator(const BlockPool& pool) {
    static const std::shared_ptr<CustomAllocator> none;
    return pool.owner != nullptr ? pool.owner->allocator : none;
  }

  static MempoolId_t pool_id(const BlockPool& pool) {
    return pool.owner != nullptr ? pool.owner->id : MempoolId_t{0, 0};
  }

  // Appends to the history (a ring of trace_max_ entries). Time: microseconds since the
  // epoch (the snapshot's "time_us").
  void record_trace(TraceEntry::Action action, const void* addr, size_t size, aclrtStream stream,
                    const BlockPool& pool, std::shared_ptr<c10::GatheredContext> context) {
    const bool tracked = trace_tracked();
    if (!record_history_ && !tracked) return;
    TraceEntry entry(action, device_, reinterpret_cast<size_t>(addr), size, stream, pool_id(pool),
                     static_cast<c10::approx_time_t>(c10::getTime() / 1000), std::move(context));
    if (tracked) {
      auto& t = trace_trackers();
      std::lock_guard<std::mutex> lock(t.mu);
      for (const auto& callback : t.callbacks) callback(entry);
    }
    if (!record_history_) return;
    if (trace_.size() < trace_max_) {
      trace_.push_back(std::move(entry));
    } else {
      trace_[trace_next_] = std::move(entry);
      trace_next_ = (trace_next_ + 1) % trace_max_;
    }
  }

  std::vector<TraceEntry> ordered_trace() const {
    std::vector<TraceEntry> out;
    out.reserve(trace_.size());
    for (size_t i = 0; i < trace_.size(); ++i) out.push_back(trace_[(trace_next_ + i) % trace_.size()]);
    return out;
  }

  // MemPool(use_on_oom=True): a free block of such a pool for a request about to fail.
  bool get_free_block_of_oom_pools(AllocParams& p) {
    for (auto& [id, pool] : graph_pools_) {
      if (!pool->use_on_oom) continue;
      BlockPool* alt = p.size() <= kSmallSize ? &pool->small : &pool->large;
      AllocParams q(device_, p.size(), p.stream(), alt, p.alloc_size);
      q.stat_types = stat_types_for(*alt);
      q.on_worker = p.on_worker;
      if (get_free_block(q)) {
        p.pool = alt;
        p.search_key.pool = alt;
        p.stat_types = q.stat_types;
        p.block = q.block;
        return true;
      }
    }
    return false;
  }

  // The pool of the capture `stream` takes part in, or nullptr.
  BlockPool* capture_pool(aclrtStream stream, size_t size) {
    for (auto& [id, filter] : captures_) {
      if (filter(stream)) {
        PrivatePool* pool = graph_pools_.at(id).get();
        return size <= kSmallSize ? &pool->small : &pool->large;
      }
    }
    return nullptr;
  }

  // Freeing `block` now would record an event on, or query, a capturing stream.
  bool capture_touches(const Block* block) const {
    if (stream_capturing(block->stream)) return true;
    for (const StreamUse& u : block->stream_uses) {
      if (stream_capturing(u.stream)) return true;
    }
    return false;
  }

  // The usual end of a free: marker, record_stream events, back to the pool.
  void release_block_to_pool(Block* block) {
    mark_free(block);
    if (!block->stream_uses.empty()) {
      insert_events(block);
    } else {
      free_block(block);
    }
  }

  // A pool no graph uses any more: its free segments go back to the device; the pool is
  // deleted once it holds none.
  void release_unused_pool(PrivatePool* pool) {
    release_blocks(pool->large);
    release_blocks(pool->small);
    prune_pools();
  }

  void prune_pools() {
    for (auto it = graph_pools_.begin(); it != graph_pools_.end();) {
      if (it->second->use_count == 0 && it->second->segments == 0) {
        it = graph_pools_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::vector<BlockPool*> all_pools() {
    std::vector<BlockPool*> pools{&large_, &small_};
    for (auto& [id, pool] : graph_pools_) {
      pools.push_back(&pool->large);
      pools.push_back(&pool->small);
    }
    return pools;
  }

  template <typename F>
  static void for_each_type(const StatTypes& types, F f) {
    for (const auto t : c10::irange(types.size())) {
      if (types[t]) f(t);
    }
  }

  static StatTypes stat_types_for(const BlockPool& pool) {
    StatTypes t = {false};
    t[static_cast<size_t>(StatType::AGGREGATE)] = true;
    t[static_cast<size_t>(pool.is_small ? StatType::SMALL_POOL : StatType::LARGE_POOL)] = true;
    return t;
  }

  std::vector<StatArray*> stat_arrays() {
    return {&stats_.allocation,     &stats_.segment,         &stats_.active,
            &stats_.inactive_split, &stats_.allocated_bytes, &stats_.reserved_bytes,
            &stats_.active_bytes,   &stats_.inactive_split_bytes,
            &stats_.requested_bytes};
  }

  // torch_npu's round_size: the request plus kPadSize, then 512 B multiples, or the next
  // of roundup_power2_divisions steps of its power-of-two interval.
  size_t round_size(size_t size) const {
    size += kPadSize;
    if (size < kMinBlockSize) return kMinBlockSize;
    const size_t divisions = config_->roundup_divisions(size);
    if (divisions > 1 && size > kMinBlockSize * divisions) {
      return roundup_power2_next_division(size, divisions);
    }
    return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
  }

  // Rounds up to the next of `divisions` equal steps between two powers of two.
  static size_t roundup_power2_next_division(size_t size, size_t divisions) {
    if (is_pow2(size)) return size;
    size_t floor2 = size_t{1} << (63 - __builtin_clzll(size));
    const size_t step = floor2 >> (63 - __builtin_clzll(divisions));
    if (step == 0) return floor2 << 1;
    const size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
  }

  size_t allocation_size(size_t size) const {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return config_->large_segment_size;
    return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
  }

  bool should_split(const Block* block, size_t size) const {
    const size_t remaining = block->size - size;
    if (block->pool->owner != nullptr && block->pool->owner->no_split) return false;
    // An expandable segment's remainder is never stranded: its pages can be unmapped
    // and mapped where they are needed, so it is split like a small block (as CUDA's).
    if (block->pool->is_small || block->expandable) return remaining >= kMinBlockSize;
    return size < config_->max_split_size && remaining > kSmallSize;
  }

  bool get_free_block(AllocParams& p) {
    BlockPool& pool = *p.pool;
    if (set_fraction_ && config_->garbage_collection_threshold > 0.0) {
      ++pool.get_free_blocks_call_count;  // ages cached blocks for the gc
    }
    const size_t max_split = config_->max_split_size;
    // Best fit among this stream's blocks. An allocation made by a kernel at execution
    // time skips blocks whose free marker is pending (bounded scan).
    int scanned = 0;
    for (auto it = pool.blocks.lower_bound(&p.search_key);
         it != pool.blocks.end() && (*it)->stream == p.stream(); ++it) {
      Block* b = *it;
      // Don't hand an oversize block to a small request, nor a much bigger oversize
      // block to an oversize request (larger candidates only get worse).
      if (p.size() < max_split && b->size >= max_split) return false;
      if (p.size() >= max_split && b->size - p.size() >= config_->max_non_split_rounding_size) {
        return false;
      }
      if (p.on_worker && !exec_safe(b)) {
        if (++scanned >= kMaxWorkerScan) return false;
        continue;
      }
      p.block = b;  // a pending marker is dropped by alloc_found_block
      pool.blocks.erase(it);
      return true;
    }
    return false;
  }

  // ---- free markers --------------------------------------------------------------

  // Called on every free (any thread); never throws: it runs inside DataPtr deleters.
  void mark_free(Block* block) noexcept {
    // A task of the block's own stream frees what it allocated while running: queued
    // kernels borrow (do not hold) stream-ordered storages, so nothing queued after this
    // task can touch the block. A marker here would complete only after the whole queue,
    // and the task's next temporaries would take fresh segments instead (a training loop
    // reserved 2.4 GiB for a 16 MiB working set).
    if (aclsimOnWorkerOf(block->stream)) return;
    aclrtStreamStatus st = ACL_STREAM_STATUS_COMPLETE;
    if (aclrtStreamQuery(block->stream, &st) == ACL_SUCCESS &&
        st == ACL_STREAM_STATUS_COMPLETE) {
      return;  // nothing queued can still use it
    }
    aclrtEvent ev = event_pool().try_get(device_);
    if (ev == nullptr) return;
    if (aclrtRecordEvent(ev, block->stream) != ACL_SUCCESS) {
      event_pool().put(device_, ev);
      return;
    }
    drop_marker(block);
    block->free_event = ev;
    block->free_event_seq = ++marker_seq_;
  }

  void drop_marker(Block* block) {
    if (block->free_event) {
      event_pool().put(device_, block->free_event);
      block->free_event = nullptr;
      block->free_event_seq = 0;
    }
  }

  // True when no queued work can touch the block any more (its marker completed).
  bool exec_safe(Block* block) {
    if (!block->free_event) return true;
    aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    NPU_CHECK(aclrtQueryEventStatus(block->free_event, &status));
    if (status != ACL_EVENT_RECORDED_STATUS_COMPLETE) return false;
    drop_marker(block);
    return true;
  }

  // dst absorbs src's marker if it is newer than its own.
  void merge_marker(Block* dst, Block* src) {
    if (!src->free_event) return;
    if (!dst->free_event || src->free_event_seq > dst->free_event_seq) {
      drop_marker(dst);
      dst->free_event = src->free_event;
      dst->free_event_seq = src->free_event_seq;
      src->free_event = nullptr;
    } else {
      drop_marker(src);
    }
  }

  // Before returning cached memory to the device: waits (lock dropped) for pending
  // record_stream events if `stream_events`, and for the free markers of releasable
  // cached blocks selected by `pred`. Stream workers never wait (what they would wait
  // for may be queued behind the kernel they run); they release only what is safe.
  template <typename Pred>
  void wait_before_release(std::unique_lock<std::mutex>& lock, bool stream_events,
                           Pred pred) {
    if (aclsimOnWorkerThread()) return;
    std::vector<aclrtEvent> waits;
    if (stream_events) {
      for (const auto& [stream, q] : events_) {
        for (const auto& [ev, pending] : q) {
          waits.push_back(ev);
          if (pending.block->free_event) waits.push_back(pending.block->free_event);
        }
      }
    }
    for (BlockPool* pool : all_pools()) {
      for (Block* b : pool->blocks) {
        if (b->free_event && releasable(b) && pred(b)) waits.push_back(b->free_event);
      }
    }
    if (waits.empty()) return;
    // The events stay valid while unlocked: pooled events are never destroyed, and a
    // reused one only makes the wait longer.
    lock.unlock();
    for (aclrtEvent ev : waits) {
      // A failed kernel still completes the event; its error is reported by the
      // stream's own synchronisation, not here.
      (void)wait_event(ev);
    }
    lock.lock();
  }

  bool alloc_block(AllocParams& p, bool is_retry) {
    if (is_retry) stats_.num_alloc_retries += 1;
    // Graph pools use plain segments: their blocks must keep their addresses.
    if (config_->expandable_segments && p.pool->owner == nullptr) return alloc_expandable_block(p);
    const size_t size = p.alloc_size;
    if (set_fraction_ && total_reserved_ + size > allowed_memory_maximum_) {
      if (config_->throw_on_npumalloc_oom) stats_.num_oom_rejections += 1;
      return false;
    }
    void* ptr = nullptr;
    aclError err;
    {
      DeviceSwitch sw(device_);
      if (const auto& custom = pool_allocator(*p.pool)) {
        ptr = custom->alloc_fn(size, device_, p.stream());  // nullptr: out of memory
        err = ptr != nullptr ? ACL_SUCCESS : ACL_ERROR_RT_MEMORY_ALLOCATION;
      } else {
        err = aclrtMalloc(&ptr, size, ACL_MEM_MALLOC_HUGE_FIRST);
      }
    }
    if (err == ACL_ERROR_RT_MEMORY_ALLOCATION) return false;
    NPU_CHECK(err);
    total_reserved_ += size;
    if (p.pool->owner != nullptr) p.pool->owner->segments += 1;
    p.block = new Block(device_, p.stream(), size, p.pool, static_cast<char*>(ptr));
    p.block->context_when_segment_allocated = p.context;
    record_trace(TraceEntry::SEGMENT_ALLOC, ptr, size, p.stream(), *p.pool, p.context);
    for_each_type(p.stat_types, [&](size_t t) {
      stats_.segment[t].increase(1);
      stats_.reserved_bytes[t].increase(size);
    });
    if (size >= config_->max_split_size) stats_.oversize_segments.increase(1);
    stats_.num_device_alloc += 1;
    return true;
  }

  // ---- expandable segments -----------------------------------------------------------

  // Finds p.size() bytes of address space in one of the stream's expandable segments of
  // the pool (a new segment if none has room) and maps what is unmapped there. Newly
  // mapped pages merge with the free blocks around them, so a request can use memory
  // that separate segments would leave fragmented. False when out of memory.
  bool alloc_expandable_block(AllocParams& p) {
    Block* c = find_expandable_block(p);
    if (c == nullptr) return false;
    if (!c->mapped && !map_block(c, std::min(c->size, p.size()))) {
      if (c->prev == nullptr && c->next == nullptr) release_segment(c);  // a new segment
      return false;
    }
    while (c->size < p.size()) {
      // c is free, merged with its free neighbours: what follows is unmapped.
      Block* next = c->next;
      TORCH_INTERNAL_ASSERT(next != nullptr && !next->mapped);
      if (!map_block(next, std::min(p.size() - c->size, next->size))) return false;
      c = next;  // it absorbed c
    }
    p.pool->blocks.erase(c);
    p.block = c;
    return true;
  }

  // The first of a run of usable blocks (unmapped, or free) of p.size() bytes in an
  // expandable segment of the stream's pool, lowest address first; else a new segment.
  Block* find_expandable_block(const AllocParams& p) {
    // A kernel allocating at execution time only takes free blocks whose free marker
    // completed (see get_free_block).
    auto usable = [&](Block* b) {
      return b != nullptr && (!b->mapped || (b->is_free() && (!p.on_worker || exec_safe(b))));
    };
    auto has_room = [&](Block* b) {
      size_t bytes = 0;
      for (; bytes < p.size() && usable(b); b = b->next) bytes += b->size;
      return bytes >= p.size();
    };
    BlockPool& pool = *p.pool;
    Block key(p.device(), p.stream(), 0, &pool, nullptr);
    for (auto it = pool.unmapped.lower_bound(&key);
         it != pool.unmapped.end() && (*it)->stream == p.stream(); ++it) {
      Block* c = *it;
      // Mapping c merges it with a free block before it: start there, or skip c if
      // that block may not be used.
      if (c->prev != nullptr && c->prev->is_free()) {
        if (!usable(c->prev)) continue;
        c = c->prev;
      }
      if (has_room(c)) return c;
    }
    ExpandableSegment* segment = ExpandableSegment::create(
        device_, pool.is_small ? kSmallBuffer : config_->expandable_large_page());
    if (segment == nullptr) return nullptr;
    Block* c = new Block(device_, p.stream(), segment->size(), &pool, segment->ptr());
    c->expandable = segment;
    c->mapped = false;
    pool.unmapped.insert(c);
    if (c->size < p.size()) {
      release_segment(c);
      return nullptr;
    }
    return c;
  }

  // Maps the pages of unmapped `block` that cover its first `size` bytes. The mapped
  // part becomes a free block merged with its free neighbours; the rest stays unmapped.
  bool map_block(Block* block, size_t size) {
    ExpandableSegment* segment = block->expandable;
    const size_t bytes = segment->round_up(size);
    if (set_fraction_ && total_reserved_ + bytes > allowed_memory_maximum_) {
      if (config_->throw_on_npumalloc_oom) stats_.num_oom_rejections += 1;
      return false;
    }
    if (!segment->map(block->ptr, bytes)) return false;
    record_trace(TraceEntry::SEGMENT_MAP, block->ptr, bytes, block->stream, *block->pool, nullptr);
    BlockPool& pool = *block->pool;
    pool.unmapped.erase(block);
    if (bytes < block->size) {
      Block* rest = new Block(device_, block->stream, block->size - bytes, &pool,
                              block->ptr + bytes);
      rest->expandable = segment;
      rest->mapped = false;
      splice(rest, block, block->next);
      block->size = bytes;
      pool.unmapped.insert(rest);
    }
    const SplitShare neighbours = split_share({block->prev, block->next});
    account_mapping(block, bytes, /*mapped=*/true);
    block->mapped = true;
    insert_free_block(block, neighbours);
    return true;
  }

  // Unmaps the whole pages inside free block `b` of an expandable segment (its free
  // marker, if any, completed). The partial pages at its ends stay mapped as free
  // blocks; a segment left with nothing mapped is released. Returns the bytes unmapped.
  size_t unmap_block(Block* b) {
    TORCH_INTERNAL_ASSERT(b->is_free() && b->free_event == nullptr);
    ExpandableSegment* segment = b->expandable;
    const auto [ptr, bytes] = segment->unmap(b->ptr, b->size);
    if (bytes == 0) return 0;
    record_trace(TraceEntry::SEGMENT_UNMAP, ptr, bytes, b->stream, *b->pool, nullptr);
    BlockPool& pool = *b->pool;
    const SplitShare before = split_share({b});
    pool.blocks.erase(b);
    Block* head = nullptr;
    Block* tail = nullptr;
    if (ptr > b->ptr) {
      head = new Block(device_, b->stream, static_cast<size_t>(ptr - b->ptr), &pool, b->ptr);
      head->expandable = segment;
      splice(head, b->prev, b);
    }
    if (ptr + bytes < b->ptr + b->size) {
      tail = new Block(device_, b->stream, static_cast<size_t>(b->ptr + b->size - ptr - bytes),
                       &pool, ptr + bytes);
      tail->expandable = segment;
      splice(tail, b, b->next);
    }
    b->ptr = ptr;
    b->size = bytes;
    b->mapped = false;
    account_mapping(b, bytes, /*mapped=*/false);
    for (Block* part : {head, tail}) {
      if (part != nullptr) pool.insert(part);
    }
    update_split_stats(pool, before, split_share({head, tail}));
    try_merge_blocks(b, b->prev, pool);
    try_merge_blocks(b, b->next, pool);
    if (b->prev == nullptr && b->next == nullptr) {
      release_segment(b);
    } else {
      pool.unmapped.insert(b);
    }
    return bytes;
  }

  // Stats of mapping (or unmapping) `bytes` as block `b`. Segments are mapped runs (as
  // in the snapshot): a run is created, extended or joined (split, shortened or removed).
  void account_mapping(const Block* b, size_t bytes, bool mapped) {
    const int64_t runs = 1 - static_cast<int64_t>(b->prev != nullptr && b->prev->mapped) -
                         static_cast<int64_t>(b->next != nullptr && b->next->mapped);
    const int64_t segments = mapped ? runs : -runs;
    if (mapped) {
      total_reserved_ += bytes;
      stats_.num_device_alloc += 1;
    } else {
      total_reserved_ -= bytes;
      stats_.num_device_free += 1;
    }
    for_each_type(stat_types_for(*b->pool), [&](size_t t) {
      if (segments > 0) {
        stats_.segment[t].increase(static_cast<size_t>(segments));
      } else if (segments < 0) {
        stats_.segment[t].decrease(static_cast<size_t>(-segments));
      }
      if (mapped) {
        stats_.reserved_bytes[t].increase(bytes);
      } else {
        stats_.reserved_bytes[t].decrease(bytes);
      }
    });
  }

  // Releases an expandable segment with nothing mapped; `whole` is its only block.
  void release_segment(Block* whole) {
    TORCH_INTERNAL_ASSERT(!whole->mapped && whole->prev == nullptr && whole->next == nullptr);
    whole->pool->unmapped.erase(whole);
    delete whole->expandable;
    delete whole;
  }

  // Links `b` between `prev` and `next`.
  static void splice(Block* b, Block* prev, Block* next) {
    b->prev = prev;
    b->next = next;
    if (prev) prev->next = b;
    if (next) next->prev = b;
  }

  Block* alloc_found_block(AllocParams& p, size_t orig_size, bool split_remainder) {
    const size_t size = p.size();
    BlockPool* pool = p.pool;
    Block* block = p.block;
    const bool already_split = block->is_split();
    if (split_remainder) {
      Block* remaining = block;
      block = new Block(device_, p.stream(), size, pool, remaining->ptr);
      block->expandable = remaining->expandable;
      block->prev = remaining->prev;
      if (block->prev) block->prev->next = block;
      block->next = remaining;
      remaining->prev = block;
      remaining->ptr += size;
      remaining->size -= size;
      pool->insert(remaining);
      if (already_split) {
        // An inactive split block shrinks by `size`.
        for_each_type(p.stat_types,
                      [&](size_t t) { stats_.inactive_split_bytes[t].decrease(size); });
      } else {
        // A whole block becomes split: its remainder is a new inactive split block.
        for_each_type(p.stat_types, [&](size_t t) {
          stats_.inactive_split_bytes[t].increase(remaining->size);
          stats_.inactive_split[t].increase(1);
        });
      }
    } else if (already_split) {
      // An inactive split block becomes active as a whole.
      for_each_type(p.stat_types, [&](size_t t) {
        stats_.inactive_split_bytes[t].decrease(block->size);
        stats_.inactive_split[t].decrease(1);
      });
    }
    // The allocated part needs no free marker (a host allocation is ordered after the
    // work it guarded; a worker only got here with a completed one); a split-off
    // remainder keeps it.
    drop_marker(block);
    block->allocated = true;
    block->requested_size = orig_size;
    active_blocks_.insert(block);
    for_each_type(p.stat_types, [&](size_t t) {
      stats_.allocation[t].increase(1);
      stats_.allocated_bytes[t].increase(block->size);
      stats_.active[t].increase(1);
      stats_.active_bytes[t].increase(block->size);
      stats_.requested_bytes[t].increase(block->requested_size);
    });
    if (block->size >= config_->max_split_size) stats_.oversize_allocations.increase(1);
    c10::reportMemoryUsageToProfiler(
        block->ptr, static_cast<int64_t>(block->size),
        static_cast<size_t>(stats_.allocated_bytes[0].current),
        static_cast<size_t>(stats_.reserved_bytes[0].current),
        c10::Device(c10::DeviceType::PrivateUse1, device_));
    return block;
  }

  // Returns `block` (no longer allocated, no pending events) to its pool, merging it
  // with free neighbours.
  void free_block(Block* block) {
    TORCH_INTERNAL_ASSERT(!block->allocated && block->event_count == 0 &&
                          block->stream_uses.empty());
    const size_t original_size = block->size;
    record_trace(TraceEntry::FREE_COMPLETED, block->ptr, block->requested_size, block->stream, *block->pool,
                 block->context_when_allocated);
    const SplitShare neighbours = split_share({block->prev, block->next});
    active_blocks_.erase(block);
    insert_free_block(block, neighbours);
    for_each_type(stat_types_for(*block->pool), [&](size_t t) {
      stats_.active[t].decrease(1);
      stats_.active_bytes[t].decrease(original_size);
    });
  }

  // What free blocks contribute to the inactive-split stats.
  struct SplitShare {
    int64_t blocks = 0;
    int64_t bytes = 0;
  };

  static SplitShare split_share(std::initializer_list<const Block*> blocks) {
    SplitShare share;
    for (const Block* b : blocks) {
      if (b != nullptr && b->is_free() && b->is_split()) {
        share.blocks += 1;
        share.bytes += static_cast<int64_t>(b->size);
      }
    }
    return share;
  }

  void update_split_stats(const BlockPool& pool, SplitShare before, SplitShare after) {
    const int64_t blocks = after.blocks - before.blocks;
    const int64_t bytes = after.bytes - before.bytes;
    for_each_type(stat_types_for(pool), [&](size_t t) {
      if (blocks > 0) {
        stats_.inactive_split[t].increase(static_cast<size_t>(blocks));
      } else if (blocks < 0) {
        stats_.inactive_split[t].decrease(static_cast<size_t>(-blocks));
      }
      if (bytes > 0) {
        stats_.inactive_split_bytes[t].increase(static_cast<size_t>(bytes));
      } else if (bytes < 0) {
        stats_.inactive_split_bytes[t].decrease(static_cast<size_t>(-bytes));
      }
    });
  }

  // Puts free `block` into its pool, merged with its free neighbours, whose split share
  // before `block` became free (or mapped) is `neighbours`.
  void insert_free_block(Block* block, SplitShare neighbours) {
    BlockPool& pool = *block->pool;
    for (Block* candidate : {block->prev, block->next}) {
      try_merge_blocks(block, candidate, pool);
    }
    pool.insert(block);
    update_split_stats(pool, neighbours, split_share({block}));
  }

  // Merges neighbour `src` into `dst` if it is free (or both are unmapped).
  void try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
    if (!src || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
        src->mapped != dst->mapped) {
      return;
    }
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next) dst->next->prev = dst;
    }
    merge_marker(dst, src);
    dst->size += src->size;
    if (src->mapped) {
      pool.blocks.erase(src);
    } else {
      pool.unmapped.erase(src);
    }
    delete src;
  }

  void insert_events(Block* block) {
    std::vector<StreamUse> uses;
    uses.swap(block->stream_uses);
    for (const StreamUse& u : uses) {
      aclrtEvent ev = event_pool().get(u.device);
      {
        DeviceSwitch sw(u.device);
        NPU_CHECK(aclrtRecordEvent(ev, u.stream));
      }
      block->event_count += 1;
      events_[u.stream].emplace_back(ev, PendingEvent{u.device, block});
    }
  }

  struct PendingEvent {
    c10::DeviceIndex device;
    Block* block;
  };

  // Consumes completed record_stream events (in order per stream); a block whose
  // last event completed returns to its pool.
  void process_events() {
    for (auto it = events_.begin(); it != events_.end();) {
      auto& q = it->second;
      while (!q.empty()) {
        auto& [ev, pending] = q.front();
        aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
        NPU_CHECK(aclrtQueryEventStatus(ev, &status));
        if (status != ACL_EVENT_RECORDED_STATUS_COMPLETE) break;
        event_pool().put(pending.device, ev);
        Block* block = pending.block;
        q.pop_front();
        if (--block->event_count == 0) free_block(block);
      }
      it = q.empty() ? events_.erase(it) : std::next(it);
    }
  }

  // Frees enough oversize cached blocks (>= max_split_size) of this stream to fit the
  // request: the smallest single one that is big enough, else the largest ones.
  bool release_available_cached_blocks(const AllocParams& p,
                                       std::unique_lock<std::mutex>& lock) {
    const size_t max_split = config_->max_split_size;
    if (max_split == std::numeric_limits<size_t>::max()) return false;
    BlockPool& pool = *p.pool;
    wait_before_release(lock, false, [&](const Block* b) {
      return b->pool == &pool && b->stream == p.stream() && b->size >= max_split;
    });
    Block key(p.device(), p.stream(), std::max(p.size(), max_split), &pool, nullptr);
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != p.stream()) {
      if (it == pool.blocks.begin()) return false;
      size_t released = 0;
      --it;  // largest block of a stream <= this one
      while (released < key.size && (*it)->size >= max_split &&
             (*it)->stream == p.stream()) {
        auto cur = it;
        const bool first = cur == pool.blocks.begin();
        if (!first) --it;
        Block* b = *cur;
        if (releasable(b) && exec_safe(b)) released += release_free_block(b);
        if (first) break;
      }
      return released >= key.size;
    }
    if (!releasable(*it) || !exec_safe(*it)) return false;
    release_free_block(*it);
    return true;
  }

  // Returns every releasable cached block to the device (after waiting for
  // record_stream events). Always returns true (as CUDA's does).
  bool release_cached_blocks(std::unique_lock<std::mutex>& lock) {
    stats_.num_sync_all_streams += 1;
    wait_before_release(lock, true, [](const Block*) { return true; });
    process_events();
    release_blocks(large_);
    release_blocks(small_);
    // Graph pools only once no graph uses them (their cached blocks are the graphs').
    for (auto& [id, pool] : graph_pools_) {
      if (pool->use_count == 0) {
        release_blocks(pool->large);
        release_blocks(pool->small);
      }
    }
    prune_pools();
    return true;
  }

  void release_blocks(BlockPool& pool) {
    // Unmapping may add blocks (the partial pages around what it unmaps) to the pool;
    // they are not releasable, so visiting them is harmless.
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* b = *it;
      ++it;
      if (releasable(b) && exec_safe(b)) release_free_block(b);
    }
  }

  // Whether returning free block `b` to the device frees memory: a whole aclrtMalloc'ed
  // segment, or whole pages of an expandable segment.
  bool releasable(const Block* b) const {
    if (b->expandable) return b->expandable->whole_pages(b->ptr, b->size).second > 0;
    return !b->is_split();
  }

  // Returns releasable `b` to the device; returns the bytes released.
  size_t release_free_block(Block* b) {
    if (b->expandable) return unmap_block(b);
    const size_t size = b->size;
    release_block(b);
    return size;
  }

  void release_block(Block* block) {
    TORCH_INTERNAL_ASSERT(!block->expandable && !block->is_split() &&
                          block->free_event == nullptr);
    {
      DeviceSwitch sw(device_);
      if (const auto& custom = pool_allocator(*block->pool)) {
        custom->free_fn(block->ptr, block->size, device_, block->stream);
      } else {
        NPU_CHECK(aclrtFree(block->ptr));
      }
    }
    record_trace(TraceEntry::SEGMENT_FREE, block->ptr, block->size, block->stream, *block->pool, nullptr);
    total_reserved_ -= block->size;
    const StatTypes types = stat_types_for(*block->pool);
    for_each_type(types, [&](size_t t) {
      stats_.segment[t].decrease(1);
      stats_.reserved_bytes[t].decrease(block->size);
    });
    if (block->size >= config_->max_split_size) stats_.oversize_segments.decrease(1);
    stats_.num_device_free += 1;
    if (block->pool->owner != nullptr) block->pool->owner->segments -= 1;  // pruned later
    block->pool->blocks.erase(block);
    delete block;
  }

  // Frees the least recently reused releasable large blocks until reserved memory is
  // back under garbage_collection_threshold * allowed memory.
  void garbage_collect_cached_blocks(std::unique_lock<std::mutex>& lock) {
    const size_t threshold = static_cast<size_t>(
        config_->garbage_collection_threshold * static_cast<double>(allowed_memory_maximum_));
    if (total_reserved_ <= threshold) return;
    wait_before_release(lock, false, [this](const Block* b) { return b->pool == &large_; });
    if (total_reserved_ <= threshold) return;
    const size_t target = total_reserved_ - threshold;
    double total_age = 0.0;
    int64_t freeable = 0;
    for (const Block* b : large_.blocks) {
      if (releasable(b)) {
        total_age += static_cast<double>(large_.gc_count(b));
        ++freeable;
      }
    }
    if (freeable == 0) return;
    size_t reclaimed = 0;
    bool freed = true;
    while (reclaimed < target && freed && freeable > 0) {
      const double age_threshold = total_age / static_cast<double>(freeable);
      freed = false;
      for (auto it = large_.blocks.begin(); it != large_.blocks.end();) {
        Block* b = *it;
        ++it;
        if (releasable(b) && static_cast<double>(large_.gc_count(b)) >= age_threshold &&
            exec_safe(b)) {
          freed = true;
          total_age -= static_cast<double>(large_.gc_count(b));
          --freeable;
          reclaimed += release_free_block(b);
        }
      }
    }
  }

  [[noreturn]] void raise_oom(size_t alloc_size, aclrtStream stream,
                              std::shared_ptr<c10::GatheredContext> context) {
    size_t device_free = 0, device_total = 0;
    {
      DeviceSwitch sw(device_);
      if (aclrtGetMemInfo(ACL_HBM_MEM, &device_free, &device_total) != ACL_SUCCESS) {
        device_total = aclsimDeviceCapacity(device_);
        device_free = device_total >= total_reserved_ ? device_total - total_reserved_ : 0;
      }
    }
    std::string allowed_info;
    if (set_fraction_) allowed_info = format_size(allowed_memory_maximum_) + " allowed; ";
    std::string host_info;
    size_t host_available = 0;
    if (aclsimHostRefusedLastAllocation(&host_available)) {
      host_info = " The host ran out of memory before the device did: the simulator's device memory is host "
                  "memory, and only " + format_size(host_available) +
                  " more of it could be backed for this process (ASCEND_SIM_HOST_MEMORY_LIMIT sets that budget; 0 "
                  "turns the check off).";
    }
    stats_.num_ooms += 1;
    // The trace entry's address is the device's free memory (as CUDA's).
    record_trace(TraceEntry::OOM, reinterpret_cast<void*>(device_free), alloc_size, stream, large_,
                 std::move(context));
    const auto allocated = static_cast<size_t>(stats_.allocated_bytes[0].current);
    const auto reserved = static_cast<size_t>(stats_.reserved_bytes[0].current);
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(alloc_size), allocated, reserved,
                                     c10::Device(c10::DeviceType::PrivateUse1, device_));
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "NPU out of memory. Tried to allocate ",
        format_size(alloc_size), " (NPU ", static_cast<int>(device_), "; ",
        format_size(device_total), " total capacity; ", format_size(allocated),
        " already allocated; ", format_size(device_free), " free; ", allowed_info,
        format_size(reserved),
        " reserved in total by PyTorch) If reserved memory is >> allocated memory try "
        "setting max_split_size_mb to avoid fragmentation. See documentation for Memory "
        "Management and PYTORCH_NPU_ALLOC_CONF. Cached blocks were already released for "
        "this request; torch.npu.empty_cache() returns memory cached by this process "
        "to the device.", host_info);
  }

  const c10::DeviceIndex device_;
  const Config* config_;  // owned by the global state; read under mutex_
  std::mutex mutex_;
  DeviceStats stats_;
  BlockPool large_;
  BlockPool small_;
  std::unordered_set<Block*> active_blocks_;  // allocated or waiting for events
  std::unordered_map<aclrtStream, std::deque<std::pair<aclrtEvent, PendingEvent>>> events_;
  size_t total_reserved_ = 0;
  uint64_t marker_seq_ = 0;
  size_t allowed_memory_maximum_ = 0;
  bool set_fraction_ = false;
  std::map<MempoolId_t, std::unique_ptr<PrivatePool>> graph_pools_;
  // Captures under way on this device: their pool and which streams allocate into it.
  std::vector<std::pair<MempoolId_t, std::function<bool(aclrtStream)>>> captures_;
  std::vector<Block*> deferred_frees_;  // freed during a capture they touch, see free()
  // Memory history (recordHistory): a ring of the last trace_max_ entries.
  bool record_history_ = false;
  std::vector<TraceEntry> trace_;
  size_t trace_next_ = 0;  // oldest entry once the ring is full
  size_t trace_max_ = 1;
};

// ---------------------------------------------------------------------------------
// Process-wide state
// ---------------------------------------------------------------------------------

void local_raw_delete(void* ptr);

class State {
 public:
  // Lazily creates the per-device allocators and parses PYTORCH_NPU_ALLOC_CONF.
  void ensure_init() {
    // Checked first: std::call_once costs two thread-local writes and a pthread_once
    // call on every allocation and free.
    if (initialized_.load(std::memory_order_acquire)) return;
    std::call_once(init_flag_, [this] {
      const char* env = std::getenv(kConfEnv);
      Config c = parse_config(env ? env : "");
      const auto n = torch_npu::device_count();
      install_config(std::move(c));
      devices_.reserve(static_cast<size_t>(n));
      for (const auto d : c10::irange(n)) {
        devices_.push_back(std::make_unique<DeviceCachingAllocator>(
            static_cast<c10::DeviceIndex>(d), &config_));
      }
      apply_memory_fraction();
      initialized_.store(true);
    });
  }

  bool initialized() const { return initialized_.load(); }
  // Served an allocation (a custom allocator can no longer replace it).
  bool used() const { return used_.load(); }

  DeviceCachingAllocator& device(c10::DeviceIndex d) {
    ensure_init();
    torch_npu::check_device_index(d);
    TORCH_CHECK(d >= 0 && static_cast<size_t>(d) < devices_.size(),
                "Invalid NPU device index ", static_cast<int>(d), ": ", devices_.size(),
                " NPU device(s) available");
    return *devices_[static_cast<size_t>(d)];
  }

  size_t num_devices() {
    ensure_init();
    return devices_.size();
  }

  PinnedConfig pinned_config() {
    ensure_init();
    return {pinned_max_cached_size_.load(std::memory_order_relaxed),
            pinned_max_round_threshold_.load(std::memory_order_relaxed),
            pin_memory_expandable_segments_.load(std::memory_order_relaxed)};
  }

  void set_settings(const std::string& conf) {
    ensure_init();
    Config c = parse_config(conf, &config_);  // validate before touching anything
    {
      std::vector<std::unique_lock<std::mutex>> locks;
      for (auto& d : devices_) locks.emplace_back(d->mutex());
      install_config(std::move(c));
    }
    apply_memory_fraction();  // takes each device's lock itself
  }

  void* malloc(c10::DeviceIndex dev, size_t size, aclrtStream stream) {
    if (size == 0) return nullptr;
    if (C10_UNLIKELY(!used_.load(std::memory_order_relaxed))) used_.store(true);
    Block* block = device(dev).malloc(size, stream);
    {
      std::lock_guard<std::mutex> g(blocks_mutex_);
      allocated_blocks_.emplace(block->ptr, block);
    }
    trace::emit(trace::Kind::MemoryAllocation, block->ptr);
    return block->ptr;
  }

  void free(void* ptr) {
    if (!ptr) return;
    Block* block = nullptr;
    {
      std::lock_guard<std::mutex> g(blocks_mutex_);
      auto it = allocated_blocks_.find(static_cast<char*>(ptr));
      TORCH_CHECK(it != allocated_blocks_.end(),
                  "NPU caching allocator: invalid device pointer ", ptr,
                  " (not allocated by this allocator, or already freed)");
      block = it->second;
      allocated_blocks_.erase(it);
      if (!unsafe_.empty()) unsafe_.erase(block->ptr);  // memory allocated again is safe
    }
    trace::emit(trace::Kind::MemoryDeallocation, ptr);
    devices_[static_cast<size_t>(block->device)]->free(block);
  }

  Block* find_allocated(void* ptr) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    auto it = allocated_blocks_.find(static_cast<char*>(ptr));
    return it == allocated_blocks_.end() ? nullptr : it->second;
  }

  // Data safety after a device fault (torch_npu.npu._recovery). The blocks allocated on
  // `device` now are marked unsafe; a block leaves the set when freed (its next user gets
  // memory it wrote itself) or when a copy writes it (updateBlockToSafe).
  void mark_all_unsafe(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    for (const auto& [ptr, block] : allocated_blocks_)
      if (block->device == device) unsafe_.insert(ptr);
  }
  // Memory of no block of this allocator (from_blob, IPC imports) counts as safe.
  bool is_safe(void* ptr) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    return unsafe_.count(static_cast<char*>(ptr)) == 0;
  }
  void set_safe(void* ptr) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    unsafe_.erase(static_cast<char*>(ptr));
  }

  // The allocated block whose range contains `ptr` (interior pointers included).
  Block* find_containing(void* ptr, void** base, size_t* size) {
    std::lock_guard<std::mutex> g(blocks_mutex_);
    auto it = allocated_blocks_.upper_bound(static_cast<char*>(ptr));
    if (it == allocated_blocks_.begin()) return nullptr;
    --it;
    Block* b = it->second;
    // The block stays allocated while it is in the map (the map entry is removed
    // before the block is freed), so its ptr/size are stable here.
    if (static_cast<char*>(ptr) >= b->ptr + b->size) return nullptr;
    *base = b->ptr;
    if (size) *size = b->size;
    return b;
  }

 private:
  void install_config(Config c) {
    pinned_max_cached_size_.store(c.pinned_max_cached_size, std::memory_order_relaxed);
    pinned_max_round_threshold_.store(c.pinned_max_round_threshold, std::memory_order_relaxed);
    pin_memory_expandable_segments_.store(c.pin_memory_expandable_segments, std::memory_order_relaxed);
    config_ = std::move(c);
  }

  // Copies of config_'s pinned keys that the pinned-host allocator reads without the
  // devices' locks (which guard config_).
  std::atomic<size_t> pinned_max_cached_size_{0}, pinned_max_round_threshold_{0};
  std::atomic<bool> pin_memory_expandable_segments_{false};
  void apply_memory_fraction() {
    if (config_.memory_fraction < 0) return;
    for (auto& d : devices_) d->set_memory_fraction(config_.memory_fraction);
  }

  std::once_flag init_flag_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> used_{false};
  Config config_;
  std::vector<std::unique_ptr<DeviceCachingAllocator>> devices_;
  std::mutex blocks_mutex_;
  std::map<char*, Block*> allocated_blocks_;
  std::unordered_set<char*> unsafe_;  // allocated blocks marked unsafe (guarded by blocks_mutex_)
};

State& state() {
  static auto* s = new State();  // leaked on purpose: DataPtrs may die after main()
  return *s;
}

void local_raw_delete(void* ptr) { state().free(ptr); }

// ---------------------------------------------------------------------------------
// Pluggable allocator: the user's alloc/free functions (changeCurrentAllocator)
// ---------------------------------------------------------------------------------

class CustomState {
 public:
  explicit CustomState(std::shared_ptr<CustomAllocator> fns) : fns(std::move(fns)) {}

  void* malloc(size_t size, c10::DeviceIndex device, aclrtStream stream) {
    used.store(true);
    void* ptr = nullptr;
    {
      // The user's function allocates on the thread's current device (aclrtMalloc).
      DeviceSwitch sw(device);
      ptr = fns->alloc_fn(size, device, stream);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "NPU out of memory: the pluggable allocator returned ",
                     "nullptr for ", format_size(size), " on NPU ", static_cast<int>(device));
    {
      std::lock_guard<std::mutex> g(mu);
      metadata[ptr] = Allocation{size, device, stream};
    }
    trace::emit(trace::Kind::MemoryAllocation, ptr);
    return ptr;
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    Allocation a;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = metadata.find(ptr);
      TORCH_CHECK(it != metadata.end(), "NPUPluggableAllocator: trying to free a pointer not allocated here: ", ptr);
      a = it->second;
      metadata.erase(it);
    }
    trace::emit(trace::Kind::MemoryDeallocation, ptr);
    DeviceSwitch sw(a.device);
    fns->free_fn(ptr, a.size, a.device, a.stream);
  }

  bool owns(void* ptr, size_t* size) {
    std::lock_guard<std::mutex> g(mu);
    auto it = metadata.find(ptr);
    if (it == metadata.end()) return false;
    if (size) *size = it->second.size;
    return true;
  }

  const std::shared_ptr<CustomAllocator> fns;
  std::atomic<bool> used{false};

 private:
  struct Allocation {
    size_t size = 0;
    c10::DeviceIndex device = 0;
    aclrtStream stream = nullptr;
  };
  std::mutex mu;
  std::unordered_map<void*, Allocation> metadata;
};

// The installed custom allocator (nullptr: the caching allocator). Installed states are
// never deleted: DataPtrs they made may outlive a later swap.
std::atomic<CustomState*> g_custom{nullptr};

CustomState* custom() { return g_custom.load(std::memory_order_acquire); }

void custom_delete(void* ptr) { custom()->free(ptr); }

void warn_custom_unsupported(const char* what) {
  TORCH_WARN_ONCE("NPUPluggableAllocator: ", what, " is not set or not supported by the pluggable allocator; ",
                  "set it with the allocator's set_", what, " (see torch_npu.npu.memory.NPUPluggableAllocator)");
}

aclrtStream acl_stream_of(c10::Stream stream) {
  return torch_npu::NPUStream(stream).stream();
}

// ---------------------------------------------------------------------------------
// The c10::DeviceAllocator registered for PrivateUse1
// ---------------------------------------------------------------------------------

class NPUCachingAllocatorImpl final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return NPUCachingAllocator::allocate(nbytes, torch_npu::current_device());
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return custom() != nullptr ? &custom_delete : &local_raw_delete;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);  // device memory is host memory
  }

  bool initialized() override { return custom() != nullptr ? custom()->used.load() : state().initialized(); }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    NPUCachingAllocator::emptyCache();
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    NPUCachingAllocator::recordStream(ptr, stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return NPUCachingAllocator::getDeviceStats(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    NPUCachingAllocator::resetAccumulatedStats(device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    NPUCachingAllocator::resetPeakStats(device);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return NPUCachingAllocator::memGetInfo(device);
  }
};

c10::DeviceIndex resolve_device(c10::DeviceIndex device) {
  return device < 0 ? torch_npu::current_device() : device;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------

c10::DeviceAllocator* get() {
  static auto* instance = new NPUCachingAllocatorImpl();  // leaked on purpose
  return instance;
}

void* raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const auto device = torch_npu::current_device();
  const auto stream = torch_npu::getCurrentNPUStream(device);
  if (CustomState* c = custom()) return c->malloc(nbytes, device, stream.stream());
  return state().malloc(device, nbytes, stream.stream());
}

void* raw_alloc_with_stream(size_t nbytes, c10::Stream stream) {
  if (nbytes == 0) return nullptr;
  if (CustomState* c = custom()) return c->malloc(nbytes, stream.device_index(), acl_stream_of(stream));
  return state().malloc(stream.device_index(), nbytes, acl_stream_of(stream));
}

void raw_delete(void* ptr) {
  if (CustomState* c = custom(); c != nullptr && ptr != nullptr && c->owns(ptr, nullptr)) {
    c->free(ptr);
    return;
  }
  state().free(ptr);
}

c10::DataPtr allocate(size_t nbytes, c10::DeviceIndex device) {
  device = resolve_device(device);
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, dev);
  }
  const auto stream = torch_npu::getCurrentNPUStream(device);
  if (CustomState* c = custom()) {
    void* ptr = c->malloc(nbytes, device, stream.stream());
    return c10::DataPtr(ptr, ptr, &custom_delete, dev);
  }
  void* ptr = state().malloc(device, nbytes, stream.stream());
  return c10::DataPtr(ptr, ptr, &local_raw_delete, dev);
}

void recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (!ptr.get()) return;
  trace::emit(trace::Kind::RecordStream, ptr.get(), acl_stream_of(stream));
  if (ptr.get_deleter() == &custom_delete) {
    if (custom()->fns->record_stream_fn) custom()->fns->record_stream_fn(ptr.get(), acl_stream_of(stream));
    return;
  }
  // Memory not from this allocator (e.g. from_blob) has nothing to delay.
  if (ptr.get_deleter() != &local_raw_delete) return;
  Block* block = state().find_allocated(ptr.get_context());
  TORCH_CHECK(block != nullptr, "recordStream: no allocated NPU block found for pointer ",
              ptr.get_context());
  StreamUse use{acl_stream_of(stream), stream.device_index()};
  state().device(block->device).record_stream(block, use);
}

bool freesInStreamOrder(const c10::DataPtr& ptr) {
  return ptr.get() != nullptr &&
         ptr.get_deleter() == &local_raw_delete;
}

void eraseStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (!ptr.get()) return;
  trace::emit(trace::Kind::EraseStream, ptr.get(), acl_stream_of(stream));
  if (ptr.get_deleter() == &custom_delete) {
    if (custom()->fns->erase_stream_fn) custom()->fns->erase_stream_fn(ptr.get(), acl_stream_of(stream));
    return;
  }
  if (ptr.get_deleter() != &local_raw_delete) return;
  Block* block = state().find_allocated(ptr.get_context());
  TORCH_CHECK(block != nullptr, "erase_stream: no allocated NPU block found for pointer ",
              ptr.get_context());
  StreamUse use{acl_stream_of(stream), stream.device_index()};
  state().device(block->device).erase_stream(block, use);
}

void emptyCache() {
  if (CustomState* c = custom(); c != nullptr && c->fns->reset_fn) c->fns->reset_fn(false);
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).empty_cache();
  }
}

DeviceStats getDeviceStats(c10::DeviceIndex device) {
  if (CustomState* c = custom()) {
    if (c->fns->get_device_stats_fn) return c->fns->get_device_stats_fn(resolve_device(device));
    warn_custom_unsupported("get_device_stats_fn");
    return DeviceStats();
  }
  return state().device(resolve_device(device)).stats();
}

void resetAccumulatedStats(c10::DeviceIndex device) {
  if (custom() != nullptr) return warn_custom_unsupported("reset_accumulated_stats_fn");
  state().device(resolve_device(device)).reset_accumulated();
}

void resetPeakStats(c10::DeviceIndex device) {
  if (CustomState* c = custom()) {
    if (c->fns->reset_peak_status_fn) return c->fns->reset_peak_status_fn(resolve_device(device));
    return warn_custom_unsupported("reset_peak_status_fn");
  }
  state().device(resolve_device(device)).reset_peak();
}

std::vector<SegmentInfo> snapshot() {
  std::vector<SegmentInfo> out;
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).snapshot(&out);
  }
  return out;
}

void setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "invalid fraction:", fraction,
              ". Please set within [0, 1].");
  if (CustomState* c = custom(); c != nullptr && c->fns->memory_fraction_fn) {
    c->fns->memory_fraction_fn(fraction, resolve_device(device));
  }
  state().device(resolve_device(device)).set_memory_fraction(fraction);
}

std::pair<size_t, size_t> memGetInfo(c10::DeviceIndex device) {
  device = resolve_device(device);
  torch_npu::check_device_index(device);
  size_t free_bytes = 0, total_bytes = 0;
  DeviceSwitch sw(device);
  NPU_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

void* getBaseAllocation(void* ptr, size_t* size) {
  if (!ptr) return nullptr;
  if (CustomState* c = custom(); c != nullptr && (c->fns->base_alloc_fn || c->owns(ptr, size))) {
    return c->fns->base_alloc_fn ? c->fns->base_alloc_fn(ptr, size) : ptr;
  }
  void* base = nullptr;
  if (state().find_containing(ptr, &base, size) == nullptr) return nullptr;
  return base;
}

void setAllocatorSettings(const std::string& conf) { state().set_settings(conf); }

bool checkBlockIsSafe(const c10::DataPtr& ptr) {
  if (!ptr.get() || ptr.get_deleter() != &local_raw_delete) return true;
  return state().is_safe(ptr.get_context());
}

void markAllBlockUnsafe(c10::DeviceIndex device) {
  if (custom() != nullptr) return;  // a pluggable allocator's blocks are its own
  state().mark_all_unsafe(device);
}

void updateBlockToSafe(const c10::DataPtr& ptr) {
  if (!ptr.get() || ptr.get_deleter() != &local_raw_delete) return;
  state().set_safe(ptr.get_context());
}

namespace {
std::atomic<bool> npu_data_unsafe_flag{false};
}  // namespace

bool getNpuDataUnsafeFlag() { return npu_data_unsafe_flag.load(std::memory_order_relaxed); }
void setNpuDataUnsafeFlag(bool flag) { npu_data_unsafe_flag.store(flag, std::memory_order_relaxed); }

PinnedConfig pinnedConfig() { return state().pinned_config(); }

void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                         std::function<bool(aclrtStream)> filter) {
  state().device(resolve_device(device)).begin_allocate_to_pool(mempool_id, std::move(filter));
}

void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  state().device(resolve_device(device)).end_allocate_to_pool(mempool_id);
}

void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  state().device(resolve_device(device)).release_pool(mempool_id);
}

std::pair<int, size_t> graphPoolInfo(c10::DeviceIndex device, MempoolId_t mempool_id) {
  return state().device(resolve_device(device)).pool_info(mempool_id);
}

void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom, bool no_split,
                        std::shared_ptr<CustomAllocator> allocator) {
  TORCH_CHECK(!allocator || (allocator->alloc_fn && allocator->free_fn),
              "MemPool: expected an allocator with alloc and free functions");
  state().device(resolve_device(device))
      .create_or_incref_pool(mempool_id, use_on_oom, no_split, std::move(allocator));
}

int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) {
  return std::max(0, state().device(resolve_device(device)).pool_info(mempool_id).first);
}

void emptyCache(MempoolId_t mempool_id) {
  if (mempool_id == MempoolId_t{0, 0}) return emptyCache();
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).empty_pool_cache(mempool_id);
  }
}

void recordHistory(bool enabled, CreateContextFn recorder, size_t max_entries, RecordContext when) {
  TORCH_CHECK(!enabled || when == RecordContext::NEVER || recorder != nullptr,
              "recordHistory: recording contexts needs a context recorder");
  HistorySettings& h = history();
  h.recorder.store(enabled ? recorder : nullptr);
  h.when.store(static_cast<int>(enabled ? when : RecordContext::NEVER));
  h.enabled.store(enabled);
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    s.device(static_cast<c10::DeviceIndex>(d)).record_history(enabled, max_entries);
  }
}

bool isHistoryEnabled() { return history().enabled.load(); }

void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
  TORCH_CHECK(tracker, "attachAllocatorTraceTracker: tracker must be a callable, got an empty function");
  auto& t = trace_trackers();
  std::lock_guard<std::mutex> lock(t.mu);
  t.callbacks.push_back(std::move(tracker));
  t.any.store(true, std::memory_order_release);
}

SnapshotInfo snapshotWithTraces(MempoolId_t mempool_id) {
  SnapshotInfo out;
  auto& s = state();
  for (const auto d : c10::irange(s.num_devices())) {
    auto& dev = s.device(static_cast<c10::DeviceIndex>(d));
    dev.snapshot(&out.segments, mempool_id);
    out.device_traces.push_back(dev.traces());
  }
  return out;
}

void changeCurrentAllocator(std::shared_ptr<CustomAllocator> allocator) {
  TORCH_CHECK(allocator && allocator->alloc_fn && allocator->free_fn,
              "change_current_allocator: expected an allocator with alloc and free functions");
  CustomState* current = custom();
  const bool used = current != nullptr ? current->used.load() : state().used();
  TORCH_CHECK(!used, "Can't swap an already initialized allocator");
  if (allocator->init_fn) allocator->init_fn(static_cast<int>(torch_npu::device_count()));
  g_custom.store(new CustomState(std::move(allocator)), std::memory_order_release);  // never deleted
}

std::shared_ptr<CustomAllocator> currentCustomAllocator() {
  CustomState* c = custom();
  return c != nullptr ? c->fns : nullptr;
}

}  // namespace torch_npu::NPUCachingAllocator

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, torch_npu::NPUCachingAllocator::get());
