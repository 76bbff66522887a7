"""Automatic mixed precision for NPUs: ``torch.npu.amp``.

``autocast`` is ``torch.autocast("npu")`` with torch_npu's signature; ``GradScaler`` is
``torch.amp.GradScaler("npu")`` with torch_npu's extra ``dynamic`` option. The
autocast op lists themselves are registered in C++ (AutocastPrivateUse1).
"""

from .autocast_mode import autocast, custom_bwd, custom_fwd
from .grad_scaler import GradScaler
from . import common

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]
