// Inference attention: npu_prompt_flash_attention (prefill), npu_incre_flash_attention
// (decode) and npu_fused_infer_attention_score (either, by the query length), with
//
//   out = Softmax(scale * Q K^T + pse_shift, masked) V
//
// in torch_npu's layouts (BSH, BSND, BNSD, BNSD_BSND, TND), per-batch actual lengths,
// GQA (num_key_value_heads), the sparse modes 0-4 and a paged KV cache (block_table,
// block_size). These operators only check their arguments and describe the problem
// (fa::Problem); the kernel is the blockwise online-softmax forward of
// npu_fusion_attention (attention.cpp): no S1 x S2 matrix is stored, the extra memory is
// one kv head's keys and values per thread plus query-block tiles.
//
// Quantisation (int8 in/out, antiquant), left padding, shared prefixes and MLA rope
// inputs are rejected with an error naming the argument.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention.h"
#include "fused.h"

namespace torch_npu::contrib {
namespace {

using fa::Layout;
using fa::Problem;
using fa::Strides;

const Tensor& value_or_undefined(const std::optional<Tensor>& t) {
  static const Tensor undefined;
  return t.has_value() ? *t : undefined;
}

// An argument the simulator does not implement (quantisation etc.): NotImplementedError.
void reject(const char* op, const char* arg, const std::optional<Tensor>& t, const char* what) {
  TORCH_CHECK_NOT_IMPLEMENTED(!t.has_value() || !t->defined(), op, ": ", arg, " (", what,
                              ") is not supported by the simulator; pass None");
}

std::optional<std::vector<int64_t>> to_vector(at::OptionalIntArrayRef a) {
  return a.has_value() ? std::optional<std::vector<int64_t>>(a->vec()) : std::nullopt;
}

std::optional<std::vector<int64_t>> to_vector(at::OptionalSymIntArrayRef a) {
  if (!a.has_value()) return std::nullopt;
  std::vector<int64_t> v;
  for (const c10::SymInt& s : *a) v.push_back(s.guard_int(__FILE__, __LINE__));
  return v;
}

// The arguments the three operators share, named as torch_npu names them.
struct Call {
  const char* op;
  const char* qlen_arg = "actual_seq_lengths";
  const char* kvlen_arg = "actual_seq_lengths_kv";
  Tensor q, k, v, pse, mask, block_table;
  std::optional<std::vector<int64_t>> qlen, kvlen;
  int64_t num_heads = 1, num_kv_heads = 0, pre = 0, next = 0, sparse_mode = 0, block_size = 0;
  double scale = 1.0;
  std::string layout;
  std::vector<std::string> layouts;  // the layouts the operator takes
  bool decode = false;               // one query per sequence: no sparse mode, masks [B, Skv]
  bool want_lse = false;
};

// "BNSD_BSND" -> (BNSD, BSND): the input layout and that of the output.
std::pair<Layout, Layout> parse_layouts(const Call& c) {
  std::string u = c.layout;
  for (auto& ch : u) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::string list;
  for (const auto& l : c.layouts) list += (list.empty() ? "" : ", ") + l;
  TORCH_CHECK(std::find(c.layouts.begin(), c.layouts.end(), u) != c.layouts.end(), c.op,
              ": expected input_layout to be one of ", list, ", got \"", c.layout, "\"");
  auto one = [](const std::string& s) {
    if (s == "BSH") return Layout::BSH;
    if (s == "BSND") return Layout::BSND;
    if (s == "BNSD") return Layout::BNSD;
    return Layout::TND;
  };
  const auto cut = u.find('_');
  if (cut == std::string::npos) return {one(u), one(u)};
  return {one(u.substr(0, cut)), one(u.substr(cut + 1))};
}

// Per-batch lengths of a padded layout: one value for every batch, or (at least) one per
// batch, each in [0, max].
std::vector<int64_t> batch_lengths(const Call& c, const char* arg, const std::optional<std::vector<int64_t>>& given,
                                   int64_t B, int64_t max, const char* what) {
  if (!given.has_value()) return std::vector<int64_t>(B, max);
  const auto& g = *given;
  TORCH_CHECK(g.size() == 1 || static_cast<int64_t>(g.size()) >= B, c.op, ": expected ", arg,
              " to hold one length or one per batch (", B, "), got ", c10::IntArrayRef(g));
  std::vector<int64_t> len(B);
  for (int64_t b = 0; b < B; ++b) {
    len[b] = g.size() == 1 ? g[0] : g[b];
    TORCH_CHECK(len[b] >= 0 && len[b] <= max, c.op, ": expected ", arg, " in [0, ", max, "] (", what,
                "), got ", len[b], " for batch ", b);
  }
  return len;
}

// Strides of a dense mask or pse_shift [.., rows, cols] whose leading dims are
// [B|1] or [B|1, N|1] (0 along broadcast dims); rows == 1 means one row for all queries.
Strides leading_strides(const Tensor& t, int64_t B, int64_t N) {
  const int64_t rows = t.dim() >= 2 ? t.size(-2) : 1, cols = t.size(-1);
  Strides s;
  s.seq = rows == 1 ? 0 : cols;
  if (t.dim() >= 3) s.batch = t.size(0) <= 1 || B == 1 ? 0 : t.numel() / t.size(0);
  if (t.dim() == 4) s.head = t.size(1) == 1 || N == 1 ? 0 : rows * cols;
  return s;
}

bool leading_ok(const Tensor& t, int64_t B, int64_t N) {
  if (t.dim() >= 3 && t.size(0) != 1 && t.size(0) != B) return false;
  if (t.dim() == 4 && t.size(1) != 1 && t.size(1) != N) return false;
  return true;
}

struct Prepared {
  std::shared_ptr<Problem> p;
  Tensor out, lse;
  bool empty = false;
};

Prepared prepare(Call& c) {
  const char* op = c.op;
  npu_device(op, {{"query", c.q},
                  {"key", c.k},
                  {"value", c.v},
                  {"pse_shift", c.pse},
                  {"atten_mask", c.mask},
                  {"block_table", c.block_table}});
  check_float(op, "query", c.q);
  check_dtype(op, "key", c.k, c.q.scalar_type());
  check_dtype(op, "value", c.v, c.q.scalar_type());
  TORCH_CHECK(c.num_heads > 0, op, ": expected num_heads > 0, got ", c.num_heads);
  TORCH_CHECK(c.num_kv_heads >= 0, op, ": expected num_key_value_heads >= 0 (0: num_heads), got ", c.num_kv_heads);
  auto [in_layout, out_layout] = parse_layouts(c);

  auto p = std::make_shared<Problem>();
  p->layout = in_layout;
  p->pse_scaled = false;  // scale * Q K^T + pse_shift
  p->scale = c.scale;
  p->N = c.num_heads;
  p->Nkv = c.num_kv_heads == 0 ? c.num_heads : c.num_kv_heads;
  TORCH_CHECK(p->N % p->Nkv == 0, op, ": num_key_value_heads (", p->Nkv, ") must divide num_heads (", p->N, ")");
  p->G = p->N / p->Nkv;

  // query
  const Tensor& q = c.q;
  const bool tnd = in_layout == Layout::TND;
  const int64_t qdims = (in_layout == Layout::BSND || in_layout == Layout::BNSD) ? 4 : 3;
  TORCH_CHECK(q.dim() == qdims, op, ": expected query to be ", qdims, "-dimensional for input_layout ", c.layout,
              ", got shape ", q.sizes());
  int64_t T = 0;
  switch (in_layout) {
    case Layout::BSH:
      p->B = q.size(0);
      p->S1 = q.size(1);
      TORCH_CHECK(q.size(2) % p->N == 0, op, ": num_heads (", p->N, ") must divide the hidden size of query (",
                  q.size(2), "), whose shape is ", q.sizes());
      p->D = q.size(2) / p->N;
      break;
    case Layout::BSND:
    case Layout::BNSD: {
      const int64_t s = in_layout == Layout::BNSD ? 2 : 1, n = 3 - s;
      p->B = q.size(0);
      p->S1 = q.size(s);
      p->D = q.size(3);
      TORCH_CHECK(q.size(n) == p->N, op, ": expected num_heads (", p->N, ") to equal query's head dimension ",
                  q.size(n), " (query shape ", q.sizes(), ", layout ", c.layout, ")");
      break;
    }
    case Layout::TND:
      T = q.size(0);
      p->D = q.size(2);
      TORCH_CHECK(q.size(1) == p->N, op, ": expected num_heads (", p->N, ") to equal query's head dimension ",
                  q.size(1), " (query shape ", q.sizes(), ", layout TND)");
      break;
    default: break;
  }
  if (c.decode) {
    TORCH_CHECK(!tnd && p->S1 == 1, op, ": expected one query token per sequence (S = 1) for decode, got query ",
                q.sizes(), " in layout ", c.layout);
  }

  // key / value: dense in the query's layout, or a paged cache
  const Tensor &k = c.k, &v = c.v;
  p->paged = c.block_table.defined();
  if (p->paged) {
    TORCH_CHECK(!tnd, op, ": a paged KV cache (block_table) with input_layout TND is not supported by the simulator");
    const Tensor& bt = c.block_table;
    TORCH_CHECK(bt.scalar_type() == at::kInt && bt.dim() == 2 && bt.size(0) == p->B, op,
                ": expected block_table to be an int32 [B, maxBlocksPerSeq] tensor with B=", p->B, ", got ",
                bt.scalar_type(), " ", bt.sizes());
    TORCH_CHECK(c.block_size > 0 && c.block_size <= 512, op, ": expected block_size in [1, 512] with block_table, got ",
                c.block_size);
    if (!c.decode) {
      TORCH_CHECK(c.block_size % 128 == 0, op, ": expected block_size to be a multiple of 128 for a prefill "
                  "(query S > 1) with block_table, got ", c.block_size);
    }
    TORCH_CHECK(c.kvlen.has_value(), op, ": a paged KV cache (block_table) needs ", c.kvlen_arg,
                ", the number of cached tokens of each batch");
    p->block_size = c.block_size;
    p->max_blocks = bt.size(1);
    p->num_blocks = k.size(0);
    const bool four = k.dim() == 4;
    TORCH_CHECK(k.dim() == 3 || (four && in_layout == Layout::BNSD), op, ": expected the paged key cache to be ",
                in_layout == Layout::BNSD ? "[blocknum, blocksize, H] or [blocknum, numKvHeads, blocksize, D]"
                                          : "[blocknum, blocksize, H] (for input_layout BSH/BSND)",
                ", got shape ", k.sizes());
    TORCH_CHECK(v.dim() == k.dim() && v.size(0) == k.size(0), op,
                ": expected value to be a paged cache like key, got key ", k.sizes(), ", value ", v.sizes());
    const int64_t bs_dim = four ? 2 : 1;
    TORCH_CHECK(k.size(bs_dim) == c.block_size && v.size(bs_dim) == c.block_size, op, ": expected the key/value ",
                "caches' block dimension to equal block_size (", c.block_size, "), got key ", k.sizes(), ", value ",
                v.sizes());
    if (four) {
      TORCH_CHECK(k.size(1) == p->Nkv && v.size(1) == p->Nkv && k.size(3) == p->D, op, ": expected key/value caches ",
                  "[blocknum, ", p->Nkv, " (num_key_value_heads), blocksize, D] with query's D=", p->D, ", got key ",
                  k.sizes(), ", value ", v.sizes());
      p->Dv = v.size(3);
      p->k = {p->Nkv * c.block_size * p->D, p->D, c.block_size * p->D};
      p->v = {p->Nkv * c.block_size * p->Dv, p->Dv, c.block_size * p->Dv};
    } else {
      TORCH_CHECK(k.size(2) == p->Nkv * p->D && v.size(2) % p->Nkv == 0, op, ": expected key/value caches ",
                  "[blocknum, blocksize, num_key_value_heads * D] = [.., .., ", p->Nkv * p->D, "], got key ", k.sizes(),
                  ", value ", v.sizes());
      p->Dv = v.size(2) / p->Nkv;
      p->k = {c.block_size * p->Nkv * p->D, p->Nkv * p->D, p->D};
      p->v = {c.block_size * p->Nkv * p->Dv, p->Nkv * p->Dv, p->Dv};
    }
    p->S2 = p->max_blocks * c.block_size;
  } else {
    TORCH_CHECK(k.dim() == qdims && v.dim() == qdims, op, ": expected key and value to be ", qdims,
                "-dimensional like query (layout ", c.layout, "), got key ", k.sizes(), ", value ", v.sizes());
    int64_t kvn = 0;  // the key/value head count their shapes give (4-D and TND)
    switch (in_layout) {
      case Layout::BSH:
        TORCH_CHECK(k.size(2) == p->Nkv * p->D && v.size(2) % p->Nkv == 0, op, ": expected key's hidden size to be ",
                    "num_key_value_heads * D = ", p->Nkv, " * ", p->D, " and value's a multiple of ", p->Nkv,
                    ", got key ", k.sizes(), ", value ", v.sizes());
        p->S2 = k.size(1);
        p->Dv = v.size(2) / p->Nkv;
        TORCH_CHECK(k.size(0) == p->B && v.size(0) == p->B && v.size(1) == p->S2, op, ": expected key and value ",
                    "[B, S, H] with query's B and one S, got query ", q.sizes(), ", key ", k.sizes(), ", value ",
                    v.sizes());
        break;
      case Layout::BSND:
      case Layout::BNSD: {
        const int64_t s = in_layout == Layout::BNSD ? 2 : 1, n = 3 - s;
        kvn = k.size(n);
        p->S2 = k.size(s);
        p->Dv = v.size(3);
        TORCH_CHECK(k.size(0) == p->B && v.size(0) == p->B && v.size(s) == p->S2 && v.size(n) == kvn &&
                        k.size(3) == p->D,
                    op, ": expected key and value with query's B and D and one S and N (layout ", c.layout,
                    "), got query ", q.sizes(), ", key ", k.sizes(), ", value ", v.sizes());
        break;
      }
      case Layout::TND:
        kvn = k.size(1);
        TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == kvn && k.size(2) == p->D, op,
                    ": expected key [T, N, D] and value [T, N, Dv] with query's D, got query ", q.sizes(), ", key ",
                    k.sizes(), ", value ", v.sizes());
        p->Dv = v.size(2);
        break;
      default: break;
    }
    if (kvn != 0) {
      TORCH_CHECK(kvn == p->Nkv, op, ": expected num_key_value_heads (", c.num_kv_heads, ", i.e. ", p->Nkv,
                  " heads) to equal the head dimension of key/value (", kvn, ")");
    }
  }
  TORCH_CHECK(p->D > 0 && p->Dv > 0, op, ": expected head dims of at least 1, got query ", q.sizes(), ", value ",
              v.sizes());

