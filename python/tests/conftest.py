"""Shared fixtures of the torch_npu Python tests.

The tests import whatever ``torch_npu`` is importable: the installed wheel (nox,
CI), the Bazel runfiles (``bazel test //python:python_tests``), or the source tree with
``PYTHONPATH=python`` after ``tools/dev_link.sh``.
"""

import os
import sys

import pytest

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _restore_npu_state():
    """Each test starts on device 0 with default streams, and leaves it that way."""
    torch.npu.set_device(0)
    yield
    torch.npu.synchronize()
    for idx in range(torch.npu.device_count()):
        torch.npu.set_stream(torch.npu.default_stream(idx))  # makes idx the current device
    torch.npu.set_device(0)


def subprocess_env(env=None):
    """This process's environment plus ``env``, with PYTHONPATH starting at the folder of the
    torch_npu the tests import (then ``env``'s PYTHONPATH, then ours): a child process imports
    the same torch_npu."""
    env = dict(env or {})
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_npu.__file__)))
    paths = [package_root, env.pop("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")]
    full_env = dict(os.environ)
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return full_env


def run_python(code: str, env=None, timeout: float = 300):
    """Run ``code`` in a fresh interpreter importing the same torch_npu as the tests."""
    import subprocess

    return subprocess.run([sys.executable, "-c", code], env=subprocess_env(env), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def fresh_inductor_cache(tmp_path_factory):
    """A module-wide empty Inductor cache: every compile of the module is a real (cold) one."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor_cache"))
    yield
    if old is None:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@pytest.fixture
def reset_dynamo():
    """Each test compiles from scratch (no graphs or recompile counts left by the previous one)."""
    import torch._dynamo
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def spawn_ranks(fn, world, *args):
    """Runs fn(rank, world, port, *args) in `world` spawned processes that meet at a TCPStore on
    `port` (see init_hccl_rank); returns when all have finished."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(fn, args=(world, store.port) + args, nprocs=world, join=True)


def init_hccl_rank(rank, world, port):
    """In a process of spawn_ranks: device `rank` and the hccl process group of the `world` ranks."""
    import torch.distributed as dist

    torch.npu.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("hccl", store=store, rank=rank, world_size=world)
