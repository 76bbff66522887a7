#!/usr/bin/env python3
"""npu vs cpu benchmarks of torch_npu (the simulator), measured as ratios in one run.

    python benchmarks/run_all.py                      # print the table
    python benchmarks/run_all.py --write docs/BENCHMARKS.md
    python benchmarks/run_all.py --only tiny_add_,empty --modes async --scale 0.5

Each mode runs in its own subprocess, because TASK_QUEUE_ENABLE is read once per
process: ``async`` (TASK_QUEUE_ENABLE=1, the default: kernels are queued on the stream's
worker thread) and ``sync`` (TASK_QUEUE_ENABLE=0: kernels run inline on the calling
thread). Inside a subprocess every case is measured on cpu and npu alternately (see
harness.py), and the ratio is npu time / cpu time. Targets apply to the default
(async) mode; the sync rows show what asynchrony costs or saves.

More rounds follow (``--load-cases``, ``--busy``, ``--load-rounds``): the cases the asynchrony
target names (large elementwise ops, a training step) run again, async and sync subprocesses
alternated ``--load-rounds`` times, idle and while ``--busy`` processes started by this script spin
on the CPU, the normal state of a shared CI runner.

--write keeps everything from the line ``<!-- keep: ... -->`` to the end of an existing
file (hand-written analysis) and regenerates the rest.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODES = {"async": "1", "sync": "0"}  # mode -> TASK_QUEUE_ENABLE
KEEP_MARKER = "<!-- keep: everything below this line is hand-written and kept by run_all.py --write -->"
RESULT_TAG = "@@RESULT@@ "
LOAD_CASES = "add,add_,transformer"  # what the loaded pass runs by default
ASYNC_COST_TARGET = 1.05               # async / sync (normalised), idle or loaded
NO_TARGET = "—"                        # the target and met cells of a case reported without a target


# Modules of this folder with more cases (a list CASES of cases.Case), run after cases.py's.
CASE_MODULES = ["compile_bench", "graph_bench", "mlir_bench"]


def all_cases():
    import importlib

    from cases import CASES

    return list(CASES) + [c for name in CASE_MODULES for c in importlib.import_module(name).CASES]


# ---- worker (one mode, one process) ---------------------------------------------------
def worker(mode: str, only, scale: float) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch_npu

    from harness import measure, measure_cpu_only

    CASES = all_cases()

    info = {
        "mode": mode,
        "TASK_QUEUE_ENABLE": os.environ.get("TASK_QUEUE_ENABLE"),
        "task_queue_enabled": bool(torch_npu._C._npu_taskQueueEnabled()),
        "torch": torch.__version__,
        "torch_npu": torch_npu.__version__,
        "torch_npu_file": os.path.dirname(torch_npu.__file__),
        "threads": torch.get_num_threads(),
        "results": [],
    }
    selected = [c for c in CASES if not only or c.name in only]
    clean = {}
    if info["task_queue_enabled"]:
        # cpu-only pass before the first npu kernel of the process (see measure_cpu_only).
        for case in (c for c in selected if c.sides[0] == "cpu"):
            clean[case.name] = measure_cpu_only(case, scale)
            print(f"  [{mode}] {case.name:<12} cpu before any npu kernel "
                  f"{fmt_time(clean[case.name]['cpu_clean_s'], case.unit):>10}", file=sys.stderr, flush=True)
    for case in selected:
        t0 = time.perf_counter()
        r = measure(case, scale)
        r.update(clean.get(case.name, {}))
        r["wall_s"] = time.perf_counter() - t0
        info["results"].append(r)
        base, subject = case.sides
        print(f"  [{mode}] {case.name:<12} {base} {fmt_time(r['base_s'], case.unit):>10}  "
              f"{subject} {fmt_time(r['subject_s'], case.unit):>10}  ratio {r['ratio']:.2f}  ({r['wall_s']:.1f}s)",
              file=sys.stderr, flush=True)
    print(RESULT_TAG + json.dumps(info), flush=True)


# ---- parent ---------------------------------------------------------------------------
def fmt_time(seconds: float, unit: str) -> str:
    if unit == "ms":
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} us"


def start_busy(count: int):
    """`count` processes that spin on the CPU until stopped (stop_busy)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_busy(procs) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def run_mode(mode: str, args, only=None, busy: int = 0) -> dict:
    """One mode's measurements in a fresh subprocess; with `busy` spinning processes around it."""
    env = dict(os.environ)
    env["TASK_QUEUE_ENABLE"] = MODES[mode]
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--scale", str(args.scale)]
    only = only if only is not None else args.only
    if only:
        cmd += ["--only", ",".join(only)]
    print(f"== mode {mode} (TASK_QUEUE_ENABLE={MODES[mode]})" + (f", {busy} busy processes" if busy else ""),
          file=sys.stderr, flush=True)
    spinners = start_busy(busy)
    try:
        return _collect(mode, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               text=True), busy)
    finally:
        stop_busy(spinners)


