// Inference attention: npu_prompt_flash_attention (prefill), npu_incre_flash_attention
// (decode), npu_fused_infer_attention_score (either, by the query length) and its _v2
// (the same operator with v2's argument names and learnable_sink), with .out variants
// for the last two:
//
//   out = Softmax(scale * Q K^T + pse_shift, masked [, sink]) V
//
// in torch_npu's layouts (BSH, BSND, BNSD, NSD, the ragged TND and NTD, and conversions
// such as BNSD_BSND or TND_NTD), per-batch actual lengths, GQA (num_key_value_heads), the
// sparse modes 0-4 and a paged KV cache (block_table, block_size; also under a ragged
// query). These operators only check their arguments and describe the problem
// (fa::Problem); the kernel is the blockwise online-softmax forward of
// npu_fusion_attention (attention.cpp): no S1 x S2 matrix is stored, the extra memory is
// one kv head's keys and values per thread plus query-block tiles.
//
// Quantisation (int8 in/out, antiquant), left padding, shared prefixes and MLA rope
// inputs are rejected with an error naming the argument.
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
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

namespace torch_npu::custom_ops {
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

// The arguments the operators share, named as torch_npu names them.
struct Call {
  const char* op;
  const char* qlen_arg = "actual_seq_lengths";
  const char* kvlen_arg = "actual_seq_lengths_kv";
  const char* heads_arg = "num_heads";
  Tensor q, k, v, pse, mask, block_table, sink;
  std::optional<std::vector<int64_t>> qlen, kvlen;
  int64_t num_heads = 1, num_kv_heads = 0, pre = 0, next = 0, sparse_mode = 0, block_size = 0;
  double scale = 1.0;
  std::string layout;
  std::vector<std::string> layouts;  // the layouts the operator takes
  bool decode = false;               // one query per sequence: no sparse mode, masks [B, Skv]
  bool decode_if_one = false;        // decode when the query has one token per sequence (FIA)
  bool want_lse = false;
  bool check_only = false;           // check the arguments, allocate nothing (get_max_workspace)
  Tensor out_dst, lse_dst;           // the .out variants' outputs
};

// A layout: the tensor's axes from outermost to innermost. BSH is BSND with N and D
// merged into H; TND and NTD are ragged: their S axis is T, the batches' rows one after
// the other (cumulative actual lengths), and they have no B axis (nor does NSD: B = 1).
struct Lay {
  std::string name, axes;
  bool bsh = false, ragged = false;
  int64_t rank() const { return static_cast<int64_t>(axes.size()) - (bsh ? 1 : 0); }
};

Lay lay_of(const std::string& s) {
  if (s == "BSH") return {s, "BSND", true, false};
  if (s == "TND") return {s, "SND", false, true};
  if (s == "NTD") return {s, "NSD", false, true};
  return {s, s, false, false};  // BSND, BNSD, NSD, NBSD
}

// "BNSD_BSND" -> (BNSD, BSND): the input layout and that of the output.
std::pair<Lay, Lay> parse_layouts(const Call& c) {
  std::string u = c.layout;
  for (auto& ch : u) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::string list;
  for (const auto& l : c.layouts) list += (list.empty() ? "" : ", ") + l;
  TORCH_CHECK(std::find(c.layouts.begin(), c.layouts.end(), u) != c.layouts.end(), c.op,
              ": expected input_layout to be one of ", list, ", got \"", c.layout, "\"");
  const auto cut = u.find('_');
  if (cut == std::string::npos) return {lay_of(u), lay_of(u)};
  return {lay_of(u.substr(0, cut)), lay_of(u.substr(cut + 1))};
}

// The sizes of a tensor in layout `l`: B (1 when the layout has none), S (T when
// ragged), N, D. For BSH, N is `bsh_heads` and D = H / N.
struct Dims {
  int64_t B = 1, S = 0, N = 0, D = 0;
};

Dims dims_of(const Lay& l, const Tensor& t, int64_t bsh_heads) {
  Dims d;
  if (l.bsh) return {t.size(0), t.size(1), bsh_heads, t.size(2) / bsh_heads};
  for (size_t i = 0; i < l.axes.size(); ++i) {
    const int64_t n = t.size(static_cast<int64_t>(i));
    switch (l.axes[i]) {
      case 'B': d.B = n; break;
      case 'S': d.S = n; break;
      case 'N': d.N = n; break;
      default: d.D = n; break;
    }
  }
  return d;
}

// Element strides of a contiguous tensor of layout `l` (batch stride 0 without a B axis).
Strides strides_of(const Lay& l, int64_t B, int64_t S, int64_t N, int64_t D) {
  Strides st;
  int64_t acc = 1;
  for (auto it = l.axes.rbegin(); it != l.axes.rend(); ++it) {
    switch (*it) {
      case 'B': st.batch = acc; acc *= B; break;
      case 'S': st.seq = acc; acc *= S; break;
      case 'N': st.head = acc; acc *= N; break;
      default: acc *= D; break;
    }
  }
  return st;
}

std::vector<int64_t> sizes_of(const Lay& l, int64_t B, int64_t S, int64_t N, int64_t D) {
  if (l.bsh) return {B, S, N * D};
  std::vector<int64_t> sizes;
  for (char a : l.axes) sizes.push_back(a == 'B' ? B : a == 'S' ? S : a == 'N' ? N : D);
  return sizes;
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

// An output: a new tensor, or the .out variant's `dst` (resized to `sizes`). A `dst`
// the kernel cannot write in place (not contiguous) gets a new tensor, copied to it after.
Tensor output(const Call& c, const char* arg, const Tensor& dst, c10::IntArrayRef sizes,
              const at::TensorOptions& options, bool zero) {
  if (dst.defined()) {
    TORCH_CHECK(dst.device() == c.q.device(), c.op, ": expected ", arg, " on ", c.q.device(), " like query, got ",
                dst.device());
    TORCH_CHECK(dst.scalar_type() == options.dtype().toScalarType(), c.op, ": expected ", arg, " of dtype ",
                options.dtype(), ", got ", dst.scalar_type());
    at::native::resize_output(dst, sizes);
    for (const Tensor* in : {&c.q, &c.k, &c.v}) at::assert_no_overlap(dst, *in);  // read while written
    if (dst.is_contiguous()) {
      if (zero) dst.zero_();
      return dst;
    }
  }
  return zero ? at::zeros(sizes, options) : at::empty(sizes, options);
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
                  {"block_table", c.block_table},
                  {"learnable_sink", c.sink}});
  check_float(op, "query", c.q);
  check_dtype(op, "key", c.k, c.q.scalar_type());
  check_dtype(op, "value", c.v, c.q.scalar_type());
  TORCH_CHECK(c.num_heads > 0, op, ": expected ", c.heads_arg, " > 0, got ", c.num_heads);
  TORCH_CHECK(c.num_kv_heads >= 0, op, ": expected num_key_value_heads >= 0 (0: ", c.heads_arg, "), got ",
              c.num_kv_heads);
  const auto [in, out] = parse_layouts(c);
  const bool ragged = in.ragged;

