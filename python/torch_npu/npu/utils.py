"""Device functions of ``torch.npu``: selection, synchronisation, properties.

Everything here is a thin, argument-checking layer over ``torch_npu._C``. The
device index helpers (:func:`_get_device_index`) are shared by the other
``torch.npu`` submodules so that every API accepts the same spellings of a device
(``1``, ``"npu:1"``, ``torch.device("npu", 1)``, ``None`` for the current one) and
rejects everything else with the same kind of message.
"""

import os
import re
import uuid
import warnings
from typing import Any, Optional

import torch

from torch_npu import _C

__all__ = [
    "obfuscation_initialize",
    "obfuscation_finalize",
    "obfuscation_calculate",
    "synchronize",
    "device_count",
    "is_available",
    "can_device_access_peer",
    "set_device",
    "current_device",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "mem_get_info",
    "utilization",
    "device",
    "device_of",
    "is_bf16_supported",
    "is_support_inf_nan",
    "get_soc_version",
    "current_blas_handle",
    "get_cann_version",
    "get_npu_overflow_flag",
    "clear_npu_overflow_flag",
    "npu_check_overflow",
    "check_uce_in_memory",
    "stress_detect",
    "set_op_timeout_ms",
]


class _InvalidDeviceError(AssertionError, RuntimeError, ValueError):
    """An NPU device index that does not name a visible device.

    Huawei's torch_npu raises ``AssertionError("Invalid device id")`` from the
    query functions and a ``RuntimeError`` from ``set_device``; ``torch.cuda`` uses
    both as well. This class is all three, so user code catching any of them keeps
    working, while the message says which argument was wrong and what is valid.
    """


def _lazy_init():
    # Late import: torch_npu.npu imports this module.
    from torch_npu.npu import _lazy_init as init

    init()


_cached_device_count: Optional[int] = None


def device_count() -> int:
    r"""Return the number of NPUs visible to this process (``ASCEND_RT_VISIBLE_DEVICES``).

    Before the NPU is initialised the count is not cached and does not start the runtime:
    ``ASCEND_RT_VISIBLE_DEVICES`` set in between applies (the runtime reads it when it starts),
    as in torch_npu. From initialisation on, the runtime's count is cached."""
    global _cached_device_count
    if _cached_device_count is not None:
        return _cached_device_count
    from torch_npu.npu import is_initialized  # late import: torch_npu.npu imports this module

    if is_initialized():
        _cached_device_count = int(_C._npu_getDeviceCount())
        return _cached_device_count
    return int(_C._npu_visibleDeviceCount())


def is_available():
    r"""Return whether at least one NPU can be used."""
    return device_count() > 0


def _fn_label(fn: Optional[str]) -> str:
    return f"{fn}(): " if fn else ""


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False,
                      *, fn: Optional[str] = None, arg: str = "device") -> int:
    r"""Return the device index named by ``device``.

    ``device`` may be an ``int``, a string (``"npu"``, ``"npu:1"``, ``"1"``), a
    ``torch.device``, a :class:`torch.npu.device` context manager or ``None``.
    ``None`` and ``"npu"`` without index mean the current device when ``optional``
    is true. With ``allow_cpu``, a cpu device gives ``-1``. ``fn`` and ``arg`` only
    make the error messages name the caller and the argument.
    """
    where = _fn_label(fn)
    if isinstance(device, bool):
        raise TypeError(f"{where}argument '{arg}' must be an int, a str or a torch.device, "
                        f"got bool ({device!r})")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        text = device.strip()
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        try:
            device = torch.device(text)
        except RuntimeError as err:
            # RuntimeError as torch.device raises it, ValueError as for other bad devices.
            raise _InvalidDeviceError(
                f"Invalid device string: {device!r}: {where}argument '{arg}' is not a valid "
                f"device string (expected e.g. 'npu', 'npu:0' or an index)") from err
    if isinstance(device, torch.device):
        if device.type == "cpu" and allow_cpu:
            return -1
        if device.type != "npu":
            expected = "an npu or cpu device" if allow_cpu else "an npu device"
            # "Expected a npu device, but got: cpu" is torch_npu's (and torch.cuda's) wording.
            raise ValueError(f"{where}Expected a npu device, but got: {device} (argument '{arg}' "
                             f"must be {expected})")
        if device.index is not None:
            return device.index
        if optional:
            return current_device()
        raise ValueError(f"{where}argument '{arg}' must be an npu device with an index, "
                         f"got {device}")
    if isinstance(device, _DeviceContext):
        return device.idx
    if device is None:
        if optional:
            return current_device()
        raise ValueError(f"{where}argument '{arg}' must be an npu device with an index or an "
                         f"int, got None")
    raise TypeError(f"{where}argument '{arg}' must be an int, a str or a torch.device, "
                    f"got {type(device).__name__}")


