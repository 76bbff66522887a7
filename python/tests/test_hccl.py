"""HCCL (the ``hccl`` c10d backend): real multi-process runs on one host.

Each test spawns its ranks (torch.multiprocessing, or torchrun); a rank that fails an
assertion makes the spawn raise with its traceback. Ranks use npu:<rank>.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_npu  # noqa: F401

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def _spawn(fn, world, *args, env=None):
    """Runs fn(rank, world, port, *args) on `world` ranks. `port` is that of a TCPStore this
    process serves for the run, the ranks' rendezvous: bound to port 0, so the OS picks a free
    port atomically (a port found free and bound later by rank 0 could be taken in between
    by a concurrent run)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        mp.spawn(fn, args=(world, store.port) + args, nprocs=world, join=True)
    finally:
        os.environ.clear()
        os.environ.update(old)


def _init(rank, world, port, timeout=None):
    import datetime

    import torch_npu  # noqa: F401  (spawned interpreters start fresh)
    torch.npu.set_device(rank)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
    # A client of _spawn's store (what tcp:// would give, without rank 0 serving it)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                          timeout=kwargs.get("timeout", dist.constants.default_pg_timeout))
    dist.init_process_group("hccl", store=store, rank=rank, world_size=world, **kwargs)
    return torch.device("npu", rank)


def _shm_segments():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("torch_npu_hccl"))


# ---- every collective, every dtype / op ---------------------------------------------------

def _expected_reduce(values, op):
    out = values[0].clone()
    for v in values[1:]:
        if op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG:
            out = out + v
        elif op == dist.ReduceOp.PRODUCT:
            out = out * v
        elif op == dist.ReduceOp.MIN:
            out = torch.minimum(out, v)
        elif op == dist.ReduceOp.MAX:
            out = torch.maximum(out, v)
    if op == dist.ReduceOp.AVG:
        out = out / len(values)
    return out


def _value(rank, n, dtype, salt=0):
    """Small exact values (fp16/bf16 sums and products stay exact)."""
    base = torch.arange(n, dtype=torch.int64) % 3 + rank + 1 + salt
    return base.to(dtype)


