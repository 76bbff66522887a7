"""The fused operators of ``contrib/`` (``torch.ops.npu.*``) as ``torch_npu.<name>``,
and their fake (meta) implementations, which give output shapes to torch.compile,
FakeTensorMode and the meta device without running a kernel.

The kernels, argument checks and autograd are C++ (contrib/src); a fake implementation
only states shapes and dtypes, for arguments the C++ checks accept.
"""
from __future__ import annotations

import torch

_NAMESPACE = "npu::"


def fused_op_names() -> list[str]:
    """Names of the registered ``torch.ops.npu`` operators (one per schema name)."""
    names = {n[len(_NAMESPACE):] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith(_NAMESPACE)}
    return sorted(n.split(".", 1)[0] for n in names)


def export(module) -> list[str]:
    """Sets ``module.<name> = torch.ops.npu.<name>`` for every fused operator."""
    names = fused_op_names()
    for name in names:
        setattr(module, name, getattr(torch.ops.npu, name))
    return names


_fake = torch.library.register_fake


@_fake("npu::npu_rms_norm")
def _npu_rms_norm(self, gamma, epsilon=1e-6):
    lead = self.dim() - gamma.dim()
    rstd_shape = list(self.shape[:lead]) + [1] * gamma.dim()
    return self.new_empty(self.shape), self.new_empty(rstd_shape, dtype=torch.float32)


@_fake("npu::npu_rms_norm_backward")
def _npu_rms_norm_backward(dy, self, gamma, rstd):
    return self.new_empty(self.shape), gamma.new_empty(gamma.shape)


@_fake("npu::npu_add_rms_norm")
def _npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    y, rstd = _npu_rms_norm(x1, gamma, epsilon)
    return y, rstd, x1.new_empty(x1.shape)
