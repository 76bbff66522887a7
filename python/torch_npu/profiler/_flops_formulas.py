"""torch_npu's default FLOPs formulas (``_flops_registry``), one per counted operator.

A matrix product of an (m x k) and a (k x n) operand is 2·m·k·n operations; leading
dimensions of the left operand multiply m. Attention is 2·B·N·(score elements)·(D_qk + D_v)
per call: the score elements are S_q·S_kv per batch and head, less the masked triangle for
the causal sparse modes (2: left-up, 3: right-down), or counted per sequence (``TND``, from
the cumulative ``actual_seq_*`` lengths) and per valid block (block-sparse attention).
Formulas read shapes only (anything with ``.shape``) and raise ValueError on arguments
they cannot count; the hook then logs it and the operator runs uncounted.
"""
from math import prod

from ._flops_registry import register_npu_flop

__all__ = []


# -- shapes --------------------------------------------------------------------------------
def _dims(tensor) -> tuple:
    return tuple(int(d) for d in tensor.shape)


def _gemm_shapes(left: tuple, right: tuple, right_transposed: bool = False) -> int:
    """left (..., m, k) times right (..., k, n): the left's leading dimensions all count as rows."""
    if len(left) < 2 or len(right) < 2:
        raise ValueError(f"Matmul FLOPs requires rank >= 2: {left}, {right}")
    n = right[-2] if right_transposed else right[-1]
    return 2 * prod(left[:-1]) * left[-1] * n


def _gemm(left, right, right_transposed: bool = False) -> int:
    return _gemm_shapes(_dims(left), _dims(right), right_transposed)


def _sequence(value):
    """A list/tuple as is, or what ``value.tolist()`` returns when that is a sequence."""
    if isinstance(value, (list, tuple)):
        return value
    listed = value.tolist() if hasattr(value, "tolist") else None
    if isinstance(listed, (list, tuple)):
        return listed
    raise ValueError("Value must be a sequence or expose tolist() returning a sequence")


def _differences(cumulative):
    """[a, b, c] -> [a, b - a, c - b]."""
    return [v - (cumulative[i - 1] if i else 0) for i, v in enumerate(cumulative)]


def _without_trailing_zeros(values):
    values = [int(v) for v in values]
    while values and values[-1] == 0:
        values.pop()
    return values


def _broadcast(left: tuple, right: tuple) -> tuple:
    width = max(len(left), len(right))
    left, right = (1,) * (width - len(left)) + left, (1,) * (width - len(right)) + right
    out = []
    for a, b in zip(left, right):
        if a != b and 1 not in (a, b):
            raise ValueError(f"Cannot broadcast matmul batch dimensions: {left}, {right}")
        out.append(max(a, b))
    return tuple(out)


# -- attention -----------------------------------------------------------------------------
def _per_head(hidden: int, heads: int) -> int:
    if heads <= 0 or hidden % heads:
        raise ValueError(f"Hidden size {hidden} must be divisible by the number of heads {heads}")
    return hidden // heads


def _bnsd(shape: tuple, layout: str, heads):
    """(batch, heads, sequence, head dim) of an attention operand in ``layout``."""
    if layout == "BNSD":
        return shape
    if layout == "BSND":
        return shape[0], shape[2], shape[1], shape[3]
    if layout == "BSH":
        return shape[0], heads, shape[1], _per_head(shape[2], heads)
    if layout == "SBH":
        return shape[1], heads, shape[0], _per_head(shape[2], heads)
    if layout == "TND":
        return None, shape[1], shape[0], shape[2]
    raise ValueError(f"Invalid layout for FlashAttention input tensor: {layout}")


def _kv_heads(q_shape: tuple, k_shape: tuple, layout: str, q_heads: int) -> int:
    if layout == "BNSD":
        return k_shape[1]
    if layout == "BSND":
        return k_shape[2]
    if layout in ("BSH", "SBH"):
        return _per_head(k_shape[2], _per_head(q_shape[2], q_heads))
    return q_heads