def _w_collectives(rank, world, port):
    dev = _init(rank, world, port)
    ranks = range(world)

    # all_reduce: every op x dtype, small (one-shot) and large (two-shot) messages
    for dtype in DTYPES:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                   dist.ReduceOp.MAX):
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            for n in (7, 100_003):
                t = _value(rank, n, dtype).to(dev)
                dist.all_reduce(t, op=op)
                want = _expected_reduce([_value(r, n, torch.float64) for r in ranks], op)
                torch.testing.assert_close(t.cpu().double(), want.to(dtype).double(), msg=f"{dtype} {op} {n}")
    b = torch.tensor([rank == 0, True, False]).to(dev)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    assert b.cpu().tolist() == [True, True, False]
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    assert b.cpu().tolist() == [True, True, False]

    # broadcast / reduce
    for root in ranks:
        t = _value(rank, 1000, torch.float32).to(dev)
        dist.broadcast(t, src=root)
        assert torch.equal(t.cpu(), _value(root, 1000, torch.float32))
        t = _value(rank, 1000, torch.int64).to(dev)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            assert torch.equal(t.cpu(), sum(_value(r, 1000, torch.int64) for r in ranks))

    # all_gather (list and into_tensor), reduce_scatter (list and tensor)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = _value(rank, 513, dtype).to(dev)
        outs = [torch.empty(513, dtype=dtype, device=dev) for _ in ranks]
        dist.all_gather(outs, x)
        for r in ranks:
            assert torch.equal(outs[r].cpu(), _value(r, 513, dtype))
        flat = torch.empty(513 * world, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(flat, x)
        assert torch.equal(flat.cpu(), torch.cat([_value(r, 513, dtype) for r in ranks]))

        ins = [_value(rank, 300, dtype, salt=i).to(dev) for i in ranks]
        out = torch.empty(300, dtype=dtype, device=dev)
        dist.reduce_scatter(out, ins)
        assert torch.equal(out.cpu(), sum(_value(r, 300, torch.int64, salt=rank) for r in ranks).to(dtype))
        big = torch.cat([_value(rank, 300, dtype, salt=i) for i in ranks]).to(dev)
        dist.reduce_scatter_tensor(out, big, op=dist.ReduceOp.MAX)
        assert torch.equal(out.cpu(), _value(world - 1, 300, dtype, salt=rank))

    # all_to_all_single: even and uneven splits; all_to_all with lists
    x = torch.arange(world * 4, dtype=torch.float32).add(100 * rank).to(dev)
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    want = torch.cat([torch.arange(world * 4).add(100 * r)[rank * 4:(rank + 1) * 4] for r in ranks])
    assert torch.equal(y.cpu(), want.float())
    # rank r sends (d + 1) rows of 3 to rank d
    send = torch.cat([torch.full((d + 1, 3), 10 * rank + d) for d in ranks]).to(dev)
    recv = torch.empty((rank + 1) * world, 3, dtype=send.dtype, device=dev)
    dist.all_to_all_single(recv, send, output_split_sizes=[rank + 1] * world,
                           input_split_sizes=[d + 1 for d in ranks])
    assert torch.equal(recv.cpu(), torch.cat([torch.full((rank + 1, 3), 10 * s + rank) for s in ranks]))
    outs = [torch.empty(s + 2, device=dev) for s in ranks]
    dist.all_to_all(outs, [torch.full((rank + 2,), float(rank * 10 + d), device=dev) for d in ranks])
    for s in ranks:
        assert torch.equal(outs[s].cpu(), torch.full((s + 2,), float(s * 10 + rank)))

    # gather / scatter
    x = torch.full((5,), float(rank), device=dev)
    outs = [torch.empty(5, device=dev) for _ in ranks] if rank == 1 else None
    dist.gather(x, outs, dst=1)
    if rank == 1:
        assert [o.cpu()[0].item() for o in outs] == [float(r) for r in ranks]
    out = torch.empty(5, device=dev)
    dist.scatter(out, [torch.full((5,), float(r * 7), device=dev) for r in ranks] if rank == 0 else None, src=0)
    assert torch.equal(out.cpu(), torch.full((5,), float(rank * 7)))

    # send / recv, isend / irecv, batch_isend_irecv (a ring)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank == 0:
        dist.send(torch.arange(10, device=dev), dst=1)
    elif rank == 1:
        t = torch.empty(10, dtype=torch.int64, device=dev)
        dist.recv(t, src=0)
        assert torch.equal(t.cpu(), torch.arange(10))
    s = torch.full((1000,), float(rank), device=dev)
    r = torch.empty(1000, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)])
    for q in reqs:
        q.wait()
    assert torch.equal(r.cpu(), torch.full((1000,), float(prv)))

    # async_op + wait orders the current stream after the collective; the comm stream
    # starts after work already queued on the current stream
    t = torch.ones(1 << 20, device=dev)
    t.mul_(rank + 1)  # queued on the current stream before the collective
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    t.add_(1)  # queued after the wait: sees the reduced values
    assert t.cpu()[::4096].eq(sum(r + 1 for r in ranks) + 1).all()
    fut = dist.all_reduce(torch.ones(4, device=dev), async_op=True).get_future()
    assert fut.wait()[0].cpu().tolist() == [float(world)] * 4

    # coalesced all_reduce
    ts = [torch.ones(3, device=dev) * (rank + 1), torch.ones(5, device=dev)]
    dist.all_reduce_coalesced(ts)
    assert ts[0].cpu().tolist() == [float(sum(r + 1 for r in ranks))] * 3

    # subgroups
    if world >= 3:
        g = dist.new_group([0, 2])
        if rank in (0, 2):
            t = torch.full((4,), float(rank), device=dev)
            dist.all_reduce(t, group=g)
            assert t.cpu().tolist() == [2.0] * 4
    else:
        g = dist.new_group([0, 1])
        t = torch.full((4,), float(rank + 1), device=dev)
        dist.all_reduce(t, group=g, op=dist.ReduceOp.PRODUCT)
        assert t.cpu().tolist() == [2.0] * 4

    # bad input: clear errors before any communication
    def raises(fn, text):
        try:
            fn()
        except (RuntimeError, ValueError) as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError(f"no error containing {text!r}")
    backend = dist.group.WORLD._get_backend(torch.device("npu"))
    raises(lambda: backend.allreduce([torch.ones(3)]), "expects npu tensors")
    other = torch.ones(3, device=torch.device("npu", (rank + 1) % world))
    raises(lambda: dist.all_reduce(other), "uses npu:%d" % rank)
    raises(lambda: dist.broadcast(torch.ones(3, device=dev), src=world), "invalid")
    raises(lambda: dist.all_gather_into_tensor(torch.empty(3, device=dev), torch.ones(2, device=dev)),
           "world_size")
    raises(lambda: dist.all_reduce(torch.ones(4, 4, device=dev).t()), "contiguous")
    raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool, device=dev), op=dist.ReduceOp.AVG),
           "bool")
    dist.barrier()
    torch.npu.synchronize()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_collectives(world):
    before = _shm_segments()
    _spawn(_w_collectives, world)
    assert _shm_segments() == before


