"""torch.distributed.rpc with npu tensors: the NPU_TENSORPIPE backend and its options
(torch_npu.distributed.rpc.options.NPUTensorPipeRpcBackendOptions).

Two spawned workers. worker0 maps npu:0 -> worker1's npu:1 and npu:2 -> worker1's npu:0 (another
index each way; its cpu tensors stay cpu); worker1 maps npu:3 -> worker0's npu:2 and cpu ->
worker0's npu:4. Every result of a remote
computation is compared with the same computation done locally on the caller's device and
on the CPU. Bad options and bad device maps must raise errors naming the argument or the
device.
"""
import faulthandler
import inspect
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

import torch_npu  # noqa: F401
from torch_npu.distributed.rpc.options import NPUTensorPipeRpcBackendOptions

pytestmark = pytest.mark.skipif(not (dist.is_available() and rpc.is_available()),
                                reason="torch.distributed.rpc is not available")

N0, N1, N2, N3, N4 = (torch.device("npu", i) for i in range(5))


# ---- functions the callee runs ----------------------------------------------------------------

def _devices_and_values(*tensors):
    return [str(t.device) for t in tensors], [t.cpu() for t in tensors]


def _affine(x, w, b):
    """relu(x @ w + b), and its row sums placed on the callee's npu:0."""
    y = torch.relu(x @ w + b)
    return y, y.sum(dim=1).to("npu:0")


def _on_side_stream(x):
    """A result written on a side stream and returned without synchronising it."""
    stream = torch.npu.Stream(x.device)
    stream.wait_stream(torch.npu.current_stream(x.device))
    with torch.npu.stream(stream):
        torch.npu._sleep(int(50 * 1.8e6))  # 50 ms: the result is still being written when it is sent
        y = x
        for _ in range(30):
            y = torch.tanh(y @ y.T / x.shape[1] + x)
    return y


def _chain(x):
    y = x
    for _ in range(30):
        y = torch.tanh(y @ y.T / x.shape[1] + x)
    return y


@rpc.functions.async_execution
def _async_double(x):
    fut = torch.futures.Future()
    fut.set_result(x * 2)
    return fut


def _to_device(x, device):
    return x.to(device)


def _inputs():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(4, 8, generator=g), torch.randn(8, 5, generator=g), torch.randn(5, generator=g))


def _close(actual, expected, device):
    assert actual.device == torch.device(device), (actual.device, device)
    torch.testing.assert_close(actual.cpu(), expected.cpu())


def _raises(fn, *texts):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (RPC surfaces remote errors as RuntimeError)
        assert all(t in str(e) for t in texts), str(e)
        return
    raise AssertionError(f"no error containing {texts}")


# ---- the two workers --------------------------------------------------------------------------

