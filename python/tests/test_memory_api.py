"""torch.npu memory tools: memory history and snapshots, MemPool / use_mem_pool, the
pluggable allocator (in fresh processes), against the caching allocator's real state; the
host (pinned-memory) allocator."""
import gc
import os
import pickle
import subprocess
import textwrap

import pytest
import torch
import torch_npu  # noqa: F401
from torch.cuda import _memory_viz

from torch_npu.npu import memory as npu_memory

from conftest import run_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _history_off():
    yield
    npu_memory._record_memory_history(None)


def _trace(snapshot, device=0):
    return snapshot["device_traces"][device]


def _entries(snapshot, action, addr=None):
    return [e for e in _trace(snapshot) if e["action"] == action and (addr is None or e.get("addr") == addr)]


def _frame_names(frames):
    return [f["name"] for f in frames]


def _block_at(snapshot, addr):
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["address"] == addr:
                return seg, b
    return None, None


def _largest_free_block():
    """Bytes of the largest cached free block (what an allocation could get without a new segment)."""
    return max((b["size"] for seg in npu_memory._snapshot()["segments"] for b in seg["blocks"]
                if b["state"] == "inactive"), default=0)


def _allocate_here(n):
    """A named frame that the recorded stacks must show."""
    return torch.full((n,), 3.0, device="npu")


# ---- memory history --------------------------------------------------------------------

