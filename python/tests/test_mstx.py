"""torch_npu.npu.mstx: marks and ranges in a profile run with mstx enabled (torch_npu/_mstx.py)."""
import json
import os
import sqlite3
import threading
import warnings

import pytest
import torch

import torch_npu
from torch_npu.npu import mstx
from torch_npu.profiler import ExportType, _ExperimentalConfig


def _markers(prof):
    return [e for e in prof._finished_run()["trace"]["traceEvents"] if e.get("cat") == "mstx"]


def test_runtime_is_torch_npus_c_mstx():
    for name in ("_mark", "_mark_on_host", "_range_start", "_range_start_on_host", "_range_end", "_range_push",
                 "_range_push_on_host", "_range_pop"):
        assert callable(getattr(torch_npu._C._mstx, name))


def test_marks_and_ranges_appear_in_the_trace(tmp_path):
    x = torch.ones(32, 32, device="npu")
    with torch_npu.profiler.profile(experimental_config=_ExperimentalConfig(mstx=True)) as prof:
        mstx.mark("m0")
        mstx.mark("m1", stream=torch.npu.current_stream(), domain="d")
        range_id = mstx.range_start("around_mm")
        y = x @ x
        mstx.range_end(range_id)
        with mstx.annotate("ann"):
            y = y + 1
    by_name = {e["name"]: e for e in _markers(prof)}
    assert set(by_name) == {"m0", "m1", "around_mm", "ann"}
    assert by_name["m0"]["ph"] == "i" and by_name["m0"]["args"] == {"domain": "default"}
    assert by_name["m1"]["args"]["domain"] == "d"
    assert by_name["m1"]["args"]["stream_id"] == torch.npu.current_stream().stream_id
    assert by_name["around_mm"]["tid"] == threading.get_native_id()
    # The range encloses the host operator it was put around.
    trace = prof._finished_run()["trace"]["traceEvents"]
    mm = next(e for e in trace if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    rng = by_name["around_mm"]
    assert rng["ts"] <= mm["ts"] and mm["ts"] + mm["dur"] <= rng["ts"] + rng["dur"]
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as f:
        assert {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "mstx"} == set(by_name)


def test_range_can_end_on_another_thread():
    with torch_npu.profiler.profile(experimental_config=_ExperimentalConfig(mstx=True)) as prof:
        range_id = mstx.range_start("cross")
        worker = threading.Thread(target=mstx.range_end, args=(range_id,))
        worker.start()
        worker.join()
        mstx.range_start("never_ended")  # open when the run stops: left out
    (cross,) = _markers(prof)
    assert cross["name"] == "cross" and cross["ph"] == "X" and cross["dur"] >= 0


def test_push_pop_depths_per_domain_and_thread():
    with torch_npu.profiler.profile(experimental_config=_ExperimentalConfig(mstx=True)) as prof:
        assert mstx.range_push("a") == 0
        assert mstx.range_push("b") == 1
        assert mstx.range_push("c", domain="other") == 0
        depths = []
        worker = threading.Thread(target=lambda: depths.append((mstx.range_push("t"), mstx.range_pop())))
        worker.start()
        worker.join()
        assert depths == [(0, 0)]  # its own stack
        assert mstx.range_pop() == 1
        assert mstx.range_pop() == 0
        assert mstx.range_pop() == -1
        assert mstx.range_pop(domain="other") == 0
    names = sorted(e["name"] for e in _markers(prof))
    assert names == ["a", "b", "c", "t"]
    b = next(e for e in _markers(prof) if e["name"] == "b")
    a = next(e for e in _markers(prof) if e["name"] == "a")
    assert a["ts"] <= b["ts"] and b["ts"] + b["dur"] <= a["ts"] + a["dur"]  # nested


def test_nothing_is_recorded_without_mstx_enabled():
    assert mstx.range_start("outside_a_profile") == 0
    assert mstx.range_push("outside_a_profile") == -1
    with torch_npu.profiler.profile() as prof:  # mstx off
        mstx.mark("m")
        assert mstx.range_start("r") == 0
    assert _markers(prof) == []


def test_domain_include_and_exclude():
    cfg = _ExperimentalConfig(mstx=True, mstx_domain_include=["keep"])
    with torch_npu.profiler.profile(experimental_config=cfg) as prof:
        mstx.mark("kept", domain="keep")
        mstx.mark("dropped")
        assert mstx.range_start("dropped", domain="other") == 0
    assert [e["name"] for e in _markers(prof)] == ["kept"]
    cfg = _ExperimentalConfig(mstx=True, mstx_domain_exclude=["noisy"])
    with torch_npu.profiler.profile(experimental_config=cfg) as prof:
        mstx.mark("dropped", domain="noisy")
        mstx.mark("kept")
    assert [e["name"] for e in _markers(prof)] == ["kept"]


@pytest.mark.parametrize("call, expected, argument", [
    (lambda: mstx.mark(""), None, "message"),
    (lambda: mstx.mark("m", domain=1), None, "domain"),
    (lambda: mstx.mark("m", stream=1), None, "stream"),
    (lambda: mstx.range_start(0), 0, "message"),
    (lambda: mstx.range_start("r", domain=""), 0, "domain"),
    (lambda: mstx.range_push("r", stream="s"), -1, "stream"),
    (lambda: mstx.range_pop(domain=1), -1, "domain"),
    (lambda: mstx.range_end("id"), None, "range_id"),
])
def test_bad_arguments_warn_and_do_nothing(call, expected, argument):
    with torch_npu.profiler.profile(experimental_config=_ExperimentalConfig(mstx=True)) as prof:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert call() == expected
    assert any(f"Invalid {argument}" in str(w.message) for w in caught)
    assert _markers(prof) == []


def test_decorators_name_the_range():
    @mstx.mstx_range("decorated")
    def f(v):
        return v + 1

    @mstx.annotate()
    def g():
        return 2

    with torch_npu.profiler.profile(experimental_config=_ExperimentalConfig(mstx=True)) as prof:
        assert f(1) == 2 and g() == 2
    assert sorted(e["name"] for e in _markers(prof)) == ["decorated", "g"]


def test_db_export_has_mstx_rows(tmp_path):
    cfg = _ExperimentalConfig(mstx=True, export_type=[ExportType.Db])
    with torch_npu.profiler.profile(experimental_config=cfg,
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))):
        mstx.mark("db_mark")
        with mstx.annotate("db_range"):
            torch.ones(4, device="npu").sum()
    (result,) = [d for d in os.listdir(tmp_path) if d.endswith("_ascend_pt")]
    db = sqlite3.connect(os.path.join(tmp_path, result, "ASCEND_PROFILER_OUTPUT", "ascend_pytorch_profiler.db"))
    try:
        rows = db.execute("""SELECT s.value, a.startNs, a.endNs FROM PYTORCH_API a JOIN STRING_IDS s ON s.id = a.name
                             JOIN ENUM_API_TYPE t ON t.id = a.type WHERE t.name = 'mstx'""").fetchall()
    finally:
        db.close()
    by_name = {name: (int(start), int(end)) for name, start, end in rows}
    assert set(by_name) == {"db_mark", "db_range"}
    assert by_name["db_mark"][0] == by_name["db_mark"][1] and by_name["db_range"][1] > by_name["db_range"][0]
