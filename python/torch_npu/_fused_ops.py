"""The fused operators of ``custom_ops/`` (``torch.ops.npu.*``) as ``torch_npu.<name>``,
and their fake (meta) implementations, which give output shapes to torch.compile,
FakeTensorMode and the meta device without running a kernel.

The kernels, argument checks and autograd are C++ (custom_ops/src); a fake implementation
only states shapes and dtypes, for arguments the C++ checks accept.
"""
from __future__ import annotations

import math

import torch

_NAMESPACE = "npu::"


def fused_op_names() -> list[str]:
    """Names of the registered ``torch.ops.npu`` operators (one per schema name)."""
    names = {n[len(_NAMESPACE):] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith(_NAMESPACE)}
    return sorted(n.split(".", 1)[0] for n in names)


def export(module) -> list[str]:
    """Sets ``module.<name> = torch.ops.npu.<name>`` for every fused operator (those whose out
    form writes several named tensors also take them as an ``out=`` tuple, see _with_out_tuple)."""
    names = fused_op_names()
    for name in names:
        packet = getattr(torch.ops.npu, name)
        outs = _out_names(packet)
        setattr(module, name, _with_out_tuple(name, packet, outs) if outs else packet)
    return names


def _out_names(packet) -> list[str]:
    """The keyword-only tensors an ``out`` overload writes, unless that is the one ``out``."""
    if "out" not in packet.overloads():
        return []
    names = [a.name for a in packet.out._schema.arguments
             if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    return [] if names == ["out"] else names


def _with_out_tuple(name, packet, out_names):
    """torch_npu's binding of an operator whose out form writes several tensors (npu_apply_adam:
    var, m, v): they may come as ``out=(var, m, v)``, as torch's ``max(..., out=(values, indices))``.
    TorchScript sees the operator itself."""
    def op(*args, out=None, **kwargs):
        if out is not None:
            outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
            if len(outs) != len(out_names):
                raise TypeError(f"{name}(): out must be a tuple of {len(out_names)} tensors "
                                f"({', '.join(out_names)}), got {len(outs)}")
            kwargs.update(zip(out_names, outs))
        return packet(*args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = packet.__doc__
    torch.jit._builtins._register_builtin(op, f"npu::{name}")
    return op


#: The operators torch_npu lists in ``torch_npu.__all__``: op-plugin's functions marked
#: ``exposed`` for torch 2.13 and newer (op_plugin_functions.yaml; torch_npu generates them into
#: torch_npu/utils/exposed_api.py). The other operators are attributes of torch_npu only, as there.
EXPOSED = frozenset({
    "_npu_dropout", "fast_gelu", "npu_advance_step_flashattn", "npu_all_gather_base_mm",
    "npu_alloc_float_status", "npu_alltoallv_gmm", "npu_alltoallv_quant_gmm", "npu_anchor_response_flags",
    "npu_anti_quant", "npu_apply_rotary_pos_emb", "npu_batch_nms", "npu_bert_apply_adam",
    "npu_block_sparse_attention", "npu_bmmV2", "npu_bounding_box_decode", "npu_bounding_box_encode",
    "npu_ciou", "npu_clear_float_status", "npu_clipped_swiglu", "npu_confusion_transpose", "npu_conv3d",
    "npu_convert_weight_to_int4pack", "npu_cross_entropy_loss", "npu_deformable_conv2d",
    "npu_dense_lightning_indexer_grad_kl_loss", "npu_dense_lightning_indexer_softmax_lse", "npu_diou",
    "npu_dropout_with_add_softmax", "npu_dynamic_block_quant", "npu_dynamic_quant",
    "npu_dynamic_quant_asymmetric", "npu_fast_gelu", "npu_ffn", "npu_fused_attention_score",
    "npu_fused_causal_conv1d", "npu_fusion_attention", "npu_gather_sparse_index", "npu_gelu_mul",
    "npu_get_float_status", "npu_giou", "npu_gmm_alltoallv", "npu_grid_assign_positive", "npu_group_norm_silu",
    "npu_group_norm_swish", "npu_grouped_matmul", "npu_grouped_matmul_finalize_routing",
    "npu_incre_flash_attention", "npu_indexing", "npu_iou", "npu_kv_quant_sparse_flash_attention",
    "npu_lightning_indexer", "npu_linear", "npu_lstm", "npu_masked_causal_conv1d", "npu_max", "npu_mhc_post",
    "npu_mhc_post_backward", "npu_mhc_sinkhorn", "npu_mla_prolog", "npu_mla_prolog_v2",
    "npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base", "npu_moe_compute_expert_tokens",
    "npu_moe_finalize_routing", "npu_moe_gating_top_k_backward", "npu_moe_gating_top_k_softmax",
    "npu_moe_gating_top_k_softmax_v2", "npu_moe_init_routing", "npu_moe_update_expert", "npu_mrope",
    "npu_multi_head_attention", "npu_nms_v4", "npu_nms_with_mask", "npu_one_hot", "npu_pad", "npu_prefetch",
    "npu_prompt_flash_attention", "npu_ps_roi_pooling", "npu_quant_gmm_alltoallv",
    "npu_quant_lightning_indexer", "npu_quant_matmul", "npu_quant_matmul_gelu", "npu_quant_matmul_reduce_sum",
    "npu_quant_scatter", "npu_quant_scatter_", "npu_quantize", "npu_random_choice_with_mask",
    "npu_recurrent_gated_delta_rule", "npu_recurrent_gated_delta_rule_functional", "npu_ring_attention_update",
    "npu_rms_norm", "npu_roi_align", "npu_rotary_mul", "npu_rotate_quant", "npu_rotated_iou",
    "npu_rotated_overlaps", "npu_scaled_masked_softmax", "npu_scatter_nd_update", "npu_scatter_nd_update_",
    "npu_scatter_pa_kv_cache", "npu_sign_bits_pack", "npu_sign_bits_unpack", "npu_sim_exponential_",
    "npu_slice", "npu_softmax_cross_entropy_with_logits", "npu_sparse_flash_attention",
    "npu_sparse_lightning_indexer_grad_kl_loss", "npu_swiglu", "npu_trans_quant_param", "npu_transpose",
    "npu_transpose_batchmatmul", "npu_transpose_quant_batchmatmul", "npu_weight_quant_batchmatmul",
    "npu_yolo_boxes_encode", "scatter_update", "scatter_update_",
})


_fake = torch.library.register_fake


@_fake("npu::npu_rms_norm")
def _npu_rms_norm(self, gamma, epsilon=1e-6):
    lead = self.dim() - gamma.dim()
    rstd_shape = list(self.shape[:lead]) + [1] * gamma.dim()
    return self.new_empty(self.shape), self.new_empty(rstd_shape, dtype=torch.float32)


@_fake("npu::npu_rms_norm_backward")
def _npu_rms_norm_backward(dy, self, gamma, rstd):
    return self.new_empty(self.shape), gamma.new_empty(gamma.shape)


@_fake("npu::npu_add_rms_norm")
def _npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    y, rstd = _npu_rms_norm(x1, gamma, epsilon)
    return y, rstd, x1.new_empty(x1.shape)


def _glu_out_shape(self, dim):
    shape = list(self.shape)
    shape[dim] = shape[dim] // 2
    return shape


@_fake("npu::npu_swiglu")
def _npu_swiglu(self, dim=-1):
    return self.new_empty(_glu_out_shape(self, dim))


@_fake("npu::npu_swiglu_backward")
def _npu_swiglu_backward(grad_output, self, dim=-1):
    return self.new_empty(self.shape)


@_fake("npu::npu_geglu")
def _npu_geglu(self, dim=-1, approximate=1, activate_left=False):
    shape = _glu_out_shape(self, dim)
    return self.new_empty(shape), self.new_empty(shape)


@_fake("npu::npu_geglu_grad")
def _npu_geglu_grad(grad_output, self, gelu, dim=-1, approximate=1, activate_left=False):
    return self.new_empty(self.shape)


@_fake("npu::npu_fast_gelu")
def _npu_fast_gelu(self):
    return self.new_empty(self.shape)


@_fake("npu::npu_fast_gelu_backward")
def _npu_fast_gelu_backward(grad, self):
    return self.new_empty(self.shape)


@_fake("npu::npu_rotary_mul")
def _npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    return self.new_empty(self.shape)


@_fake("npu::npu_rotary_mul_backward")
def _npu_rotary_mul_backward(grad, self, r1, r2, rotary_mode="half"):
    return self.new_empty(self.shape), r1.new_empty(r1.shape), r2.new_empty(r2.shape)


@_fake("npu::npu_apply_rotary_pos_emb")
def _npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    return query, key


@_fake("npu::npu_scaled_masked_softmax")
def _npu_scaled_masked_softmax(x, mask, scale=1, fixed_triu_mask=False):
    return x.new_empty(x.shape)


@_fake("npu::npu_scaled_masked_softmax_backward")
def _npu_scaled_masked_softmax_backward(y_grad, y, mask, scale, fixed_triu_mask):
    return y.new_empty(y.shape)


@_fake("npu::npu_dropout_with_add_softmax")
def _npu_dropout_with_add_softmax(self, x1, alpha, prob, dim):
    return self.new_empty(self.shape, dtype=torch.uint8), self.new_empty(self.shape), self.new_empty(self.shape)


@_fake("npu::npu_dropout_with_add_softmax_backward")
def _npu_dropout_with_add_softmax_backward(grad, mask, softmax_out, alpha, prob, dim):
    return grad.new_empty(grad.shape), grad.new_empty(grad.shape)


@_fake("npu::npu_confusion_transpose")
def _npu_confusion_transpose(self, perm, shape, transpose_first):
    return self.new_empty(list(shape) if transpose_first else [shape[p] for p in perm])


@_fake("npu::npu_confusion_transpose_backward")
def _npu_confusion_transpose_backward(grad, perm, shape, transpose_first):
    return grad.new_empty(list(shape))


def _attention_out_shape(query, key, value, head_num, layout):
    """attention_out's shape: query's, with value's head dim (torch_npu's rule for BSH/SBH)."""
    if layout in ("BSH", "SBH"):
        d = query.shape[2] // head_num
        dv = value.shape[2] // (key.shape[2] // d)
        return list(query.shape[:2]) + [head_num * dv]
    return list(query.shape[:-1]) + [value.shape[-1]]


def _attention_lengths(query, key, head_num, layout, actual_seq_qlen, actual_seq_kvlen):
    """(batch, query length, mask elements) of npu_fusion_attention's arguments."""
    if layout == "TND":
        def lengths(ends):
            ends = list(ends)
            while len(ends) > 1 and ends[-1] == 0:  # trailing zeros: batches left out
                ends.pop()
            return [e - s for s, e in zip([0] + ends[:-1], ends)]
        numels = head_num * sum(a * b for a, b in zip(lengths(actual_seq_qlen), lengths(actual_seq_kvlen)))
        return len(actual_seq_qlen), query.shape[0], numels
    b, s1, s2 = {"BSH": (0, 1, 1), "SBH": (1, 0, 0), "BNSD": (0, 2, 2), "BSND": (0, 1, 1)}[layout]
    return query.shape[b], query.shape[s1], query.shape[b] * head_num * query.shape[s1] * key.shape[s2]


_compile_dropout_warned = False


@_fake("npu::npu_fusion_attention")
def _npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                          atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                          next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                          actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                          softmax_layout="", sink=None, dropout_mask=None, seed=0, offset=0):
    global _compile_dropout_warned
    layout = input_layout.upper()
    batch, s1, numels = _attention_lengths(query, key, head_num, layout, actual_seq_qlen, actual_seq_kvlen)
    stat_shape = [s1, head_num, 8] if layout == "TND" else [batch, head_num, s1, 8]
    stat_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    if keep_prob < 1 and seed == 0 and not _compile_dropout_warned:
        # As torch_npu: the seed drawn at run time is not visible to a traced graph.
        import warnings
        warnings.warn("npu_fusion_attention with keep_prob < 1 traced with a fake seed: a traced backward "
                      "cannot see the seed and offset drawn at run time; pass seed= and offset= explicitly "
                      "to keep forward and backward dropout masks equal", UserWarning, stacklevel=2)
        _compile_dropout_warned = True
    return (query.new_empty(_attention_out_shape(query, key, value, head_num, layout)),
            query.new_empty(stat_shape, dtype=stat_dtype), query.new_empty(stat_shape, dtype=stat_dtype),
            query.new_empty([0]), seed, offset, numels)


@_fake("npu::npu_fusion_attention_grad")
def _npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                               atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                               attention_in=None, scale_value=1.0, keep_prob=1.0, pre_tockens=2147483647,
                               next_tockens=2147483647, inner_precise=0, seed=0, offset=0, numels=0,
                               prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                               gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    stat_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    dpse = pse.new_empty(pse.shape) if pse is not None else query.new_empty([0])
    dsink = sink.new_empty(sink.shape) if sink is not None else query.new_empty([0], dtype=stat_dtype)
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dpse, dsink)


