"""HCCL across two "hosts": two Linux network namespaces joined by a veth pair (netns_hosts.py).

Each namespace runs ``torchrun --nnodes=2 --nproc_per_node=2`` (static rendezvous at
10.77.0.1). The backend tells hosts apart by their network namespace, so ranks 0, 1 share
one "host" (shared memory) and ranks 2, 3 the other; between them the collectives go over
TCP. The LLaMA example runs on both hosts with one host's losses. Needs root
(CAP_NET_ADMIN) for ``ip netns``; skipped otherwise.
A third test splits one machine into three "hosts" with TORCH_NPU_HCCL_HOST_ID (a ring of
three leaders, hosts of one rank), no namespaces needed.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

import netns_hosts
from conftest import subprocess_env
import torch_npu  # noqa: F401

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

MASTER = netns_hosts.MASTER


@pytest.fixture(scope="module")
def hosts():
    try:
        with netns_hosts.two_hosts() as ns:
            yield ns
    except netns_hosts.Unavailable as e:
        pytest.skip(str(e))


def _torchrun(ns, script, tmp_path, env=None, timeout=240):
    """Runs `script` with torchrun on both "hosts" (2 ranks each); returns [(returncode, output)] per host."""
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(script))
    return netns_hosts.torchrun_on_hosts(ns, [str(path)], 2, subprocess_env(env), timeout)


# Ranks print one line each with one write() (atomic on a pipe): lines never interleave.
SAY = """
    import os
    def say(*words):
        os.write(1, (" ".join(str(w) for w in words).replace("\\n", " ")[:4000] + "\\n").encode())
