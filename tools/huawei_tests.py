#!/usr/bin/env python3
"""Runs Huawei's own test suites (Ascend/pytorch, Ascend/op-plugin) against the importable torch_npu.

Huawei's tests are the acceptance test of the drop-in claim. This script runs each test file
of the selected suites in its own pytest subprocess (with a timeout, in its own process group),
so a crash or a hang is a result and not the end of the run, and records every test's outcome.
Then it joins the outcomes with the classification data (python/tests/data/huawei_test_classes.csv)
and prints a table per suite: passed / failed / errors / skipped, and how many of the failures
(failed + errors) are

  (a) a defect of this torch_npu,
  (b) a test that needs real Ascend hardware or CANN binaries (a feature the simulator cannot have),
  (c) a test that is wrong on any device (Huawei's test bug; it fails on a real NPU as well),
  env: a package Huawei's test/requirements_*.txt pins is missing from the venv (numpy 1.x, Pillow,
       torchvision), not a property of torch_npu,
  unclassified.

The classification is data: python/tests/data/huawei_test_classes.csv, one row per failing test,
columns ``suite,test,class,root_cause,why`` where test is ``<file relative to the suite>::<Class>::<test>``
(``<file>::<collection>`` for a file that fails to import). (a) rows carry a root_cause id, so the
tables end with the (a) root causes ranked by how many tests each breaks; (b) rows say which
hardware or CANN feature the test needs. A test glob (``*``, ``?``) in the test column matches
several tests.

Nothing of Huawei's is copied into this repository: the checkouts live outside it.

    # checkouts of github:Ascend/pytorch and github:Ascend/op-plugin, outside the repository
    git clone https://github.com/Ascend/pytorch /tmp/hw/pytorch
    git clone https://github.com/Ascend/op-plugin /tmp/hw/op-plugin
    tools/dev_link.sh    # torch_npu importable from python/
    .venv/pt213/bin/python tools/huawei_tests.py --pytorch /tmp/hw/pytorch --op-plugin /tmp/hw/op-plugin \\
        --suites npu,allocator,optim --timeout 240 --out /tmp/hw/results
    .venv/pt213/bin/python tools/huawei_tests.py --out /tmp/hw/results --report        # tables only
    .venv/pt213/bin/python tools/huawei_tests.py --out /tmp/hw/results --unclassified  # rows to classify
    .venv/pt213/bin/python tools/huawei_tests.py --pytorch /tmp/hw/pytorch --suites npu --only-failed \\
        --out /tmp/hw/results                                                          # after a fix

Each file runs as ``python -m pytest <file>`` with the suite's test root as working directory
(Huawei's run_test.py runs ``python <dir>/<file>.py`` from there), TORCH_DEVICE_BACKEND_AUTOLOAD=1,
PYTHONPATH=<repo>/python, LIBRARY_PATH and LD_LIBRARY_PATH led by torch_npu/lib (where CANN's
environment has AscendCL's lib64: Huawei's C++ extension tests link -lascendcl), the
interpreter's folder first on PATH (tests start ``python`` and
``torchrun``) and a torch_npu dist-info holding the wheel's entry points (so a subprocess that only
imports torch autoloads torch_npu, as with an installed wheel). A small pytest plugin (written
into the output folder) streams
every test's outcome to a JSON-lines file as it happens, so when a file hangs or crashes the
test that was running is known: it is recorded as an error (``TIMEOUT after N s`` /
``CRASH: signal ...``) and the file is run again without the tests already done (up to
--restarts times), so one bad test does not hide the rest of its file.

Tests that fill device memory fill host memory here (simulated HBM is host RAM): the processes of
a file are killed when their memory (proportional set size) passes --mem-limit-gb (default 8), recorded as
``CRASH: killed by the host-memory guard``, rather than let the kernel's OOM killer pick a victim.

The tree's python/torch_npu holds whatever pair was built last (one bazel-bin for every pair):
``--build auto`` tests copies of the tree's builds of --pair taken as they appear (see build_path).

Results: <out>/<suite>/<file>.jsonl (one record per test) and <out>/<suite>/<file>.meta.json
(return codes, durations); --resume skips files that already have results.
"""

import argparse
import csv
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CLASSES = os.path.join(REPO, "python", "tests", "data", "huawei_test_classes.csv")

# suite name -> (checkout, path of the suite inside it, test root the files run from)
PYTORCH_SUITES = ["npu", "allocator", "profiler", "distributed", "contrib", "optim", "nn",
                  "_inductor", "dynamo"]
