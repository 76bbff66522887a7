"""torch.npu streams and events."""

import pytest
import torch

import torch_npu


def test_stream_basics():
    s = torch.npu.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.npu.Stream)
    assert s.device == torch.device("npu", 0)
    assert isinstance(s.npu_stream, int) and s.npu_stream != 0
    assert s != torch.npu.default_stream()
    assert s == s and hash(s) == hash(s)
    assert "torch_npu.npu.Stream device=npu:0" in repr(s)
    assert s.query()
    s.synchronize()
    s1 = torch.npu.Stream(device=1, priority=-1)
    assert s1.device == torch.device("npu", 1)
    assert torch.npu.Stream("npu:2").device.index == 2


def test_current_and_default_stream():
    assert torch.npu.current_stream() == torch.npu.default_stream()
    assert torch.npu.default_stream(3).device.index == 3
    assert torch.npu.current_stream(torch.device("npu:3")) == torch.npu.default_stream(3)
    s = torch.npu.Stream()
    torch.npu.set_stream(s)
    assert torch.npu.current_stream() == s
    torch.npu.set_stream(torch.npu.default_stream())
    assert torch.npu.current_stream() == torch.npu.default_stream()
    torch.npu.set_stream(None)  # no-op


def test_stream_context_manager():
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
        with torch.npu.stream(None):
            assert torch.npu.current_stream() == s
    assert torch.npu.current_stream() == torch.npu.default_stream()
    with torch.npu.StreamContext(s) as ctx:
        assert ctx.stream is s and torch.npu.current_stream() == s
    assert torch.npu.current_stream() == torch.npu.default_stream()


def test_stream_context_on_other_device_switches_device_and_restores_it():
    s2 = torch.npu.Stream(device=2)
    with torch.npu.stream(s2):
        assert torch.npu.current_device() == 2  # as torch_npu's and CUDA's set_stream
        assert torch.npu.current_stream(2) == s2
    assert torch.npu.current_device() == 0
    assert torch.npu.current_stream(2) == torch.npu.default_stream(2)


def test_native_torch_stream_interop():
    native = torch.Stream(device="npu:0")
    torch.npu.set_stream(native)
    assert torch.npu.current_stream().stream_id == native.stream_id
    torch.npu.set_stream(torch.npu.default_stream())
    assert torch.npu.Stream(stream_id=native.stream_id, device_index=native.device_index,
                            device_type=native.device_type) == native


def test_stream_argument_errors():
    with pytest.raises(TypeError, match="argument 'stream'"):
        torch.npu.set_stream("stream")
    with pytest.raises(ValueError, match="npu device"):
        torch.npu.set_stream(torch.Stream(device="cpu"))
    with pytest.raises(TypeError, match="priority"):
        torch.npu.Stream(priority="high")
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.Stream(device=99)
    # a negative index or a float: the current device, as torch_npu's (Huawei's test_with_device)
    torch.npu.set_device(1)
    try:
        assert [torch.npu.Stream(d).device_index for d in (-258, -1, -0.2, -7.88)] == [1, 1, 1, 1]
        assert torch.npu.current_device() == 1
    finally:
        torch.npu.set_device(0)
    with pytest.raises(TypeError, match="device_index"):
        torch.npu.Stream(stream_id=1)


