"""Helpers for operator tests written for Huawei's torch_npu (``torch_npu.testing.common_utils``).

``create_common_tensor`` makes a CPU reference tensor and its NPU copy from the
same random data; the decorators skip tests the current machine cannot run.
"""

import atexit
import functools
import json
import os
import stat
import threading
import unittest
from itertools import product
from typing import Iterable, List, Sequence, Union

import numpy as np
import torch
from torch.testing._utils import freeze_rng_state as _torch_freeze_rng_state

import torch_npu

__all__ = [
    "freeze_rng_state",
    "iter_indices",
    "is_iterable",
    "get_npu_device",
    "set_npu_device",
    "create_common_tensor",
    "create_dtype_tensor",
    "test_2args_broadcast",
    "check_operators_in_prof",
    "SupportedDevices",
    "SkipIfNoLapack",
    "SkipIfNoLatestTorch",
    "get_cycles_per_ms",
    "SkipIfNotGteCANNVersion",
    "SkipIfNotRegistered",
    "Baseline",
    "dump_baseline",
    "PERF_TEST_ENABLE",
    "IS_WINDOWS",
]

IS_WINDOWS = os.name == "nt"
PERF_TEST_ENABLE = os.getenv("PERF_TEST_ENABLE", "").upper() in ("ON", "1", "YES", "TRUE", "Y")

#: The newest torch release this build matrix supports (see versions/ of the monorepo).
LATEST_TORCH_VERSION = (2, 14)


def freeze_rng_state():
    """Context manager: restore the CPU and NPU random number generator states on exit."""
    return _torch_freeze_rng_state()


def iter_indices(tensor):
    """Iterate over every index of ``tensor`` (ints for 1-D, tuples otherwise)."""
    if tensor.dim() == 0:
        return range(0)
    if tensor.dim() == 1:
        return range(tensor.size(0))
    return product(*(range(s) for s in tensor.size()))


