"""``torch_npu.utils._dynamo``: torch_npu's hooks into Dynamo (torch_npu/_inductor/registration.py).

``import torch_npu`` registers them when Dynamo is first used; the function here lets code
that reads Dynamo's device registry directly do it first.
"""
from torch_npu._inductor.registration import register_device_interface

__all__ = []


def _dynamo_register_interface_for_device() -> None:
    """Registers the ``npu`` device interface with Dynamo (``torch._dynamo.device_interface.
    get_interface_for_device("npu")``: streams, events, synchronisation, raw streams)."""
    register_device_interface()
