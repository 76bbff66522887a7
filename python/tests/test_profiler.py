"""torch_npu.profiler: host operators and npu tasks on one timeline, torch_npu's result files."""
import csv
import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torch_npu
from torch_npu.profiler import ProfilerActivity

BOTH = [ProfilerActivity.CPU, ProfilerActivity.NPU]


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


def test_trace_links_host_ops_to_npu_tasks(tmp_path):
    x = torch.randn(1024, 1024, device="npu")
    torch.npu.synchronize()
    with torch_npu.profiler.profile(activities=BOTH) as prof:
        y = x @ x  # large: queued on the stream, runs after the host op returned
        y.relu_()
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
    assert host_mm["ts"] + host_mm["dur"] < mm["ts"] + mm["dur"]
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
    assert len(records) >= 3 and max(allocated) - allocated[-1] == pytest.approx(0.25, abs=1e-3)
    # Each allocation is attributed to the innermost operator (the output's aten::empty*).
    ops = [r for r in _rows(os.path.join(out, "operator_memory.csv")) if float(r["Size(KB)"]) == 256]
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
