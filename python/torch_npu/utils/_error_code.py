"""torch_npu's error codes: the suffix torch_npu appends to its Python error messages.

``ops_error(ErrCode.VALUE)`` returns ``"\\n[ERROR] <time> (PID:<pid>, Device:<d>, RankID:<r>)
ERR01003 OPS invalid value"``: ``ERR`` + the submodule (2 digits) + the code (3 digits).
The suffix is empty with ``TORCH_NPU_COMPACT_ERROR_OUTPUT=1`` and in an interactive
session, as in torch_npu. Code written for torch_npu raises with it, e.g.
``raise ValueError("bad shape" + ops_error(ErrCode.VALUE))``.
"""

import os
import sys
import time
from enum import Enum

__all__ = ["ErrCode", "pta_error", "ops_error", "dist_error", "graph_error", "prof_error"]


class _SubModuleID(Enum):
    PTA = 0
    OPS = 1
    DIST = 2
    GRAPH = 3
    PROF = 4
    UNKNOWN = 99


class ErrCode(Enum):
    """An error's (code, description)."""
    SUCCESS = (0, "success")
    PARAM = (1, "invalid parameter")
    TYPE = (2, "invalid type")
    VALUE = (3, "invalid value")
    PTR = (4, "invalid pointer")
    INTERNAL = (5, "internal error")
    MEMORY = (6, "memory error")
    NOT_SUPPORT = (7, "feature not supported")
    NOT_FOUND = (8, "resource not found")
    UNAVAIL = (9, "resource unavailable")
    SYSCALL = (10, "system call failed")
    TIMEOUT = (11, "timeout error")
    PERMISSION = (12, "permission error")
    ACL = (100, "call acl api failed")
    HCCL = (200, "call hccl api failed")
    GE = (300, "call ge api failed")
    EXCEPT = (999, "applicaiton exception")  # sic: torch_npu's text

    @property
    def code(self):
        return self.value[0]

    @property
    def msg(self):
        return self.value[1]


def get_env_compact_error_output():
    """``TORCH_NPU_COMPACT_ERROR_OUTPUT`` as an int (0 unless set)."""
    return int(os.getenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0"))


def _is_interactive():
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def _device_id():
    # Never initialise the runtime just to format a message.
    try:
        import torch_npu.npu

        return torch_npu.npu.current_device() if torch_npu.npu.is_initialized() else -1
    except Exception:  # noqa: BLE001  (formatting an error must not raise)
        return -1


def _rank_id():
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else -1
    except Exception:  # noqa: BLE001
        return -1


def _format_error_msg(submodule, error_code):
    if get_env_compact_error_output() or _is_interactive():
        return ""
    return (f"\n[ERROR] {time.strftime('%Y-%m-%d-%H:%M:%S', time.localtime())} "
            f"(PID:{os.getpid()}, Device:{_device_id()}, RankID:{_rank_id()}) "
            f"ERR{submodule.value:0>2d}{error_code.code:0>3d} {submodule.name} {error_code.msg}")


def pta_error(error: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.PTA, error)


def ops_error(error: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.OPS, error)


def dist_error(error: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.DIST, error)


def graph_error(error: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.GRAPH, error)


def prof_error(error: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.PROF, error)
