"""Runs the OpInfo conformance suite in full and writes the pass counts to docs/OPS.md.

usage (from the repository root, the pair's venv python, torch_npu importable):
    PYTHONPATH=python .venv/pt213/bin/python python/tests/ops/report.py [--write docs/OPS.md]
        [--max-samples N] [-k EXPR] [--json results.json] [--from-json results.json]

Runs test_op_conformance.py with TORCH_NPU_CONFORMANCE=full in a child process that records
every test's outcome as it goes. Should the process die (a crash in a kernel), the test it
was running is recorded as "crashed" and the run resumes after it, so one crash cannot hide
the rest. Then prints, and with --write puts into the "## Conformance" section below the keep
marker of docs/OPS.md (replacing this pair's older results, keeping other pairs'), the number
of OpInfos passing per dtype, forward and backward.
"""
import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
KEEP = "<!-- keep: everything below this line is hand-written and kept by tools/write_ops_md.py -->"
SECTION = "## Conformance"
DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
NAME = re.compile(r"::test_(forward|backward)_(.+)_npu_(" + "|".join(DTYPES) + r")$")


# ----------------------------------------------------------------------------------- child
class Recorder:
    """pytest plugin: drops already-run tests, logs each test's start and outcome (jsonl)."""

    def __init__(self, log_path, skip):
        self.log = open(log_path, "a", buffering=1)
        self.skip = skip

    def pytest_collection_modifyitems(self, session, config, items):
        items[:] = [it for it in items if it.nodeid not in self.skip]

    def pytest_runtest_logstart(self, nodeid, location):
        self.log.write(json.dumps({"start": nodeid}) + "\n")

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.passed:
            return
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "failed"
            message = report.wasxfail if report.skipped else "unexpected pass (strict xfail)"
        else:
            outcome = report.outcome
            message = ""
            if report.failed:
                message = _short(report.longreprtext)
            elif report.skipped:
                message = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        self.log.write(json.dumps({"test": report.nodeid, "when": report.when, "outcome": outcome,
                                   "message": message}) + "\n")


def _short(text: str) -> str:
    """The error line of a pytest failure report (the last 'E   ...' lines)."""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    msg = " ".join(lines[:3]) if lines else (text.strip().splitlines() or [""])[-1]
    return msg[:400]


def child(args) -> int:
    import pytest

    with open(args.skip_file) as f:
        skip = set(json.load(f))
    argv = ["-q", "-p", "no:cacheprovider", "--tb=short", "-o", "console_output_style=classic",
            os.path.join(HERE, "test_op_conformance.py")]
    if args.k:
        argv += ["-k", args.k]
    return pytest.main(argv, plugins=[Recorder(args.log, skip)])


# ---------------------------------------------------------------------------------- parent
def run_suite(args):
    """Runs the suite in child processes until every test has an outcome; returns
    {nodeid: (outcome, message)}."""
    env = dict(os.environ, TORCH_NPU_CONFORMANCE="full")
    if args.max_samples:
        env["TORCH_NPU_CONFORMANCE_MAX_SAMPLES"] = str(args.max_samples)
    results, crashed = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        skip_file = os.path.join(tmp, "skip.json")
        open(log, "w").close()
        for attempt in range(200):
            with open(skip_file, "w") as f:
                json.dump(sorted(set(results) | set(crashed)), f)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--log", log, "--skip-file", skip_file]
            if args.k:
                cmd += ["-k", args.k]
            proc = subprocess.run(cmd, cwd=os.path.dirname(HERE), env=env)
            started = None
            with open(log) as f:
                for line in f:
                    rec = json.loads(line)
                    if "start" in rec:
                        started = rec["start"]
                        continue
                    prev = results.get(rec["test"])
                    # setup/call/teardown: the worst outcome wins
                    rank = {"passed": 0, "skipped": 1, "xfailed": 2, "failed": 3}
                    if prev is None or rank[rec["outcome"]] > rank[prev[0]]:
                        results[rec["test"]] = (rec["outcome"], rec["message"])
            if proc.returncode >= 0 or started is None or started in results:
                break
            crashed[started] = f"process died (signal {-proc.returncode}) while running this test"
            print(f"*** {started}: crashed (signal {-proc.returncode}); resuming after it", flush=True)
            with open(log, "a") as f:
                f.write(json.dumps({"test": started, "when": "call", "outcome": "failed",
                                    "message": "CRASH: " + crashed[started]}) + "\n")
    return results


def summarize(results):
    """{(kind, dtype): Counter(outcome)} and the non-passing tests by kind/dtype."""
    counts = collections.defaultdict(collections.Counter)
    details = collections.defaultdict(list)
    for nodeid, (outcome, message) in sorted(results.items()):
        m = NAME.search(nodeid)
        if not m:
            continue
        kind, op, dtype = m.groups()
        counts[(kind, dtype)][outcome] += 1
        if outcome != "passed":
            details[outcome].append((op, dtype, kind, message))
    return counts, details


