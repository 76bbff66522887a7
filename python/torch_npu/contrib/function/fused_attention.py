"""BERT self-attention as torch_npu's fused operators chain it: ``npu_fused_attention`` and
``npu_fused_attention_with_layernorm`` (torch_npu.contrib.function).

hidden_states is [B*S, H] (H = 768 or 1024, heads of 64) in FRACTAL_NZ (format 29),
attention_mask an additive [B, 1, S, S] mask in FRACTAL_NZ, the kernels [H, H] in FRACTAL_NZ
(projections are ``hidden_states @ kernel + bias``), the biases (and gamma/beta) ND. The
result is the context [B*S, H]: softmax(q k^T * scale + mask), dropout with keep
probability ``keep_prob``, times v, heads side by side.
"""
import warnings

import torch
import torch_npu

__all__ = ['npu_fused_attention', 'npu_fused_attention_with_layernorm']

VALID_FORMAT = [29, 29, 29, 29, 29, 2, 2, 2]
_HEAD_DIM = 64  # torch_npu's fused BERT attention has heads of 64


def _check_compatibility(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                         query_bias, key_bias, value_bias, gamma=None, beta=None):
    """torch_npu's checks (formats, then shapes); torch_npu runs them on the first call only,
    here every call is checked."""
    tensors = [hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias, value_bias]
    names = ["hidden_states", "attention_mask", "query_kernel", "key_kernel", "value_kernel",
             "query_bias", "key_bias", "value_bias"]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fused attention: expected {name} to be a Tensor, got {type(t).__name__}")
    if not _is_format_matched(tensors):
        formats = [torch_npu.get_npu_format(t) for t in tensors]
        raise RuntimeError(
            "fused attention check compatibility failed, format not matches: expected the formats of "
            f"({', '.join(names)}) to be {VALID_FORMAT} (29 = FRACTAL_NZ, 2 = ND), got {formats}")
    if gamma is not None and beta is not None:
        if torch_npu.get_npu_format(gamma) != 2 or torch_npu.get_npu_format(beta) != 2:
            raise RuntimeError(
                "fused attention check compatibility failed, gamma or beta format not matches: expected ND (2), "
                f"got {torch_npu.get_npu_format(gamma)} and {torch_npu.get_npu_format(beta)}")
    if hidden_states.dim() != 2 or hidden_states.shape[0] % 32 != 0 or hidden_states.shape[1] not in (1024, 768):
        raise RuntimeError(
            "fused attention check compatibility failed, shape of hidden_states not matches: expected "
            f"[B*S, H] with B*S a multiple of 32 and H 768 or 1024, got {list(hidden_states.shape)}")
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[2] != attention_mask.shape[3]:
        raise RuntimeError(
            "fused attention check compatibility failed, shape of attention_mask not matches: expected "
            f"[B, 1, S, S], got {list(attention_mask.shape)}")
    if any(k.dim() != 2 or k.shape[0] not in (1024, 768) for k in (query_kernel, key_kernel, value_kernel)):
        raise RuntimeError(
            "fused attention check compatibility failed, shape of kernel not matches: expected query/key/value "
            "kernels of shape [H, H] with H 768 or 1024, got "
            f"{[list(k.shape) for k in (query_kernel, key_kernel, value_kernel)]}")
    if hidden_states.shape[0] % attention_mask.shape[0] != 0:
        raise RuntimeError(
            f"fused attention: hidden_states rows ({hidden_states.shape[0]}) are not a multiple of the batch "
            f"size of attention_mask ({attention_mask.shape[0]})")


def _is_format_matched(input_list):
    """Whether the storage formats of ``input_list`` (hidden_states, attention_mask, the three
    kernels, the three biases) are the fused attention's: FRACTAL_NZ, then ND."""
    return [torch_npu.get_npu_format(t) for t in input_list] == VALID_FORMAT


# torch_npu's name. torch_npu checks only the first call of the process; here every call is
# checked (the checks are cheap next to the attention).
_check_compatibility_once = _check_compatibility