  auto p = std::make_shared<Problem>();
  p->layout = ragged ? Layout::TND : in.bsh ? Layout::BSH : Layout::BNSD;  // informative: strides below
  p->pse_scaled = false;  // scale * Q K^T + pse_shift
  p->scale = c.scale;
  p->N = c.num_heads;
  p->Nkv = c.num_kv_heads == 0 ? c.num_heads : c.num_kv_heads;
  TORCH_CHECK(p->N % p->Nkv == 0, op, ": num_key_value_heads (", p->Nkv, ") must divide ", c.heads_arg, " (", p->N,
              ")");
  p->G = p->N / p->Nkv;

  // query
  const Tensor& q = c.q;
  TORCH_CHECK(q.dim() == in.rank(), op, ": expected query to be ", in.rank(), "-dimensional for input_layout ",
              c.layout, ", got shape ", q.sizes());
  if (in.bsh) {
    TORCH_CHECK(q.size(2) % p->N == 0, op, ": ", c.heads_arg, " (", p->N,
                ") must divide the hidden size of query (", q.size(2), "), whose shape is ", q.sizes());
  }
  const Dims qd = dims_of(in, q, p->N);
  TORCH_CHECK(qd.N == p->N, op, ": expected ", c.heads_arg, " (", p->N, ") to equal query's head dimension ", qd.N,
              " (query shape ", q.sizes(), ", layout ", c.layout, ")");
  const int64_t T = ragged ? qd.S : 0;  // query rows of a ragged layout
  p->B = qd.B;
  p->S1 = qd.S;
  p->D = qd.D;
  if (c.decode_if_one) c.decode = !ragged && p->S1 == 1;
  if (c.decode) {
    TORCH_CHECK(!ragged && p->S1 == 1, op, ": expected one query token per sequence (S = 1) for decode, got query ",
                q.sizes(), " in layout ", c.layout);
  }
  if (ragged) {  // the batches: the cumulative query lengths
    TORCH_CHECK(c.qlen.has_value() && !c.qlen->empty(), op, ": input_layout ", c.layout, " needs ", c.qlen_arg,
                ", the cumulative sequence lengths of each batch (e.g. [2, 4, 6] for lengths 2, 2, 2)");
    p->B = static_cast<int64_t>(c.qlen->size());
    fa::split_cumulative(op, c.qlen_arg, *c.qlen, T, "query", p->sq, p->q_first, p->tnd_tail);
    p->S1 = *std::max_element(p->sq.begin(), p->sq.end());
  }