# ---- memory of expandable segments ---------------------------------------------------------

EXPANDABLE = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}


def _w_expandable(rank, world, port):
    dev = _init(rank, world, port)
    x = torch.full((3 << 20,), float(rank + 1), device=dev)  # 12 MiB: several 2 MiB pages
    segments = torch.npu.memory_snapshot()
    assert segments and all(s["is_expandable"] for s in segments), segments
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((3 << 20,), float(world * (world + 1) // 2)))
    # Free pages go back to the device and come back at other arena offsets: peers must
    # follow the new pages behind the same addresses.
    for step in range(3):
        del x
        torch.npu.empty_cache()
        filler = torch.empty(1 << 20, device=dev) if (step + rank) % 2 else None
        x = torch.arange(3 << 20, device=dev, dtype=torch.float32) * (rank + 1 + step)
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        for r in range(world):
            assert torch.equal(parts[r].cpu(), torch.arange(3 << 20, dtype=torch.float32) * (r + 1 + step)), (step, r)
        del filler
    dist.broadcast(x, src=world - 1)
    assert torch.equal(x.cpu(), torch.arange(3 << 20, dtype=torch.float32) * (world + 2))
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        y = torch.zeros_like(x)
        dist.recv(y, 0)
        assert torch.equal(y.cpu(), torch.arange(3 << 20, dtype=torch.float32) * (world + 2))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_expandable_segments(world):
    before = _shm_segments()
    _spawn(_w_expandable, world, env=EXPANDABLE)
    _spawn(_w_collectives, world, env=EXPANDABLE)
    assert _shm_segments() == before


def test_ddp_with_expandable_segments(tmp_path):
    path = str(tmp_path / "weights.pt")
    _spawn(_w_ddp, 2, path, env=EXPANDABLE)
    _assert_matches_single_process(path, 2)


# ---- mismatched sizes across ranks ---------------------------------------------------------

def _raises_by_sync(fn, *texts):
    """fn() or the synchronisation after it raises an error containing every text (a
    synchronous collective that already failed raises in its work.wait())."""
    try:
        try:
            fn()
        finally:
            torch.npu.synchronize()  # the stream's copy of the error, if fn() raised it
    except RuntimeError as e:
        assert all(t in str(e) for t in texts), str(e)
    else:
        raise AssertionError(f"no error containing {texts}")


def _w_mismatch(rank, world, port):
    dev = _init(rank, world, port)
    t = torch.ones(10 + rank, device=dev)
    _raises_by_sync(lambda: dist.all_reduce(t), "does not match across ranks", "10 elements", "11 elements")
    dist.destroy_process_group()


def test_mismatched_sizes_raise():
    _spawn(_w_mismatch, 2)


# ---- a rank that never arrives -------------------------------------------------------------

def _w_timeout(rank, world, port):
    import time

    dev = _init(rank, world, port)
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)  # sequence number 1: both ranks
    torch.npu.synchronize()
    if rank == 0:
        start = time.time()
        dist.all_reduce(t)  # rank 1 skips this one
        try:
            torch.npu.synchronize()
        except RuntimeError as e:
            msg = str(e)
            assert "timed out" in msg and "rank(s) 1" in msg and "allreduce" in msg, msg
            assert "sequence number 2" in msg, msg
            assert time.time() - start < 20, "took longer than HCCL_EXEC_TIMEOUT allows"
        else:
            raise AssertionError("no timeout error")
        # the communicator is aborted: later calls fail at once instead of hanging
        try:
            dist.all_reduce(t)
        except RuntimeError:
            pass
        else:
            raise AssertionError("a collective on a failed communicator did not raise")
    else:
        time.sleep(4)  # stay alive (peer present but absent from the collective)
    dist.destroy_process_group()


def test_timeout_names_rank_and_collective():
    before = _shm_segments()
    _spawn(_w_timeout, 2, env={"HCCL_EXEC_TIMEOUT": "2"})
    assert _shm_segments() == before


def _w_dead_peer(rank, world, port):
    import time

    dev = _init(rank, world, port)
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)
    torch.npu.synchronize()
    if rank == 1:
        os._exit(0)  # dies without a word
    start = time.time()
    dist.all_reduce(t)
    try:
        torch.npu.synchronize()
    except RuntimeError as e:
        assert "rank 1" in str(e) and "exited" in str(e), str(e)
        assert time.time() - start < 15, "a dead peer must be noticed long before HCCL_EXEC_TIMEOUT"
    else:
        raise AssertionError("no error for a dead peer")