OP_PLUGIN_SUITES = ["test_base_ops", "test_custom_ops", "test_network_ops"]
DEFAULT_ORDER = ["npu", "allocator", "optim", "contrib", "nn", "test_base_ops", "profiler",
                 "distributed", "_inductor", "dynamo", "test_custom_ops", "test_network_ops"]

CLASS_NAMES = {"a": "defect here", "b": "needs Ascend hardware/CANN", "c": "Huawei's test wrong",
               "env": "a test requirement (Huawei's test/requirements_*.txt) missing from the venv"}

PLUGIN = r'''
"""pytest plugin of tools/huawei_tests.py: streams per-test outcomes to $HW_RESULTS (JSON lines)."""
import json
import os
import re
import time

_OUT = os.environ["HW_RESULTS"]
_SKIP = set()
if os.environ.get("HW_DESELECT") and os.path.exists(os.environ["HW_DESELECT"]):
    with open(os.environ["HW_DESELECT"]) as f:
        _SKIP = {line.rstrip("\n") for line in f if line.strip()}
_state = {}


def _emit(rec):
    with open(_OUT, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _message(report):
    try:
        text = report.longreprtext or ""
    except Exception:
        text = str(report.longrepr or "")
    if report.skipped and isinstance(report.longrepr, tuple):
        return "", str(report.longrepr[2])
    lines = text.splitlines()
    elines = [l[1:].strip() for l in lines if l.startswith("E ")]
    # the first E line names the exception (the last one of a chained traceback is usually better)
    msg = ""
    for l in elines:
        if l:
            msg = l
            break
    # prefer the last "Error:"-like E line of the final traceback
    for l in reversed(elines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Failure|Interrupt|Exit)\b", l):
            msg = l
            break
    if not msg and lines:
        msg = lines[-1].strip()
    return text[-4000:], msg[:1000]


def _newinstance_for_run_tests_files():
    """pytest makes a TestCase("runTest") to collect a class; some of Huawei's classes look their
    method up in __init__ and cannot be made so (their files run under `python <file>.py`, where
    unittest makes each instance with a test's name). Those get the name of one of their tests."""
    try:
        from _pytest.unittest import UnitTestCase
    except ImportError:
        return
    original = UnitTestCase.newinstance

    def newinstance(self):
        try:
            return original(self)
        except AttributeError:
            import unittest
            names = unittest.TestLoader().getTestCaseNames(self.obj)
            if not names:
                raise
            return self.obj(names[0])

    UnitTestCase.newinstance = newinstance


_newinstance_for_run_tests_files()


def pytest_collection_modifyitems(session, config, items):
    if not _SKIP:
        return
    keep, drop = [], []
    for it in items:
        (drop if it.nodeid in _SKIP else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collectreport(report):
    if report.failed:
        text, msg = _message(report)
        _emit({"event": "collect_error", "nodeid": report.nodeid, "msg": msg, "text": text})


def pytest_runtest_logstart(nodeid, location):
    _state[nodeid] = {"start": time.time()}
    _emit({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    st = _state.setdefault(report.nodeid, {})
    if report.when == "setup":
        st["outcome"] = "passed"
    if report.failed:
        if report.when == "call":
            st["outcome"] = "failed"
        else:
            st["outcome"] = "error" if st.get("outcome") != "failed" else "failed"
        if "msg" not in st:
            st["text"], st["msg"] = _message(report)
    elif report.skipped:
        if hasattr(report, "wasxfail"):
            st["outcome"] = "xfailed"
        else:
            st["outcome"] = "skipped"
        if "msg" not in st:
            st["text"], st["msg"] = _message(report)
    elif report.when == "call" and hasattr(report, "wasxfail"):
        st["outcome"] = "xpassed"
    if report.when == "teardown":
        rec = {"event": "result", "nodeid": report.nodeid, "outcome": st.get("outcome", "error"),
               "msg": st.get("msg", ""), "text": st.get("text", ""),
               "duration": round(time.time() - st.get("start", time.time()), 3)}
        _emit(rec)
'''

EMPTY_INI = "[pytest]\naddopts =\n"