@_fake("npu::npu_moe_gating_top_k_softmax")
def _npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    shape = list(x.shape[:-1]) + [k]
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


@_fake("npu::npu_moe_init_routing")
def _npu_moe_init_routing(x, row_idx, expert_idx, active_num):
    n, k = expert_idx.shape
    return (x.new_empty((min(active_num, n) * k, x.shape[1])), row_idx.new_empty((n * k,)),
            expert_idx.new_empty((n * k,)))


def _grouped_matmul_fake(x, weight, bias=None, group_list=None, split_item=0, group_type=None, **_):
    if group_type == 2:  # K split: [M, N] per group, or their [G, M, N] stack
        groups = len(group_list) if isinstance(group_list, (list, tuple)) else group_list.shape[0]
        m, n = x[0].shape[0], weight[0].shape[-1]
        if (split_item or 0) >= 2:
            return [x[0].new_empty((groups, m, n))]
        return [x[0].new_empty((m, n)) for _ in range(groups)]
    if len(weight) == 1 and weight[0].dim() == 3:
        weight = list(weight[0].unbind(0))
    if (split_item or 0) >= 2:
        rows = x[0].shape[0] if group_list is not None else sum(t.numel() // t.shape[-1] for t in x)
        return [x[0].new_empty((rows, weight[0].shape[1]))]
    if group_list is None:
        return [xi.new_empty(list(xi.shape[:-1]) + [w.shape[1]]) for xi, w in zip(x, weight)]
    if isinstance(group_list, (list, tuple)):
        sizes = [b - a for a, b in zip([0] + list(group_list[:-1]), group_list)]
    else:  # row counts held by a tensor: data-dependent output shapes
        ctx = torch.library.get_ctx()
        sizes = [ctx.new_dynamic_size() for _ in weight]
    return [x[0].new_empty((s, w.shape[1])) for s, w in zip(sizes, weight)]


@_fake("npu::npu_grouped_matmul")
def _npu_grouped_matmul(x, weight, *, bias=None, group_list=None, split_item=0, group_type=None, **kwargs):
    return _grouped_matmul_fake(x, weight, bias, group_list, split_item, group_type)


@_fake("npu::npu_grouped_matmul.List")
def _npu_grouped_matmul_list(x, weight, *, bias=None, group_list=None, split_item=0, group_type=None, **kwargs):
    return _grouped_matmul_fake(x, weight, bias, group_list, split_item, group_type)


# ---- fused optimizer kernels (custom_ops/src/optim.cpp) ----------------------------------------
@_fake("npu::npu_apply_adam_w")
def _npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                      max_grad_norm=None, amsgrad=None, maximize=None):
    return grad.new_empty(grad.shape), grad.new_empty(grad.shape), grad.new_empty(grad.shape)


