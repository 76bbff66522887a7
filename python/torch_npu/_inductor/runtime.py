"""Called by the Python wrappers Inductor generates for npu graphs (keep this import-light)."""
import torch

__all__ = ["wait_for_stream"]

_current_stream = torch.accelerator.current_stream


def wait_for_stream(device_index: int) -> None:
    """Block until the work queued on the current stream of npu ``device_index`` is done.

    Inductor's generated C++ kernels run on the calling thread and touch npu memory directly,
    while npu ops (``extern_kernels.addmm``, fallback ops, the eager code that produced the
    inputs) are queued on the stream and run later on its worker. The generated wrapper calls
    this before each C++ kernel so the kernel sees their results, and so that none of them
    still reads a buffer the kernel overwrites. An idle stream (the usual case: nothing was
    queued since the last wait) is only queried, which is several times cheaper than a
    synchronize.
    """
    stream = _current_stream(device_index)
    if not stream.query():
        stream.synchronize()
