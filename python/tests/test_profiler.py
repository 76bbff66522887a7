"""torch_npu.profiler: host operators and npu tasks on one timeline, torch_npu's result files."""
import csv
import glob
import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torch_npu
from torch_npu.profiler import ProfilerActivity

BOTH = [ProfilerActivity.CPU, ProfilerActivity.NPU]



def _npu_block(nbytes):
    """The block torch_npu's allocator gives a request: 32 bytes more, in 512-byte steps."""
    return (nbytes + 32 + 511) // 512 * 512

def _train_steps(prof, steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64).npu()
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _result_dir(root):
    dirs = glob.glob(os.path.join(root, "*_ascend_pt"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_seed_import():
    from torch_npu import contrib, profiler  # noqa: F401  (as the seed article writes it)

    assert profiler.supported_activities() == {ProfilerActivity.CPU, ProfilerActivity.NPU}
    assert profiler.schedule(wait=1, active=1)(0) == profiler.ProfilerAction.NONE


def test_schedule_and_result_directory(tmp_path):
    with torch_npu.profiler.profile(
            activities=BOTH, schedule=torch_npu.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path), worker_name="w0"),
            record_shapes=True) as prof:
        _train_steps(prof, 5)
    path = _result_dir(tmp_path)
    assert os.path.basename(path).startswith(f"w0_{os.getpid()}_") and path.endswith("_ascend_pt")
    out = os.path.join(path, "ASCEND_PROFILER_OUTPUT")
    assert {"trace_view.json", "kernel_details.csv", "operator_details.csv", "op_statistic.csv",
            "step_trace_time.csv"} <= set(os.listdir(out))
    assert os.path.isfile(os.path.join(path, "profiler_info.json"))

    kernels = _rows(os.path.join(out, "kernel_details.csv"))
    # Only the two active steps (2 and 3) are recorded; each has the model's kernels.
    assert {k["Step Id"] for k in kernels} == {"2", "3"}
    types = [k["Type"] for k in kernels if k["Step Id"] == "2"]
    assert types.count("Addmm") == 2 and "Relu" in types or "Threshold" in types, types
    assert all(float(k["Duration(us)"]) > 0 and float(k["Wait Time(us)"]) >= 0 for k in kernels)
    shapes = [k["Input Shapes"] for k in kernels if k["Type"] == "Addmm"]
    assert "64;32,64;64,64" in shapes[0], shapes  # bias; input; weight.t()

    stats = {r["OP Type"]: r for r in _rows(os.path.join(out, "op_statistic.csv"))}
    assert int(stats["Addmm"]["Count"]) == sum(1 for k in kernels if k["Type"] == "Addmm")
    assert abs(sum(float(r["Ratio(%)"]) for r in stats.values()) - 100) < 0.1

    steps = _rows(os.path.join(out, "step_trace_time.csv"))
    assert [s["Step"] for s in steps] == ["2", "3"]
    for s in steps:
        assert float(s["Computing"]) > 0 and float(s["Communication"]) == 0
        assert float(s["Stage"]) >= float(s["Computing"])

    def device_time(name, column):
        return sum(float(r[column]) for r in _rows(os.path.join(out, "operator_details.csv")) if r["Name"] == name)

    addmm_kernels = sum(float(k["Duration(us)"]) for k in kernels if k["Type"] == "Addmm")
    assert device_time("aten::addmm", "Device Self Duration(us)") == pytest.approx(addmm_kernels, abs=0.01)
    assert device_time("aten::linear", "Device Total Duration(us)") == pytest.approx(addmm_kernels, abs=0.01)


@pytest.mark.parametrize("make_schedule", [torch_npu.profiler.schedule, torch.profiler.schedule])
def test_profile_takes_torch_npu_and_torch_schedules(make_schedule):
    # torch_npu's schedule returns torch_npu's ProfilerAction, torch's torch's: both drive profile
    ready = []
    with torch_npu.profiler.profile(activities=BOTH, schedule=make_schedule(wait=1, warmup=0, active=1, repeat=2),
                                    on_trace_ready=lambda p: ready.append(p.step_num)) as prof:
        _train_steps(prof, 6)
    assert ready == [2, 4]


@pytest.mark.parametrize("queued", [True, False])
def test_trace_links_host_ops_to_npu_tasks(tmp_path, queued):
    x = torch.randn(1024, 1024, device="npu")
    (x @ x).relu_()  # an operator's first call runs inline (it proves its dtype signature); later ones queue
    torch.npu.synchronize()
    prev = torch_npu._C._npu_set_inline(not queued)  # by default large kernels run on the caller
    try:
        with torch_npu.profiler.profile(activities=BOTH) as prof:
            y = x @ x  # large: queued on the stream, runs after the host op returned (or on the caller)
            y.relu_()
    finally:
        torch_npu._C._npu_set_inline(prev)
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    hardware = [pid for pid, name in names.items() if name.startswith("Ascend Hardware")]
    assert len(hardware) == 1
    tasks = [e for e in events if e.get("ph") == "X" and e.get("pid") == hardware[0]]
    mm = next(e for e in tasks if e["name"] == "aten::mm")
    host_mm = next(e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    # Asynchrony shows: the host op returned long before its kernel finished.
    assert (host_mm["ts"] + host_mm["dur"] < mm["ts"] + mm["dur"]) == queued
    flows = {(e["ph"], e["id"]) for e in events if e.get("cat") == "async_npu"}
    assert ("s", mm["args"]["correlation"]) in flows and ("f", mm["args"]["correlation"]) in flows
    by_op = {t["name"]: t["op"] for t in prof.npu_tasks()}
    assert by_op["aten::mm"] == "aten::mm" and by_op["aten::relu_"] in ("aten::relu_", "aten::clamp_min_")


def test_activities_select_sides(tmp_path):
    x = torch.randn(64, 64, device="npu")
    with torch_npu.profiler.profile(activities=[ProfilerActivity.NPU]) as npu_only:
        (x + 1).sum()
    events = json.load(open(npu_only.export_chrome_trace(str(tmp_path / "a.json"))))["traceEvents"]
    assert not any(e.get("cat") == "cpu_op" for e in events)
    assert any(e.get("name") == "aten::sum" and e.get("cat") == "kernel" for e in events)

    with torch_npu.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as cpu_only:
        (x + 1).sum()
    assert cpu_only.npu_tasks() == []
    assert any(e.key == "aten::sum" for e in cpu_only.key_averages())

    with pytest.raises(TypeError, match="activities"):
        torch_npu.profiler.profile(activities=["GPU"])


def test_memory_views(tmp_path):
    x = torch.randn(256, 256, device="npu")
    handler = torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))
    with torch_npu.profiler.profile(activities=BOTH, profile_memory=True, on_trace_ready=handler):
        y = x @ x  # one 256 KiB allocation by aten::mm, freed below
        del y
        z = x + 1  # still allocated at the end
    out = os.path.join(_result_dir(tmp_path), "ASCEND_PROFILER_OUTPUT")
    records = _rows(os.path.join(out, "memory_record.csv"))
    allocated = [float(r["Total Allocated(MB)"]) for r in records]
    # y's block is returned at `del y` (stream-ordered free), before z is allocated.
    drops = [a - b for a, b in zip(allocated, allocated[1:])]
    block = _npu_block(256 * 256 * 4)
    assert len(records) >= 3 and any(d == pytest.approx(block / 2**20, abs=1.5e-3) for d in drops), allocated
    # Each allocation is attributed to the innermost operator (the output's aten::empty*).
    ops = [r for r in _rows(os.path.join(out, "operator_memory.csv")) if float(r["Size(KB)"]) == block / 1024]
    assert len(ops) == 2 and all(r["Name"].startswith("aten::empty") for r in ops), ops
    freed, kept = sorted(ops, key=lambda r: r["Release Time(us)"] == "")
    assert float(freed["Duration(us)"]) >= 0 and float(freed["Release Time(us)"]) >= float(freed["Allocation Time(us)"])
    assert kept["Release Time(us)"] == ""
    del z


