"""torch_npu.contrib: fused operators and modules (``function``, ``module``, ``transfer_to_npu``).

Empty on purpose: the fused-operator layer (``contrib/`` of the monorepo) fills this
package in its own issue. Nothing here pretends to exist before it does.
"""