def test_history_records_alloc_free_with_frames():
    torch.npu.synchronize()
    gc.collect()
    torch.npu.empty_cache()  # the next allocation needs a new segment
    # Larger than any cached free block (tensors that earlier tests keep alive can pin
    # segments empty_cache cannot release): the allocation needs a segment of its own.
    n = max(3 << 20, _largest_free_block() // 4 + (1 << 20))
    # 32 bytes short of a multiple of 2 MiB: with torch_npu's 32-byte padding the block is
    # its whole segment (a split would leave the segment's allocation stack on the remainder,
    # as in torch_npu and CUDA).
    n = ((n + (1 << 19) - 1) >> 19 << 19) - 8
    npu_memory._record_memory_history("all", context="all", stacks="python")
    x = _allocate_here(n)
    addr = x.data_ptr()
    assert torch.equal(x.cpu(), torch.full((n,), 3.0))
    snap = npu_memory._snapshot()

    # The live block carries the stack of its allocation.
    seg, block = _block_at(snap, addr)
    assert block is not None and block["state"] == "active_allocated"
    assert block["requested_size"] == 4 * n and block["size"] >= 4 * n
    assert "_allocate_here" in _frame_names(block["frames"])
    assert any(f["filename"] == __file__ for f in block["frames"])
    assert seg["segment_pool_id"] == (0, 0)
    assert "_allocate_here" in _frame_names(seg["frames"])  # the segment was allocated for it

    allocs = _entries(snap, "alloc", addr)
    assert len(allocs) == 1 and allocs[0]["size"] == 4 * n
    assert "_allocate_here" in _frame_names(allocs[0]["frames"])
    assert allocs[0]["pool_id"] == (0, 0) and allocs[0]["time_us"] > 0
    seg_allocs = _entries(snap, "segment_alloc")
    assert any(e["addr"] <= addr < e["addr"] + e["size"] for e in seg_allocs)
    assert _entries(snap, "snapshot")  # taking a snapshot is in the history

    del x
    snap = npu_memory._snapshot()
    requested = _entries(snap, "free_requested", addr)
    completed = _entries(snap, "free_completed", addr)
    assert len(requested) == 1 and len(completed) == 1
    assert requested[0]["size"] == 4 * n
    assert "test_history_records_alloc_free_with_frames" in _frame_names(requested[0]["frames"])
    actions = [e["action"] for e in _trace(snap) if e.get("addr") == addr]
    assert actions.index("alloc") < actions.index("free_requested") < actions.index("free_completed")
    _, block = _block_at(snap, addr)
    assert block is not None and block["state"] == "inactive"

    torch.npu.empty_cache()
    snap = npu_memory._snapshot()
    assert any(e["addr"] <= addr < e["addr"] + e["size"] for e in _entries(snap, "segment_free"))

    # torch.cuda's tools read it.
    assert "alloc" in _memory_viz.trace(snap) or _memory_viz.trace(snap)
    assert "Summary of segments" in _memory_viz.segsum(snap)
    assert "<html" in _memory_viz.trace_plot(snap).lower()


def test_history_off_clears_and_stops():
    npu_memory._record_memory_history("all")
    x = torch.empty(100, device="npu")
    assert _entries(npu_memory._snapshot(), "alloc", x.data_ptr())
    npu_memory._record_memory_history(None)
    y = torch.empty(100, device="npu")
    snap = npu_memory._snapshot()
    assert snap["device_traces"][0] == []
    _, block = _block_at(snap, y.data_ptr())
    assert block["frames"] == []
    del x, y


def test_history_max_entries_keeps_latest():
    npu_memory._record_memory_history("all", max_entries=3)
    tensors = [torch.empty(64 * (i + 1), device="npu") for i in range(5)]
    trace = _trace(npu_memory._snapshot())
    # 3 entries: the last two allocations and the snapshot itself, oldest first.
    assert [e["action"] for e in trace] == ["alloc", "alloc", "snapshot"]
    assert [e["addr"] for e in trace[:2]] == [t.data_ptr() for t in tensors[3:]]
    # Re-enabled with room for more: the kept entries stay in order, new ones follow.
    npu_memory._record_memory_history("all", max_entries=10)
    more = torch.empty(16, device="npu")
    trace = _trace(npu_memory._snapshot())
    assert [e["action"] for e in trace] == ["alloc", "alloc", "snapshot", "alloc", "snapshot"]
    assert [e["addr"] for e in trace if e["action"] == "alloc"] == [
        t.data_ptr() for t in tensors[3:] + [more]]
    del tensors, more


def test_history_state_and_context_options():
    npu_memory._record_memory_history("state")
    x = _allocate_here(10)
    snap = npu_memory._snapshot()
    assert len(_trace(snap)) <= 1  # "state" keeps no history
    _, block = _block_at(snap, x.data_ptr())
    assert "_allocate_here" in _frame_names(block["frames"])

    npu_memory._record_memory_history("all", context=None)
    y = _allocate_here(10)
    snap = npu_memory._snapshot()
    (entry,) = _entries(snap, "alloc", y.data_ptr())
    assert entry["frames"] == []
    _, block = _block_at(snap, y.data_ptr())
    assert block["frames"] == []

    npu_memory._record_memory_history("all", context="alloc")
    z = _allocate_here(10)
    addr = z.data_ptr()
    del z
    snap = npu_memory._snapshot()
    (alloc,) = _entries(snap, "alloc", addr)
    (free,) = _entries(snap, "free_requested", addr)
    assert "_allocate_here" in _frame_names(alloc["frames"])
    # Frees have no stack of their own with context="alloc": they show the allocation's.
    assert free["frames"] == alloc["frames"]
    del x, y


def test_history_records_oom():
    npu_memory._record_memory_history("all")
    total = torch.npu.mem_get_info()[1]
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2 * total, dtype=torch.uint8, device="npu")
    (oom,) = _entries(npu_memory._snapshot(), "oom")
    assert oom["size"] >= 2 * total and 0 <= oom["device_free"] <= total
    assert "addr" not in oom


def test_dump_snapshot_pickle(tmp_path):
    npu_memory._record_memory_history("all")
    x = torch.ones(256, device="npu")
    path = tmp_path / "snap.pickle"
    npu_memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert set(snap) >= {"segments", "device_traces"}
    assert _entries(snap, "alloc", x.data_ptr())
    assert len(snap["device_traces"]) == torch.npu.device_count()
    assert "Summary of segments" in _memory_viz.segsum(snap)
    del x


