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
    with pytest.raises(RuntimeError, match="split_sizes to sum exactly to 10"):
        comm.scatter(tn, [0, 1], chunk_sizes=[3, 3])


def test_comm_checks_and_messages_as_torch():
    """torch.npu.comm (torch.cuda.comm's functions): the checks and texts of torch's comm.cpp with
    NPU for CUDA, negative dims, views for chunks already on their device, memory formats kept."""
    if torch.npu.device_count() < 2:
        pytest.skip("needs 2 npu devices")
    comm = torch.npu.comm
    x = torch.randn(4, 4)
    parts = comm.scatter(x.npu(), (0, 1), dim=-2)
    assert [p.shape for p in parts] == [(2, 4), (2, 4)]
    assert parts[0].data_ptr() == parts[0]._base.data_ptr()  # a view of the source on npu:0
    torch.testing.assert_close(comm.gather(parts, dim=-2).cpu(), x)
    out = [torch.empty(2, 4, device="npu:0"), torch.empty(2, 4, device="npu:1")]
    cases = [
        (lambda: comm.scatter(x, (), dim=0), "Expected at least one device to scatter to"),
        (lambda: comm.scatter(x, dim=0, out=[]), "Expected at least one output tensor to scatter to"),
        (lambda: comm.scatter(x, (0, 0, 0), dim=0, chunk_sizes=(2, 2)),
         r"Expected devices and chunk_sizes to be of same length, but got len\(devices\) = 3"),
        (lambda: comm.scatter(x, dim=0, out=[out[0].cpu(), out[1]]),
         "Expected all output tensors to be NPU tensors, but output tensor at index 0"),
        (lambda: comm.scatter(x, dim=0, out=[out[0].unsqueeze(0), out[1]]),
         "Output tensor at index 0 has incorrect shape"),
        (lambda: comm.scatter(x, dim=0, out=[out[0][1:], out[1]]),
         "Total size for output tensors along scatter dim 0 does not match"),
        (lambda: comm.broadcast(x, out=[x.npu(0), x]),
         "Expected all output tensors to be NPU tensors, but output tensor at index 1"),
        (lambda: comm.broadcast(x, out=[x.npu(0), x.npu(1).unsqueeze(0)]),
         "Expected all output tensors to have same shape as the source .+ at index 1"),
        (lambda: comm.gather(()), "Expected at least one tensor to gather from"),
        (lambda: comm.gather((parts[0].cpu(), parts[1])), "Expected all input tensors to be NPU tensors, "),
        (lambda: comm.gather((parts[0], parts[1].unsqueeze(0))),
         "Expected all input tensors to have the same number of dimensions"),
        (lambda: comm.gather((parts[0], parts[1][:, 1:])), "Input tensor at index 1 has invalid shape"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    nhwc = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    chunks = comm.scatter(nhwc, (0, 1), None, 0)
    assert all(c.is_contiguous(memory_format=torch.channels_last) and not c.is_contiguous() for c in chunks)
    assert comm.gather(chunks).is_contiguous(memory_format=torch.channels_last)