def _caller(x, w, b):
    x0, w0, b0 = x.to(N0), w.to(N0), b.to(N0)
    y_ref, s_ref = _affine(x, w, b)  # CPU reference
    y_loc, _ = _affine(x0, w0, b0)   # the caller's own device
    torch.testing.assert_close(y_loc.cpu(), y_ref)

    # arguments land on the mapped devices: npu:0 -> npu:1, npu:2 -> npu:0, cpu -> cpu
    devices, values = rpc.rpc_sync("worker1", _devices_and_values, args=(x0, x.to(N2), x))
    assert devices == ["npu:1", "npu:0", "cpu"], devices
    for v in values:
        assert torch.equal(v, x)

    # rpc_sync: results come back through the inverse map (npu:1 -> npu:0, npu:0 -> npu:2)
    y, s = rpc.rpc_sync("worker1", _affine, args=(x0, w0, b0))
    _close(y, y_ref, N0)
    _close(y, y_loc, N0)
    _close(s, s_ref, N2)

    # rpc_async, several in flight
    futs = [rpc.rpc_async("worker1", _affine, args=(x0 * k, w0, b0)) for k in (1.0, 2.0, 3.0)]
    for k, fut in zip((1.0, 2.0, 3.0), futs):
        y, s = fut.wait()
        y_k, s_k = _affine(x * k, w, b)
        _close(y, y_k, N0)
        _close(s, s_k, N2)

    # remote: the value stays on worker1 (npu:1), to_here brings it to npu:0
    rref = rpc.remote("worker1", _affine, args=(x0, w0, b0))
    y, s = rref.to_here()
    _close(y, y_ref, N0)
    _close(s, s_ref, N2)
    assert rpc.rpc_sync("worker1", _devices_and_values, args=(rref.to_here()[0],))[0] == ["npu:1"]

    # built-in operators, through rpc_sync / rpc_async / remote, and an RRef proxy
    _close(rpc.rpc_sync("worker1", torch.add, args=(x0, x0)), x + x, N0)
    _close(rpc.rpc_async("worker1", torch.matmul, args=(x0, w0)).wait(), x @ w, N0)
    mul = rpc.remote("worker1", torch.mul, args=(x0, 3))
    _close(mul.to_here(), x * 3, N0)
    _close(mul.rpc_sync().sum(dim=0), (x * 3).sum(dim=0), N0)

    # an async_execution function
    _close(rpc.rpc_sync("worker1", _async_double, args=(x0,)), x * 2, N0)

    # stream order: the caller's input is written on a side stream it has not synchronised,
    # the callee writes its result on a side stream it does not synchronise
    big = torch.randn(96, 96, generator=torch.Generator().manual_seed(3))
    side = torch.npu.Stream(N0)
    side.wait_stream(torch.npu.current_stream(N0))
    with torch.npu.stream(side):
        torch.npu._sleep(int(50 * 1.8e6))  # 50 ms: the argument is still being written when it is sent
        pending = _chain(big.to(N0))
    got = rpc.rpc_sync("worker1", _devices_and_values, args=(pending,))[1][0]
    torch.testing.assert_close(got, _chain(big))
    _close(rpc.rpc_sync("worker1", _on_side_stream, args=(big.to(N0),)), _chain(big), N0)

    # distributed autograd through the npu <-> host copies on both sides
    with dist_autograd.context() as ctx:
        t1 = x.to(N0).requires_grad_()
        t2 = (x * 0.5 + 1).to(N0).requires_grad_()
        t3 = rpc.rpc_sync("worker1", torch.mul, args=(t1, t2))
        t4 = torch.arange(32, dtype=torch.float32).reshape(4, 8).to(N0)
        dist_autograd.backward(ctx, [(t3 * t4).sum()])
        grads = dist_autograd.get_gradients(ctx)
    c1, c2 = x.clone().requires_grad_(), (x * 0.5 + 1).requires_grad_()
    ((c1 * c2) * t4.cpu()).sum().backward()
    _close(grads[t1], c1.grad, N0)
    _close(grads[t2], c2.grad, N0)

    # the agent reports the npu options it runs with
    agent = rpc.api._get_current_rpc_agent()
    assert agent._get_backend_options().device_maps["worker1"] == {N0: N1, N2: N0}
    assert agent._get_backend_options().devices == [N0, N2, N4]
    assert agent._get_device_map(rpc.get_worker_info("worker1")) == {N0: N1, N2: N0}

    # errors: an unmapped device, on the way there and on the way back; RPC keeps working
    _raises(lambda: rpc.rpc_sync("worker1", _devices_and_values, args=(x.to("npu:5"),)),
            "npu:5", "device map", "worker1")
    _raises(lambda: rpc.rpc_sync("worker1", _to_device, args=(x, "npu:6")), "npu:6", "worker1")
    _raises(lambda: rpc.remote("worker1", torch.add, args=(x.to("npu:4"), 1)).to_here(), "npu:4")
    _close(rpc.rpc_sync("worker1", torch.add, args=(x0, 1)), x + 1, N0)


def _worker(rank, world, init_method):
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails the test (with the stacks) instead
    torch.npu.set_device(rank)
    if rank == 0:
        options = NPUTensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=60, init_method=init_method,
                                                 device_maps={"worker1": {0: 1}})
        options.set_device_map("worker1", {"npu:2": "npu:0"})
        options.set_devices(["npu:0", "npu:2", "npu:4"])
    else:
        options = NPUTensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=60, init_method=init_method,
                                                 device_maps={"worker0": {"npu:3": "npu:2", "cpu": "npu:4"}})
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, backend=rpc.BackendType.NPU_TENSORPIPE,
                 rpc_backend_options=options)
    x, w, b = _inputs()
    if rank == 0:
        _caller(x, w, b)
    else:
        # the other direction: worker1's npu:3 -> worker0's npu:2 and cpu -> npu:4, back inverted
        assert rpc.rpc_sync("worker0", _devices_and_values, args=(x.to(N3), x))[0] == ["npu:2", "npu:4"]
        _close(rpc.rpc_sync("worker0", torch.matmul, args=(x.to(N3), w.to(N3))), x @ w, N3)
        _close(rpc.rpc_sync("worker0", torch.add, args=(x, 1)), x + 1, "cpu")
        # worker1 maps nothing to worker0's npu:6, so a result there has nowhere to go
        _raises(lambda: rpc.rpc_sync("worker0", _to_device, args=(x.to(N3), "npu:6")), "npu:6", "worker0")
    rpc.shutdown()
    faulthandler.cancel_dump_traceback_later()


def test_rpc_sync_async_remote_with_device_maps(tmp_path):
    mp.spawn(_worker, args=(2, f"file://{tmp_path}/init"), nprocs=2, join=True)