def _score_elements(q_s: int, kv_s: int, sparse_mode: int):
    """Score-matrix elements computed per batch and head."""
    if sparse_mode == 0:
        return q_s * kv_s
    if sparse_mode == 2:  # left-up causal
        return q_s * kv_s - kv_s * kv_s / 2 if q_s >= kv_s else q_s * q_s / 2
    if sparse_mode == 3:  # right-down causal
        return kv_s * kv_s / 2 if q_s >= kv_s else q_s * kv_s - q_s * q_s / 2
    raise ValueError(f"Unknown FLOPs formula for sparse_mode={sparse_mode}")


def _calculate_common_layout_flops(q_shape, k_shape, v_shape, input_layout, sparse_mode, q_heads, kv_heads):
    batch, heads, q_s, q_d = _bnsd(tuple(q_shape), input_layout, q_heads)
    _, _, kv_s, _ = _bnsd(tuple(k_shape), input_layout, kv_heads)
    v_d = _bnsd(tuple(v_shape), input_layout, kv_heads)[3]
    return int(2 * batch * heads * _score_elements(q_s, kv_s, sparse_mode) * (q_d + v_d))


def _calculate_tnd_layout_flops(q_shape, k_shape, v_shape, actual_seq_qlen, actual_seq_kvlen, q_heads=None):
    if actual_seq_qlen is None or actual_seq_kvlen is None:
        raise ValueError("TND layout requires actual_seq_qlen and actual_seq_kvlen")
    q_lens = _differences(_without_trailing_zeros(actual_seq_qlen))
    kv_lens = _differences(_without_trailing_zeros(actual_seq_kvlen))
    if len(q_lens) != len(kv_lens) or min(q_lens + kv_lens, default=0) < 0:
        raise ValueError("actual_seq_qlen and actual_seq_kvlen must contain valid cumulative lengths")
    scores = sum(q * kv for q, kv in zip(q_lens, kv_lens))
    return int(2 * (q_heads or q_shape[1]) * (q_shape[2] + v_shape[2]) * scores)


@register_npu_flop(target="torch_npu:npu_fusion_attention", is_default=True)
def npu_fusion_attention_flops(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                               atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                               next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                               actual_seq_kvlen=None, sparse_mode=0, *args, **kwargs):
    q, k, v = _dims(query), _dims(key), _dims(value)
    if input_layout == "TND":
        return _calculate_tnd_layout_flops(q, k, v, actual_seq_qlen, actual_seq_kvlen)
    return _calculate_common_layout_flops(q, k, v, input_layout, sparse_mode, head_num,
                                          _kv_heads(q, k, input_layout, head_num))


@register_npu_flop(target="torch_npu:npu_fused_infer_attention_score", is_default=True)
def npu_fused_infer_attention_score_flops(query, key, value, *, input_layout, num_heads, num_key_value_heads=0,
                                          actual_seq_lengths=None, actual_seq_lengths_kv=None, sparse_mode=0,
                                          **kwargs):
    q, k, v = _dims(query), _dims(key), _dims(value)
    if input_layout == "TND":
        return _calculate_tnd_layout_flops(q, k, v, actual_seq_lengths, actual_seq_lengths_kv, num_heads)
    return _calculate_common_layout_flops(q, k, v, input_layout, sparse_mode, num_heads,
                                          num_key_value_heads or num_heads)


def _lengths(given, batch: int, default: int, cumulative: bool):
    if given is None:
        return [default] * batch
    lengths = _without_trailing_zeros(given)
    if len(lengths) != batch:
        raise ValueError(f"Expected {batch} sequence lengths, got {len(lengths)}")
    lengths = _differences(lengths) if cumulative else lengths
    if min(lengths, default=0) < 0:
        raise ValueError("Sequence lengths must be non-negative")
    return lengths