  // per-batch lengths
  if (tnd) {
    TORCH_CHECK(c.qlen.has_value() && c.kvlen.has_value() && !c.qlen->empty() && c.qlen->size() == c.kvlen->size(),
                op, ": input_layout TND needs ", c.qlen_arg, " and ", c.kvlen_arg, ", the cumulative sequence ",
                "lengths of each batch, of the same non-zero length");
    p->B = static_cast<int64_t>(c.qlen->size());
    fa::split_cumulative(op, c.qlen_arg, *c.qlen, T, "query", p->sq, p->q_first, p->tnd_tail);
    fa::split_cumulative(op, c.kvlen_arg, *c.kvlen, k.size(0), "key", p->skv, p->kv_first, p->tnd_tail);
    p->S1 = *std::max_element(p->sq.begin(), p->sq.end());
    p->S2 = *std::max_element(p->skv.begin(), p->skv.end());
  } else {
    p->sq = batch_lengths(c, c.qlen_arg, c.decode ? std::nullopt : c.qlen, p->B, p->S1, "query's S");
    p->skv = batch_lengths(c, c.kvlen_arg, c.kvlen, p->B, p->S2,
                           p->paged ? "block_table's blocks * block_size" : "key's S");
    p->q_first.assign(p->B, 0);
    p->kv_first.assign(p->B, 0);
  }
  const bool untouched = p->tnd_tail || std::any_of(p->sq.begin(), p->sq.end(), [&](int64_t s) { return s < p->S1; });