def test_dead_peer_is_detected():
    _spawn(_w_dead_peer, 2, env={"HCCL_EXEC_TIMEOUT": "120"})


# ---- DDP --------------------------------------------------------------------------------

def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _assert_matches_single_process(path, world):
    """The weights rank 0 saved equal the same two steps on the whole batch in one process."""
    model = _model()
    torch.manual_seed(1)
    x = torch.randn(world * 8, 16)
    y = torch.randn(world * 8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for got, want in zip(torch.load(path), model.parameters()):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def _w_ddp(rank, world, port, result_path):
    dev = _init(rank, world, port)
    model = torch.nn.parallel.DistributedDataParallel(_model().to(dev), bucket_cap_mb=0.001)
    torch.manual_seed(1)
    x = torch.randn(world * 8, 16)
    y = torch.randn(world * 8, 4)
    xs, ys = x[rank * 8:(rank + 1) * 8].to(dev), y[rank * 8:(rank + 1) * 8].to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
    if rank == 0:
        torch.save([p.detach().cpu() for p in model.parameters()], result_path)
        times = {k: v for k, v in model._get_ddp_logging_data().items() if k.endswith("_time")}
        torch.save(times, result_path + ".times")
    dist.destroy_process_group()


def test_ddp_matches_single_process(tmp_path):
    world = 2
    path = str(tmp_path / "weights.pt")
    _spawn(_w_ddp, world, path)
    _assert_matches_single_process(path, world)
    # DDP's runtime stats come from the npu timer (torch_npu registers one for PrivateUse1)
    times = torch.load(path + ".times")
    for key in ("forward_compute_time", "backward_compute_time", "backward_comm_time",
                "avg_forward_compute_time", "avg_backward_comm_time"):
        assert times.get(key, 0) > 0, (key, times)


def _w_fsdp2(rank, world, port, result_path):
    from torch.distributed.fsdp import fully_shard

    _init(rank, world, port)
    model = _model().npu()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    torch.manual_seed(1)
    x = torch.randn(world * 8, 16)
    y = torch.randn(world * 8, 4)
    xs, ys = x[rank * 8:(rank + 1) * 8].npu(), y[rank * 8:(rank + 1) * 8].npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
    full = [p.full_tensor().cpu() for p in model.parameters()]  # a collective: every rank
    if rank == 0:
        torch.save(full, result_path)
    dist.destroy_process_group()


def test_fsdp2_matches_single_process(tmp_path):
    world = 2
    path = str(tmp_path / "weights.pt")
    _spawn(_w_fsdp2, world, path)
    _assert_matches_single_process(path, world)


# ---- small collectives on the calling thread -----------------------------------------------

def _w_small_inline(rank, world, port):
    import time

    dev = _init(rank, world, port, timeout=60)
    peer = 1 - rank
    # Many small all-reduces in a row (the path that runs on the calling thread when both
    # streams are idle), checked against the sum computed here.
    x = torch.zeros(1024, device=dev)
    for i in range(200):
        x.fill_(float(rank + i))
        dist.all_reduce(x)
        assert x[::97].cpu().eq(float(2 * i + 1)).all(), i

    # Work queued on the current stream before a small collective: the collective must
    # see its result (the current stream is busy, so the collective is queued after it).
    big = torch.ones(1 << 22, device=dev)
    t = torch.zeros(16, device=dev)
    for _ in range(3):
        big.mul_(1.0)
    t.add_(rank + 1)  # behind the big kernels
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    t.add_(1)  # after wait(): sees the reduced values
    assert t.cpu().tolist() == [float(sum(r + 1 for r in range(world)) + 1)] * 16

    # A peer that arrives late: the early rank's attempt hands the collective to the
    # communication stream and returns; the result is the same.
    t = torch.full((8,), float(rank + 1), device=dev)
    if rank == 1:
        time.sleep(0.2)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert t.cpu().tolist() == [3.0] * 8
    t2 = torch.full((8,), float(rank), device=dev)
    dist.all_reduce(t2)  # queued behind it or inline, in order
    assert t2.cpu().tolist() == [1.0] * 8

    # An async collective must not block its caller until the peers join it: rank 0 issues
    # an all_reduce, then sends to rank 1, which receives before joining the all_reduce.
    # (Blocking rank 0 in the all_reduce would deadlock.)
    a = torch.full((4,), float(rank + 1), device=dev)
    msg = torch.empty(4, device=dev)
    if rank == 0:
        w = dist.all_reduce(a, async_op=True)
        dist.send(torch.full((4,), 7.0, device=dev), dst=peer)
        w.wait()
    else:
        dist.recv(msg, src=peer)
        dist.all_reduce(a)
        assert msg.cpu().tolist() == [7.0] * 4
    assert a.cpu().tolist() == [3.0] * 4

    # Mismatched small collectives: async, the error surfaces at the next synchronisation
    # (and the group is failed: a synchronous call raises at once).
    bad = torch.ones(10 + rank, device=dev)
    dist.all_reduce(bad, async_op=True)
    try:
        torch.npu.synchronize()
    except RuntimeError as e:
        assert "does not match across ranks" in str(e), str(e)
    else:
        raise AssertionError("mismatched small all_reduce did not raise")
    _raises_by_sync(lambda: dist.all_reduce(bad), "does not match across ranks")
    dist.destroy_process_group()


def test_small_collectives_inline():
    # HCCL_EXEC_TIMEOUT: a regression that blocks the async caller fails instead of hanging.
    _spawn(_w_small_inline, 2, env={"HCCL_EXEC_TIMEOUT": "30"})


def _w_threads(rank, world, port, expect):
    _init(rank, world, port)
    startup = torch_npu.distributed._STARTUP_THREADS
    want = min(startup, max(1, len(os.sched_getaffinity(0)) // world)) if expect == "shared" else startup
    assert torch.get_num_threads() == want, (torch.get_num_threads(), want, startup)
    dist.destroy_process_group()


def test_local_ranks_share_the_cores():
    # Ranks on one host compute on the same cores: each gets its share of intra-op
    # threads unless the user chose (OMP_NUM_THREADS, as torchrun sets it).
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k == "OMP_NUM_THREADS"}
    try:
        _spawn(_w_threads, 2, "shared")
        _spawn(_w_threads, 2, "unchanged", env={"OMP_NUM_THREADS": "2"})
    finally:
        os.environ.update(saved)


def _w_profile(rank, world, port, out_dir):
    dev = _init(rank, world, port)
    big, small = torch.ones(1 << 20, device=dev), torch.ones(16, device=dev)
    handler = torch_npu.profiler.tensorboard_trace_handler(out_dir, worker_name=f"rank{rank}")
    with torch_npu.profiler.profile(activities=[torch_npu.profiler.ProfilerActivity.NPU], on_trace_ready=handler) as prof:
        dist.all_reduce(big)  # on the communication stream
        dist.all_reduce(small)  # small: maybe run inline on this thread
        (big * 2).sum()
    names = [t["name"] for t in prof.npu_tasks()]
    assert names.count("hccl:allreduce") == 2 and "aten::sum" in names, names
    assert torch.equal(small.cpu(), torch.full((16,), float(world)))
    dist.destroy_process_group()


def test_profiler_shows_communication(tmp_path):
    import csv
    import glob

    _spawn(_w_profile, 2, str(tmp_path))
    for rank in range(2):
        (path,) = glob.glob(str(tmp_path / f"rank{rank}_*_ascend_pt"))
        with open(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "step_trace_time.csv")) as f:
            (row,) = list(csv.DictReader(f))
        assert float(row["Communication"]) > 0 and float(row["Computing"]) > 0, row


# ---- coalescing ----------------------------------------------------------------------------

def _w_coalescing(rank, world, port):
    dev = _init(rank, world, port)
    ranks = range(world)
    backend = dist.group.WORLD._get_backend(torch.device("npu"))
    assert backend.supports_coalescing

    def total(n, dtype=torch.float32, salt=0):
        return sum(_value(r, n, torch.float64, salt) for r in ranks).to(dtype)

    # fast path: all_reduce -> allreduce_coalesced (small and large tensors, sync and async)
    a, b = _value(rank, 10, torch.float32).to(dev), _value(rank, 300_000, torch.float32, 1).to(dev)
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    assert torch.equal(a.cpu(), total(10)) and torch.equal(b.cpu(), total(300_000, salt=1))
    a, b = _value(rank, 10, torch.float32).to(dev), _value(rank, 20, torch.float32, 1).to(dev)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a, op=dist.ReduceOp.MAX)
        dist.all_reduce(b, op=dist.ReduceOp.MAX)
    cm.wait()
    assert torch.equal(a.cpu(), _value(world - 1, 10, torch.float32))
    assert torch.equal(b.cpu(), _value(world - 1, 20, torch.float32, 1))

    # fast path: all_gather_into_tensor / reduce_scatter_tensor, as FSDP issues them
    sizes = (5, 1000, 70_000)
    ins = [_value(rank, n, torch.bfloat16, i).to(dev) for i, n in enumerate(sizes)]
    outs = [torch.empty(n * world, dtype=torch.bfloat16, device=dev) for n in sizes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k, (o, n) in enumerate(zip(outs, sizes)):
        assert torch.equal(o.cpu(), torch.cat([_value(r, n, torch.bfloat16, k) for r in ranks]))
    bigs = [torch.cat([_value(rank, n, torch.float32, d) for d in ranks]).to(dev) for n in sizes]
    parts = [torch.empty(n, device=dev) for n in sizes]
    with dist._coalescing_manager():
        for p, big in zip(parts, bigs):
            dist.reduce_scatter_tensor(p, big)
    for p, n in zip(parts, sizes):
        assert torch.equal(p.cpu(), total(n, salt=rank))

    # device= (startCoalescing / endCoalescing): any collective inside; the block's Work
    # covers all of them, including the fast-path one issued at the end of the block
    x = torch.full((6,), float(rank * 10), device=dev)
    lst = [torch.empty(3, device=dev) for _ in ranks]
    y = torch.full((3,), float(rank + 1), device=dev)
    z = torch.full((1 << 18,), float(rank + 1), device=dev)  # large: queued on the stream
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.broadcast(x, src=world - 1)
        dist.all_gather(lst, y)
        dist.all_reduce(z)
    assert len(cm.works) == 1
    cm.wait()
    z.add_(1)  # after wait(): ordered after the block
    assert x.cpu().tolist() == [float((world - 1) * 10)] * 6
    assert [t.cpu()[0].item() for t in lst] == [float(r + 1) for r in ranks]
    assert z.cpu()[::4096].eq(float(sum(r + 1 for r in ranks) + 1)).all()
    with dist._coalescing_manager(device=dev):  # an empty block
        pass

    # all_gather_coalesced (lists of per-rank outputs)
    ins = [torch.full((2,), float(rank), device=dev), torch.full((3,), float(rank + 5), device=dev)]
    outs = [[torch.empty(2, device=dev) for _ in ranks], [torch.empty(3, device=dev) for _ in ranks]]
    dist.all_gather_coalesced(outs, ins)
    assert [o.cpu()[0].item() for o in outs[0]] == [float(r) for r in ranks]
    assert [o.cpu()[-1].item() for o in outs[1]] == [float(r + 5) for r in ranks]

    # batch_isend_irecv goes through startCoalescing/endCoalescing (supports_coalescing)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    s = torch.full((100,), float(rank), device=dev)
    r = torch.empty(100, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)])
    assert len(reqs) == 1
    reqs[0].wait()
    assert torch.equal(r.cpu(), torch.full((100,), float(prv)))

    try:
        dist.group.WORLD._end_coalescing(dev)
    except RuntimeError as e:
        assert "without startCoalescing" in str(e), str(e)
    else:
        raise AssertionError("endCoalescing without start did not raise")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_coalescing_manager(world):
    _spawn(_w_coalescing, world)