def _collect(mode: str, proc, busy: int) -> dict:
    noise = Counter()
    # Progress lines go through; anything else on stderr (e.g. C++ warnings repeated
    # every step) is counted and shown once at the end.
    for line in proc.stderr:
        if line.startswith("  ["):
            sys.stderr.write(line)
            sys.stderr.flush()
        else:
            # Drop c10's "[W<date> <time> " prefix so repeats of a warning collapse.
            noise[re.sub(r"^\[W\d+ [\d:.]+ ", "[W ", line.rstrip())[:300]] += 1
    out = proc.stdout.read()
    rc = proc.wait()
    if noise:
        print(f"   worker stderr ({mode}), deduplicated:", file=sys.stderr)
        for line, count in noise.most_common(8):
            print(f"   {count:>5} x {line}", file=sys.stderr)
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            info = json.loads(line[len(RESULT_TAG):])
            info["stderr_lines"] = sum(noise.values())
            info["busy"] = busy
            return info
    raise SystemExit(f"benchmark worker for mode {mode} failed (exit code {rc})")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_state() -> str:
    """The repository commit the run measured, and whether tracked sources were modified."""
    root = os.path.dirname(HERE)
    try:
        commit = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %s"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if not commit:
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip() and not line[3:].startswith(("benchmarks/", "docs/"))]
    return f"`{commit}`" + (f", with uncommitted changes to {', '.join(changed)}" if changed else "")


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def table(runs, cases) -> str:
    head = "| benchmark | mode | baseline | measured | ratio | target | met |\n|---|---|---:|---:|---:|---:|---|\n"
    rows = []
    for case in cases:
        for info in runs:
            r = next((x for x in info["results"] if x["name"] == case.name), None)
            if r is None:
                continue
            met = {True: "yes", False: "no", None: NO_TARGET}[case.met(r["ratio"])]
            target = NO_TARGET if case.target is None else f"<= {case.target:.2f}"
            label = mode_label(info)
            base, subject = case.sides
            rows.append(f"| {case.title} | {label} | {base} {fmt_time(r['base_s'], case.unit)} | "
                        f"{subject} {fmt_time(r['subject_s'], case.unit)} | {r['ratio']:.2f} | {target} | {met} |")
    return head + "\n".join(rows) + "\n"


def mode_label(info) -> str:
    label = info["mode"] + (" (TQE=0)" if info["mode"] == "sync" else "")
    busy = info.get("busy", 0)
    return label + (f", {busy} busy processes" if busy else "")


