"""torch_npu.distributed.distributed_c10d: torch_npu's additions to torch.distributed's c10d."""
import logging

import torch
import torch.distributed as dist

__all__ = ["is_hccl_available", "reinit_process_group"]

_logger = logging.getLogger("torch_npu.distributed")


def is_hccl_available():
    """True when the ``hccl`` backend is registered with torch.distributed."""
    return dist.is_available() and "hccl" in dist.Backend.backend_list


def reinit_process_group(group=None, rebuild_link=True):
    """Recovery after a fault (torch_npu's): with ``rebuild_link`` the hccl communicator of
    ``group`` (default: the default group) is aborted — operations of the group in flight on
    any rank fail — and the group's next operation builds a new one, which every rank of the
    group joins after reinitialising too; the group (same object, ranks and name) is returned.
    Without ``rebuild_link`` the communicators of every hccl group of the current device are
    resumed after ``torch.npu.restart_device`` (the simulator's ``stop_device`` leaves them as
    they are) and None is returned."""
    from torch.distributed import distributed_c10d as c10d
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL

    device_id = torch.npu.current_device()
    _logger.info("reinit process group, group=%s, rebuild link=%s, device=%s", group, rebuild_link, device_id)
    npu = torch.device("npu")
    if not rebuild_link:
        for pg in c10d._pg_map:
            if npu in pg._device_types:
                backend = pg._get_backend(npu)
                if isinstance(backend, ProcessGroupHCCL):
                    backend.resume_hccl_comm(device_id)
        return None
    if group is None or group is dist.GroupMember.WORLD:
        group = c10d._get_default_group()
    if group not in c10d._pg_map:
        raise ValueError(f"reinit_process_group: group must be a process group of this process "
                         f"(or None for the default group), got {group!r}")
    backend = group._get_backend(npu) if npu in group._device_types else None
    if isinstance(backend, ProcessGroupHCCL):
        backend._delete_tcpstore_key()
        backend.abort_hccl_comm("reinit")
    return group
