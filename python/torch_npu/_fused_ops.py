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


def _glu_out_shape(self, dim):
    shape = list(self.shape)
    shape[dim] = shape[dim] // 2
    return shape


@_fake("npu::npu_swiglu")
def _npu_swiglu(self, dim=-1):
    return self.new_empty(_glu_out_shape(self, dim))


@_fake("npu::npu_swiglu_backward")
def _npu_swiglu_backward(grad_output, self, dim=-1):
    return self.new_empty(self.shape)


@_fake("npu::npu_geglu")
def _npu_geglu(self, dim=-1, approximate=1, activate_left=False):
    shape = _glu_out_shape(self, dim)
    return self.new_empty(shape), self.new_empty(shape)


@_fake("npu::npu_geglu_grad")
def _npu_geglu_grad(grad_output, self, gelu, dim=-1, approximate=1, activate_left=False):
    return self.new_empty(self.shape)


@_fake("npu::npu_fast_gelu")
def _npu_fast_gelu(self):
    return self.new_empty(self.shape)


@_fake("npu::npu_fast_gelu_backward")
def _npu_fast_gelu_backward(grad, self):
    return self.new_empty(self.shape)


@_fake("npu::npu_rotary_mul")
def _npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    return self.new_empty(self.shape)


@_fake("npu::npu_rotary_mul_backward")
def _npu_rotary_mul_backward(grad, self, r1, r2, rotary_mode="half"):
    return self.new_empty(self.shape), r1.new_empty(r1.shape), r2.new_empty(r2.shape)


@_fake("npu::npu_apply_rotary_pos_emb")
def _npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    return query, key


@_fake("npu::npu_scaled_masked_softmax")
def _npu_scaled_masked_softmax(x, mask, scale=1, fixed_triu_mask=False):
    return x.new_empty(x.shape)


@_fake("npu::npu_scaled_masked_softmax_backward")
def _npu_scaled_masked_softmax_backward(y_grad, y, mask, scale, fixed_triu_mask):
    return y.new_empty(y.shape)


@_fake("npu::npu_dropout_with_add_softmax")
def _npu_dropout_with_add_softmax(self, x1, alpha, prob, dim):
    return self.new_empty(self.shape, dtype=torch.uint8), self.new_empty(self.shape), self.new_empty(self.shape)


@_fake("npu::npu_dropout_with_add_softmax_backward")
def _npu_dropout_with_add_softmax_backward(grad, mask, softmax_out, alpha, prob, dim):
    return grad.new_empty(grad.shape), grad.new_empty(grad.shape)


@_fake("npu::npu_confusion_transpose")
def _npu_confusion_transpose(self, perm, shape, transpose_first):
    return self.new_empty(list(shape) if transpose_first else [shape[p] for p in perm])


@_fake("npu::npu_confusion_transpose_backward")
def _npu_confusion_transpose_backward(grad, perm, shape, transpose_first):
    return grad.new_empty(list(shape))
