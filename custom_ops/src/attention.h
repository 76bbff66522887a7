// The blockwise attention forward that npu_fusion_attention (attention.cpp) and the
// inference operators (infer_attention.cpp: npu_prompt_flash_attention,
// npu_incre_flash_attention, npu_fused_infer_attention_score) share: the description of
// a problem (shapes, layouts, per-batch lengths, masks, paged KV cache) and the kernel
// entry point. Each operator checks its own arguments and fills a Problem; the kernel
// (flash-attention style, online softmax, O(S * D) extra memory) is in attention.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace torch_npu::custom_ops::fa {

constexpr int64_t kBlockQ = 64;    // query rows per block
constexpr int64_t kBlockKV = 128;  // keys per tile
constexpr int64_t kStatLanes = 8;  // softmax_max/softmax_sum repeat each value 8 times
constexpr int64_t kTokensMax = int64_t{1} << 40;  // pre/next_tockens beyond any sequence

// ---- dropout: Philox-4x32-10 keyed by seed, one 32-bit draw per element ---------------
// Element e of the [B, N, S1, S2] mask (TND: the batches' [N, Sq, Skv] one after the
// other) is kept when draw number offset + e of the Philox stream of `seed` is below
// keep_prob * 2^32. The backward regenerates the same draws from (seed, offset).
struct Dropout {
  bool on = false;
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t threshold = 0;
  double inv_keep = 1.0;
};

// ---- the problem: shapes, layouts, masks ------------------------------------------------
enum class Layout { BSH, SBH, BNSD, BSND, TND };

// Where row i of head n of batch b starts in a dense operand:
// b * batch + (first[b] + i) * seq + n * head. `first` is the batch's first row for TND
// (whose batch stride is 0) and 0 otherwise. For a paged KV cache `batch` is the stride
// of a physical block and `seq` that of a row inside it.
struct Strides {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;
  int64_t at(int64_t b, int64_t row, int64_t n) const { return b * batch + row * seq + n * head; }
};

inline Strides layout_strides(Layout layout, int64_t B, int64_t S, int64_t heads, int64_t dim) {
  switch (layout) {
    case Layout::BSH:
    case Layout::BSND:
      return {S * heads * dim, heads * dim, dim};
    case Layout::SBH:
      return {heads * dim, B * heads * dim, dim};
    case Layout::BNSD:
      return {heads * S * dim, dim, S * dim};
    case Layout::TND:
      return {0, heads * dim, dim};
  }
  return {};
}

struct Problem {
  Layout layout = Layout::BSH;
  int64_t B = 0, N = 0, Nkv = 0, G = 1, D = 0, Dv = 0;  // G = N / Nkv query heads per kv head
  int64_t S1 = 0, S2 = 0;  // longest query / key sequence
  // Per batch: sequence lengths and (TND) first rows.
  std::vector<int64_t> sq, skv, q_first, kv_first;
  int64_t last_batch = 0;  // the last batch with queries (sparse_mode 7)
  Strides q, k, v, out, stat;
  std::vector<int64_t> out_sizes, stat_sizes;
  bool tnd_tail = false;  // TND rows that belong to no batch: left zero
  double scale = 1.0;

  // Which keys row i may see: an interval from the sparse mode, and the mask tensor.
  int64_t sparse_mode = 0;
  bool band = false;      // atten_mask given: the sparse mode applies
  bool use_mask = false;  // the mask tensor is read (modes 0, 1, 5)
  Strides mask;           // (b, i, n) -> row of the mask
  int64_t pre = 0, next = 0;
  std::vector<int64_t> prefix;

  bool has_pse = false;
  bool pse_full = false;  // pse has one element per score: its gradient is written, not summed
  bool pse_scaled = true;  // scale * (Q K^T + pse) (FlashAttentionScore); else scale * Q K^T + pse
  Strides pse;
  int64_t pse_numel = 0;
  bool has_sink = false;

  Dropout dropout;
  std::vector<int64_t> drop_first;  // first mask element of each batch
  int64_t numels = 0;

  // Paged KV cache: key/value row j of batch b is row j % block_size of the physical
  // block block_table[b][j / block_size] (k/v strides: batch = block, seq = row in block).
  bool paged = false;
  int64_t block_size = 0, max_blocks = 0, num_blocks = 0;

  // Statistics written to the kMax/kSum outputs (when given): softmax max and sum, each
  // repeated stat_lanes times; with `lse`, log(sum) + max alone (-inf for a row that sees
  // nothing) to kMax.
  int64_t stat_lanes = kStatLanes;
  bool lse = false;

  // Keys [lo, hi) that row i of batch b sees before the mask tensor.
  std::pair<int64_t, int64_t> keys(int64_t b, int64_t i) const {
    const int64_t len = skv[b];
    int64_t lo = 0, hi = len;
    if (band) {
      const int64_t shift = len - sq[b];  // right-down alignment
      auto banded = [&](int64_t origin) {
        lo = origin - pre;
        hi = origin + next + 1;
      };
      switch (sparse_mode) {
        case 0: banded(i); break;
        case 2: hi = i + 1; break;
        case 3: hi = i + shift + 1; break;
        case 4: banded(i + shift); break;
        case 6: hi = std::max(i + shift + 1, prefix[b]); break;
        case 7:  // sequence split across devices: the last batch is a band, the others causal
          if (b == last_batch) {
            banded(i + shift);
          } else {
            hi = i + shift + 1;
          }
          break;
        case 8:
          if (b == 0) {
            banded(i + shift);
          } else {
            hi = i + 1;
          }
          break;
        default: break;  // 1, 5: the mask alone
      }
    }
    return {std::clamp<int64_t>(lo, 0, len), std::clamp<int64_t>(hi, 0, len)};
  }
};

// Per-batch lengths and first rows from TND's cumulative ends ("2 4 6" for lengths
// 2 2 2). Trailing zeros mark batches left out, whose rows (if any) stay zero.
void split_cumulative(const char* op, const char* arg, c10::IntArrayRef ends, int64_t rows, const char* tensor,
                      std::vector<int64_t>& len, std::vector<int64_t>& first, bool& tail);

// ---- the forward kernel -------------------------------------------------------------------
// The tensors of a forward launch, in this order (CPU aliases; undefined when unused):
// query, key, value, pse, atten_mask (bool/uint8, read when use_mask), sink (float),
// out, max (or lse), sum, block_table (int32 [B, max_blocks], when paged), drop_mask (uint8,
// one keep bit per score element, lowest bit first: a dropout mask given by the caller).
enum FwdArg { kQ, kK, kV, kPse, kMask, kSink, kOut, kMax, kSum, kBlockTable, kDropMask };

// Runs the forward of `p` on `t` (dtype dispatch inside): writes out and, when defined,
// the statistics. Throws (naming block_table) on a block id outside the cache.
void forward(const Problem& p, const std::vector<at::Tensor>& t);

// Multiply-adds of the problem, for the launch's inline/queued choice.
int64_t work_estimate(const Problem& p);

}  // namespace torch_npu::custom_ops::fa
