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
    def current_stream() -> torch.Stream:
        return torch.npu.current_stream()

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch.npu.current_stream(device_idx).npu_stream

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        torch.npu.synchronize(device)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True
