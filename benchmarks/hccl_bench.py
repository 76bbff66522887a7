"""All-reduce bus bandwidth and latency: hccl (npu tensors) vs gloo (cpu tensors), 2 ranks.

    PYTHONPATH=python .venv/pt213/bin/python benchmarks/hccl_bench.py [--sizes 4K,1M,64M]

Each backend runs in its own pair of processes, one after the other, in this run. Per size:
a few warm-up calls, then ``repeats`` timed batches (each ends with a device
synchronize / a blocking wait); the median batch gives the time per call. As in
nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n for all-reduce and
algbw * (n - 1) / n for all-gather and reduce-scatter (bytes = the full tensor). Open MPI is
measured too when ``mpirun`` and mpi4py are available (apt install openmpi-bin; pip install mpi4py).
Not part of run_all.py: it needs the whole machine for a minute.

``--ddp`` instead times a DistributedDataParallel training step of a small MLP (SGD, 2 ranks)
with hccl on npu and with gloo on cpu, and checks that both end with identical weights.

``--plot FILE.svg`` also draws bus bandwidth against message size, one panel per collective,
one line per backend (a dependency-free SVG, e.g. docs/hccl_busbw.svg).

``--tcp`` adds an ``hccl-tcp`` column: hccl with each rank made its own "host"
(TORCH_NPU_HCCL_HOST_ID set per rank), so the data goes over the TCP transport (loopback)
instead of shared memory, as between machines.

``--two-hosts`` compares one host with two: 2 ranks on this machine (shared memory) against
one rank in each of two network namespaces joined by a veth pair (python/tests/netns_hosts.py,
needs root), launched by ``torchrun --nnodes=2``: all-reduce time and bus bandwidth per size,
and the step time of examples/llama_finetune/train.py with DDP (whose losses must agree).
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"


def _parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def _fmt_size(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k:
            return f"{n // k}{unit}"
    return str(n)


def _time_batches(fn, sync, nbytes, repeats=5):
    iters = max(3, min(200, (256 << 20) // max(nbytes, 1)))
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def _worker(rank, world, port, backend, sizes, out_path):
    if backend == "hccl-tcp":
        os.environ["TORCH_NPU_HCCL_HOST_ID"] = f"bench-rank{rank}"  # every rank its own host
        backend = "hccl"
    if backend == "hccl":
        import torch_npu  # noqa: F401
        torch.npu.set_device(rank)
        device = torch.device("npu", rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _measure(rank, device, sizes, out_path, all_reduce_only=False)


def _torchrun_worker(sizes, out_path):
    """One rank started by torchrun (env:// rendezvous): hccl all-reduce timings."""
    import torch_npu  # noqa: F401
    local = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local)
    dist.init_process_group("hccl")
    _measure(dist.get_rank(), torch.device("npu", local), sizes, out_path, all_reduce_only=True)