def test_npu_memory_viz_flame_graph_lines():
    from torch_npu.npu import _memory_viz as npu_viz

    npu_memory._record_memory_history("all")
    x = torch.ones(1024, device="npu")
    snap = npu_memory._snapshot()
    raw = lambda text: text  # noqa: E731  (the folded lines, instead of flamegraph.pl's svg)
    seg_lines = npu_viz.segments(snap, raw).splitlines()
    mem_lines = npu_viz.memory(snap, raw).splitlines()
    (seg,) = [s for s in snap["segments"] if s["address"] <= x.data_ptr() < s["address"] + s["total_size"]]
    # one line per block: stream;seg_<address>;<state>;<frames> <bytes>
    ours = [line for line in seg_lines if line.startswith(f"stream_{seg['stream']};seg_{seg['address']};")]
    assert any("active_allocated" in line and "test_memory_api.py" in line and line.endswith(" 4096")
               for line in ours)
    assert sum(int(line.rsplit(" ", 1)[1]) for line in ours) == seg["total_size"]
    assert all(line.startswith("stream_") and ";seg_" not in line for line in mem_lines)
    assert npu_viz.__all__ == ["segments", "memory"] and npu_viz._write_blocks is _memory_viz._write_blocks
    del x


def test_history_bad_arguments():
    with pytest.raises(ValueError, match="'enabled'"):
        npu_memory._record_memory_history("everything")
    with pytest.raises(ValueError, match="'context'"):
        npu_memory._record_memory_history("all", context="stack")
    with pytest.raises(ValueError, match="'stacks'"):
        npu_memory._record_memory_history("all", stacks="cpp")
    with pytest.raises(ValueError, match="'max_entries'"):
        npu_memory._record_memory_history("all", max_entries=0)
    with pytest.raises(TypeError, match="mempool_id"):
        torch.npu.memory_snapshot(mempool_id=3)


# ---- memory pools ----------------------------------------------------------------------

def _segment_of(addr, segments):
    for seg in segments:
        if seg["address"] <= addr < seg["address"] + seg["total_size"]:
            return seg
    return None


def test_mem_pool_routes_and_reuses():
    torch.npu.synchronize()
    pool = torch.npu.MemPool()
    assert isinstance(pool.id, tuple) and pool.id[0] == 0 and pool.id[1] > 0
    assert pool.use_count() == 1
    assert pool.snapshot() == []
    with torch.npu.use_mem_pool(pool):
        assert pool.use_count() == 2
        x = torch.empty(1000, device="npu")
        x.fill_(2.5)
        addr = x.data_ptr()
    assert pool.use_count() == 1
    outside = torch.empty(1000, device="npu")

    assert torch.equal((x * 2).cpu(), torch.full((1000,), 5.0))
    segs = pool.snapshot()
    assert _segment_of(addr, segs) is not None
    assert _segment_of(outside.data_ptr(), segs) is None
    assert all(s["segment_pool_id"] == pool.id for s in segs)
    assert _segment_of(addr, torch.npu.memory_snapshot())["segment_pool_id"] == pool.id

    # Freed memory goes back to the pool: only allocations routed to it reuse it.
    del x
    other = torch.empty(1000, device="npu")
    assert _segment_of(other.data_ptr(), pool.snapshot()) is None
    with torch.npu.use_mem_pool(pool):
        again = torch.empty(1000, device="npu")
    assert again.data_ptr() == addr
    del again, other, outside


def test_mem_pool_memory_released_when_pool_and_tensors_die():
    torch.npu.synchronize()
    gc.collect()
    torch.npu.empty_cache()
    base = torch.npu.memory_reserved()
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        x = torch.empty(8 << 20, dtype=torch.uint8, device="npu")  # a large segment of its own
    assert torch.npu.memory_reserved() >= base + (8 << 20)
    x.fill_(7)
    assert int(x.sum().item()) == 7 * (8 << 20)
    pool_id = pool.id
    (seg,) = pool.snapshot()
    torch.npu.synchronize()
    reserved = torch.npu.memory_reserved()
    del pool  # the tensor keeps its memory
    gc.collect()
    assert torch.npu.memory_reserved() == reserved
    assert int(x[-5:].sum().item()) == 35
    torch.npu.synchronize()
    reserved = torch.npu.memory_reserved()
    del x  # the last user of the pool: its segment goes back to the device
    assert torch.npu.memory_reserved() == reserved - seg["total_size"]
    assert not [s for s in torch.npu.memory_snapshot() if s["segment_pool_id"] == pool_id]


