"""``AiCpuBean``: a row of msprof's aicpu CSV (data_preprocess / AI CPU operators)."""
from ._common_bean import _RowBean

__all__ = []


class AiCpuBean(_RowBean):
    HEADERS = ["Timestamp", "Node", "Compute_time(ms)", "Memcpy_time(us)", "Task_time(ms)", "Dispatch_time(ms)",
               "Total_time(ms)", "Stream ID", "Task ID"]

    def __init__(self, data: dict):
        super().__init__(data)
