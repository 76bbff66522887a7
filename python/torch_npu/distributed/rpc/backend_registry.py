"""torch_npu.distributed.rpc.backend_registry: the ``NPU_TENSORPIPE`` RPC backend.

``_rpc_backend_registry()`` registers it with ``torch.distributed.rpc.backend_registry``, so
that ``rpc.init_rpc(name, rank=..., world_size=..., backend=rpc.BackendType.NPU_TENSORPIPE,
rpc_backend_options=NPUTensorPipeRpcBackendOptions(...))`` works (with those options the
backend is also found without ``backend=``). Its agent is torch's TensorPipe agent; npu
tensors in its messages travel through host memory and follow the device maps (``_transport``
says how). At start-up the workers of a static group exchange their device maps, device lists
and device counts and check them together, as torch's TensorPipe backend does.
"""
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.distributed.rpc import api
from torch.distributed.rpc import constants as rpc_constants

from torch_npu.utils._error_code import ErrCode, dist_error

from . import _transport

__all__ = []

_BACKEND = "NPU_TENSORPIPE"


def _npu_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def _get_device_count_info() -> Dict[str, int]:
    """``{"npu": number of npu devices}`` of this process."""
    return {_npu_type(): torch.npu.device_count()}


def _init_device_state(device_type):
    """Starts the runtime of ``device_type`` (npu) so that requests may use it at once."""
    module = getattr(torch, str(device_type), None)
    if module is not None and hasattr(module, "is_available") and module.is_available():
        module.init()


def _tensorpipe_validate_devices(devices, device_count) -> bool:
    """True when every device is ``cpu`` or has an index below ``device_count[type]``."""
    return all(d.type == "cpu" or (d.index is not None and 0 <= d.index < device_count.get(d.type, 0))
               for d in devices)


def _fmt(devices):
    """Devices (a list, or a map) written as ``npu:0`` rather than ``device(type='npu', index=0)``."""
    if isinstance(devices, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in devices.items()) + "}"
    return "[" + ", ".join(str(d) for d in devices) + "]"


def _validate_device_maps(all_names, all_device_counts, all_device_maps, all_devices, is_static_group=True):
    """Raises ValueError naming the worker and the entry when the workers' device maps, device
    lists and device counts do not fit together."""
    for node in all_names:
        devices = all_devices.get(node, [])
        if len(set(devices)) != len(devices):
            raise ValueError(f"Node {node} has duplicated devices\ndevices = {_fmt(devices)}"
                             + dist_error(ErrCode.VALUE))
        if not _tensorpipe_validate_devices(devices, all_device_counts[node]):
            raise ValueError(f"Node {node} has devices with invalid indices\ndevices = {_fmt(devices)}\n"
                             f"device count = {all_device_counts[node]}" + dist_error(ErrCode.VALUE))
    for source in all_names:
        maps = all_device_maps.get(source, {})
        if is_static_group and not set(maps).issubset(all_names):
            raise ValueError(f"Node {source} has invalid target node names in its device maps\n"
                             f"device maps = {list(maps)}\nnode names = {all_names}" + dist_error(ErrCode.VALUE))
        for target, map_ in maps.items():
            if len(set(map_.values())) != len(map_):
                raise ValueError(f"Node {source} has duplicated target devices in its device map for "
                                 f"{target}\ndevice map = {_fmt(map_)}" + dist_error(ErrCode.VALUE))
            source_devices = all_devices.get(source, [])
            if source_devices:
                if not set(map_).issubset(source_devices):
                    raise ValueError(f"Node {source} has unexpected source devices in its device map for "
                                     f"{target}\ndevice map = {_fmt(map_)}\ndevices = {_fmt(source_devices)}"
                                     + dist_error(ErrCode.VALUE))
            elif not _tensorpipe_validate_devices(map_.keys(), all_device_counts[source]):
                raise ValueError(f"Node {source} has source devices with invalid indices in its device map "
                                 f"for {target}\ndevice map = {_fmt(map_)}\ndevice count = {all_device_counts[source]}"
                                 + dist_error(ErrCode.VALUE))
            target_devices = all_devices.get(target, [])
            if target_devices:
                if not set(map_.values()).issubset(target_devices):
                    raise ValueError(f"Node {source} has unexpected target devices in its device map for "
                                     f"{target}\ndevice map = {_fmt(map_)}\ndevices = {_fmt(target_devices)}"
                                     + dist_error(ErrCode.VALUE))
            elif target in all_device_counts and not _tensorpipe_validate_devices(
                    map_.values(), all_device_counts[target]):
                raise ValueError(f"Node {source} has target devices with invalid indices in its device map "
                                 f"for {target}\ndevice map = {_fmt(map_)}\ndevice count = {all_device_counts[target]}"
                                 + dist_error(ErrCode.VALUE))