@register_npu_flop(target="torch_npu:npu_block_sparse_attention", is_default=True)
def npu_block_sparse_attention_flops(query, key, value, block_sparse_mask, block_shape, *, q_input_layout="TND",
                                     kv_input_layout="TND", num_key_value_heads=1, scale_value=0.0, inner_precise=1,
                                     actual_seq_lengths=None, actual_seq_lengths_kv=None, softmax_lse_flag=0,
                                     **kwargs):
    mask = _sequence(block_sparse_mask)  # [batch][head][query block][kv block]
    _, _, q_s, q_d = _bnsd(_dims(query), q_input_layout, len(mask[0]) if mask else None)
    _, _, kv_s, v_d = _bnsd(_dims(value), kv_input_layout, num_key_value_heads)
    q_lens = _lengths(actual_seq_lengths, len(mask), q_s, q_input_layout == "TND")
    kv_lens = _lengths(actual_seq_lengths_kv, len(mask), kv_s, kv_input_layout == "TND")
    rows, cols = (int(d) for d in block_shape)

    def tokens(length, block, size):  # tokens of a sequence that fall in block number `block`
        return max(0, min(size, length - block * size))

    elements = sum(tokens(q_lens[b], i, rows) * tokens(kv_lens[b], j, cols)
                   for b, heads in enumerate(mask) for blocks in heads
                   for i, valid in enumerate(blocks) for j, on in enumerate(valid) if on)
    return int(2 * elements * (q_d + v_d))


# -- matrix products -----------------------------------------------------------------------
@register_npu_flop(target="torch_npu:npu_all_gather_base_mm", is_default=True)
def npu_all_gather_base_mm_flops(x1, x2, hcom, world_size, bias=None, x1_scale=None, x2_scale=None, gather_index=0,
                                 gather_output=True, comm_turn=0, output_dtype=None, comm_mode=None, **kwargs):
    m_local, k = _dims(x1)[-2:]
    return 2 * m_local * int(world_size) * k * _dims(x2)[-1]  # the gathered x1 times x2


@register_npu_flop(target="torch_npu:npu_transpose_batchmatmul", is_default=True)
def npu_transpose_batchmatmul_flops(input, weight, *, bias=None, scale=None, perm_x1=(0, 1, 2), perm_x2=(0, 1, 2),
                                    perm_y=(1, 0, 2), batch_split_factor=1, **kwargs):
    def permuted(shape, perm):
        if len(shape) != len(perm):
            raise ValueError(f"Permutation {perm} does not match tensor shape {shape}")
        return tuple(shape[int(i)] for i in perm)

    return _gemm_shapes(permuted(_dims(input), perm_x1), permuted(_dims(weight), perm_x2))


def _group_rows(group_list, groups: int, rows: int):
    if groups == 1:
        return [rows]
    if group_list is None:
        raise ValueError("Grouped matmul FLOPs requires group_list for split groups")
    sizes = [int(g) for g in _sequence(group_list)]
    if len(sizes) != groups:
        raise ValueError(f"Expected {groups} groups, got {len(sizes)}")
    if sizes[-1] == rows and sum(sizes) > rows:  # cumulative (group_list_type 0)
        sizes = _differences(sizes)
    if sum(sizes) != rows:
        raise ValueError("group_list does not match grouped matmul token count")
    return sizes


@register_npu_flop(target="torch_npu:npu_grouped_matmul", is_default=True)
def npu_grouped_matmul_flops(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                             antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                             activation_quant_scale=None, activation_quant_offset=None, split_item=0,
                             group_type=None, group_list_type=0, act_type=0, output_dtype=None, tuning_config=None,
                             **kwargs):
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    ws = list(weight) if isinstance(weight, (list, tuple)) else [weight]
    if len(xs) == len(ws):
        return sum(_gemm(a, b) for a, b in zip(xs, ws))
    if len(xs) != 1:
        raise ValueError(f"Grouped matmul FLOPs requires matching groups: {len(xs)}, {len(ws)}")
    shape = _dims(xs[0])
    sizes = _group_rows(group_list, len(ws), prod(shape[:-1]))
    return sum(_gemm_shapes((rows, shape[-1]), _dims(w)) for rows, w in zip(sizes, ws))