def test_offline_analyse(tmp_path):
    handler = torch_npu.profiler.tensorboard_trace_handler(str(tmp_path), analyse_flag=False)
    with torch_npu.profiler.profile(activities=BOTH, on_trace_ready=handler) as prof:
        _train_steps(prof, 1)
    path = _result_dir(tmp_path)
    assert not os.path.exists(os.path.join(path, "ASCEND_PROFILER_OUTPUT"))
    torch_npu.profiler.analyse(str(tmp_path))
    kernels = _rows(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))
    assert any(k["Type"] == "Addmm" for k in kernels)
    with pytest.raises(ValueError, match="profiler_path"):
        torch_npu.profiler.analyse(str(tmp_path / "missing"))


def test_experimental_config():
    cfg = torch_npu.profiler._ExperimentalConfig(profiler_level=torch_npu.profiler.ProfilerLevel.Level1,
                                                 aic_metrics=torch_npu.profiler.AiCMetrics.PipeUtilization,
                                                 export_type=[torch_npu.profiler.ExportType.Text])
    assert cfg.profiler_level == "Level1" and cfg.export_type == ["text"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bad = torch_npu.profiler._ExperimentalConfig(profiler_level="Level9", l2_cache="yes", export_type="csv")
    text = " ".join(str(w.message) for w in caught)
    assert "profiler_level" in text and "l2_cache" in text and "export_type" in text
    assert bad.profiler_level == "Level0" and bad.export_type == ["text"] and bad._l2_cache is False
    x = torch.randn(8, 8, device="npu")
    with torch_npu.profiler.profile(activities=BOTH, experimental_config=cfg, with_stack=True,
                                    profile_memory=True) as prof:
        (x * 2).sum()
    assert any(t["type"] == "Sum" for t in prof.npu_tasks())


def test_inline_kernels_are_recorded_without_task_queue():
    script = textwrap.dedent("""
        import torch, torch_npu
        x = torch.randn(512, 512, device="npu")
        with torch_npu.profiler.profile() as prof:
            (x @ x).sum()
        print(sorted({t["type"] for t in prof.npu_tasks()}))
    """)
    env = dict(os.environ, TASK_QUEUE_ENABLE="0")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "'Mm'" in r.stdout and "'Sum'" in r.stdout, r.stdout


# ---- torch_npu's API beyond torch.profiler (checked against Huawei's test/profiler) ----------

def test_schedule_is_torch_npus_class():
    Schedule = torch_npu.profiler.schedule
    # Valid settings: the same actions as torch.profiler.schedule (the reference).
    settings = [(1, 1, 2, 1, 0), (2, 2, 2, 0, 2), (0, 1, 3, 2, 1), (3, 0, 1, 4, 0)]
    for wait, warmup, active, repeat, skip_first in settings:
        ours = Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
        ref = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
        assert [ours(s).name for s in range(30)] == [ref(s).name for s in range(30)]
        assert (ours.wait, ours.warmup, ours.active, ours.repeat) == (wait, warmup, active, repeat)
    # Invalid settings are reset with a warning naming them (torch_npu), not raised.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bad = Schedule(wait=-1, active=0, warmup="x", repeat=-2, skip_first=None)
    assert (bad.wait, bad.active, bad.warmup, bad.repeat, bad.skip_first) == (0, 1, 0, 0, 0)
    text = " ".join(str(w.message) for w in caught)
    assert all(name in text for name in ("wait", "active", "warmup", "repeat", "skip_first"))
    A = torch_npu.profiler.ProfilerAction
    # torch_npu's own Enum (as in torch_npu), with torch's members NONE ... RECORD_AND_SAVE and values
    assert A is torch_npu.profiler.scheduler.ProfilerAction and A.__module__ == "torch_npu.profiler.scheduler"
    assert [(a.name, a.value) for a in A] == [("NONE", 0), ("WARMUP", 1), ("RECORD", 2), ("RECORD_AND_SAVE", 3)]
    assert all(torch.profiler.ProfilerAction[a.name].value == a.value for a in A)
    assert [bad(s) for s in range(3)] == [A.RECORD_AND_SAVE] * 3
    # skip_first_wait: the first cycle starts without its wait steps.
    s = Schedule(skip_first=1, wait=2, warmup=1, active=2, repeat=2, skip_first_wait=1)
    assert [s(i) for i in range(10)] == [A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE, A.NONE,
                                         A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE]
    with pytest.raises(ValueError, match="step"):
        s(-1)


def test_cpu_activity_writes_host_views_only(tmp_path):
    with torch_npu.profiler.profile(activities=[ProfilerActivity.CPU],
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))) as p:
        _train_steps(p, 1)
    path = _result_dir(tmp_path)
    out = set(os.listdir(os.path.join(path, "ASCEND_PROFILER_OUTPUT")))
    assert {"trace_view.json", "operator_details.csv"} <= out
    assert not out & {"kernel_details.csv", "op_statistic.csv", "task_time.csv"}, out
    assert not glob.glob(os.path.join(path, "PROF_*"))  # no device data was collected


