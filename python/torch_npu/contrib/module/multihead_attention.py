import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import Parameter

from .ensemble_dropout import NpuCachedDropout

__all__ = ["Matmul_transpose", "MultiheadAttention"]


def _quant_noise(module, p, block_size):
    """fairseq's quantisation noise ("Training with Quantization Noise for Extreme Model
    Compression"), as torch_npu's MultiheadAttention applies it to its projections: in training,
    before each forward, blocks of ``block_size`` input weights are dropped with probability
    ``p`` and the weight is scaled by ``1 / (1 - p)`` (in place, on ``weight.data``).

    ``module`` is an ``nn.Linear``, ``nn.Embedding`` (blocks along the input features) or
    ``nn.Conv2d`` (1x1: blocks of input channels; otherwise whole kernels, and
    ``kernel_h * kernel_w`` must be a multiple of ``block_size``). ``p <= 0`` returns the
    module untouched. Returns the module.
    """
    if p <= 0:
        return module
    if not isinstance(module, (nn.Linear, nn.Embedding, nn.Conv2d)):
        raise TypeError("_quant_noise: expected module to be an nn.Linear, nn.Embedding or nn.Conv2d, got "
                        f"{type(module).__name__}")
    is_conv = module.weight.ndim == 4
    if not is_conv:
        if module.weight.size(1) % block_size != 0:
            raise ValueError(f"_quant_noise: input features ({module.weight.size(1)}) must be a multiple of "
                             f"block_size ({block_size})")
    elif module.kernel_size == (1, 1):
        if module.in_channels % block_size != 0:
            raise ValueError(f"_quant_noise: input channels ({module.in_channels}) must be a multiple of "
                             f"block_size ({block_size})")
    else:
        kernel = module.kernel_size[0] * module.kernel_size[1]
        if kernel % block_size != 0:
            raise ValueError(f"_quant_noise: kernel size ({kernel}) must be a multiple of block_size ({block_size})")

    def _drop_blocks(mod, _inputs):
        if not mod.training:
            return
        weight = mod.weight
        if not is_conv or mod.kernel_size == (1, 1):
            # rows of weight are output units; each row splits into blocks of block_size inputs
            out_units, in_units = weight.size(0), weight.size(1)
            keep = torch.empty(out_units, in_units // block_size, device=weight.device).bernoulli_(1 - p)
            mask = keep.repeat_interleave(block_size, dim=1)
            if is_conv:
                mask = mask[:, :, None, None]
        else:
            keep = torch.empty(weight.size(0), weight.size(1), device=weight.device).bernoulli_(1 - p)
            mask = keep[:, :, None, None]
        mod.weight.data = weight.data * mask.to(weight.dtype) / (1 - p)

    module.register_forward_pre_hook(_drop_blocks)
    return module


class _NpuLinear(nn.Linear):
    """torch_npu's projection layer: nn.Linear on 2-D inputs or 3-D inputs (flattened to
    rows); other ranks are an error."""

    def forward(self, input2):
        if input2.dim() not in (2, 3):
            raise RuntimeError(f"_NpuLinear: expected a 2-D or 3-D input, got {input2.dim()}-D")
        return super().forward(input2)


class _MHAConfig:
    """torch_npu's switch to the fused attention (``_MHAConfig.set_fussion()``): MultiheadAttention
    then runs torch_npu.npu_multi_head_attention (its lengths, heads and head size multiples of 16;
    float16 inputs with float32 weights), otherwise the same attention composed of ATen operators."""
    use_fussion_mha = False

    @classmethod
    def set_fussion(cls):
        cls.use_fussion_mha = True


def Matmul_transpose(tensor1, tensor2):
    """tensor1 @ tensor2.transpose(-2, -1), differentiable (torch_npu.contrib.function.matmul_transpose)."""
    from ..function.matmul_transpose import matmul_transpose
    return matmul_transpose(tensor1, tensor2)


class MultiheadAttention(nn.Module):
    """fairseq-style multi-head attention with torch_npu's interface: after
    ``_MHAConfig.set_fussion()`` torch_npu.npu_multi_head_attention, otherwise the same
    computation composed of ATen operators.

    forward(query [bsz * tgt_len, E], key [bsz * s_len, kdim], value [bsz * s_len, vdim],
    bsz, tgt_len, s_len, key_padding_mask=None, ...) -> (attn [bsz * tgt_len, E], None);
    rows are batch-major, ``key_padding_mask`` is an additive float mask broadcastable to
    [bsz, num_heads, tgt_len, s_len]. ``q_noise`` > 0 applies fairseq's quantisation noise
    (blocks of ``qn_block_size``) to the four projections in training (``_quant_noise``)."""

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, self_attention=False, encoder_decoder_attention=False, q_noise=0.0,
                 qn_block_size=8):
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.qkv_same_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout_module = NpuCachedDropout(dropout, module_name=self.__class__.__name__)
        self.dropout_prob = dropout
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != self.embed_dim:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.scaling = self.head_dim ** -0.5
        self.self_attention = self_attention
        self.encoder_decoder_attention = encoder_decoder_attention
        if self.self_attention and not self.qkv_same_dim:
            raise ValueError("Self-attention requires query, key and value to be of the same size")
        self.k_proj = _quant_noise(_NpuLinear(self.kdim, embed_dim, bias=bias), q_noise, qn_block_size)
        self.v_proj = _quant_noise(_NpuLinear(self.vdim, embed_dim, bias=bias), q_noise, qn_block_size)
        self.q_proj = _quant_noise(_NpuLinear(embed_dim, embed_dim, bias=bias), q_noise, qn_block_size)
        self.out_proj = _quant_noise(_NpuLinear(embed_dim, embed_dim, bias=bias), q_noise, qn_block_size)
        if add_bias_kv:
            self.bias_k = Parameter(torch.Tensor(1, 1, embed_dim))
            self.bias_v = Parameter(torch.Tensor(1, 1, embed_dim))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self.reset_parameters()
        self.onnx_trace = False
        self.tpu = False

    def prepare_for_onnx_export_(self):
        self.onnx_trace = True

    def prepare_for_tpu_(self, **kwargs):
        self.tpu = True

    def reset_parameters(self):
        gain = 1 / math.sqrt(2) if self.qkv_same_dim else 1.
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            nn.init.xavier_normal_(self.bias_v)

    def transpose_for_scores(self, x):
        """Rows of x split into heads: [B, S, E] (or [B*S, E] with ``self.batch_size`` and
        ``self.squence_length`` set, torch_npu's attribute names) -> [B, num_heads, S, head_dim]."""
        if x.dim() == 3:
            batch, length = x.shape[0], x.shape[1]
        else:
            batch = getattr(self, "batch_size", None)
            length = getattr(self, "squence_length", None)
            if batch is None or length is None:
                raise ValueError("MultiheadAttention.transpose_for_scores: a 2-D input [B*S, E] needs the module's "
                                 "batch_size and squence_length attributes; pass [B, S, E] or set them")
        heads = getattr(self, "num_attention_heads", self.num_heads)
        head_size = getattr(self, "attention_head_size", self.head_dim)
        return x.reshape(batch, length, heads, head_size).permute(0, 2, 1, 3)

    def apply_sparse_mask(self, attn_weights, tgt_len: int, src_len: int, bsz: int):
        """fairseq's hook for sparse attention patterns: dense attention leaves the weights as they are."""
        return attn_weights

    def upgrade_state_dict_named(self, state_dict, name):
        """Convert, in place, an old checkpoint's packed ``in_proj_weight`` / ``in_proj_bias`` (q, k, v
        stacked, nn.MultiheadAttention's layout) under prefix ``name`` to q_proj/k_proj/v_proj entries."""
        prefix = name + "." if name != "" else ""
        items_to_add = {}
        keys_to_remove = []
        for k in list(state_dict.keys()):
            if k.endswith(prefix + "in_proj_weight"):
                dim = state_dict[k].shape[0] // 3
                base = k[:-len("in_proj_weight")]
                for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    items_to_add[base + proj + ".weight"] = state_dict[k][i * dim:(i + 1) * dim]
                keys_to_remove.append(k)
                k_bias = base + "in_proj_bias"
                if k_bias in state_dict:
                    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                        items_to_add[base + proj + ".bias"] = state_dict[k_bias][i * dim:(i + 1) * dim]
                    keys_to_remove.append(k_bias)
        for k in keys_to_remove:
            del state_dict[k]
        state_dict.update(items_to_add)

    def forward(self, query, key: Optional[torch.Tensor], value: Optional[torch.Tensor], bsz, tgt_len,
                s_len, key_padding_mask: Optional[torch.Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[torch.Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False,
                attn_mask: Optional[torch.Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        return self.multi_attn(query, key, value, key_padding_mask, bsz, tgt_len), None

    def multi_attn(self, query, key, value, key_padding_mask, bsz, tgt_len):
        src_len = key.size(0) // bsz
        if _MHAConfig.use_fussion_mha:
            mask = key_padding_mask if key_padding_mask is not None else query.new_zeros(())
            dropout_prob = self.dropout_prob if self.training else 0.0
            return torch.ops.npu.npu_multi_head_attention(
                query, key, value, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, mask,
                self.out_proj.weight, self.q_proj.bias, self.k_proj.bias, self.v_proj.bias, self.out_proj.bias,
                None, self.num_heads, self.head_dim, src_len, tgt_len, dropout_prob, True)[0]
        h, d = self.num_heads, self.head_dim
        q = (self.q_proj(query) * self.scaling).view(bsz, tgt_len, h, d).transpose(1, 2)
        k = self.k_proj(key).view(bsz, src_len, h, d).transpose(1, 2)
        v = self.v_proj(value).view(bsz, src_len, h, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1)
        if key_padding_mask is not None:
            scores = scores + key_padding_mask.to(scores.dtype)
        probs = F.softmax(scores.float(), dim=-1).to(scores.dtype)
        probs = self.dropout_module(probs)
        context = (probs @ v).transpose(1, 2).reshape(bsz * tgt_len, self.embed_dim)
        return self.out_proj(context)
