"""``torch.npu.comm``: broadcast, scatter, gather and reduce_add between npu devices, the
functions of ``torch.cuda.comm`` (``torch.nn.parallel.comm``; nn.DataParallel uses them). Their
device primitives on ``torch._C`` serve npu tensors (``torch_npu/_data_parallel.py``)."""

from torch.nn.parallel.comm import (  # noqa: F401
    broadcast,
    broadcast_coalesced,
    gather,
    reduce_add,
    reduce_add_coalesced,
    scatter,
)

__all__ = ["broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather"]