def test_result_directory_layout_and_task_time(tmp_path):
    with torch_npu.profiler.profile(activities=BOTH,
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))) as p:
        _train_steps(p, 1)
    path = _result_dir(tmp_path)
    # torch_npu's layout: FRAMEWORK/ (host) and PROF_*/device_{d}/ (device) next to the views.
    (prof_dir,) = glob.glob(os.path.join(path, "PROF_*"))
    assert os.path.isdir(os.path.join(prof_dir, "device_0")) and os.path.isdir(os.path.join(path, "FRAMEWORK"))
    out = os.path.join(path, "ASCEND_PROFILER_OUTPUT")
    kernels = _rows(os.path.join(out, "kernel_details.csv"))
    tasks = _rows(os.path.join(out, "task_time.csv"))
    assert len(tasks) == len(kernels) == len(p.npu_tasks()) > 0
    from decimal import Decimal  # epoch µs with ns digits: more than a float holds

    for t in tasks:
        took = Decimal(t["task_stop(us)"]) - Decimal(t["task_start(us)"])
        assert abs(took - Decimal(t["task_time(us)"])) <= Decimal("0.002"), t
    assert sorted(t["kernel_name"] for t in tasks) == sorted(k["Name"] for k in kernels)


def test_ascend_work_path_keeps_raw_data_for_analyse(tmp_path):
    env = dict(os.environ, ASCEND_WORK_PATH=str(tmp_path))
    script = textwrap.dedent("""
        import torch, torch_npu
        x = torch.randn(128, 128, device="npu")
        prof = torch_npu.profiler._KinetoProfile()
        prof.start()
        (x @ x).relu()
        prof.stop()
        torch_npu.profiler.analyse(torch_npu.profiler.profiler._result_dir.__globals__["os"].path.join(
            r"%s", "profiling_data"), export_type="text")
    """ % tmp_path)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (path,) = glob.glob(str(tmp_path / "profiling_data" / "*_ascend_pt"))
    kernels = _rows(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))
    assert [k["Type"] for k in kernels if k["Type"] in ("Mm", "Relu")] == ["Mm", "Relu"]


def test_export_stacks(tmp_path):
    model = torch.nn.Linear(256, 256).npu()
    x = torch.randn(256, 256, device="npu")
    with torch_npu.profiler.profile(with_stack=True) as prof:
        model(x).sum()
    cpu = prof.export_stacks(str(tmp_path / "cpu.txt"))
    npu = prof.export_stacks(str(tmp_path / "npu.txt"), "self_npu_time_total")
    for path in (str(tmp_path / "cpu.txt"), npu):
        lines = open(path).read().splitlines()
        assert lines and all(int(line.rsplit(" ", 1)[1]) > 0 for line in lines)
    assert cpu is None or os.path.isfile(str(tmp_path / "cpu.txt"))
    # Device time per stack: the linear's stack carries the addmm kernel's time.
    by_stack = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in open(npu).read().splitlines()}
    addmm_us = sum(t["dur_us"] for t in prof.npu_tasks() if t["type"] == "Addmm")
    linear = [us for stack, us in by_stack.items() if stack.endswith("<built-in_function_linear>")]
    assert linear == [int(addmm_us)], (by_stack, addmm_us)
    assert any("test_profiler.py" in stack for stack in by_stack)  # outermost frames first: the caller
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_npu.profiler.profile() as no_stack:
            x.sum()
        no_stack.export_stacks(str(tmp_path / "none.txt"))
    assert any("with_stack=True" in str(w.message) for w in caught)


def test_export_type_db(tmp_path):
    import sqlite3

    cfg = torch_npu.profiler._ExperimentalConfig(export_type=[torch_npu.profiler.ExportType.Db])
    x = torch.randn(256, 256, device="npu")
    with torch_npu.profiler.profile(activities=BOTH, experimental_config=cfg, profile_memory=True, record_shapes=True,
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))) as p:
        y = x @ x
        del y
    out = os.path.join(_result_dir(tmp_path), "ASCEND_PROFILER_OUTPUT")
    assert os.listdir(out) == ["ascend_pytorch_profiler.db"]  # db only: no text views
    db = sqlite3.connect(os.path.join(out, "ascend_pytorch_profiler.db"))
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"STRING_IDS", "PYTORCH_API", "CONNECTION_IDS", "TASK", "COMPUTE_TASK_INFO", "MEMORY_RECORD",
                "OP_MEMORY", "ENUM_API_TYPE", "META_DATA"} <= tables
        assert db.execute("SELECT COUNT(*) FROM TASK").fetchone()[0] == len(p.npu_tasks())
        # The host operator -> the device task it launched, through the connection ids.
        rows = db.execute("""
            SELECT s1.value, s2.value, t.endNs - t.startNs FROM PYTORCH_API a
            JOIN CONNECTION_IDS c ON c.id = a.connectionId JOIN TASK t ON t.connectionId = c.connectionId
            JOIN COMPUTE_TASK_INFO i ON i.globalTaskId = t.globalTaskId
            JOIN STRING_IDS s1 ON s1.id = a.name JOIN STRING_IDS s2 ON s2.id = i.opType""").fetchall()
        mm = [r for r in rows if r[0] == "aten::mm"]
        assert len(mm) == 1 and mm[0][1] == "Mm" and mm[0][2] > 0
        mm_task = next(t for t in p.npu_tasks() if t["type"] == "Mm")
        assert mm[0][2] / 1000.0 == pytest.approx(mm_task["dur_us"], abs=0.01)
        sizes = [r[0] for r in db.execute("SELECT size FROM OP_MEMORY")]
        assert _npu_block(256 * 256 * 4) in sizes
    finally:
        db.close()
    # analyse(export_type=...) re-exports a run offline in the other format.
    torch_npu.profiler.analyse(_result_dir(tmp_path), export_type="text")
    assert "kernel_details.csv" in os.listdir(out)


def test_profiler_in_child_thread():
    import threading

    x = torch.randn(64, 64, device="npu")
    ready, go = threading.Event(), threading.Event()

    def worker():  # a pool thread: alive before the profile starts
        torch.npu.set_device(0)
        ready.set()
        go.wait()
        torch_npu.profiler.profile.enable_profiler_in_child_thread()
        torch.mm(x, x)
        torch_npu.profiler.profile.disable_profiler_in_child_thread()

    t = threading.Thread(target=worker)
    t.start()
    ready.wait()
    with torch_npu.profiler.profile(activities=BOTH) as prof:
        go.set()
        t.join()
    assert "aten::mm" in {e.name for e in prof.events()}  # the thread's host operator
    assert any(task["type"] == "Mm" for task in prof.npu_tasks())


