"""torch_npu's own distributed API on the hccl backend, as Huawei's test/distributed uses it:
integer ReduceOp.AVG, PREMUL_SUM (torch_npu.distributed._make_hccl_premul_sum),
get_hccl_comm_name, the stream-id queries, hccl_config checks, the uneven all-gather /
reduce-scatter, _group_start/_group_end.
Multi-process, with test_hccl.py's helpers; every expected value is computed here.
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu  # noqa: F401
from test_hccl import _init, _raises_by_sync, _spawn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def _ints(rank, n, dtype):
    """Values whose sum over the ranks is not a multiple of the world size (so truncation shows)."""
    base = torch.arange(n, dtype=torch.int64) % 7 + rank * 3
    if dtype != torch.uint8:
        base = base - 5  # negative values too: AVG truncates toward zero, as C division does
    return base.to(dtype)


def _w_avg_premul(rank, world, port):
    dev = _init(rank, world, port)
    ranks = range(world)
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.int8):
        for n in (5, 70_001):  # one-shot and two-shot all-reduce
            t = _ints(rank, n, dtype).to(dev)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            total = sum(_ints(r, n, dtype).long() for r in ranks)
            want = torch.div(total, world, rounding_mode="trunc").to(dtype)
            assert torch.equal(t.cpu(), want), (dtype, n)
    out = torch.empty(4, dtype=torch.int32, device=dev)
    dist.reduce_scatter_tensor(out, _ints(rank, 4 * world, torch.int32).to(dev), op=dist.ReduceOp.AVG)
    total = sum(_ints(r, 4 * world, torch.int64) for r in ranks)
    want = torch.div(total, world, rounding_mode="trunc").to(torch.int32)
    assert torch.equal(out.cpu(), want[4 * rank:4 * rank + 4])

    def vals(r, n):
        return torch.arange(n, dtype=torch.float32) * 0.5 + r

    total = sum(vals(r, 6 * world) for r in ranks)
    for factor in (2.5, torch.tensor([0.25], device=dev)):
        op = torch_npu.distributed._make_hccl_premul_sum(factor)
        f = float(factor) if isinstance(factor, float) else factor.item()
        for dtype in (torch.float32, torch.bfloat16):
            t = vals(rank, 6 * world).to(dtype).to(dev)
            dist.all_reduce(t, op=op)
            ref = (sum(vals(r, 6 * world).to(dtype).float() * f for r in ranks)).to(dtype)
            torch.testing.assert_close(t.cpu(), ref, rtol=1e-2, atol=1e-2)
        src = vals(rank, 6 * world).to(dev)
        out = torch.empty(6, device=dev)
        dist.reduce_scatter_tensor(out, src, op=op)
        torch.testing.assert_close(out.cpu(), (total * f)[6 * rank:6 * rank + 6])
        assert torch.equal(src.cpu(), vals(rank, 6 * world)), "PREMUL_SUM must not change the input"
        outs = torch.empty(6, device=dev)
        dist.reduce_scatter(outs, list(src.chunk(world)), op=op)
        torch.testing.assert_close(outs.cpu(), (total * f)[6 * rank:6 * rank + 6])
        t = vals(rank, 6 * world).to(dev)
        dist.reduce(t, dst=1, op=op)
        if rank == 1:
            torch.testing.assert_close(t.cpu(), total * f)
        else:
            assert torch.equal(t.cpu(), vals(rank, 6 * world)), "a non-root's tensor must stay as it was"
    # Tensors in a tiled format (FRACTAL_NZ: padded, permuted storage): all-reduce and
    # broadcast run on the whole storage, as torch_npu; a view at an offset is refused.
    def nz_vals(r):
        return torch.arange(2 * 3 * 17, dtype=torch.float32).reshape(2, 3, 17) * 0.5 + r

    t = torch_npu.npu_format_cast(nz_vals(rank).to(dev), 29)
    assert torch_npu.get_npu_format(t) == 29
    assert t.untyped_storage().nbytes() > t.numel() * 4  # really padded
    dist.all_reduce(t)
    torch.testing.assert_close(t.cpu(), sum(nz_vals(r) for r in ranks))
    t = torch_npu.npu_format_cast(nz_vals(rank).to(dev), 29)
    dist.broadcast(t, src=1)
    torch.testing.assert_close(t.cpu(), nz_vals(1))
    # Collectives placing parts (all-gather, reduce-scatter, all-to-all) see logical values.
    nz_in = torch_npu.npu_format_cast(nz_vals(rank).to(dev), 29)
    gathered = torch_npu.npu_format_cast(torch.zeros(2 * world, 3, 17, device=dev), 29)
    dist.all_gather_into_tensor(gathered, nz_in)
    assert torch_npu.get_npu_format(gathered) == 29
    torch.testing.assert_close(gathered.cpu(), torch.cat([nz_vals(r) for r in ranks]))
    outs = [torch.zeros(2, 3, 17, device=dev) for _ in ranks]
    dist.all_gather(outs, nz_in)
    for r in ranks:
        torch.testing.assert_close(outs[r].cpu(), nz_vals(r))
    part = torch_npu.npu_format_cast(torch.zeros(2, 3, 17, device=dev), 29)
    dist.reduce_scatter_tensor(part, torch.cat([nz_vals(rank)] * world).to(dev))
    torch.testing.assert_close(part.cpu(), sum(nz_vals(r) for r in ranks))
    big = torch_npu.npu_format_cast(torch.ones(4, 16, 16, device=dev), 29)
    for fn in (lambda: dist.all_reduce(big[2:]),
               lambda: dist.all_gather_into_tensor(torch.empty(4, 16, 16, device=dev), big[2:])):
        _raises_by_sync(fn, "storage_offset must be 0")

    _raises_by_sync(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32, device=dev),
                                            op=torch_npu.distributed._make_hccl_premul_sum(2.0)),
                    "PREMUL_SUM needs floating point")
    dist.barrier()
    dist.destroy_process_group()


def test_integer_avg_and_premul_sum():
    _spawn(_w_avg_premul, 2)


def _w_comm_name_streams(rank, world, port):
    dev = _init(rank, world, port)
    backend = dist.group.WORLD._get_backend(torch.device("npu"))
    assert backend._get_stream_id(False, -1) == -1  # nothing made yet
    sid = backend.get_coll_stream_id(dev)
    assert sid != -1 and backend.get_coll_stream_id(dev) == sid
    stream = torch.npu.Stream(stream_id=sid, device_type=20, device_index=dev.index)
    t = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    stream.synchronize()  # the collective ran on that stream
    assert t.cpu().tolist() == [3.0] * 3
    assert backend._get_stream_id(False, -1) == sid

    assert backend.get_p2p_stream_id(dev, 1 - rank, False) == -1
    x = torch.full((4,), float(rank), device=dev)
    if rank == 0:
        dist.send(x, 1)
        assert backend.get_p2p_stream_id(dev, 1, False) not in (-1, sid)
    else:
        dist.recv(x, 0)
        assert x.cpu().tolist() == [0.0] * 4
    assert backend._get_stream_id(True, 1 - rank) not in (-1, sid)  # the receiving rank's too

    # batch_isend_irecv with every rank, itself included (receive listed before the send),
    # and p2p between tensors of different storage formats (values travel in logical layout).
    ops, recvs = [], []
    for peer in range(world):
        recvs.append(torch.full((peer + 1, 3), -1.0, device=dev))
        ops.append(dist.P2POp(dist.irecv, recvs[-1], peer))
        ops.append(dist.P2POp(dist.isend, torch.full((rank + 1, 3), float(10 * rank + peer), device=dev), peer))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for peer in range(world):
        assert torch.equal(recvs[peer].cpu(), torch.full((peer + 1, 3), float(10 * peer + rank))), peer
    vals = torch.arange(3 * 20, dtype=torch.float32).reshape(3, 20)
    if rank == 0:
        dist.send(vals.to(dev), 1)  # ND into FRACTAL_NZ
        dist.send(torch_npu.npu_format_cast(vals.to(dev), 29), 1)  # FRACTAL_NZ into ND
    else:
        nz = torch_npu.npu_format_cast(torch.zeros(3, 20, device=dev), 29)
        dist.recv(nz, 0)
        assert torch_npu.get_npu_format(nz) == 29 and torch.equal(nz.cpu(), vals)
        nd = torch.zeros(3, 20, device=dev)
        dist.recv(nd, 0)
        assert torch.equal(nd.cpu(), vals)

    names = []
    for _ in range(2):
        g = dist.new_group()
        b = g._get_backend(torch.device("npu"))
        assert b.get_hccl_comm_name(rank, init_comm=False) == ""  # no collective yet
        name = b.get_hccl_comm_name(rank)
        assert name and b.get_hccl_comm_name(rank, init_comm=False) == name
        names.append(name)
        t = torch.ones(2, device=dev)
        dist.all_reduce(t, group=g)
        assert t.cpu().tolist() == [2.0, 2.0]
    assert names[0] != names[1]
    gathered = [None] * world
    dist.all_gather_object(gathered, names)
    assert gathered == [names] * world, gathered  # one communicator, one name on every rank

    backend._group_start()
    a = torch.full((5,), float(rank), device=dev)
    b = torch.full((5,), float(rank * 10), device=dev)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, async_op=True)
    backend._group_end()
    wa.wait()
    wb.wait()
    assert a.cpu().tolist() == [1.0] * 5 and b.cpu().tolist() == [10.0] * 5
    _raises_by_sync(backend._group_end, "_group_start")
    dist.destroy_process_group()


def test_comm_name_stream_ids_and_groups():
    _spawn(_w_comm_name_streams, 2)


def _w_hccl_config(rank, world, port):
    import datetime
    dev = _init(rank, world, port)
    store = dist.distributed_c10d._get_default_store()
    good = {"hccl_buffer_size": 300, "group_name": "custom", "hccl_exec_timeout": 500,
            "hccl_algo": "allreduce=level0:NA;level1:ring"}
    opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    opts.hccl_config = good
    g = dist.new_group(ranks=list(range(world)), pg_options=opts)
    opts.hccl_config = {"hccl_buffer_size": 1}  # later changes do not reach the group
    assert g._get_backend(torch.device("npu")).options.hccl_config == good
    t = torch.ones(2, device=dev)
    dist.all_reduce(t, group=g)
    assert t.cpu().tolist() == [2.0, 2.0]
    PG = torch_npu._C._distributed_c10d.ProcessGroupHCCL
    for config, text in (({"group_name": 123}, "Value type of group_name should be string"),
                         ({"hccl_exec_timeout": "1"}, "Value type of hccl_exec_timeout should be int."),
                         ({"qos_traffic_class": "1"}, "Value type of qos_traffic_class should be int."),
                         ({"hccl_exec_timeout": 2 ** 31}, "exceeds INT32_MAX(2147483647)")):
        bad = PG.Options()
        bad.hccl_config = config
        _raises_by_sync(lambda: PG(dist.PrefixStore("bad", store), rank, world, bad), text)

    # hccl_exec_timeout bounds a collective a peer never joins (1 s, not the group's 60 s).
    short = PG.Options()
    short.hccl_config = {"hccl_exec_timeout": 1}
    short._timeout = datetime.timedelta(seconds=60)
    pg = PG(dist.PrefixStore("short", store), rank, world, short)
    if rank == 0:
        t = torch.ones(2, device=dev)
        w = pg.allreduce([t])
        _raises_by_sync(w.wait, "allreduce", "1")  # the peer never comes: a timeout
    store.set(f"done{rank}", "1")
    store.wait([f"done{r}" for r in range(world)])
    dist.destroy_process_group()


def test_hccl_config_checks_and_exec_timeout():
    _spawn(_w_hccl_config, 2)


def _w_uneven(rank, world, port):
    dev = _init(rank, world, port)
    splits = [1, 3, 2][:world]
    rows = sum(splits)

    def part(r):
        return torch.arange(splits[r] * 4, dtype=torch.float32).reshape(splits[r], 4) + 100 * r

    out = torch.empty(rows, 4, device=dev)
    torch_npu.distributed.all_gather_into_tensor_uneven(out, part(rank).to(dev), output_split_sizes=splits)
    assert torch.equal(out.cpu(), torch.cat([part(r) for r in range(world)]))
    even = torch.empty(2 * world, 4, device=dev)
    torch_npu.distributed.all_gather_into_tensor_uneven(even, torch.full((2, 4), float(rank), device=dev))
    assert torch.equal(even.cpu(), torch.arange(world).float().repeat_interleave(2)[:, None].expand(-1, 4))

    def full(r):
        return torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4) * (r + 1)

    total = sum(full(r) for r in range(world))
    first = sum(splits[:rank])
    for op, ref in ((dist.ReduceOp.SUM, total), (dist.ReduceOp.AVG, total / world),
                    (dist.ReduceOp.MAX, full(world - 1))):
        src = full(rank).to(dev)
        mine = torch.empty(splits[rank], 4, device=dev)
        work = torch_npu.distributed.reduce_scatter_tensor_uneven(mine, src, input_split_sizes=splits, op=op,
                                                                  async_op=True)
        work.wait()
        torch.testing.assert_close(mine.cpu(), ref[first:first + splits[rank]])
        assert torch.equal(src.cpu(), full(rank)), "the input must stay as it was"
    _raises_by_sync(lambda: torch_npu.distributed.all_gather_into_tensor_uneven(
        out, part(rank).to(dev), output_split_sizes=[1] * world), "split sizes sum to")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_all_gather_and_reduce_scatter(world):
    _spawn(_w_uneven, world)


def _mc2_inputs(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return (torch.randn(4, 32, generator=g).half(), torch.randint(-8, 8, (4, 32), generator=g, dtype=torch.int8),
            torch.rand(4, 1, generator=g) + 0.5)


def _w_all_gather_base_mm(rank, world, port):
    dev = _init(rank, world, port)
    hcom = dist.distributed_c10d._get_default_group()._get_backend(dev).get_hccl_comm_name(rank)
    x, xq, xs = (t.to(dev) for t in _mc2_inputs(rank))
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(7)).half()
    all_x = torch.cat([_mc2_inputs(r)[0] for r in range(world)])
    out, gathered = torch_npu.npu_all_gather_base_mm(x, w.to(dev), hcom, world, bias=torch.ones(8).half().to(dev),
                                                     comm_mode="aiv")
    assert torch.equal(gathered.cpu(), all_x)
    torch.testing.assert_close(out.cpu().float(), all_x.float() @ w.float() + 1, rtol=1e-2, atol=1e-2)
    out, gathered = torch_npu.npu_all_gather_base_mm(x, w.to(dev), hcom, world, gather_output=False)
    assert out.shape == (4 * world, 8) and gathered.numel() == 0
    # quantized: int8 rows gathered with their per-token scales, x2's per-column scales
    wq = torch.randint(-8, 8, (32, 8), generator=torch.Generator().manual_seed(8), dtype=torch.int8)
    ws = torch.rand(1, 8, generator=torch.Generator().manual_seed(9)) + 0.5
    out, gathered = torch_npu.npu_all_gather_base_mm(xq, wq.to(dev), hcom, world, x1_scale=xs, x2_scale=ws.to(dev),
                                                     output_dtype=torch.float16, comm_mode="aiv")
    all_q = torch.cat([_mc2_inputs(r)[1] for r in range(world)])
    all_s = torch.cat([_mc2_inputs(r)[2] for r in range(world)])
    assert out.dtype == torch.float16 and torch.equal(gathered.cpu(), all_q)
    want = (all_q.float() @ wq.float()) * ws * all_s
    torch.testing.assert_close(out.cpu().float(), want, rtol=1e-2, atol=1e-1)
    with pytest.raises(RuntimeError, match="quantization not supported"):
        torch_npu.npu_all_gather_base_mm(xq, wq.to(dev), hcom, world, x1_scale=xs, x2_scale=ws.to(dev))
    with pytest.raises(RuntimeError, match="no hccl process group"):
        torch_npu.npu_all_gather_base_mm(x, w.to(dev), "nonexistent", world)
    with pytest.raises(RuntimeError, match="world_size should be in"):
        torch_npu.npu_all_gather_base_mm(x, w.to(dev), hcom, 3)
    dist.destroy_process_group()


def test_all_gather_base_mm():
    _spawn(_w_all_gather_base_mm, 2)


def _mm_ar_inputs(rank, shape=(4, 32), n=8):
    """Per-rank float and int8 operands of npu_mm_all_reduce_base, the same on every call."""
    g = torch.Generator().manual_seed(200 + rank)
    k = shape[-1]
    return {"x": torch.randn(*shape, generator=g), "w": torch.randn(k, n, generator=g),
            "xq": torch.randint(-8, 8, shape, generator=g, dtype=torch.int8),
            "wq": torch.randint(-8, 8, (k, n), generator=g, dtype=torch.int8)}


def _w_mm_all_reduce_base(rank, world, port):
    dev = _init(rank, world, port)
    hcom = dist.distributed_c10d._get_default_group()._get_backend(dev).get_hccl_comm_name(rank)
    mine = _mm_ar_inputs(rank)
    every = [_mm_ar_inputs(r) for r in range(world)]
    g = torch.Generator().manual_seed(5)  # operands shared by the ranks
    bias, x3 = torch.randn(8, generator=g), torch.randn(4, 8, generator=g)

    def close(out, want, dtype, tol):
        assert out.dtype == dtype and out.device == dev and out.shape == want.shape
        torch.testing.assert_close(out.cpu().float(), want, rtol=tol, atol=tol)

    # float16 / bfloat16: the sum of every rank's x1 @ x2 + bias + x3
    for dtype in (torch.float16, torch.bfloat16):
        out = torch_npu.npu_mm_all_reduce_base(mine["x"].to(dtype).to(dev), mine["w"].to(dtype).to(dev), hcom,
                                               reduce_op="sum", bias=bias.to(dtype).to(dev), x3=x3.to(dtype).to(dev))
        want = sum(e["x"].to(dtype).float() @ e["w"].to(dtype).float() + bias.to(dtype).float()
                   + x3.to(dtype).float() for e in every)
        close(out, want, dtype, 5e-2)
    # 3-D x1 [b, s, k]
    x3d = _mm_ar_inputs(rank, (2, 3, 32))["x"].half()
    out = torch_npu.npu_mm_all_reduce_base(x3d.to(dev), mine["w"].half().to(dev), hcom, comm_mode="aiv")
    want = sum(_mm_ar_inputs(r, (2, 3, 32))["x"].half().float() @ e["w"].half().float() for r, e in enumerate(every))
    close(out, want, torch.float16, 5e-2)
    # weight quantisation: x1 @ ((x2 + offset) * scale), per column, then per group of 32 rows of k
    scale, offset = torch.rand(8, generator=g) * 0.1, torch.randn(8, generator=g)
    out = torch_npu.npu_mm_all_reduce_base(mine["x"].half().to(dev), mine["wq"].to(dev), hcom,
                                           antiquant_scale=scale.half().to(dev), antiquant_offset=offset.half().to(dev))
    want = sum(e["x"].half().float() @ ((e["wq"].float() + offset.half().float()) * scale.half().float())
               for e in every)
    close(out, want, torch.float16, 5e-2)
    xk, wk = _mm_ar_inputs(rank, (4, 64))["x"].half(), _mm_ar_inputs(rank, (4, 64))["wq"]
    gscale = torch.rand(2, 8, generator=g) * 0.1  # [ceil(k / 32), n]
    out = torch_npu.npu_mm_all_reduce_base(xk.to(dev), wk.to(dev), hcom, antiquant_scale=gscale.half().to(dev),
                                           antiquant_group_size=32)
    want = sum(_mm_ar_inputs(r, (4, 64))["x"].half().float()
               @ (_mm_ar_inputs(r, (4, 64))["wq"].float() * gscale.half().float().repeat_interleave(32, 0))
               for r in range(world))
    close(out, want, torch.float16, 5e-2)
    # int8 x int8: (x1 @ x2 + int32 bias) * dequant_scale [* pertoken_scale], float16 (bfloat16 scales: bfloat16)
    dq, ibias = torch.rand(8, generator=g) * 0.01 + 0.001, torch.randint(-50, 50, (8,), generator=g, dtype=torch.int32)
    pertoken = torch.rand(4, generator=g) + 0.5
    exact = [e["xq"].long() @ e["wq"].long() + ibias.long() for e in every]
    out = torch_npu.npu_mm_all_reduce_base(mine["xq"].to(dev), mine["wq"].to(dev), hcom, bias=ibias.to(dev),
                                           dequant_scale=dq.to(dev), pertoken_scale=pertoken.to(dev))
    close(out, sum(s.double() * dq.double() * pertoken.double()[:, None] for s in exact).float(), torch.float16, 1e-2)
    out = torch_npu.npu_mm_all_reduce_base(mine["xq"].to(dev), mine["wq"].to(dev), hcom, bias=ibias.to(dev),
                                           dequant_scale=dq.bfloat16().to(dev))
    close(out, sum(s.double() * dq.bfloat16().double() for s in exact).float(), torch.bfloat16, 2e-2)
    packed = torch_npu.npu_trans_quant_param(dq.to(dev))  # int64, the float32 scale truncated to 19 bits
    out = torch_npu.npu_mm_all_reduce_base(mine["xq"].to(dev), mine["wq"].to(dev), hcom, dequant_scale=packed)
    close(out, sum((e["xq"].long() @ e["wq"].long()).double() * dq.double() for e in every).float(), torch.float16,
          1e-2)
    # int8 communication: each rank's result / s1 rounded to int8, summed, * s1 / s2 rounded to int8, * s2
    s1, s2 = torch.full((1, 8), 0.0625).half(), torch.full((1, 8), 0.125).half()
    out = torch_npu.npu_mm_all_reduce_base(mine["xq"].to(dev), mine["wq"].to(dev), hcom, dequant_scale=dq.to(dev),
                                           comm_quant_scale_1=s1.to(dev), comm_quant_scale_2=s2.to(dev))
    parts = [((e["xq"].int() @ e["wq"].int()).float() * dq).half().float() for e in every]  # each rank's float16
    q1 = sum(torch.round(p / 0.0625).clamp(-128, 127) for p in parts)
    want = torch.round(q1 * 0.5).clamp(-128, 127) * 0.125
    assert want.abs().max() > 1 and not torch.equal(want, sum(parts))  # the int8 steps show
    close(out, want, torch.float16, 0)
    # errors
    x16, w16 = mine["x"].half().to(dev), mine["w"].half().to(dev)
    with pytest.raises(RuntimeError, match="reduce_op only supports 'sum'"):
        torch_npu.npu_mm_all_reduce_base(x16, w16, hcom, reduce_op="max")
    with pytest.raises(RuntimeError, match="comm_turn only supports 0"):
        torch_npu.npu_mm_all_reduce_base(x16, w16, hcom, comm_turn=1)
    with pytest.raises(RuntimeError, match="no hccl process group"):
        torch_npu.npu_mm_all_reduce_base(x16, w16, "nonexistent")
    with pytest.raises(RuntimeError, match="K of x1 and x2 should be same"):
        torch_npu.npu_mm_all_reduce_base(x16, w16[:16], hcom)
    with pytest.raises(RuntimeError, match="x3 with shape"):
        torch_npu.npu_mm_all_reduce_base(x16, w16, hcom, x3=x3[:2].half().to(dev))
    with pytest.raises(RuntimeError, match="antiquantScale, antiquantOffset and dequantScale should all be null"):
        torch_npu.npu_mm_all_reduce_base(x16, w16, hcom, dequant_scale=dq.to(dev))
    with pytest.raises(RuntimeError, match="should both be null or not null"):
        torch_npu.npu_mm_all_reduce_base(mine["xq"].to(dev), mine["wq"].to(dev), hcom, dequant_scale=dq.to(dev),
                                         comm_quant_scale_1=s1.to(dev))
    with pytest.raises(NotImplementedError, match="Ascend950"):
        torch_npu.npu_mm_all_reduce_base(x16, w16, hcom, x1_dtype=torch.float8_e4m3fn)
    dist.destroy_process_group()


def test_mm_all_reduce_base():
    _spawn(_w_mm_all_reduce_base, 2)


def test_mm_all_reduce_base_meta_needs_no_group():
    # shapes and dtypes alone (meta tensors, FakeTensorMode, torch.compile): no process group is looked up
    x1, x2 = torch.empty(2, 3, 16, dtype=torch.float16, device="meta"), torch.empty(16, 8, dtype=torch.float16,
                                                                                  device="meta")
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, "no such group")
    assert out.shape == (2, 3, 8) and out.dtype == torch.float16 and out.device.type == "meta"
    q1, q2 = torch.empty(4, 16, dtype=torch.int8, device="meta"), torch.empty(16, 8, dtype=torch.int8, device="meta")
    out = torch_npu.npu_mm_all_reduce_base(q1, q2, "g", dequant_scale=torch.empty(8, dtype=torch.bfloat16,
                                                                                  device="meta"))
    assert out.shape == (4, 8) and out.dtype == torch.bfloat16
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        out = torch_npu.npu_mm_all_reduce_base(torch.empty(4, 16, dtype=torch.float16, device="npu"),
                                               torch.empty(16, 8, dtype=torch.float16, device="npu"), "fake group")
        assert out.shape == (4, 8) and out.device.type == "npu"


def _w_nslb(rank, world, port, folder):
    import os

    os.environ.update(NSLB_CP=folder, NSLB_MAX_RECORD_NUM="3", RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      HCCL_ALGO="level0:ring")
    dev = _init(rank, world, port)
    x = torch.ones(16, device=dev)  # 64 bytes
    for _ in range(5):  # the first 3 are recorded, the 3rd marks the end
        dist.all_reduce(x)
    dist.broadcast(x, 0)
    torch.npu.synchronize()
    dist.destroy_process_group()


def test_nslb_records_the_first_operations(tmp_path):
    folder = str(tmp_path / "nslb")
    _spawn(_w_nslb, 2, folder)
    import os

    names = sorted(os.listdir(folder))
    logs = [n for n in names if not n.startswith("end_")]
    assert len(names) == 4 and len(logs) == 2, names  # a record and an end mark per rank
    for rank in range(2):
        log = next(n for n in logs if n.endswith(f"_{rank}.log"))
        assert log.startswith("127.0.0.1_")
        with open(os.path.join(folder, log)) as f:
            assert f.read().splitlines() == ["HCCL_ALGO=level0:ring"] + [f"allreduce 64 {rank}"] * 3
