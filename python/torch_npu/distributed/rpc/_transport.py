"""How npu tensors travel in RPC messages of the ``NPU_TENSORPIPE`` backend.

The backend's agent is torch's TensorPipe agent, whose channels move CPU (and CUDA) memory
only, so it is built CPU-only (no device maps, no devices) and npu tensors cross the wire
through host memory, at the boundary where RPC pickles Python objects into "bytes + tensor
table" (``torch.distributed.rpc.internal._InternalRPCPickler``):

* Sending: an npu tensor is copied to host memory after its device is synchronised (every
  stream's pending write to it lands first); the tensor table carries the copy. The copy is an
  autograd op, so distributed autograd reaches the npu tensor.
* A request (``rpc_sync`` / ``rpc_async`` / ``remote``, which this module wraps to know the
  callee) names each tensor's destination: the caller's device map for the callee maps the
  tensor's device (``cpu`` too, when mapped). An npu tensor whose device is not mapped is
  refused before anything is sent, as torch's agent refuses it.
* A response (a function's result, the value ``to_here`` fetches) names the sender and the
  source device; the receiver maps it back through the inverse of its own device map for
  the sender, which is the map torch's agent applies to responses. A device with no inverse
  entry is an error.
* Receiving: the host copy is copied to its device, and that device's current stream is
  synchronised, so the tensor is complete whichever stream reads it next. A request's copies
  are made when its function is called (``_Request``), because distributed autograd attaches
  its ``recv`` function to the received host tensors only after the request is unpickled.

Every request carries its function as a ``_Request``: Python functions, and also built-in
operators (``torch.add``) and TorchScript functions, which torch would send as JIT values
that never pass through the pickler. ``RRef.to_here`` asks the owner by ``rpc_sync`` (torch
fetches an RRef holding a JIT-typed value, such as ``rpc.RRef(tensor)``, as a JIT value).
TorchScript async functions keep torch's route and take CPU tensors only, and so do RPCs
issued from TorchScript code.
"""
import contextlib
import functools
import threading

import torch
from torch._C._distributed_rpc import PyRRef
from torch.distributed.rpc import api
from torch.distributed.rpc import internal
from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

from torch_npu.utils._error_code import ErrCode, dist_error

__all__ = []

_CPU = torch.device("cpu")


class _Worker:
    """This process's ``NPU_TENSORPIPE`` agent and the device maps its messages follow."""

    def __init__(self, agent, name, device_maps, devices):
        self.agent = agent
        self.name = name
        self.device_maps = {to: dict(m) for to, m in device_maps.items()}
        self.devices = list(devices)

    def response_map(self, sender):
        """Where tensors returned by ``sender`` land: the inverse of our map for it."""
        return {remote: local for local, remote in self.device_maps.get(sender, {}).items()}


_worker = None
_sending = threading.local()  # .to: the callee of the request being pickled in this thread


def _set_worker(worker):
    global _worker
    _worker = worker


def _active():
    """The _Worker when the current RPC agent is an ``NPU_TENSORPIPE`` one, else None."""
    worker = _worker
    if worker is None or not api._is_current_rpc_agent_set():
        return None
    return worker if api._get_current_rpc_agent() is worker.agent else None


# ---- tensors in the pickler ------------------------------------------------------------------

def _to_host(tensor):
    if tensor.device.type == "cpu":
        return tensor
    torch.npu.synchronize(tensor.device)  # writes of any stream of the device land first
    return tensor.to(_CPU)


def _append(tensor):
    table = internal._thread_local_tensor_tables.send_tables
    table.append(tensor)
    return len(table) - 1


def _fill(out, host):
    """Copies the received host tensor into ``out`` on its device. A host tensor that distributed
    autograd made part of its graph (its grad_fn is the ``recv`` function) stays in it through
    the copy; otherwise ``out`` is a leaf requiring grad as the host tensor does, as a tensor
    received by torch's agent."""
    if host.grad_fn is not None:
        out.copy_(host)
    else:
        with torch.no_grad():
            out.copy_(host)
        if host.requires_grad:
            out.requires_grad_(True)