def _get_device_infos():
    """(device counts, device maps, devices) of this worker (asked by joining workers)."""
    worker = _transport._active()
    if worker is not None:
        maps, devices = worker.device_maps, worker.devices
    else:
        opts = api._get_current_rpc_agent()._get_backend_options()
        maps, devices = opts.device_maps, opts.devices
    if devices:
        _init_device_state(devices[0].type)
    return _get_device_count_info(), maps, devices


def _tensorpipe_exchange_and_check_all_device_maps(my_name, my_device_count, my_device_maps, my_devices, group):
    """Gathers every worker's (name, device counts, device maps, devices) over ``group``, checks
    them, and returns (this worker's reverse device maps, its device list)."""
    gathered: List[Tuple[str, Dict[str, int], Dict, List[torch.device]]] = [("", {}, {}, [])] * group.size()
    dist.all_gather_object(gathered, (my_name, my_device_count, my_device_maps, my_devices), group)
    all_names = [name for name, _, _, _ in gathered]
    all_device_counts = {name: count for name, count, _, _ in gathered}
    all_device_maps = {name: maps for name, _, maps, _ in gathered}
    all_devices = {name: devices for name, _, _, devices in gathered}
    _validate_device_maps(all_names, all_device_counts, all_device_maps, all_devices)
    reverse = rpc.backend_registry._create_reverse_mapping(my_name, all_names, all_device_maps)
    return reverse, rpc.backend_registry._create_device_list(my_devices, my_device_maps, reverse)


def _set_devices_and_reverse_device_map(agent):
    """A worker joining a dynamic group: checks its device maps against the workers present
    and announces itself to each of them (the agents themselves stay CPU-only)."""
    from torch.distributed.rpc._utils import _update_group_membership

    me = agent.get_worker_info()
    all_names, all_device_counts, all_device_maps, all_devices = [], {}, {}, {}
    for info in agent.get_worker_infos():
        if info.name == me.name:
            counts, maps, devices = _get_device_count_info(), _transport._worker.device_maps, _transport._worker.devices
        else:
            counts, maps, devices = api.rpc_sync(info.name, _get_device_infos)
        all_names.append(info.name)
        all_device_counts[info.name], all_device_maps[info.name], all_devices[info.name] = counts, maps, devices
    _validate_device_maps(all_names, all_device_counts, all_device_maps, all_devices, is_static_group=False)
    for name in all_names:
        api.rpc_sync(name, _update_group_membership, args=(me, [], {}, True))


def _backend_type_repr(self):
    return "BackendType." + self.name


def _construct_rpc_backend_options(backend, rpc_timeout=rpc_constants.DEFAULT_RPC_TIMEOUT_SEC,
                                   init_method=rpc_constants.DEFAULT_INIT_METHOD, **kwargs):
    return backend.value.construct_rpc_backend_options_handler(rpc_timeout, init_method, **kwargs)


def _init_backend(backend, *args, **kwargs):
    return backend.value.init_backend_handler(*args, **kwargs)