def test_work_on_side_stream_is_ordered():
    side = torch.npu.Stream()
    x = torch.randn(512, 512, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        y = x @ x
        z = y * 2
    torch.npu.current_stream().wait_stream(side)
    w = z + 1
    torch.npu.synchronize()
    expected = (x.cpu() @ x.cpu()) * 2 + 1
    torch.testing.assert_close(w.cpu(), expected, rtol=1e-4, atol=1e-3)
    assert side.query()


def test_event_record_wait_query():
    e = torch.npu.Event()
    assert "uninitialized" in repr(e) or isinstance(e.npu_event, int)
    s = torch.npu.Stream()
    x = torch.randn(256, 256, device="npu")
    with torch.npu.stream(s):
        y = x @ x
        e.record()
    e.wait()  # current (default) stream waits for s
    z = y + 0
    e.synchronize()
    assert e.query()
    assert e.npu_event != 0
    assert "torch_npu.npu.Event 0x" in repr(e)
    torch.npu.synchronize()
    torch.testing.assert_close(z.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-3)


def test_stream_record_event_and_wait_event():
    s = torch.npu.Stream()
    e = s.record_event()
    assert isinstance(e, torch.npu.Event)
    torch.npu.current_stream().wait_event(e)
    e2 = torch.npu.Event()
    assert s.record_event(e2) is e2
    e2.synchronize()
    assert e2.query()


def _timed_matmuls(start, end):
    a = torch.randn(512, 512, device="npu")
    start.record()
    for _ in range(4):
        a = (a @ a).clamp_(-1, 1)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_event_elapsed_time_to_native_event():
    start = torch.npu.Event(enable_timing=True)
    end = torch.Event("npu", enable_timing=True)
    elapsed = _timed_matmuls(start, end)
    assert isinstance(elapsed, float) and elapsed > 0


def test_event_elapsed_time_around_matmul():
    a = torch.randn(512, 512, device="npu")
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        a = (a @ a).clamp_(-1, 1)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float)
    assert elapsed > 0
    with pytest.raises(TypeError, match="end_event"):
        start.elapsed_time(1.0)


@pytest.mark.parametrize("end_type", ["npu", "native"])
def test_elapsed_time_waits_for_both_events(end_type):
    """As torch_npu's NPUEvent::elapsed_time: no synchronize needed before timing (it failed
    with 107009 "end event has not completed yet" while the timed work was queued)."""
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True) if end_type == "npu" else torch.Event("npu", enable_timing=True)
    a = torch.randn(768, 768, device="npu")
    start.record()
    for _ in range(6):
        a = (a @ a).clamp_(-1, 1)
    end.record()
    assert start.elapsed_time(end) > 0
    assert end.query()
    # (PyTorch's generic Event raises ValueError here, torch_npu's RuntimeError)
    with pytest.raises((RuntimeError, ValueError), match="Both events must be recorded"):
        torch.npu.Event(enable_timing=True).elapsed_time(end)


@pytest.mark.parametrize("end_type", ["npu", "native"])
def test_events_of_two_devices_are_not_timed(end_type):
    """Each device has its own clock (Huawei's test_events_multi_gpu_elapsed_time): two events
    recorded on npu:0 and npu:1 raise, from either current device; two of npu:0 time from npu:1."""
    make = (lambda: torch.npu.Event(enable_timing=True)) if end_type == "npu" else \
        (lambda: torch.Event("npu", enable_timing=True))
    start, other, end = make(), make(), make()
    with torch.npu.device(0):
        start.record()
    with torch.npu.device(1):
        other.record()
    start.synchronize()
    other.synchronize()  # (PyTorch's generic Event requires both done)
    for current in (0, 1):
        with torch.npu.device(current), pytest.raises(RuntimeError, match="device 0 and the end event on device 1"):
            start.elapsed_time(other)
    with torch.npu.device(0):
        end.record()
    end.synchronize()
    with torch.npu.device(1):
        assert start.elapsed_time(end) >= 0


def test_event_record_on_explicit_stream_and_device():
    s = torch.npu.Stream(device=1)
    e = torch.npu.Event(enable_timing=True)
    with torch.npu.device(1):
        torch.ones(4, device="npu")
    e.record(s)
    e.synchronize()
    assert e.device == torch.device("npu", 1)
    with pytest.raises(TypeError, match="argument 'stream'"):
        e.record("s")


def test_torch_event_native():
    e = torch.Event("npu", enable_timing=True)
    e.record(torch.npu.current_stream())
    e.synchronize()
    assert e.query()


