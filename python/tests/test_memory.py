"""torch.npu memory API over the caching allocator."""

import collections
import gc
import json
import textwrap
import warnings

import pytest
import torch

from conftest import run_python

MiB = 1024 ** 2
GiB = 1024 ** 3


def _settle():
    torch.npu.synchronize()
    gc.collect()


def test_memory_allocated_tracks_a_tensor():
    _settle()
    before = torch.npu.memory_allocated()
    t = torch.empty(1024 * 1024, dtype=torch.float32, device="npu")  # 4 MiB
    # torch_npu's sizes: the request plus 32 bytes, rounded up to 512 bytes
    assert torch.npu.memory_allocated() - before == 4 * MiB + 512
    assert torch.npu.memory_allocated(0) == torch.npu.memory_allocated("npu:0")
    assert torch.npu.max_memory_allocated() >= before + 4 * MiB
    assert torch.npu.memory_reserved() >= torch.npu.memory_allocated()
    del t
    _settle()
    assert torch.npu.memory_allocated() == before


def test_stats_are_per_device():
    _settle()
    before0, before1 = torch.npu.memory_allocated(0), torch.npu.memory_allocated(1)
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="npu:1")
    assert torch.npu.memory_allocated(1) - before1 == 2 * MiB + 512
    assert torch.npu.memory_allocated(0) == before0
    del t


def test_statistics_of_a_missing_device_name_it():
    # torch_npu's caching allocator words ("Invalid device argument"), plus the argument and
    # the valid range.
    bad = f"npu:{torch.npu.device_count()}"
    for fn in (torch.npu.memory_allocated, torch.npu.max_memory_allocated,
               torch.npu.memory_reserved, torch.npu.max_memory_reserved, torch.npu.memory_stats,
               torch.npu.reset_peak_memory_stats, torch.npu.reset_accumulated_memory_stats,
               torch.npu.memory_summary):
        with pytest.raises(AssertionError, match=r"Invalid device argument: .*argument 'device' "
                                                 r"is \d+, .* must be in \[0, \d+\]"):
            fn(bad)
    with pytest.warns(FutureWarning), pytest.raises(AssertionError, match="Invalid device argument"):
        torch.npu.reset_max_memory_allocated(bad)


def test_peak_and_reset():
    _settle()
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="npu")
    del t
    _settle()
    assert torch.npu.max_memory_allocated() >= torch.npu.memory_allocated() + 8 * MiB
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == torch.npu.memory_allocated()
    assert torch.npu.max_memory_reserved() == torch.npu.memory_reserved()
    with pytest.warns(FutureWarning):
        torch.npu.reset_max_memory_allocated()
    with pytest.warns(FutureWarning):
        torch.npu.reset_max_memory_cached()


def test_empty_cache_releases_reserved_memory():
    _settle()
    t = torch.empty(64 * MiB, dtype=torch.uint8, device="npu")
    reserved_with = torch.npu.memory_reserved()
    del t
    _settle()
    assert torch.npu.memory_reserved() == reserved_with  # cached, not freed
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() <= reserved_with - 64 * MiB
    assert torch.npu.memory_reserved() >= torch.npu.memory_allocated()


def test_deprecated_cached_names():
    with pytest.warns(FutureWarning, match="memory_reserved"):
        assert torch.npu.memory_cached() == torch.npu.memory_reserved()
    with pytest.warns(FutureWarning, match="max_memory_reserved"):
        assert torch.npu.max_memory_cached() == torch.npu.max_memory_reserved()


def test_memory_stats_shape():
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="npu")
    stats = torch.npu.memory_stats()
    assert isinstance(stats, collections.OrderedDict)
    assert list(stats) == sorted(stats)
    for key in ("allocated_bytes.all.current", "allocated_bytes.large_pool.peak",
                "reserved_bytes.all.current", "active_bytes.small_pool.freed",
                "segment.all.current", "num_ooms", "num_alloc_retries"):
        assert key in stats, key
    nested = torch.npu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    assert stats["allocated_bytes.all.current"] >= 3 * MiB
    del t