@functools.lru_cache(maxsize=None)
def get_cycles_per_ms() -> float:
    """Cycles of ``torch.npu._sleep`` per millisecond, measured with timing events (the
    median of nine runs of a 1M-cycle sleep, so that a descheduled run does not count)."""
    def measure() -> float:
        start = torch.npu.Event(enable_timing=True)
        end = torch.npu.Event(enable_timing=True)
        start.record()
        torch.npu._sleep(1000000)
        end.record()
        end.synchronize()
        return 1000000 / start.elapsed_time(end)

    runs = sorted(measure() for _ in range(9))
    return runs[len(runs) // 2]


def is_iterable(obj):
    try:
        iter(obj)
        return True
    except TypeError:
        return False


def get_npu_device():
    """Return the device tests run on: ``"npu:<SET_NPU_DEVICE>"``, ``"npu:0"`` by default."""
    index = os.environ.get("SET_NPU_DEVICE")
    if index is None or index == "":
        return "npu:0"
    if not index.strip().isdigit():
        raise ValueError(f"SET_NPU_DEVICE must be a device index, got {index!r}")
    return f"npu:{int(index)}"


def set_npu_device():
    """Make :func:`get_npu_device` the current device and return it."""
    device = get_npu_device()
    torch.npu.set_device(device)
    return device


_NUMPY_OF_TORCH = {
    torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16,
    torch.float32: np.float32, torch.float64: np.float64,
}


def _cast_to_format(npu_tensor: torch.Tensor, npu_format: int) -> torch.Tensor:
    if npu_format == -1:
        return npu_tensor
    cast = getattr(torch_npu, "npu_format_cast", None)
    if cast is None:
        # No private storage formats in this build: tensors stay ND, which every
        # format-agnostic operator test accepts.
        return npu_tensor
    return cast(npu_tensor, npu_format)


def create_common_tensor(item, minValue, maxValue, device=None):
    """Return ``(cpu_tensor, npu_tensor)`` holding the same uniform random data.

    Args:
        item: ``[dtype, npu_format, shape, ...]``; ``dtype`` a numpy dtype (``np.float32``) or a
            torch dtype, ``npu_format`` an ACL format number (-1 keeps the default ND),
            ``shape`` a sequence of ints or an int; further entries are ignored, as torch_npu's.
        minValue, maxValue: the range of the values.
        device: the NPU to put the copy on; :func:`get_npu_device` by default.
    """
    if not isinstance(item, (list, tuple)) or len(item) < 3:
        raise TypeError("create_common_tensor(): argument 'item' must be [dtype, npu_format, shape], "
                        f"got {item!r}")
    dtype, npu_format, shape = item[:3]
    bfloat16 = dtype is torch.bfloat16
    if isinstance(dtype, torch.dtype):
        if bfloat16:
            np_dtype = np.float32
        elif dtype in _NUMPY_OF_TORCH:
            np_dtype = _NUMPY_OF_TORCH[dtype]
        else:
            raise TypeError(f"create_common_tensor(): dtype {dtype} has no numpy equivalent")
    else:
        np_dtype = dtype
    if isinstance(shape, int):
        shape = (shape,)
    if device is None:
        device = get_npu_device()
    data = np.random.uniform(minValue, maxValue, shape).astype(np_dtype)
    cpu_input = torch.from_numpy(data)
    if bfloat16:
        cpu_input = cpu_input.to(torch.bfloat16)
    npu_input = _cast_to_format(cpu_input.to(device), npu_format)
    return cpu_input, npu_input


def create_dtype_tensor(shape, dtype, npu_format=-1, min_value=-5, max_value=5, no_zero=False,
                        device=None):
    """Like :func:`create_common_tensor` with a torch dtype: bools, halves, floats, else int32."""
    if device is None:
        device = get_npu_device()
    if dtype == torch.bool:
        data = np.random.randint(0, 2, size=shape).astype(bool)
    elif dtype == torch.half:
        data = np.random.uniform(min_value, max_value, shape).astype(np.float16)
    elif dtype == torch.float:
        data = np.random.uniform(min_value, max_value, shape).astype(np.float32)
    else:
        data = np.random.randint(min_value, max_value + 1, size=shape).astype(np.int32)
    if no_zero:
        data = np.where(data != 0, data, np.ones_like(data))
    cpu_input = torch.from_numpy(data)
    npu_input = cpu_input.to(device)
    if dtype in (torch.float, torch.half):
        npu_input = _cast_to_format(npu_input, npu_format)
    return cpu_input, npu_input


def test_2args_broadcast(fn):
    """Run ``fn(x, y)`` on broadcasting pairs on CPU and NPU; return ``[[cpu_out, npu_out], ...]`` (numpy)."""
    device = get_npu_device()
    outputs = []
    for x_shape, y_shape in (((2, 3, 4, 5), (1, 1, 1)), ((2, 3, 4, 5), (4, 5))):
        x = torch.from_numpy(np.random.rand(*x_shape).astype(np.float32))
        y = torch.from_numpy(np.random.rand(*y_shape).astype(np.float32))
        cpu_out = fn(x, y).numpy()
        npu_out = fn(x.to(device), y.to(device)).to("cpu").numpy()
        outputs.append([cpu_out, npu_out])
    return outputs


test_2args_broadcast.__test__ = False  # not a pytest test


def check_operators_in_prof(expected_operators, prof, unexpected_operators=None):
    """Return whether a profile ran all ``expected_operators`` and none of ``unexpected_operators``."""
    unexpected = set(unexpected_operators or [])
    expected = list(expected_operators)
    averages = prof.key_averages()
    if not averages:
        return False
    for item in averages:
        key = item.key.replace("cached_", "")
        if key in unexpected:
            return False
        if key in expected:
            expected.remove(key)
    return not expected


class SupportedDevices:
    """Decorator: run the test only on the listed SoCs, e.g. ``@SupportedDevices(["Ascend910B"])``.

    The first 10 characters of ``get_device_name(0)`` are compared (``"Ascend910B"``
    for an ``"Ascend910B1"``), as in torch_npu.
    """

    def __init__(self, supported_devices: List[str]) -> None:
        if isinstance(supported_devices, str):
            supported_devices = [supported_devices]
        self.supported_devices = list(supported_devices)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch.npu.is_available():
                raise unittest.SkipTest("no NPU available")
            name = torch.npu.get_device_name(0)[:10]
            if name not in self.supported_devices:
                raise unittest.SkipTest(f"Only run on {self.supported_devices!r}, current device "
                                        f"is {name}.")
            return fn(*args, **kwargs)

        return wrapper


class SkipIfNotRegistered(object):
    """torch_npu's (caffe2-era) decorator factory: ``SkipIfNotRegistered()(message)`` skips the
    test with ``message`` unless ``caffe2.python.core`` can be imported and has this
    registered; PyTorch 2 has no caffe2, so the test is skipped ("Cannot import
    `caffe2.python.core`")."""

    def __call__(self, message):
        try:
            from caffe2.python import core
            skipper = unittest.skipIf(self not in core._REGISTERED_OPERATORS, message)
        except ImportError:
            skipper = unittest.skip("Cannot import `caffe2.python.core`")
        return skipper


class Baseline(object):
    """Performance baselines kept in a JSON file: ``get_baseline(id)``, ``set_baseline(id, value)``
    (thread-safe) and ``save_baseline()`` (writes the file, owner read/write only)."""

    def __init__(self, baselineFile):
        self._baseline = {}
        self._baselineFile = baselineFile
        self._mutex = threading.Lock()
        if os.path.exists(self._baselineFile):
            with open(self._baselineFile, "r") as f:
                self._baseline = json.load(f)

    def get_baseline(self, resourceId):
        return self._baseline.get(resourceId)

    def set_baseline(self, resourceId, baseline):
        with self._mutex:
            self._baseline[resourceId] = baseline

    def save_baseline(self):
        with self._mutex:
            fd = os.open(self._baselineFile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IWUSR | stat.S_IRUSR)
            with os.fdopen(fd, "w") as f:
                json.dump(self._baseline, f)


#: torch_npu's performance baseline file (``PERF_BASELINE_FILE``, default ./data/perf_baseline.json).
PERF_BASELINE_FILE = os.getenv("PERF_BASELINE_FILE", os.path.join(os.getcwd(), "data", "perf_baseline.json"))
PerfBaseline = Baseline(PERF_BASELINE_FILE)


@atexit.register
def dump_baseline():
    """At exit, with ``PERF_TEST_ENABLE`` set, write :data:`PerfBaseline` to its file."""
    if PERF_TEST_ENABLE:
        PerfBaseline.save_baseline()


class SkipIfNoLapack:
    """Decorator: skip the test if PyTorch was built without LAPACK."""

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch._C.has_lapack:
                raise unittest.SkipTest("PyTorch compiled without Lapack")
            return fn(*args, **kwargs)

        return wrapper


def _torch_release() -> tuple:
    parts = torch.__version__.split("+")[0].split(".")
    return tuple(int(p) for p in parts[:2] if p.isdigit())


class SkipIfNoLatestTorch:
    """Decorator: skip the test unless torch is the newest release of the build matrix.

    For tests of APIs that only the newest supported torch has.
    """

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _torch_release() < LATEST_TORCH_VERSION:
                raise unittest.SkipTest(
                    f"needs torch >= {'.'.join(map(str, LATEST_TORCH_VERSION))}, "
                    f"have {torch.__version__}")
            return fn(*args, **kwargs)

        return wrapper


class SkipIfNotGteCANNVersion:
    """Decorator: skip the test unless the CANN component ``module`` is at least ``base_version``,
    e.g. ``@SkipIfNotGteCANNVersion("8.1.RC1")``."""

    def __init__(self, base_version, module='CANN'):
        self.base_version = base_version
        self.module = module

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from torch_npu.utils import _is_gte_cann_version, get_cann_version

            if not _is_gte_cann_version(self.base_version, module=self.module):
                raise unittest.SkipTest(
                    f"Only run on {self.base_version} or greater, current cann version is "
                    f"{get_cann_version(self.module)}.")
            return fn(*args, **kwargs)

        return wrapper


def _create_scaling_models_optimizers(device="npu", optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    """Two identical 2-layer MLPs with their optimizers: one to train with a GradScaler and a
    control trained without; the GradScaler tests compare them."""
    mod_control = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    mod_scaling = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    mod_scaling.load_state_dict(mod_control.state_dict())
    kwargs = {"lr": 1.0, **(optimizer_kwargs or {})}
    return (mod_control, mod_scaling, optimizer_ctor(mod_control.parameters(), **kwargs),
            optimizer_ctor(mod_scaling.parameters(), **kwargs))


def _create_scaling_case(device="npu", dtype=torch.float, optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    """:func:`_create_scaling_models_optimizers` plus 4 (input, target) batches, an MSE loss
    and the iteration at which the tests inject an inf (2)."""
    data = [tuple(torch.randn((8, 8), dtype=dtype, device=device) for _ in range(2)) for _ in range(4)]
    skip_iter = 2
    return _create_scaling_models_optimizers(device, optimizer_ctor, optimizer_kwargs) + (
        data, torch.nn.MSELoss(), skip_iter)


# Defined in common_distributed (as in torch_npu); importable from here too.
from .common_distributed import skipIfUnsupportMultiNPU  # noqa: E402,F401
