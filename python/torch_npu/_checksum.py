"""torch_npu.matmul_checksum: algorithm-based fault detection of a matmul's result.

For c = a @ b, the row sums of c must equal a @ (row sums of b) up to rounding. A row whose
difference exceeds 5x the expected accumulated rounding error (2^-8 per element, scaled by
sqrt(n) when the row is dominated by its largest element, else by n) is suspicious; the matmul
is then recomputed into c and the result is whether the recomputation changed it (a transient
fault); the check's answer is a bool scalar tensor on the npu.
"""
import math

import torch

__all__ = ["matmul_checksum"]


def matmul_checksum(a, b, c):
    """True (a bool npu tensor) if ``c`` is not a fault-free ``a @ b``."""
    for t in (a, b, c):
        if not isinstance(t, torch.Tensor) or t.device.type != "npu":
            raise TypeError("tensor should be torch.Tensor, and device type should be npu")
    c_sum = torch.sum(c, dim=-1, dtype=torch.float32)
    b_rows = torch.sum(b, dim=-1, keepdim=True, dtype=torch.float32)
    expected = torch.matmul(a.to(torch.float32), b_rows).squeeze(-1)
    n_b = b.shape[-1]
    c_abs = torch.abs(c).to(torch.float32)
    c_max = torch.amax(c_abs, dim=-1)
    c_mean = torch.mean(c_abs, dim=-1)
    if torch.min(c_max / c_mean) > 5:
        round_error = c_max * 2 ** (-8) * math.sqrt(n_b)
    else:
        round_error = c_mean * 2 ** (-8) * n_b
    flag = (torch.abs(c_sum - expected) - 5 * round_error) > 5e-20
    any_flag = torch.any(flag)
    if any_flag:
        torch.matmul(a, b, out=c)
        c_mean2 = torch.mean(torch.abs(c).to(torch.float32), dim=-1)
        return torch.any(c_mean != c_mean2)
    return any_flag