def _place(host, device):
    """The received host tensor on ``device`` (a torch.device), complete on return."""
    if device.type == "cpu":
        return host
    if host.layout == torch.strided:
        out = torch.empty_like(host, device=device, requires_grad=False)
        _fill(out, host)
    elif host.grad_fn is not None:
        out = host.to(device)
    else:
        out = host.detach().to(device).requires_grad_(host.requires_grad)
    torch.npu.current_stream(device).synchronize()
    return out


_receiving = threading.local()  # .pending: (device tensor, host tensor) of the request being unpickled


def _receive_request_tensor(index, device):
    """Unpickles a request's tensor: ``device`` is where the caller's device map sends it.

    Distributed autograd attaches its ``recv`` function to the received host tensors after
    the request is unpickled, so the copy to the device waits until the function is called
    (``_Request.__call__``); until then the tensor is allocated, not filled."""
    host = internal._thread_local_tensor_tables.recv_tables[index]
    device = torch.device(device)
    pending = getattr(_receiving, "pending", None)
    if pending is None or device.type == "cpu" or host.layout != torch.strided:
        return _place(host, device)
    out = torch.empty_like(host, device=device, requires_grad=False)
    pending.append((out, host))
    return out


def _receive_response_tensor(index, source, sender):
    """Unpickles a response's tensor from ``sender``'s device ``source``."""
    host = internal._thread_local_tensor_tables.recv_tables[index]
    worker = _active()
    source = torch.device(source)
    mapping = worker.response_map(sender) if worker is not None else {}
    if source in mapping:
        return _place(host, mapping[source])
    if source.type == "cpu":
        return host
    mine = worker.name if worker is not None else "this worker"
    mapped = {str(k): str(v) for k, v in (worker.device_maps.get(sender, {}) if worker else {}).items()}
    raise RuntimeError(
        f"RPC: {sender} returned a tensor on its device {source}, but the device map of {mine} for "
        f"{sender} ({mapped or 'none'}) has no entry mapping a local device to {source}, so the "
        f"tensor has nowhere to go. Add one with NPUTensorPipeRpcBackendOptions.set_device_map"
        f"('{sender}', {{<local device>: '{source}'}}), or return CPU tensors." + dist_error(ErrCode.VALUE))


_torch_tensor_reducer = internal._InternalRPCPickler._tensor_reducer


def _tensor_reducer(pickler, tensor):
    """``_InternalRPCPickler._tensor_reducer`` for the NPU_TENSORPIPE agent (torch's otherwise)."""
    worker = _active()
    if worker is None:
        return _torch_tensor_reducer(pickler, tensor)
    to = getattr(_sending, "to", None)
    device = tensor.device
    if to is None:  # a response: the receiver maps it back
        return (_receive_response_tensor, (_append(_to_host(tensor)), str(device), worker.name))
    device_map = worker.device_maps.get(to, {})
    if device in device_map:
        return (_receive_request_tensor, (_append(_to_host(tensor)), str(device_map[device])))
    if device.type == "cpu":
        return _torch_tensor_reducer(pickler, tensor)
    mapped = {str(k): str(v) for k, v in device_map.items()}
    raise RuntimeError(
        f"RPC: cannot send a tensor on {device} from {worker.name} to {to}: the device map of "
        f"{worker.name} for {to} ({mapped or 'none'}) has no entry for {device}. Set one with "
        f"NPUTensorPipeRpcBackendOptions(device_maps={{'{to}': {{'{device}': <{to}'s device>}}}}) or "
        f"set_device_map('{to}', ...), or move the tensor to CPU." + dist_error(ErrCode.VALUE))


# ---- requests --------------------------------------------------------------------------------

def _begin_request():
    """Unpickled first in a request: collects the request's tensors waiting for their copy."""
    _receiving.pending = []
    return _receiving.pending


def _find_script_function(qualified_name):
    fn = torch.jit._state._python_cu.find_function(qualified_name)
    if fn is None:
        raise RuntimeError(f"RPC: TorchScript function {qualified_name} is not defined on "
                           f"{api.get_worker_info().name}" + dist_error(ErrCode.NOT_FOUND))
    return fn


