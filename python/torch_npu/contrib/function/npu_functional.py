r"""Functional interface torch_npu adds to ``torch.nn.functional``."""
import torch

__all__ = ["dropout_with_byte_mask"]


def dropout_with_byte_mask(input1, p=0.5, training=True, inplace=False):
    """Dropout (zero with probability p, scale the rest by 1/(1-p)) with torch_npu's
    signature: ``torch_npu.dropout_with_byte_mask`` (a byte mask drawn from the npu
    generator). ``inplace`` is rejected, as in torch_npu."""
    if p < 0. or p > 1.:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if inplace:
        raise ValueError("dropout_with_byte_mask has no in-place computing")
    if not training:
        return input1
    return torch.ops.npu.dropout_with_byte_mask(input1, p, training)