#: The functions whose out-of-range device torch_npu reports in its caching allocator's
#: words ("Invalid device argument"): the memory statistics and the memory pools.
_ALLOCATOR_FNS = frozenset({"memory_stats", "memory_summary", "reset_accumulated_memory_stats",
                            "reset_peak_memory_stats", "use_mem_pool"})


def _check_device_index(idx: int, *, fn: Optional[str] = None, arg: str = "device") -> int:
    count = device_count()
    if idx < 0 or idx >= count:
        # torch_npu's words: "Invalid device ID ... Check whether the device ID is valid" from
        # set_device, "Invalid device argument" from the caching allocator, "Invalid peer
        # device id" for a peer, "Invalid device id" from the other query functions.
        head, tail = "Invalid device id", ""
        if fn == "set_device":
            head, tail = "Invalid device ID", ". Check whether the device ID is valid"
        elif fn in _ALLOCATOR_FNS:
            head = "Invalid device argument"
        elif arg == "peer_device_id":
            head = "Invalid peer device id"
        raise _InvalidDeviceError(
            f"{head}: {_fn_label(fn)}argument '{arg}' is {idx}, but this process "
            f"sees {count} NPU device(s), so it must be in [0, {count - 1}]{tail} "
            f"(ASCEND_RT_VISIBLE_DEVICES selects which devices are visible)")
    return idx


def _valid_device_index(device: Any, *, fn: str, arg: str = "device") -> int:
    """Index of ``device`` (``None`` = current), checked against ``device_count()``."""
    return _check_device_index(_get_device_index(device, optional=True, fn=fn, arg=arg),
                               fn=fn, arg=arg)


def set_device(device):
    r"""Set the current NPU device of this thread.

    Args:
        device (int, str or torch.device): the device, e.g. ``1``, ``"npu:1"`` or
            ``torch.device("npu", 1)``. A negative index is a no-op.
    """
    idx = _get_device_index(device, optional=True, fn="set_device")
    if idx < 0:
        return
    _check_device_index(idx, fn="set_device")
    _lazy_init()  # as torch_npu's (and torch.cuda's): choosing a device starts the runtime
    _C._npu_setDevice(idx)


def current_device():
    r"""Return the index of the current NPU device of this thread."""
    _lazy_init()
    return int(_C._npu_getDevice())


def synchronize(device=None):
    r"""Wait for all kernels in all streams of an NPU device to complete.

    Args:
        device (torch.device or int, optional): the device; the current one if ``None``.
    """
    _lazy_init()
    idx = _valid_device_index(device, fn="synchronize")
    _C._npu_synchronize(idx)


def _sleep(cycles):
    r"""Queue a task that keeps the current stream busy for ``cycles`` AI Core cycles
    (1.8 GHz: 1.8e6 cycles take a millisecond), as ``torch.cuda._sleep``; the call returns
    at once. Tests use it to have work queued behind a running task."""
    if not isinstance(cycles, int) or isinstance(cycles, bool):
        raise TypeError(f"torch.npu._sleep(): expected 'int' for argument 'cycles', got {type(cycles).__name__}")
    _lazy_init()
    _C._npu_sleep(cycles)