def async_cost_table(runs, cases) -> str:
    """async / sync per case and load. A load with several rounds (async and sync subprocesses
    alternated) shows the median of the rounds' normalised costs and their range."""
    by_mode = {}
    for info in runs:
        by_mode.setdefault((info["mode"], info.get("busy", 0)), []).append({r["name"]: r for r in info["results"]})
    loads = sorted({busy for mode, busy in by_mode if ("async", busy) in by_mode and ("sync", busy) in by_mode})
    if not loads:
        return ""
    lines = ["| benchmark | load | rounds | ratio async | ratio sync | async / sync (normalised) | range | target | "
             "met | npu async | npu sync |",
             "|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|"]
    for busy in loads:
        for case in cases:
            pairs = [(a[case.name], s[case.name]) for a, s in zip(by_mode[("async", busy)], by_mode[("sync", busy)])
                     if case.name in a and case.name in s]
            if not pairs:
                continue
            costs = [a["ratio"] / s["ratio"] for a, s in pairs]
            cost = statistics.median(costs)
            a_ratio = statistics.median(a["ratio"] for a, _ in pairs)
            s_ratio = statistics.median(s["ratio"] for _, s in pairs)
            a_time = statistics.median(a["subject_s"] for a, _ in pairs)
            s_time = statistics.median(s["subject_s"] for _, s in pairs)
            spread = f"{min(costs):.2f}–{max(costs):.2f}" if len(costs) > 1 else "—"
            # Only a cpu baseline leaves the npu side as the one thing the mode changes.
            if case.sides[0] == "cpu":
                target, met = f"<= {ASYNC_COST_TARGET:.2f}", "yes" if cost <= ASYNC_COST_TARGET else "no"
            else:
                target, met = NO_TARGET, NO_TARGET
            lines.append(f"| {case.title} | {f'{busy} busy processes' if busy else 'idle'} | {len(pairs)} | "
                         f"{a_ratio:.2f} | {s_ratio:.2f} | {cost:.2f} | {spread} | {target} | {met} | "
                         f"{fmt_time(a_time, case.unit)} | {fmt_time(s_time, case.unit)} |")
    return "\n".join(lines) + "\n"


def clean_cpu_table(runs, cases) -> str:
    info = next((i for i in runs if i["mode"] == "async" and not i.get("busy")), None)
    if info is None or not any("cpu_clean_s" in r for r in info["results"]):
        return ""
    lines = ["| benchmark | cpu before any npu kernel | cpu interleaved with npu | inflation | npu async | "
             "npu async / cpu before |",
             "|---|---:|---:|---:|---:|---:|"]
    for case in cases:
        r = next((x for x in info["results"] if x["name"] == case.name), None)
        if r is None or "cpu_clean_s" not in r:
            continue
        lines.append(f"| {case.title} | {fmt_time(r['cpu_clean_s'], case.unit)} | {fmt_time(r['base_s'], case.unit)} | "
                     f"{r['base_s'] / r['cpu_clean_s']:.2f} | {fmt_time(r['subject_s'], case.unit)} | "
                     f"{r['subject_s'] / r['cpu_clean_s']:.2f} |")
    return "\n".join(lines) + "\n"


def spread_table(runs, cases) -> str:
    lines = ["| benchmark | mode | iterations x repeats | baseline min..max | measured min..max | ratio min..max |",
             "|---|---|---|---:|---:|---:|"]
    for case in cases:
        for info in runs:
            r = next((x for x in info["results"] if x["name"] == case.name), None)
            if r is None:
                continue
            lines.append(
                f"| {case.title} | {mode_label(info)} | {r['n']} x {r['repeats']} | "
                f"{fmt_time(min(r['base_all']), case.unit)} .. {fmt_time(max(r['base_all']), case.unit)} | "
                f"{fmt_time(min(r['subject_all']), case.unit)} .. {fmt_time(max(r['subject_all']), case.unit)} | "
                f"{min(r['ratios']):.2f} .. {max(r['ratios']):.2f} |")
    return "\n".join(lines) + "\n"


def idle_runs(runs):
    """The runs of the main pass (the extra rounds only feed the async-cost table)."""
    return [info for info in runs if not info.get("busy") and not info.get("extra_round")]


