"""torch_npu.npu._kernel_check: the debug operator package (a copy of ASCEND_OPP_PATH whose
AI Core kernel folder links to ASCEND_OPP_DEBUG_PATH's) and the operator messages."""
import os

import torch_npu.npu._kernel_check as kernel_check
from torch_npu.utils.utils import _print_error_log

KERNELS = "built-in/op_impl/ai_core/tbe/kernel"


def test_debug_package_is_built_and_removed(tmp_path, monkeypatch):
    opp, debug = tmp_path / "opp", tmp_path / "debug"
    (opp / KERNELS).mkdir(parents=True)
    (opp / KERNELS / "release.o").write_text("release")
    (opp / "version.info").write_text("8.5")
    (debug / KERNELS).mkdir(parents=True)
    (debug / KERNELS / "debug.o").write_text("debug")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("ASCEND_OPP_PATH", str(opp))
    monkeypatch.setenv("ASCEND_OPP_DEBUG_PATH", str(debug))
    monkeypatch.delenv("ASCEND_LAUNCH_BLOCKING", raising=False)
    manager = kernel_check.KernelPathManager()
    copy = work / "opp_debug_path"
    assert os.environ["ASCEND_OPP_PATH"] == str(copy) and os.environ["ASCEND_LAUNCH_BLOCKING"] == "1"
    assert (copy / "version.info").read_text() == "8.5"
    assert (copy / KERNELS).is_symlink() and sorted(os.listdir(copy / KERNELS)) == ["debug.o"]
    manager.clear_debug_env()
    assert not copy.exists() and not (work / "opp_debug.lock").exists()
    assert (debug / KERNELS / "debug.o").exists() and (opp / KERNELS / "release.o").exists()


def test_missing_paths_are_reported_and_nothing_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASCEND_OPP_PATH", str(tmp_path / "none"))
    monkeypatch.setenv("ASCEND_OPP_DEBUG_PATH", str(tmp_path / "none2"))
    kernel_check.KernelPathManager()
    out = capsys.readouterr().out
    assert "-[ERROR] ASCEND_OPP_PATH is not exists." in out
    assert not (tmp_path / "opp_debug_path").exists()
    _print_error_log("x")
    assert f"({os.getpid()})-[ERROR] x" in capsys.readouterr().out


def test_event_handler_prints_the_operator(capsys):
    handler = kernel_check.EventHandler()
    handler._handle_acl_start_execution("aclnnAdd")
    handler._handle_acl_finish_execution("aclnnAdd")
    out = capsys.readouterr().out
    assert f"[sanitizer]({os.getpid()}) ====== Start acl operator aclnnAdd" in out
    assert "====== aclnnAdd python stack info:" in out and "test_event_handler_prints_the_operator" in out