def test_sleep_keeps_the_current_stream_busy():
    """torch.npu._sleep(cycles), as torch.cuda._sleep: queued, 1.8e6 cycles a millisecond."""
    s = torch.npu.Stream()
    other = torch.npu.Stream()
    with torch.npu.stream(s):
        start = torch.npu.Event(enable_timing=True)
        end = torch.npu.Event(enable_timing=True)
        start.record()
        torch.npu._sleep(int(50 * 1.8e6))  # 50 ms
        end.record()
    assert not s.query() and not end.query()
    with torch.npu.stream(other):  # another stream is not held up
        y = torch.ones(10, device="npu") + 1
        done = torch.npu.Event()
        done.record()
    done.synchronize()
    assert not end.query()
    assert torch.equal(y.cpu(), torch.full((10,), 2.0))
    end.synchronize()
    assert start.elapsed_time(end) >= 45
    with pytest.raises(RuntimeError, match="'cycles' must be a non-negative"):
        torch.npu._sleep(-1)
    with pytest.raises(TypeError, match="expected 'int'"):
        torch.npu._sleep(1.5)


def test_event_recorded_time():
    """torch_npu's Event.recorded_time(): µs when the record completed; waits for it."""
    e1 = torch.npu.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="must be recorded"):
        e1.recorded_time()
    e1.record()
    torch.npu._sleep(int(5 * 1.8e6))  # 5 ms
    e2 = torch.npu.Event()
    e2.record()
    t1, t2 = e1.recorded_time(), e2.recorded_time()
    assert isinstance(t1, int) and t1 > 0
    assert t2 - t1 >= 4000  # the sleep lies between the two records
    assert e2.query()


def test_stream_ids_follow_torch_npus_layout():
    """type << 5 | index: 3 for the normal-priority pool, 4 for the high-priority one."""
    assert torch.npu.default_stream().stream_id == 0
    assert torch.npu.Stream().stream_id >> 5 == 3
    assert torch.npu.Stream(priority=-1).stream_id >> 5 == 4
    assert torch.npu.Stream(priority=-1).priority == -1 and torch.npu.Stream().priority == 0
    with pytest.raises(RuntimeError, match="invalid npu stream id"):
        torch.npu.Stream(stream_id=99999, device_index=0, device_type=20).npu_stream


def test_external_stream():
    """An aclrtStream created outside torch_npu, as torch_npu's ExternalStream."""
    import ctypes
    rt = torch.npu.npurt()
    handle = ctypes.c_void_p(0)
    assert int(rt.npuStreamCreate(ctypes.addressof(handle))) == 0
    try:
        ext = torch.npu.ExternalStream(handle.value)
        assert ext.npu_stream == handle.value and ext == torch.npu.ExternalStream(handle.value)
        x = torch.randn(1000, device="npu")
        ext.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(ext):
            assert torch.npu.current_stream().npu_stream == handle.value
            y = x * 2 + 1
            done = torch.npu.Event()
            done.record()
        done.synchronize()
        assert torch.equal(y.cpu(), x.cpu() * 2 + 1)
        # the program that made it tracks it, as in torch_npu
        with pytest.raises(RuntimeError, match="Cannot query external NPU stream"):
            ext.query()
        with pytest.raises(RuntimeError, match="NPUStream::synchronize"):
            ext.synchronize()
    finally:
        assert int(rt.npuStreamDestroy(handle.value)) == 0
    with pytest.raises(RuntimeError, match="not a live aclrtStream"):
        torch.npu.ExternalStream(12345)


