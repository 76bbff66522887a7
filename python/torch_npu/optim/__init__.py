"""torch_npu.optim: fused optimizers (``NpuFusedSGD``, ``NpuFusedAdamW``, ...).

Empty on purpose: the fused optimizers are added by their own issue, together with
the combined-buffer kernels they need. Nothing here pretends to exist before it does.
"""
