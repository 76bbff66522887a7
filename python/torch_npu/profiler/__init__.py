"""torch_npu.profiler: profile host operators and npu tasks together, as in torch_npu.

    with torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
            schedule=torch_npu.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler("./result"),
            record_shapes=True) as prof:
        for step in range(6):
            train_step()
            prof.step()
"""
import sys as _sys

import torch_npu._C as _native

from . import _c_profiler

# torch_npu binds its profiler as torch_npu._C._profiler (ProfilerActivity, NpuProfilerConfig,
# _init_profiler, ...): the same names, see _c_profiler.py.
_native._profiler = _c_profiler
_sys.modules.setdefault("torch_npu._C._profiler", _c_profiler)
from .experimental_config import (AiCMetrics, ExportType, HostSystem, ProfilerLevel, _ExperimentalConfig,
                                  supported_ai_core_metrics, supported_export_type, supported_profiler_level)
from .profiler import (ProfilerAction, ProfilerActivity, _KinetoProfile, analyse, profile, schedule,
                       supported_activities, tensorboard_trace_handler)
from . import dynamic_profile  # noqa: E402  (torch_npu.profiler.dynamic_profile.init / step / start)
from ._non_intrusive_profile import _NonIntrusiveProfile
from ._add_metadata_sanitizer_patch import _apply_metadata_sanitizer_patch

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler", "schedule",
           "ProfilerAction", "_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem", "analyse"]

_apply_metadata_sanitizer_patch()  # torch.profiler's add_metadata cannot break its trace
_NonIntrusiveProfile.init()  # PROF_CONFIG_PATH: dynamic profiling driven by optimizer.step()