def can_device_access_peer(device_id, peer_device_id):
    r"""Return whether ``device_id`` can access the memory of ``peer_device_id``.

    All simulated devices live in one host address space, so any two distinct
    devices can; like ``aclrtDeviceCanAccessPeer``/CUDA, a device is not its own peer.
    """
    idx = _valid_device_index(device_id, fn="can_device_access_peer", arg="device_id")
    peer = _valid_device_index(peer_device_id, fn="can_device_access_peer", arg="peer_device_id")
    return idx != peer


def get_device_name(device_name=None):
    r"""Return the SoC name of an NPU (``device_name``: a device or its index), e.g.
    ``"Ascend910B1"``."""
    idx = _valid_device_index(device_name, fn="get_device_name", arg="device_name")
    return _C._npu_getDeviceName(idx)


# Hardware facts of the SoCs the simulator can profile (public Ascend data sheets):
# AI cube cores, vector cores, L2 cache. Anything else falls back to 910B1 numbers.
_SOC_FACTS = {
    "Ascend910B1": (24, 48, 192 * 1024 * 1024),
    "Ascend910B2": (24, 48, 192 * 1024 * 1024),
    "Ascend910B3": (20, 40, 192 * 1024 * 1024),
    "Ascend910B4": (20, 40, 96 * 1024 * 1024),
}


class _NPUDeviceProperties:
    """Properties of one NPU, with the attribute names of torch_npu's ``_NPUDeviceProperties``."""

    __slots__ = ("name", "total_memory", "cube_core_num", "vector_core_num", "L2_cache_size",
                 "multi_processor_count", "major", "minor", "is_integrated", "is_multi_gpu_board",
                 "max_threads_per_multi_processor", "warp_size", "regs_per_multiprocessor", "gcnArchName",
                 "index", "uuid")

    def __init__(self, index: int, name: str, total_memory: int):
        cube, vector, l2 = _SOC_FACTS.get(name, _SOC_FACTS["Ascend910B1"])
        self.index = index
        self.name = name
        self.total_memory = int(total_memory)
        self.cube_core_num = cube
        self.vector_core_num = vector
        self.L2_cache_size = l2
        # The vector cores stand for CUDA's multiprocessors (as torch_npu, e.g. for
        # DataParallel's balance check).
        self.multi_processor_count = vector
        # CUDA / ROCm facts an NPU does not have are None, as in torch_npu (no compute
        # capability: see get_device_capability()).
        self.major = self.minor = None
        self.is_integrated = self.is_multi_gpu_board = None
        self.max_threads_per_multi_processor = self.warp_size = self.regs_per_multiprocessor = None
        self.gcnArchName = None
        # A stable id per simulated device (a real NPU reports its chip's UUID).
        self.uuid = uuid.uuid5(uuid.NAMESPACE_OID, f"ascend-simulator/{name}/{index}")

    def __repr__(self) -> str:
        return (f"_NPUDeviceProperties(name='{self.name}', "
                f"total_memory={self.total_memory // (1024 * 1024)}MB)")


def get_device_properties(device_name=None):
    r"""Return the properties of an NPU (``device_name``: a device or its index): ``name``,
    ``total_memory``, core counts, ..."""
    _lazy_init()
    idx = _valid_device_index(device_name, fn="get_device_properties", arg="device_name")
    return _NPUDeviceProperties(idx, _C._npu_getDeviceName(idx),
                                _C._npu_getDeviceTotalMemory(idx))