def test_reset_accumulated_memory_stats():
    _settle()
    torch.npu.reset_accumulated_memory_stats()
    stats = torch.npu.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0
    assert stats["allocated_bytes.all.freed"] == 0
    t = torch.empty(MiB, dtype=torch.uint8, device="npu")
    del t
    _settle()
    stats = torch.npu.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == MiB + 512
    assert stats["allocated_bytes.all.freed"] == MiB + 512


def test_memory_summary_layout():
    t = torch.empty(5 * MiB, dtype=torch.uint8, device="npu")
    text = torch.npu.memory_summary()
    lines = text.rstrip("\n").split("\n")
    assert "| " + " " * 16 + " PyTorch NPU memory summary, device ID 0 " in lines[1]
    assert "NPU OOMs: 0" in text and "npuMalloc retries: 0" in text
    assert "NPU reserved memory" in text and "from large pool" in text
    assert all(len(line) == 77 and line[0] == "|" and line[-1] == "|" for line in lines)
    row = next(line for line in lines if line.startswith("| Allocated memory"))
    assert "MB" in row or "KB" in row
    short = torch.npu.memory_summary(device=1, abbreviated=True)
    assert "device ID 1" in short and "from large pool" not in short
    assert len(short) < len(text)
    del t


def test_memory_snapshot_lists_the_tensor_block():
    t = torch.empty(6 * MiB, dtype=torch.uint8, device="npu")
    snapshot = torch.npu.memory_snapshot()
    assert isinstance(snapshot, list) and snapshot
    blocks = [(seg, b) for seg in snapshot if seg["device"] == 0 for b in seg["blocks"]]
    assert any(b["state"] == "active_allocated" and b["size"] >= 6 * MiB
               and seg["segment_type"] == "large" for seg, b in blocks)
    for seg in snapshot:
        assert seg["total_size"] >= seg["allocated_size"]
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    del t


def test_mem_get_info_reflects_reservations():
    _settle()
    torch.npu.empty_cache()
    free_before, total = torch.npu.mem_get_info()
    t = torch.empty(256 * MiB, dtype=torch.uint8, device="npu")
    free_after, _ = torch.npu.mem_get_info()
    assert total == 64 * GiB
    assert free_before - free_after >= 256 * MiB
    del t
    _settle()
    torch.npu.empty_cache()


def test_memory_fraction_validation_and_limit():
    with pytest.raises(ValueError, match="'fraction'"):
        torch.npu.set_per_process_memory_fraction(1.5)
    with pytest.raises(ValueError, match="'fraction'"):
        torch.npu.set_per_process_memory_fraction(-0.1)
    with pytest.raises(TypeError, match="'fraction'"):
        torch.npu.set_per_process_memory_fraction("half")
    # torch_npu's error code suffix (an int is not a float either).
    with pytest.raises(TypeError, match="(?s)must be a float, got int.*ERR00002 PTA invalid type"):
        torch.npu.set_per_process_memory_fraction(1)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.set_per_process_memory_fraction(0.5, device=99)
    device = 2
    torch.npu.set_per_process_memory_fraction(0.25, device)
    try:
        assert torch.npu.get_per_process_memory_fraction(device) == 0.25
        ooms = torch.npu.memory_stats(device)["num_ooms"]
        with pytest.raises(torch.npu.OutOfMemoryError):
            torch.empty(20 * GiB, dtype=torch.uint8, device=f"npu:{device}")
        assert torch.npu.memory_stats(device)["num_ooms"] == ooms + 1
        ok = torch.empty(1 * GiB, dtype=torch.uint8, device=f"npu:{device}")
        del ok
    finally:
        torch.npu.set_per_process_memory_fraction(1.0, device)
        torch.npu.empty_cache()
    assert torch.npu.OutOfMemoryError is torch.OutOfMemoryError