def _npu_tensorpipe_construct_rpc_backend_options_handler(
        rpc_timeout, init_method, num_worker_threads=rpc_constants.DEFAULT_NUM_WORKER_THREADS,
        _transports=None, _channels=None, **kwargs):
    from .options import NPUTensorPipeRpcBackendOptions

    return NPUTensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method,
                                          num_worker_threads=num_worker_threads,
                                          _transports=_transports, _channels=_channels)


class _NPUTensorPipeAgent(rpc.TensorPipeAgent):
    """torch's TensorPipe agent, built CPU-only; Python sees the npu options it runs with."""

    def __init__(self, store, name, rank, world_size, options):
        cpu_options = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=options.num_worker_threads, rpc_timeout=options.rpc_timeout,
            init_method=options.init_method, _transports=getattr(options, "_transports", None),
            _channels=getattr(options, "_channels", None))
        super().__init__(store, name, rank, world_size, cpu_options, {}, [])
        # A copy, as torch's agent keeps one: later changes to the caller's options do not count.
        self._npu_options = type(options)(
            num_worker_threads=options.num_worker_threads, rpc_timeout=options.rpc_timeout,
            init_method=options.init_method, device_maps=options.device_maps, devices=options.devices,
            _transports=getattr(options, "_transports", None), _channels=getattr(options, "_channels", None))

    def _get_backend_options(self):
        return self._npu_options

    def _get_device_map(self, dst):
        return dict(self._npu_options.device_maps.get(dst.name, {}))


def _start_agent(store, name, rank, world_size, options, devices):
    agent = _NPUTensorPipeAgent(store, name, rank, world_size, options)
    _transport._set_worker(_transport._Worker(agent, name, agent._npu_options.device_maps, devices))
    api._init_rpc_states(agent)
    return agent


def _npu_tensorpipe_init_backend_handler(store, name, rank, world_size, rpc_backend_options):
    from .options import NPUTensorPipeRpcBackendOptions

    if not isinstance(store, dist.Store):
        raise TypeError(f"`store` must be a c10d::Store. {store}" + dist_error(ErrCode.TYPE))
    if not isinstance(rpc_backend_options, NPUTensorPipeRpcBackendOptions):
        raise TypeError(f"`rpc_backend_options` must be a `NPUTensorPipeRpcBackendOptions`. "
                        f"{rpc_backend_options}" + dist_error(ErrCode.TYPE))
    if world_size:  # a static group
        group = rpc.backend_registry._init_process_group(store, rank, world_size)
        _, devices = _tensorpipe_exchange_and_check_all_device_maps(
            name, _get_device_count_info(), rpc_backend_options.device_maps, rpc_backend_options.devices, group)
        if devices:
            _init_device_state(devices[0].type)
        agent = _start_agent(store, name, rank, world_size, rpc_backend_options, devices)
        # One round of RPC sets the channels up (shutdown would time out otherwise), then the
        # barrier keeps peers from leaving before rank 0 is done with it.
        api._all_gather(None, timeout=rpc_backend_options.rpc_timeout)
        group.barrier().wait()
        return agent
    from torch.distributed.rpc._utils import _group_membership_management

    with _group_membership_management(store, name, True):
        agent = _start_agent(store, name, rank, world_size, rpc_backend_options,
                             list(rpc_backend_options.devices))
        try:
            _set_devices_and_reverse_device_map(agent)
        except Exception:
            api.shutdown()
            raise
        return agent


def _rpc_backend_registry():
    """Registers the NPU_TENSORPIPE backend (once) and the npu tensor transport."""
    if not rpc.is_available():
        return
    _transport._install()
    if not rpc.backend_registry.backend_registered(_BACKEND):
        rpc.backend_registry.register_backend(_BACKEND, _npu_tensorpipe_construct_rpc_backend_options_handler,
                                              _npu_tensorpipe_init_backend_handler)
    rpc.BackendType = rpc.backend_registry.BackendType