def _measure(rank, device, sizes, out_path, all_reduce_only):
    """Times the collectives on the initialised group; rank 0 writes 'op bytes seconds' lines."""
    # gloo's synchronous calls return when done
    sync = torch.npu.synchronize if device.type == "npu" else (lambda: None)
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        t = _time_batches(lambda: dist.all_reduce(x), sync, nbytes)
        rows.append(("all_reduce", nbytes, t))
        if nbytes >= (1 << 20) and not all_reduce_only:
            out = torch.empty(nbytes // 4, device=device)
            part = torch.ones(nbytes // 4 // world, device=device)
            t = _time_batches(lambda: dist.all_gather_into_tensor(out, part), sync, nbytes, repeats=3)
            rows.append(("all_gather", nbytes, t))
            t = _time_batches(lambda: dist.reduce_scatter_tensor(part, out), sync, nbytes, repeats=3)
            rows.append(("reduce_scatter", nbytes, t))
    # the slowest rank's time counts
    times = torch.tensor([r[2] for r in rows], dtype=torch.float64).to(device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out_path, "w") as f:
            for (op, n, _), t in zip(rows, times.cpu().tolist()):
                f.write(f"{op} {n} {t}\n")
    dist.destroy_process_group()


def _ddp_worker(rank, world, port, backend, steps, out_path):
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "hccl":
        import torch_npu  # noqa: F401
        torch.npu.set_device(rank)
        device, sync = torch.device("npu", rank), torch.npu.synchronize
    else:
        torch.set_num_threads(1)
        device, sync = torch.device("cpu"), (lambda: None)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)  # the same initial weights on every rank and backend
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(512, 512), torch.nn.GELU())])
    ddp = DDP(model.to(device), device_ids=[rank] if backend == "hccl" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own batches, as in training
    batches = [torch.randn(64, 512, generator=gen).to(device) for _ in range(steps + 3)]

    def step(x):
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()

    for x in batches[:3]:
        step(x)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for x in batches[3:]:
        step(x)
    sync()
    elapsed = torch.tensor([(time.perf_counter() - t0) / steps], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        torch.save({"t": elapsed.item(), "state": {k: v.cpu() for k, v in model.state_dict().items()}}, out_path)
    dist.destroy_process_group()


def run_ddp(steps=30):
    """(seconds per step for hccl, for gloo, largest weight difference between them)."""
    results = {}
    for backend in ("hccl", "gloo"):
        with tempfile.NamedTemporaryFile(suffix=".pt", delete=False) as f:
            path = f.name
        try:
            mp.spawn(_ddp_worker, args=(WORLD, _free_port(), backend, steps, path), nprocs=WORLD, join=True)
            results[backend] = torch.load(path)
        finally:
            os.unlink(path)
    diff = max((results["hccl"]["state"][k] - results["gloo"]["state"][k]).abs().max().item()
               for k in results["gloo"]["state"])
    return results["hccl"]["t"], results["gloo"]["t"], diff


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(backend, sizes):
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as f:
        path = f.name
    try:
        mp.spawn(_worker, args=(WORLD, _free_port(), backend, sizes, path), nprocs=WORLD, join=True)
        with open(path) as f:
            return {(op, int(n)): float(t) for op, n, t in (line.split() for line in f)}
    finally:
        os.unlink(path)


MPI_SCRIPT = r"""
import sys, time, statistics, numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
for n in map(int, sys.argv[1:]):
    x = np.ones(n // 4, np.float32); y = np.empty_like(x)
    iters = max(3, min(200, (256 << 20) // n)); ts = []
    for _ in range(3): comm.Allreduce(x, y)
    for _ in range(5):
        comm.Barrier(); t0 = time.perf_counter()
        for _ in range(iters): comm.Allreduce(x, y)
        ts.append((time.perf_counter() - t0) / iters)
    t = comm.allreduce(statistics.median(ts), op=MPI.MAX)
    if comm.rank == 0: print("all_reduce", n, t, flush=True)
"""


def _run_mpi(sizes):
    if not shutil.which("mpirun"):
        return None, "mpirun not found"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None, "mpi4py not installed"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(MPI_SCRIPT)
    try:
        # Open MPI refuses to start as root unless told (containers and CI machines run as root).
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        res = subprocess.run(["mpirun", *root, "--oversubscribe", "-np", str(WORLD), sys.executable, f.name]
                             + [str(n) for n in sizes], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            return None, "mpirun failed: " + res.stderr.strip()[-300:]
        return {("all_reduce", int(n)): float(t) for _, n, t in (l.split() for l in res.stdout.split("\n") if l)}, ""
    finally:
        os.unlink(f.name)


def _busbw(op, nbytes, t):
    factor = 2 * (WORLD - 1) / WORLD if op == "all_reduce" else (WORLD - 1) / WORLD
    return nbytes / t * factor / 1e9


COLORS = {"hccl": "#c0392b", "gloo": "#2c7fb8", "hccl-tcp": "#e67e22", "mpi": "#27ae60"}


def write_plot(path, results):
    """busbw (GB/s, linear) against size (log2) per collective, one polyline per backend."""
    ops = list(dict.fromkeys(op for op, _ in results["hccl"]))
    sizes = sorted({n for _, n in results["hccl"]})
    w, h, pad = 360, 240, 46
    top = max(_busbw(op, n, t) for r in results.values() for (op, n), t in r.items() if t) * 1.1
    x = lambda n: pad + (w - 2 * pad + 20) * (sizes.index(n) / max(len(sizes) - 1, 1))  # noqa: E731
    y = lambda v: h - pad + 10 - (h - pad - 10) * v / top  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(ops)}" height="{h + 30}" '
             f'font-family="sans-serif" font-size="11">']
    for i, op in enumerate(ops):
        parts.append(f'<g transform="translate({i * w},0)"><text x="{w / 2}" y="14" text-anchor="middle" '
                     f'font-weight="bold">{op} busbw (GB/s), {WORLD} ranks</text>')
        parts.append(f'<line x1="{pad}" y1="{y(0)}" x2="{w - pad + 20}" y2="{y(0)}" stroke="#444"/>'
                     f'<line x1="{pad}" y1="{y(0)}" x2="{pad}" y2="{y(top)}" stroke="#444"/>')
        for k in range(5):
            v = top * k / 4
            parts.append(f'<text x="{pad - 4}" y="{y(v) + 4}" text-anchor="end">{v:.1f}</text>')
        for n in sizes:
            parts.append(f'<text x="{x(n)}" y="{y(0) + 14}" text-anchor="middle">{_fmt_size(n)}</text>')
        for name, r in results.items():
            pts = [(x(n), y(_busbw(op, n, r[(op, n)]))) for n in sizes if r.get((op, n))]
            if pts:
                parts.append(f'<polyline fill="none" stroke="{COLORS.get(name, "#000")}" stroke-width="2" '
                             f'points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>')
        parts.append("</g>")
    for j, name in enumerate(results):
        parts.append(f'<rect x="{pad + j * 90}" y="{h + 12}" width="12" height="4" fill="{COLORS.get(name, "#000")}"/>'
                     f'<text x="{pad + j * 90 + 16}" y="{h + 18}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def run_two_hosts(sizes, steps=20):
    """One host (2 ranks, shared memory) vs two hosts (1 rank each, TCP over a veth pair)."""
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "python", "tests"))
    import netns_hosts

    import torch_npu
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in [os.path.dirname(os.path.dirname(os.path.abspath(torch_npu.__file__))),
                    os.environ.get("PYTHONPATH")] if p))
    train = os.path.join(root, "examples", "llama_finetune", "train.py")
    bench = ["--worker", "--sizes", ",".join(str(n) for n in sizes), "--out"]
    example = ["--steps", str(steps), "--batch", "2", "--parallel", "ddp", "--losses"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp, netns_hosts.two_hosts() as ns:
        def here(argv):
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            *argv], env=env, cwd=tmp, check=True, capture_output=True)

        def hosts(argv):
            out = netns_hosts.torchrun_on_hosts(ns, argv, 1, env, timeout=600, cwd=tmp)
            if any(rc != 0 for rc, _ in out):
                raise RuntimeError("two-host run failed:\n" + "\n".join(o[-3000:] for _, o in out))

        for name, launch in (("1 host", here), ("2 hosts", hosts)):
            path = os.path.join(tmp, name.replace(" ", "_"))
            launch([os.path.abspath(__file__), *bench, path + ".txt"])
            launch([train, *example, path + ".json"])
            with open(path + ".txt") as f:
                timings = {int(n): float(t) for _, n, t in (line.split() for line in f)}
            with open(path + ".json") as f:
                run = json.load(f)
            results[name] = (timings, run)
    (one, one_run), (two, two_run) = results["1 host"], results["2 hosts"]
    diff = max(abs(a - b) for a, b in zip(one_run["losses"], two_run["losses"]))
    print(f"\n{WORLD} ranks: one host (shared memory) vs two hosts (network namespaces, TCP over veth); "
          f"all-reduce float32, time per call (us) and bus bandwidth (GB/s)")
    print(f"{'size':>6}{'1 host us':>12}{'1 host GB/s':>13}{'2 hosts us':>12}{'2 hosts GB/s':>14}")
    for n in sizes:
        print(f"{_fmt_size(n):>6}{one[n] * 1e6:>12.1f}{_busbw('all_reduce', n, one[n]):>13.2f}"
              f"{two[n] * 1e6:>12.1f}{_busbw('all_reduce', n, two[n]):>14.2f}")
    step = {k: statistics.median(r["step_seconds"][3:]) for k, r in (("1", one_run), ("2", two_run))}
    print(f"\nLLaMA example (tiny, DDP, batch 2 per rank, {steps} steps, median of steps 4-{steps}): "
          f"1 host {step['1'] * 1e3:.1f} ms/step, 2 hosts {step['2'] * 1e3:.1f} ms/step "
          f"({step['2'] / step['1']:.2f}x); largest loss difference {diff:g}")