def test_mem_pool_empty_cache_keeps_pool_memory_until_released():
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        x = torch.empty(4 << 20, dtype=torch.uint8, device="npu")
    del x
    torch.npu.empty_cache()  # a live pool keeps its cached memory (as torch.cuda)
    assert len(pool.snapshot()) == 1
    npu_memory._C._npu_emptyCachePool(pool.id)  # a pool's own cache can be released
    assert pool.snapshot() == []


def test_mem_pool_no_split_and_use_on_oom():
    pool = torch.npu.MemPool(no_split=True)
    with torch.npu.use_mem_pool(pool):
        x = torch.empty(100, device="npu")
    (seg,) = pool.snapshot()
    assert len(seg["blocks"]) == 1 and seg["blocks"][0]["size"] == seg["total_size"]
    del x

    # Larger than any cached free block outside the pool (earlier tests may leave some).
    size = max(4 << 20, _largest_free_block() + (1 << 20))
    oom_pool = torch.npu.MemPool(use_on_oom=True)
    with torch.npu.use_mem_pool(oom_pool):
        y = torch.empty(size, dtype=torch.uint8, device="npu")
    y_addr = y.data_ptr()
    del y
    torch.npu.synchronize()
    # With no device memory left, an allocation outside the pool takes the pool's block.
    torch.npu.set_per_process_memory_fraction(0.0)
    try:
        z = torch.empty(size, dtype=torch.uint8, device="npu")
    finally:
        torch.npu.set_per_process_memory_fraction(1.0)
    assert z.data_ptr() == y_addr
    z.fill_(1)
    assert int(z.sum().item()) == size
    del z


def test_mem_pool_bad_arguments():
    with pytest.raises(TypeError, match="'pool'"):
        with torch.npu.use_mem_pool((0, 1)):
            pass
    with pytest.raises(TypeError, match="'no_split'"):
        torch.npu.MemPool(no_split=1)
    with pytest.raises(RuntimeError, match="'allocator'"):
        torch.npu.MemPool(allocator=object())


def test_mem_pool_thread_only():
    import threading

    pool = torch.npu.MemPool()
    seen = {}

    def worker():
        seen["t"] = torch.empty(1000, device="npu")

    with torch.npu.use_mem_pool(pool):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        mine = torch.empty(1000, device="npu")
    segs = pool.snapshot()
    assert _segment_of(mine.data_ptr(), segs) is not None
    assert _segment_of(seen["t"].data_ptr(), segs) is None  # other threads are not routed
    del mine, seen


# ---- pluggable allocator (fresh processes: it must be installed before any allocation) ----

ALLOCATOR_SRC = r"""
#include <acl/acl_rt.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <atomic>
#include <cstddef>
static std::atomic<long> allocs{0}, frees{0}, freed_bytes{0}, peak_resets{0};
extern "C" {
void* my_alloc(size_t size, int device, aclrtStream stream) {
  void* ptr = nullptr;
  if (aclrtMalloc(&ptr, size, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) return nullptr;
  allocs++;
  return ptr;
}
void my_free(void* ptr, size_t size, int device, aclrtStream stream) {
  aclrtFree(ptr);
  frees++;
  freed_bytes += static_cast<long>(size);
}
// torch_npu's optional hooks: statistics and peak reset.
c10::CachingDeviceAllocator::DeviceStats my_get_device_stats(c10::DeviceIndex device) {
  c10::CachingDeviceAllocator::DeviceStats stats;
  stats.num_alloc_retries = 7 + device;
  stats.allocated_bytes[0].current = allocs.load() - frees.load();
  return stats;
}
void my_reset_peak_status(c10::DeviceIndex device) { peak_resets++; }
long peak_reset_count() { return peak_resets.load(); }
long alloc_count() { return allocs.load(); }
long free_count() { return frees.load(); }
long freed() { return freed_bytes.load(); }
}
"""


