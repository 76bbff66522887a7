"""torch_npu.profiler.dynamic_profile's monitor: the thread DynMonitorProc of the process that
created the job's shared memory publishes profiler_config.json into it; every process of the
job reads it (DynamicProfilerMonitor, DynamicProfilerShareMemory)."""
import glob
import json
import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest
import torch_npu

from torch_npu.profiler._dynamic_profiler._dynamic_profiler_monitor import DynamicProfilerMonitor
from torch_npu.profiler._dynamic_profiler._dynamic_profiler_monitor_shm import DynamicProfilerShareMemory
from torch_npu.profiler._dynamic_profiler._dynamic_profiler_utils import DynamicProfilerUtils


def _thread_names():
    names = []
    for comm in glob.glob(f"/proc/{os.getpid()}/task/*/comm"):
        with open(comm) as f:
            names.append(f.read().strip())
    return names


def _wait_for(fn, seconds=20.0):
    deadline = time.time() + seconds
    while True:
        value = fn()
        if value is not None or time.time() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture
def monitor_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(DynamicProfilerUtils, "CFG_CONFIG_PATH", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    return tmp_path


def test_monitor_publishes_edits(monitor_dir):
    first = DynamicProfilerMonitor()  # creates the segment, profiler_config.json and the monitor thread
    second = DynamicProfilerMonitor()  # another process of the job would attach the same way
    try:
        assert first._process is not None and first._process.name == "DynMonitorProc"
        assert "DynMonitorProc" in _thread_names()  # the OS name: `ps -eT` shows it
        assert second._process is None and not second._shm_obj.is_create_process
        cfg_path = monitor_dir / "profiler_config.json"
        assert json.loads(cfg_path.read_text()) == DynamicProfilerShareMemory.JSON_DATA
        assert first.shm_to_prof_conf_context() is None  # the file as it was: nothing new

        first.modify_step_time(1)
        cfg_path.write_text(json.dumps(dict(DynamicProfilerShareMemory.JSON_DATA, active=3, warmup=1)))
        ctx = _wait_for(first.shm_to_prof_conf_context)
        assert ctx is not None and (ctx.active(), ctx.warmup()) == (3, 1)
        assert second.shm_to_prof_conf_context().active() == 3  # every reader gets it once
        assert first.shm_to_prof_conf_context() is None and second.shm_to_prof_conf_context() is None

        stamp = first._shm_obj.read_bytes(read_time=True)
        cfg_path.write_text("[1, 2]")  # not a config: logged by the monitor, not published
        time.sleep(2.5)
        assert first._shm_obj.read_bytes(read_time=True) == stamp
        logs = glob.glob(str(monitor_dir / "log" / "monitor_dp_*.log"))
        assert logs and "JSON object" in open(logs[0]).read()

        cfg_path.write_text(json.dumps(dict(DynamicProfilerShareMemory.JSON_DATA, is_rank=True, rank_list=[1])))
        _wait_for(lambda: None if first._shm_obj.read_bytes(read_time=True) == stamp else True)
        with pytest.warns(UserWarning, match="not in valid rank_list"):
            assert first.shm_to_prof_conf_context() is None  # for rank 1 only
    finally:
        second.clean_resource()
        first.clean_resource()
    assert not first._process.is_alive()
    assert not os.path.exists(os.path.join("/dev/shm", first._shm_obj.shm_path))


def test_shared_memory_of_a_killed_job_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    cfg = str(tmp_path / "profiler_config.json")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    shm = DynamicProfilerShareMemory(str(tmp_path), cfg, 0)
    assert shm._get_pid_st_ctime(os.getpid()) > 0 and shm._get_pid_st_ctime(dead_pid) is None
    try:
        # a job that created the segment and was killed: it was never unlinked
        header = DynamicProfilerShareMemory.HEADER
        seq, mtime, length, _, _ = header.unpack_from(shm.shm.buf, 0)
        header.pack_into(shm.shm.buf, 0, seq, mtime, length, dead_pid, 1)
        shm.is_create_process = False  # (as if another process had made it)
        fresh = DynamicProfilerShareMemory(str(tmp_path), cfg, 0)
        assert fresh.is_create_process  # removed and made anew
        assert header.unpack_from(fresh.shm.buf, 0)[3] == os.getpid()
        attached = DynamicProfilerShareMemory(str(tmp_path), cfg, 0)  # its creator runs: used as it is
        assert not attached.is_create_process
        attached.clean_resource()
        fresh.clean_resource()
    finally:
        shm.clean_resource()
    assert not os.path.exists(os.path.join("/dev/shm", shm.shm_path))


def test_create_fails_after_retries(tmp_path, monkeypatch):
    from multiprocessing import shared_memory

    def refuse(*args, **kwargs):
        raise FileExistsError("taken")

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(DynamicProfilerShareMemory, "CREATE_TRIES", 3)
    monkeypatch.setattr(shared_memory.SharedMemory, "__init__", refuse)
    with pytest.raises(RuntimeError, match="Failed to create shared memory"):
        DynamicProfilerShareMemory(str(tmp_path), str(tmp_path / "profiler_config.json"), 0)


def test_launcher_attaches_to_nothing(tmp_path, monkeypatch):
    """torchrun's own process (no RANK) neither creates the segment nor reads configs."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(DynamicProfilerUtils, "CFG_CONFIG_PATH", str(tmp_path))
    monkeypatch.setattr(DynamicProfilerShareMemory, "_is_worker_process", lambda self: False)
    monitor = DynamicProfilerMonitor()
    assert monitor._shm_obj.shm is None and monitor._process is None
    assert monitor.shm_to_prof_conf_context() is None
    monitor.clean_resource()


def test_poll_interval_from_step_time():
    from torch_npu.profiler.dynamic_profile import _DynamicProfile

    class Monitor:
        def __init__(self):
            self.intervals, self.status = [], {}

        def shm_to_prof_conf_context(self):
            return None

        def modify_step_time(self, seconds):
            self.intervals.append(seconds)

        def update_step_info(self, step, flag):
            self.status[flag] = step

        def update_profiler_status(self, status):
            self.status["status"] = status

        def report_profiler_status(self):
            pass

    dp = _DynamicProfile()
    saved = (dp._dynamic_monitor, dp.cur_step, dp._step_record_time)
    dp._dynamic_monitor = Monitor()
    try:
        dp.RECORD_TIME_STEP = 3
        dp.cur_step = 1
        dp.step()
        dp.step()  # step 3: the clock starts
        assert dp._step_record_time is not None and dp._dynamic_monitor.intervals == []
        dp._step_record_time -= 70  # a step of 70 s
        dp.step()
        assert dp._step_time == 50 and dp._dynamic_monitor.intervals == [50]  # at most 50 s
        assert dp._dynamic_monitor.status[DynamicProfilerUtils.CURRENT_STEP] == 4
    finally:
        del dp.RECORD_TIME_STEP
        dp._dynamic_monitor, dp.cur_step, dp._step_record_time = saved


_RANK_SCRIPT = """
import os, sys, time, torch, torch_npu
from torch_npu.profiler import dynamic_profile as dp
cfg_dir = sys.argv[1]
dp.init(cfg_dir)
me = dp._DynamicProfile()
x = torch.randn(16, 16, device="npu")
open(os.path.join(cfg_dir, "ready_" + os.environ["RANK"]), "w").close()
while not os.path.exists(os.path.join(cfg_dir, "go")):
    time.sleep(0.02)
runs, deadline = 0, time.time() + 8
while time.time() < deadline:
    (x @ x).sum()
    was = me.prof is not None
    dp.step()
    runs += (me.prof is not None) and not was
    time.sleep(0.02)
print("RESULT", os.environ["RANK"], int(me._dynamic_monitor._process is not None), runs, flush=True)
"""


def test_ranks_share_one_monitor(tmp_path):
    """Three processes of a job with one config folder: one monitor, and the edit reaches
    the ranks it names."""
    cfg_dir, out = tmp_path / "cfg", tmp_path / "out"
    cfg_dir.mkdir()
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_npu.__file__)))
    procs = []
    for rank in range(3):
        env = dict(os.environ, RANK=str(rank), PYTHONPATH=os.pathsep.join(
            p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p))
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(_RANK_SCRIPT), str(cfg_dir)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.time() + 240
        while len(glob.glob(str(cfg_dir / "ready_*"))) < 3:
            assert time.time() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        cfg = dict(DynamicProfilerShareMemory.JSON_DATA, start_step=-1, prof_dir=str(out), is_rank=True,
                   rank_list=[0, 2])
        (cfg_dir / "profiler_config.json").write_text(json.dumps(cfg))
        (cfg_dir / "go").touch()
        results = {}
        for p in procs:
            stdout, stderr = p.communicate(timeout=240)
            assert p.returncode == 0, stderr[-3000:]
            _, rank, monitor, runs = next(line for line in stdout.splitlines() if line.startswith("RESULT")).split()
            results[int(rank)] = (int(monitor), int(runs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sum(monitor for monitor, _ in results.values()) == 1  # one DynMonitorProc for the job
    assert {rank: runs for rank, (_, runs) in results.items()} == {0: 1, 1: 0, 2: 1}
    assert len(glob.glob(str(out / "*_ascend_pt"))) == 2
    key = DynamicProfilerShareMemory(str(cfg_dir), str(cfg_dir / "profiler_config.json"), 0)  # the job's is gone
    assert key.is_create_process
    key.clean_resource()