def render(counts, details, args, seconds) -> str:
    import torch
    import torch_npu

    pair = f"torch {torch.__version__.split('+')[0]}, CANN {torch_npu.version.cann_version}"
    lines = [f"### {pair}", "",
             f"Measured {datetime.date.today().isoformat()} by `python/tests/ops/report.py` "
             f"(TORCH_NPU_CONFORMANCE=full{', at most %d samples per test' % args.max_samples if args.max_samples else ', every sample'}"
             f"{', -k ' + args.k if args.k else ''}"
             f"{'; %.0f min on 2 cores' % (seconds / 60) if seconds else ''}{getattr(args, 'note', '')}). "
             "An OpInfo passes when every sample input (forward: also its noncontiguous twin) gives "
             "the CPU's outputs, mutated inputs and (backward) input gradients. Rate = passed / "
             "(tested - skipped); expected failures (python/tests/ops/expected_failures.py) count as "
             "not passed.", "",
             "| dtype | kind | OpInfos | passed | expected failures | failed | skipped | pass rate |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for dtype in DTYPES:
        for kind in ("forward", "backward"):
            c = counts.get((kind, dtype))
            if not c:
                continue
            total = sum(c.values())
            ran = total - c["skipped"]
            rate = f"{100.0 * c['passed'] / ran:.1f}%" if ran else "-"
            lines.append(f"| {dtype} | {kind} | {total} | {c['passed']} | {c['xfailed']} | {c['failed']} | "
                         f"{c['skipped']} | {rate} |")
    for outcome, title in (("failed", "Failures (not expected)"), ("xfailed", "Expected failures"),
                           ("skipped", "Skipped (by the OpInfo's own decorators)")):
        rows = details.get(outcome, [])
        if not rows:
            continue
        by_op = collections.defaultdict(list)
        for op, dtype, kind, message in rows:
            by_op[(op, message)].append(f"{dtype} {kind}")
        lines += ["", f"{title}: {len(rows)}", ""]
        for (op, message), where in sorted(by_op.items()):
            msg = message.replace("|", "\\|").replace("\n", " ")
            lines.append(f"- `{op}` ({', '.join(where)}): {msg}")
    return "\n".join(lines) + "\n"


def write(path, pair_section):
    text = open(path).read() if os.path.exists(path) else ""
    if KEEP not in text:
        text = text.rstrip("\n") + ("\n\n" if text else "") + KEEP + "\n"
    head, kept = text.split(KEEP, 1)
    pair_title = pair_section.splitlines()[0]
    if SECTION in kept:
        before, section = kept.split(SECTION, 1)
        after = ""
        nxt = re.search(r"^## ", section, flags=re.M)
        if nxt:
            section, after = section[:nxt.start()], section[nxt.start():]
        pairs = [p for p in re.split(r"(?=^### )", section, flags=re.M) if p.startswith("### ")]
        pairs = [p for p in pairs if p.splitlines()[0] != pair_title]
    else:
        before, after, pairs = kept.rstrip("\n") + "\n\n", "", []
    pairs.append(pair_section)
    pairs.sort()
    body = (SECTION + "\n\nOpInfo conformance (python/tests/ops/): npu against cpu on PyTorch's op_db.\n\n"
            + "\n".join(p.rstrip("\n") + "\n" for p in pairs))
    with open(path, "w") as f:
        f.write(head + KEEP + before + body + ("\n" + after if after else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="OPS_MD", help="update the Conformance section of this file (docs/OPS.md)")
    p.add_argument("--max-samples", type=int, default=0, help="samples per test (default: all)")
    p.add_argument("-k", help="pytest -k expression (a subset; for trying things out)")
    p.add_argument("--json", help="also write {test: [outcome, message]} here")
    p.add_argument("--from-json", metavar="JSON", help="report the results a --json run saved (no run)")
    p.add_argument("--update", metavar="JSON", help="re-run the -k subset and overlay it on the results a --json "
                                                   "run saved (after a fix; the report says so)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--skip-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.path.insert(0, HERE)
        return child(args)
    start = time.time()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        if "results" not in saved:  # an older file: {test: [outcome, message]}
            saved = {"results": saved, "seconds": None}
        results, seconds = {k: tuple(v) for k, v in saved["results"].items()}, saved["seconds"]
    elif args.update:
        if not args.k:
            p.error("--update re-runs a subset: give -k")
        with open(args.update) as f:
            saved = json.load(f)
        if "results" not in saved:  # an older file: {test: [outcome, message]}
            saved = {"results": saved, "seconds": None}
        results, seconds = {k: tuple(v) for k, v in saved["results"].items()}, saved["seconds"]
        rerun = run_suite(args)
        results.update(rerun)
        args.note = f"; then, after a fix, the {len(rerun)} tests matching `-k {args.k}` re-run and overlaid"
        args.k = None
    else:
        results = run_suite(args)
        seconds = time.time() - start
    counts, details = summarize(results)
    text = render(counts, details, args, seconds)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "seconds": seconds}, f, indent=1, sort_keys=True)
    if args.write:
        write(args.write, text)
        print(f"wrote the Conformance section of {args.write}")
    return 1 if details.get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