@pytest.fixture(scope="module")
def allocator_so(tmp_path_factory):
    d = tmp_path_factory.mktemp("pluggable")
    src = d / "alloc.cpp"
    src.write_text(ALLOCATOR_SRC)
    so = d / "alloc.so"
    # The simulator's ACL functions are exported by torch_npu/_C.so.
    c_so = os.path.realpath(torch_npu._C.__file__)
    from torch.utils.cpp_extension import include_paths

    cmd = ["g++", "-shared", "-fPIC", "-O1", "-std=c++17", "-o", str(so), str(src),
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
           "-I", os.path.join(REPO, "core", "acl", "include"), "-I", include_paths()[0], c_so,
           "-Wl,-rpath," + os.path.dirname(c_so)]
    subprocess.run(cmd, check=True, capture_output=True)
    return str(so)


def _run(code):
    r = run_python(textwrap.dedent(code))  # the torch_npu under test (the wheel in CI)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_pluggable_allocator_serves_npu_memory(allocator_so):
    out = _run(f"""
        import ctypes, gc, torch, torch_npu
        lib = ctypes.CDLL({allocator_so!r})
        lib.alloc_count.restype = lib.free_count.restype = lib.freed.restype = ctypes.c_long
        alloc = torch.npu.memory.NPUPluggableAllocator({allocator_so!r}, "my_alloc", "my_free")
        torch.npu.memory.change_current_allocator(alloc)
        assert torch.npu.get_allocator_backend() == "pluggable"
        assert lib.alloc_count() == 0
        a = torch.arange(1000, dtype=torch.float32, device="npu")
        b = (a * 2 + 1).sum()
        assert b.item() == float((torch.arange(1000.) * 2 + 1).sum())
        assert lib.alloc_count() >= 2, lib.alloc_count()
        n = lib.alloc_count()
        del a, b
        torch.npu.synchronize(); gc.collect()
        c = torch.zeros(10, device="npu")  # collects finished kernels' memory too
        assert lib.free_count() >= 2 and lib.freed() >= 4000, (lib.free_count(), lib.freed())
        assert torch.npu.memory_allocated() == 0  # no statistics function set yet
        raw = alloc.allocator()
        raw.set_get_device_stats_fn(ctypes.cast(lib.my_get_device_stats, ctypes.c_void_p).value)
        raw.set_reset_peak_status_fn(ctypes.cast(lib.my_reset_peak_status, ctypes.c_void_p).value)
        assert torch.npu.memory_stats()["num_alloc_retries"] == 7
        assert torch.npu.memory_allocated() == lib.alloc_count() - lib.free_count() > 0
        lib.peak_reset_count.restype = ctypes.c_long
        torch.npu.reset_peak_memory_stats()
        assert lib.peak_reset_count() == 1
        p = torch.npu.caching_allocator_alloc(4096)
        assert lib.alloc_count() > n
        torch.npu.caching_allocator_delete(p)
        try:
            torch.npu.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            assert "already initialized" in str(e)
        else:
            raise AssertionError("swapping a used allocator must fail")
        print("OK", lib.alloc_count(), lib.free_count())
    """)
    assert out.startswith("OK")


def test_pluggable_allocator_after_caching_allocation(allocator_so):
    out = _run(f"""
        import torch, torch_npu
        x = torch.zeros(10, device="npu")
        alloc = torch.npu.memory.NPUPluggableAllocator({allocator_so!r}, "my_alloc", "my_free")
        try:
            torch.npu.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            assert "Can't swap an already initialized allocator" in str(e), e
            print("OK")
    """)
    assert out.startswith("OK")


def test_pluggable_allocator_bad_arguments(allocator_so):
    with pytest.raises(RuntimeError, match="no_such_fn"):
        torch.npu.memory.NPUPluggableAllocator(allocator_so, "no_such_fn", "my_free")
    with pytest.raises(TypeError, match="'alloc_fn_name'"):
        torch.npu.memory.NPUPluggableAllocator(allocator_so, 3, "my_free")
    with pytest.raises(TypeError, match="'allocator'"):
        torch.npu.memory.change_current_allocator("my_alloc")


# ---- torch.npu.utilization ---------------------------------------------------------------