_DP_PRELUDE = """
import json, os, time, torch, torch_npu
from torch_npu.profiler import dynamic_profile as dp
cfg_dir, out = {cfg_dir!r}, {out!r}
model = torch.nn.Linear(32, 32).npu()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 32, device="npu")
def edit(**changes):
    shm = dp._DynamicProfile()._dynamic_monitor._shm_obj
    published = shm.read_bytes(read_time=True)
    path = os.path.join(cfg_dir, "profiler_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(path, "w") as f:
        json.dump(cfg, f)
    deadline = time.time() + 20
    while shm.read_bytes(read_time=True) == published:  # the monitor publishes within its poll interval
        assert time.time() < deadline, "the monitor did not publish the edit"
        time.sleep(0.05)
"""


def _steps_recorded(result_root):
    """[{ProfilerStep numbers}] of each result directory under result_root, oldest first."""
    runs = []
    for path in sorted(glob.glob(os.path.join(result_root, "*_ascend_pt"))):
        assert glob.glob(os.path.join(path, "PROF_*", "device_0"))
        kernels = _rows(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))
        runs.append({int(k["Step Id"]) for k in kernels})
    return runs


def test_dynamic_profile(tmp_path):
    from conftest import run_python

    cfg_dir, out = str(tmp_path / "cfg"), str(tmp_path / "out")
    script = _DP_PRELUDE.format(cfg_dir=cfg_dir, out=out) + textwrap.dedent("""
        dp.init(cfg_dir)
        assert json.load(open(os.path.join(cfg_dir, "profiler_config.json")))["active"] == 1  # the defaults
        for step in range(1, 9):
            model(x).sum()
            if step == 2:   # edited while training: from step 4, 1 warmup and 2 active steps
                edit(start_step=4, warmup=1, active=2, prof_dir=os.path.join(out, "a"), analyse=True)
            dp.step()
        edit(is_rank=True, rank_list=[1], start_step=-1, prof_dir=os.path.join(out, "b"))  # rank 0 not listed
        for _ in range(3):
            model(x).sum(); dp.step()
        edit(is_rank=False, start_step=-1, warmup=0, active=1, prof_dir=os.path.join(out, "c"))
        for _ in range(3):
            model(x).sum(); dp.step()
        dp.set_state("bad")  # logged and warned, never raised
        dp.start(os.path.join(cfg_dir, "profiler_config.json"))  # at once, for warmup + active steps
        model(x).sum(); dp.step()
        print("ok")
    """)
    r = run_python(script, env={"RANK": "0"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    assert "set_state" in r.stderr  # the warning
    # Steps are counted by dp.step(): the run started at step 4 records ProfilerStep#5 and #6.
    # A run started at step n records ProfilerStep#n on (steps counted by dp.step()).
    assert _steps_recorded(os.path.join(out, "a")) == [{5, 6}]  # #4 was the warmup
    assert not os.path.exists(os.path.join(out, "b"))
    assert _steps_recorded(os.path.join(out, "c")) == [{12}, {14}]  # the edit; then dp.start at step 14
    assert os.listdir(os.path.join(cfg_dir, "log"))


def test_dynamic_profile_without_code_changes(tmp_path):
    """PROF_CONFIG_PATH: import torch_npu starts dynamic profiling; optimizer.step() is dp.step()."""
    from conftest import run_python

    cfg_dir, out = str(tmp_path / "cfg"), str(tmp_path / "out")
    script = _DP_PRELUDE.format(cfg_dir=cfg_dir, out=out) + textwrap.dedent("""
        assert os.path.isfile(os.path.join(cfg_dir, "profiler_config.json"))  # created at import
        edit(start_step=2, active=1, prof_dir=out, analyse=True)
        other = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # the last optimizer counts
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(x).sum().backward()
            opt.step()
            other.step()  # not counted
        print("ok")
    """)
    r = run_python(script, env={"PROF_CONFIG_PATH": cfg_dir})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    assert _steps_recorded(out) == [{2}]  # the iteration after the 2nd counted opt.step()


def test_export_memory_timeline(tmp_path):
    x = torch.randn(256, 1024, device="npu")  # 1 MiB, before the profile: preexisting
    with torch_npu.profiler.profile(activities=BOTH, record_shapes=True, profile_memory=True,
                                    with_stack=True) as prof:
        y = x * 2  # a new 1 MiB npu tensor
        del y
    path = str(tmp_path / "timeline.json")
    prof.export_memory_timeline(path, device="npu:0")
    with open(path) as f:
        times, sizes = json.load(f)
    assert len(times) == len(sizes) > 0
    peak = max(sum(s) for s in sizes)
    assert peak >= 2 * x.numel() * 4  # x and y alive together
    prof.export_memory_timeline(output_path=str(tmp_path / "default.json"))  # torch_npu's keyword, npu:0
    assert os.path.isfile(tmp_path / "default.json")

    with torch_npu.profiler.profile(activities=BOTH, profile_memory=True) as prof:
        (x * 2).sum()
    with pytest.warns(UserWarning, match="record_shapes=True, with_stack=True or with_modules=True required"):
        prof.export_memory_timeline(str(tmp_path / "none.json"))
    assert not os.path.exists(tmp_path / "none.json")


def test_metadata_with_quotes_and_backslashes(tmp_path):
    x = torch.randn(8, 8, device="npu")
    handler = torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_npu.profiler.profile(on_trace_ready=handler) as prof:
            prof.add_metadata("cmd", 'run "a b" C:\\data\n')  # would break Kineto's unescaped trace
            prof.add_metadata_json("cfg", '{"lr": 0.1, "path": "a\\\\b"}')
            prof.add_metadata_json("bad", "{not json")
            x.sum()
    assert any("not JSON" in str(w.message) for w in caught)
    path = _result_dir(tmp_path)
    with open(os.path.join(path, "profiler_metadata.json")) as f:
        meta = json.load(f)
    assert meta == {"cmd": 'run "a b" C:\\data\n', "cfg": {"lr": 0.1, "path": "a\\b"}}
    with open(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "trace_view.json")) as f:
        trace = json.load(f)
    assert trace["cmd"] == meta["cmd"] and trace["cfg"] == meta["cfg"]
    assert any(e.get("name") == "aten::sum" for e in trace["traceEvents"])


# ---- profiles name a device copy aclnnInplaceCopy, as torch_npu's do -------------------------

def test_device_copy_is_named_aclnnInplaceCopy_in_profiles():
    from torch_npu.testing.common_utils import check_operators_in_prof

    x = torch.randn(2, 6, 9, 4)
    xn = x.npu()
    with torch.autograd.profiler.profile(use_device="npu") as prof:
        y = xn.permute(1, 0, 2, 3).contiguous()
    assert check_operators_in_prof(["aclnnInplaceCopy"], prof)
    torch.testing.assert_close(y.cpu(), x.permute(1, 0, 2, 3).contiguous())
    # Host <-> device copies are not device copies.
    with torch.autograd.profiler.profile(use_device="npu") as prof:
        x.npu().cpu()
    assert not check_operators_in_prof(["aclnnInplaceCopy"], prof)


def test_legacy_profiler_use_device_npu():
    """torch.autograd.profiler.profile(use_device="npu"): torch's legacy profiler times each
    operator with npu events on the current stream (torch_npu's PrivateUse1 profiler methods)."""
    a = torch.randn(64, 64, device="npu")
    torch.npu.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.profiler.profile(use_device="npu") as prof:
            b = torch.mm(a, a)
            torch.npu.synchronize()
    assert b.device.type == "npu"
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert mm, [e.name for e in prof.function_events]
    for e in prof.function_events:
        # Host times on one clock: without the npu's methods every range was garbage.
        assert 0 <= e.time_range.start <= e.time_range.end, (e.name, e.time_range)
        assert 0 <= e.cpu_time_total < 60e6, (e.name, e.cpu_time_total)
    # The operator's device time comes from its two npu events.
    assert any(e.kernels for e in mm) and all(k.duration >= 0 for e in mm for k in e.kernels)
    assert sum(e.device_time_total for e in mm) > 0


def test_torch_profiler_metadata_is_sanitized(tmp_path):
    """torch.profiler's add_metadata / add_metadata_json (Kineto writes them unescaped):
    characters that would break the trace are replaced, with a warning; clean ones pass."""
    from torch_npu.profiler._add_metadata_sanitizer_patch import _sanitize_json_value, _sanitize_value

    assert _sanitize_value("plain") == ("plain", [])
    safe, notes = _sanitize_value('a "b" C:\\x\t\x01')
    assert safe == "a 'b' C:/x  " and sorted(notes) == sorted(
        ["2 double quote", "1 backslash", "1 tab", "1 control character U+0001"])
    safe, notes = _sanitize_json_value(json.dumps({'k"': ['say "hi"', 3]}))
    assert json.loads(safe) == {"k'": ["say 'hi'", 3]} and "\\" not in safe and notes
    assert _sanitize_json_value("not json") == ("not json", [])

    path = str(tmp_path / "trace.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            prof.add_metadata('run"id', 'C:\\data "x"')
            prof.add_metadata_json("doc", json.dumps({"note": 'a "q"'}))
            prof.add_metadata("clean", "value")
            torch.ones(4).sum()
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)  # parses
    assert trace["run'id"] == "C:/data 'x'" and trace["clean"] == "value"
    assert trace["doc"] == {"note": "a 'q'"}
    altered = [str(w.message) for w in caught if "altered" in str(w.message)]
    assert len(altered) == 3 and any("key" in m for m in altered), altered


def test_torch_profiler_privateuse1_records_npu_tasks(tmp_path):
    """torch.profiler with ProfilerActivity.PrivateUse1: the npu's tasks in Kineto's trace (the
    npu's activity profiler), on a device lane below the CPU process, each linked by an ac2g
    flow to the operator that launched it; a CPU-only trace has none of them."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(32, 32, device="npu")
    torch.npu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        b = torch.mm(a, a)
        b.add_(1)
        host = b.cpu()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert {"aten::mm", "aten::add"} <= {e["name"] for e in kernels}, [e["name"] for e in kernels]
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    for k in kernels:
        assert k["args"]["type"] == "KERNEL" and k["args"]["streamId"] == 0 and k["args"]["device"] == 0
        op = ops[k["args"]["External id"]]  # the launching operator
        assert k["ts"] >= op["ts"], (k, op)
        if k["name"] == "aten::mm":
            assert op["name"] == "aten::mm"
    sort = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    cpu_pid = next(iter(ops.values()))["pid"]
    assert {k["pid"] for k in kernels} == {0} and sort[0] > sort[cpu_pid]
    starts = [e for e in events if e.get("cat") == "ac2g" and e["ph"] == "s"]
    finishes = [e for e in events if e.get("cat") == "ac2g" and e["ph"] == "f"]
    assert len(finishes) == len(kernels) and {e["id"] for e in starts} == {e["id"] for e in finishes}
    assert len(starts) == len({e["id"] for e in starts}) and all(e["pid"] == cpu_pid for e in starts)
    assert {e["id"] for e in starts} <= set(ops)
    assert torch.allclose(host, (a.cpu() @ a.cpu()) + 1, atol=1e-4)
    npu_total = sum(e.self_device_time_total for e in prof.key_averages())
    assert npu_total > 0

    # CPU only (what torch_npu.profiler.profile uses under the hood): no device events.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(a, a)
        torch.npu.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        assert not [e for e in json.load(f)["traceEvents"] if e.get("cat") in ("kernel", "ac2g")]


def test_result_directory_of_a_custom_handler(tmp_path, monkeypatch):
    """As torch_npu: a run handed to a handler of the user's still gets its result directory
    (raw data, parsed later by analyse) in the working directory, named by ProfPathCreator,
    which is one object per process; without on_trace_ready nothing is written."""
    from torch_npu.profiler._profiler_path_creator import ProfPathCreator

    assert ProfPathCreator() is ProfPathCreator()
    ProfPathCreator().init()  # forget an earlier tensorboard_trace_handler's folder
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASCEND_WORK_PATH", raising=False)
    seen = []
    x = torch.randn(8, 8, device="npu")
    with torch_npu.profiler.profile(activities=BOTH, on_trace_ready=lambda p: seen.append(p)) as prof:
        x.sum()
    path = ProfPathCreator().get_prof_dir()
    assert seen == [prof] and os.path.dirname(path) == str(tmp_path) and path.endswith("_ascend_pt")
    assert os.path.basename(path).startswith(f"{socket.gethostname()}_{os.getpid()}_")
    assert os.path.isfile(os.path.join(path, "FRAMEWORK", "torch_npu_raw.json"))
    torch_npu.profiler.analyse(path)
    assert os.path.isfile(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))

    before = set(os.listdir(tmp_path))
    with torch_npu.profiler.profile(activities=BOTH):
        x.sum()
    assert set(os.listdir(tmp_path)) == before

    # tensorboard_trace_handler names the folder and worker; a bad worker name is reset, with a warning.
    with pytest.warns(UserWarning, match="worker_name"):
        ProfPathCreator().init(worker_name="", dir_name=str(tmp_path / "out"))
    handler = torch_npu.profiler.tensorboard_trace_handler(str(tmp_path / "tb"), worker_name="w0")
    with torch_npu.profiler.profile(activities=BOTH, on_trace_ready=handler):
        x.sum()
    assert os.path.basename(ProfPathCreator().get_prof_dir()).startswith(f"w0_{os.getpid()}_")
    assert os.path.dirname(ProfPathCreator().get_prof_dir()) == str(tmp_path / "tb")


def test_dynamic_profile_parts(tmp_path, monkeypatch, capsys):
    """dynamic_profile's parts under torch_npu's names: ConfigContext validates a config
    (bad entries reset, with a warning), DynamicProfilerShareMemory is the job's shared memory,
    DynamicProfilerUtils logs (to stdout in the dynolog model); dp.step() marks each step
    with an mstx range "step {n}"."""
    import copy

    from torch_npu.profiler._dynamic_profiler._dynamic_profiler_config_context import ConfigContext
    from torch_npu.profiler._dynamic_profiler._dynamic_profiler_monitor_shm import DynamicProfilerShareMemory
    from torch_npu.profiler._dynamic_profiler._dynamic_profiler_utils import DynamicProfilerUtils
    from torch_npu.profiler.dynamic_profile import _DynamicProfile

    monkeypatch.setenv("RANK", "1")
    data = copy.deepcopy(DynamicProfilerShareMemory.JSON_DATA)
    data.update(prof_dir=1, analyse="yes", active=0, warmup=-2, start_step=-1, record_shapes=True,
                activities=["CPU", "GPU"], is_rank=True, rank_list=[0, "x"], metadata={"k": 1})
    with pytest.warns(UserWarning) as caught:
        ctx = ConfigContext(data)
    text = " ".join(str(w.message) for w in caught)
    for name in ("prof_dir", "analyse", "active", "warmup", "GPU", "rank_list"):
        assert name in text, (name, text)
    assert (ctx.prof_path, ctx.analyse(), ctx.active(), ctx.warmup()) == ("./", False, 1, 0)
    assert ctx.start() and ctx.start_step() == -1 and ctx.record_shapes and not ctx.with_stack
    assert ctx.activities() == [ProfilerActivity.CPU] and ctx.meta_data() == {"k": 1}
    assert ctx.experimental_config.profiler_level == "Level0"
    assert not ctx.valid()  # rank 1 is not in rank_list
    monkeypatch.setenv("RANK", "0")
    assert ConfigContext(data).valid()

    cfg = str(tmp_path / "profiler_config.json")
    shm = DynamicProfilerShareMemory(str(tmp_path), cfg, 0)  # the first: creates the segment and the file
    other = DynamicProfilerShareMemory(str(tmp_path), cfg, 1)  # attaches
    try:
        assert shm.is_create_process and not other.is_create_process
        with open(cfg) as f:
            assert json.load(f) == DynamicProfilerShareMemory.JSON_DATA
        assert json.loads(other.read_bytes()) == DynamicProfilerShareMemory.JSON_DATA
        stamp = other.read_bytes(read_time=True)
        shm.write_config(b'{"active": 3}', 123)
        assert other.read_bytes(read_time=True) != stamp and other.read_snapshot()[1:] == (123, b'{"active": 3}')
        with pytest.raises(ValueError, match="more than"):
            shm.write_config(b" " * DynamicProfilerUtils.CFG_BUFFER_SIZE, 1)
    finally:
        other.clean_resource()  # detaches only
        assert os.path.exists(os.path.join("/dev/shm", shm.shm_path))
        shm.clean_resource()  # the creator removes the segment
    assert not os.path.exists(os.path.join("/dev/shm", shm.shm_path))

    monkeypatch.setattr(DynamicProfilerUtils, "DYNAMIC_PROFILER_MODEL",
                        DynamicProfilerUtils.DynamicProfilerConfigModel.DYNO_CONFIG)
    DynamicProfilerUtils.out_log("to stdout", DynamicProfilerUtils.LoggerLevelEnum.ERROR)
    assert "[ERROR]" in capsys.readouterr().out
    monkeypatch.undo()

    dp = _DynamicProfile()
    with torch_npu.profiler.profile(experimental_config=torch_npu.profiler._ExperimentalConfig(mstx=True)) as prof:
        dp.step()
        torch.ones(4, device="npu").sum()
        dp.step()
    steps = [e for e in prof._finished_run()["trace"]["traceEvents"] if e.get("cat") == "mstx"]
    assert [e["name"] for e in steps] == [f"step {dp.cur_step - 1}"] and steps[0]["ph"] == "X"


def test_cann_package_manager(tmp_path, monkeypatch):
    """CannPackageManager asks the CANN toolkit's msprof (on PATH) what it can export, as
    torch_npu: none here (the simulator ships no msprof), a toolkit's answers when there is
    one; an msprof that others can write is not run."""
    from torch_npu.profiler.analysis.prof_common_func import _cann_package_manager as cpm

    def fresh():
        monkeypatch.setattr(cpm.CannPackageManager, "SUPPORT_EXPORT_DB", None)
        monkeypatch.setattr(cpm.CannPackageManager, "SUPPORT_DEFAULT_EXPORT_DB", None)

    monkeypatch.setenv("PATH", str(tmp_path))
    fresh()
    assert not cpm.CannPackageManager.is_support_export_db()
    assert not cpm.CannPackageManager.is_support_default_export_db()
    msprof = tmp_path / "msprof"
    msprof.write_text("#!/bin/sh\necho '  --type  text(which will also export the database), db'\n")
    msprof.chmod(0o755)
    fresh()
    assert cpm.CannPackageManager.is_support_export_db()
    assert cpm.CannPackageManager.is_support_default_export_db()
    msprof.chmod(0o777)
    fresh()
    assert not cpm.CannPackageManager.is_support_export_db()


def test_db_manager(tmp_path):
    """DbManager (the SQLite access of export_type="db"): failures are reported and answered
    with falsy results; rows go in and come out in batches."""
    from torch_npu.profiler.analysis.prof_common_func._db_manager import DbManager, EmptyClass

    with pytest.warns(UserWarning, match="cannot open"):
        conn, cur = DbManager.create_connect_db(str(tmp_path / "missing" / "x.db"))
    assert isinstance(conn, EmptyClass) and not conn and not cur
    DbManager.destroy_db_connect(None, None)

    path = tmp_path / "t.db"
    conn, cur = DbManager.create_connect_db(str(path))
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
    DbManager.create_table_with_headers(conn, cur, "T", [("a", "INTEGER"), ("b", "TEXT")])
    assert DbManager.judge_table_exist(cur, "T") and not DbManager.judge_table_exist(cur, "U")
    DbManager.insert_data_into_table(conn, "T", [])
    old = (DbManager.INSERT_SIZE, DbManager.FETCH_SIZE, DbManager.MAX_ROW_COUNT)
    try:
        DbManager.INSERT_SIZE = DbManager.FETCH_SIZE = 3
        DbManager.insert_data_into_table(conn, "T", [(i, str(i)) for i in range(10)])
        assert DbManager.fetch_all_data(cur, "SELECT a FROM T ORDER BY a") == [(i,) for i in range(10)]
        DbManager.MAX_ROW_COUNT = 4
        with pytest.warns(UserWarning, match="exceed the limit"):
            assert len(DbManager.fetch_all_data(cur, "SELECT a FROM T")) == 6
    finally:
        DbManager.INSERT_SIZE, DbManager.FETCH_SIZE, DbManager.MAX_ROW_COUNT = old
    assert DbManager.fetch_one_data(cur, "SELECT count(*) FROM T") == (10,)
    with pytest.warns(UserWarning, match="SQLite Error"):
        assert DbManager.fetch_all_data(cur, "SELECT * FROM nowhere") == []
    with pytest.warns(UserWarning, match="SQLite Error"):
        assert not DbManager.execute_sql(conn, "NOT SQL")
    DbManager.clear_table_data(conn, cur, "T")
    assert DbManager.fetch_one_data(cur, "SELECT count(*) FROM T") == (0,)
    DbManager.destroy_db_connect(conn, cur)


def test_flops_ranges(monkeypatch):
    """with_flops=True and mstx: each call of an operator with a FLOPs formula is an mstx range
    "{flops}-{op}" in the domain mfu_flops (torch_npu's MFU data); the hooks go when the
    profile stops; a user's formula replaces the default one."""
    from torch_npu.profiler import _flops_formulas as formulas
    from torch_npu.profiler._flops_hook import FlopsHookManager
    from torch_npu.profiler._flops_registry import _npu_flop_registry, get_flop_func

    mm = torch.mm
    a, b = torch.ones(8, 16, device="npu"), torch.ones(16, 4, device="npu")
    w = torch.ones(5, 16, device="npu")
    config = torch_npu.profiler._ExperimentalConfig(mstx=True)
    with torch_npu.profiler.profile(with_flops=True, experimental_config=config) as prof:
        assert FlopsHookManager.is_installed() and torch.mm is not mm
        torch.mm(a, b)
        torch.nn.functional.linear(a, w)
        torch.matmul(a.view(2, 4, 16), b)  # torch.matmul's own mm is not counted again
    assert torch.mm is mm and not FlopsHookManager.is_installed()
    ranges = [e for e in prof._finished_run()["trace"]["traceEvents"] if e.get("cat") == "mstx"]
    assert [(e["name"], e["args"]["domain"]) for e in ranges] == [
        (f"{2 * 8 * 16 * 4}-mm", "mfu_flops"), (f"{2 * 8 * 16 * 5}-linear", "mfu_flops"),
        (f"{2 * 2 * 4 * 16 * 4}-matmul", "mfu_flops")]

    # without mstx nothing is hooked
    with torch_npu.profiler.profile(with_flops=True):
        assert torch.mm is mm

    # formulas of torch_npu's fused operators (shapes only)
    q = torch.empty(2, 4, 8, 16)  # BNSD: batch 2, 4 heads, sequence 8, head dim 16
    assert formulas.npu_fusion_attention_flops(q, q, q, 4, "BNSD") == 2 * 2 * 4 * 8 * 8 * 32
    assert formulas.npu_fusion_attention_flops(q, q, q, 4, "BNSD", sparse_mode=2) == 2 * 2 * 4 * 32 * 32
    bsh = torch.empty(2, 8, 64)
    assert formulas.npu_fusion_attention_flops(bsh, bsh, bsh, 4, "BSH") == 2 * 2 * 4 * 64 * 32
    with pytest.raises(ValueError, match="sparse_mode=5"):
        formulas.npu_fusion_attention_flops(q, q, q, 4, "BNSD", sparse_mode=5)
    tnd = torch.empty(10, 4, 16)
    assert formulas.npu_fusion_attention_flops(tnd, tnd, tnd, 4, "TND", actual_seq_qlen=[4, 10],
                                               actual_seq_kvlen=[4, 10]) == 2 * 4 * 32 * (16 + 36)
    assert formulas.npu_grouped_matmul_flops(torch.empty(6, 3), [torch.empty(3, 7), torch.empty(3, 11)],
                                             group_list=[2, 4]) == 2 * 2 * 3 * 7 + 2 * 4 * 3 * 11

    monkeypatch.setitem(_npu_flop_registry, "mm", (lambda x, y, **kw: 1, "torch:mm"))
    assert get_flop_func("mm")(a, b) == 1
    with torch_npu.profiler.profile(with_flops=True, experimental_config=config) as prof:
        torch.mm(a, b)
    assert [e["name"] for e in prof._finished_run()["trace"]["traceEvents"] if e.get("cat") == "mstx"] == ["1-mm"]


def test_analysis_messages_and_time_conversions(capsys):
    """analysis.prof_common_func._constant: torch_npu's report lines and exact ns <-> µs text
    (the views' timestamps are written with it)."""
    from torch_npu.profiler.analysis.prof_common_func import _constant as c

    c.print_warn_msg("look")
    out = capsys.readouterr().out
    assert out.endswith(f"[WARNING] [{os.getpid()}] profiler.py: look\n") and out.startswith("[20")
    assert c.convert_ns2us_str(1459635878536856678) == "1459635878536856.678"
    assert c.convert_ns2us_str(5, "\t") == "0.005\t" and c.convert_ns2us_str(float("inf")) == "inf"
    assert c.convert_ns2us_float(1500) == 1.5
    with pytest.raises(TypeError):
        c.convert_ns2us_str(1.5)
    assert c.convert_us2ns("1459635878536856.678\t") == 1459635878536856678
    assert c.convert_us2ns(2) == 2000 and c.convert_us2ns("0.1234") == 123
    with pytest.raises(RuntimeError):
        c.convert_us2ns("1.2.3")
    assert c.contact_2num(1, 2) == (1 << 32) + 2


def test_prof_interface_driven_by_action_controller(tmp_path):
    """torch_npu's lower layers: ProfActionController turns schedule actions into calls of a
    _ProfInterface session over torch_npu._C._profiler; the result directory parses as one
    of tensorboard_trace_handler(analyse_flag=False)."""
    from torch_npu._C._profiler import ProfilerActivity as NativeActivity
    from torch_npu.profiler import ProfilerAction
    from torch_npu.profiler._profiler_action_controller import ProfActionController
    from torch_npu.profiler._profiler_path_creator import ProfPathCreator
    from torch_npu.profiler.profiler_interface import _ProfInterface

    assert NativeActivity is ProfilerActivity
    ProfPathCreator().init(dir_name=str(tmp_path))
    prof_if = _ProfInterface(activities=BOTH, record_shapes=True, metadata={"job": "t1"},
                             custom_trace_id_callback=lambda: "trace-7")
    ready = []
    controller = ProfActionController("the profile", prof_if, on_trace_ready=ready.append)
    schedule = torch_npu.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    x = torch.randn(16, 16, device="npu")
    prev = schedule(0)
    controller.transit_action(ProfilerAction.NONE, prev)
    for step in range(1, 5):
        torch.mm(x, x)
        event = torch.npu.Event(enable_timing=True)
        event.record()
        current = schedule(step)
        controller.transit_action(prev, current)
        prev = current
    assert ready == ["the profile"]  # after RECORD_AND_SAVE
    path = prof_if.prof_path
    assert os.path.dirname(path) == str(tmp_path) and path.endswith("_ascend_pt")
    with open(os.path.join(path, "profiler_info.json")) as f:
        info = json.load(f)
    assert info["start_info"]["freq"] == 1000 and info["start_info"]["syscnt_enable"]
    assert info["config"]["common_config"]["record_shapes"] is True
    with open(os.path.join(path, "profiler_metadata.json")) as f:
        meta = json.load(f)
    assert meta["job"] == "t1" and meta["trace_id"] == "trace-7" and "ENV_VARIABLES" in meta
    prof_if.analyse()
    kernels = _rows(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))
    assert sum(k["Type"] == "Mm" for k in kernels) == 2  # the two recorded steps
    with open(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "trace_view.json")) as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert "Event::record" in names and "aten::mm" in names  # npu events are timed while recording
    assert not hasattr(torch.npu.Event.record, "origin_func")  # and no longer after