@_fake("npu::npu_apply_adam")
def _npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking=None,
                    use_nesterov=None):
    return grad.new_empty(grad.shape), grad.new_empty(grad.shape), grad.new_empty(grad.shape)


@_fake("npu::_npu_dropout_gen_mask.Tensor")
def _npu_dropout_gen_mask_seeded(self, size, p, seed, offset, *, parallel=True, sync=None):
    n = math.prod(size)
    return self.new_empty([(n + 127) // 128 * 16], dtype=torch.uint8)


def _fake_inplace_step(*args, **kwargs):
    """The _npu_fused_<opt>_step kernels update their buffers in place and return nothing."""
    return None


for _name in ("adam", "sgd", "rmsprop", "rmsprop_tf", "adadelta", "lamb", "bert_adam", "adamp"):
    _fake(f"npu::_npu_fused_{_name}_step")(_fake_inplace_step)


# ---- vision (custom_ops/src/vision.cpp) ----

@_fake("npu::npu_iou")
def _npu_iou(bboxes, gtboxes, mode=0):
    return bboxes.new_empty((gtboxes.shape[0], bboxes.shape[0]))


@_fake("npu::npu_ptiou")
def _npu_ptiou(bboxes, gtboxes, mode=0):
    return bboxes.new_empty((gtboxes.shape[0], bboxes.shape[0]))


@_fake("npu::npu_giou")
def _npu_giou(self, gtboxes, trans=False, is_cross=False, mode=0):
    return self.new_empty((self.shape[1], gtboxes.shape[1] if is_cross else 1))


@_fake("npu::npu_giou_backward")
def _npu_giou_backward(grad, bboxes, gtboxes, trans=False, is_cross=False, mode=0):
    return bboxes.new_empty(bboxes.shape), gtboxes.new_empty(gtboxes.shape)


@_fake("npu::npu_nms_v4")
def _npu_nms_v4(self, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    if pad_to_max_output_size:
        size = int(max_output_size)
    else:
        size = torch.library.get_ctx().new_dynamic_size()
    return self.new_empty((size,), dtype=torch.int32), self.new_empty((), dtype=torch.int32)


@_fake("npu::npu_nms_with_mask")
def _npu_nms_with_mask(input, iou_threshold):
    n = input.shape[0]
    return (input.new_empty((n, 5)), input.new_empty((n,), dtype=torch.int32),
            input.new_empty((n,), dtype=torch.uint8))


@_fake("npu::npu_nms_rotated")
def _npu_nms_rotated(self, scores, iou_threshold, scores_threshold=0, max_output_size=-1, mode=0):
    size = torch.library.get_ctx().new_dynamic_size()
    return self.new_empty((size,), dtype=torch.int32), self.new_empty((1,), dtype=torch.int32)


@_fake("npu::npu_roi_align")
def _npu_roi_align(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode):
    return self.new_empty((rois.shape[0], self.shape[1], pooled_height, pooled_width))


@_fake("npu::npu_roi_alignbk")
def _npu_roi_alignbk(self, rois, xdiff_shape, pooled_width, pooled_height, spatial_scale, sample_num,
                     roi_end_mode=None):
    return self.new_empty(tuple(xdiff_shape))


def _dcn_out_hw(input, weight, stride, padding, dilation):
    kh, kw = weight.shape[2], weight.shape[3]
    oh = (input.shape[2] + padding[0] + padding[1] - ((kh - 1) * dilation[2] + 1)) // stride[2] + 1
    ow = (input.shape[3] + padding[2] + padding[3] - ((kw - 1) * dilation[3] + 1)) // stride[3] + 1
    return kh, kw, oh, ow


@_fake("npu::npu_deformable_conv2d")
def _npu_deformable_conv2d(input, weight, offset, bias, kernel_size, stride, padding, dilation=(1, 1, 1, 1),
                           groups=1, deformable_groups=1, modulated=True):
    kh, kw, oh, ow = _dcn_out_hw(input, weight, stride, padding, dilation)
    return (input.new_empty((input.shape[0], weight.shape[0], oh, ow)),
            input.new_empty((input.shape[0], input.shape[1], oh * kh, ow * kw)))


@_fake("npu::npu_deformable_conv2dbk")
def _npu_deformable_conv2dbk(input, grad_output, offset_out, weight, offset, kernel_size, stride, padding,
                             dilation=(1, 1, 1, 1), groups=1, deformable_groups=1, modulated=True):
    return (input.new_empty(input.shape), weight.new_empty(weight.shape), offset.new_empty(offset.shape),
            weight.new_empty((weight.shape[0],)))


# The axes of torch_npu's inference attention layouts, outermost first: BSH is BSND with
# N and D merged; TND and NTD are ragged (S is T, the batches' rows one after the other).
_INFER_AXES = {"BSH": "BSND", "BSND": "BSND", "BNSD": "BNSD", "NSD": "NSD", "NBSD": "NBSD", "TND": "SND",
               "NTD": "NSD"}


def _infer_attention_out(query, value, block_table, num_heads, num_key_value_heads, input_layout):
    """attention_out of the inference attention operators (torch_npu's shape rule): the
    query's shape in the output layout ("BNSD_BSND": BNSD in, BSND out), with value's D."""
    q_layout, _, out_layout = input_layout.upper().partition("_")
    out_layout = out_layout or q_layout
    nkv = num_key_value_heads or num_heads
    if block_table is not None:  # paged cache: [blocks, block_size, H] or [blocks, Nkv, block_size, D]
        dv = value.shape[2] // nkv if value.dim() == 3 else value.shape[3]
    else:
        dv = value.shape[2] // nkv if q_layout == "BSH" else value.shape[-1]
    dims = dict(zip(_INFER_AXES[q_layout], query.shape))
    b, s, n = dims.get("B", 1), dims["S"], num_heads if q_layout == "BSH" else dims["N"]
    if out_layout == "BSH":
        return query.new_empty([b, s, n * dv])
    sizes = {"B": b, "S": s, "N": n, "D": dv}
    return query.new_empty([sizes[a] for a in _INFER_AXES[out_layout]])


def _infer_attention_outputs(query, value, block_table, num_heads, num_key_value_heads, input_layout, want_lse):
    """(attention_out, softmax_lse) of npu_fused_infer_attention_score(_v2): softmax_lse is
    [B, N, S, 1] ([T, N, 1] for TND/NTD input), empty without the flag."""
    out = _infer_attention_out(query, value, block_table, num_heads, num_key_value_heads, input_layout)
    lse_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    if not want_lse:
        return out, query.new_empty([0], dtype=lse_dtype)
    q_layout = input_layout.upper().partition("_")[0]
    dims = dict(zip(_INFER_AXES[q_layout], query.shape))
    n = num_heads if q_layout == "BSH" else dims["N"]
    if q_layout in ("TND", "NTD"):
        return out, query.new_empty([dims["S"], n, 1], dtype=lse_dtype)
    return out, query.new_empty([dims.get("B", 1), n, dims["S"], 1], dtype=lse_dtype)


def _resized_outputs(outputs, attention_out, softmax_lse, want_lse):
    """The .out variants' outputs: resized like the operator's (softmax_lse left alone
    without the flag)."""
    attention_out.resize_(outputs[0].shape)
    if want_lse:
        softmax_lse.resize_(outputs[1].shape)
    return attention_out, softmax_lse


@_fake("npu::npu_prompt_flash_attention")
def _npu_prompt_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
                                actual_seq_lengths=None, deq_scale1=None, quant_scale1=None, deq_scale2=None,
                                quant_scale2=None, quant_offset2=None, num_heads=1, scale_value=1.0,
                                pre_tokens=2147483647, next_tokens=0, input_layout="BSH", num_key_value_heads=0,
                                actual_seq_lengths_kv=None, sparse_mode=0):
    return _infer_attention_out(query, value, None, num_heads, num_key_value_heads, input_layout)


@_fake("npu::npu_incre_flash_attention")
def _npu_incre_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
                               actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None,
                               block_table=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None,
                               quant_scale2=None, quant_offset2=None, kv_padding_size=None, num_heads=1,
                               scale_value=1.0, input_layout="BSH", num_key_value_heads=0, block_size=0,
                               inner_precise=1):
    return _infer_attention_out(query, value, block_table, num_heads, num_key_value_heads, input_layout)


@_fake("npu::npu_fused_infer_attention_score")
def _npu_fused_infer_attention_score(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                     actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
                                     dequant_scale2=None, quant_scale2=None, quant_offset2=None,
                                     antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None,
                                     key_antiquant_offset=None, value_antiquant_scale=None,
                                     value_antiquant_offset=None, block_table=None, query_padding_size=None,
                                     kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
                                     actual_shared_prefix_len=None, query_rope=None, key_rope=None,
                                     key_rope_antiquant_scale=None, num_heads=1, scale=1.0, pre_tokens=2147483647,
                                     next_tokens=2147483647, input_layout="BSH", num_key_value_heads=0,
                                     sparse_mode=0, inner_precise=0, block_size=0, antiquant_mode=0,
                                     key_antiquant_mode=0, value_antiquant_mode=0, softmax_lse_flag=False):
    return _infer_attention_outputs(query, value, block_table, num_heads, num_key_value_heads, input_layout,
                                    softmax_lse_flag)


@_fake("npu::npu_fused_infer_attention_score.out")
def _npu_fused_infer_attention_score_out(query, key, value, *, attention_out, softmax_lse, block_table=None,
                                         num_heads=1, input_layout="BSH", num_key_value_heads=0,
                                         softmax_lse_flag=False, **_):
    outputs = _infer_attention_outputs(query, value, block_table, num_heads, num_key_value_heads, input_layout,
                                       softmax_lse_flag)
    return _resized_outputs(outputs, attention_out, softmax_lse, softmax_lse_flag)


@_fake("npu::npu_fused_infer_attention_score_v2")
def _npu_fused_infer_attention_score_v2(query, key, value, *, block_table=None, num_query_heads=1,
                                        num_key_value_heads=0, input_layout="BSH", return_softmax_lse=False, **_):
    return _infer_attention_outputs(query, value, block_table, num_query_heads, num_key_value_heads, input_layout,
                                    return_softmax_lse)


@_fake("npu::npu_fused_infer_attention_score_v2.out")
def _npu_fused_infer_attention_score_v2_out(query, key, value, *, attention_out, softmax_lse, block_table=None,
                                            num_query_heads=1, num_key_value_heads=0, input_layout="BSH",
                                            return_softmax_lse=False, **_):
    outputs = _infer_attention_outputs(query, value, block_table, num_query_heads, num_key_value_heads,
                                       input_layout, return_softmax_lse)
    return _resized_outputs(outputs, attention_out, softmax_lse, return_softmax_lse)


@_fake("npu::_npu_fused_infer_attention_score_infer_output")
def _npu_fused_infer_attention_score_infer_output(query, value, *, input_layout="BSH", quant_scale2=None,
                                                  block_table=None, num_heads=1, num_key_value_heads=0,
                                                  softmax_lse_flag=False, query_rope=None):
    return _infer_attention_outputs(query, value, block_table, num_heads, num_key_value_heads, input_layout,
                                    softmax_lse_flag)


@_fake("npu::_npu_fused_infer_attention_score_v2_infer_output")
def _npu_fused_infer_attention_score_v2_infer_output(query, value, *, input_layout="BSH", block_table=None,
                                                     num_query_heads=1, num_key_value_heads=0,
                                                     return_softmax_lse=False, **_):
    return _infer_attention_outputs(query, value, block_table, num_query_heads, num_key_value_heads, input_layout,
                                    return_softmax_lse)


def _no_workspace(query, key, value, **_):
    # The simulator's kernel needs no workspace: an empty one.
    return query.new_empty([0])


_fake("npu::_npu_fused_infer_attention_score_get_max_workspace")(_no_workspace)
_fake("npu::_npu_fused_infer_attention_score_v2_get_max_workspace")(_no_workspace)


@_fake("npu::npu_ps_roi_pooling")
def _npu_ps_roi_pooling(self, rois, spatial_scale, group_size, output_dim):
    return self.new_empty([rois.shape[0] * rois.shape[2], output_dim, group_size, group_size])


@_fake("npu::npu_ps_roi_pooling_backward")
def _npu_ps_roi_pooling_backward(output_grad, rois, spatial_scale, group_size, output_dim, input_size):
    return output_grad.new_empty([rois.shape[0], output_dim * group_size * group_size, input_size[0], input_size[1]])


@_fake("npu::npu_trans_quant_param")
def _npu_trans_quant_param(scale, offset=None, round_mode=0):
    shape = scale.shape if offset is None else torch.broadcast_shapes(scale.shape, offset.shape)
    return scale.new_empty(shape, dtype=torch.int64)


def _quant_dtype(v, default):
    # int? *_dtype arguments arrive as torch.dtype or as the ScalarType number.
    if v is None:
        return default
    if isinstance(v, torch.dtype):
        return v
    return {1: torch.int8, 3: torch.int32, 5: torch.float16, 6: torch.float32, 15: torch.bfloat16}[int(v)]


@_fake("npu::npu_quant_matmul")
def _npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None, **_):
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    n = x2.shape[-1]
    if x2.dtype == torch.int32 and not (x2.dim() >= 2 and x2.stride(-2) == 1 and x2.stride(-1) == x2.shape[-2]):
        n = n * 8  # int4 x2 [k, n // 8], eight values to an int32 (its transpose [k // 8, n] holds n)
    return x1.new_empty([*batch, x1.shape[-2], n], dtype=_quant_dtype(output_dtype, torch.int8))


