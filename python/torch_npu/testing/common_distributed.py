"""Helpers for distributed tests written for torch_npu (``torch_npu.testing.common_distributed``).

Meant for ``torch.testing._internal.common_distributed.MultiProcessTestCase`` subclasses
(which provide ``rank``, ``world_size`` and ``file_name``)::

    class TestAllReduce(MultiProcessTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

        @skipIfUnsupportMultiNPU(2)
        @with_comms
        def test_all_reduce(self):
            t = torch.ones(4, device=self.device_type)
            dist.all_reduce(t)
"""

import functools
import unittest
from collections import namedtuple

import torch
import torch.distributed as dist

__all__ = ["TestSkip", "TEST_SKIPS", "skipIfUnsupportMultiNPU", "with_comms", "init_pg", "hccl_available"]

TestSkip = namedtuple("TestSkip", "exit_code, message")
TEST_SKIPS = {
    "multi-npu": TestSkip(75, "Need at least 2 ASCEND devices"),
    **{f"multi-npu-{n}": TestSkip(75, f"Need at least {n} ASCEND devices") for n in range(1, 9)},
    "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
    "known_issues": TestSkip(77, "Test skipped due to known issues"),
}


def skipIfUnsupportMultiNPU(npu_number_needed):
    """Decorator: skip the test unless at least ``npu_number_needed`` NPUs are visible."""
    if isinstance(npu_number_needed, bool) or not isinstance(npu_number_needed, int):
        raise TypeError("skipIfUnsupportMultiNPU(): argument 'npu_number_needed' must be an int, "
                        f"got {type(npu_number_needed).__name__}")

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            count = torch.npu.device_count() if torch.npu.is_available() else 0
            if count < npu_number_needed:
                raise unittest.SkipTest(f"Need at least {npu_number_needed} NPU devices, "
                                        f"have {count}")
            return fn(*args, **kwargs)

        return wrapper

    return decorator


def hccl_available() -> bool:
    """Return whether the ``hccl`` process-group backend is registered with torch.distributed."""
    return dist.is_available() and "hccl" in getattr(dist.Backend, "backend_list", [])


def init_pg(backend: str = "hccl", world_size=1, rank=0, file_name="file://") -> None:
    """Initialise the default process group through a file store at ``file_name`` (a path, or a
    ``file://`` URL) and set the rank's NPU for hccl."""
    if backend not in ("hccl", "gloo"):
        raise RuntimeError(f"init_pg(): backend {backend!r} not supported (expected 'hccl' or 'gloo')")
    if backend == "hccl":
        if torch.npu.device_count() < world_size:
            raise RuntimeError(TEST_SKIPS[f"multi-npu-{min(world_size, 8)}"].message)
        if not hccl_available():
            raise RuntimeError(TEST_SKIPS["hccl"].message)
    dist.init_process_group(backend=backend, world_size=world_size, rank=rank,
                            init_method=file_name if str(file_name).startswith("file://") else f"file://{file_name}")
    if backend == "hccl":
        torch.npu.set_device(rank)


def with_comms(func):
    """Decorator: run the test inside a process group, on NPUs with ``hccl`` when there are
    ``world_size`` NPUs and the backend is registered, else on CPU with ``gloo``.

    Sets ``self.device_type`` (``"npu"`` or ``"cpu"``) before calling the test and
    destroys the group afterwards.
    """
    if func is None:
        raise RuntimeError("with_comms: the test function is None")

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        use_npu = (torch.npu.is_available() and torch.npu.device_count() >= self.world_size
                   and hccl_available())
        if not isinstance(getattr(type(self), "device_type", None), property):  # DTensorTestBase: read-only
            self.device_type = "npu" if use_npu else "cpu"
        init_pg(backend="hccl" if use_npu else "gloo", world_size=self.world_size,
                rank=self.rank, file_name=self.file_name)
        try:
            torch.npu.manual_seed(0)
            return func(self, *args, **kwargs)
        finally:
            destroy = getattr(self, "destroy_pg", None)
            if callable(destroy):
                destroy()
            elif dist.is_initialized():
                dist.destroy_process_group()

    return wrapper
