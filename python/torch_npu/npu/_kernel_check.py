"""Kernel check support of the NPU sanitizer (torch_npu's ``torch_npu.npu._kernel_check``).

``KernelPathManager`` builds a private operator package for debug kernels: it copies the
package named by ``ASCEND_OPP_PATH`` into ``./opp_debug_path``, replaces its AI Core kernel
folder (``built-in/op_impl/ai_core/tbe/kernel``) with a link to the one of the package named
by ``ASCEND_OPP_DEBUG_PATH``, points ``ASCEND_OPP_PATH`` at the copy and sets
``ASCEND_LAUNCH_BLOCKING=1`` (so a failing kernel is reported at its launch). Processes
sharing the working directory take turns through the lock file ``./opp_debug.lock``.
``EventHandler`` prints, per operator, its start and the Python stack that launched it.

The simulator's kernels are host code and read no operator package: the copy only matters
to programs that look at ``ASCEND_OPP_PATH`` themselves.
"""
import fcntl
import os
import shutil
import traceback
from typing import Callable

import torch_npu.utils._npu_trace as npu_trace
from torch_npu.utils.utils import _print_error_log, _print_info_log, _print_warn_log

__all__ = []

_KERNEL_DIR = "built-in/op_impl/ai_core/tbe/kernel"
_LOCK_NAME = "opp_debug.lock"


class EventHandler:
    """Prints the operators the sanitizer sees start and finish."""

    def _handle_acl_start_execution(self, acl_name: str):
        npu_trace.print_check_msg(f"====== Start acl operator {acl_name}")

    def _handle_acl_finish_execution(self, acl_name: str):
        frames = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
        frames.reverse()  # walk_stack goes from the innermost frame out
        npu_trace.print_check_msg(f"====== {acl_name} python stack info:\n{''.join(frames.format())}")


class KernelPathManager:
    """The debug operator package (see the module's doc)."""

    def __init__(self):
        self.folder_permission = 0o750
        self.ascend_opp_path = os.getenv("ASCEND_OPP_PATH")
        self.opp_debug_path = os.path.join(os.getcwd(), "opp_debug_path")
        self.opp_debug_kernel_path = os.getenv("ASCEND_OPP_DEBUG_PATH")
        self.func_with_lock(self.make_opp_debug_path)
        os.environ["ASCEND_LAUNCH_BLOCKING"] = "1"
        os.environ["ASCEND_OPP_PATH"] = self.opp_debug_path

    @staticmethod
    def _lock_path() -> str:
        return os.path.join(os.getcwd(), _LOCK_NAME)

    def func_with_lock(self, func: Callable):
        r"""Run ``func`` holding the working directory's lock file; if another process holds it,
        warn and skip ``func``."""
        fd = os.open(self._lock_path(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o600)
        with os.fdopen(fd, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                func()
            except IOError:
                _print_warn_log(f"Permission denied to execute {func}")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def make_opp_debug_path(self):
        r"""Copy the operator package and link the debug kernels into the copy."""
        if not os.path.exists(self.ascend_opp_path):
            _print_error_log("ASCEND_OPP_PATH is not exists.")
            return
        if not os.path.exists(self.opp_debug_kernel_path):
            _print_error_log("ASCEND_OPP_DEBUG_PATH is not exists.")
            return
        debug_kernels = os.path.join(self.opp_debug_kernel_path, _KERNEL_DIR)
        if not os.path.exists(debug_kernels):
            _print_warn_log("ASCEND_OPP_DEBUG_PATH is not valid kernel path.")
            return
        kernels = os.path.join(self.opp_debug_path, _KERNEL_DIR)
        if os.path.islink(kernels):
            os.unlink(kernels)
        if os.path.exists(self.opp_debug_path):
            shutil.rmtree(self.opp_debug_path)
        shutil.copytree(self.ascend_opp_path, self.opp_debug_path)
        os.chmod(self.opp_debug_path, self.folder_permission)
        if os.path.islink(kernels):
            os.unlink(kernels)
        elif os.path.exists(kernels):
            shutil.rmtree(kernels)
        os.makedirs(os.path.dirname(kernels), exist_ok=True)
        os.symlink(debug_kernels, kernels)

    def remove_debug_files(self):
        r"""Remove the debug package (the link first, so the debug kernels stay)."""
        os.unlink(os.path.join(self.opp_debug_path, _KERNEL_DIR))
        shutil.rmtree(self.opp_debug_path)

    def clear_debug_env(self):
        r"""Remove the debug package and the lock file, if the package exists."""
        if not os.path.exists(self.opp_debug_path):
            return
        self.func_with_lock(self.remove_debug_files)
        try:
            os.remove(self._lock_path())
        except FileNotFoundError as err:
            _print_info_log(err)
