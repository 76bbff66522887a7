"""torch_npu.contrib: fused operators and modules (``function``, ``module``, ``transfer_to_npu``).

``transfer_to_npu`` (run CUDA scripts unchanged on NPUs) is imported on request only --
``from torch_npu.contrib import transfer_to_npu`` or ``TORCH_TRANSFER_TO_NPU=1`` -- since
importing it changes ``torch`` for the whole process. ``function`` and ``module`` come
with the fused-operator layer (``contrib/`` of the monorepo) in their own issue.
"""
