"""``TraceStepTimeParser``: step_trace_time.csv from msprof's overlap analysis, as torch_npu's.

msprof's timeline has, per device (a process labelled "NPU <id>"), the overlap analysis's
events "Computing", "Communication", "Communication(Not Overlapped)" and "Free". Their
durations (us) are summed per device and step (the step whose device span holds the
event's start; one step without ProfilerStep spans); "hcom_receive*" events are the bubble.
Then: Overlapped = Communication - Communication(Not Overlapped); Stage = the step's span
from its first to its last event, less the bubble; Communication(Not Overlapped and Exclude
Receive) = not overlapped less the bubble; Preparing = from the step's host start (the
first host op without steps) to its first computing or communication event.
"""
import copy
from collections import defaultdict
from enum import Enum

from ..prof_common_func._constant import Constant, convert_ns2us_float
from ..prof_common_func._csv_headers import CsvHeaders
from ..prof_common_func._file_manager import FileManager
from ..prof_parse._cann_file_parser import CANNFileParser
from ..prof_parse._fwk_cann_relation_parser import FwkCANNRelationParser
from ..prof_parse._fwk_file_parser import FwkFileParser
from ._base_parser import BaseParser

__all__ = []


def default_time() -> dict:
    return {"compute": 0, "comunNotOverlp": 0, "Overlp": 0, "comun": 0, "free": 0, "stage": 0, "bubble": 0,
            "comunNotOverlpRec": 0, "prepare": 0}


def step_time_dict():
    return defaultdict(default_time)


class _StepInfoIndex(Enum):
    """The fields of a step's list: id, span (us), first and last event (us, -1: none yet),
    host start (us), first computing / communication event (us)."""
    ID = 0
    START_TS = 1
    END_TS = 2
    E2E_START_TS = 3
    E2E_END_TS = 4
    FWK_START_TS = 5
    FIRST_TASK_TS = 6


_ANALYSIS_EVENTS = {"Communication", "Computing", "Free", "Communication(Not Overlapped)"}


def _earlier(step: list, index: _StepInfoIndex, value: float) -> None:
    if step[index.value] == -1 or value < step[index.value]:
        step[index.value] = value


