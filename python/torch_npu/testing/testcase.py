"""``TestCase`` and ``run_tests`` for tests written for Huawei's torch_npu.

``TestCase`` is PyTorch's ``torch.testing._internal.common_utils.TestCase`` with
torch_npu's conventions on top:

* ``assertEqual(x, y, prec=None, message='', ...)``: a third positional argument is a
  tolerance (a number) or a message (a string); dtypes need not match
  (``exact_dtype = False``) and a CPU tensor compares with an NPU tensor.
* ``assertRtolEqual(x, y, prec=1e-4, prec16=1e-3)``: the relative/absolute check of
  torch_npu's operator tests, for tensors, numpy arrays, numbers and sequences.
* ``setUpClass`` selects the test device (``SET_NPU_DEVICE``), ``setUp`` seeds torch's and
  Python's RNGs with ``SEED`` (default 666), not numpy's (as torch_npu), and does not
  turn on the sparse tensor invariant checks that PyTorch's ``setUp`` turns on.
"""

import os
import random
import warnings
from contextlib import contextmanager
from collections.abc import ItemsView, KeysView, Sequence, ValuesView
from numbers import Number

import numpy as np
import torch
from torch.testing._internal import common_utils as _torch_common_utils

from .common_utils import set_npu_device

_DICT_VIEWS = (KeysView, ValuesView, ItemsView)
_CONTAINERS = (list, tuple, dict, set, frozenset) + _DICT_VIEWS

__all__ = ["TestCase", "run_tests"]


def _seed_torch_and_random(seed=None):
    seed = _torch_common_utils.SEED if seed is None else seed
    torch.manual_seed(seed)
    random.seed(seed)


def run_tests(argv=None):
    """Run the tests of ``__main__`` (PyTorch's runner: unittest, or pytest with --use-pytest).

    As torch_npu's runner it leaves numpy's generator as the module seeded it (PyTorch's
    runner reseeds torch, random and numpy when it starts)."""
    set_rng_seed = _torch_common_utils.set_rng_seed
    _torch_common_utils.set_rng_seed = _seed_torch_and_random
    try:
        _torch_common_utils.run_tests(argv)
    finally:
        _torch_common_utils.set_rng_seed = set_rng_seed


_FP16_MIN = 6e-8
_MIN = 1e-9
_NUMERIC = (np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16,
            np.float32, np.float64)


def _is_storage(value) -> bool:
    return isinstance(value, (torch.UntypedStorage, torch.TypedStorage))


def _storage_tensor(storage) -> torch.Tensor:
    """A 1-D tensor over the whole storage: its elements (an UntypedStorage: its bytes)."""
    if isinstance(storage, torch.TypedStorage):
        return torch.empty(0, dtype=storage.dtype, device=storage.device).set_(
            storage._untyped_storage, 0, (storage.size(),), (1,))
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