"""

COLLECTIVES = SAY + """
    import os, torch, torch_npu, torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local)
    dev = torch.device("npu", local)
    # HOST_OF (a comma list of host names by rank): make "hosts" on one machine instead.
    hosts = os.environ["HOST_OF"].split(",") if os.environ.get("HOST_OF") else None
    if hosts:
        os.environ["TORCH_NPU_HCCL_HOST_ID"] = hosts[rank]
    dist.init_process_group("hccl")
    pg = dist.group.WORLD._get_backend(dev)
    host = (lambda r: hosts[r]) if hosts else (lambda r: r // 2)  # torchrun: node k has ranks 2k, 2k + 1
    leaders = {min(r for r in range(world) if host(r) == host(q)) for q in range(world)}
    p2p_partners = {0: {2}, 2: {0, 3}, 3: {2}}.get(rank, set())  # the send/recv pairs below

    # Which transport each peer uses: shared memory on one host, TCP across.
    for peer in range(world):
        want = "self" if peer == rank else ("shm" if host(peer) == host(rank) else "tcp")
        assert pg._transport(peer) == want, (peer, pg._transport(peer), want)

    def value(r, n, dtype=torch.float32):
        return ((torch.arange(n) * 7 + r * 3) % 11 - 5).to(dtype)

    # all-reduce: sizes below, around and above the 1 MiB TCP chunk; SUM, MAX, AVG
    for n in (1, 1000, 3 * (1 << 20) // 4 + 7):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
            t = value(rank, n).to(dev)
            dist.all_reduce(t, op=op)
            vals = torch.stack([value(r, n) for r in range(world)])
            want = {dist.ReduceOp.SUM: vals.sum(0), dist.ReduceOp.MAX: vals.max(0).values,
                    dist.ReduceOp.AVG: vals.mean(0)}[op]
            torch.testing.assert_close(t.cpu(), want, msg=f"all_reduce n={n} {op}")
    t = value(rank, 5000, torch.int64).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    assert torch.equal(t.cpu(), torch.stack([value(r, 5000, torch.int64) for r in range(world)]).min(0).values)

    # all_gather (list and into one tensor)
    n = 300001
    outs = [torch.empty(n, device=dev) for _ in range(world)]
    dist.all_gather(outs, value(rank, n).to(dev))
    for r in range(world):
        assert torch.equal(outs[r].cpu(), value(r, n)), r
    flat = torch.empty(world * 1000, device=dev)
    dist.all_gather_into_tensor(flat, value(rank, 1000).to(dev))
    assert torch.equal(flat.cpu(), torch.cat([value(r, 1000) for r in range(world)]))

    # broadcast from a rank on either host
    for root in (0, 3):
        t = value(rank, 70000).to(dev)
        dist.broadcast(t, src=root)
        assert torch.equal(t.cpu(), value(root, 70000)), root

    # reduce, reduce_scatter, gather, scatter
    t = value(rank, 4096).to(dev)
    dist.reduce(t, dst=2)
    if rank == 2:
        assert torch.equal(t.cpu(), sum(value(r, 4096) for r in range(world)))
    else:
        assert torch.equal(t.cpu(), value(rank, 4096)), "reduce changed a non-root buffer"
    out = torch.empty(1000, device=dev)
    dist.reduce_scatter_tensor(out, value(rank, world * 1000).to(dev))
    assert torch.equal(out.cpu(), sum(value(r, world * 1000) for r in range(world))[rank * 1000:(rank + 1) * 1000])
    gl = [torch.empty(100, device=dev) for _ in range(world)] if rank == 1 else None
    dist.gather(value(rank, 100).to(dev), gl, dst=1)
    if rank == 1:
        assert all(torch.equal(gl[r].cpu(), value(r, 100)) for r in range(world))
    out = torch.empty(100, device=dev)
    dist.scatter(out, [value(10 + r, 100).to(dev) for r in range(world)] if rank == 2 else None, src=2)
    assert torch.equal(out.cpu(), value(10 + rank, 100))

    # all_to_all_single: even, then uneven splits (rank s sends s + d + 1 rows to rank d)
    inp = torch.arange(world * 4, dtype=torch.float32) + 100 * rank
    out = torch.empty(world * 4, device=dev)
    dist.all_to_all_single(out, inp.to(dev))
    want = torch.cat([torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32) + 100 * s for s in range(world)])
    assert torch.equal(out.cpu(), want), out
    send = [rank + d + 1 for d in range(world)]
    recv = [s + rank + 1 for s in range(world)]
    inp = torch.cat([torch.full((k, 3), float(10 * rank + d)) for d, k in enumerate(send)])
    out = torch.empty(sum(recv), 3, device=dev)
    dist.all_to_all_single(out, inp.to(dev), recv, send)
    want = torch.cat([torch.full((k, 3), float(10 * s + rank)) for s, k in enumerate(recv)])
    assert torch.equal(out.cpu(), want)

    # send/recv: across hosts (0 <-> 2) and on one host (2 <-> 3)
    if rank in (0, 2):
        peer = 2 - rank
        if rank == 0:
            dist.send(value(0, 200000).to(dev), peer)
            t = torch.empty(10, device=dev); dist.recv(t, peer)
            assert torch.equal(t.cpu(), value(2, 10))
        else:
            t = torch.empty(200000, device=dev); dist.recv(t, peer)
            assert torch.equal(t.cpu(), value(0, 200000))
            dist.send(value(2, 10).to(dev), peer)
    if rank == 2:
        dist.send(value(2, 50).to(dev), 3)
    if rank == 3:
        t = torch.empty(50, device=dev); dist.recv(t, 2)
        assert torch.equal(t.cpu(), value(2, 50))
    dist.barrier()

    # one DDP step: equal weights everywhere, equal to one process on the whole batch
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    torch.manual_seed(1)
    x, y = torch.randn(world * 8, 16), torch.randn(world * 8, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model().to(dev), bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x[rank * 8:(rank + 1) * 8].to(dev)), y[rank * 8:(rank + 1) * 8].to(dev)).backward()
    opt.step()
    mine = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    for r in range(world):
        assert torch.equal(every[r].cpu(), mine.cpu()), f"DDP weights differ between rank {rank} and {r}"
    ref = model()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ropt.zero_grad()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ropt.step()
    torch.testing.assert_close(mine.cpu(), torch.cat([p.detach().flatten() for p in ref.parameters()]),
                               rtol=1e-5, atol=1e-6)

    # TCP carried the cross-host traffic, and only that: no TCP connection to a same-host peer.
    torch.npu.synchronize()
    stats, peers = pg._tcp_stats(), pg._tcp_peers()
    assert all(host(p) != host(rank) for p in peers), peers
    if rank in leaders:  # the host leaders move their host's data
        assert stats["bytes_sent"] > 3 * (1 << 20) // 2 and stats["bytes_received"] > 3 * (1 << 20) // 2, stats
        assert set(peers) >= leaders - {rank}, peers
    else:  # the others talk to their leader in shared memory, over TCP only for their own send/recv
        assert set(peers) <= p2p_partners, peers
    dist.destroy_process_group()
    say("OK", rank, stats)
