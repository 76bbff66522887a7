import torch
import torch.nn.functional as F

__all__ = ["NpuFairseqDropout", "NpuCachedDropout"]


class NpuCachedDropout(torch.nn.Dropout):
    """Dropout with torch_npu's (fairseq-style) signature; torch_npu pre-generates masks on a
    side stream (``enable_dropout_ensemble``), which is a no-op here."""

    def __init__(self, p, module_name=None):
        super().__init__(p)
        self.module_name = module_name

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    @classmethod
    def enable_dropout_ensemble(cls, model):
        return model


NpuFairseqDropout = NpuCachedDropout
