"""``torch_npu.npu.amp.common``."""

import torch

__all__ = ["amp_definitely_not_available"]


def amp_definitely_not_available():
    r"""True when no NPU is usable, so autocast and GradScaler cannot do anything."""
    return not torch.npu.is_available()
