import math

import torch
import torch.nn.functional as F

__all__ = ["fuse_add_softmax_dropout"]


def fuse_add_softmax_dropout(training, dropout, attn_mask, attn_scores, attn_head_size, p=0.5, dim=-1):
    """dropout(softmax(attn_mask + attn_scores / sqrt(attn_head_size))), with torch_npu's
    signature: the fused torch_npu.npu_dropout_with_add_softmax for 4-D scores whose last
    two sizes torch_npu fuses (128/256/384/512, n*c divisible by 32), else ``dropout``."""
    n, c, h, w = attn_scores.size()
    if h in (128, 256, 384, 512) and (n * c) % 32 == 0 and attn_scores.device.type == "npu":
        drop_p = p if training else 0.
        _, _, attn_probs = torch.ops.npu.npu_dropout_with_add_softmax(
            attn_scores, attn_mask, 1 / math.sqrt(attn_head_size), drop_p, -1)
        return attn_probs
    attn_scores = torch.add(attn_mask, attn_scores, alpha=(1 / math.sqrt(attn_head_size)))
    attn_probs = F.softmax(attn_scores, dim=-1)
    return dropout(attn_probs)
