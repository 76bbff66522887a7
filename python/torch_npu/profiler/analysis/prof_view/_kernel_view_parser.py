"""``KernelViewParser``: kernel_details.csv, msprof's op_summary rows under torch_npu's column
names, as torch_npu's.

At Level0 only the base columns (``CsvHeaders.OP_SUMMARY_SHOW_HEADERS``) and the shape ones
msprof wrote are kept; at other levels every column. The op_summary names become torch_npu's
(``Op Name`` -> ``Name``, ``Task Duration(us)`` -> ``Duration(us)``, ...). With ProfilerStep
spans (the op tree and the kernel dict of RelationParser), each row starts with the step
whose device span holds the task's start.
"""
from .._profiler_config import ProfilerConfig
from ..prof_bean._op_summary_bean import OpSummaryBean
from ..prof_common_func._constant import Constant, convert_us2ns
from ..prof_common_func._csv_headers import CsvHeaders
from ..prof_common_func._file_manager import FileManager
from ..prof_parse._cann_file_parser import CANNDataEnum, CANNFileParser
from ..prof_parse._fwk_cann_relation_parser import FwkCANNRelationParser
from ._base_parser import BaseParser

__all__ = []

_KERNEL_NAMES = dict(zip(CsvHeaders.OP_SUMMARY_SHOW_HEADERS, CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS))


def _start_ns(data: OpSummaryBean):
    try:
        return convert_us2ns(data.ts)
    except RuntimeError:
        return None


class KernelViewParser(BaseParser):
    KERNEL_VIEW = "kernel_details.csv"

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self.step_range = []

    @classmethod
    def _project_map_for_headers(cls, input_headers: list) -> list:
        return [_KERNEL_NAMES.get(header, header) for header in input_headers]

    @classmethod
    def _get_kernel_headers(cls, all_headers: list, is_all_kernel_headers: bool) -> list:
        if is_all_kernel_headers:
            return all_headers
        return CsvHeaders.OP_SUMMARY_SHOW_HEADERS + [h for h in CsvHeaders.OP_SUMMARY_SHAPE_HEADERS if h in all_headers]

    def run(self, deps_data: dict):
        def work():
            ProfilerConfig().load_info(self._profiler_path)
            self._init_step_range(deps_data)
            self.generate_view()

        return self._run_logged(work, "Failed to generate kernel_details.csv")

    def _step_of(self, data: OpSummaryBean):
        start = _start_ns(data)
        if start is None:
            return None
        return next((step[Constant.STEP_ID] for step in self.step_range
                     if step[Constant.START_TS] <= start <= step[Constant.END_TS]), None)

    def generate_view(self) -> None:
        rows = []
        output_headers = CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS
        for file_path in CANNFileParser(self._profiler_path).get_file_list_by_type(CANNDataEnum.OP_SUMMARY):
            all_data = FileManager.read_csv_file(file_path, OpSummaryBean)
            if all_data:
                OpSummaryBean.headers = self._get_kernel_headers(all_data[0].all_headers,
                                                                 ProfilerConfig().is_all_kernel_headers())
                output_headers = self._project_map_for_headers(OpSummaryBean.headers)
            if self.step_range:
                rows.extend([self._step_of(data)] + data.row for data in all_data)
            else:
                rows.extend(data.row for data in all_data)
        headers = ["Step Id"] + output_headers if self.step_range else output_headers
        FileManager.create_csv_file(self._output_path, rows, self.KERNEL_VIEW, headers)

    def _init_step_range(self, deps_data: dict) -> None:
        """The steps' device spans (ns)."""
        torch_op_node = deps_data.get(Constant.TREE_BUILD_PARSER, [])
        if not torch_op_node:
            return
        kernel_dict = deps_data.get(Constant.RELATION_PARSER, {})
        if not kernel_dict:
            self.logger.error("Kernel view failed to get the step range; the kernel dict is empty.")
            return
        step_range = FwkCANNRelationParser(self._profiler_path).get_step_range(torch_op_node[0], kernel_dict)
        if not step_range:
            self.logger.warning("Kernel view failed to get the step range; the step range is empty.")
        self.step_range = [{Constant.STEP_ID: step.get(Constant.STEP_ID),
                            Constant.START_TS: step.get(Constant.START_TS, 0),
                            Constant.END_TS: step.get(Constant.END_TS, 0)} for step in step_range]