# ---- torchrun (env://) -------------------------------------------------------------------

def test_torchrun_env_init(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch_npu, torch.distributed as dist
        local = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("hccl")  # env://
        dist.barrier()  # before set_device: runs on the current device, then done
        torch.npu.set_device(local)
        t = torch.full((3,), float(dist.get_rank() + 1), device="npu")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [3.0] * 3, t
        hccl = torch_npu._C._distributed_c10d.ProcessGroupHCCL
        assert isinstance(hccl.Options(), hccl.Options)
        dist.destroy_process_group()
        print("ok", local)
    """))
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_npu.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [package_root, os.environ.get("PYTHONPATH")] if p))
    # --standalone: the rendezvous stores bind port 0 (no port to race for with other runs);
    # MASTER_ADDR 127.0.0.1 (not the host name)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1",
                          "--nproc_per_node=2", str(script)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok") == 2


def test_options_and_registration():
    opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    assert opts.is_high_priority_stream is False
    opts.hccl_config = {"hccl_buffer_size": 200, "group_name": "x"}
    assert opts.hccl_config["hccl_buffer_size"] == 200
    import datetime
    opts.op_timeout = datetime.timedelta(seconds=5)
    assert opts.op_timeout == datetime.timedelta(seconds=5)
    assert not hasattr(dist, "ProcessGroupHCCL")  # as torch_npu: only torch_npu._C._distributed_c10d's
    assert "hccl" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map.get("npu") == "hccl"