def test_caching_allocator_alloc_and_delete():
    _settle()
    before = torch.npu.memory_allocated()
    ptr = torch.npu.caching_allocator_alloc(MiB)
    assert isinstance(ptr, int) and ptr != 0
    assert torch.npu.memory_allocated() - before == MiB + 512
    torch.npu.caching_allocator_delete(ptr)
    assert torch.npu.memory_allocated() == before
    s = torch.npu.Stream(device=1)
    before1 = torch.npu.memory_allocated(1)
    ptr = torch.npu.caching_allocator_alloc(2 * MiB, device=1, stream=s)
    assert torch.npu.memory_allocated(1) - before1 == 2 * MiB + 512
    torch.npu.caching_allocator_delete(ptr)
    with pytest.raises(TypeError, match="'size'"):
        torch.npu.caching_allocator_alloc(1.5)
    with pytest.raises(TypeError, match="'stream'"):
        torch.npu.caching_allocator_alloc(16, stream="s")


def test_empty_cache_is_safe_anytime():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.npu.empty_cache()
        torch.npu.empty_cache()


# On a 256 MiB device, 12 x 20 MiB blocks fill 240 MiB; freeing every other one leaves
# 136 MiB free, but in pieces of 20 MiB (16 MiB at the end): fixed segments cannot hold
# 100 MiB, expandable segments unmap the free pieces (one 20 MiB page each) and map the
# memory where needed. Requests are 32 bytes short of the block (torch_npu's padding).
_FRAGMENTATION = textwrap.dedent("""
    import json, torch, torch_npu
    MiB = 1024 ** 2
    keep = [torch.empty(20 * MiB - 32, dtype=torch.uint8, device="npu") for _ in range(12)]
    del keep[::2]
    try:
        big = torch.empty(100 * MiB - 32, dtype=torch.uint8, device="npu")
        big.fill_(7)
        ok = int(big[-1].item()) == 7 and int(keep[-1].fill_(3)[0].item()) == 3
    except torch.OutOfMemoryError:
        ok = False
    torch.npu.synchronize()
    report = {"ok": ok, "reserved": torch.npu.memory_reserved(),
              "allocated": torch.npu.memory_allocated(),
              "free": torch.npu.mem_get_info()[0],
              "segments": [s for s in torch.npu.memory_snapshot() if s["device"] == 0],
              "stats": dict(torch.npu.memory_stats())}
    if ok:
        del big
        torch.npu.empty_cache()
        report["reserved_after_empty_cache"] = torch.npu.memory_reserved()
    print("REPORT", json.dumps(report))
""")