def main():
    if "--worker" in sys.argv:  # a rank under torchrun (--two-hosts)
        worker = argparse.ArgumentParser()
        worker.add_argument("--worker", action="store_true")
        worker.add_argument("--sizes", required=True)
        worker.add_argument("--out", required=True)
        args = worker.parse_args()
        _torchrun_worker([int(n) for n in args.sizes.split(",")], args.out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--tcp", action="store_true", help="also hccl over its TCP transport")
    parser.add_argument("--plot", metavar="SVG", help="also write a bus-bandwidth plot here")
    parser.add_argument("--ddp", action="store_true", help="time a DDP training step instead (hccl vs gloo)")
    parser.add_argument("--two-hosts", action="store_true",
                        help="one host vs two (network namespaces, needs root): all-reduce and the LLaMA example")
    args = parser.parse_args()
    if args.two_hosts:
        run_two_hosts([_parse_size(s) for s in (args.sizes if args.sizes != DEFAULT_SIZES else "64K,1M,16M")
                       .split(",")])
        return
    if args.ddp:
        hccl, gloo, diff = run_ddp()
        print(f"DDP step, 4x Linear(512)+GELU, batch 64 per rank, SGD, {WORLD} ranks: hccl {hccl * 1e3:.2f} ms, "
              f"gloo {gloo * 1e3:.2f} ms, hccl/gloo {hccl / gloo:.2f}; largest weight difference {diff:g}")
        return
    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    results = {"hccl": _run("hccl", sizes), "gloo": _run("gloo", sizes)}
    if args.tcp:
        results["hccl-tcp"] = _run("hccl-tcp", sizes)
    mpi, why = _run_mpi(sizes)
    if mpi is not None:
        results["mpi"] = mpi
    names = list(results)
    print(f"\n{WORLD} ranks, float32, time per call (us) and bus bandwidth (GB/s); hccl on npu tensors, "
          f"gloo on cpu tensors" + ("" if mpi is not None else f"; Open MPI not measured ({why})"))
    header = f"{'collective':<15}{'size':>6}" + "".join(f"{n + ' us':>14}{n + ' GB/s':>14}" for n in names)
    header += f"{'busbw x gloo':>14}"
    print(header)
    print("-" * len(header))
    for key in results["hccl"]:
        op, n = key
        line = f"{op:<15}{_fmt_size(n):>6}"
        for name in names:
            t = results[name].get(key)
            line += f"{t * 1e6:>14.1f}{_busbw(op, n, t):>14.2f}" if t else f"{'-':>14}{'-':>14}"
        line += f"{results['gloo'][key] / results['hccl'][key]:>14.1f}"
        print(line)
    if args.plot:
        write_plot(args.plot, results)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