@_fake("npu::npu_weight_quant_batchmatmul")
def _npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                  quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                  weight_dtype=None):
    n = weight.shape[1]
    if weight.dtype == torch.int32 and not (weight.stride(0) == 1 and weight.stride(1) == weight.shape[0]):
        n = n * 8  # int4 weight [k, n // 8], eight values to an int32 (its transpose [k // 8, n] holds n)
    return x.new_empty([x.shape[0], n], dtype=torch.int8 if quant_scale is not None else x.dtype)


@_fake("npu::npu_quant_conv2d")
def _npu_quant_conv2d(input, weight, scale, strides=(1, 1), pads=(0, 0), dilations=(1, 1), groups=1, offset_x=0,
                      round_mode="rint", output_dtype=None, bias=None, offset=None, input_dtype=None,
                      weight_dtype=None):
    hw = [(input.shape[2 + i] + 2 * pads[i] - dilations[i] * (weight.shape[2 + i] - 1) - 1) // strides[i] + 1
          for i in range(2)]
    return input.new_empty([input.shape[0], weight.shape[0], *hw], dtype=_quant_dtype(output_dtype, torch.float16))


@_fake("npu::npu_anchor_response_flags")
def _npu_anchor_response_flags(self, featmap_size, stride, num_base_anchors):
    return self.new_empty((featmap_size[0] * featmap_size[1] * num_base_anchors,), dtype=torch.uint8)


