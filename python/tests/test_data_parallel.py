"""nn.DataParallel across npu devices and torch.nn.parallel.comm (torch._C._scatter, _gather,
_broadcast & co. for npu tensors, python/torch_npu/_data_parallel.py), against one device."""
import pytest
import torch

import torch_npu  # noqa: F401


# ---- nn.DataParallel across npu devices (torch._C._scatter & co., as torch_npu defines) ------

def test_data_parallel_over_npus_matches_single_device():
    if torch.npu.device_count() < 3:
        pytest.skip("needs 3 npu devices")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(8, 3)
    ref = model(x)
    ref.pow(2).sum().backward()
    grad_ref = model[0].weight.grad.clone()
    model.zero_grad()

    model = model.npu()
    dp = torch.nn.DataParallel(model, device_ids=[0, 1, 2])
    out = dp(x.npu())
    assert out.device == torch.device("npu", 0)
    torch.testing.assert_close(out.cpu(), ref)
    out.pow(2).sum().backward()
    torch.testing.assert_close(model[0].weight.grad.cpu(), grad_ref)


def test_parallel_comm_primitives_on_npu():
    if torch.npu.device_count() < 3:
        pytest.skip("needs 3 npu devices")
    from torch.nn.parallel import comm

    t = torch.arange(20.0).view(10, 2)
    tn = t.npu()
    parts = comm.scatter(tn, [0, 2], chunk_sizes=[3, 7])
    assert [p.device.index for p in parts] == [0, 2] and [p.shape[0] for p in parts] == [3, 7]
    torch.testing.assert_close(parts[1].cpu(), t[3:])
    torch.testing.assert_close(comm.gather(parts, destination=1).cpu(), t)
    assert comm.gather(parts, destination=1).device == torch.device("npu", 1)
    assert comm.gather(parts, destination="cpu").device.type == "cpu"
    copies = comm.broadcast(tn, [0, 1, 2])
    assert copies[0] is tn and copies[2].device == torch.device("npu", 2)
    torch.testing.assert_close(copies[2].cpu(), t)
    coalesced = comm.broadcast_coalesced([tn, tn[0]], [0, 1])
    torch.testing.assert_close(coalesced[1][1].cpu(), t[0])
    out = [torch.empty(5, 2, device="npu:1"), torch.empty(5, 2, device="npu:2")]
    comm.scatter(tn, out=out)
    torch.testing.assert_close(out[1].cpu(), t[5:])
    dest = torch.empty(10, 2, device="npu:0")
    comm.gather(out, out=dest)
    torch.testing.assert_close(dest.cpu(), t)
    with pytest.raises(RuntimeError, match="do not sum"):
        comm.scatter(tn, [0, 1], chunk_sizes=[3, 3])