def _fragmentation(conf):
    result = run_python(_FRAGMENTATION, env={"ASCEND_SIM_HBM_BYTES": "256M",
                                             "ASCEND_SIM_DEVICE_COUNT": "1",
                                             "PYTORCH_NPU_ALLOC_CONF": conf})
    assert result.returncode == 0, result.stderr
    assert "expandable" not in result.stderr  # accepted silently: it is implemented
    line = next(l for l in result.stdout.splitlines() if l.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def test_fixed_segments_fragment():
    report = _fragmentation("expandable_segments:False")
    assert not report["ok"]
    assert report["stats"]["num_ooms"] == 1
    assert not any(s["is_expandable"] for s in report["segments"])


def test_expandable_segments_avoid_fragmentation():
    report = _fragmentation("expandable_segments:True")
    assert report["ok"]
    assert report["stats"]["num_ooms"] == 0
    assert report["stats"]["num_alloc_retries"] == 1  # the free pieces were unmapped
    # Reserved memory is the mapped memory: the 6 kept tensors and the big one.
    assert report["allocated"] == report["reserved"] == 220 * MiB
    assert report["free"] == 256 * MiB - report["reserved"]
    segments = report["segments"]
    assert segments and all(s["is_expandable"] for s in segments)
    assert sum(s["total_size"] for s in segments) == report["reserved"]
    assert len(segments) == report["stats"]["segment.all.current"]
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    assert report["reserved_after_empty_cache"] == 120 * MiB


_VIRT_ADDR_CACHE = textwrap.dedent("""
    import json, torch, torch_npu
    MiB = 1024 ** 2
    r = {}
    x = torch.empty(100 * MiB, dtype=torch.uint8, device="npu")
    del x
    r["reserved_cached"] = torch.npu.memory_reserved()
    free_cached = torch.npu.mem_get_info()[0]
    torch_npu.npu.empty_virt_addr_cache()
    # unmapped (not reserved any more), but the physical pages are kept: device memory
    # stays used
    r["reserved_after"] = torch.npu.memory_reserved()
    r["max_reserved"] = torch.npu.max_memory_reserved()
    r["device_free_unchanged"] = torch.npu.mem_get_info()[0] == free_cached
    y = torch.empty(100 * MiB, dtype=torch.uint8, device="npu").fill_(5)
    r["realloc_ok"] = int(y[-1].item()) == 5 and torch.npu.memory_allocated() >= 100 * MiB
    r["device_free_reused"] = torch.npu.mem_get_info()[0] == free_cached  # the kept pages
    del y
    torch_npu.npu.empty_virt_addr_cache()
    torch.npu.empty_cache()  # frees the kept pages
    r["reserved_end"] = torch.npu.memory_reserved()
    r["device_free_end"] = torch.npu.mem_get_info()[0]
    r["capacity"] = torch.npu.mem_get_info()[1]
    print("REPORT", json.dumps(r))
""")


def test_empty_virt_addr_cache_keeps_physical_pages():
    result = run_python(_VIRT_ADDR_CACHE, env={"ASCEND_SIM_HBM_BYTES": "256M", "ASCEND_SIM_DEVICE_COUNT": "1",
                                               "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})
    assert result.returncode == 0, result.stderr
    r = json.loads(next(l for l in result.stdout.splitlines() if l.startswith("REPORT "))[len("REPORT "):])
    assert r["reserved_cached"] >= 100 * MiB
    assert r["reserved_after"] == 0 and r["max_reserved"] == r["reserved_cached"]
    assert r["device_free_unchanged"] and r["realloc_ok"] and r["device_free_reused"]
    assert r["reserved_end"] == 0 and r["device_free_end"] == r["capacity"]


def test_empty_virt_addr_cache_needs_expandable_segments():
    torch.zeros(1, device="npu")
    with pytest.raises(RuntimeError, match="please enable expandable_segments"):
        torch.npu.empty_virt_addr_cache()


def test_deterministic_mode_fills_uninitialized_memory():
    """torch.use_deterministic_algorithms(True) (fill_uninitialized_memory on by default):
    new npu memory reads NaN or the largest integer, as ATen's CPU and CUDA allocations."""
    from torch.testing._internal.common_utils import DeterministicGuard

    with DeterministicGuard(True, fill_uninitialized_memory=True):
        assert bool(torch.empty(10, 9, device="npu").isnan().all())
        assert bool(torch.empty_strided((3, 4), (1, 3), device="npu").isnan().all())
        assert bool(torch.empty_like(torch.zeros(5, device="npu"), dtype=torch.half).isnan().all())
        ints = torch.empty(5, dtype=torch.int32, device="npu")
        assert (ints.cpu() == torch.iinfo(torch.int32).max).all()
        grown = torch.zeros(4, device="npu")
        grown.resize_(64)
        assert (grown[:4].cpu() == 0).all() and bool(grown[4:].isnan().all())
    with DeterministicGuard(True, fill_uninitialized_memory=False):
        torch.empty(1 << 20, device="npu")  # no fill: nothing to check but that it runs



# ---- host memory behind the simulated HBM (8 x 64 GiB advertised on a smaller host) ----

_FILL_HOST = textwrap.dedent("""
    import torch, torch_npu
    keep = []
    try:
        for i in range(64):
            keep.append(torch.ones(128 * 2**20, dtype=torch.uint8, device="npu"))  # touched
        print("NO OOM")
    except torch.OutOfMemoryError as e:
        print("OOM", len(keep), "|", e)
    del keep
    print("after", torch.ones(4, device="npu").sum().item())
""")


def test_filling_host_memory_ends_in_out_of_memory_error_not_a_kill():
    r = run_python(_FILL_HOST, env={"ASCEND_SIM_HOST_MEMORY_LIMIT": "1G"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("OOM "), out
    assert 4 <= int(out.split()[1]) <= 8  # 128 MiB tensors under a 1 GiB budget
    assert "NPU out of memory. Tried to allocate" in out and "64.00 GiB total capacity" in out
    assert "The host ran out of memory before the device did" in out
    assert "after 4.0" in out  # the freed tensors' memory is usable again (their queued fills done)


def test_allocation_beyond_what_the_host_has_is_refused_at_once():
    with open("/proc/meminfo") as f:
        available = int(next(line for line in f if line.startswith("MemAvailable:")).split()[1]) * 1024
    if available > 48 * 2**30:
        pytest.skip("this host could back 48 GiB of device memory")
    with pytest.raises(torch.OutOfMemoryError, match="The host ran out of memory before the device did"):
        torch.empty(48 * 2**30, dtype=torch.uint8, device="npu")
    assert torch.ones(2, device="npu").sum().item() == 2  # nothing held


def test_host_memory_check_can_be_turned_off():
    code = ("import torch, torch_npu\n"
            "x = torch.empty(48 * 2**30, dtype=torch.uint8, device='npu')  # never touched\n"
            "print(torch.npu.memory_allocated() >= 48 * 2**30)\n")
    r = run_python(code, env={"ASCEND_SIM_HOST_MEMORY_LIMIT": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


# ---- the pinned-host caching allocator ----------------------------------------------

def test_pinned_blocks_are_cached_and_reused_after_their_copies():
    torch.npu.host_empty_cache()
    torch.npu.reset_accumulated_host_memory_stats()
    src = torch.arange(1000, dtype=torch.float32).pin_memory()  # 4000 bytes: a 4096-byte block
    ptr = src.data_ptr()
    dst = src.to("npu", non_blocking=True)
    del src  # the queued copy still reads it: the block comes back only once the copy has run
    torch.npu.synchronize()
    again = torch.empty(1024, dtype=torch.float32).pin_memory()  # the same rounded size
    assert again.data_ptr() == ptr  # reused, not a new block
    stats = torch.npu.host_memory_stats()
    assert stats["num_host_alloc"] == 1 and stats["allocations.current"] == 1
    assert stats["active_requests.current"] == 1 and stats["active_bytes.current"] == 4096
    assert torch.equal(dst.cpu(), torch.arange(1000, dtype=torch.float32))
    del again
    torch.npu.host_empty_cache()
    stats = torch.npu.host_memory_stats()
    assert stats["allocations.current"] == 0 and stats["num_host_free"] == 1


def test_pinned_cache_keys_of_the_alloc_conf():
    code = textwrap.dedent("""
        import torch, torch_npu
        a = torch.empty(3 * 2**20, dtype=torch.uint8).pin_memory()  # above the round threshold
        del a
        s = torch.npu.host_memory_stats()
        print(s["allocated_bytes.current"], s["num_host_free"])
    """)
    r = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"]  # 3 MiB: not rounded, larger than the cache takes: freed
    r = run_python("import torch, torch_npu; torch.empty(1).pin_memory()",
                   env={"PYTORCH_NPU_ALLOC_CONF": "pinned_max_cached_size_mb:0"})
    assert r.returncode != 0 and "pinned_max_cached_size_mb" in r.stderr