class TraceStepTimeParser(BaseParser):
    STEP_TRACE = "step_trace_time.csv"
    timeflag = {"Communication": "comun", "Computing": "compute", "Free": "free",
                "Communication(Not Overlapped)": "comunNotOverlp", "hcom_receive": "bubble"}
    title = CsvHeaders.STEP_TRACE_TIME

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self.step_range = []
        self.torch_op_data = []

    @classmethod
    def is_float_num(cls, num) -> bool:
        try:
            float(num)
            return True
        except (TypeError, ValueError):
            return False

    @classmethod
    def count_time(cls, add_type: str, data: dict, step_list: dict, save_time: dict, pid_device_map: dict) -> None:
        """Adds the event's duration to its device's step, and widens the step's event span."""
        start, duration = data.get("ts", 0), data.get("dur", 0)
        if not cls.is_float_num(start) or not cls.is_float_num(duration):
            print("Ts or dur format error!")
            return
        start, duration = float(start), float(duration)
        device_id = pid_device_map[data["pid"]]
        steps = step_list.get(device_id, [])
        step = next((s for s in steps if s[_StepInfoIndex.START_TS.value] <= start < s[_StepInfoIndex.END_TS.value]),
                    None)
        cur_step = step[_StepInfoIndex.ID.value] if step else None
        if step is None:  # outside every span: the step with no id, if any
            step = next((s for s in steps if s[_StepInfoIndex.ID.value] is None), None)
        if step is not None:
            _earlier(step, _StepInfoIndex.E2E_START_TS, start)
            end = start + duration
            if step[_StepInfoIndex.E2E_END_TS.value] == -1 or end > step[_StepInfoIndex.E2E_END_TS.value]:
                step[_StepInfoIndex.E2E_END_TS.value] = end
            if add_type in ("Communication", "Computing"):
                _earlier(step, _StepInfoIndex.FIRST_TASK_TS, start)
        save_time[device_id][cur_step][cls.timeflag.get(add_type)] += duration

    @classmethod
    def get_e2e_time(cls, step, step_list: list) -> float:
        for cur_step in step_list:
            if cur_step[_StepInfoIndex.ID.value] == step:
                return cur_step[_StepInfoIndex.E2E_END_TS.value] - cur_step[_StepInfoIndex.E2E_START_TS.value]
        return 0

    def get_prepare_time(self, step, step_list: list) -> float:
        for cur_step in step_list:
            if cur_step[_StepInfoIndex.ID.value] != step:
                continue
            first_task = cur_step[_StepInfoIndex.FIRST_TASK_TS.value]
            if step is None:
                first_op = FwkFileParser(self._profiler_path).get_first_fwk_op(self.torch_op_data)
                return first_task - convert_ns2us_float(first_op.ts) if first_op else 0
            return first_task - cur_step[_StepInfoIndex.FWK_START_TS.value]
        return 0

    def create_step_file(self, output_path: str, json_str: list, file_name: str) -> None:
        if not json_str:
            return
        # the devices' processes: "NPU <id>" ("NPU" alone: -1)
        pid_device_map = {}
        for data in json_str:
            label = data.get("args", {}).get("labels", "") if data.get("name") == "process_labels" else ""
            if label.startswith("NPU"):
                pid_device_map[data.get("pid")] = -1 if label == "NPU" else int(label.split(" ")[1])
        steps = [[step.get(Constant.STEP_ID), convert_ns2us_float(step.get(Constant.START_TS)),
                  convert_ns2us_float(step.get(Constant.END_TS)), -1, -1,
                  convert_ns2us_float(step.get(Constant.FWK_START_TS)), -1] for step in self.step_range]
        if not self.step_range:
            steps.append([None, -1, -1, -1, -1, -1, -1])
        step_dict = {device: copy.deepcopy(steps) for device in set(pid_device_map.values())}
        save_time = defaultdict(step_time_dict)
        has_analysis_data = False
        for data in json_str:
            name = str(data.get("name"))
            if name in _ANALYSIS_EVENTS:
                self.count_time(name, data, step_dict, save_time, pid_device_map)
                has_analysis_data = True
            elif name.startswith("hcom_receive"):
                self.count_time("hcom_receive", data, step_dict, save_time, pid_device_map)
        if not has_analysis_data:
            return
        rows = []
        for device, device_time in save_time.items():
            for step, times in device_time.items():
                if self.step_range and step is None:
                    continue  # outside every step
                times["comunNotOverlpRec"] = max(times["comunNotOverlp"] - times["bubble"], 0)
                times["Overlp"] = times["comun"] - times["comunNotOverlp"]
                times["stage"] = self.get_e2e_time(step, step_dict.get(device, [])) - times["bubble"]
                times["prepare"] = self.get_prepare_time(step, step_dict.get(device, []))
                rows.append([device, step, times["compute"], times["comunNotOverlp"], times["Overlp"], times["comun"],
                             times["free"], times["stage"], times["bubble"], times["comunNotOverlpRec"],
                             times["prepare"]])
        rows.sort(key=(lambda row: (row[0], int(row[1]))) if self.step_range else (lambda row: row[0]))
        FileManager.create_csv_file(output_path, rows, file_name, self.title)

    def run(self, deps_data: dict):
        def work():
            self._init_step_range(deps_data)
            self.torch_op_data = deps_data.get(Constant.TORCH_OP_PARSER, [])
            self.generate_view()

        return self._run_logged(work, "Failed to generate step_trace_time.csv")

    def generate_view(self) -> None:
        self.create_step_file(self._output_path, CANNFileParser(self._profiler_path).get_timeline_all_data(),
                              self.STEP_TRACE)

    def _init_step_range(self, deps_data: dict) -> None:
        torch_op_node = deps_data.get(Constant.TREE_BUILD_PARSER, [])
        if torch_op_node:
            self.step_range = FwkCANNRelationParser(self._profiler_path).get_step_range(
                torch_op_node[0], deps_data.get(Constant.RELATION_PARSER, {}))
