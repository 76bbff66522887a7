"""``torch_npu.atb``: op-plugin's newer ATB operators (``torch.ops.atb.*``, see
``torch_npu._atb_ops``) by name, as in torch_npu."""
import torch

from torch_npu import _atb_ops

__all__ = list(_atb_ops.ATB_NAMES)

globals().update({name: getattr(torch.ops.atb, name) for name in __all__})
