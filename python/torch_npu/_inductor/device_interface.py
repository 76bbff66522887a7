"""Dynamo's device interface for npu: how Dynamo and Inductor query the device."""
import torch
from torch._dynamo.device_interface import CpuInterface

__all__ = ["NpuInterface"]


class NpuInterface(CpuInterface):
    """npu as Dynamo/Inductor see it: a CPU-like device (Inductor generates C++ kernels for it)
    with torch.npu's devices, current device and synchronization.

    It derives from ``CpuInterface`` for what only makes sense for a code generator target
    (host-clock ``Event``, worker properties reporting the host's cores, which Inductor's C++
    backend parallelises over) and takes everything about devices from ``torch.npu``.
    """

    device = torch.npu.device
    # Dynamo recognises streams made, entered and read in a compiled function by these objects
    # (a torch.npu.stream(s) block, torch.npu.current_stream() become graph objects)
    Stream = torch.npu.Stream
    stream = staticmethod(torch.npu.stream)
    current_stream = staticmethod(torch.npu.current_stream)
    set_stream = staticmethod(torch.npu.set_stream)

    class Worker(CpuInterface.Worker):
        @staticmethod
        def set_device(device: int) -> None:
            torch.npu.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.npu.current_device()

    @staticmethod
    def is_available() -> bool:
        return torch.npu.is_available()

    @staticmethod
    def device_count() -> int:
        return torch.npu.device_count()

    @staticmethod
    def current_device() -> int:
        return torch.npu.current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        torch.npu.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        previous = torch.npu.current_device()
        if device >= 0 and device != previous:
            torch.npu.set_device(device)
        return previous

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.npu.current_device()
        torch.npu.set_device(device)
        return previous

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch.npu.current_stream(device_idx).npu_stream

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        torch.npu.synchronize(device)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True