  if (!p->paged) {
    p->k = fa::layout_strides(in_layout, p->B, p->S2, p->Nkv, p->D);
    p->v = fa::layout_strides(in_layout, p->B, p->S2, p->Nkv, p->Dv);
  }
  p->q = fa::layout_strides(in_layout, p->B, p->S1, p->N, p->D);
  p->out = fa::layout_strides(out_layout, p->B, p->S1, p->N, p->Dv);
  switch (out_layout) {
    case Layout::BSH: p->out_sizes = {p->B, p->S1, p->N * p->Dv}; break;
    case Layout::BSND: p->out_sizes = {p->B, p->S1, p->N, p->Dv}; break;
    case Layout::BNSD: p->out_sizes = {p->B, p->N, p->S1, p->Dv}; break;
    case Layout::TND: p->out_sizes = {T, p->N, p->Dv}; break;
    default: break;
  }

  // mask and sparse mode
  const Tensor& mask = c.mask;
  const int64_t mask_cols_min = p->S2;
  if (c.decode) {
    p->band = false;  // the sparse mode and pre/next_tokens do not apply to one query
    if (mask.defined()) {
      // [B, Skv], [B, 1, Skv], [B, 1, 1, Skv] (B may be 1)
      const bool ok = mask.dim() >= 2 && mask.dim() <= 4 && mask.size(-1) >= mask_cols_min &&
                      (mask.size(0) == 1 || mask.size(0) == p->B) &&
                      (mask.dim() == 2 || (mask.size(-2) == 1 && leading_ok(mask, p->B, p->N)));
      TORCH_CHECK(ok, op, ": expected atten_mask of shape [B, KV_S], [B, 1, KV_S] or [B, 1, 1, KV_S] with B=", p->B,
                  " and KV_S >= ", mask_cols_min, ", got ", mask.sizes());
      p->use_mask = true;
      p->mask = mask.dim() == 2 ? Strides{mask.size(0) == 1 ? 0 : mask.size(1), 0, 0} : leading_strides(mask, p->B, p->N);
    }
  } else {
    TORCH_CHECK(c.sparse_mode >= 0 && c.sparse_mode <= 4, op, ": sparse_mode must be 0 (default mask), 1 (all mask), ",
                "2 (left-up causal), 3 (right-down causal) or 4 (band), got ", c.sparse_mode);
    p->sparse_mode = c.sparse_mode;
    p->pre = std::clamp(c.pre, -fa::kTokensMax, fa::kTokensMax);
    p->next = std::clamp(c.next, -fa::kTokensMax, fa::kTokensMax);
    TORCH_CHECK(mask.defined() || c.sparse_mode == 0, op, ": sparse_mode ", c.sparse_mode, " needs atten_mask");
    p->band = mask.defined();  // no mask, sparse_mode 0: every key, whatever pre/next_tokens say
    if (mask.defined() && c.sparse_mode <= 1) {
      const bool ok = mask.dim() >= 2 && mask.dim() <= 4 && mask.size(-2) >= p->S1 && mask.size(-1) >= mask_cols_min &&
                      (mask.dim() == 2 || tnd || leading_ok(mask, p->B, p->N)) && (!tnd || mask.dim() == 2);
      TORCH_CHECK(ok, op, ": expected atten_mask of shape ",
                  tnd ? "[Q_S, KV_S]" : "[Q_S, KV_S], [B|1, Q_S, KV_S] or [B|1, 1, Q_S, KV_S]", " with B=", p->B,
                  ", Q_S >= ", p->S1, ", KV_S >= ", mask_cols_min, ", got ", mask.sizes());
      p->use_mask = true;
      p->mask = leading_strides(mask, p->B, p->N);
    } else if (mask.defined()) {
      const bool ok = mask.dim() >= 2 && mask.dim() <= 4 && mask.size(-2) == 2048 && mask.size(-1) == 2048 &&
                      mask.numel() == 2048 * 2048;
      TORCH_CHECK(ok, op, ": sparse_mode ", c.sparse_mode, " takes the compressed 2048x2048 atten_mask ",
                  "((2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048)), got ", mask.sizes());
    }
  }
  if (p->use_mask) {
    TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte ||
                    mask.scalar_type() == at::kChar,
                op, ": expected atten_mask to be bool, int8 or uint8 (1 = masked out), got ", mask.scalar_type());
  }

