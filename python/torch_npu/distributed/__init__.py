"""HCCL: the ``hccl`` c10d backend for npu tensors, registered by ``import torch_npu``.

``dist.init_process_group("hccl")`` then works as with torch_npu on Ascend; the backend
itself is C++ (distributed/, bound as ``torch_npu._C._distributed_c10d``).
"""
import torch.distributed as dist

__all__ = ["ProcessGroupHCCL"]

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
        return ProcessGroupHCCL(dist_backend_opts.store, dist_backend_opts.group_rank,
                                dist_backend_opts.group_size, options)

    if "HCCL" not in dist.Backend._plugins:
        dist.Backend.register_backend("hccl", _create_process_group_hccl, extended_api=True,
                                      devices=["npu"])
    dist.ProcessGroupHCCL = ProcessGroupHCCL
