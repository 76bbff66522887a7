"""Conformance of the NPU with the CPU on PyTorch's OpInfo database (op_db).

For each OpInfo and dtype, every sample input runs on npu and on cpu (the same values,
the same strides) and the results must match: outputs, inputs the op mutated, and, in the
backward tests, the gradients of every input that requires grad. Tests are instantiated by
PyTorch's device-type machinery for the PrivateUse1 backend ("npu"), named
``test_{forward,backward}_<op>_npu_<dtype>``.

Expected failures live in expected_failures.py (one place, a reason each): they are
reported as xfailed, and (full mode, every sample) as failures ("unexpected pass") once
they pass. So do the comparison tolerances (torch.testing's defaults for float32; a
rounding or two for float16/bfloat16; per-OpInfo overrides with their reasons).

Modes (TORCH_NPU_CONFORMANCE):
  unset / "fast"  float32 forward (the first sample and its noncontiguous twin), backward
                  (the first sample) and storage formats (the first sample with a tensor of
                  2+ dimensions, its npu tensors in FRACTAL_NZ / NC1HWC0) of every OpInfo: the
                  slice the default
                  `pytest python/tests` runs (CI), 1.5-3 minutes on 2 cores;
  "full"          float32, float16, bfloat16, int64 and bool forward (every sample and its
                  noncontiguous twin) and backward (every sample) where the OpInfo takes the
                  dtype: what python/tests/ops/report.py runs for docs/OPS.md.
TORCH_NPU_CONFORMANCE_MAX_SAMPLES caps the samples per test in full mode (default: all).
"""
import os
import unittest

import torch
import torch_npu  # noqa: F401  (before common_device_type: it picks its device bases on import)

import pytest
from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase
from torch.utils._pytree import tree_flatten, tree_map

from expected_failures import COMPARE_METADATA_ONLY, SKIPPED_SAMPLES, expected_failure, tolerance

MODE = os.environ.get("TORCH_NPU_CONFORMANCE", "fast").lower()
FULL = MODE == "full"
if MODE not in ("fast", "full"):
    raise ValueError(f"TORCH_NPU_CONFORMANCE={MODE!r}: expected 'fast' or 'full'")

FORWARD_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool) if FULL else (torch.float32,)
BACKWARD_DTYPES = (torch.float32, torch.float16, torch.bfloat16) if FULL else (torch.float32,)
MAX_SAMPLES = int(os.environ.get("TORCH_NPU_CONFORMANCE_MAX_SAMPLES", "0")) if FULL else 1
SEED = 1234


@pytest.fixture(autouse=True, scope="module")
def _cpu_fallback_as_configured():
    """As in torch_npu, overloads without an NPU kernel (every one torch_npu itself registers
    none for, ops/torch_npu_registered_ops.txt) run through the CPU fallback, and the suite
    checks their results too. With TORCH_NPU_FALLBACK_CPU_DISABLE=1 it checks the NPU's
    kernels only: those overloads raise, and the op table's gaps show (expected_failures.py
    then lists them through table(...))."""
    before = torch.npu.get_cpu_fallback()
    torch.npu.set_cpu_fallback(os.environ.get("TORCH_NPU_FALLBACK_CPU_DISABLE") != "1")
    yield
    torch.npu.set_cpu_fallback(before)


