"""The caching allocator's sizes and PYTORCH_NPU_ALLOC_CONF keys, as torch_npu's.

torch_npu pads every request by 32 bytes before rounding it (to 512 bytes, or to a
roundup_power2_divisions step of its power-of-two interval), and its segment sizes follow
large_segment_size_mb / segment_size_mb; memory_allocated, memory_reserved, memory_stats and
the snapshot report those sizes.
"""
import gc
import json
import textwrap

import pytest
import torch
import torch_npu  # noqa: F401

from conftest import run_python

MiB = 1 << 20


@pytest.fixture
def clean_allocator():
    gc.collect()
    torch.npu.synchronize()
    torch.npu.empty_cache()
    torch.npu.memory._set_allocator_settings("")
    yield
    gc.collect()
    torch.npu.synchronize()
    torch.npu.memory._set_allocator_settings("")
    torch.npu.empty_cache()


def _block_size(nbytes):
    """Bytes memory_allocated counts for one request of nbytes (everything else freed)."""
    before = torch.npu.memory_allocated()
    t = torch.empty(nbytes, dtype=torch.uint8, device="npu")
    size = torch.npu.memory_allocated() - before
    stats = torch.npu.memory_stats()
    assert stats["requested_bytes.all.current"] >= nbytes
    del t
    return size


def test_requests_are_padded_by_32_bytes_then_rounded_to_512(clean_allocator):
    assert _block_size(1) == 512
    assert _block_size(480) == 512      # 480 + 32 = 512
    assert _block_size(481) == 1024     # 481 + 32 > 512
    assert _block_size(512) == 1024     # torch_npu's test_huge_memory_alloc_512B
    assert _block_size(1000) == 1536
    # torch_npu's test_huge_memory_alloc_20M: 40 Mi float32 elements
    assert _block_size(160 * MiB) == 160 * MiB + 512


def _stats_delta(fn):
    before = torch.npu.memory_stats()
    keep = fn()
    after = torch.npu.memory_stats()
    return keep, {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}


def test_requested_bytes_are_the_unpadded_request(clean_allocator):
    t, d = _stats_delta(lambda: torch.empty(1000, dtype=torch.uint8, device="npu"))
    assert d["requested_bytes.all.current"] == 1000
    assert d["allocated_bytes.all.current"] == 1536
    del t


def test_a_1_mib_request_is_large_with_the_padding(clean_allocator):
    small, d = _stats_delta(lambda: torch.empty(MiB - 32, dtype=torch.uint8, device="npu"))
    assert d["allocated_bytes.small_pool.current"] == MiB
    assert d["allocated_bytes.large_pool.current"] == 0
    large, d = _stats_delta(lambda: torch.empty(MiB, dtype=torch.uint8, device="npu"))
    assert d["allocated_bytes.large_pool.current"] == MiB + 512
    assert d["allocated_bytes.small_pool.current"] == 0
    del small, large


def test_snapshot_block_sizes_are_the_rounded_sizes(clean_allocator):
    t = torch.empty(1000, dtype=torch.uint8, device="npu")
    ptr = t.data_ptr()
    blocks = [b for seg in torch.npu.memory_snapshot() for b in seg["blocks"]
              if b["address"] == ptr]
    assert len(blocks) == 1
    assert blocks[0]["size"] == 1536
    assert blocks[0]["requested_size"] == 1000
    assert blocks[0]["state"] == "active_allocated"
    del t