  // pse_shift: [B|1, N, Q_S, KV_S], added after scaling
  if (c.pse.defined()) {
    check_dtype(op, "pse_shift", c.pse, q.scalar_type());
    const bool ok = !tnd && c.pse.dim() == 4 && (c.pse.size(0) == 1 || c.pse.size(0) == p->B) &&
                    c.pse.size(1) == p->N && c.pse.size(2) >= p->S1 && c.pse.size(3) >= mask_cols_min;
    TORCH_CHECK(ok, op, ": expected pse_shift of shape [B, N, Q_S, KV_S] or [1, N, Q_S, KV_S] with B=", p->B,
                ", N=", p->N, ", Q_S >= ", p->S1, ", KV_S >= ", mask_cols_min,
                tnd ? " (and not with input_layout TND)" : "", ", got ", c.pse.sizes());
    p->has_pse = true;
    p->pse = leading_strides(c.pse, p->B, p->N);
  }

  // softmax_lse: [B, N, S1, 1] (TND: [T, N, 1]) float32, one value per row
  p->stat_lanes = 1;
  p->lse = true;
  std::vector<int64_t> lse_sizes;
  if (tnd) {
    lse_sizes = {T, p->N, 1};
    p->stat = {0, p->N, 1};
  } else {
    lse_sizes = {p->B, p->N, p->S1, 1};
    p->stat = {p->N * p->S1, 1, p->S1};
  }

