"""npu tensors through torch.multiprocessing: the receiving process maps the same device
memory (no copy), writes are seen both ways, the sender keeps sent memory alive until the
receivers let it go, and what cannot be shared fails with torch_npu's errors."""
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

import torch_npu  # noqa: F401

TIMEOUT = 120


def _child(inbox, outbox, done):
    import torch_npu  # noqa: F401  (spawned interpreters start fresh)

    try:
        x = inbox.get(timeout=TIMEOUT)  # [0, 1, ..., 11] as a view at offset 4 of a larger tensor
        outbox.put(("got", x.device.type, x.tolist(), x.storage_offset()))
        x.mul_(10)  # seen by the parent: the same memory
        torch.npu.synchronize()
        outbox.put(("wrote",))
        try:
            ForkingPickler.dumps(x)  # a received tensor cannot be sent on (a queue pickles in its feeder thread)
            outbox.put(("resend", "sent"))
        except RuntimeError as err:
            outbox.put(("resend", str(err)))
        p = inbox.get(timeout=TIMEOUT)  # a Parameter, sent after the parent dropped it
        outbox.put(("param", type(p).__name__, p.requires_grad, p.sum().item()))
        del x, p
        mine = torch.arange(5, dtype=torch.float32, device="npu") * 2
        outbox.put(mine)  # the child's own memory, read by the parent
        done.wait(TIMEOUT)
    except Exception as err:  # noqa: BLE001 — report everything to the test
        outbox.put(("error", repr(err)))


def _expect(outbox, tag):
    item = outbox.get(timeout=TIMEOUT)
    assert isinstance(item, tuple) and item[0] == tag, item
    return item[1:]


def test_npu_tensors_are_shared_between_processes():
    ctx = mp.get_context("spawn")
    inbox, outbox, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_child, args=(inbox, outbox, done))
    child.start()
    try:
        base = torch.arange(16, dtype=torch.float32, device="npu")
        x = base[4:]
        inbox.put(x)
        device, values, offset = _expect(outbox, "got")
        assert device == "npu" and values == list(range(4, 16)) and offset == 4
        _expect(outbox, "wrote")
        assert base.tolist() == list(range(4)) + [10.0 * v for v in range(4, 16)]
        (message,) = _expect(outbox, "resend")
        assert "received from another process" in message and "cloning before sending" in message

        p = torch.nn.Parameter(torch.full((3,), 2.0, device="npu"))
        before = torch.npu.memory_allocated()
        inbox.put(p)
        del p  # the sender keeps the sent storage alive for the receiver
        torch.npu.empty_cache()
        garbage = torch.full((1024,), -1.0, device="npu")  # would reuse a freed block
        assert _expect(outbox, "param") == ("Parameter", True, 6.0)

        mine = outbox.get(timeout=TIMEOUT)
        assert isinstance(mine, torch.Tensor) and mine.device.type == "npu", mine
        assert mine.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
        del mine
        # the child freed its copies of x and p: the next collection drops them here
        torch.npu.ipc_collect()
        del garbage
        assert torch.npu.memory_allocated() < before
    finally:
        done.set()
        child.join(TIMEOUT)
    assert child.exitcode == 0


def test_what_cannot_be_shared():
    t = torch.ones(4, device="npu", requires_grad=True) * 2  # not a leaf
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(t)
    with pytest.raises(RuntimeError, match="Cannot pickle NPU storage; try pickling a NPU tensor instead"):
        ForkingPickler(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(torch.ones(4, device="npu").untyped_storage())
    with pytest.raises(RuntimeError, match="_share_npu_: only available on NPU"):
        torch.ones(2).untyped_storage()._share_npu_()
    # cpu tensors keep torch's own sharing
    q = mp.get_context("spawn").SimpleQueue()
    q.put(torch.arange(3))
    assert q.get().tolist() == [0, 1, 2]


def test_empty_npu_tensor_round_trip():
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(torch.empty(0, device="npu"))
    back = pickle.loads(buf.getvalue())
    assert back.device.type == "npu" and back.numel() == 0


def test_release_counter_is_checked():
    with pytest.raises(Exception, match="reference counter must be a contiguous cpu int64 tensor"):
        torch_npu._C._npu_ipc_open(0, b"aclsim-ipc:1:0:3:0:2097152:0", 8, 0, torch.zeros(1), 0)


def test_unknown_process_handle_is_a_clear_error():
    with pytest.raises(RuntimeError, match="gone or its device memory is not reachable"):
        torch_npu._C._npu_ipc_open(0, b"aclsim-ipc:999999999:0:3:0:2097152:0", 8, 0,
                                   torch.ones(1, dtype=torch.int64), 0)


def test_pipe_within_one_process():
    """Sending to oneself maps the memory a second time: both tensors see the same bytes."""
    a, b = mp.get_context("spawn").Pipe()
    with pytest.raises(RuntimeError, match="Cowardly refusing"):
        a.send(torch.ones(2, device="npu", requires_grad=True) * 3)
    sent = torch.ones(2, device="npu")
    a.send(sent)
    got = b.recv()
    assert got.tolist() == [1.0, 1.0] and got.data_ptr() != sent.data_ptr()
    sent.add_(1)
    torch.npu.synchronize()
    assert got.tolist() == [2.0, 2.0]


def test_sharing_keeps_the_current_device():
    if torch.npu.device_count() < 2:
        pytest.skip("needs 2 npu devices")
    t = torch.ones(4, device="npu:1")
    before = torch.npu.current_device()
    back = pickle.loads(ForkingPickler.dumps(t))  # share, then import within this process
    assert torch.npu.current_device() == before
    assert back.device == t.device and back.tolist() == [1.0] * 4
