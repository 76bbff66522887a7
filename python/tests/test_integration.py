"""PyTorch integration points of the npu device: serialization, pinned memory,
record_stream, other devices, generic torch.Stream/Event, storage resize."""
import io

import torch
import torch_npu  # noqa: F401


def test_save_and_load_with_map_location():
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0, device="npu")}, buf)
    buf.seek(0)
    assert torch.load(buf)["w"].device == torch.device("npu:0")
    buf.seek(0)
    w = torch.load(buf, map_location="npu:1")["w"]
    assert w.device == torch.device("npu:1") and w.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["w"].device == torch.device("cpu")


def test_pinned_memory_and_non_blocking_copies():
    host = torch.arange(1000.0).pin_memory()
    assert host.is_pinned()
    dev = host.to("npu", non_blocking=True)
    back = torch.empty(1000).pin_memory()
    back.copy_(dev, non_blocking=True)
    torch.npu.synchronize()
    assert torch.equal(back, host)
    assert not torch.ones(2).is_pinned()


def test_record_stream_keeps_memory_until_the_stream_is_done():
    side = torch.npu.Stream()
    x = torch.ones(64, 64, device="npu")
    x * 2                              # the first call of a dtype signature runs at once
    torch.npu.synchronize()
    with torch.npu.stream(side):
        torch.npu._sleep(540_000_000)  # ~0.3 s: keeps the side stream busy
        y = x * 2                      # small: queued behind the sleep
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    z = torch.empty(64, 64, device="npu")  # default stream: must not get x's block yet
    assert z.data_ptr() != ptr
    side.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((64, 64), 2.0))


def test_other_devices_and_device_context():
    with torch.npu.device(3):
        a = torch.ones(4, device="npu")
        assert a.device == torch.device("npu:3")
        assert torch.npu.current_device() == 3
    b = (a * 3).sum()
    assert b.device == torch.device("npu:3") and b.item() == 12.0
    assert torch.npu.current_device() == 0
    c = a.to("npu:5")
    assert c.device == torch.device("npu:5") and c.cpu().tolist() == [1.0] * 4


def test_generic_stream_and_event_apis():
    s = torch.Stream(device="npu:0")
    start = torch.Event(device="npu", enable_timing=True)
    end = torch.Event(device="npu", enable_timing=True)
    a = torch.randn(512, 512, device="npu")
    start.record(s)
    with torch.npu.stream(torch.npu.Stream(stream_id=s.stream_id, device_index=s.device_index,
                                           device_type=s.device_type)):
        a @ a
    end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    torch.accelerator.synchronize()
    assert torch.accelerator.current_stream().device.type == "npu"


def test_storage_resize_keeps_bytes():
    t = torch.arange(4.0, device="npu")
    s = t.untyped_storage()
    s.resize_(64)
    assert s.nbytes() == 64
    assert torch.tensor([], device="npu").set_(s)[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_snapshot_agrees_with_stats():
    keep = [torch.empty(n, device="npu") for n in (10, 300_000, 5_000_000)]
    torch.npu.synchronize()
    stats = torch.npu.memory_stats()
    segments = [s for s in torch.npu.memory_snapshot() if s["device"] == 0]
    assert sum(s["total_size"] for s in segments) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segments) == stats["allocated_bytes.all.current"]
    del keep