def _twin(t: torch.Tensor, device) -> torch.Tensor:
    """A copy of `t` on `device` with its sizes, strides and storage offset (noncontiguous
    samples stay noncontiguous), a leaf that requires grad as `t` does."""
    if t.layout != torch.strided:
        out = t.detach().to(device)
    else:
        src = t.detach().resolve_conj().resolve_neg()
        storage = src.untyped_storage()
        flat = torch.empty(0, dtype=src.dtype, device=src.device).set_(
            storage, 0, (storage.nbytes() // src.element_size(),), (1,))
        out = flat.to(device).as_strided(src.size(), src.stride(), src.storage_offset()).detach()
    return out.requires_grad_(t.requires_grad)


def _cpu_twin(sample):
    """The sample with each npu tensor copied to the cpu (tensors the OpInfo deliberately
    put on the cpu, e.g. tensor_split's indices, stay there)."""
    return sample.transform(lambda t: _twin(t, "cpu") if isinstance(t, torch.Tensor) and t.device.type != "cpu" else t)


def _formattable(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "npu" and t.layout == torch.strided and t.dim() >= 2


def _in_storage_format(t):
    """t's values in a storage of FRACTAL_NZ (29), or NC1HWC0 (3) for a 4-D tensor."""
    if not _formattable(t):
        return t
    return torch_npu.npu_format_cast(t, 3 if t.dim() == 4 else 29)


def _to_cpu(x):
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, x)


def _seed():
    torch.manual_seed(SEED)
    torch.npu.manual_seed(SEED)


def _leaves(sample):
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [t for t in leaves if isinstance(t, torch.Tensor)]


class TestNPUConformance(TestCase):
    """Generic tests; instantiate_device_type_tests makes TestNPUConformancePRIVATEUSE1."""

    def _check(self, op, dtype, kind, body):
        reason = expected_failure(op.full_name, dtype, kind)
        if reason is None:
            body()
            return
        try:
            body()
        except unittest.SkipTest:
            raise
        except Exception as e:  # noqa: BLE001 - any error of a listed test is its expected failure
            pytest.xfail(f"{reason} [{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}]")
        if not FULL or MAX_SAMPLES:
            return  # a subset of the samples may miss the failing one: strict only over all of them
        self.fail(f"unexpected pass: {op.full_name} {dtype} {kind} is listed in expected_failures.py "
                  f"({reason}); remove the entry")

    def _samples(self, op, dtype, device, requires_grad):
        _seed()
        samples = op.sample_inputs(device, dtype, requires_grad=requires_grad)
        skip = SKIPPED_SAMPLES.get(op.full_name, (lambda sample: False, ""))[0]
        for i, s in enumerate(samples):
            if MAX_SAMPLES and i >= MAX_SAMPLES:
                return
            if not skip(s):
                yield s

    def _assert_match(self, npu, cpu, what, metadata_only=False, tol=None):
        npu = _to_cpu(npu)
        if metadata_only:
            npu_l, npu_spec = tree_flatten(npu)
            cpu_l, cpu_spec = tree_flatten(cpu)
            self.assertEqual(npu_spec, cpu_spec, msg=what)
            for a, b in zip(npu_l, cpu_l):
                if isinstance(a, torch.Tensor):
                    self.assertEqual((a.shape, a.dtype), (b.shape, b.dtype), msg=what)
            return
        atol, rtol = tol if tol else (None, None)
        self.assertEqual(npu, cpu, exact_dtype=True, atol=atol, rtol=rtol, msg=what)

    def _forward(self, op, dtype, sample, label, npu_transform=None):
        npu_sample, sample = sample, _cpu_twin(sample)
        if npu_transform is not None:
            npu_sample = npu_sample.transform(npu_transform)
        _seed()
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # the CPU rejects this sample: nothing to compare
            return
        expected = sample.output_process_fn_grad(expected)
        _seed()
        actual = op(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
        actual = npu_sample.output_process_fn_grad(actual)
        torch.npu.synchronize()
        meta_only = op.full_name in COMPARE_METADATA_ONLY
        tol = tolerance(op.full_name, dtype)
        self._assert_match(actual, _to_cpu(expected), f"{op.full_name} {dtype} output, {label}", meta_only, tol)
        # Inputs the op mutated (in-place OpInfos, out= in kwargs) must match too.
        self._assert_match(_leaves(npu_sample), _leaves(sample), f"{op.full_name} {dtype} inputs after, {label}",
                           meta_only, tol)

    @ops(op_db, dtypes=OpDTypes.supported, allowed_dtypes=FORWARD_DTYPES)
    def test_forward(self, device, dtype, op):
        def body():
            with torch.no_grad():
                for i, sample in enumerate(self._samples(op, dtype, device, requires_grad=False)):
                    self._forward(op, dtype, sample, f"sample {i}: {sample.summary()}")
                    # A noncontiguous twin exists for strided inputs only (is_contiguous()
                    # raises for sparse compressed layouts on every device).
                    if all(t.layout == torch.strided for t in _leaves(sample) if isinstance(t, torch.Tensor)):
                        self._forward(op, dtype, sample.noncontiguous(), f"noncontiguous sample {i}")
        self._check(op, dtype, "forward", body)

    @ops(op_db, dtypes=OpDTypes.supported, allowed_dtypes=(torch.float32,))
    def test_formats(self, device, dtype, op):
        """The first sample with a tensor of 2 or more dimensions, its npu tensors in internal
        storage formats (FRACTAL_NZ; 4-D ones in NC1HWC0): the op must give the values it
        gives in ND."""
        def body():
            _seed()
            skip = SKIPPED_SAMPLES.get(op.full_name, (lambda sample: False, ""))[0]
            for i, sample in enumerate(op.sample_inputs(device, dtype, requires_grad=False)):
                if not skip(sample) and any(_formattable(t) for t in _leaves(sample)):
                    with torch.no_grad():
                        self._forward(op, dtype, sample, f"sample {i} in storage formats: {sample.summary()}",
                                      npu_transform=_in_storage_format)
                    return
            raise unittest.SkipTest("no sample has a tensor of 2 or more dimensions to put in a storage format")
        self._check(op, dtype, "formats", body)

    @ops(op_db, dtypes=OpDTypes.supported_backward, allowed_dtypes=BACKWARD_DTYPES)
    def test_backward(self, device, dtype, op):
        def body():
            checked = 0
            for i, sample in enumerate(self._samples(op, dtype, device, requires_grad=True)):
                checked += self._backward(op, dtype, device, sample, f"sample {i}: {sample.summary()}")
            if checked == 0:
                raise unittest.SkipTest("no sample has a differentiable output")
        self._check(op, dtype, "backward", body)

    def _backward(self, op, dtype, device, sample, label) -> int:
        npu_sample, sample = sample, _cpu_twin(sample)
        results = []
        for s in (sample, npu_sample):
            _seed()
            try:
                out = s.output_process_fn_grad(op(s.input, *s.args, **s.kwargs))
            except Exception:
                if s is sample:
                    return 0  # the CPU rejects this sample
                raise
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            inputs = [t for t in _leaves(s) if t.requires_grad]
            if not outs or not inputs:
                return 0
            if s is sample:
                torch.manual_seed(SEED + 1)
                grads_out = [torch.randn_like(t) if t.is_floating_point() else torch.ones_like(t) for t in outs]
            else:
                grads_out = [g.to(device) for g in grads_out]
            grads = torch.autograd.grad(outs, inputs, grads_out, allow_unused=True)
            results.append(grads)
        torch.npu.synchronize()
        self._assert_match(results[1], results[0], f"{op.full_name} {dtype} gradients, {label}",
                           op.full_name in COMPARE_METADATA_ONLY, tolerance(op.full_name, dtype))
        return 1


instantiate_device_type_tests(TestNPUConformance, globals(), only_for="npu")