"""


def test_collectives_and_ddp_across_two_hosts(hosts, tmp_path):
    out = _torchrun(hosts, COLLECTIVES, tmp_path)
    text = "\n".join(o for _, o in out)
    assert all(rc == 0 for rc, _ in out), text
    for rank in range(4):
        assert f"OK {rank} " in text, text


def _torchrun_here(script, tmp_path, nproc, env):
    """torchrun on this machine (no namespaces); returns its CompletedProcess."""
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(script))
    env = subprocess_env(env)
    # --standalone: the rendezvous stores bind port 0 (no port to race for with other runs);
    # MASTER_ADDR 127.0.0.1 (not the host name)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1",
                           f"--nproc_per_node={nproc}", str(path)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_collectives_on_three_hosts_of_one_machine(tmp_path):
    # TORCH_NPU_HCCL_HOST_ID splits one machine into "hosts" a (ranks 0, 1), b (2) and c
    # (3): a ring of three leaders, single-rank hosts, cross-host send/recv from a leader
    # to a host of its own. No namespaces needed.
    res = _torchrun_here(COLLECTIVES, tmp_path, 4, {"HOST_OF": "a,a,b,c"})
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(4):
        assert f"OK {rank} " in res.stdout, res.stdout + res.stderr


HOSTILE = SAY + """
    import os, socket, struct, time, torch, torch_npu, torch.distributed as dist

    rank = int(os.environ["RANK"])
    os.environ["TORCH_NPU_HCCL_HOST_ID"] = f"hostile-test-{rank}"  # two "hosts": TCP between them
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    pg = dist.group.WORLD._get_backend(torch.device("npu", rank))
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.set("listener", pg._tcp_address())
    else:
        ip, port = store.get("listener").decode().rsplit(":", 1)
        group = 2166136261  # FNV-1a of the group name, as in the hello and frame headers
        for ch in dist.group.WORLD.group_name.encode():
            group = ((group ^ ch) * 16777619) % (1 << 32)
        frame = lambda kind, seq, n, dtype: struct.pack("<IIQQiI", 0x4843434C, kind, seq, n, dtype, group)
        # Garbage instead of a hello: dropped by the listener.
        with socket.create_connection((ip, int(port))) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n" + bytes(64))
        # A forged connection "from rank 0" (before the real one), announcing 1 TiB of data.
        forged = socket.create_connection((ip, int(port)))
        forged.sendall(frame(1, 0, 0, 0))  # hello: rank 0, collectives channel
        forged.sendall(frame(2, 1, 1 << 40, -1))  # a message of collective #1
        store.set("forged", "1")
    if rank == 1:
        store.wait(["forged"])
        deadline = time.time() + 60
        while pg._tcp_peers() != [0]:  # the listener took the forged connection
            assert time.time() < deadline, "the forged connection never arrived"
            time.sleep(0.01)
    t = torch.ones(4, device="npu")
    try:
        dist.all_reduce(t)
        torch.npu.synchronize()
        say("NO ERROR", rank)
    except Exception as e:
        say("RAISED", rank, e)