  // key / value: dense in the query's layout, or a paged cache
  const Tensor &k = c.k, &v = c.v;
  int64_t kv_rows = 0;  // rows of dense key/value (T of a ragged layout)
  p->paged = c.block_table.defined();
  if (p->paged) {
    const Tensor& bt = c.block_table;
    TORCH_CHECK(bt.scalar_type() == at::kInt && bt.dim() == 2 && bt.size(0) == p->B, op,
                ": expected block_table to be an int32 [B, maxBlocksPerSeq] tensor with B=", p->B, ", got ",
                bt.scalar_type(), " ", bt.sizes());
    if (ragged) {
      TORCH_CHECK(c.block_size > 0 && c.block_size <= 1024 && c.block_size % 16 == 0, op,
                  ": expected block_size to be a multiple of 16 in [16, 1024] with block_table and input_layout ",
                  c.layout, ", got ", c.block_size);
    } else {
      TORCH_CHECK(c.block_size > 0 && c.block_size <= 512, op,
                  ": expected block_size in [1, 512] with block_table, got ", c.block_size);
    }
    if (!c.decode && !ragged) {
      TORCH_CHECK(c.block_size % 128 == 0, op, ": expected block_size to be a multiple of 128 for a prefill "
                  "(query S > 1) with block_table, got ", c.block_size);
    }
    TORCH_CHECK(c.kvlen.has_value(), op, ": a paged KV cache (block_table) needs ", c.kvlen_arg,
                ", the number of cached tokens of each batch");
    p->block_size = c.block_size;
    p->max_blocks = bt.size(1);
    p->num_blocks = k.size(0);
    // [blocknum, Nkv, blocksize, D] is taken unless the query is BSH or BSND.
    const bool four_ok = !in.bsh && in.name != "BSND";
    const bool four = k.dim() == 4;
    TORCH_CHECK(k.dim() == 3 || (four && four_ok), op, ": expected the paged key cache to be ",
                four_ok ? "[blocknum, blocksize, H] or [blocknum, numKvHeads, blocksize, D]"
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
    TORCH_CHECK(k.dim() == in.rank() && v.dim() == in.rank(), op, ": expected key and value to be ", in.rank(),
                "-dimensional like query (layout ", c.layout, "), got key ", k.sizes(), ", value ", v.sizes());
    if (in.bsh) {
      TORCH_CHECK(k.size(2) == p->Nkv * p->D && v.size(2) % p->Nkv == 0, op, ": expected key's hidden size to be ",
                  "num_key_value_heads * D = ", p->Nkv, " * ", p->D, " and value's a multiple of ", p->Nkv,
                  ", got key ", k.sizes(), ", value ", v.sizes());
    }
    const Dims kd = dims_of(in, k, p->Nkv), vd = dims_of(in, v, p->Nkv);
    TORCH_CHECK(kd.N == p->Nkv, op, ": expected num_key_value_heads (", c.num_kv_heads, ", i.e. ", p->Nkv,
                " heads) to equal the head dimension of key/value (", kd.N, ")");
    TORCH_CHECK((ragged || kd.B == p->B) && vd.B == kd.B && vd.S == kd.S && vd.N == kd.N && kd.D == p->D, op,
                ": expected key and value with query's B and D and one S and N (layout ", c.layout,
                "), got query ", q.sizes(), ", key ", k.sizes(), ", value ", v.sizes());
    kv_rows = kd.S;
    p->S2 = kd.S;
    p->Dv = vd.D;
  }
  TORCH_CHECK(p->D > 0 && p->Dv > 0, op, ": expected head dims of at least 1, got query ", q.sizes(), ", value ",
              v.sizes());

  // per-batch lengths
  if (ragged && !p->paged) {
    TORCH_CHECK(c.kvlen.has_value() && c.kvlen->size() == c.qlen->size(), op, ": input_layout ", c.layout, " needs ",
                c.kvlen_arg, ", the cumulative key/value lengths of each batch, as many as ", c.qlen_arg, " (",
                c.qlen->size(), ")");
    fa::split_cumulative(op, c.kvlen_arg, *c.kvlen, kv_rows, "key", p->skv, p->kv_first, p->tnd_tail);
    p->S2 = *std::max_element(p->skv.begin(), p->skv.end());
  } else {
    if (!ragged) {
      p->sq = batch_lengths(c, c.qlen_arg, c.decode ? std::nullopt : c.qlen, p->B, p->S1, "query's S");
      p->q_first.assign(p->B, 0);
    }
    // paged: per-batch cached tokens (also with a ragged query)
    p->skv = batch_lengths(c, c.kvlen_arg, c.kvlen, p->B, p->S2,
                           p->paged ? "block_table's blocks * block_size" : "key's S");
    p->kv_first.assign(p->B, 0);
  }
  const bool untouched = p->tnd_tail || std::any_of(p->sq.begin(), p->sq.end(), [&](int64_t s) { return s < p->S1; });

  const int64_t q_rows = ragged ? T : p->S1;
  if (!p->paged) {
    p->k = strides_of(in, p->B, kv_rows, p->Nkv, p->D);
    p->v = strides_of(in, p->B, kv_rows, p->Nkv, p->Dv);
  }
  p->q = strides_of(in, p->B, q_rows, p->N, p->D);
  p->out = strides_of(out, p->B, q_rows, p->N, p->Dv);
  p->out_sizes = sizes_of(out, p->B, q_rows, p->N, p->Dv);

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
                      (mask.dim() == 2 || ragged || leading_ok(mask, p->B, p->N)) && (!ragged || mask.dim() == 2);
      TORCH_CHECK(ok, op, ": expected atten_mask of shape ",
                  ragged ? "[Q_S, KV_S]" : "[Q_S, KV_S], [B|1, Q_S, KV_S] or [B|1, 1, Q_S, KV_S]", " with B=", p->B,
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
    const bool ok = !ragged && c.pse.dim() == 4 && (c.pse.size(0) == 1 || c.pse.size(0) == p->B) &&
                    c.pse.size(1) == p->N && c.pse.size(2) >= p->S1 && c.pse.size(3) >= mask_cols_min;
    TORCH_CHECK(ok, op, ": expected pse_shift of shape [B, N, Q_S, KV_S] or [1, N, Q_S, KV_S] with B=", p->B,
                ", N=", p->N, ", Q_S >= ", p->S1, ", KV_S >= ", mask_cols_min,
                ragged ? " (and not with a TND/NTD input_layout)" : "", ", got ", c.pse.sizes());
    p->has_pse = true;
    p->pse = leading_strides(c.pse, p->B, p->N);
  }

  // learnable_sink: one logit per query head, in the softmax denominator only
  if (c.sink.defined()) {
    TORCH_CHECK(at::isFloatingType(c.sink.scalar_type()) && c.sink.dim() == 1 && c.sink.size(0) == p->N, op,
                ": expected learnable_sink to be a floating [", c.heads_arg, "] = [", p->N, "] tensor, got ",
                c.sink.scalar_type(), " ", c.sink.sizes());
    p->has_sink = true;
  }

  // softmax_lse: [B, N, S1, 1] (TND/NTD: [T, N, 1]) float32, one value per row
  p->stat_lanes = 1;
  p->lse = true;
  std::vector<int64_t> lse_sizes;
  if (ragged) {
    lse_sizes = {T, p->N, 1};
    p->stat = {0, p->N, 1};
  } else {
    lse_sizes = {p->B, p->N, p->S1, 1};
    p->stat = {p->N * p->S1, 1, p->S1};
  }

  Prepared r;
  if (c.check_only) return r;
  const auto lse_options = q.options().dtype(q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  r.out = output(c, "attention_out", c.out_dst, p->out_sizes, q.options(), untouched);
  // without softmax_lse_flag: an empty lse (the .out variant's softmax_lse is left alone)
  r.lse = !c.want_lse ? (c.lse_dst.defined() ? c.lse_dst : at::empty({0}, lse_options))
                      : output(c, "softmax_lse", c.lse_dst, lse_sizes, lse_options, untouched);
  r.empty = r.out.numel() == 0;
  r.p = std::move(p);
  return r;
}

std::tuple<Tensor, Tensor> run(Call& c) {
  Prepared r = prepare(c);
  const auto& p = r.p;
  if (!r.empty) {
    // the kernel reads the sink in its accumulation type
    const Tensor sink = c.sink.defined() ? c.sink.to(c.q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat)
                                         : Tensor();
    ops::launch_kernel(c.op, c.q.device().index(),
                       {dense(c.q), dense(c.k), dense(c.v), dense(c.pse), p->use_mask ? dense(c.mask) : Tensor(),
                        dense(sink), r.out, c.want_lse ? r.lse : Tensor(), Tensor(),
                        p->paged ? dense(c.block_table) : Tensor()},
                       fa::work_estimate(*p), [p](const std::vector<Tensor>& t) { fa::forward(*p, t); });
  }
  // .out variants whose outputs were not contiguous: computed aside, copied in
  if (c.out_dst.defined() && !c.out_dst.is_same(r.out)) c.out_dst.copy_(r.out);
  if (c.want_lse && c.lse_dst.defined() && !c.lse_dst.is_same(r.lse)) c.lse_dst.copy_(r.lse);
  return {r.out, r.lse};
}

// ---- the operators --------------------------------------------------------------------------
// The layouts of npu_fused_infer_attention_score(_v2): "IN_OUT" converts the layout.
const std::vector<std::string> kFiaLayouts = {"BSH",      "BSND",      "BNSD",      "TND",       "NTD",
                                              "NSD",      "BNSD_BSND", "BSH_BNSD",  "BSND_BNSD", "NTD_TND",
                                              "TND_NTD",  "BSH_NBSD",  "BSND_NBSD", "BNSD_NBSD"};

// The arguments npu_fused_infer_attention_score and its v2 share (their names differ); the
// prompt and incremental flash attention operators start from them too.
Call fia_common(const char* op, const Tensor& query, const Tensor& key, const Tensor& value,
                const std::optional<Tensor>& pse_shift, const std::optional<Tensor>& atten_mask,
                const std::optional<Tensor>& block_table, std::optional<std::vector<int64_t>> qlen,
                std::optional<std::vector<int64_t>> kvlen, int64_t num_heads, int64_t num_kv_heads, double scale,
                int64_t pre_tokens, int64_t next_tokens, int64_t sparse_mode, int64_t block_size,
                c10::string_view input_layout, bool want_lse) {
  Call c{op};
  c.q = query;
  c.k = key;
  c.v = value;
  c.pse = value_or_undefined(pse_shift);
  c.mask = value_or_undefined(atten_mask);
  c.block_table = value_or_undefined(block_table);
  c.qlen = std::move(qlen);
  c.kvlen = std::move(kvlen);
  c.num_heads = num_heads;
  c.num_kv_heads = num_kv_heads;
  c.scale = scale;
  c.pre = pre_tokens;
  c.next = next_tokens;
  c.sparse_mode = sparse_mode;
  c.block_size = block_size;
  c.layout = std::string(input_layout);
  c.layouts = kFiaLayouts;
  c.want_lse = want_lse;
  c.decode_if_one = true;  // Q_S == 1: the decode (IncreFlashAttention) branch, else the prefill one
  return c;
}

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
  Call c = fia_common(op, query, key, value, pse_shift, atten_mask, /*block_table=*/std::nullopt,
                      to_vector(actual_seq_lengths), to_vector(actual_seq_lengths_kv), num_heads, num_key_value_heads,
                      scale_value,
                      pre_tokens, next_tokens, sparse_mode, /*block_size=*/0, input_layout, /*want_lse=*/false);
  c.layouts = {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  c.decode_if_one = false;  // always the prefill branch
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
  Call c = fia_common(op, query, key, value, pse_shift, atten_mask, block_table, /*qlen=*/std::nullopt,
                      to_vector(actual_seq_lengths), num_heads, num_key_value_heads, scale_value, /*pre_tokens=*/0,
                      /*next_tokens=*/0, /*sparse_mode=*/0, block_size, input_layout, /*want_lse=*/false);
  c.kvlen_arg = "actual_seq_lengths";  // the key/value lengths, in decode
  c.layouts = {"BSH", "BSND", "BNSD"};
  c.decode = true;
  c.decode_if_one = false;
  return std::get<0>(run(c));
}


Call fia_call(
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
  return fia_common(op, query, key, value, pse_shift, atten_mask, block_table, to_vector(actual_seq_lengths),
                    to_vector(actual_seq_lengths_kv), num_heads, num_key_value_heads, scale, pre_tokens, next_tokens, sparse_mode,
                    block_size, input_layout, softmax_lse_flag);
}

// The argument list of npu_fused_infer_attention_score, for its .out to pass on.
#define FIA_PARAMS                                                                                                \
  const Tensor& query, const Tensor& key, const Tensor& value, const std::optional<Tensor>& pse_shift,            \
      const std::optional<Tensor>& atten_mask, at::OptionalSymIntArrayRef actual_seq_lengths,                     \
      at::OptionalSymIntArrayRef actual_seq_lengths_kv, const std::optional<Tensor>& dequant_scale1,              \
      const std::optional<Tensor>& quant_scale1, const std::optional<Tensor>& dequant_scale2,                     \
      const std::optional<Tensor>& quant_scale2, const std::optional<Tensor>& quant_offset2,                      \
      const std::optional<Tensor>& antiquant_scale, const std::optional<Tensor>& antiquant_offset,                \
      const std::optional<Tensor>& key_antiquant_scale, const std::optional<Tensor>& key_antiquant_offset,        \
      const std::optional<Tensor>& value_antiquant_scale, const std::optional<Tensor>& value_antiquant_offset,    \
      const std::optional<Tensor>& block_table, const std::optional<Tensor>& query_padding_size,                  \
      const std::optional<Tensor>& kv_padding_size, const std::optional<Tensor>& key_shared_prefix,               \
      const std::optional<Tensor>& value_shared_prefix, at::OptionalSymIntArrayRef actual_shared_prefix_len,      \
      const std::optional<Tensor>& query_rope, const std::optional<Tensor>& key_rope,                             \
      const std::optional<Tensor>& key_rope_antiquant_scale, int64_t num_heads, double scale, int64_t pre_tokens, \
      int64_t next_tokens, c10::string_view input_layout, int64_t num_key_value_heads, int64_t sparse_mode,       \
      int64_t inner_precise, int64_t block_size, int64_t antiquant_mode, int64_t key_antiquant_mode,              \
      int64_t value_antiquant_mode, bool softmax_lse_flag

#define FIA_ARGS                                                                                                     \
  query, key, value, pse_shift, atten_mask, actual_seq_lengths, actual_seq_lengths_kv, dequant_scale1, quant_scale1, \
      dequant_scale2, quant_scale2, quant_offset2, antiquant_scale, antiquant_offset, key_antiquant_scale,           \
      key_antiquant_offset, value_antiquant_scale, value_antiquant_offset, block_table, query_padding_size,          \
      kv_padding_size, key_shared_prefix, value_shared_prefix, actual_shared_prefix_len, query_rope, key_rope,       \
      key_rope_antiquant_scale, num_heads, scale, pre_tokens, next_tokens, input_layout, num_key_value_heads,        \
      sparse_mode, inner_precise, block_size, antiquant_mode, key_antiquant_mode, value_antiquant_mode,              \
      softmax_lse_flag

std::tuple<Tensor, Tensor> npu_fused_infer_attention_score(FIA_PARAMS) {
  Call c = fia_call(FIA_ARGS);
  return run(c);
}

// workspace: the simulator's kernel needs none (it takes and ignores one).
std::tuple<Tensor&, Tensor&> npu_fused_infer_attention_score_out(FIA_PARAMS, const std::optional<Tensor>& workspace,
                                                                 Tensor& attention_out, Tensor& softmax_lse) {
  (void)workspace;
  Call c = fia_call(FIA_ARGS);
  c.op = "npu_fused_infer_attention_score.out";
  c.out_dst = attention_out;
  c.lse_dst = softmax_lse;
  run(c);
  return {attention_out, softmax_lse};
}

// npu_fused_infer_attention_score_v2: the same operator with v2's argument names;
// the *_dtype arguments are reserved (torch_npu uses them only for quantised types).
#define FIA_V2_PARAMS                                                                                         \
  const Tensor& query, const Tensor& key, const Tensor& value, const std::optional<Tensor>& query_rope,       \
      const std::optional<Tensor>& key_rope, const std::optional<Tensor>& pse_shift,                          \
      const std::optional<Tensor>& atten_mask, at::OptionalSymIntArrayRef actual_seq_qlen,                    \
      at::OptionalSymIntArrayRef actual_seq_kvlen, const std::optional<Tensor>& block_table,                  \
      const std::optional<Tensor>& dequant_scale_query, const std::optional<Tensor>& dequant_scale_key,       \
      const std::optional<Tensor>& dequant_offset_key, const std::optional<Tensor>& dequant_scale_value,      \
      const std::optional<Tensor>& dequant_offset_value, const std::optional<Tensor>& dequant_scale_key_rope, \
      const std::optional<Tensor>& quant_scale_out, const std::optional<Tensor>& quant_offset_out,            \
      const std::optional<Tensor>& quant_scale_p, const std::optional<Tensor>& learnable_sink,                \
      int64_t num_query_heads, int64_t num_key_value_heads, double softmax_scale, int64_t pre_tokens,         \
      int64_t next_tokens, c10::string_view input_layout, int64_t sparse_mode, int64_t block_size,            \
      int64_t query_quant_mode, int64_t key_quant_mode, int64_t value_quant_mode, int64_t inner_precise,      \
      bool return_softmax_lse, std::optional<int64_t> query_dtype, std::optional<int64_t> key_dtype,          \
      std::optional<int64_t> value_dtype, std::optional<int64_t> query_rope_dtype,                            \
      std::optional<int64_t> key_rope_dtype, std::optional<int64_t> key_shared_prefix_dtype,                  \
      std::optional<int64_t> value_shared_prefix_dtype, std::optional<int64_t> dequant_scale_query_dtype,     \
      std::optional<int64_t> dequant_scale_key_dtype, std::optional<int64_t> dequant_scale_value_dtype,       \
      std::optional<int64_t> dequant_scale_key_rope_dtype, std::optional<int64_t> out_dtype

#define FIA_V2_ARGS                                                                                               \
  query, key, value, query_rope, key_rope, pse_shift, atten_mask, actual_seq_qlen, actual_seq_kvlen, block_table, \
      dequant_scale_query, dequant_scale_key, dequant_offset_key, dequant_scale_value, dequant_offset_value,      \
      dequant_scale_key_rope, quant_scale_out, quant_offset_out, quant_scale_p, learnable_sink, num_query_heads,  \
      num_key_value_heads, softmax_scale, pre_tokens, next_tokens, input_layout, sparse_mode, block_size,         \
      query_quant_mode, key_quant_mode, value_quant_mode, inner_precise, return_softmax_lse, query_dtype,         \
      key_dtype, value_dtype, query_rope_dtype, key_rope_dtype, key_shared_prefix_dtype,                          \
      value_shared_prefix_dtype, dequant_scale_query_dtype, dequant_scale_key_dtype, dequant_scale_value_dtype,   \
      dequant_scale_key_rope_dtype, out_dtype

Call fia_v2_call(FIA_V2_PARAMS) {
  constexpr const char* op = "npu_fused_infer_attention_score_v2";
  // precision/invalid-row modes and the modes of the (rejected) quantisation tensors
  (void)inner_precise, (void)query_quant_mode, (void)key_quant_mode, (void)value_quant_mode;
  // reserved, or used by torch_npu for quantised inputs/outputs only (rejected below)
  (void)query_dtype, (void)key_dtype, (void)value_dtype, (void)query_rope_dtype, (void)key_rope_dtype;
  (void)key_shared_prefix_dtype, (void)value_shared_prefix_dtype, (void)dequant_scale_query_dtype;
  (void)dequant_scale_key_dtype, (void)dequant_scale_value_dtype, (void)dequant_scale_key_rope_dtype, (void)out_dtype;
  reject(op, "query_rope", query_rope, "MLA rope input");
  reject(op, "key_rope", key_rope, "MLA rope input");
  reject(op, "dequant_scale_query", dequant_scale_query, "int8 quantisation");
  reject(op, "dequant_scale_key", dequant_scale_key, "KV cache dequantisation");
  reject(op, "dequant_offset_key", dequant_offset_key, "KV cache dequantisation");
  reject(op, "dequant_scale_value", dequant_scale_value, "KV cache dequantisation");
  reject(op, "dequant_offset_value", dequant_offset_value, "KV cache dequantisation");
  reject(op, "dequant_scale_key_rope", dequant_scale_key_rope, "reserved by torch_npu");
  reject(op, "quant_scale_out", quant_scale_out, "int8 output quantisation");
  reject(op, "quant_offset_out", quant_offset_out, "int8 output quantisation");
  reject(op, "quant_scale_p", quant_scale_p, "reserved by torch_npu");
  Call c = fia_common(op, query, key, value, pse_shift, atten_mask, block_table, to_vector(actual_seq_qlen),
                      to_vector(actual_seq_kvlen), num_query_heads, num_key_value_heads, softmax_scale, pre_tokens, next_tokens, sparse_mode,
                      block_size, input_layout, return_softmax_lse);
  c.qlen_arg = "actual_seq_qlen";
  c.kvlen_arg = "actual_seq_kvlen";
  c.heads_arg = "num_query_heads";
  c.sink = value_or_undefined(learnable_sink);
  return c;
}

std::tuple<Tensor, Tensor> npu_fused_infer_attention_score_v2(FIA_V2_PARAMS) {
  Call c = fia_v2_call(FIA_V2_ARGS);
  return run(c);
}

std::tuple<Tensor&, Tensor&> npu_fused_infer_attention_score_v2_out(FIA_V2_PARAMS,
                                                                    const std::optional<Tensor>& workspace,
                                                                    Tensor& attention_out, Tensor& softmax_lse) {
  (void)workspace;
  Call c = fia_v2_call(FIA_V2_ARGS);
  c.op = "npu_fused_infer_attention_score_v2.out";
  c.out_dst = attention_out;
  c.lse_dst = softmax_lse;
  run(c);
  return {attention_out, softmax_lse};
}

// _npu_fused_infer_attention_score(_v2)_get_max_workspace: the workspace the .out variant
// may be given. The simulator's kernel needs none: the arguments are checked as the
// operator checks them and the workspace is empty.
Tensor max_workspace(Call c) {
  c.check_only = true;
  prepare(c);
  return at::empty({0}, c.q.options());
}

// _npu_fused_infer_attention_score(_v2)_infer_output: new (attention_out, softmax_lse)
// for the .out variant, from the query's and value's shapes alone.
std::tuple<Tensor, Tensor> infer_output(const char* op, const Tensor& query, const Tensor& value,
                                        c10::string_view input_layout, const Tensor& block_table, int64_t num_heads,
                                        int64_t num_key_value_heads, bool want_lse, const char* heads_arg) {
  Call c{op};
  c.q = query;
  c.layout = std::string(input_layout);
  c.layouts = kFiaLayouts;
  npu_device(op, {{"query", query}, {"value", value}, {"block_table", block_table}});
  check_float(op, "query", query);
  TORCH_CHECK(num_heads > 0 && num_key_value_heads >= 0, op, ": expected ", heads_arg,
              " > 0 and num_key_value_heads >= 0, got ", num_heads, " and ", num_key_value_heads);
  const int64_t nkv = num_key_value_heads == 0 ? num_heads : num_key_value_heads;
  const auto [in, out] = parse_layouts(c);
  TORCH_CHECK(query.dim() == in.rank() && (!in.bsh || query.size(2) % num_heads == 0), op, ": expected query to be ",
              in.rank(), "-dimensional for input_layout ", c.layout,
              in.bsh ? " with a hidden size that num_heads divides" : "", ", got shape ", query.sizes());
  const Dims qd = dims_of(in, query, num_heads);
  int64_t dv = 0;
  if (block_table.defined()) {  // [blocknum, blocksize, Nkv * Dv] or [blocknum, Nkv, blocksize, Dv]
    TORCH_CHECK(value.dim() == 3 || value.dim() == 4, op, ": expected a paged value cache of 3 or 4 dimensions, got ",
                value.sizes());
    dv = value.dim() == 3 ? value.size(2) / nkv : value.size(3);
  } else {
    TORCH_CHECK(value.dim() == in.rank(), op, ": expected value to be ", in.rank(), "-dimensional like query, got ",
                value.sizes());
    dv = dims_of(in, value, nkv).D;
  }
  const int64_t rows = qd.S;  // S, or T of a ragged layout
  Tensor attention_out = at::empty(sizes_of(out, qd.B, rows, qd.N, dv), query.options());
  const auto lse_options = query.options().dtype(query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  Tensor lse = !want_lse ? at::empty({0}, lse_options)
               : in.ragged ? at::empty({rows, qd.N, 1}, lse_options)
                           : at::empty({qd.B, qd.N, rows, 1}, lse_options);
  return {attention_out, lse};
}

Tensor npu_fused_infer_attention_score_get_max_workspace(FIA_PARAMS) { return max_workspace(fia_call(FIA_ARGS)); }

std::tuple<Tensor, Tensor> npu_fused_infer_attention_score_infer_output(
    const Tensor& query, const Tensor& value, c10::string_view input_layout, const std::optional<Tensor>& quant_scale2,
    const std::optional<Tensor>& block_table, int64_t num_heads, int64_t num_key_value_heads, bool softmax_lse_flag,
    const std::optional<Tensor>& query_rope) {
  constexpr const char* op = "_npu_fused_infer_attention_score_infer_output";
  reject(op, "quant_scale2", quant_scale2, "int8 output quantisation");
  reject(op, "query_rope", query_rope, "MLA rope input");
  return infer_output(op, query, value, input_layout, value_or_undefined(block_table), num_heads,
                      num_key_value_heads, softmax_lse_flag, "num_heads");
}

Tensor npu_fused_infer_attention_score_v2_get_max_workspace(FIA_V2_PARAMS) {
  return max_workspace(fia_v2_call(FIA_V2_ARGS));
}

std::tuple<Tensor, Tensor> npu_fused_infer_attention_score_v2_infer_output(
    const Tensor& query, const Tensor& value, std::optional<int64_t> query_dtype, std::optional<int64_t> value_dtype,
    c10::string_view input_layout, const std::optional<Tensor>& quant_scale_out,
    const std::optional<Tensor>& block_table, int64_t num_query_heads, int64_t num_key_value_heads,
    bool return_softmax_lse, const std::optional<Tensor>& query_rope, std::optional<int64_t> out_dtype) {
  constexpr const char* op = "_npu_fused_infer_attention_score_v2_infer_output";
  (void)query_dtype, (void)value_dtype, (void)out_dtype;  // for quantised types only (rejected)
  reject(op, "quant_scale_out", quant_scale_out, "int8 output quantisation");
  reject(op, "query_rope", query_rope, "MLA rope input");
  return infer_output(op, query, value, input_layout, value_or_undefined(block_table), num_query_heads,
                      num_key_value_heads, return_softmax_lse, "num_query_heads");
}

}  // namespace

// The schemas are torch_npu's (op-plugin's op_plugin_functions.yaml).
#define FIA_SCHEMA_ARGS                                                                                  \
  "Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "                                  \
  "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "   \
  "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "                \
  "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "                \
  "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, " \
  "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "  \
  "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "      \
  "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, " \
  "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "     \
  "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "                    \
  "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "                \
  "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "                         \
  "bool softmax_lse_flag=False"

#define FIA_V2_SCHEMA_ARGS                                                                                 \
  "Tensor query, Tensor key, Tensor value, *, Tensor? query_rope=None, Tensor? key_rope=None, "            \
  "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, "                      \
  "SymInt[]? actual_seq_kvlen=None, Tensor? block_table=None, Tensor? dequant_scale_query=None, "          \
  "Tensor? dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "    \
  "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, Tensor? quant_scale_out=None, " \
  "Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, "               \
  "int num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, int pre_tokens=2147483647, " \
  "int next_tokens=2147483647, str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, "            \
  "int query_quant_mode=0, int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, "            \
  "bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, int? value_dtype=None, "     \
  "int? query_rope_dtype=None, int? key_rope_dtype=None, int? key_shared_prefix_dtype=None, "              \
  "int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, "                             \
  "int? dequant_scale_key_dtype=None, int? dequant_scale_value_dtype=None, "                               \
  "int? dequant_scale_key_rope_dtype=None, int? out_dtype=None"

#define OUT_SCHEMA_ARGS \
  ", Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))"

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
  m.def("npu_fused_infer_attention_score(" FIA_SCHEMA_ARGS ") -> (Tensor, Tensor)");
  m.def("npu_fused_infer_attention_score.out(" FIA_SCHEMA_ARGS OUT_SCHEMA_ARGS);
  m.def("npu_fused_infer_attention_score_v2(" FIA_V2_SCHEMA_ARGS ") -> (Tensor, Tensor)");
  m.def("npu_fused_infer_attention_score_v2.out(" FIA_V2_SCHEMA_ARGS OUT_SCHEMA_ARGS);
  m.def("_npu_fused_infer_attention_score_get_max_workspace(" FIA_SCHEMA_ARGS ") -> Tensor");
  m.def(
      "_npu_fused_infer_attention_score_infer_output(Tensor query, Tensor value, *, str input_layout=\"BSH\", "
      "Tensor? quant_scale2=None, Tensor? block_table=None, int num_heads=1, int num_key_value_heads=0, "
      "bool softmax_lse_flag=False, Tensor? query_rope=None) -> (Tensor, Tensor)");
  m.def("_npu_fused_infer_attention_score_v2_get_max_workspace(" FIA_V2_SCHEMA_ARGS ") -> Tensor");
  m.def(
      "_npu_fused_infer_attention_score_v2_infer_output(Tensor query, Tensor value, *, int? query_dtype=None, "
      "int? value_dtype=None, str input_layout=\"BSH\", Tensor? quant_scale_out=None, Tensor? block_table=None, "
      "int num_query_heads=1, int num_key_value_heads=0, bool return_softmax_lse=False, Tensor? query_rope=None, "
      "int? out_dtype=None) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_prompt_flash_attention", TORCH_FN(npu_prompt_flash_attention));
  m.impl("npu_incre_flash_attention", TORCH_FN(npu_incre_flash_attention));
  m.impl("npu_fused_infer_attention_score", TORCH_FN(npu_fused_infer_attention_score));
  m.impl("npu_fused_infer_attention_score.out", TORCH_FN(npu_fused_infer_attention_score_out));
  m.impl("npu_fused_infer_attention_score_v2", TORCH_FN(npu_fused_infer_attention_score_v2));
  m.impl("npu_fused_infer_attention_score_v2.out", TORCH_FN(npu_fused_infer_attention_score_v2_out));
  m.impl("_npu_fused_infer_attention_score_get_max_workspace",
         TORCH_FN(npu_fused_infer_attention_score_get_max_workspace));
  m.impl("_npu_fused_infer_attention_score_infer_output", TORCH_FN(npu_fused_infer_attention_score_infer_output));
  m.impl("_npu_fused_infer_attention_score_v2_get_max_workspace",
         TORCH_FN(npu_fused_infer_attention_score_v2_get_max_workspace));
  m.impl("_npu_fused_infer_attention_score_v2_infer_output",
         TORCH_FN(npu_fused_infer_attention_score_v2_infer_output));
}

}  // namespace torch_npu::custom_ops
