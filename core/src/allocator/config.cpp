// PYTORCH_NPU_ALLOC_CONF parsing: the keys, values and error texts of torch_npu's
// NPUAllocatorConfig (read at the first allocation, again by _set_allocator_settings).
#include "config.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace torch_npu::NPUCachingAllocator::detail {

namespace {

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
}  // namespace

Config parse_config(const std::string& conf, const Config* prev) {
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

}  // namespace torch_npu::NPUCachingAllocator::detail