def get_device_capability(device=None):
    r"""Return ``None``: NPUs have no CUDA compute capability.

    For code that insists on a tuple, set ``TORCH_NPU_DEVICE_CAPABILITY="major.minor"``
    (as with torch_npu); the value is then returned as ``(major, minor)``, the same for
    every device. ``device`` is accepted for compatibility and not used: as torch_npu,
    any value is taken (an index, a device, a device name such as ``"Ascend910B1"``).
    """
    note = ("The return value of get_device_capability is only for compatibility with PyTorch "
            "and does not describe the NPU.")
    env = os.environ.get("TORCH_NPU_DEVICE_CAPABILITY")
    if not env:
        warnings.warn("torch.npu.get_device_capability() returns None; set "
                      f"TORCH_NPU_DEVICE_CAPABILITY='major.minor' to change it. {note}")
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", env.strip())
    if match is None:
        warnings.warn(f"Cannot parse TORCH_NPU_DEVICE_CAPABILITY={env!r}: expected "
                      "'major.minor' with non-negative integers, e.g. '8.0'. Returning None.")
        return None
    warnings.warn(note)
    return int(match.group(1)), int(match.group(2))


def mem_get_info(device=None):
    r"""Return ``(free, total)`` device memory in bytes, as ``aclrtGetMemInfo`` reports it."""
    _lazy_init()
    idx = _valid_device_index(device, fn="mem_get_info")
    free, total = _C._npu_getMemInfo(idx)
    return int(free), int(total)


def utilization(device=None):
    r"""Return the percentage of time over the last sample period the device was busy.

    torch_npu reports the AI Core utilization the driver samples. The simulator reports
    the time the device's streams spent running tasks (kernels, copies, memsets, host
    callbacks, graph replays; not event waits) during the period since the previous
    ``utilization()`` call for that device (the first call: since torch_npu was loaded),
    summed over streams and capped at 100. A task counts once it finished; kernels small
    enough to run on the launching thread are not counted.
    """
    _lazy_init()
    idx = _valid_device_index(device, fn="utilization")
    return int(_C._npu_getDeviceUtilizationRate(idx))


# torch_npu's SocVersion enum (what get_soc_version() returns): one number per SoC, grouped
# by generation so that code can compare, e.g. ``get_soc_version() >= 220`` for Ascend910B1+.
_SOC_VERSIONS = {
    "Ascend910PremiumA": 100, "Ascend910ProA": 101, "Ascend910A": 102, "Ascend910ProB": 103,
    "Ascend910B": 104,
    "Ascend310P1": 200, "Ascend310P2": 201, "Ascend310P3": 202, "Ascend310P4": 203,
    "Ascend310P5": 204, "Ascend310P7": 205,
    "Ascend910B1": 220, "Ascend910B2": 221, "Ascend910B2C": 222, "Ascend910B3": 223,
    "Ascend910B4": 224, "Ascend910B4-1": 225,
    "Ascend310B1": 240, "Ascend310B2": 241, "Ascend310B3": 242, "Ascend310B4": 243,
    "Ascend910_9391": 250, "Ascend910_9392": 251, "Ascend910_9381": 252, "Ascend910_9382": 253,
    "Ascend910_9372": 254, "Ascend910_9362": 255, "Ascend910_9363": 256,
}
_ASCEND910B1 = 220
_ASCEND310B1 = 240
_ASCEND910_9391 = 250
_ASCEND950 = 260


def _soc_version_of(name: str) -> int:
    if name in _SOC_VERSIONS:
        return _SOC_VERSIONS[name]
    if name.startswith("Ascend950"):
        return _ASCEND950
    return -1  # torch_npu's UnsupportedSocVersion


def get_soc_version() -> int:
    r"""Return the SoC of the NPUs as torch_npu's ``SocVersion`` number, e.g. ``220`` for
    ``"Ascend910B1"`` (``get_device_name()`` gives the name)."""
    _lazy_init()
    return _soc_version_of(get_device_name())


def is_bf16_supported(including_emulation: bool = False):
    r"""Return whether the SoC computes in bfloat16 (Ascend910B1 and later)."""
    return get_soc_version() >= _ASCEND910B1


