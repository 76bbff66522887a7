"""torch.npu.Event(interprocess=True): ipc_handle / from_ipc_handle and pickling through
torch.multiprocessing give another process the same event: records in either process move
it, and queries, synchronisations and stream waits in either see them."""
import pytest
import torch
import torch.multiprocessing as mp

import torch_npu  # noqa: F401

TIMEOUT = 120


def test_handle_and_the_event_opened_from_it_in_one_process():
    e = torch.npu.Event(interprocess=True)
    assert e.query() and e.device is None and e.npu_event == 0  # created lazily
    h = e.ipc_handle()
    assert isinstance(h, bytes) and len(h) == 64
    assert e.device == torch.device("npu", 0) and e.npu_event != 0
    other = torch.npu.Event.from_ipc_handle(0, h)
    assert other.device == torch.device("npu", 0) and other.npu_event != e.npu_event
    # hold the stream with an external event: the record stays pending until it is set
    s = torch.npu.Stream()
    gate = torch.npu.ExternalEvent()
    gate.wait(s)
    e.record(s)
    assert not other.query() and not e.query()
    gate.record(torch.npu.Stream())
    other.synchronize()
    assert e.query() and other.query()
    # a record through the opened event moves the original
    other.record()
    e.synchronize()
    assert e.query()


def test_bad_uses_raise():
    with pytest.raises(RuntimeError, match="Parameter interprocess cannot be specified together with other"):
        torch.npu.Event(enable_timing=True, interprocess=True)
    with pytest.raises(RuntimeError, match="not created with interprocess=True"):
        torch.npu.Event().ipc_handle()
    with pytest.raises(RuntimeError, match="aclrtIpcEventHandle expects byte-like object of size 64, but got 3"):
        torch.npu.Event.from_ipc_handle(0, b"abc")
    with pytest.raises(RuntimeError, match="Event can only be created on PrivateUse1 devices"):
        torch.npu.Event.from_ipc_handle(torch.device("cpu"), bytes(64))
    with pytest.raises(RuntimeError, match="not an event handle"):
        torch.npu.Event.from_ipc_handle(0, bytes(64))
    e = torch.npu.Event(interprocess=True)
    h = e.ipc_handle()
    del e  # the handle dies with the creator's event
    with pytest.raises(RuntimeError, match="gone or destroyed it"):
        torch.npu.Event.from_ipc_handle(0, h)
    t1, t2 = torch.npu.Event(interprocess=True), torch.npu.Event(enable_timing=True)
    t1.record()
    t2.record()
    with pytest.raises(RuntimeError, match="interprocess events do not time"):
        t2.elapsed_time(t1)


def _child(handle, inbox, outbox):
    import torch_npu  # noqa: F401  (spawned interpreters start fresh)

    try:
        opened = torch.npu.Event.from_ipc_handle(torch.npu.current_device(), handle)
        pickled = inbox.get(timeout=TIMEOUT)  # the same kind of event, through the pickler
        outbox.put(("got", str(pickled.device)))
        assert inbox.get(timeout=TIMEOUT) == "recorded"  # the parent's record is pending
        outbox.put(("pending", pickled.query()))
        pickled.synchronize()  # returns once the parent released its stream
        outbox.put(("synced", pickled.query()))
        # the child records `opened` behind its own gate: pending in the parent until set
        s = torch.npu.Stream()
        gate = torch.npu.ExternalEvent()
        gate.wait(s)
        opened.record(s)
        outbox.put(("child recorded",))
        assert inbox.get(timeout=TIMEOUT) == "release"
        gate.record(torch.npu.Stream())
        torch.npu.synchronize()
        assert inbox.get(timeout=TIMEOUT) == "done"
    except Exception as err:  # noqa: BLE001 — report everything to the test
        outbox.put(("error", repr(err)))


def _expect(outbox, tag):
    item = outbox.get(timeout=TIMEOUT)
    assert isinstance(item, tuple) and item[0] == tag, item
    return item[1:]


def test_events_shared_with_another_process():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    exported = torch.npu.Event(interprocess=True)
    child = ctx.Process(target=_child, args=(exported.ipc_handle(), inbox, outbox))
    child.start()
    try:
        sent = torch.npu.Event(interprocess=True)
        sent.record()
        inbox.put(sent)
        assert _expect(outbox, "got") == ("npu:0",)
        s = torch.npu.Stream()
        gate = torch.npu.ExternalEvent()
        gate.wait(s)
        sent.record(s)  # pending until the gate is set
        inbox.put("recorded")
        assert _expect(outbox, "pending") == (False,)
        gate.record(torch.npu.Stream())
        assert _expect(outbox, "synced") == (True,)
        _expect(outbox, "child recorded")
        assert not exported.query()  # the child's record is pending
        inbox.put("release")
        exported.synchronize()
        assert exported.query()
        inbox.put("done")
        child.join(TIMEOUT)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
