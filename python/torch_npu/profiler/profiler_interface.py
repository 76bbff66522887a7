"""torch_npu.profiler.profiler_interface: the activities this profiler can record."""
from .profiler import supported_activities

__all__ = ["supported_activities"]
