"""npu-smi (torch_npu/npu_smi.py) over the shared-memory registry of device usage that every
process keeps (core/acl/src/smi.cpp): another process's HBM and AI Core time, its row gone when
it exits or is killed, the -t views, watch, and argument errors."""
import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import pytest

import torch_npu  # noqa: F401
from torch_npu import npu_smi

REPO_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(npu_smi.__file__)))

# Holds `mib` MiB on npu:<device>, optionally keeps the device busy, and says "ready".
_HOLDER = """
import sys, time, torch, torch_npu
device, mib, busy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "busy"
x = torch.empty(mib << 20, dtype=torch.uint8, device=f"npu:{device}")
y = torch.randn(384, 384, device=f"npu:{device}")
print("ready", flush=True)
while True:
    if busy:
        (y @ y).sum()
        torch.npu.synchronize(device)
    else:
        time.sleep(0.05)
"""


@contextlib.contextmanager
def _holder(device, mib, busy=False):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_PYTHON, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", _HOLDER, str(device), str(mib),
                             "busy" if busy else "idle"], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _run(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert npu_smi.main(list(argv)) == 0
    return out.getvalue()


def _process_rows(text, pid):
    return [line for line in text.splitlines() if f"| {pid} " in line]


def test_info_shows_another_process_and_its_hbm():
    with _holder(3, 200) as proc:
        text = _run("info")
        rows = _process_rows(text, proc.pid)
        assert len(rows) == 1, text
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        assert cells[0].split() == ["3", "0"]  # NPU 3, chip 0
        assert 200 <= int(cells[3]) < 300  # its MiB: the tensor and the arena's 2 MiB granules
        reg = npu_smi.read_registry()
        mine = next(p for p in reg["processes"] if p["pid"] == proc.pid)
        assert set(mine["hbm_used"]) == {3} and mine["hbm_used"][3] >= 200 << 20
        device_row = text.splitlines()[text.splitlines().index(next(l for l in text.splitlines()
                                                                    if l.startswith("| 3 "))) + 1]
        used, total = device_row.rsplit("|", 2)[1].split()[-3::2]
        assert int(used) >= 200 and int(total) == reg["hbm_capacity"] >> 20
        memory = _run("info", "-t", "memory", "-i", "3")
        assert f"HBM Capacity(MB)" in memory and "NPU ID" in memory
    assert not _process_rows(_run("info"), proc.pid)  # a killed process is not listed


def test_usages_reports_ai_core_time_of_a_busy_process():
    with _holder(4, 8, busy=True):
        for _ in range(5):  # a loaded machine may starve the holder during one sample
            text = _run("info", "-t", "usages", "-i", "4")
            rate = int(next(l for l in text.splitlines() if "Aicore Usage Rate" in l).rsplit(":", 1)[1])
            if rate > 0:
                break
        assert 0 < rate <= 100


def test_a_killed_process_leaves_no_row_and_later_ones_register():
    with _holder(5, 4) as first:
        os.kill(first.pid, signal.SIGKILL)  # no exit handler runs: its slot stays marked in use
        first.wait()
    for _ in range(3):
        with _holder(5, 4) as proc:
            assert [p["pid"] for p in npu_smi.read_registry()["processes"] if p["pid"] == proc.pid] == [proc.pid]
    assert all(p["pid"] != first.pid for p in npu_smi.read_registry()["processes"])


def test_board_and_watch():
    board = _run("info", "-t", "board", "-i", "0")
    assert "(simulated)" in board and "Software Version" in board
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_PYTHON, os.environ.get("PYTHONPATH")) if p))
    watch = subprocess.Popen([sys.executable, "-m", "torch_npu.npu_smi", "info", "watch", "-i", "1", "-d", "0.1"],
                             stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert watch.stdout.readline().startswith("NpuID(Idx)")
        rows = [watch.stdout.readline().split() for _ in range(2)]
        assert [r[0] for r in rows] == ["1", "1"]  # one line per period for NPU 1
    finally:
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=30) == 0


@pytest.mark.parametrize("argv, message", [
    (["info", "-t", "memory"], "-i <id> is required"),
    (["info", "-t", "memory", "-i", "99"], "invalid NPU id 99"),
])
def test_bad_arguments(argv, message):
    with pytest.raises(SystemExit, match=message):
        npu_smi.main(argv)


def test_bad_chip_is_refused(capsys):
    with pytest.raises(SystemExit):
        npu_smi.main(["info", "-c", "1"])
    assert "invalid chip id 1" in capsys.readouterr().err


def test_the_wheel_installs_the_console_script():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    try:
        import build_wheel
    finally:
        sys.path.pop(0)
    assert "npu-smi = torch_npu.npu_smi:main" in build_wheel.entry_points({"torch_npu/dynamo/__init__.py":
                                                                             b"BACKENDS = {}\n"})