def _bsnc(hidden_states, attention_mask):
    """[batch, sequence, heads, head dim]."""
    batch = attention_mask.shape[0]
    return [batch, hidden_states.shape[0] // batch, hidden_states.shape[1] // _HEAD_DIM, _HEAD_DIM]


def _permute_with_reshape(x, new_shape):
    """[B*S, H] rows -> [B, N, S, D] in FRACTAL_NZ."""
    return torch_npu.npu_format_cast(torch_npu.npu_confusion_transpose(x, (0, 2, 1, 3), new_shape, False), 29)


class _FusedAttentionWithLayerNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                value_bias, gamma, beta, scale=1, keep_prob=0):
        warnings.warn("torch_npu.contrib.npu_fused_attention_with_layernorm is deprecated and "
                      "will be removed in a future version. Use torch_npu.npu_fusion_attention and "
                      "torch.nn.LayerNorm instead.", FutureWarning)
        _check_compatibility(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                             query_bias, key_bias, value_bias, gamma, beta)
        bsnc = _bsnc(hidden_states, attention_mask)
        norm, query_layer, key_layer, value_layer, mean, variance = torch_npu.npu_fused_attention_layernorm_qkv_fwd(
            hidden_states, query_kernel, key_kernel, value_kernel, gamma, beta,
            query_bias, key_bias, value_bias, bsnc[1], bsnc[2])
        context_layer, softmax_output, dropout_mask = torch_npu.npu_fused_attention_score_fwd(
            query_layer, key_layer, value_layer, attention_mask, scale, keep_prob)
        ctx.scale = scale
        ctx.keep_prob = keep_prob
        ctx.save_for_backward(query_kernel, key_kernel, value_kernel, query_layer, key_layer, value_layer,
                              hidden_states, softmax_output, dropout_mask, norm, mean, variance, gamma, beta)
        return context_layer, norm

    @staticmethod
    def backward(ctx, grad_output, grad_norm):
        q_w, k_w, v_w, q_l, k_l, v_l, h_s, s_o, d_m, norm, mean, variance, gamma, beta = ctx.saved_tensors
        if grad_output is None:
            grad_output = torch.zeros(q_l.shape[0] * q_l.shape[2], q_l.shape[1] * q_l.shape[3],
                                      dtype=q_l.dtype, device=q_l.device)
        if grad_norm is None:
            grad_norm = torch.zeros_like(norm)
        query_grad, key_grad, value_grad = torch_npu.npu_fused_attention_score_grad(
            grad_output, s_o, q_l, k_l, v_l, d_m, ctx.scale, ctx.keep_prob)
        g_h_s, g_w_q, g_w_k, g_w_v, g_b_q, g_b_k, g_b_v = torch_npu.npu_fused_attention_qkv_grad(
            query_grad, key_grad, value_grad, q_w, k_w, v_w, norm, torch_npu.npu_format_cast(grad_norm, 29))
        g_h_s, g_gamma, g_beta = torch_npu.npu_layernorm_grad(
            g_h_s, h_s, (g_h_s.shape[1],), mean, variance, gamma, beta)
        return g_h_s, None, g_w_q, g_w_k, g_w_v, g_b_q, g_b_k, g_b_v, g_gamma, g_beta, None, None


def _fused_attention_with_layernorm(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                                    query_bias, key_bias, value_bias, gamma, beta, scale=1, keep_prob=0):
    """BERT self-attention after a layer norm of hidden_states (deprecated in torch_npu).

    Returns (context [B*S, H], norm [B*S, H]): the attention of layer_norm(hidden_states;
    gamma, beta, eps=1e-5) and that layer norm.
    """
    return _FusedAttentionWithLayerNorm.apply(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                                              query_bias, key_bias, value_bias, gamma, beta, scale, keep_prob)


class _FusedAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                value_bias, scale=1, keep_prob=0):
        _check_compatibility(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                             query_bias, key_bias, value_bias, None, None)
        bsnc = _bsnc(hidden_states, attention_mask)
        with torch.no_grad():
            query_layer, key_layer, value_layer = (
                _permute_with_reshape(torch_npu.npu_linear(hidden_states, kernel.t(), bias), bsnc)
                for kernel, bias in ((query_kernel, query_bias), (key_kernel, key_bias), (value_kernel, value_bias)))
        context_layer, softmax_output, dropout_mask = torch_npu.npu_fused_attention_score_fwd(
            query_layer, key_layer, value_layer, attention_mask, scale, keep_prob)
        ctx.scale = scale
        ctx.keep_prob = keep_prob
        ctx.save_for_backward(query_kernel, key_kernel, value_kernel, query_layer, key_layer, value_layer,
                              hidden_states, softmax_output, dropout_mask)
        return context_layer

    @staticmethod
    def backward(ctx, grad_output):
        q_w, k_w, v_w, q_l, k_l, v_l, h_s, s_o, d_m = ctx.saved_tensors
        query_grad, key_grad, value_grad = torch_npu.npu_fused_attention_score_grad(
            grad_output, s_o, q_l, k_l, v_l, d_m, ctx.scale, ctx.keep_prob)
        g_h_s, g_w_q, g_w_k, g_w_v, g_b_q, g_b_k, g_b_v = torch_npu.npu_fused_attention_qkv_grad(
            query_grad, key_grad, value_grad, q_w, k_w, v_w, h_s,
            torch_npu.npu_format_cast(torch.zeros_like(h_s), 29))
        return g_h_s, None, g_w_q, g_w_k, g_w_v, g_b_q, g_b_k, g_b_v, None, None


def _fused_attention(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                     query_bias, key_bias, value_bias, scale=1, keep_prob=0):
    """BERT self-attention: the context [B*S, H] of hidden_states [B*S, H]."""
    return _FusedAttention.apply(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                                 query_bias, key_bias, value_bias, scale, keep_prob)


# torch_npu exports these as ``autograd.Function.apply`` (signature ``(*args, **kwargs)``); the
# wrappers keep that signature and take the parameters above, by position or by name.
def npu_fused_attention_with_layernorm(*args, **kwargs):
    return _fused_attention_with_layernorm(*args, **kwargs)


def npu_fused_attention(*args, **kwargs):
    return _fused_attention(*args, **kwargs)


npu_fused_attention_with_layernorm.__doc__ = _fused_attention_with_layernorm.__doc__
npu_fused_attention.__doc__ = _fused_attention.__doc__