  Prepared r;
  const auto lse_options = q.options().dtype(q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  r.out = untouched ? at::zeros(p->out_sizes, q.options()) : at::empty(p->out_sizes, q.options());
  r.lse = !c.want_lse ? at::empty({0}, lse_options)
                      : (untouched ? at::zeros(lse_sizes, lse_options) : at::empty(lse_sizes, lse_options));
  r.empty = r.out.numel() == 0;
  r.p = std::move(p);
  return r;
}

std::tuple<Tensor, Tensor> run(Call& c) {
  Prepared r = prepare(c);
  if (r.empty) return {r.out, r.lse};
  const auto& p = r.p;
  ops::launch_kernel(c.op, c.q.device().index(),
                     {dense(c.q), dense(c.k), dense(c.v), dense(c.pse), p->use_mask ? dense(c.mask) : Tensor(),
                      Tensor(), r.out, c.want_lse ? r.lse : Tensor(), Tensor(),
                      p->paged ? dense(c.block_table) : Tensor()},
                     fa::work_estimate(*p), [p](const std::vector<Tensor>& t) { fa::forward(*p, t); });
  return {r.out, r.lse};
}

// ---- the operators --------------------------------------------------------------------------
Tensor npu_prompt_flash_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const std::optional<Tensor>& padding_mask, const std::optional<Tensor>& atten_mask,
                                  const std::optional<Tensor>& pse_shift, at::OptionalIntArrayRef actual_seq_lengths,
                                  const std::optional<Tensor>& deq_scale1, const std::optional<Tensor>& quant_scale1,
                                  const std::optional<Tensor>& deq_scale2, const std::optional<Tensor>& quant_scale2,
                                  const std::optional<Tensor>& quant_offset2, int64_t num_heads, double scale_value,
                                  int64_t pre_tokens, int64_t next_tokens, c10::string_view input_layout,
                                  int64_t num_key_value_heads, at::OptionalIntArrayRef actual_seq_lengths_kv,
                                  int64_t sparse_mode) {
  constexpr const char* op = "npu_prompt_flash_attention";
  TORCH_CHECK(!padding_mask.has_value() || !padding_mask->defined(), op,
              ": padding_mask is reserved by torch_npu and unused; pass None");
  reject(op, "deq_scale1", deq_scale1, "int8 quantisation");
  reject(op, "quant_scale1", quant_scale1, "int8 quantisation");
  reject(op, "deq_scale2", deq_scale2, "int8 quantisation");
  reject(op, "quant_scale2", quant_scale2, "int8 output quantisation");
  reject(op, "quant_offset2", quant_offset2, "int8 output quantisation");
  Call c{op};
  c.q = query;
  c.k = key;
  c.v = value;
  c.pse = value_or_undefined(pse_shift);
  c.mask = value_or_undefined(atten_mask);
  c.qlen = to_vector(actual_seq_lengths);
  c.kvlen = to_vector(actual_seq_lengths_kv);
  c.num_heads = num_heads;
  c.num_kv_heads = num_key_value_heads;
  c.scale = scale_value;
  c.pre = pre_tokens;
  c.next = next_tokens;
  c.sparse_mode = sparse_mode;
  c.layout = std::string(input_layout);
  c.layouts = {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  return std::get<0>(run(c));
}

Tensor npu_incre_flash_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                 const std::optional<Tensor>& padding_mask, const std::optional<Tensor>& atten_mask,
                                 const std::optional<Tensor>& pse_shift, at::OptionalSymIntArrayRef actual_seq_lengths,
                                 const std::optional<Tensor>& antiquant_scale,
                                 const std::optional<Tensor>& antiquant_offset,
                                 const std::optional<Tensor>& block_table, const std::optional<Tensor>& dequant_scale1,
                                 const std::optional<Tensor>& quant_scale1, const std::optional<Tensor>& dequant_scale2,
                                 const std::optional<Tensor>& quant_scale2, const std::optional<Tensor>& quant_offset2,
                                 const std::optional<Tensor>& kv_padding_size, int64_t num_heads, double scale_value,
                                 c10::string_view input_layout, int64_t num_key_value_heads, int64_t block_size,
                                 int64_t inner_precise) {
  constexpr const char* op = "npu_incre_flash_attention";
  (void)inner_precise;  // precision modes: the simulator always accumulates in float
  TORCH_CHECK(!padding_mask.has_value() || !padding_mask->defined(), op,
              ": padding_mask is reserved by torch_npu and unused; pass None");
  reject(op, "antiquant_scale", antiquant_scale, "int8 KV cache dequantisation");
  reject(op, "antiquant_offset", antiquant_offset, "int8 KV cache dequantisation");
  reject(op, "dequant_scale1", dequant_scale1, "int8 quantisation");
  reject(op, "quant_scale1", quant_scale1, "int8 quantisation");
  reject(op, "dequant_scale2", dequant_scale2, "int8 quantisation");
  reject(op, "quant_scale2", quant_scale2, "int8 output quantisation");
  reject(op, "quant_offset2", quant_offset2, "int8 output quantisation");
  reject(op, "kv_padding_size", kv_padding_size, "KV left padding");
  Call c{op};
  c.kvlen_arg = "actual_seq_lengths";  // the key/value lengths, in decode
  c.q = query;
  c.k = key;
  c.v = value;
  c.pse = value_or_undefined(pse_shift);
  c.mask = value_or_undefined(atten_mask);
  c.block_table = value_or_undefined(block_table);
  c.kvlen = to_vector(actual_seq_lengths);
  c.num_heads = num_heads;
  c.num_kv_heads = num_key_value_heads;
  c.scale = scale_value;
  c.block_size = block_size;
  c.layout = std::string(input_layout);
  c.layouts = {"BSH", "BSND", "BNSD"};
  c.decode = true;
  return std::get<0>(run(c));
}

