"""``FwkCANNRelationParser``: which device tasks each host op started, and each step's span
on the device, as torch_npu's.

msprof's timeline links each host launch (by its start, ns) to its device tasks
(``CANNFileParser.combine_acl_to_npu``). With the task queue, the launches run on the
dequeue thread: a launch belongs to the dequeue whose span holds its start, so the kernel
dict is keyed by the dequeue's correlation id (``combine_kernel_dict``), which the enqueue
of the host op shares. Without it the launch times themselves are the keys.

``get_step_range(root, kernel_dict)``: for each ``ProfilerStep#N`` node of the op tree, its
span on the device: from the first task of its first launch (its host start when none) to
the later of its last task's end and its host end.
"""
import os

from .._profiler_config import ProfilerConfig
from ..prof_bean._torch_op_node import TorchOpNode
from ..prof_common_func._constant import Constant, print_error_msg
from ..prof_common_func._log import ProfilerLogger
from ._cann_file_parser import CANNFileParser
from ._fwk_file_parser import FwkFileParser

__all__ = []


class FwkCANNRelationParser:
    def __init__(self, profiler_path: str):
        self._profiler_path = profiler_path
        ProfilerLogger.init(self._profiler_path, "FwkCANNRelationParser")
        self.logger = ProfilerLogger.get_instance()

    @classmethod
    def combine_kernel_dict(cls, acl_to_npu_dict: dict, dequeue_data_list: list) -> dict:
        """{dequeue correlation id: the tasks of the launches inside that dequeue} (both in
        time order); without dequeues, ``acl_to_npu_dict`` itself."""
        if not dequeue_data_list:
            return acl_to_npu_dict
        kernel_dict = {}
        index = 0
        for acl_start_time in sorted(acl_to_npu_dict):
            while index < len(dequeue_data_list):
                dequeue = dequeue_data_list[index]
                if dequeue.ts > acl_start_time:
                    break  # a launch outside every dequeue
                if acl_start_time <= dequeue.ts + dequeue.dur:
                    kernel_dict.setdefault(dequeue.corr_id, []).extend(acl_to_npu_dict.get(acl_start_time, []))
                    break
                index += 1
        return kernel_dict

    @classmethod
    def _update_step_node_info(cls, step_node_list: list, acl_start_time_list: list) -> None:
        """Gives each step node the launches (sorted times) inside its span."""
        step_node_list.sort(key=lambda node: node.start_time)
        index = 0
        for acl_start_time in acl_start_time_list:
            while index < len(step_node_list):
                node = step_node_list[index]
                if node.start_time <= acl_start_time <= node.end_time:
                    node.update_corr_id_total(acl_start_time)
                    break
                if acl_start_time < node.start_time:
                    break
                index += 1

    def get_kernel_dict(self, dequeue_data: list) -> dict:
        acl_to_npu_dict = CANNFileParser(self._profiler_path).get_acl_to_npu_data()
        if not acl_to_npu_dict and ProfilerConfig().get_level() != Constant.LEVEL_NONE:
            print_error_msg("Failed to get acl to npu flow events. For details, please check the logs at: "
                            f"{os.path.join(self._profiler_path, 'logs')}")
            return acl_to_npu_dict
        return self.combine_kernel_dict(acl_to_npu_dict, dequeue_data)

    def get_step_range(self, root_node: TorchOpNode, kernel_dict: dict) -> list:
        """[{step_id, start_ts, end_ts, comm_ops: {}, fwk_step_start_ts}] per ProfilerStep node (ns)."""
        if not kernel_dict:
            self.logger.error("Failed to get the step range; the kernel dict is empty.")
            return []
        step_nodes = [node for node in root_node.child_node_list if node.is_profiler_step()]
        if not step_nodes:
            self.logger.warning("Failed to get the step range; the step node list is empty.")
            return []
        if not FwkFileParser(self._profiler_path).has_task_queue_data():
            self._update_step_node_info(step_nodes, sorted(kernel_dict))
        step_range = []
        for node in step_nodes:
            if not node.corr_id_total:
                self.logger.error("There are no flow events in the %s range.", node.event.name)
                continue
            corr_ids = sorted(node.corr_id_total)
            first_kernels = next((kernel_dict[i] for i in corr_ids if kernel_dict.get(i)), [])
            last_kernels = next((kernel_dict[i] for i in reversed(corr_ids) if kernel_dict.get(i)), [])
            device_start = min(k.ts for k in first_kernels) if first_kernels else node.start_time
            device_end = max(k.end_ns for k in last_kernels) if last_kernels else Constant.INVALID_VALUE
            step_range.append({Constant.STEP_ID: node.event.name.split("#")[-1], Constant.START_TS: device_start,
                               Constant.END_TS: max(device_end, node.end_time), Constant.COMM_OPS: {},
                               Constant.FWK_START_TS: node.start_time})
        return step_range
