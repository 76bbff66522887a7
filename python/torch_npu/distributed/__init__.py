"""HCCL: the ``hccl`` c10d backend for npu tensors, registered by ``import torch_npu``.

``dist.init_process_group("hccl")`` then works as with torch_npu on Ascend; the backend
itself is C++ (distributed/, bound as ``torch_npu._C._distributed_c10d``).
"""
import logging
import os

import torch
import torch.distributed as dist

__all__ = ["ProcessGroupHCCL"]

_logger = logging.getLogger("torch_npu.distributed")
# Intra-op threads as the process started with (torch.set_num_threads not yet called).
_STARTUP_THREADS = torch.get_num_threads()


def _share_cores_among_local_ranks(pg) -> None:
    """Gives each rank on this host its share of the cores, unless the user chose.

    A simulated device computes on the host's cores, so k ranks on one host each using
    every core oversubscribe it: OpenMP threads spin against each other and a DDP step
    can take 10x longer. torchrun sets OMP_NUM_THREADS=1 for the same reason; this covers
    mp.spawn and other launchers, and leaves any explicit choice alone.
    """
    if "OMP_NUM_THREADS" in os.environ or torch.get_num_threads() != _STARTUP_THREADS:
        return
    local = sum(pg._transport(peer) in ("self", "shm") for peer in range(pg.size()))
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // local)
    if local > 1 and threads < _STARTUP_THREADS:
        torch.set_num_threads(threads)
        _logger.info("hccl: %d ranks share this host's %d cores: intra-op threads set to %d per rank "
                     "(set OMP_NUM_THREADS or call torch.set_num_threads to choose)", local, cores, threads)

if dist.is_available():
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL

    def _create_process_group_hccl(dist_backend_opts, backend_options):
        """Creator for ``Backend.register_backend(..., extended_api=True)``."""
        options = backend_options
        if not isinstance(options, ProcessGroupHCCL.Options):
            options = ProcessGroupHCCL.Options()
        options._timeout = dist_backend_opts.timeout
        options.global_ranks_in_group = list(dist_backend_opts.global_ranks_in_group)
        options.group_id = dist_backend_opts.group_id
        options.group_name = dist_backend_opts.group_id
        pg = ProcessGroupHCCL(dist_backend_opts.store, dist_backend_opts.group_rank,
                              dist_backend_opts.group_size, options)
        _share_cores_among_local_ranks(pg)
        return pg

    if "HCCL" not in dist.Backend._plugins:
        dist.Backend.register_backend("hccl", _create_process_group_hccl, extended_api=True,
                                      devices=["npu"])
    dist.ProcessGroupHCCL = ProcessGroupHCCL