def markdown(runs, cases, machine, args, elapsed) -> str:
    first = runs[0]
    tqe = ", ".join(f"{i['mode']}: TASK_QUEUE_ENABLE={i['TASK_QUEUE_ENABLE']} "
                    f"(task queue {'on' if i['task_queue_enabled'] else 'off'})" for i in idle_runs(runs))
    notes = "\n".join(f"- **{c.title}**: {c.note}" for c in cases if c.note)
    return f"""# torch_npu benchmarks (simulator npu vs cpu)

Generated by `benchmarks/run_all.py` on {machine['date']} in {elapsed:.0f} s. Ratio = measured time /
baseline time, both measured in the same process with their repetitions interleaved (lower is
better; the targets apply to the default **async** mode). The baseline is the same work on cpu
tensors, or, for fused operators, their unfused composition on npu.

{table(idle_runs(runs), cases)}
## Cost of asynchrony (TASK_QUEUE_ENABLE=1 vs 0)

`async / sync (normalised)` = ratio async / ratio sync: the npu time of the async mode
over that of the sync mode, each first divided by the cpu time measured alongside it in
the same process. Below 1 the task queue helps, above 1 it costs. (The two modes run in
two subprocesses one after the other; this machine's speed changes by 2x or more from one
minute to the next, so the raw npu times of the two modes, shown for reference, are not
directly comparable.) The cases of `--load-cases` run again in `--load-rounds` more rounds
({args.load_rounds} here), idle and loaded, async and sync subprocesses alternated; their rows
show the median of the rounds' costs and their range. Rows "N busy processes" come from the
loaded rounds: the script starts N processes spinning on the CPU for the duration of each
subprocess. The target applies to cases with a cpu baseline; where the
baseline runs on npu too (fused vs unfused, compiled vs eager, graph replay vs eager), the mode
changes both sides, so the quotient shows which side gains more from the task queue rather than
what it costs (e.g. a graph replays through the stream's worker in both modes, and eager gets
faster with the queue): shown without a target.

{async_cost_table(runs, cases)}
## The cpu baseline of the async process

In the async subprocess every case is first run on cpu alone, before the process has
run any npu kernel ("cpu before"); the interleaved measurement comes afterwards. Once the
npu stream worker has run an OpenMP-parallel kernel, the process holds two OpenMP teams
(4 threads on {machine['nproc']} cores) and libgomp stops spin-waiting between parallel
regions, which also slows the cpu side of the interleaved measurement ("inflation" > 1;
see the notes below the tables). The last column compares the npu with the undisturbed cpu. It
spans ~10-60 s of this noisy machine, so it is less exact than the interleaved ratio.

{clean_cpu_table(runs, cases)}
## Machine

| | |
|---|---|
| nproc | {machine['nproc']} |
| CPU | {machine['cpu']} |
| torch | {first['torch']} (intra-op threads: {first['threads']}) |
| torch_npu | {first['torch_npu']} (from `{first['torch_npu_file']}`) |
| source | {machine['source']} |
| python | {machine['python']} |
| date | {machine['date']} |
| TASK_QUEUE_ENABLE | {tqe}; in the calling environment: {machine['tqe_env']} |
| OMP_NUM_THREADS | {machine['omp']} |
| load average (start -> end) | {machine['load_start']} -> {machine['load_end']} |

## Method

- Each mode runs in a fresh subprocess with `TASK_QUEUE_ENABLE` set (it is read once per process).
- The extra rounds (`--load-cases`, `--busy`, `--load-rounds`): the named cases again, async and sync
  subprocesses alternated `--load-rounds` times, idle and while `--busy` processes
  (`python -c "while True: pass"`) started by the script spin.
- Per case: the state is built on cpu and on npu from the same seed; garbage is collected once
  and the collector stays disabled until the case is done (as `timeit` does); each device runs
  untimed warm-up iterations; then `repeats` pairs of timed measurements, the order alternating
  (cpu, npu), (npu, cpu), ... Each measurement runs a few untimed iterations (`prewarm`, to
  bring that device's data back into the caches), then `n` timed iterations followed by
  `torch.npu.synchronize()` on npu (nothing on cpu), divided by `n`.
- Times are medians per device; the ratio is the median of the per-pair ratios (so it can
  differ slightly from the quotient of the two median times).
- In the async subprocess every case is first run on cpu alone, before any npu kernel
  (the "cpu before" table above).
- Scale factor: {args.scale} (iterations and warm-up are multiplied by it).

Spread of the individual measurements:

{spread_table(idle_runs(runs), cases)}
Case notes:

{notes}
- **tiny ops**: the host-side cost per op: `n` = 10000 enqueues (or inline runs) plus one
  final synchronize, divided by `n`.
- **torch.empty**: `torch.empty((1024,), dtype=float32, device=...)` in a loop; each result is
  freed at once, so the npu caching allocator serves the same cached block every time.

## Reproduce

```
nox -s benchmarks
# or, from the repository root with the development build:
PYTHONPATH=python .venv/pt213/bin/python benchmarks/run_all.py --write docs/BENCHMARKS.md
# subsets: --only add,matmul   --modes async   --scale 0.5 (fewer iterations)
```
"""