# ---- BERT attention (custom_ops/src/bert_attention.cpp) ----

@_fake("npu::npu_fused_attention_score_fwd")
def _npu_fused_attention_score_fwd(query_layer, key_layer, value_layer, attention_mask, scale, keep_prob,
                                   query_transpose=False, key_transpose=False, bmm_score_transpose_a=False,
                                   bmm_score_transpose_b=False, value_transpose=False, dx_transpose=False):
    b, n, s, _ = query_layer.shape
    sk, dv = key_layer.shape[2], value_layer.shape[3]
    return (query_layer.new_empty([b * s, n * dv]), query_layer.new_empty([b, n, s, sk]),
            query_layer.new_empty([b * n * s * sk], dtype=torch.uint8))


def _attention_score_grads(query_layer, key_layer, value_layer):
    """q/k/v gradient buffers [B, S, N, D] (the context's BSH rows)."""
    b, n, s, d = query_layer.shape
    sk, dv = key_layer.shape[2], value_layer.shape[3]
    return (query_layer.new_empty([b, s, n, d]), query_layer.new_empty([b, sk, n, d]),
            query_layer.new_empty([b, sk, n, dv]))


@_fake("npu::npu_fused_attention_score_backward")
def _npu_fused_attention_score_backward(grad_output, softmax_output, query_layer, key_layer, value_layer, mask,
                                        scale, keep_prob, query_transpose=False, key_transpose=False,
                                        value_transpose=False, dx_transpose=False):
    return tuple(t.transpose(1, 2) for t in _attention_score_grads(query_layer, key_layer, value_layer))