std::tuple<Tensor, Tensor> npu_fused_infer_attention_score(
    const Tensor& query, const Tensor& key, const Tensor& value, const std::optional<Tensor>& pse_shift,
    const std::optional<Tensor>& atten_mask, at::OptionalSymIntArrayRef actual_seq_lengths,
    at::OptionalSymIntArrayRef actual_seq_lengths_kv, const std::optional<Tensor>& dequant_scale1,
    const std::optional<Tensor>& quant_scale1, const std::optional<Tensor>& dequant_scale2,
    const std::optional<Tensor>& quant_scale2, const std::optional<Tensor>& quant_offset2,
    const std::optional<Tensor>& antiquant_scale, const std::optional<Tensor>& antiquant_offset,
    const std::optional<Tensor>& key_antiquant_scale, const std::optional<Tensor>& key_antiquant_offset,
    const std::optional<Tensor>& value_antiquant_scale, const std::optional<Tensor>& value_antiquant_offset,
    const std::optional<Tensor>& block_table, const std::optional<Tensor>& query_padding_size,
    const std::optional<Tensor>& kv_padding_size, const std::optional<Tensor>& key_shared_prefix,
    const std::optional<Tensor>& value_shared_prefix, at::OptionalSymIntArrayRef actual_shared_prefix_len,
    const std::optional<Tensor>& query_rope, const std::optional<Tensor>& key_rope,
    const std::optional<Tensor>& key_rope_antiquant_scale, int64_t num_heads, double scale, int64_t pre_tokens,
    int64_t next_tokens, c10::string_view input_layout, int64_t num_key_value_heads, int64_t sparse_mode,
    int64_t inner_precise, int64_t block_size, int64_t antiquant_mode, int64_t key_antiquant_mode,
    int64_t value_antiquant_mode, bool softmax_lse_flag) {
  constexpr const char* op = "npu_fused_infer_attention_score";
  (void)inner_precise;  // precision and invalid-row modes: float accumulation, empty rows give 0
  (void)antiquant_mode;  // modes of the (rejected) antiquant tensors
  (void)key_antiquant_mode;
  (void)value_antiquant_mode;
  reject(op, "dequant_scale1", dequant_scale1, "int8 quantisation");
  reject(op, "quant_scale1", quant_scale1, "int8 quantisation");
  reject(op, "dequant_scale2", dequant_scale2, "int8 quantisation");
  reject(op, "quant_scale2", quant_scale2, "int8 output quantisation");
  reject(op, "quant_offset2", quant_offset2, "int8 output quantisation");
  reject(op, "antiquant_scale", antiquant_scale, "int8 KV cache dequantisation");
  reject(op, "antiquant_offset", antiquant_offset, "int8 KV cache dequantisation");
  reject(op, "key_antiquant_scale", key_antiquant_scale, "KV cache dequantisation");
  reject(op, "key_antiquant_offset", key_antiquant_offset, "KV cache dequantisation");
  reject(op, "value_antiquant_scale", value_antiquant_scale, "KV cache dequantisation");
  reject(op, "value_antiquant_offset", value_antiquant_offset, "KV cache dequantisation");
  reject(op, "query_padding_size", query_padding_size, "query left padding");
  reject(op, "kv_padding_size", kv_padding_size, "KV left padding");
  reject(op, "key_shared_prefix", key_shared_prefix, "shared prefix");
  reject(op, "value_shared_prefix", value_shared_prefix, "shared prefix");
  TORCH_CHECK_NOT_IMPLEMENTED(!actual_shared_prefix_len.has_value(), op,
                              ": actual_shared_prefix_len (shared prefix) is not supported by the simulator; pass None");
  reject(op, "query_rope", query_rope, "MLA rope input");
  reject(op, "key_rope", key_rope, "MLA rope input");
  reject(op, "key_rope_antiquant_scale", key_rope_antiquant_scale, "MLA rope dequantisation");
  Call c{op};
  c.q = query;
  c.k = key;
  c.v = value;
  c.pse = value_or_undefined(pse_shift);
  c.mask = value_or_undefined(atten_mask);
  c.block_table = value_or_undefined(block_table);
  c.qlen = to_vector(actual_seq_lengths);
  c.kvlen = to_vector(actual_seq_lengths_kv);
  c.num_heads = num_heads;
  c.num_kv_heads = num_key_value_heads;
  c.scale = scale;
  c.pre = pre_tokens;
  c.next = next_tokens;
  c.sparse_mode = sparse_mode;
  c.block_size = block_size;
  c.layout = std::string(input_layout);
  c.layouts = {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  c.want_lse = softmax_lse_flag;
  // Q_S == 1 is the decode (IncreFlashAttention) branch, anything else the prefill one.
  std::string upper = c.layout;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const int64_t s_dim = upper == "BNSD" || upper == "BNSD_BSND" ? 2 : 1;
  c.decode = upper != "TND" && query.dim() > s_dim && query.size(s_dim) == 1;
  return run(c);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def(
      "npu_prompt_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
      "Tensor? atten_mask=None, Tensor? pse_shift=None, int[]? actual_seq_lengths=None, Tensor? deq_scale1=None, "
      "Tensor? quant_scale1=None, Tensor? deq_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
      "int num_heads=1, float scale_value=1.0, int pre_tokens=2147483647, int next_tokens=0, "
      "str input_layout=\"BSH\", int num_key_value_heads=0, int[]? actual_seq_lengths_kv=None, "
      "int sparse_mode=0) -> Tensor");
  m.def(
      "npu_incre_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
      "Tensor? atten_mask=None, Tensor? pse_shift=None, SymInt[]? actual_seq_lengths=None, "
      "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? block_table=None, "
      "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
      "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? kv_padding_size=None, int num_heads=1, "
      "float scale_value=1.0, str input_layout=\"BSH\", int num_key_value_heads=0, int block_size=0, "
      "int inner_precise=1) -> Tensor");
  m.def(
      "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
      "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
      "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
      "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
      "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
      "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
      "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
      "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
      "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
      "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
      "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
      "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
      "bool softmax_lse_flag=False) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_prompt_flash_attention", TORCH_FN(npu_prompt_flash_attention));
  m.impl("npu_incre_flash_attention", TORCH_FN(npu_incre_flash_attention));
  m.impl("npu_fused_infer_attention_score", TORCH_FN(npu_fused_infer_attention_score));
}

}  // namespace torch_npu::contrib
