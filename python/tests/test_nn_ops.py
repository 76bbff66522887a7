"""Dtype rules of nn operators on npu, as torch_npu's aclnn kernels have them: F.one_hot and
torch.histc of integer tensors, int32 class targets of the losses, softmax / log_softmax with
half_to_float, silu's backward rounded once; references computed here."""
import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401


# ---- silu_backward: one rounding (the kernel), not PyTorch's decomposition ------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_silu_backward_matches_cpu_kernel(dtype):
    x = (torch.rand(4096) * 20 - 10).to(dtype)
    xc = x.clone().requires_grad_()
    F.silu(xc).sum().backward()
    xn = x.npu().requires_grad_()
    F.silu(xn).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, atol=0, rtol=0)
    # Huawei's test_activations.py::test_silu: the float32 gradient rounded once.
    xf = x.float().requires_grad_()
    (xf * torch.sigmoid(xf)).sum().backward()
    torch.testing.assert_close(xn.grad.cpu().float(), xf.grad.to(dtype).float(), atol=0, rtol=1e-2)


def test_silu_double_backward():
    x = torch.randn(5, dtype=torch.double).npu().requires_grad_()
    assert torch.autograd.gradgradcheck(F.silu, (x,))