def write_dist_info(repo, folder):
    """A torch_npu dist-info (entry points of the wheel) next to the plugin, on PYTHONPATH.

    An installed torch_npu declares the ``torch.backends`` entry point that PyTorch's device
    backend autoload (TORCH_DEVICE_BACKEND_AUTOLOAD=1) imports; Huawei's tests rely on it in
    subprocesses that only ``import torch``. Working from the tree has no dist-info: this one
    gives the same entry points (read by tools/build_wheel.py from the same sources)."""
    sys.path.insert(0, os.path.join(repo, "tools"))
    try:
        import build_wheel
        path = "torch_npu/dynamo/__init__.py"
        with open(os.path.join(repo, "python", path), "rb") as f:
            text = build_wheel.entry_points({path: f.read()})
    except Exception:  # an older/newer build_wheel: the autoload entry point is what matters
        text = "[torch.backends]\ntorch_npu = torch_npu:_autoload\n"
    finally:
        sys.path.pop(0)
    d = os.path.join(folder, "torch_npu-0+tree.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: torch_npu\nVersion: 0+tree\n")
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write(text)


def link_op_plugin_submodule(args):
    """Ascend/pytorch holds op-plugin as the submodule third_party/op-plugin, and its tests read
    files of it (test_public_bindings: op-plugin's allow-list of the exposed operators). A checkout
    without submodules has the folder empty: it becomes a link to the --op-plugin checkout."""
    if not (args.pytorch and args.op_plugin):
        return
    sub = os.path.join(args.pytorch, "third_party", "op-plugin")
    if os.path.isdir(sub) and not os.path.islink(sub) and not os.listdir(sub):
        os.rmdir(sub)
        os.symlink(os.path.abspath(args.op_plugin), sub)
        print("linked %s -> %s (the submodule was empty)" % (sub, os.path.abspath(args.op_plugin)))


def suite_paths(args):
    """[(suite, root the files run from, folder of the suite)] for the suites that exist."""
    found, missing = [], []
    wanted = args.suites.split(",") if args.suites else DEFAULT_ORDER
    for s in wanted:
        if s in PYTORCH_SUITES:
            base = args.pytorch and os.path.join(args.pytorch, "test")
        elif s in OP_PLUGIN_SUITES:
            base = args.op_plugin and os.path.join(args.op_plugin, "test")
        else:
            sys.exit("unknown suite %r (known: %s)" % (s, ", ".join(PYTORCH_SUITES + OP_PLUGIN_SUITES)))
        if base and os.path.isdir(os.path.join(base, s)):
            found.append((s, base, os.path.join(base, s)))
        else:
            missing.append(s)
    return found, missing


def test_files(folder):
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for f in sorted(filenames):
            if f.startswith("test_") and f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), folder))
    return out


def slug(rel):
    return rel.replace(os.sep, "__")


def read_jsonl(path):
    recs = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass  # a record cut by a kill
    return recs


def _tree_pair(pkg):
    """(pair, mtime of _C.so) of a torch_npu package folder, or (None, 0)."""
    try:
        with open(os.path.join(pkg, "version.py")) as f:
            m = re.search(r'^pair = "([^"]+)"', f.read(), re.M)
        return (m.group(1) if m else None), os.stat(os.path.join(pkg, "_C.so")).st_mtime
    except OSError:
        return None, 0


