"""HCCL: the ``hccl`` c10d backend for npu tensors, registered by ``import torch_npu``.

``dist.init_process_group("hccl")`` then works as with torch_npu on Ascend; the backend
itself is C++ (distributed/, bound as ``torch_npu._C._distributed_c10d``).
"""
import logging
import os

import torch
import torch.distributed as dist

__all__ = ["is_available", "is_hccl_available", "reduce_scatter_tensor_uneven", "all_gather_into_tensor_uneven",
           "reinit_process_group"]

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
        # A copy: changing the user's Options later must not reach this group (torch_npu's rule).
        options = ProcessGroupHCCL.Options()
        if isinstance(backend_options, ProcessGroupHCCL.Options):
            options.is_high_priority_stream = backend_options.is_high_priority_stream
            options.op_timeout = backend_options.op_timeout
            options.hccl_config = dict(backend_options.hccl_config)
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
    # The class is torch_npu._C._distributed_c10d.ProcessGroupHCCL (torch_npu sets no
    # torch.distributed.ProcessGroupHCCL; transfer_to_npu makes it ProcessGroupNCCL).


def is_available():
    """True when torch.distributed is built in and torch_npu's c10d (the ``hccl`` backend) is
    registered."""
    return dist.is_available() and "hccl" in dist.Backend.backend_list


from .distributed_c10d import is_hccl_available

if dist.is_available():
    from .distributed_c10d import reinit_process_group

    # torch_npu's names on torch.distributed too, as torch_npu puts them there.
    dist.is_hccl_available = is_hccl_available
    dist.reinit_process_group = reinit_process_group

    def _register_dtensor_support():
        """DTensor sharding of torch_npu's operators, once torch.distributed.tensor is imported."""
        try:
            import torch_npu.distributed.tensor._sharding  # noqa: F401
        except Exception as err:  # at the end of the user's import: a warning, not a failed import
            import warnings
            warnings.warn(f"torch_npu: DTensor sharding of npu operators not registered: {err!r}")

    from torch_npu.utils._post_import import when_imported

    when_imported("torch.distributed.tensor", _register_dtensor_support)

    # ReduceOp.PREMUL_SUM with a factor, as torch_npu exports it (torch's NCCL helper).
    from torch.distributed import _make_nccl_premul_sum as _make_hccl_premul_sum

    def _hccl_backend(group, name):
        from torch.distributed.distributed_c10d import _get_default_group, _rank_not_in_group
        if _rank_not_in_group(group):
            return None
        pg = group if group is not None and group is not dist.GroupMember.WORLD else _get_default_group()
        backend = pg._get_backend(torch.device("npu"))
        if not isinstance(backend, ProcessGroupHCCL):
            raise RuntimeError(f"torch_npu.distributed.{name} needs a group with the hccl backend, "
                               f"got {type(backend).__name__}")
        return backend

    def _finish(work, async_op):
        if async_op:
            return work
        work.wait()
        return None

    def reduce_scatter_tensor_uneven(output, input, input_split_sizes=None, op=dist.ReduceOp.SUM,
                                     group=None, async_op=False):
        """Reduce-scatter where rank r receives ``input_split_sizes[r]`` rows (dim 0) of the
        reduced ``input`` into ``output``; without split sizes the parts are equal."""
        backend = _hccl_backend(group, "reduce_scatter_tensor_uneven")
        if backend is None:
            return None
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = op
        work = backend.reduce_scatter_tensor_uneven(output, input, list(input_split_sizes or []), opts)
        return _finish(work, async_op)

    def all_gather_into_tensor_uneven(output, input, output_split_sizes=None, group=None, async_op=False):
        """All-gather where rank r contributes ``output_split_sizes[r]`` rows (dim 0) of ``output``;
        without split sizes the parts are equal."""
        backend = _hccl_backend(group, "all_gather_into_tensor_uneven")
        if backend is None:
            return None
        work = backend.all_gather_into_tensor_uneven(output, input, list(output_split_sizes or []))
        return _finish(work, async_op)