class _Request:
    """What a request of the NPU_TENSORPIPE agent runs on the callee: ``func`` (a Python function,
    a built-in operator, or a TorchScript function named by ``__qualname__``), after the copies
    of its tensor arguments to their devices. ``__qualname__`` is also the profiling name."""

    def __init__(self, func, qualified_name, script=False, pending=None):
        self.func = func
        self.__qualname__ = qualified_name
        self.script = script
        self.pending = pending
        if hasattr(func, "_wrapped_async_rpc_function"):
            self._wrapped_async_rpc_function = func._wrapped_async_rpc_function

    def __reduce__(self):
        # _begin_request is unpickled before func and the arguments, whose tensors it collects.
        return (_rebuild_request, (_BeginRequest(), None if self.script else self.func, self.__qualname__,
                                   self.script))

    def __call__(self, *args, **kwargs):
        pending, self.pending = self.pending or [], None
        devices = set()
        for out, host in pending:
            _fill(out, host)
            devices.add(out.device)
        for device in devices:
            torch.npu.current_stream(device).synchronize()
        func = _find_script_function(self.__qualname__) if self.script else self.func
        return func(*args, **kwargs)


class _BeginRequest:
    def __reduce__(self):
        return (_begin_request, ())


def _rebuild_request(pending, func, qualified_name, script):
    return _Request(func, qualified_name, script, pending)


def _as_request(func):
    """``func`` as the callable a request carries (torch's route for TorchScript async functions)."""
    if not callable(func):
        return func
    if hasattr(func, "_wrapped_async_rpc_function"):
        if isinstance(func._wrapped_async_rpc_function, torch.jit.ScriptFunction):
            return func
    qualified_name = torch.jit._builtins._find_builtin(func)
    if qualified_name is not None:
        return _Request(func, qualified_name)
    if isinstance(func, torch.jit.ScriptFunction):
        return _Request(None, func.qualified_name, script=True)
    return _Request(func, getattr(func, "__qualname__", type(func).__qualname__))


@contextlib.contextmanager
def _request_to(to):
    tables = internal._thread_local_tensor_tables
    had_tables = hasattr(tables, "send_tables")
    outer = getattr(_sending, "to", None)
    _sending.to = api._to_worker_info(to).name
    try:
        yield
    except BaseException:
        # torch's pickler leaves its half-filled table behind when pickling raises
        if not had_tables and hasattr(tables, "send_tables"):
            del tables.send_tables
        raise
    finally:
        _sending.to = outer


_torch_invoke_rpc = api._invoke_rpc
_torch_remote = api.remote
_torch_to_here = PyRRef.to_here


def _invoke_rpc(to, func, rpc_type, args=None, kwargs=None, rpc_timeout: float = UNSET_RPC_TIMEOUT):
    if _active() is None:
        return _torch_invoke_rpc(to, func, rpc_type, args, kwargs, rpc_timeout)
    with _request_to(to):
        return _torch_invoke_rpc(to, _as_request(func), rpc_type, args, kwargs, rpc_timeout)


@functools.wraps(_torch_remote)
def _remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    if _active() is None:
        return _torch_remote(to, func, args, kwargs, timeout)
    with _request_to(to):
        return _torch_remote(to, _as_request(func), args, kwargs, timeout)


def _owner_value(rref):
    """Runs on the owner of ``rref``: its value, which returns to the caller as a response."""
    return rref.local_value()


@functools.wraps(_torch_to_here)
def _to_here(self, timeout=UNSET_RPC_TIMEOUT):
    if _active() is None or self.is_owner():
        return _torch_to_here(self, timeout)
    return api.rpc_sync(self.owner(), _owner_value, args=(self,), timeout=timeout)


def _install():
    """Routes RPC's pickling and its three send functions through this module (idempotent);
    without an NPU_TENSORPIPE agent everything behaves as torch's."""
    import torch.distributed.rpc as rpc

    internal._InternalRPCPickler._tensor_reducer = _tensor_reducer
    pickler = internal._internal_rpc_pickler
    pickler._dispatch_table[torch.Tensor] = pickler._tensor_reducer
    api._invoke_rpc = _invoke_rpc
    api.remote = _remote
    rpc.remote = _remote
    PyRRef.to_here = _to_here