def is_support_inf_nan():
    r"""Return whether the SoC propagates inf/NaN instead of setting a global overflow flag
    (the Ascend910B and Ascend910_93 families and later; torch_npu's rule)."""
    soc = get_soc_version()
    return (_ASCEND910B1 <= soc < _ASCEND310B1) or soc >= _ASCEND910_9391


def current_blas_handle():
    r"""Return ``None``: NPUs have no BLAS handle (same as torch_npu, with its warning)."""
    warnings.warn("NPU does not use blas handle.")
    return None


def get_cann_version(module='CANN'):
    r"""Return the (simulated) CANN version; see :func:`torch_npu.utils.get_cann_version`."""
    from torch_npu.utils import get_cann_version as _get

    return _get(module)


def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    r"""Whether the CANN component ``module`` is at least ``version`` (e.g. ``"8.1.RC1"``)."""
    from torch_npu.utils import _is_gte_cann_version as _gte

    return _gte(version, module)


class _DeviceContext:
    r"""Context manager that changes the current NPU device.

    Args:
        device (torch.device, str, int or None): device to select. ``None`` means the
            current device; a negative index makes the context manager a no-op.
    """

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True, fn="torch.npu.device")
        if self.idx >= 0:
            _check_device_index(self.idx, fn="torch.npu.device")
        self.prev_idx = -1

    def __enter__(self):
        if self.idx < 0:
            return self
        _lazy_init()
        self.prev_idx = int(_C._npu_getDevice())
        if self.prev_idx != self.idx:
            _C._npu_setDevice(self.idx)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self.idx >= 0 and self.prev_idx >= 0 and self.prev_idx != self.idx:
            _C._npu_setDevice(self.prev_idx)
        return False

    def __repr__(self):
        return f"torch.npu.device(idx={self.idx})"


class device(_DeviceContext):
    r"""Context manager that changes the current NPU device (as ``torch.cuda.device``)."""


class device_of(device):
    r"""Context manager that selects the device of a tensor or storage.

    A no-op if the object is not on an NPU.
    """

    def __init__(self, obj):
        idx = obj.get_device() if getattr(obj, "is_npu", False) else -1
        super().__init__(idx)


# ---- overflow detection, device health checks, operator timeout (torch_npu.npu.utils) ----

def get_npu_overflow_flag():
    r"""The chip's global floating-point overflow flag. SoCs that propagate inf/NaN (Ascend910B
    and later, which the simulator is) have none: as torch_npu, this raises and
    :func:`npu_check_overflow` is the way to check."""
    if is_support_inf_nan():
        raise RuntimeError("Unsupported api when soc_version >= Ascend910B1, please use "
                           "npu_check_overflow")
    raise RuntimeError(f"get_npu_overflow_flag: the simulated {get_device_name()} keeps no "
                       f"global overflow status register")


def clear_npu_overflow_flag():
    r"""Clear the global overflow flag; useless (a warning) where inf/NaN propagate."""
    if is_support_inf_nan():
        warnings.warn("When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless. "
                      "Please remove it.")
        return
    raise RuntimeError(f"clear_npu_overflow_flag: the simulated {get_device_name()} keeps no "
                       f"global overflow status register")


def npu_check_overflow(grad):
    r"""Whether ``grad`` (a float or a tensor, e.g. a gradient norm) overflowed: its sum is
    inf or NaN."""
    if isinstance(grad, float):
        total = grad
    elif isinstance(grad, torch.Tensor):
        total = float(grad.float().sum())
    else:
        raise RuntimeError("Unsupported type.")
    return total in (float("inf"), -float("inf")) or total != total


