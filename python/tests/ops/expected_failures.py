"""The one list of conformance expectations (python/tests/ops/test_op_conformance.py).

EXPECTED_FAILURES maps an OpInfo (its ``full_name``: ``name`` or ``name.variant``) to the
reason it is expected to fail on npu, optionally narrowed to a dtype and/or to ``forward``
/ ``backward``. A listed test that fails is reported as xfailed with its reason; a listed
test that passes FAILS with "unexpected pass" (remove its entry). Reasons that come from
the op table (``table(...)``) follow the pair being tested: an overload this pair's table
serves makes the entry inactive, so the same list fits every PyTorch x CANN pair.

COMPARE_METADATA_ONLY lists OpInfos whose outputs are not determined by their inputs
(uninitialised memory, random numbers): for them only structure, shapes and dtypes are compared.

SKIPPED_SAMPLES lists samples that cannot match the CPU by design (random draws from
another generator); they are left out of the comparison, with the reason here.
"""
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch_npu import _op_table
from torch_npu.npu.op_support import unsupported_reason


class table:
    """A gap of the op table: active while this pair's table lacks `overload` and the CPU
    fallback is off (TORCH_NPU_FALLBACK_CPU_DISABLE=1); with it on, the gap runs on the CPU."""

    def __init__(self, *overloads: str):
        self.overloads = overloads

    def reason(self) -> Optional[str]:
        if torch.npu.get_cpu_fallback():
            return None
        reasons = [f"aten::{o} is not supported on NPU by the op table ({unsupported_reason(o)})"
                   for o in self.overloads if unsupported_reason(o)]
        return "; ".join(reasons) or None


class table_dtypes:
    """A dtype restriction of the op table: active while `overload` does not take `dtype`."""

    def __init__(self, overload: str, dtype: torch.dtype):
        self.overload, self.dtype = overload, dtype

    def reason(self) -> Optional[str]:
        allowed = _op_table.DTYPES.get(self.overload)
        name = str(self.dtype).replace("torch.", "")
        if allowed is None or name in allowed:
            return None
        return f"the op table restricts aten::{self.overload} to {', '.join(allowed)} (no {name} kernel)"


Reason = Union[str, table, table_dtypes]
# (OpInfo full_name, dtype or None = every dtype, "forward"/"backward" or None = both) -> reason
Key = Tuple[str, Optional[torch.dtype], Optional[str]]

_SDPA_HALF = ("on npu SDPA runs the fused attention kernel (npu_fusion_attention), on cpu PyTorch's flash "
              "kernel: both accumulate in float but round intermediates (probabilities, dS) to the input "
              "dtype at different points, so float16/bfloat16 gradients differ by up to ~10 ulp")

EXPECTED_FAILURES: Dict[Key, Reason] = {
    # --- gaps of the op table (pair-dependent) ---
    ("linalg.lstsq", None, None): table("linalg_lstsq.out"),
    ("linalg.lstsq.grad_oriented", None, None): table("linalg_lstsq.out"),
    ("special.entr", None, None): table("special_entr.out"),
    ("special.airy_ai", None, None): table("special_airy_ai.out"),
    # --- integer (and complex) matrix multiplication: the cube units take float types only ---
    ("__rmatmul__", torch.int64, None): table_dtypes("mm.out", torch.int64),
    ("matmul", torch.int64, None): table_dtypes("mm.out", torch.int64),
    ("mm", torch.int64, None): table_dtypes("mm.out", torch.int64),
    ("linalg.multi_dot", torch.int64, None): table_dtypes("mm.out", torch.int64),
    ("tensordot", torch.int64, None): table_dtypes("mm.out", torch.int64),
    ("addmm", torch.int64, None): table_dtypes("addmm.out", torch.int64),
    ("addmm.decomposed", torch.int64, None): table_dtypes("addmm.out", torch.int64),
    ("nn.functional.linear", torch.int64, None): table_dtypes("addmm.out", torch.int64),
    ("addbmm", torch.int64, None): table_dtypes("addbmm", torch.int64),
    ("baddbmm", torch.int64, None): table_dtypes("baddbmm.out", torch.int64),
    ("bmm", torch.int64, None): table_dtypes("bmm.out", torch.int64),
    ("einsum", torch.int64, None): table_dtypes("bmm.out", torch.int64),
    ("nn.functional.bilinear", torch.int64, None): table_dtypes("bmm.out", torch.int64),
    ("linalg.eig", torch.float32, "backward"): table_dtypes("mm.out", torch.complex64),  # complex eigenvectors
    # --- numerics ---
    ("nn.functional.scaled_dot_product_attention", torch.float16, "backward"): _SDPA_HALF,
    ("nn.functional.scaled_dot_product_attention", torch.bfloat16, "backward"): _SDPA_HALF,
}