def _bad_map_worker(rank, world, init_method):
    maps = {"worker1": {"npu:0": "npu:9"}} if rank == 0 else {}
    options = NPUTensorPipeRpcBackendOptions(rpc_timeout=30, init_method=init_method, device_maps=maps)
    _raises(lambda: rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options),
            "Node worker0 has target devices with invalid indices", "npu:9")


def test_device_map_beyond_device_count_fails_init(tmp_path):
    mp.spawn(_bad_map_worker, args=(2, f"file://{tmp_path}/init"), nprocs=2, join=True)


# ---- the options alone --------------------------------------------------------------------------

def test_options_normalise_devices():
    options = NPUTensorPipeRpcBackendOptions(num_worker_threads=3, rpc_timeout=5.5, init_method="tcp://h:1",
                                             device_maps={"w1": {0: "npu:1", torch.device("npu:2"): 3}},
                                             devices=[0, "npu:2"])
    assert options.device_maps == {"w1": {N0: N1, N2: N3}}
    assert options.devices == [N0, N2]
    assert (options.num_worker_threads, options.rpc_timeout, options.init_method) == (3, 5.5, "tcp://h:1")
    options.set_device_map("w1", {"npu:0": "npu:1", "cpu": "npu:4"})  # repeating an entry is fine
    options.set_device_map("w2", {1: 0})
    assert options.device_maps == {"w1": {N0: N1, N2: N3, torch.device("cpu"): torch.device("npu", 4)},
                                   "w2": {N1: N0}}
    options.set_devices(["npu:5"])
    assert options.devices == [torch.device("npu", 5)]
    # without options the backend's handler makes them (torch.distributed.rpc's hook)
    made = rpc.backend_registry.construct_rpc_backend_options(rpc.BackendType.NPU_TENSORPIPE,
                                                              rpc_timeout=7, num_worker_threads=2)
    assert isinstance(made, NPUTensorPipeRpcBackendOptions)
    assert (made.rpc_timeout, made.num_worker_threads, made.device_maps) == (7, 2, {})


@pytest.mark.parametrize("make, error, texts", [
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"npu:0": "npu:1", "npu:2": "npu:1"}}),
     ValueError, ["1-to-1", "npu:1"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"cuda:0": "npu:1"}}), ValueError,
     ["device_map key", "cuda"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"npu:0": "npu"}}), ValueError,
     ["device_map['npu:0']", "index"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"npu:0": "gpu7"}}), ValueError,
     ["device_map['npu:0']", "gpu7"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"npu:0": 1.5}}), TypeError,
     ["device_map['npu:0']", "float"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={3: {"npu:0": "npu:1"}}), TypeError, ["`to`"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps=[("w", {})]), TypeError, ["device_maps"]),
    (lambda: NPUTensorPipeRpcBackendOptions(devices=["cpu"]), ValueError, ["set_devices", "cpu"]),
    (lambda: NPUTensorPipeRpcBackendOptions(devices=["npu:0", 0]), ValueError, ["devices", "twice"]),
    (lambda: NPUTensorPipeRpcBackendOptions(devices="npu:0"), TypeError, ["devices"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"npu:0": "npu:1"}}).set_device_map(
        "w", {"npu:0": "npu:2"}), ValueError, ["1-to-1", "npu:0", "npu:2", "npu:1"]),
    (lambda: NPUTensorPipeRpcBackendOptions(device_maps={"w": {"npu:0": "npu:1"}}).set_device_map(
        "w", {"npu:3": "npu:1"}), ValueError, ["1-to-1", "npu:3", "npu:0"]),
    (lambda: NPUTensorPipeRpcBackendOptions().set_device_map("w", ["npu:0"]), TypeError, ["device_map"]),
    (lambda: NPUTensorPipeRpcBackendOptions().set_devices(["npu:1", "cpu"]), ValueError, ["set_devices"]),
])
def test_bad_options_raise(make, error, texts):
    with pytest.raises(error) as info:
        make()
    assert all(t in str(info.value) for t in texts), str(info.value)


def test_signatures_match_the_api_list():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch_npu_api.json")
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)["entries"]
    prefix = "torch_npu.distributed.rpc.options.NPUTensorPipeRpcBackendOptions"
    assert str(inspect.signature(NPUTensorPipeRpcBackendOptions)) == entries[prefix]
    for name in ("set_device_map", "set_devices"):
        assert str(inspect.signature(getattr(NPUTensorPipeRpcBackendOptions, name))) == entries[f"{prefix}.{name}"]
    assert "NPU_TENSORPIPE" in rpc.backend_registry.BackendType.__members__
    assert rpc.BackendType is rpc.backend_registry.BackendType
