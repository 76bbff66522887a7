"""``NpuProfiler.analyse``: torch_npu's entry to parse result directories (here
``torch_npu.profiler.analyse``, which builds ASCEND_PROFILER_OUTPUT from the raw data)."""
import os
from typing import Optional

from .prof_common_func._constant import Constant

__all__ = []


class NpuProfiler:
    @classmethod
    def analyse(cls, input_path: str, analysis_type: str = Constant.TENSORBOARD_TRACE_HANDLER,
                output_path: Optional[str] = None, **kwargs) -> None:
        """Parse ``input_path`` (one ``*_ascend_pt`` directory or a folder of them); kwargs:
        ``max_process_number``, ``export_type``. Only the tensorboard_trace_handler layout
        exists here (``export_chrome_trace`` etc. write their files directly)."""
        from ..profiler import analyse

        if analysis_type != Constant.TENSORBOARD_TRACE_HANDLER:
            raise ValueError(f"NpuProfiler.analyse: analysis_type must be {Constant.TENSORBOARD_TRACE_HANDLER!r}, "
                             f"got {analysis_type!r}")
        if output_path is not None:
            raise ValueError("NpuProfiler.analyse: output_path is not used by tensorboard_trace_handler parsing; "
                             "the results go into each result directory")
        path = os.path.realpath(input_path)
        if not os.path.exists(path):
            raise RuntimeError(f"The path does not exist: {path}")
        analyse(path, max_process_number=kwargs.get("max_process_number", Constant.DEFAULT_PROCESS_NUMBER),
                export_type=kwargs.get("export_type"))