def test_utilization_busy_and_idle():
    import time

    a = torch.randn(512, 512, device="npu")
    torch.npu.synchronize()
    torch.npu.utilization()  # starts a period
    time.sleep(0.2)
    idle = torch.npu.utilization()  # a period with nothing queued
    assert idle == 0

    ref = a.cpu()
    torch.npu.utilization()
    for _ in range(30):
        a = (a @ a).tanh()  # run in stream order (on the caller: runs_on_caller)
    torch.npu.synchronize()
    busy = torch.npu.utilization()
    assert 0 < busy <= 100
    for _ in range(30):
        ref = (ref @ ref).tanh()
    assert torch.allclose(a.cpu(), ref, atol=1e-4)
    assert isinstance(torch.npu.utilization(0), int)
    with pytest.raises((RuntimeError, ValueError)):
        torch.npu.utilization(torch.npu.device_count())


# ---- throw_on_npumalloc_oom (torch_npu's PYTORCH_NPU_ALLOC_CONF key) ---------------------

def test_throw_on_npumalloc_oom_counts_rejections():
    set_settings = torch_npu._C._npu_npuCachingAllocator_set_allocator_settings
    with pytest.raises(RuntimeError, match="throw_on_npumalloc_oom"):
        set_settings("throw_on_npumalloc_oom:maybe")
    torch.npu.reset_accumulated_memory_stats()
    assert torch.npu.memory_stats()["num_oom_rejections"] == 0
    total = torch.npu.mem_get_info()[1]
    try:
        set_settings("throw_on_npumalloc_oom:True,per_process_memory_fraction:0.01")
        small = torch.ones(100, device="npu")  # within the limit
        assert torch.npu.memory_stats()["num_oom_rejections"] == 0
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(total // 50, dtype=torch.uint8, device="npu")  # 2% > 1%
        assert torch.npu.memory_stats()["num_oom_rejections"] > 0
        assert int(small.sum().item()) == 100
    finally:
        set_settings("throw_on_npumalloc_oom:False,per_process_memory_fraction:1.0")


def test_mem_pool_shared_with_graph_capture():
    pool = torch.npu.MemPool()
    x = torch.arange(1000, dtype=torch.float32, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, pool=pool.id):
        y = x * 2 + 1
    assert pool.use_count() == 2  # the graph holds the pool too
    assert _segment_of(y.data_ptr(), pool.snapshot()) is not None
    x.fill_(1.0)
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), torch.full((1000,), 3.0))
    del g
    assert pool.use_count() == 1
    del y


def test_mem_pool_with_pluggable_allocator(allocator_so):
    import ctypes

    lib = ctypes.CDLL(allocator_so)
    for fn in (lib.alloc_count, lib.free_count, lib.freed):
        fn.restype = ctypes.c_long
    alloc = torch.npu.memory.NPUPluggableAllocator(allocator_so, "my_alloc", "my_free")
    allocs, frees, freed = lib.alloc_count(), lib.free_count(), lib.freed()
    pool = torch.npu.MemPool(allocator=alloc.allocator())
    assert pool.allocator is not None
    assert torch.npu.get_allocator_backend() == "native"  # only the pool uses it
    with torch.npu.use_mem_pool(pool):
        x = torch.full((3000,), 2.0, device="npu")
    outside = torch.ones(3000, device="npu")
    assert lib.alloc_count() == allocs + 1  # one segment for the pool, nothing else
    (seg,) = pool.snapshot()
    assert _segment_of(x.data_ptr(), [seg]) is not None
    assert torch.equal((x + outside).cpu(), torch.full((3000,), 3.0))
    torch.npu.synchronize()
    del x, pool
    gc.collect()
    assert lib.free_count() == frees + 1 and lib.freed() == freed + seg["total_size"]
    del outside


# ---- the host (pinned-memory) allocator is registered (fresh interpreter) ---------

def test_host_allocator_is_registered():
    code = textwrap.dedent("""
        import torch, torch_npu
        t = torch.empty(1 << 16).pin_memory()
        assert t.is_pinned()
        torch.accelerator.memory.empty_host_cache()  # crashed without npu's HostAllocator
        torch._C._accelerator_emptyHostCache()
        del t
        print("OK")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
