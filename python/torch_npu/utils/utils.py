"""torch_npu's console log helpers: ``<YYYY-mm-dd HH:MM:SS>(<pid>)-[<LEVEL>] <message>`` on stdout."""
import os
import time

__all__ = []


def _print_log(level: str, msg) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(time.time())))
    print(f"{stamp}({os.getpid()})-[{level}] {msg}")


def _print_info_log(info_msg) -> None:
    _print_log("INFO", info_msg)


def _print_warn_log(warn_msg) -> None:
    _print_log("WARNING", warn_msg)


def _print_error_log(error_msg) -> None:
    _print_log("ERROR", error_msg)