@register_npu_flop(target="torch_npu:npu_quant_matmul_gelu", is_default=True)
def npu_quant_matmul_gelu_flops(x1, x2, x1_scale, x2_scale, *, bias=None, approximate="gelu_erf", **kwargs):
    return _gemm(x1, x2)


@register_npu_flop(target="torch_npu:npu_grouped_matmul_swiglu_quant_v2", is_default=True)
def npu_grouped_matmul_swiglu_quant_v2_flops(x, weight, weight_scale, x_scale, group_list, *, smooth_scale=None,
                                             weight_assist_matrix=None, bias=None, dequant_mode=0, dequant_dtype=0,
                                             quant_mode=0, quant_dtype=0, group_list_type=0, tuning_config=None,
                                             **kwargs):
    # every token meets one expert's weight; weight and weight_scale are one-tensor lists, and N
    # is read from the scale (the weight may hold packed int4 columns)
    scale = weight_scale[0] if isinstance(weight_scale, (list, tuple)) else weight_scale
    return 2 * prod(_dims(x)[:-1]) * _dims(x)[-1] * _dims(scale)[-1]


def _routed_gemm(gmm_x, gmm_weight, mm_x, mm_weight, trans_gmm_weight, trans_mm_weight):
    flops = _gemm(gmm_x, gmm_weight, trans_gmm_weight)
    if mm_x is not None and mm_weight is not None:  # the shared expert
        flops += _gemm(mm_x, mm_weight, trans_mm_weight)
    return flops


@register_npu_flop(target="torch_npu:npu_alltoallv_gmm", is_default=True)
def npu_alltoallv_gmm_flops(gmm_x, gmm_weight, hcom, ep_world_size, send_counts, recv_counts, *,
                            send_counts_tensor=None, recv_counts_tensor=None, mm_x=None, mm_weight=None,
                            trans_gmm_weight=False, trans_mm_weight=False, permute_out_flag=False, **kwargs):
    return _routed_gemm(gmm_x, gmm_weight, mm_x, mm_weight, trans_gmm_weight, trans_mm_weight)


@register_npu_flop(target="torch_npu:npu_gmm_alltoallv", is_default=True)
def npu_gmm_alltoallv_flops(gmm_x, gmm_weight, hcom, ep_world_size, send_counts, recv_counts, *,
                            send_counts_tensor=None, recv_counts_tensor=None, mm_x=None, mm_weight=None,
                            trans_gmm_weight=False, trans_mm_weight=False, **kwargs):
    return _routed_gemm(gmm_x, gmm_weight, mm_x, mm_weight, trans_gmm_weight, trans_mm_weight)


@register_npu_flop(target="torch:mm", is_default=True)
def mm_flops(input, other, **kwargs):
    return _gemm(input, other)


@register_npu_flop(target="torch:bmm", is_default=True)
def bmm_flops(input, other, **kwargs):
    return _gemm(input, other)


@register_npu_flop(target="torch:matmul", is_default=True)
def matmul_flops(input, other, **kwargs):
    a, b = _dims(input), _dims(other)
    if len(a) == 1 and len(b) == 1:
        return 2 * a[0]  # dot product
    if len(a) == 1:
        return 2 * prod(b[:-2]) * a[0] * b[-1]
    if len(b) == 1:
        return 2 * prod(a[:-2]) * a[-2] * a[-1]
    return 2 * prod(_broadcast(a[:-2], b[:-2])) * a[-2] * a[-1] * b[-1]


@register_npu_flop(target="torch.nn.functional:linear", is_default=True)
def linear_flops(input, weight, bias=None, **kwargs):
    return _gemm(input, weight, right_transposed=True)  # weight is (out, in)


@register_npu_flop(target="torch:addmm", is_default=True)
def addmm_flops(self, mat1, mat2, beta=1, alpha=1, **kwargs):
    return _gemm(mat1, mat2)
