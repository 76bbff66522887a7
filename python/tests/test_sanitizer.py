"""torch_npu.npu._sanitizer: races between streams and with the host, missing record_stream."""
import gc

import pytest
import torch
import torch.cuda._sanitizer as csan

import torch_npu
import torch_npu.npu._sanitizer as sanitizer
from conftest import run_python


@pytest.fixture
def handler():
    sanitizer.npu_sanitizer.enable()
    yield sanitizer.npu_sanitizer.event_handler
    sanitizer.npu_sanitizer.disable()


def side_stream():
    return torch.npu.Stream()


def test_the_issue_race_is_caught_and_names_both_accesses(handler, capsys):
    # zero-filled on the default stream, updated on a side stream that never waited for it
    a = torch.zeros(1000, device="npu")
    s = side_stream()
    with pytest.raises(csan.CUDASanitizerErrors) as err:
        with torch.npu.stream(s):
            a.add_(1)
    (error,) = err.value.errors
    assert error.current_access.stream == s.npu_stream
    assert error.previous_access.stream == torch.npu.default_stream().npu_stream
    assert "aten::add_.Tensor" in error.current_access.operator
    assert "aten::zeros" in error.previous_access.operator
    text = str(error)
    assert "test_the_issue_race_is_caught" in text  # the stack traces
    assert "data race" in capsys.readouterr().err


def test_the_ordered_example_passes(handler):
    a = torch.zeros(1000, device="npu")
    s = side_stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        a.add_(1)
    torch.npu.current_stream().wait_stream(s)
    assert a.sum().item() == 1000


def test_ordering_by_event_and_by_synchronize(handler):
    a = torch.zeros(64, device="npu")
    s = side_stream()
    e = torch.npu.Event()
    e.record()
    s.wait_event(e)
    with torch.npu.stream(s):
        a.add_(1)
    torch.npu.synchronize()
    b = a * 2  # the default stream after a device synchronize
    assert b.sum().item() == 128


def test_a_read_of_an_overlapping_view_is_a_race(handler):
    # csan keys accesses by data pointer: x[0:50] and x[25:75] start at different
    # addresses, so it would not see this race.
    x = torch.zeros(100, device="npu")
    s1, s2 = side_stream(), side_stream()
    for s in (s1, s2):
        s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s1):
        x[0:50].add_(1)
    with pytest.raises(csan.CUDASanitizerErrors):
        with torch.npu.stream(s2):
            x[25:75].sum()


def test_disjoint_strided_views_do_not_race(handler):
    x = torch.zeros(64, 2, device="npu")
    s1, s2 = side_stream(), side_stream()
    for s in (s1, s2):
        s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s1):
        x[:, 0].add_(1)
    with torch.npu.stream(s2):
        x[:, 1].add_(2)  # no element in common with x[:, 0]
    for s in (s1, s2):
        torch.npu.current_stream().wait_stream(s)
    assert x.sum().item() == 64 * 3


def test_pinned_buffer_rewritten_before_its_non_blocking_copy_ran(handler):
    p = torch.ones(1 << 16).pin_memory()
    x = p.to("npu", non_blocking=True)
    with pytest.raises(csan.CUDASanitizerErrors) as err:
        p.fill_(2)  # the copy may not have read p yet
    assert err.value.errors[0].current_access.stream == -1  # the host
    del x


def test_pinned_buffer_rewritten_after_synchronize(handler):
    p = torch.ones(1 << 16).pin_memory()
    x = p.to("npu", non_blocking=True)
    torch.npu.current_stream().synchronize()
    p.fill_(2)
    assert x.sum().item() == 1 << 16


def test_blocking_copy_orders_the_host(handler):
    p = torch.ones(1024).pin_memory()
    x = torch.empty(1024, device="npu")
    x.copy_(p)  # blocking: returns after the copy
    p.fill_(3)
    assert x.sum().item() == 1024


def test_reading_a_non_blocking_device_to_host_copy_without_waiting(handler):
    x = torch.arange(4096, dtype=torch.float32, device="npu")
    host = torch.empty(4096).pin_memory()
    host.copy_(x, non_blocking=True)
    with pytest.raises(csan.CUDASanitizerErrors):
        host.sum()
    e = torch.npu.Event()
    host2 = torch.empty(4096).pin_memory()
    host2.copy_(x, non_blocking=True)
    e.record()
    e.synchronize()
    assert host2.sum().item() == x.sum().item()


def test_missing_record_stream_is_reported_at_free(handler):
    x = torch.randn(100, device="npu")
    s = side_stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        x.mul(2)
    del x
    gc.collect()
    (error,) = handler.record_stream_errors
    assert error.usage_stream == s.npu_stream
    assert "record_stream" in str(error)


def test_record_stream_or_a_wait_back_makes_it_safe(handler):
    s = side_stream()
    x, y = torch.randn(100, device="npu"), torch.randn(100, device="npu")
    s.wait_stream(torch.npu.current_stream())
    x.record_stream(s)
    with torch.npu.stream(s):
        x.mul(2)
        y.mul(2)
    torch.npu.current_stream().wait_stream(s)
    del x, y
    gc.collect()
    assert handler.record_stream_errors == []
    assert handler.flush_record_stream_warnings() == []


def test_erase_stream_undoes_record_stream(handler):
    s = side_stream()
    x = torch.randn(100, device="npu")
    s.wait_stream(torch.npu.current_stream())
    x.record_stream(s)
    with torch.npu.stream(s):
        x.mul(2)
    torch_npu.erase_stream(x, s)
    assert len(handler.flush_record_stream_warnings()) == 1


def test_disable_stops_checking():
    sanitizer.npu_sanitizer.enable()
    sanitizer.npu_sanitizer.disable()
    a = torch.zeros(10, device="npu")
    with torch.npu.stream(side_stream()):
        a.add_(1)  # a race, but nobody is looking
    torch.npu.synchronize()


RACE = """
import torch, torch_npu
import torch.cuda._sanitizer as csan
a = torch.zeros(1 << 20, device="npu")
s = torch.npu.Stream()
try:
    with torch.npu.stream(s):
        a.add_(1)
    print("missed")
except csan.CUDASanitizerErrors:
    print("caught")
"""


@pytest.mark.parametrize("task_queue", ["0", "1"])
def test_enabled_by_environment_in_both_modes(task_queue):
    # The verdict is the host's calls in order: the same without the task queue, where
    # every kernel has finished before the next call and no data could be corrupted.
    r = run_python(RACE, env={"TORCH_NPU_SANITIZER": "1", "TASK_QUEUE_ENABLE": task_queue})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "caught"
    r = run_python(RACE, env={"TASK_QUEUE_ENABLE": task_queue})
    assert r.stdout.strip() == "missed", r.stderr


def test_the_contrib_prefetcher_needs_no_record_stream_warning(handler):
    # Its batches are allocated on a side stream and used on the current one: found by
    # the sanitizer, the prefetcher now calls record_stream (else the next preload could
    # reuse a batch's memory while the current stream still reads it).
    from torch_npu.contrib.module.prefetcher import Prefetcher

    prefetcher = Prefetcher([torch.randn(64, 64) for _ in range(4)])
    total = 0.0
    batch = prefetcher.next()
    while batch is not None:
        total += (batch * 2).sum().item()
        batch = prefetcher.next()
    del prefetcher
    gc.collect()
    assert handler.record_stream_errors == []
