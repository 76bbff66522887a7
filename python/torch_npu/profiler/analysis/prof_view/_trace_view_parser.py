"""``TraceViewParser``: trace_view.json, as torch_npu's.

Without msprof data it is the host side (``FwkFileParser.get_fwk_trace_data``). With it, the
msprof timeline's events (less the CANN layers the profiler level leaves out,
``ProfilerConfig.get_prune_config``) plus a "torch_to_npu" flow from each host op to the
device tasks it launched: through the task queue (an op's enqueue correlation ids, the
kernel dict of ``FwkCANNRelationParser.combine_kernel_dict``) or, without a task queue, from
the innermost op holding each launch. When TracePreParser has written the host side
already (``Constant.TRACE_VIEW``, left open), these events are appended to it.
"""
import os

from .._profiler_config import ProfilerConfig
from ..prof_common_func._constant import Constant
from ..prof_common_func._file_manager import FileManager
from ..prof_common_func._path_manager import ProfilerPathManager
from ..prof_common_func._trace_event_manager import TraceEventManager
from ..prof_common_func._tree_builder import TreeBuilder
from ..prof_parse._cann_file_parser import CANNFileParser
from ..prof_parse._fwk_cann_relation_parser import FwkCANNRelationParser
from ..prof_parse._fwk_file_parser import FwkFileParser
from ._base_parser import BaseParser

__all__ = []


class TraceViewParser(BaseParser):
    TRACE_VIEW = "trace_view.json"

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        in_folder = isinstance(self._output_path, str) and os.path.isdir(self._output_path)
        self._trace_file_path = os.path.join(self._output_path, self.TRACE_VIEW) if in_folder else self._output_path
        self._temp_trace_file_path = (os.path.join(self._output_path, Constant.TRACE_VIEW) if in_folder
                                      else self._output_path)
        self._trace_data = []
        self._torch_op_node = []
        self._torch_op_data = []
        self._enqueue_data = []
        self._dequeue_data = []
        self._root_node = None

    @staticmethod
    def _prune_trace_by_level(json_data: list) -> list:
        """Drops the events whose name starts with, or whose args' name is, a pruned layer."""
        prune_config = ProfilerConfig().get_prune_config()
        if not prune_config or not json_data:
            return json_data
        return [data for data in json_data
                if not any(data.get("name", "").startswith(key) or data.get("args", {}).get("name", "") == key
                           for key in prune_config)]

    def run(self, deps_data: dict):
        def work():
            ProfilerConfig().load_info(self._profiler_path)
            torch_op_node = deps_data.get(Constant.TREE_BUILD_PARSER, [])
            if torch_op_node:
                self._root_node, self._torch_op_node = torch_op_node[0], torch_op_node[1:]
            self._torch_op_data = deps_data.get(Constant.TORCH_OP_PARSER, [])
            task_queue_data = deps_data.get(Constant.TASK_QUEUE_PARSER, {})
            self._enqueue_data = task_queue_data.get(Constant.ENQUEUE_DATA, [])
            self._dequeue_data = task_queue_data.get(Constant.DEQUEUE_DATA, [])
            self.generate_view()

        return self._run_logged(work, "Failed to generate trace_view.json")

    def generate_view(self) -> None:
        if not ProfilerPathManager.get_cann_path(self._profiler_path):
            self._trace_data = FwkFileParser(self._profiler_path).get_fwk_trace_data(
                self._torch_op_data, self._enqueue_data, self._dequeue_data)
        else:
            msprof_timeline_data = CANNFileParser(self._profiler_path).get_timeline_all_data()
            self._trace_data.extend(self._prune_trace_by_level(msprof_timeline_data))
            if self._torch_op_node:
                self._trace_data.extend(self._get_flow_event(msprof_timeline_data))
        if os.path.exists(self._temp_trace_file_path):
            FileManager.append_trace_json_by_path(self._temp_trace_file_path, self._trace_data, self._trace_file_path)
        else:
            FileManager.create_json_file_by_path(self._trace_file_path, self._trace_data)

    def _get_flow_event(self, msprof_timeline_data: list) -> list:
        flows = []
        acl_to_npu_dict = CANNFileParser.combine_acl_to_npu(msprof_timeline_data)
        if not FwkFileParser(self._profiler_path).has_task_queue_data():
            for acl_ts, kernels in acl_to_npu_dict.items():
                matched_torch_op = TreeBuilder.match_self_torch_op(acl_ts, self._root_node)
                if matched_torch_op:
                    for kernel in kernels:
                        flows.extend(TraceEventManager.create_torch_to_npu_flow(matched_torch_op.event, kernel))
            return flows
        kernel_dict = FwkCANNRelationParser.combine_kernel_dict(acl_to_npu_dict, self._dequeue_data)
        for torch_op_node in self._torch_op_node:
            for corr_id in torch_op_node.corr_id_self:
                for kernel in kernel_dict.get(corr_id, []):
                    flows.extend(TraceEventManager.create_torch_to_npu_flow(torch_op_node.event, kernel))
        return flows