def build_path(args):
    """The folder put first on PYTHONPATH for the next file.

    --build tree: <repo>/python as it is (tools/dev_link.sh links the last build into it).
    --build PATH: a folder holding a torch_npu package (e.g. an unpacked wheel).
    --build auto: <repo>/python is shared with other people's builds, and a build of another
    pair links another pair's _C.so into it (Bazel has one bazel-bin for every pair). Before
    each file, when the tree holds a build of --pair newer than the last copy, the package is
    copied (symlinks resolved) to <out>/_builds/<mtime>/ and that copy is used; otherwise the
    last copy (or --build-fallback, e.g. an unpacked wheel of the pair) is used."""
    if args.build == "tree":
        return os.path.join(args.repo, "python")
    if args.build != "auto":
        return args.build
    live = os.path.join(args.repo, "python", "torch_npu")
    pair, mtime = _tree_pair(live)
    builds = os.path.join(args.out, "_builds")
    have = sorted(os.listdir(builds)) if os.path.isdir(builds) else []
    if pair == args.pair and (not have or float("%.0f" % mtime) > float(have[-1])):
        import shutil
        dest = os.path.join(builds, "%.0f" % mtime)
        tmp = dest + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(live, os.path.join(tmp, "torch_npu"), symlinks=False,
                            ignore=shutil.ignore_patterns("__pycache__"))
            if _tree_pair(os.path.join(tmp, "torch_npu"))[0] == args.pair:
                os.rename(tmp, dest)
                have.append(os.path.basename(dest))
                print("  (using a copy of the tree's %s build of %s)" % (pair, time.ctime(mtime)), flush=True)
        except (OSError, shutil.Error) as e:  # the tree changed while copying: keep the last copy
            print("  (copying the tree failed: %s)" % e, flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if have:
        return os.path.join(builds, have[-1])
    if args.build_fallback:
        return args.build_fallback
    sys.exit("--build auto: the tree holds no %s build (%s) and there is no copy; run tools/dev_link.sh"
             % (args.pair, pair))


def session_memory_gib(sid):
    """Memory of the processes of session ``sid`` in GiB: their proportional set size of
    anonymous and shared memory (the simulator's device arenas are shared memory), so pages a
    forked DataLoader worker shares with its parent, or an arena two processes map, count once."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
            if int(stat.rsplit(")", 1)[1].split()[3]) != sid:  # field 6: session id
                continue
            with open("/proc/%s/smaps_rollup" % pid) as f:
                for line in f:
                    if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                        total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / (1024.0 * 1024.0)


def run_file(args, suite, root, folder, rel, outdir, plugin_dir, ini):
    """Runs one test file (restarting after a hang/crash without the tests already done)."""
    path = os.path.join(folder, rel)
    res = os.path.join(outdir, slug(rel) + ".jsonl")
    meta_path = os.path.join(outdir, slug(rel) + ".meta.json")
    desel = os.path.join(outdir, slug(rel) + ".deselect")
    for p in (res, desel):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    env["HW_RESULTS"] = res
    env["HW_DESELECT"] = desel
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # as on an installed torch_npu: the venv's python/torchrun first on PATH (tests start
    # subprocesses with "python"), and torch_npu's entry points (autoload) visible
    env["PATH"] = os.path.dirname(args.python) + os.pathsep + env.get("PATH", "")
    bp = build_path(args)
    # the file's own folder, as sys.path[0] of Huawei's `python <file>.py` runs (test/_inductor's
    # files import their sibling testutils.py; pytest adds no folder that has an __init__.py)
    pp = [bp, plugin_dir, os.path.dirname(path)]
    if env.get("PYTHONPATH"):
        pp.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(pp)
    # as CANN's environment (set_env.sh) has AscendCL's lib64 on the library paths: tests that
    # build C++ extensions link -lascendcl; here libascendcl.so is torch_npu/lib's
    npu_lib = os.path.join(bp, "torch_npu", "lib")
    for var in ("LIBRARY_PATH", "LD_LIBRARY_PATH"):
        env[var] = os.pathsep.join(p for p in (npu_lib, env.get(var, "")) if p)
    cmd = [args.python, "-m", "pytest", path, "-q", "-p", "no:cacheprovider", "-p", "hw_stream_plugin",
           "-c", ini, "--rootdir", root, "-o", "console_output_style=classic", "--tb=short",
           "-W", "ignore::pytest.PytestCollectionWarning"]
    runs = []
    t_file = time.time()
    for attempt in range(args.restarts + 1):
        t0 = time.time()
        log_path = os.path.join(outdir, slug(rel) + ".log")
        with open(log_path, "a") as log:
            log.write("\n### attempt %d: %s\n" % (attempt, " ".join(cmd)))
            log.flush()
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            timed_out, mem_killed = False, 0.0
            deadline = t0 + args.timeout
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                used = session_memory_gib(proc.pid) if args.mem_limit_gb else 0.0
                if time.time() > deadline or used > args.mem_limit_gb > 0:
                    timed_out, mem_killed = time.time() > deadline, (used if used > args.mem_limit_gb else 0.0)
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    rc = proc.wait()
                    break
        # kill whatever the test left behind in its session (spawned workers)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        runs.append({"rc": rc, "timeout": timed_out, "seconds": round(time.time() - t0, 1),
                     "mem_killed_gib": round(mem_killed, 1)})
        recs = read_jsonl(res)
        done = {r["nodeid"] for r in recs if r["event"] == "result"}
        started = [r["nodeid"] for r in recs if r["event"] == "start"]
        culprit = next((n for n in reversed(started) if n not in done), None)
        abnormal = timed_out or rc < 0 or rc not in (0, 1, 2, 3, 4, 5)
        if not abnormal:
            break
        why = ("TIMEOUT after %d s" % args.timeout) if timed_out else (
            "CRASH: killed by the host-memory guard at %.1f GiB (--mem-limit-gb)" % mem_killed) if mem_killed else (
            "CRASH: signal %s" % signal.Signals(-rc).name if rc < 0 else "CRASH: exit code %d" % rc)
        if culprit is None:
            # no test was running: import/collection or interpreter exit hung or died
            if not done:
                with open(res, "a") as f:
                    f.write(json.dumps({"event": "result", "nodeid": rel + "::<file>", "outcome": "error",
                                        "msg": why + " (before or after the tests)", "text": ""}) + "\n")
            break
        with open(res, "a") as f:
            f.write(json.dumps({"event": "result", "nodeid": culprit, "outcome": "error",
                                "msg": why + " (while this test ran)", "text": ""}) + "\n")
        if timed_out and time.time() - t_file > args.timeout * args.file_budget:
            break
        with open(desel, "w") as f:
            for n in sorted(done | {culprit}):
                f.write(n + "\n")
    with open(meta_path, "w") as f:
        json.dump({"suite": suite, "file": rel, "runs": runs, "build": pp[0], "seconds": round(time.time() - t_file, 1)}, f)
    return runs


def load_results(out, suites=None):
    """{suite: {file::test: record}} from the output folder."""
    results = {}
    if not os.path.isdir(out):
        return results
    for suite in sorted(os.listdir(out)):
        d = os.path.join(out, suite)
        # (the folder holds the suites' results and the pytest plugin, _plugin)
        if not os.path.isdir(d) or suite not in PYTORCH_SUITES + OP_PLUGIN_SUITES or (suites and suite not in suites):
            continue
        per = results.setdefault(suite, {})
        for f in sorted(os.listdir(d)):
            if not f.endswith(".meta.json"):
                continue
            with open(os.path.join(d, f)) as fh:
                meta = json.load(fh)
            rel = meta["file"]
            for r in read_jsonl(os.path.join(d, f[:-len(".meta.json")] + ".jsonl")):
                if r["event"] == "collect_error":
                    key = rel + "::<collection>" if r["nodeid"] in ("", rel) or r["nodeid"].endswith(".py") \
                        else test_key(r["nodeid"], rel)
                    per[key] = {"outcome": "error", "msg": r["msg"], "file": rel}
                elif r["event"] == "result":
                    per[test_key(r["nodeid"], rel)] = {"outcome": r["outcome"], "msg": r.get("msg", ""),
                                                       "file": rel, "text": r.get("text", "")}
            per.setdefault("__files__", {})[rel] = meta
    return results


def test_key(nodeid, rel):
    """'file::Class::test' with the file relative to the suite folder."""
    if "::" in nodeid:
        return rel + "::" + nodeid.split("::", 1)[1]
    return nodeid if nodeid.startswith(rel) else rel + "::" + nodeid


def load_classes(path):
    exact, patterns = {}, []
    if not path or not os.path.exists(path):
        return exact, patterns
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["suite"], row["test"])
            if any(c in row["test"] for c in "*?["):
                patterns.append((row["suite"], row["test"], row))
            else:
                exact[key] = row
    return exact, patterns


def classify(suite, key, exact, patterns):
    row = exact.get((suite, key))
    if row is None:
        for s, pat, r in patterns:
            if s == suite and fnmatch.fnmatchcase(key, pat):
                return r
    return row


def tables(results, classes_path, markdown=False):
    exact, patterns = load_classes(classes_path)
    lines = []
    totals = {}
    header = ["suite", "files", "tests", "passed", "failed", "errors", "skipped", "(a)", "(b)", "(c)", "env",
              "unclassified", "timeouts/crashes", "pass rate"]
    rows = []
    causes = {}
    for suite in sorted(results, key=lambda s: DEFAULT_ORDER.index(s) if s in DEFAULT_ORDER else 99):
        per = results[suite]
        files = per.get("__files__", {})
        c = dict.fromkeys(["passed", "failed", "errors", "skipped", "a", "b", "c", "env", "unclassified", "abn"], 0)
        n = 0
        for key, r in per.items():
            if key == "__files__":
                continue
            n += 1
            o = r["outcome"]
            if o in ("passed", "xpassed"):
                c["passed"] += 1
            elif o in ("skipped", "xfailed"):
                c["skipped"] += 1
            else:
                c["failed" if o == "failed" else "errors"] += 1
                if r["msg"].startswith(("TIMEOUT", "CRASH")):
                    c["abn"] += 1
                row = classify(suite, key, exact, patterns)
                cls = row["class"] if row else "unclassified"
                if cls not in ("a", "b", "c", "env"):
                    cls = "unclassified"
                c[cls] += 1
                if cls == "a":
                    cause = row.get("root_cause") or "?"
                    causes.setdefault(cause, []).append((suite, key))
        rows.append([suite, len(files), n, c["passed"], c["failed"], c["errors"], c["skipped"], c["a"], c["b"],
                     c["c"], c["env"], c["unclassified"], c["abn"]])
        for i, v in enumerate(rows[-1][1:], 1):
            totals[i] = totals.get(i, 0) + v
    if len(rows) > 1:
        rows.append(["total"] + [totals[i] for i in range(1, len(header) - 1)])
    for r in rows:  # the measure: passed / (tests - skipped - (b) - (c) - env)
        counted = r[2] - r[6] - r[8] - r[9] - r[10]
        r.append("%.1f %%" % (100.0 * r[3] / counted) if counted else "—")
    if markdown:
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for r in rows:
            lines.append("| " + " | ".join(str(x) for x in r) + " |")
    else:
        w = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        for r in [header] + rows:
            lines.append("  ".join(str(x).rjust(w[i]) if i else str(x).ljust(w[i]) for i, x in enumerate(r)))
    return "\n".join(lines), causes


def prune_passing(out, classes_path):
    """Drop the classification rows of tests that now pass, and the ``<collection>`` rows of files
    that now import (exact rows only: a glob row may still match a failing test), so the CSV keeps
    describing failures."""
    passed = set()
    for suite, per in load_results(out).items():
        imported = {r["file"] for key, r in per.items() if key != "__files__" and not key.endswith("::<collection>")}
        passed |= {(suite, key) for key, r in per.items() if key != "__files__" and r["outcome"] == "passed"}
        passed |= {(suite, rel + "::<collection>") for rel in imported
                   if per.get(rel + "::<collection>") is None}
    with open(classes_path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    kept = [row for row in rows if (row["suite"], row["test"]) not in passed]
    with open(classes_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\r\n")
        w.writeheader()
        w.writerows(kept)
    for row in rows:
        if (row["suite"], row["test"]) in passed:
            print("passes now: %s/%s (%s)" % (row["suite"], row["test"], row["root_cause"] or row["class"]))
    print("%d of %d rows removed" % (len(rows) - len(kept), len(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pytorch", help="checkout of Ascend/pytorch")
    ap.add_argument("--op-plugin", help="checkout of Ascend/op-plugin")
    ap.add_argument("--suites", help="comma-separated suites, in run order (default: %s)" % ",".join(DEFAULT_ORDER))
    ap.add_argument("--files", help="only files matching this glob (relative to the suite folder)")
    ap.add_argument("--exclude", help="comma-separated globs of files not to run")
    ap.add_argument("--stride", type=int, default=1, help="run every stride-th file of each suite (a sample)")
    ap.add_argument("--stride-offset", type=int, default=0, help="first file of the --stride sample")
    ap.add_argument("--out", default="/tmp/hw/results", help="results folder (outside the repository)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch (default: this one)")
    ap.add_argument("--repo", default=REPO, help="torch_npu source tree (PYTHONPATH=<repo>/python)")
    ap.add_argument("--build", default="tree",
                    help="torch_npu to test: 'tree' (<repo>/python), 'auto' (copies of the tree's builds of "
                         "--pair, see build_path), or a folder holding a torch_npu package")
    ap.add_argument("--pair", default="v2.13.0-8.5.0", help="version pair of --build auto")
    ap.add_argument("--build-fallback", help="--build auto: folder with a torch_npu of --pair used until the "
                                             "tree holds one (e.g. an unpacked wheel)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per pytest run of a file")
    ap.add_argument("--restarts", type=int, default=3, help="reruns of a file after a hang or crash")
    ap.add_argument("--file-budget", type=float, default=2.0,
                    help="no restart after a timeout once a file has used this many timeouts")
    ap.add_argument("--mem-limit-gb", type=float, default=8.0,
                    help="kill a file's processes when their resident memory passes this (0: no guard); "
                         "simulated device memory is host memory, and a test that fills 64 GiB of HBM "
                         "would otherwise wake the kernel's OOM killer")
    ap.add_argument("--budget-minutes", type=float, default=0, help="start no file after this (0: no limit)")
    ap.add_argument("--resume", action="store_true", help="skip files that already have results")
    ap.add_argument("--only-failed", action="store_true",
                    help="run again only the files whose results in --out have failures or errors")
    ap.add_argument("--classes", default=DEFAULT_CLASSES, help="classification CSV")
    ap.add_argument("--report", action="store_true", help="do not run; print the tables of --out")
    ap.add_argument("--markdown", action="store_true", help="tables as markdown")
    ap.add_argument("--unclassified", action="store_true",
                    help="do not run; print the failures of --out that have no class (CSV)")
    ap.add_argument("--prune", action="store_true",
                    help="do not run; remove from --classes the exact rows of tests that passed in --out")
    args = ap.parse_args()

    if args.prune:
        prune_passing(args.out, args.classes)
        return
    if args.unclassified:
        exact, patterns = load_classes(args.classes)
        w = csv.writer(sys.stdout)
        w.writerow(["suite", "test", "outcome", "msg"])
        for suite, per in load_results(args.out).items():
            for key, r in per.items():
                if key != "__files__" and r["outcome"] in ("failed", "error") and \
                        not classify(suite, key, exact, patterns):
                    w.writerow([suite, key, r["outcome"], r["msg"][:300]])
        return
    if not args.report:
        found, missing = suite_paths(args)
        if missing:
            print("suites not in the checkouts (skipped): %s" % ", ".join(missing))
        os.makedirs(args.out, exist_ok=True)
        plugin_dir = os.path.join(args.out, "_plugin")
        os.makedirs(plugin_dir, exist_ok=True)
        with open(os.path.join(plugin_dir, "hw_stream_plugin.py"), "w") as f:
            f.write(PLUGIN)
        write_dist_info(args.repo, plugin_dir)
        link_op_plugin_submodule(args)
        ini = os.path.join(plugin_dir, "pytest.ini")
        with open(ini, "w") as f:
            f.write(EMPTY_INI)
        t_start = time.time()
        for suite, root, folder in found:
            outdir = os.path.join(args.out, suite)
            os.makedirs(outdir, exist_ok=True)
            files = test_files(folder)
            if args.files:
                files = [f for f in files if fnmatch.fnmatch(f, args.files)]
            for pat in (args.exclude.split(",") if args.exclude else []):
                files = [f for f in files if not fnmatch.fnmatch(f, pat)]
            if args.stride > 1:  # a sample spread over the suite: every stride-th file
                files = files[args.stride_offset::args.stride]
            print("== %s: %d files (%s)" % (suite, len(files), folder), flush=True)
            for rel in files:
                if args.budget_minutes and time.time() - t_start > args.budget_minutes * 60:
                    print("budget of %.0f min used: stopping" % args.budget_minutes)
                    break
                done = os.path.exists(os.path.join(outdir, slug(rel) + ".meta.json"))
                if args.resume and done:
                    continue
                if args.only_failed and (not done or not any(
                        r["event"] == "collect_error" or r.get("outcome") in ("failed", "error")
                        for r in read_jsonl(os.path.join(outdir, slug(rel) + ".jsonl")))):
                    continue
                t0 = time.time()
                runs = run_file(args, suite, root, folder, rel, outdir, plugin_dir, ini)
                recs = [r for r in read_jsonl(os.path.join(outdir, slug(rel) + ".jsonl")) if r["event"] != "start"]
                counts = {}
                for r in recs:
                    o = r.get("outcome", "error")
                    counts[o] = counts.get(o, 0) + 1
                flag = " TIMEOUT" if any(x["timeout"] for x in runs) else (
                    " CRASH" if any(x["rc"] < 0 or x["rc"] > 5 for x in runs) else "")
                print("  %-60s %5.0fs %s%s" % (rel, time.time() - t0,
                                                " ".join("%s=%d" % kv for kv in sorted(counts.items())), flag),
                      flush=True)
            else:
                continue
            break
    text, causes = tables(load_results(args.out), args.classes, markdown=args.markdown)
    print(text)
    if causes:
        print("\n(a) root causes, by tests broken:")
        for cause, tests in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            print("  %4d  %s   e.g. %s" % (len(tests), cause, tests[0][1]))


if __name__ == "__main__":
    main()