@_fake("npu::npu_fused_attention_score_grad")
def _npu_fused_attention_score_grad(grad_output, softmax_output, query_layer, key_layer, value_layer, mask,
                                    scale, keep_prob, query_transpose=False, key_transpose=False,
                                    value_transpose=False, dx_transpose=False):
    return tuple(t.new_empty([t.shape[0] * t.shape[1], t.shape[2] * t.shape[3]])
                 for t in _attention_score_grads(query_layer, key_layer, value_layer))


@_fake("npu::npu_fused_attention_layernorm_qkv_fwd")
def _npu_fused_attention_layernorm_qkv_fwd(x, kernel_query, kernel_key, kernel_value, gamma, beta, bias_query=None,
                                           bias_key=None, bias_value=None, seq_len=128, num_heads=12, eps=1e-05):
    m, h = x.shape
    shape = [m // seq_len, num_heads, seq_len, kernel_query.shape[1] // num_heads]
    return [x.new_empty([m, h]), x.new_empty(shape), x.new_empty(shape), x.new_empty(shape),
            x.new_empty([m]), x.new_empty([m])]


@_fake("npu::npu_fused_attention_qkv_grad")
def _npu_fused_attention_qkv_grad(grad_output_query, grad_output_key, grad_output_value, query_kernel, key_kernel,
                                  value_kernel, hidden_states, grad_output_ln):
    kernels = (query_kernel, key_kernel, value_kernel)
    return ([hidden_states.new_empty(hidden_states.shape)] + [k.new_empty(k.shape) for k in kernels]
            + [k.new_empty([k.shape[1]]) for k in kernels])


@_fake("npu::npu_layernorm_grad")
def _npu_layernorm_grad(grad_out, input, normalized_shape, mean, rstd, weight, bias):
    shape = list(normalized_shape)
    return input.new_empty(input.shape), input.new_empty(shape), input.new_empty(shape)


@_fake("npu::npu_linear")
def _npu_linear(input, weight, bias=None):
    return input.new_empty([input.shape[0], weight.shape[0]])


@_fake("npu::npu_linear_backward")
def _npu_linear_backward(grad, input, weight):
    return input.new_empty(input.shape), weight.new_empty(weight.shape)


class _OutListOverload(torch._ops.OpOverload):
    """An ``.out`` overload with two outputs that also takes them as torch_npu's Python
    binding does: ``op.out(..., out=[attention_out, softmax_lse])``."""

    def __call__(self, /, *args, **kwargs):
        if "out" in kwargs:
            out = kwargs.pop("out")
            if not isinstance(out, (list, tuple)) or len(out) != 2:
                raise RuntimeError(f"{self.__name__}: out must be a list of 2 tensors (attention_out, softmax_lse), "
                                   f"got {out!r}")
            kwargs["attention_out"], kwargs["softmax_lse"] = out
        return super().__call__(*args, **kwargs)


for _name in ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"):
    getattr(torch.ops.npu, _name).out.__class__ = _OutListOverload