def test_launch_host_func_runs_in_stream_order_and_on_replays():
    """torch_npu's _launch_host_func: a Python call the stream reaches in order (the stream
    waits for it), recorded into graphs; _launch_host_func_pending does not hold the stream."""
    import threading
    s = torch.npu.Stream()
    seen = []
    x, y = torch.zeros(4, device="npu"), torch.zeros(4, device="npu")

    def after_fill(d):
        seen.append(d)
        y.copy_(x)  # npu work may be queued from it (blocking reads may not: it runs on the stream)
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        torch.npu._sleep(int(20 * 1.8e6))
        x.fill_(3.0)
        torch.npu._launch_host_func(s, after_fill, "after fill")
    assert seen == []  # queued behind the sleep
    s.synchronize()
    assert seen == ["after fill"] and torch.equal(y.cpu(), torch.full((4,), 3.0))
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.npu._launch_host_func(torch.npu.current_stream(), seen.append, "replay")
    assert "replay" not in seen  # nothing runs during the capture
    g.replay()
    g.replay()
    torch.npu.synchronize()
    assert seen.count("replay") == 2
    done = threading.Event()
    torch.npu._launch_host_func_pending(torch.npu.current_stream(), lambda ev: ev.set(), done)
    torch.npu.synchronize()
    assert done.wait(10)

    def boom(_):
        raise ValueError("boom")
    torch.npu._launch_host_func(torch.npu.current_stream(), boom, None)
    with pytest.raises(RuntimeError, match="host function raised: ValueError: boom"):
        torch.npu.synchronize()
    with pytest.raises(TypeError, match="'op_stream' must be a torch.npu.Stream"):
        torch.npu._launch_host_func(None, print, None)
    with pytest.raises(RuntimeError, match="'fn' must be callable"):
        torch.npu._launch_host_func(s, 3, None)


def test_sync_launch_stream_runs_kernels_at_the_call():
    """torch_npu's SyncLaunchStream: no task queue for its kernels (ids 64..67)."""
    s = torch.npu.SyncLaunchStream()
    assert s.stream_id >> 5 == 2 and isinstance(s, torch.npu.Stream)
    assert torch.npu.Stream(is_sync_launch=True).stream_id >> 5 == 2
    x = torch.randn(100000, device="npu")
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        y = x * 2
        assert s.query()  # it ran at the call
        torch.npu._sleep(int(10 * 1.8e6))  # queued work on it ...
        z = y + 1  # ... comes first
        assert s.query()
    assert torch.equal(z.cpu(), x.cpu() * 2 + 1)
    with pytest.raises(RuntimeError, match="invalid npu stream id"):
        torch.npu.Stream(stream_id=s.stream_id + 4, device_index=0, device_type=s.device_type).npu_stream


def test_event_device_is_none_until_recorded():
    e = torch.npu.Event()
    assert e.device is None  # torch_npu's and CUDA's: no device before the first record
    with torch.npu.device(1 if torch.npu.device_count() > 1 else 0):
        s = torch.npu.Stream()
        s.record_event(e)
        assert e.device == s.device


def test_rng_state_offset_of_the_default_generator():
    torch.npu.manual_seed(0)
    torch.npu._set_rng_state_offset(64)
    assert torch.npu._get_rng_state_offset() == 64
    assert torch.npu._get_rng_state_offset("npu:0") == torch.npu.default_generators[0].get_offset() == 64
    a = torch.rand(8, device="npu")
    torch.npu.manual_seed(0)
    torch.npu._set_rng_state_offset(64)
    assert torch.equal(torch.rand(8, device="npu"), a)


def test_a_completed_event_implies_its_stream_passed_it():
    """Huawei's test_events_wait, flaky under load: s1 waits on e0 recorded last on s0; after
    s1.synchronize(), s0.query() was sometimes False (the event completed before its record task
    was counted done). Stream queries now see the record task through."""
    s0, s1 = torch.npu.Stream(), torch.npu.Stream()
    for _ in range(300):
        e0 = torch.npu.Event()
        with torch.npu.stream(s0):
            torch.npu._sleep(1000)
            s0.record_event(e0)
        s1.wait_event(e0)
        s1.synchronize()
        assert e0.query() and s0.query() and s1.query()
