"""torch_npu.utils.profiler: ``Profile``, torch_npu's one-step profiling helper, and ``Singleton``.

``Profile(start_step=10, save_path="./npu_profiling", profile_type=None, use_npu=True,
record_shape=True, experimental_config=..., **kwargs)`` is one object per process (the
``Singleton`` decorator). Each ``start()``/``end()`` pair is one step; the ``start_step``-th
step is profiled with torch.autograd.profiler.profile (``profile_type="TORCH"``, a chrome
trace ``torch_prof_<time>.json`` in save_path) or torch_npu.profiler.profile
(``"ASCEND_PROFILER"``, torch_npu's result directory in save_path), and, as torch_npu's,
``end()`` of that step exits the process (``sys.exit()``) once the data is written. Any
other ``profile_type`` disables it.
"""
import os
import sys
import time
from typing import Optional

import torch

__all__ = []


def Singleton(cls):
    """Class decorator: the first call creates the instance, later calls return it."""
    _instances = {}

    def _singleton(*args, **kwargs):
        if cls not in _instances:
            _instances[cls] = cls(*args, **kwargs)
        return _instances[cls]
    return _singleton


def _default_experimental_config():
    import torch_npu

    return torch_npu.profiler._ExperimentalConfig(profiler_level=torch_npu.profiler.ProfilerLevel.Level2)


@Singleton
class Profile(object):
    def __init__(self, start_step: int = 10, save_path: str = "./npu_profiling", profile_type: str = None,
                 use_npu=True, record_shape: bool = True, experimental_config: Optional[object] = None, **kwargs):
        import torch_npu

        self.step_count = 0
        self.save_path = save_path
        self.profile_type = profile_type
        self.enable = self.profile_type in ["TORCH", "ASCEND_PROFILER"]
        self.start_step = start_step
        self.use_npu = use_npu
        self.record_shape = record_shape
        self.experimental_config = experimental_config or _default_experimental_config()
        self.count = 0
        if self.enable:
            torch_args_set = {"enabled", "use_cuda", "record_shapes", "with_flops", "profile_memory",
                              "with_stack", "use_kineto", "use_cpu", "use_npu_simple"}
            ascend_profiler_args_set = {"activities", "schedule", "record_shapes", "profile_memory", "with_stack"}
            if self.profile_type == "TORCH":
                if not set(kwargs).issubset(torch_args_set):
                    raise ValueError(f"Args '{kwargs.keys()}' invaild, expect args '{torch_args_set}' .")
                kwargs.pop("use_npu_simple", None)
                kwargs.pop("use_cuda", None)
                if self.use_npu:
                    kwargs["use_device"] = "npu"
                self.prof = torch.autograd.profiler.profile(**kwargs)
            else:
                if not set(kwargs).issubset(ascend_profiler_args_set):
                    raise ValueError(f"Args '{kwargs.keys()}' invaild, expect args '{ascend_profiler_args_set}' .")
                kwargs.setdefault("record_shapes", self.record_shape)
                self.prof = torch_npu.profiler.profile(
                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(self.save_path),
                    experimental_config=self.experimental_config, **kwargs)
            try:
                os.makedirs(self.save_path, exist_ok=True)
            except Exception as e:
                raise ValueError(f"the path of '{self.save_path}' is invaild.") from e

    def __del__(self):
        if self.count != 0:
            self.end()

    def start(self):
        if self.count != 0:
            raise RuntimeError("start interface can only be called once")
        self.count = self.count + 1
        if self.enable:
            self.step_count = self.step_count + 1
            if self.step_count == self.start_step:
                self.prof.__enter__()

    def end(self):
        if self.count == 0:
            raise RuntimeError("start interface must be called after end")
        self.count = 0
        if self.enable and self.step_count == self.start_step:
            self.prof.__exit__(None, None, None)
            if self.profile_type == "TORCH":
                filename = "torch_prof_" + time.strftime("%Y%m%d%H%M%S") + ".json"
                self.prof.export_chrome_trace(os.path.join(self.save_path, filename))
            sys.exit()