def test_native_profiler_api_checks(tmp_path):
    from torch_npu._C import _profiler as native
    from torch_npu.profiler.profiler_interface import _ProfInterface

    cfg = torch_npu.profiler._ExperimentalConfig(mstx=True, mstx_domain_include=["d1"])()
    assert isinstance(cfg, native._ExperimentalConfig) and cfg.msprof_tx and cfg.mstx_domain_include == ["d1"]
    with pytest.raises(TypeError, match="l2_cache"):
        native._ExperimentalConfig(l2_cache="yes")
    with pytest.raises(TypeError, match="with_stack"):
        native.NpuProfilerConfig(str(tmp_path), False, False, 1, False, False, cfg)
    with pytest.raises(TypeError, match="experimental_config"):
        native.NpuProfilerConfig(str(tmp_path), False, False, False, False, False, None)
    config = native.NpuProfilerConfig(str(tmp_path), False, False, False, False, False, cfg)
    with pytest.raises(RuntimeError, match="_init_profiler first"):
        native._start_profiler(config, {native.ProfilerActivity.NPU})
    with pytest.raises(ValueError, match="path"):
        native._init_profiler("", set())
    assert native._supported_npu_activities() == {native.ProfilerActivity.CPU, native.ProfilerActivity.NPU}
    assert native._get_syscnt() < native._get_syscnt()

    prof_if = _ProfInterface(custom_trace_id_callback=lambda: 12345)
    assert len(prof_if.create_trace_id()) == 32  # not a str: the default id
    prof_if.custom_trace_id_callback = lambda: "x" * (_ProfInterface.MAX_TRACE_ID_LEN + 1)
    assert len(prof_if.create_trace_id()) == 32
    bad = _ProfInterface(activities=["GPU"], record_shapes="yes")
    assert bad.activities == {native.ProfilerActivity.CPU, native.ProfilerActivity.NPU}
    assert bad.record_shapes is False


