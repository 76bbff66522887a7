"""``get_host_info()``: this host's name and uid (``torch_npu._C._profiler._get_host_uid``, as
text), which the db export writes into its HOST_INFO table."""
import socket

from torch_npu._C._profiler import _get_host_uid

__all__ = []


def get_host_info() -> dict:
    return {"host_name": socket.gethostname(), "host_uid": str(_get_host_uid())}