class TestCase(_torch_common_utils.TestCase):
    _precision = 1e-5
    exact_dtype = False
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.npu_device = set_npu_device()

    def setUp(self):
        # As torch_npu's TestCase: torch and random are seeded, numpy's generator is left as
        # the test module set it (PyTorch's setUp would reseed it).
        np_state = np.random.get_state()
        super().setUp()
        np.random.set_state(np_state)
        # PyTorch's setUp turns the sparse invariant checks on for every test; torch_npu's
        # TestCase leaves them as they were (tearDown restores the saved state either way).
        if not self._check_invariants:
            torch.sparse.check_sparse_tensor_invariants.disable()
        seed = int(os.getenv("SEED", "666"))
        torch.manual_seed(seed)
        random.seed(seed)

    # -- torch_npu's helpers ----------------------------------------------------------------
    def safeCoalesce(self, t):
        """``t.coalesce()``, checked against a coalescing done here (summed duplicates, sorted indices)."""
        tc = t.coalesce()
        self.assertEqual(tc.to_dense(), t.to_dense())
        self.assertTrue(tc.is_coalesced())
        if t._nnz() == 0:
            self.assertEqual(t._indices(), tc._indices())
            self.assertEqual(t._values(), tc._values())
            return tc
        value_map = {}
        for idx, val in zip(t._indices().t(), t._values()):
            idx_tup = tuple(idx.tolist())
            if idx_tup in value_map:
                value_map[idx_tup] += val
            else:
                value_map[idx_tup] = val.clone() if isinstance(val, torch.Tensor) else val
        new_indices = sorted(value_map)
        new_values = [value_map[idx] for idx in new_indices]
        if t._values().ndimension() < 2:
            new_values = torch.stack(new_values) if new_values and isinstance(new_values[0], torch.Tensor) \
                else t._values().new_tensor(new_values)
        else:
            new_values = torch.stack(new_values)
        new_indices = torch.tensor(new_indices, dtype=t._indices().dtype, device=t._indices().device).t()
        tg = torch.sparse_coo_tensor(new_indices, new_values, t.size())
        self.assertEqual(tc._indices(), tg._indices())
        self.assertEqual(tc._values(), tg._values())
        if t.is_coalesced():
            self.assertEqual(tc._indices(), t._indices())
            self.assertEqual(tc._values(), t._values())
        return tg

    def assertObjectIn(self, obj, iterable):
        """Assert that ``obj`` itself (by identity) is an element of ``iterable``."""
        for elem in iterable:
            if id(obj) == id(elem):
                return
        raise AssertionError("object not found in iterable")

    def assertExpectedRaises(self, exc_type, call_fn, *args, **kwargs):
        """Assert ``call_fn(*args, **kwargs)`` raises ``exc_type`` whose message is the expect
        file's (``assertExpected``; ``subname=`` picks the file)."""
        subname = kwargs.pop("subname", None)
        try:
            call_fn(*args, **kwargs)
        except exc_type as e:
            self.assertExpected(str(e), subname)
            return
        self.fail(msg="Did not raise when expected to")

    def assertNotWarn(self, call_fn, msg=''):
        """Assert ``call_fn()`` emits no warning."""
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            call_fn()
            self.assertTrue(len(ws) == 0, msg)

    @contextmanager
    def maybeWarnsRegex(self, category, regex=''):
        """Context manager for code that may warn: warnings of ``category`` matching ``regex``
        are ignored, any other warning fails the test."""
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=regex, category=category)
            try:
                yield
            finally:
                if ws:
                    msg = "Caught unexpected warnings:\n"
                    for w in ws:
                        msg += warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) + "\n"
                    self.fail(msg)

    # -- equality -----------------------------------------------------------------------
    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None,
                    **kwargs):
        """Assert ``x`` and ``y`` are equal up to a tolerance.

        ``prec`` (or a number in third position) is the absolute tolerance; a string in
        third position is the message. Other keyword arguments (``atol``, ``rtol``,
        ``msg``, ``exact_device``, ...) are those of PyTorch's ``TestCase.assertEqual``.
        """
        __tracebackhide__ = True
        if isinstance(prec, str) and not message:
            message, prec = prec, None
        msg = kwargs.pop("msg", None) or message or None
        if exact_dtype is None:
            exact_dtype = self.exact_dtype
        if prec is not None:
            if not isinstance(prec, Number):
                raise TypeError(f"assertEqual(): argument 'prec' must be a number or a message "
                                f"string, got {type(prec).__name__}")
            kwargs.setdefault("atol", float(prec))
            kwargs.setdefault("rtol", 0.0)
        if allow_inf:
            kwargs.setdefault("equal_nan", True)
        if (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.size == y.size == 1
                and (x.ndim == 0) != (y.ndim == 0)):
            # torch_npu compares a 0-d array with a one-element one by value (unittest's ==):
            # assertEqual(torch.tensor([10]).numpy(), npu_sum.cpu().numpy()) passes there.
            x, y = x.reshape(()), y.reshape(())
        if (isinstance(x, _DICT_VIEWS) or isinstance(y, _DICT_VIEWS)) and all(
                isinstance(v, _DICT_VIEWS + (list, tuple)) for v in (x, y)):
            # torch_npu compares two iterables element by element, in order:
            # assertEqual(d.keys(), list(d.keys())) passes there.
            x, y = list(x), list(y)
        if all(isinstance(v, _CONTAINERS) and len(v) == 0 for v in (x, y)):
            # torch_npu compares two iterables by length, then element by element: any two
            # empty containers are equal there (assertEqual(parser._json_load(""), {}) with a []).
            return
        if _is_storage(x) and _is_storage(y):
            # torch_npu compares storages element by element (bytes of an UntypedStorage),
            # on any devices: as tensors over them here.
            x, y = _storage_tensor(x), _storage_tensor(y)
        super().assertEqual(x, y, msg, exact_dtype=exact_dtype, **kwargs)

    def assertAlmostEqual(self, x, y, places=None, msg=None, delta=None, allow_inf=None):
        """torch_npu's: :meth:`assertEqual` with tolerance ``10**-places`` (or ``delta``);
        works for tensors on any device, numbers and sequences."""
        __tracebackhide__ = True
        prec = 10 ** (-places) if places else delta
        self.assertEqual(x, y, prec, msg or "", bool(allow_inf))

    def assertTensorsSlowEqual(self, x, y, prec=None, message=""):
        """Assert two tensors have the same size and dtype and differ by at most ``prec``
        (the largest absolute elementwise difference; exact equality for bool)."""
        __tracebackhide__ = True
        self.assertEqual(x.size(), y.size())
        self.assertEqual(x.dtype, y.dtype)
        x, y = x.detach().cpu(), y.detach().cpu()
        if x.dtype == torch.bool:
            self.assertTrue(torch.equal(x, y), message)
            return
        if x.numel() == 0:
            return
        wide = torch.complex128 if x.dtype.is_complex else torch.float64
        max_err = (x.to(wide) - y.to(wide)).abs().max().item()
        self.assertLessEqual(max_err, self._precision if prec is None else prec, message)

    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False,
                        message=None):
        """Assert ``x`` and ``y`` agree elementwise, relatively or absolutely.

        An element agrees when ``|x - y| <= prec`` or ``|x - y| / max(|x|, |y|) <= prec``
        (``prec16`` for float16 and bfloat16); a result passes if the disagreeing
        elements are at most ``prec`` of all elements. NaNs must be at the same places.
        Shapes and dtypes must match (``auto_trans_dtype`` casts ``x`` to ``y``'s dtype).
        Tensors may be on any device.
        """
        __tracebackhide__ = True
        self._rtol_equal(x, y, prec, prec16, auto_trans_dtype, message)

    def _rtol_fail(self, what: str, message):
        self.fail(f"{what}" + (f"\n{message}" if message else ""))

    def _rtol_equal(self, x, y, prec, prec16, auto_trans_dtype, message):
        if isinstance(x, Sequence) and isinstance(y, Sequence) and not isinstance(x, str):
            if len(x) != len(y):
                self._rtol_fail(f"length error: {len(x)} vs {len(y)}", message)
            for x_item, y_item in zip(x, y):
                self._rtol_equal(x_item, y_item, prec, prec16, auto_trans_dtype, message)
            return
        if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
            y = torch.as_tensor(y, dtype=x.dtype)
        elif isinstance(x, Sequence) and isinstance(y, torch.Tensor):
            x = torch.as_tensor(x, dtype=y.dtype)
        low_precision = False
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if auto_trans_dtype:
                x = x.to(y.dtype)
            if x.dtype != y.dtype:
                self._rtol_fail(f"dtype error: {x.dtype} vs {y.dtype}", message)
            if x.dtype == torch.bfloat16:
                low_precision = True
                x, y = x.float(), y.float()
            x = x.detach().cpu().numpy()
            y = y.detach().cpu().numpy()
        elif isinstance(x, Number) and isinstance(y, Number):
            x, y = np.array(x), np.array(y)
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            # A tensor against a numpy array: compare as numpy.
            x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
            y = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            self._rtol_fail(f"shape error: {x.shape} vs {y.shape}", message)
        if x.dtype != y.dtype:
            self._rtol_fail(f"dtype error: {x.dtype} vs {y.dtype}", message)
        if x.dtype.type not in _NUMERIC:
            self._rtol_fail(f"dtype error: {x.dtype} is not a supported numeric dtype", message)
        if x.dtype == np.bool_:
            if not np.array_equal(x, y):
                self._rtol_fail(f"result error: {int(np.sum(x != y))} of {x.size} booleans differ",
                                message)
            return
        if x.dtype == np.float16:
            low_precision = True
        tol, minimum = (prec16, _FP16_MIN) if low_precision else (prec, _MIN)
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        nan_x, nan_y = np.isnan(xf), np.isnan(yf)
        if not np.array_equal(nan_x, nan_y):
            self._rtol_fail("result error: NaNs at different positions", message)
        finite = ~nan_x
        both_inf = np.isinf(xf) & np.isinf(yf) & (np.sign(xf) == np.sign(yf))
        diff = np.where(finite & ~both_inf, np.abs(xf - yf), 0.0)
        scale = np.maximum(np.abs(xf), np.abs(yf))
        with np.errstate(invalid="ignore"):
            rel = np.where(finite & ~both_inf, diff / (scale + minimum), 0.0)
        bad = (diff > tol) & (rel > tol)
        if np.isnan(diff).any():
            bad |= np.isnan(diff)
        if bad.sum() > x.size * tol:
            worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), x.shape)
            self._rtol_fail(
                f"result error: {int(bad.sum())} of {x.size} elements differ by more than "
                f"{tol} (absolute and relative); worst at index {tuple(int(i) for i in worst)}: "
                f"{x[worst]!r} vs {y[worst]!r}", message)
