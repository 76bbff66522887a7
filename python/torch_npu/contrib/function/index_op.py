import torch

__all__ = ["npu_fast_condition_index_put"]


def npu_fast_condition_index_put(x, condition, value):
    """``x[condition] = value`` written as ``torch.where`` (out of place, as torch_npu's).

    Args:
        x (Tensor): the tensor to update.
        condition (BoolTensor): where to write, broadcastable to x.
        value (int, float): the value written.
    Returns: a new tensor.
    """
    if not isinstance(condition, torch.Tensor) or condition.dtype != torch.bool:
        raise TypeError(f"npu_fast_condition_index_put: expected condition to be a torch.bool tensor, "
                        f"got {getattr(condition, 'dtype', type(condition))}")
    return torch.where(condition, torch.full_like(x, value), x)
