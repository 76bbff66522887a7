"""torch_npu.distributed.rpc.options: ``NPUTensorPipeRpcBackendOptions``, the options of the
``NPU_TENSORPIPE`` RPC backend.

They are torch's TensorPipe options (worker threads, timeout, init method, transports,
channels) with npu device placement: ``device_maps`` maps this worker's devices (``npu:i``
or ``cpu``) to a callee's devices, per callee name, and ``devices`` lists the local npu
devices the agent uses. Passing these options to ``torch.distributed.rpc.init_rpc`` selects
the ``NPU_TENSORPIPE`` backend (see ``backend_registry``).
"""
from typing import Dict, List, Optional, Union

import torch
import torch.distributed.rpc.constants as rpc_constants
from torch._C._distributed_rpc import _TensorPipeRpcBackendOptionsBase

from torch_npu.utils._error_code import ErrCode, dist_error

__all__ = ["NPUTensorPipeRpcBackendOptions"]

DeviceType = Union[int, str, torch.device]


def _npu_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def _parse_device(device: DeviceType, what: str) -> torch.device:
    """``device`` as a torch.device: an int is ``npu:<int>``; a device must be ``cpu`` or an
    npu with an index. ``what`` names the argument in the error."""
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"{what} must be an int, a str or a torch.device, got "
                        f"{type(device).__name__} ({device!r})" + dist_error(ErrCode.TYPE))
    try:
        parsed = torch.device(_npu_type(), device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{what}: {device!r} is not a device ({e})" + dist_error(ErrCode.VALUE)) from None
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type != _npu_type():
        raise ValueError(f"{what}: {device!r} is a {parsed.type} device; the NPU_TENSORPIPE backend maps "
                         f"{_npu_type()} and cpu devices" + dist_error(ErrCode.VALUE))
    if parsed.index is None:
        raise ValueError(f"{what}: {device!r} has no device index; write it as '{_npu_type()}:<index>'"
                         + dist_error(ErrCode.VALUE))
    return parsed


def _to_device(device: DeviceType) -> torch.device:
    """One entry of ``devices``: an npu device with an index."""
    parsed = _parse_device(device, "devices")
    if parsed.type != _npu_type():
        raise ValueError(f"`set_devices` expects a list of {_npu_type()} devices, but got device type "
                         f"{parsed.type} ({device!r})" + dist_error(ErrCode.VALUE))
    return parsed


def _to_device_map(device_map: Dict[DeviceType, DeviceType]) -> Dict[torch.device, torch.device]:
    """``device_map`` with torch.device keys and values; it must be one-to-one."""
    if not isinstance(device_map, dict):
        raise TypeError(f"device_map must be a dict from local to remote devices, got "
                        f"{type(device_map).__name__}" + dist_error(ErrCode.TYPE))
    full: Dict[torch.device, torch.device] = {}
    sources: Dict[torch.device, torch.device] = {}
    for key, value in device_map.items():
        src = _parse_device(key, "device_map key")
        dst = _parse_device(value, f"device_map[{key!r}]")
        if src in full and full[src] != dst:
            raise ValueError(f"`device_map` maps {src} to both {full[src]} and {dst}" + dist_error(ErrCode.VALUE))
        if dst in sources and sources[dst] != src:
            raise ValueError(f"`device_map` only supports 1-to-1 mapping, trying to map {src} and "
                             f"{sources[dst]} to {dst}" + dist_error(ErrCode.VALUE))
        full[src] = dst
        sources[dst] = src
    return full


def _to_device_list(devices: List[DeviceType]) -> List[torch.device]:
    if isinstance(devices, (str, int, torch.device)) or not hasattr(devices, "__iter__"):
        raise TypeError(f"devices must be a list of {_npu_type()} devices, got {type(devices).__name__}"
                        + dist_error(ErrCode.TYPE))
    full = [_to_device(d) for d in devices]
    if len(set(full)) != len(full):
        raise ValueError(f"devices lists a device twice: {full}" + dist_error(ErrCode.VALUE))
    return full


def _check_worker_name(to) -> str:
    if not isinstance(to, str) or not to:
        raise TypeError(f"the callee name (`to` / a key of device_maps) must be a non-empty str, got {to!r}"
                        + dist_error(ErrCode.TYPE))
    return to


class NPUTensorPipeRpcBackendOptions(_TensorPipeRpcBackendOptionsBase):
    r"""The options of the ``NPU_TENSORPIPE`` RPC backend (torch's TensorPipe agent for npu tensors).

    Args:
        num_worker_threads (int): threads of the agent's pool that run requests (default 16).
        rpc_timeout (float): default timeout of an RPC, in seconds (default 60).
        init_method (str): URL of the rendezvous store, as for ``init_process_group``
            (default ``env://``).
        device_maps (Dict[str, Dict]): per callee name, a one-to-one map from this worker's
            devices (``npu:i``, an int ``i`` meaning ``npu:i``, or ``cpu``) to the callee's. An
            npu tensor sent to that callee arrives on the mapped device; what the callee
            returns travels back through the inverse map.
        devices (List): the local npu devices the agent uses (default: those in the device
            maps of this worker and of its peers).
    """

    def __init__(
        self,
        *,
        num_worker_threads: int = rpc_constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout: float = rpc_constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method: str = rpc_constants.DEFAULT_INIT_METHOD,
        device_maps: Optional[Dict[str, Dict[DeviceType, DeviceType]]] = None,
        devices: Optional[List[DeviceType]] = None,
        _transports: Optional[List] = None,
        _channels: Optional[List] = None,
    ):
        if device_maps is not None and not isinstance(device_maps, dict):
            raise TypeError(f"device_maps must be a dict from callee names to device maps, got "
                            f"{type(device_maps).__name__}" + dist_error(ErrCode.TYPE))
        full_device_maps = {_check_worker_name(to): _to_device_map(m) for to, m in (device_maps or {}).items()}
        full_devices = [] if devices is None else _to_device_list(devices)
        super().__init__(num_worker_threads, _transports, _channels, rpc_timeout, init_method,
                         full_device_maps, full_devices)
        # The C++ base keeps no Python-readable copy of these two; the agent is built with them.
        self._transports = _transports
        self._channels = _channels

    def set_device_map(self, to: str, device_map: Dict[DeviceType, DeviceType]):
        r"""Adds ``device_map`` (this worker's devices -> the devices of callee ``to``) to the map
        for ``to``. An entry may repeat one already set, not change it."""
        _check_worker_name(to)
        full = _to_device_map(device_map)
        current = super().device_maps.get(to, {})
        for src, dst in full.items():
            if src in current and current[src] != dst:
                raise ValueError(f"`set_device_map` only supports 1-to-1 mapping, trying to map {src} to "
                                 f"{dst} and {current[src]}" + dist_error(ErrCode.VALUE))
        merged = dict(current)
        merged.update(full)
        _to_device_map(merged)  # still one-to-one with the entries set before
        super()._set_device_map(to, full)

    def set_devices(self, devices: List[DeviceType]):
        r"""Sets the local npu devices the agent uses."""
        self.devices = _to_device_list(devices)