# Cross-backend comparison: float16/bfloat16 results may differ from the CPU's by a rounding
# or two where the npu reaches a kernel through another path (a composite of the .out
# overload, another attention backend); float32 keeps torch.testing's defaults.
DEFAULT_TOLERANCE = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)}  # dtype -> (atol, rtol)

# (OpInfo full_name, dtype or None) -> (atol, rtol, reason): looser than DEFAULT_TOLERANCE.
TOLERANCE_OVERRIDES: Dict[Tuple[str, Optional[torch.dtype]], Tuple[float, float, str]] = {
    ("nn.functional.scaled_dot_product_attention", torch.float32): (
        1e-4, 1e-4, "on npu SDPA runs the fused attention kernel for the inputs it takes (4-D, "
                    "custom_ops/src/sdpa.cpp) and the math backend (bmm, softmax) for the others; the CPU "
                    "takes _scaled_dot_product_flash_attention_for_cpu: another summation order"),
}


def tolerance(full_name: str, dtype: torch.dtype) -> Optional[Tuple[float, float]]:
    """(atol, rtol) to compare npu with cpu results of (full_name, dtype); None: torch's defaults."""
    for key in ((full_name, dtype), (full_name, None)):
        if key in TOLERANCE_OVERRIDES:
            return TOLERANCE_OVERRIDES[key][:2]
    return DEFAULT_TOLERANCE.get(dtype)

SKIPPED_SAMPLES: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "nn.functional.multi_head_attention_forward": (
        lambda sample: sample.kwargs.get("training", True) and len(sample.args) > 9 and sample.args[9] > 0,
        "dropout in training (dropout_p, the 10th argument): the npu draws its mask from the npu generator's "
        "(seed, offset) stream, as torch_npu's, not the CPU's"),
    "nn.functional.scaled_dot_product_attention": (
        lambda sample: sample.kwargs.get("dropout_p", 0.0) > 0,
        "on npu SDPA runs the fused attention kernel, whose dropout masks come from the npu generator's "
        "Philox stream (as on Ascend), not the CPU's: samples with dropout_p > 0 cannot match "
        "(test_sdpa.py checks that dropout's forward and backward use one mask at the right rate)"),
}

_RANDOM = ("random numbers: the npu's come from the npu generator's (seed, offset) stream, as torch_npu's on Ascend, "
           "not from the CPU generator's (test_random.py checks the draws)")

COMPARE_METADATA_ONLY: Dict[str, str] = {
    **{name: _RANDOM for name in ("bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
                                  "normal", "normal.in_place", "normal.number_mean", "rand_like", "randint_like",
                                  "randn_like", "uniform", "nn.functional.rrelu")},
    "empty": "uninitialised memory",
    "empty_like": "uninitialised memory",
    "empty_strided": "uninitialised memory",
    "empty_permuted": "uninitialised memory",
    "new_empty": "uninitialised memory",
    "new_empty_strided": "uninitialised memory",
}


def _reason_of(value: Reason) -> Optional[str]:
    return value if isinstance(value, str) else value.reason()


def expected_failure(full_name: str, dtype: torch.dtype, kind: str) -> Optional[str]:
    """The reason (full_name, dtype, kind) is expected to fail on this pair, or None."""
    for key in ((full_name, dtype, kind), (full_name, dtype, None), (full_name, None, kind), (full_name, None, None)):
        if key in EXPECTED_FAILURES:
            reason = _reason_of(EXPECTED_FAILURES[key])
            if reason:
                return reason
    return None