def test_roundup_power2_divisions_per_interval_as_torch_npu(clean_allocator):
    # torch_npu's test_roundup_power2_divisions: intervals 0-3 -> 1, 4-5 -> 0, 6 -> 4,
    # 7 -> 8, 8 -> 2, 9 and above -> 16 (interval i: [2^i, 2^(i+1)) MiB).
    torch.npu.memory._set_allocator_settings("roundup_power2_divisions:[8:1,64:4,128:8,256:2,>:16]")
    assert _block_size(513) == 1024
    assert _block_size(1025) == 1536
    # divisions 0: 512 B rounding; the 34 MiB segment's remainder is too small to split
    assert _block_size(33 * MiB) == 34 * MiB
    assert _block_size(65 * MiB) == 80 * MiB      # [64, 128) MiB in 4 steps
    assert _block_size(200 * MiB) == 208 * MiB    # [128, 256) MiB in 8 steps of 16
    assert _block_size(510 * MiB) == 512 * MiB    # [256, 512) MiB in 2 steps
    assert _block_size(513 * MiB) == 544 * MiB    # [512, 1024) MiB in 16 steps


def test_roundup_power2_divisions_list_sets_its_interval_not_the_one_below(clean_allocator):
    # [256:1,512:2,>:4]: 1 below 512 MiB, 2 in [512 MiB, 1 GiB), 4 from 1 GiB.
    torch.npu.memory._set_allocator_settings("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert _block_size(300 * MiB) == 300 * MiB + 512
    assert _block_size(600 * MiB) == 768 * MiB
    assert _block_size(1100 * MiB) == 1280 * MiB


def test_roundup_power2_divisions_single_value(clean_allocator):
    torch.npu.memory._set_allocator_settings("roundup_power2_divisions:4")
    assert _block_size(9000) == 10240  # 9032 -> next quarter step of [8 KiB, 16 KiB)
    assert _block_size(1000) == 1536   # at most 512 * divisions: 512 B rounding
    torch.npu.memory._set_allocator_settings("")
    assert _block_size(9000) == 9216


@pytest.mark.parametrize("conf, error, text", [
    ("max_split_size_mb:10", ValueError, "CachingAllocator option max_split_size_mb too small, must be >= 20"),
    ("max_non_split_rounding_mb:5", ValueError,
     "CachingAllocator option max_non_split_rounding_mb too small, must be >= 20"),
    ("large_segment_size_mb:5", ValueError, "CachingAllocator option large_segment_size_mb must be > 10 MB"),
    ("large_segment_size_mb:10", ValueError, "CachingAllocator option large_segment_size_mb must be > 10 MB"),
    ("large_segment_size_mb:50,max_split_size_mb:30", ValueError,
     "CachingAllocator option max_split_size_mb too small, must be >= 50"),
    ("max_non_split_rounding_mb:30,large_segment_size_mb:40", ValueError,
     "CachingAllocator option max_non_split_rounding_mb too small, must be >= 40"),
    ("segment_size_mb:10", RuntimeError,
     "CachingAllocator option segment_size_mb error, must be [20, 512], dtype is int"),
    ("segment_size_mb:513", RuntimeError,
     "CachingAllocator option segment_size_mb error, must be [20, 512], dtype is int"),
    ("segment_size_mb:1.5", RuntimeError, "CachingAllocator option segment_size_mb is invalid."),
    ("roundup_power2_divisions:3", ValueError, "For roundups, the divisions has to be power of 2 "),
    ("roundup_power2_divisions:[64:3]", ValueError,
     "For roundups, the divisions has to be power of 2 or 0 to disable roundup "),
    ("roundup_power2_divisions:[48:2]", ValueError, "For roundups, the intervals have to be power of 2 "),
    ("garbage_collection_threshold:1.5", ValueError,
     "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"),
    ("max_split_size_mb:many", RuntimeError, "invalid value 'many' for key 'max_split_size_mb'"),
])
def test_alloc_conf_errors_are_torch_npus(conf, error, text, clean_allocator):
    with pytest.raises(error) as info:
        torch.npu.memory._set_allocator_settings(conf)
    assert text in str(info.value)


def test_max_split_size_mb_accepts_the_large_segment_size(clean_allocator):
    torch.npu.memory._set_allocator_settings("max_split_size_mb:20")
    assert torch.npu.memory_stats()["max_split_size"] == 20 * MiB
    torch.npu.memory._set_allocator_settings("max_non_split_rounding_mb:20,segment_size_mb:20")


def _reserved_growth_for_75_mib_after_a_freed_100_mib(conf):
    torch.npu.memory._set_allocator_settings(conf)
    torch.npu.empty_cache()
    large = torch.empty(100 * MiB, dtype=torch.uint8, device="npu")
    del large  # cached: one 102 MiB segment, not split (oversize)
    before = torch.npu.memory_reserved()
    small = torch.empty(75 * MiB, dtype=torch.uint8, device="npu")
    grown = torch.npu.memory_reserved() - before
    del small
    torch.npu.empty_cache()
    return grown


def test_max_non_split_rounding_mb_bounds_the_oversize_block_a_request_takes(clean_allocator):
    # The cached 102 MiB block is 27 MiB larger than the 75 MiB request (both oversize).
    assert _reserved_growth_for_75_mib_after_a_freed_100_mib(
        "max_split_size_mb:50,max_non_split_rounding_mb:20") == 76 * MiB
    assert _reserved_growth_for_75_mib_after_a_freed_100_mib(
        "max_split_size_mb:50,max_non_split_rounding_mb:30") == 0
    # Default: the large segment size (20 MiB).
    assert _reserved_growth_for_75_mib_after_a_freed_100_mib("max_split_size_mb:50") == 76 * MiB


_SEGMENTS = textwrap.dedent("""
    import json, warnings
    MiB = 1 << 20
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch, torch_npu
        a = torch.empty(5 * MiB, dtype=torch.uint8, device="npu")
    r1 = torch.npu.memory_reserved()
    b = torch.empty(8 * MiB, dtype=torch.uint8, device="npu")
    r2 = torch.npu.memory_reserved()
    c = torch.empty(64, dtype=torch.uint8, device="npu")
    print("REPORT", json.dumps({"first": r1, "second": r2, "with_small": torch.npu.memory_reserved(),
                                "warnings": [str(w.message) for w in caught]}))
""")


def _segments(conf):
    r = run_python(_SEGMENTS, env={"PYTORCH_NPU_ALLOC_CONF": conf, "ASCEND_SIM_DEVICE_COUNT": "1"})
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def test_large_segment_size_mb_sets_the_segment_of_mid_size_requests():
    report = _segments("large_segment_size_mb:50")
    assert report["first"] == 50 * MiB
    assert report["second"] == 50 * MiB  # the 8 MiB request fits in the 45 MiB left
    assert report["with_small"] == 52 * MiB  # the small pool keeps 2 MiB segments


def test_expandable_segments_map_20_mib_pages_in_the_large_pool():
    report = _segments("expandable_segments:True")
    assert report["first"] == 20 * MiB
    assert report["second"] == 20 * MiB
    assert report["with_small"] == 22 * MiB  # 2 MiB pages in the small pool


def test_segment_size_mb_sets_the_expandable_page_and_is_deprecated():
    report = _segments("expandable_segments:True,segment_size_mb:128")
    assert report["first"] == 128 * MiB  # torch_npu's test_custom_segment_size
    assert any("`segment_size_mb` is deprecated, please use `large_segment_size_mb` instead." in w
               for w in report["warnings"])


def test_large_segment_size_mb_wins_over_segment_size_mb():
    report = _segments("expandable_segments:True,segment_size_mb:50,large_segment_size_mb:100")
    assert report["first"] == 100 * MiB
    assert any("Both `segment_size_mb` and `large_segment_size_mb` are set." in w for w in report["warnings"])


def test_segment_size_mb_does_not_change_fixed_segments():
    report = _segments("segment_size_mb:128")
    assert report["first"] == 20 * MiB


def test_invalid_large_segment_size_in_the_environment_fails_the_first_allocation():
    r = run_python("import torch, torch_npu\ntorch.empty(4, device='npu')",
                   env={"PYTORCH_NPU_ALLOC_CONF": "large_segment_size_mb:50,max_split_size_mb:30"})
    assert r.returncode != 0
    assert "CachingAllocator option max_split_size_mb too small, must be >= 50" in r.stderr
