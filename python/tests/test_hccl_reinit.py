"""torch_npu.distributed.reinit_process_group: a group's hccl communicator aborted and built
again by its next collective (every rank reinitialises), and the resume form."""
import pytest
import torch
import torch.distributed as dist

from conftest import init_hccl_rank, spawn_ranks


def _all_reduce(rank, group=None):
    x = torch.full((1024,), float(rank + 1), device="npu")
    dist.all_reduce(x, group=group)
    return x.cpu()


def _ranks(rank, world, port):
    import torch_npu

    init_hccl_rank(rank, world, port)
    expected = float(sum(range(1, world + 1)))
    assert torch.equal(_all_reduce(rank), torch.full((1024,), expected))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("npu"))
    assert backend.get_hccl_comm_name(rank, init_comm=False) != ""

    group = torch_npu.distributed.reinit_process_group()
    assert group is dist.distributed_c10d._get_default_group()
    assert backend.get_hccl_comm_name(rank, init_comm=False) == ""  # aborted, not rebuilt yet
    for _ in range(3):  # the first builds the new communicator
        assert torch.equal(_all_reduce(rank), torch.full((1024,), expected))
    assert backend.get_hccl_comm_name(rank, init_comm=False) != ""

    assert torch_npu.distributed.reinit_process_group(rebuild_link=False) is None
    assert torch.equal(_all_reduce(rank), torch.full((1024,), expected))

    sub = dist.new_group([0, 1])
    assert torch.equal(_all_reduce(rank, sub), torch.full((1024,), 3.0))
    assert torch_npu.distributed.distributed_c10d.reinit_process_group(sub) is sub
    assert torch.equal(_all_reduce(rank, sub), torch.full((1024,), 3.0))
    assert torch.equal(_all_reduce(rank), torch.full((1024,), expected))  # the default group untouched

    with pytest.raises(ValueError, match="group must be a process group"):
        torch_npu.distributed.reinit_process_group(group="not a group")
    dist.barrier()
    dist.destroy_process_group()


def test_reinit_process_group_rebuilds_the_communicator():
    spawn_ranks(_ranks, 2)