def stress_detect(detect_type='aic'):
    r"""Online hardware self-test: ``'aic'`` runs a compute check on the current device's
    cores, ``'hccs'`` a point-to-point check between the ranks of a node (needs
    ``torch.distributed`` initialised and ``RANK``/``LOCAL_WORLD_SIZE``/``WORLD_SIZE``).
    Returns 0 when the check passes, 1 otherwise (a warning says why).

    On the simulator the 'aic' check computes a matmul on the device and compares it with the
    host's result; 'hccs' all-reduces a tensor over the default group and checks the sum."""
    if detect_type not in ('aic', 'hccs'):
        warnings.warn("Detect_type should be `aic` or `hccs`. For details, `aic` is for "
                      "`Online aicore detect`, and `hccs` is for `Online p2p detect`.")
        return 1
    _lazy_init()
    if detect_type == 'aic':
        gen = torch.Generator().manual_seed(1234)
        a = torch.randn(64, 64, generator=gen)
        b = torch.randn(64, 64, generator=gen)
        dev = torch.device("npu", current_device())
        ok = torch.allclose((a.to(dev) @ b.to(dev)).cpu(), a @ b, rtol=1e-4, atol=1e-4)
        return 0 if ok else 1
    import torch.distributed as dist
    if not dist.is_initialized():
        warnings.warn("torch.distributed should be initialized for p2p detection.")
        return 1
    if any(int(os.getenv(v, -1)) == -1 for v in ("RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")):
        warnings.warn("Environment variables 'RANK', 'LOCAL_WORLD_SIZE' or 'WORLD_SIZE' are not set.")
        return 1
    t = torch.ones(1, device=torch.device("npu", current_device()))
    dist.all_reduce(t)
    return 0 if int(t.item()) == dist.get_world_size() else 1


def check_uce_in_memory(device_id):
    r"""Whether device memory has uncorrectable ECC errors (UCE) and where they are: 0 none,
    1 in memory no tensor uses, 2 in memory the allocator holds, 3 in tensor memory. The
    simulator's memory (host RAM) reports none: always 0 for a valid device."""
    _lazy_init()
    _check_device_index(int(device_id), fn="check_uce_in_memory", arg="device_id")
    return 0


_op_timeout_ms = None


_UINT32_MAX = 2 ** 32 - 1


def set_op_timeout_ms(timeout):
    r"""Set the execution timeout of one operator, in milliseconds (> 0). The simulator records
    it (``torch_npu.npu.utils._op_timeout_ms``); its kernels run on the host CPU without an
    AI Core watchdog, so no operator is aborted by it."""
    global _op_timeout_ms
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        raise TypeError(f"set_op_timeout_ms(): timeout must be an int, got {type(timeout).__name__}")
    # The timeout is an unsigned 32-bit count; the texts in parentheses are torch_npu's.
    if timeout < 0:
        raise ValueError(f"set_op_timeout_ms(): timeout must be > 0, got {timeout} (can't convert "
                         "negative value to unsigned int)")
    if timeout == 0:
        raise ValueError("set_op_timeout_ms(): timeout must be > 0, got 0")
    if timeout > _UINT32_MAX:
        raise OverflowError(f"set_op_timeout_ms(): timeout must be at most {_UINT32_MAX} ms, got "
                            f"{timeout} (Overflow when unpacking long)")
    _op_timeout_ms = timeout


# PMCC model obfuscation (torch_npu/_obfuscation_ops.py): the operators are torch.ops.npu ones,
# registered after this module is imported.
def obfuscation_initialize(hidden_size, tp_rank, cmd, *, data_type=None, model_obf_seed_id=0, data_obf_seed_id=0,
                           thread_num=4, obf_coefficient=1.0):
    return torch.ops.npu.obfuscation_initialize(
        hidden_size, tp_rank, cmd, data_type=data_type, model_obf_seed_id=model_obf_seed_id,
        data_obf_seed_id=data_obf_seed_id, thread_num=thread_num, obf_coefficient=obf_coefficient)


def obfuscation_finalize(fd_to_close):
    return torch.ops.npu.obfuscation_finalize(fd_to_close)


def obfuscation_calculate(fd, x, param, *, obf_coefficient=1.0):
    return torch.ops.npu.obfuscation_calculate(fd, x, param, obf_coefficient=obf_coefficient)
