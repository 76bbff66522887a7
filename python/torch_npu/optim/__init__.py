"""torch_npu.optim: fused optimizers over combined (flattened) parameter, grad and state
buffers, one fused kernel per parameter group and dtype (custom_ops/src/optim.cpp); and
_DistributedMuon (Muon for plain and sharded DTensor 2-D parameters, distributed_muon.py)."""

__all__ = [
    "NpuFusedOptimizerBase", "NpuFusedSGD", "NpuFusedAdadelta", "NpuFusedLamb",
    "NpuFusedAdam", "NpuFusedAdamW", "NpuFusedAdamP",
    "NpuFusedBertAdam", "NpuFusedRMSprop", "NpuFusedRMSpropTF",
]

from .npu_fused_optim_base import NpuFusedOptimizerBase
from .npu_fused_sgd import NpuFusedSGD
from .npu_fused_adadelta import NpuFusedAdadelta
from .npu_fused_lamb import NpuFusedLamb
from .npu_fused_adam import NpuFusedAdam
from .npu_fused_adamw import NpuFusedAdamW
from .npu_fused_adamp import NpuFusedAdamP
from .npu_fused_bert_adam import NpuFusedBertAdam
from .npu_fused_rmsprop import NpuFusedRMSprop
from .npu_fused_rmsprop_tf import NpuFusedRMSpropTF


def __getattr__(name):
    # _DistributedMuon imports torch.distributed.tensor (DTensor, ~0.5 s): on first use, not
    # at `import torch_npu`.
    if name == "_DistributedMuon":
        from .distributed_muon import _DistributedMuon

        return _DistributedMuon
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