def test_gc_detect(tmp_path):
    """_ExperimentalConfig(gc_detect_threshold=ms): Python garbage collections of at least that
    long are "GC" ranges of the trace view, kept in FRAMEWORK/torch.gc_record (ProfGCDetector)."""
    import gc

    from torch_npu.profiler._profiler_gc_detect import ProfGCDetector

    cfg = torch_npu.profiler._ExperimentalConfig(gc_detect_threshold=0)
    with torch_npu.profiler.profile(activities=BOTH, experimental_config=cfg,
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(
                                        str(tmp_path / "a"))):
        torch.ones(8, device="npu").sum()
        gc.collect()
        gc.collect()
    path = _result_dir(str(tmp_path / "a"))
    assert os.path.getsize(os.path.join(path, "FRAMEWORK", "torch.gc_record")) >= 2 * 24
    with open(os.path.join(path, "ASCEND_PROFILER_OUTPUT", "trace_view.json")) as f:
        events = json.load(f)["traceEvents"]
    gcs = [e for e in events if e.get("name") == "GC"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert len(gcs) >= 2 and all(e["pid"] == os.getpid() and e["dur"] >= 0 for e in gcs)
    lo, hi = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    # On the host operators' clock (a collection of a large heap on a loaded host takes a while).
    slack = 1e6 + sum(e["dur"] for e in gcs)
    assert all(lo - 1e6 < e["ts"] < hi + slack for e in gcs), (lo, hi, gcs)
    assert not any(getattr(cb, "__self__", None).__class__ is ProfGCDetector
                                                     for cb in gc.callbacks)
    with torch_npu.profiler.profile(activities=BOTH, experimental_config=torch_npu.profiler._ExperimentalConfig(
            gc_detect_threshold=10_000), on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(
            str(tmp_path / "b"))):
        gc.collect()  # shorter than 10 s
    assert not os.path.exists(os.path.join(_result_dir(str(tmp_path / "b")), "FRAMEWORK", "torch.gc_record"))

    detector = ProfGCDetector(1000.0)
    assert detector.threshold == 10**9
    detector.gc_callback("start", {})
    detector.gc_callback("stop", {})
    assert detector.save_info == []  # well under 1 s
