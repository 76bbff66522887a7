"""``CommunicationParser``: communication.json and communication_matrix.json, msprof's
communication analysis (``analyze/communication.json``, ``communication_matrix.json``) split
by step, as torch_npu's.

communication.json: ``{"step<N>": {"p2p": {op: info, ..., "Total Op Info": totals},
"collective": {...}}}``; an op belongs to the step whose device span holds its start
(``Communication Time Info`` / ``Start Timestamp(us)``), p2p ops are the send / receive /
batchsendrecv ones. The totals sum the ops' times (ms) and, per transport type, their
transit time, size and size distribution; the wait and synchronization ratios are of the
summed times. communication_matrix.json: per step and kind, per op type and group, the
links' top, middle and bottom entries by bandwidth and their total. Without steps the key
is ``"step"``.
"""
import re
from collections import defaultdict

from ..prof_bean._torch_op_node import TorchOpNode
from ..prof_common_func._constant import Constant, convert_us2ns, print_warn_msg
from ..prof_common_func._file_manager import FileManager
from ..prof_parse._cann_file_parser import CANNDataEnum, CANNFileParser
from ..prof_parse._fwk_cann_relation_parser import FwkCANNRelationParser
from ._base_parser import BaseParser

__all__ = []


def _step_name(step_info: dict) -> str:
    return "step" + step_info["step_id"] if step_info.get("step_id") else "step"