"""


def test_malformed_peer_raises_never_writes_out_of_bounds(tmp_path):
    # Every header is checked before any payload is read: the announced 1 TiB is refused
    # (rank 1), and rank 0's real connection, refused as a second one, makes rank 0 raise.
    res = _torchrun_here(HOSTILE, tmp_path, 2, {})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    lines = {ln.split()[1]: ln for ln in res.stdout.splitlines() if ln.startswith(("RAISED", "NO ERROR"))}
    assert lines.get("1", "").startswith("RAISED") and "rank 0" in lines["1"], out
    assert "1099511627776 bytes" in lines["1"] or "different orders" in lines["1"], lines["1"]
    assert lines.get("0", "").startswith("RAISED") and "rank 1" in lines["0"], out


DEAD_RANK = SAY + """
    import os, sys, torch, torch_npu, torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local)
    dist.init_process_group("hccl")

    # Sizes that differ between hosts are reported on every rank (on a group of its own).
    g = dist.new_group(list(range(4)))
    t = torch.ones(1001 if rank == 2 else 1000, device="npu")
    try:
        dist.all_reduce(t, group=g)
        torch.npu.synchronize()
    except Exception as e:
        say("MISMATCH", rank, e)

    t = torch.ones(1000, device="npu")
    dist.all_reduce(t)  # connections are up
    torch.npu.synchronize()
    if rank == 3:
        # Dies without a word. (Exit status 0: torchrun's agent of host 1 then lets rank 2
        # finish instead of killing it, and both agents end normally.)
        os._exit(0)
    try:
        for _ in range(3):
            dist.all_reduce(t)
        torch.npu.synchronize()
    except Exception as e:
        say("RAISED", rank, e)
        sys.exit(0)
    say("NO ERROR", rank)
"""


def test_mismatch_and_dead_remote_rank_raise(hosts, tmp_path):
    # Long execution timeout: the error must come from noticing the dead peer (its closed
    # connection, its exit), not from waiting the timeout out.
    out = _torchrun(hosts, DEAD_RANK, tmp_path, env={"HCCL_EXEC_TIMEOUT": "600"})
    text = "\n".join(o for _, o in out)
    assert all(rc == 0 for rc, _ in out), text
    for rank in (0, 1, 2):
        line = next((ln for ln in text.splitlines() if ln.startswith(f"RAISED {rank} ")), None)
        assert line is not None, text
        assert "timed out" not in line, line
        assert "allreduce" in line and "sequence number" in line, line
        assert "rank 2" in line or "rank 3" in line, line  # names the peer that failed
    for rank in range(4):
        line = next((ln for ln in text.splitlines() if ln.startswith(f"MISMATCH {rank} ")), None)
        assert line is not None, text
        assert "does not match" in line and "1001" in line and "1000" in line, line


def test_llama_example_on_two_hosts_gives_one_hosts_losses(hosts, tmp_path):
    # examples/llama_finetune/train.py with DDP over hccl: one rank on each "host" (TCP between
    # them) against two ranks on this machine (shared memory); the same global batch.
    pytest.importorskip("transformers", reason="the LLaMA example needs transformers")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "llama_finetune", "train.py")
    if not os.path.exists(script):
        pytest.skip("needs the repository's examples/")
    args = ["--steps", "4", "--batch", "2", "--parallel", "ddp"]
    out = netns_hosts.torchrun_on_hosts(hosts, [script, *args, "--losses", str(tmp_path / "two.json")], 1,
                                        subprocess_env({"OMP_NUM_THREADS": "1"}), timeout=300, cwd=str(tmp_path))
    assert all(rc == 0 for rc, _ in out), "\n".join(o for _, o in out)
    one = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          script, *args, "--losses", str(tmp_path / "one.json")], env=subprocess_env({"OMP_NUM_THREADS": "1"}),
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two, ref = (json.load(open(tmp_path / f)) for f in ("two.json", "one.json"))
    assert two["world"] == 2 and two["parallel"] == "ddp"
    assert max(abs(a - b) for a, b in zip(two["losses"], ref["losses"])) <= 1e-6, (two["losses"], ref["losses"])
