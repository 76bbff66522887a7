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


def _attention_out_shape(query, key, value, head_num, layout):
    """attention_out's shape: query's, with value's head dim (torch_npu's rule for BSH/SBH)."""
    if layout in ("BSH", "SBH"):
        d = query.shape[2] // head_num
        dv = value.shape[2] // (key.shape[2] // d)
        return list(query.shape[:2]) + [head_num * dv]
    return list(query.shape[:-1]) + [value.shape[-1]]


@_fake("npu::npu_moe_gating_top_k_softmax")
def _npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    shape = list(x.shape[:-1]) + [k]
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


@_fake("npu::npu_moe_init_routing")
def _npu_moe_init_routing(x, row_idx, expert_idx, active_num):
    n, k = expert_idx.shape
    return (x.new_empty((min(active_num, n) * k, x.shape[1])), row_idx.new_empty((n * k,)),
            expert_idx.new_empty((n * k,)))


def _grouped_matmul_fake(x, weight, bias=None, group_list=None, split_item=0, **_):
    if len(weight) == 1 and weight[0].dim() == 3:
        weight = list(weight[0].unbind(0))
    if (split_item or 0) >= 2:
        rows = x[0].shape[0] if group_list is not None else sum(t.numel() // t.shape[-1] for t in x)
        return [x[0].new_empty((rows, weight[0].shape[1]))]
    if group_list is None:
        return [xi.new_empty(list(xi.shape[:-1]) + [w.shape[1]]) for xi, w in zip(x, weight)]
    if isinstance(group_list, (list, tuple)):
        sizes = [b - a for a, b in zip([0] + list(group_list[:-1]), group_list)]
    else:  # row counts held by a tensor: data-dependent output shapes
        ctx = torch.library.get_ctx()
        sizes = [ctx.new_dynamic_size() for _ in weight]
    return [x[0].new_empty((s, w.shape[1])) for s, w in zip(sizes, weight)]


@_fake("npu::npu_grouped_matmul")
def _npu_grouped_matmul(x, weight, *, bias=None, group_list=None, split_item=0, **kwargs):
    return _grouped_matmul_fake(x, weight, bias, group_list, split_item)


@_fake("npu::npu_grouped_matmul.List")
def _npu_grouped_matmul_list(x, weight, *, bias=None, group_list=None, split_item=0, **kwargs):
    return _grouped_matmul_fake(x, weight, bias, group_list, split_item)