def write_markdown(path: str, text: str) -> None:
    kept = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        i = old.find(KEEP_MARKER)
        if i >= 0:
            kept = old[i:]
    if not kept:
        kept = KEEP_MARKER + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + kept)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="PATH", help="write the Markdown report (e.g. docs/BENCHMARKS.md)")
    p.add_argument("--modes", default="async,sync", help="comma list of: async, sync (default both)")
    p.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma list of case names to run (default all)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply iterations (default 1.0)")
    p.add_argument("--json", metavar="PATH", help="also dump the raw measurements as JSON")
    p.add_argument("--load-cases", default=LOAD_CASES,
                   help=f"comma list of cases run again under load (default {LOAD_CASES}; empty: no loaded pass)")
    p.add_argument("--busy", type=int, default=2, help="spinning processes of the loaded pass (default 2)")
    p.add_argument("--load-rounds", type=int, default=3,
                   help="loaded pass: async and sync subprocesses alternated this many times (default 3)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        worker(args.worker, args.only, args.scale)
        return

    CASES = all_cases()
    BY_NAME = {c.name: c for c in CASES}

    if args.only:
        unknown = [n for n in args.only if n not in BY_NAME]
        if unknown:
            p.error(f"unknown case(s) {unknown}; known: {[c.name for c in CASES]}")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; known: {list(MODES)}")
    cases = [c for c in CASES if not args.only or c.name in args.only]
    load_cases = [n for n in args.load_cases.split(",") if n and (not args.only or n in args.only)]
    unknown = [n for n in load_cases if n not in BY_NAME]
    if unknown:
        p.error(f"unknown --load-cases {unknown}")

    machine = {
        "nproc": nproc(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "tqe_env": os.environ.get("TASK_QUEUE_ENABLE", "unset (= 1)"),
        "omp": os.environ.get("OMP_NUM_THREADS", "unset"),
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "source": source_state(),
    }
    t0 = time.perf_counter()
    runs = [run_mode(m, args) for m in modes]
    if load_cases:
        # More rounds, idle and loaded, of the cases the asynchrony target names: one pair of
        # subprocesses is too few to tell a cost from the machine's drift between them.
        for _ in range(args.load_rounds):
            for busy in ([0, args.busy] if args.busy > 0 else [0]):
                for m in modes:
                    info = run_mode(m, args, only=load_cases, busy=busy)
                    info["extra_round"] = True
                    runs.append(info)
    elapsed = time.perf_counter() - t0
    machine["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())

    print()
    print(table(idle_runs(runs), cases))
    for extra in (async_cost_table(runs, cases), clean_cpu_table(runs, cases)):
        if extra:
            print(extra)
    print(f"({elapsed:.0f} s; torch {runs[0]['torch']}, torch_npu {runs[0]['torch_npu']}, "
          f"nproc {machine['nproc']}, load {machine['load_start']} -> {machine['load_end']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "runs": runs}, f, indent=1)
    if args.write:
        write_markdown(args.write, markdown(runs, cases, machine, args, elapsed))
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