class CommunicationParser(BaseParser):
    COMMUNICATION_TIME_INFO = "Communication Time Info"
    START_TIMESTAMP = "Start Timestamp(us)"
    COMMUNICATION_BANDWIDTH_INFO = "Communication Bandwidth Info"
    HCOM_SEND = "hcom_send"
    HCOM_RECEIVE = "hcom_receive"
    HCOM_BATCHSENDRECV = "hcom_batchsendrecv"
    HCCL_PATTERN = (r"send|reduce|invalid|broadcast|allreduce|receive|allgather|reducescatter|scatter|alltoall|"
                    r"alltoallv|alltoallvc|batchsendrecv")
    TOTAL = "total"
    SYNCHRONIZATION_TIME_RATIO = "Synchronization Time Ratio"
    SYNCHRONIZATION_TIME_MS = "Synchronization Time(ms)"
    WAIT_TIME_RATIO = "Wait Time Ratio"
    TRANSIT_TIME_MS = "Transit Time(ms)"
    TRANSIT_SIZE_MB = "Transit Size(MB)"
    SIZE_DISTRIBUTION = "Size Distribution"
    WAIT_TIME_MS = "Wait Time(ms)"
    BANDWIDTH_GB_S = "Bandwidth(GB/s)"
    COMMUNICATION = "communication.json"
    COMMUNICATION_MATRIX = "communication_matrix.json"
    P2P = "p2p"
    COLLECTIVE = "collective"
    TRANSPORT_TYPE = "Transport Type"
    TOTAL_OP_INFO = "Total Op Info"

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._root_node = TorchOpNode()
        self._kernel_dict = {}
        self.step_list = []

    @staticmethod
    def combine_size_distribution(op_dict: dict, total_dict: dict) -> None:
        """Adds an op's {size: [count, time]} into the totals."""
        for size, (count, duration) in op_dict.items():
            total_dict[size][0] += count
            total_dict[size][1] += duration

    @staticmethod
    def compute_ratio(dividend: float, divisor: float) -> float:
        return 0 if abs(divisor) < 1e-15 else round(dividend / divisor, 4)

    def run(self, deps_data: dict):
        def work():
            self._init_step_list(deps_data)
            self.generate_view()

        return self._run_logged(work, "Failed to generate communication.json or communication_matrix.json")

    def generate_view(self) -> None:
        self.generate_communication(self._output_path)
        self.generate_matrix(self._output_path)

    def generate_communication(self, output_path: str) -> None:
        data = CANNFileParser(self._profiler_path).get_analyze_communication_data(CANNDataEnum.COMMUNICATION)
        if not data:
            return
        self.split_comm_op_by_step(data)
        output = {_step_name(step): self.get_communication_ops_dict(step.get(Constant.COMM_OPS))
                  for step in self.step_list}
        FileManager.create_json_file(output_path, output, self.COMMUNICATION)

    def generate_matrix(self, output_path: str) -> None:
        data = CANNFileParser(self._profiler_path).get_analyze_communication_data(CANNDataEnum.MATRIX)
        if not data:
            return
        output = {step: self.get_matrix_ops_dict(ops) for step, ops in self.split_matrix_by_step(data).items()}
        FileManager.create_json_file(output_path, output, self.COMMUNICATION_MATRIX)

    def split_comm_op_by_step(self, communication_data: dict) -> None:
        """Puts each op into the step holding its start (with one step: every op)."""
        if len(self.step_list) == 1:
            self.step_list[0][Constant.COMM_OPS] = communication_data
        for op_name, op_info in communication_data.items():
            start = convert_us2ns(op_info.get(self.COMMUNICATION_TIME_INFO, {}).get(self.START_TIMESTAMP))
            for step in self.step_list:
                if step.get(Constant.START_TS, -1) <= start <= step.get(Constant.END_TS, -1):
                    step.setdefault(Constant.COMM_OPS, {})[op_name] = op_info
                    break

    def split_communication_p2p_ops(self, op_data: dict) -> dict:
        ops = {self.P2P: {}, self.COLLECTIVE: {}}
        for op_name, info in op_data.items():
            lower = op_name.lower()
            if lower.startswith((self.HCOM_SEND, self.HCOM_RECEIVE, self.HCOM_BATCHSENDRECV)):
                ops[self.P2P][op_name] = info
            elif not lower.startswith(self.TOTAL):
                ops[self.COLLECTIVE][op_name] = info
        return ops

    def compute_total_link_info(self, op_matrix_data: dict) -> None:
        """Adds "Total Op Info": per link, the summed transit time and size and their bandwidth."""
        totals = defaultdict(lambda: {self.TRANSPORT_TYPE: "", self.TRANSIT_TIME_MS: 0, self.TRANSIT_SIZE_MB: 0})
        for link_dict in op_matrix_data.values():
            for link, info in link_dict.items():
                totals[link][self.TRANSIT_TIME_MS] += info.get(self.TRANSIT_TIME_MS, 0)
                totals[link][self.TRANSIT_SIZE_MB] += info.get(self.TRANSIT_SIZE_MB, 0)
                totals[link][self.TRANSPORT_TYPE] = info.get(self.TRANSPORT_TYPE, 0)
        for info in totals.values():
            info[self.BANDWIDTH_GB_S] = self.compute_ratio(info[self.TRANSIT_SIZE_MB], info[self.TRANSIT_TIME_MS])
        op_matrix_data[self.TOTAL_OP_INFO] = totals

    def split_matrix_by_step(self, matrix_data: dict) -> dict:
        """The matrix's ops by the step communication.json put them in (all in "step" without steps)."""
        if self.is_step_list_empty():
            return {"step": matrix_data}
        by_step = {}
        for op_name in matrix_data:
            step = next((s for s in self.step_list if op_name in s.get(Constant.COMM_OPS, {})), None)
            if step is not None:
                by_step.setdefault(_step_name(step), {})[op_name] = matrix_data[op_name]
        return by_step

    def get_communication_ops_dict(self, op_data: dict) -> dict:
        ops = self.split_communication_p2p_ops(op_data)
        self.compute_total_info(ops[self.P2P])
        self.compute_total_info(ops[self.COLLECTIVE])
        return ops

    def get_matrix_ops_dict(self, op_data: dict) -> dict:
        ops = self.split_communication_p2p_ops(op_data)
        return {kind: self.integrate_matrix_data(self.get_comm_type(ops[kind])) for kind in (self.P2P, self.COLLECTIVE)}

    def get_comm_type(self, op_data: dict) -> dict:
        """{(op type, group, link): [the links' entries, each with its "Op Name"]}."""
        by_type = defaultdict(list)
        pattern = re.compile(self.HCCL_PATTERN)
        for op_name, info in op_data.items():
            match = pattern.search(op_name.lower())
            if match:
                op_type = match.group()
            else:
                op_type = op_name.split("__")[0]
                print_warn_msg(f"Unknown communication op type: {op_type}")
            for link, data in info.items():
                data["Op Name"] = op_name.split("@")[0]
                by_type[(op_type, op_name.split("@")[-1], link)].append(data)
        return by_type

    def integrate_matrix_data(self, new_comm_op_dict: dict) -> dict:
        """Per (op type, group): the link entries with the highest, middle and lowest three
        bandwidths, and the link's total."""
        ops = defaultdict(dict)
        for (op_type, group, link), data in new_comm_op_dict.items():
            data.sort(key=lambda entry: entry[self.BANDWIDTH_GB_S], reverse=True)
            size = sum(entry.get(self.TRANSIT_SIZE_MB, 0) for entry in data)
            duration = sum(entry.get(self.TRANSIT_TIME_MS, 0) for entry in data)
            picks = {"top1": data[0], "middle": data[len(data) // 2], "bottom1": data[-1]}
            if len(data) >= 2:
                picks["bottom2"] = data[-2]
            if len(data) >= 3:
                picks["bottom3"] = data[-3]
            picks["total"] = {self.TRANSPORT_TYPE: data[0].get(self.TRANSPORT_TYPE, ""), self.TRANSIT_SIZE_MB: size,
                              self.TRANSIT_TIME_MS: duration,
                              self.BANDWIDTH_GB_S: self.compute_ratio(size, duration)}
            for rank, entry in picks.items():
                ops[f"{op_type}-{rank}@{group}"][link] = entry
        return ops

    def is_step_list_empty(self) -> bool:
        return not any(step.get(Constant.COMM_OPS) for step in self.step_list)

    def compute_total_info(self, comm_ops: dict) -> None:
        """Adds "Total Op Info" (summed times and bandwidth info) to the ops of one kind."""
        if not comm_ops:
            return
        times = defaultdict(float)
        bandwidths = {}
        for op_info in comm_ops.values():
            for section, values in op_info.items():
                if section == self.COMMUNICATION_TIME_INFO:
                    self.combine_time_info(values, times)
                elif section == self.COMMUNICATION_BANDWIDTH_INFO:
                    self.combine_bandwidth_info(values, bandwidths)
        self.compute_time_ratio(times)
        self.compute_bandwidth_ratio(bandwidths)
        comm_ops[self.TOTAL_OP_INFO] = {self.COMMUNICATION_TIME_INFO: times,
                                        self.COMMUNICATION_BANDWIDTH_INFO: bandwidths}

    def combine_time_info(self, com_info_dict: dict, total_time_info_dict: dict) -> None:
        skipped = (self.WAIT_TIME_RATIO, self.SYNCHRONIZATION_TIME_RATIO, self.START_TIMESTAMP)
        for name, value in com_info_dict.items():
            if name not in skipped:
                total_time_info_dict[name] += value

    def combine_bandwidth_info(self, com_info_dict: dict, total_bandwidth_info_dict: dict) -> None:
        for transport_type, info in com_info_dict.items():
            totals = total_bandwidth_info_dict.setdefault(transport_type, {
                self.TRANSIT_TIME_MS: 0, self.TRANSIT_SIZE_MB: 0, self.SIZE_DISTRIBUTION: defaultdict(lambda: [0, 0])})
            for name, value in info.items():
                if name in (self.TRANSIT_TIME_MS, self.TRANSIT_SIZE_MB):
                    totals[name] += value
                elif name == self.SIZE_DISTRIBUTION:
                    self.combine_size_distribution(value, totals[name])

    def compute_time_ratio(self, total_time_info_dict: dict) -> None:
        wait = total_time_info_dict.get(self.WAIT_TIME_MS, 0)
        transit = total_time_info_dict.get(self.TRANSIT_TIME_MS, 0)
        sync = total_time_info_dict.get(self.SYNCHRONIZATION_TIME_MS, 0)
        total_time_info_dict[self.WAIT_TIME_RATIO] = self.compute_ratio(wait, wait + transit)
        total_time_info_dict[self.SYNCHRONIZATION_TIME_RATIO] = self.compute_ratio(sync, transit + sync)

    def compute_bandwidth_ratio(self, total_bandwidth_info_dict: dict) -> None:
        """Each transport type's bandwidth (GB/s: MB per ms) of its summed size and time."""
        for info in total_bandwidth_info_dict.values():
            info[self.BANDWIDTH_GB_S] = self.compute_ratio(info.get(self.TRANSIT_SIZE_MB, 0),
                                                           info.get(self.TRANSIT_TIME_MS, 0))

    def _init_step_list(self, deps_data: dict) -> None:
        torch_op_node = deps_data.get(Constant.TREE_BUILD_PARSER, [])
        if torch_op_node:
            kernel_dict = deps_data.get(Constant.RELATION_PARSER, {})
            if not kernel_dict:
                self.logger.error("Init step list failed, the kernel dict is empty.")
            self.step_list = FwkCANNRelationParser(self._profiler_path).get_step_range(torch_op_node[0], kernel_dict)
        if not self.step_list:
            self.step_list = [{Constant.STEP_ID: None, Constant.START_TS: 0, Constant.END_TS: float("inf"),
                               Constant.COMM_OPS: {}}]
