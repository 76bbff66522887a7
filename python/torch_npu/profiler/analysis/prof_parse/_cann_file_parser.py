"""``CANNFileParser``: msprof's files of one run, as torch_npu's.

msprof (CANN's profiling tool) writes, when it exports a ``PROF_*`` folder, the
summary CSV files and the timeline JSON into ``mindstudio_profiler_output/``
(``op_summary_<n>_<time>.csv``, ``msprof_<n>_<time>.json``, ``npu_mem_*.csv``, ... or their
``*_slice_<n>_*`` parts when the data was split), the communication analysis into
``analyze/`` (``communication.json``, ``communication_matrix.json``) and its databases into
the folder itself (``msprof_<time>.db``). ``CANNDataEnum`` names the kinds; the parser sorts
the files it finds by their names' patterns (``CANN_DATA_MATCH``), and
``get_file_list_by_type(kind)`` gives the paths of a kind.

The timeline: ``get_timeline_all_data()`` (every event of every msprof JSON) and
``combine_acl_to_npu(events)``: msprof links a host launch to the device tasks it started
with "HostToDevice" flow events (``ph`` "s" at the launch, "f" at the task); the result
maps each launch's start (ns) to the tasks (``EventBean``) its flows end on.
``get_localtime_diff()``: wall clock minus monotonic clock (ns) at the start of msprof's
collection (its ``start_info``), for the times of msprof's records.
"""
import ast
import json
import os
import re
from enum import Enum
from json import JSONDecodeError

from ....utils._path_manager import PathManager
from ..prof_bean._event_bean import EventBean
from ..prof_common_func._constant import Constant, convert_us2ns, print_error_msg
from ..prof_common_func._file_manager import FileManager
from ..prof_common_func._log import ProfilerLogger, get_logger
from ..prof_common_func._path_manager import ProfilerPathManager

__all__ = []


class CANNDataEnum(Enum):
    OP_SUMMARY = 0
    NPU_MEMORY = 1
    MSPROF_TIMELINE = 2
    STEP_TRACE = 3
    GE_MEMORY_RECORD = 4
    GE_OPERATOR_MEMORY = 5
    L2_CACHE = 6
    AI_CPU = 7
    COMMUNICATION = 8
    MATRIX = 9
    OP_STATISTIC = 10
    NPU_MODULE_MEM = 11
    REPORT_DB = 12
    ANALYSIS_DB = 13
    API_STATISTIC = 14
    NIC = 15
    ROCE = 16
    PCIE = 17
    HCCS = 18
    TASK_TIME = 19
    SOC_PMU = 20


def _summary(*prefixes: str, ext: str = "csv") -> list:
    """msprof's name patterns of a summary file: ``<prefix>_<n>...`` and its slices
    ``<prefix>_slice_<n>...``."""
    return [rf"^{prefix}{part}_\d{{1,20}}.*\.{ext}" for prefix in prefixes for part in ("", "_slice")]


class CANNFileParser:
    START_FLOW = "s"
    END_FLOW = "f"
    MINDSTUDIO_PROFILER_OUTPUT = Constant.MINDSTUDIO_PROFILER_OUTPUT
    ANALYZE = "analyze"
    HOST_TO_DEVICE = "HostToDevice"
    CANN_DATA_MATCH = {
        CANNDataEnum.OP_SUMMARY: _summary("op_summary"),
        CANNDataEnum.NPU_MEMORY: _summary("npu_mem"),
        CANNDataEnum.MSPROF_TIMELINE: _summary("msprof", ext="json"),
        CANNDataEnum.STEP_TRACE: _summary("step_trace"),
        CANNDataEnum.GE_MEMORY_RECORD: _summary("ge_memory_record", "memory_record"),
        CANNDataEnum.GE_OPERATOR_MEMORY: _summary("ge_operator_memory", "operator_memory"),
        CANNDataEnum.L2_CACHE: _summary("l2_cache"),
        CANNDataEnum.AI_CPU: _summary("aicpu"),
        CANNDataEnum.COMMUNICATION: [r"^communication\.json"],
        CANNDataEnum.MATRIX: [r"^communication_matrix\.json"],
        CANNDataEnum.API_STATISTIC: _summary("api_statistic"),
        CANNDataEnum.OP_STATISTIC: _summary("op_statistic"),
        CANNDataEnum.NPU_MODULE_MEM: _summary("npu_module_mem"),
        CANNDataEnum.REPORT_DB: [r"^msprof_\d{1,20}\.db"],
        CANNDataEnum.ANALYSIS_DB: [r"communication_analyzer\.db"],
        CANNDataEnum.NIC: _summary("nic"),
        CANNDataEnum.ROCE: _summary("roce"),
        CANNDataEnum.PCIE: _summary("pcie"),
        CANNDataEnum.HCCS: _summary("hccs"),
        CANNDataEnum.TASK_TIME: [r"^task_time_\d{1,20}.*\.csv", r"^task_time_slice.*\.csv"],
        CANNDataEnum.SOC_PMU: _summary("soc_pmu"),
    }

    def __init__(self, profiler_path: str):
        self._profiler_path = profiler_path
        self._cann_path = ProfilerPathManager.get_cann_path(profiler_path)
        self._file_dict = {}
        self._file_dispatch()
        ProfilerLogger.init(profiler_path, "CANNFileParser")
        self.logger = ProfilerLogger.get_instance()
        try:
            self._check_cann_path_valid()
        except RuntimeError as err:
            print_error_msg(f"Failed to parse CANN Profiling data. Error msg: {err}")
            self.logger.exception("Failed to parse CANN Profiling data.")

    def _check_cann_path_valid(self) -> None:
        if not self._cann_path:
            raise RuntimeError("CANN Profiling data does not exist.")
        if not FileManager.check_file_readable(self._cann_path):
            self.logger.warning("The path '%s' is not readable. Please run: chmod -R 755 '%s'.",
                                self._cann_path, self._cann_path)
        if not FileManager.check_file_writable(self._cann_path):
            self.logger.warning("The path '%s' is not writable. Please execute 'chmod -R 755 '%s' '.",
                                self._cann_path, self._cann_path)

    @classmethod
    def _json_load(cls, data: str) -> list:
        """A JSON list of objects (a timeline); [] for no text or any other JSON value."""
        if not data:
            return []
        try:
            value = json.loads(data)
        except JSONDecodeError as err:
            raise RuntimeError("Invalid CANN trace data.") from err
        if not isinstance(value, list) or (value and not isinstance(value[0], dict)):
            return []
        return value

    @classmethod
    def _json_dict_load(cls, data: str) -> dict:
        """A JSON object (the communication analysis); {} for no text or any other JSON value."""
        if not data:
            return {}
        try:
            value = json.loads(data)
        except JSONDecodeError as err:
            raise RuntimeError("Invalid communication data.") from err
        return value if isinstance(value, dict) else {}

    @classmethod
    def combine_acl_to_npu(cls, timeline_data: list) -> dict:
        """{start of a host launch (ns): [EventBean of each device task its HostToDevice flows end on]}."""
        logger = get_logger()
        flows, tasks = {}, {}
        for event in timeline_data:
            if event.get("cat") == cls.HOST_TO_DEVICE and event.get("ph") in (cls.START_FLOW, cls.END_FLOW):
                end = "start" if event.get("ph") == cls.START_FLOW else "end"
                flows.setdefault(event.get("id", 0), {}).setdefault(end, event)
            elif event.get("ph") == "X":
                tasks[(event.get("pid"), event.get("tid"), event.get("ts"))] = event
        if not flows:
            logger.warning("There are no HostToDevice flow events in the msprof timeline.")
        if not tasks:
            logger.error("There are no kernel events in the msprof timeline.")
        acl_to_npu, missing = {}, 0
        for flow in flows.values():
            start, end = flow.get("start"), flow.get("end")
            if not (start and end):
                continue
            task = tasks.get((end.get("pid"), end.get("tid"), end.get("ts")))
            if task is None:
                missing += 1
                continue
            acl_to_npu.setdefault(convert_us2ns(start.get("ts", 0)), []).append(EventBean(task))
        if missing:
            logger.warning("%d kernels do not exist in the msprof timeline.", missing)
        return acl_to_npu

    def get_timeline_all_data(self) -> list:
        events = []
        for path in self._file_dict.get(CANNDataEnum.MSPROF_TIMELINE, set()):
            events.extend(self._json_load(FileManager.file_read_all(path, "rt")))
        if not events:
            self.logger.error("Get timeline all data failed, the timeline data is empty.")
        return events

    def get_analyze_communication_data(self, file_type: Enum) -> dict:
        """The communication analysis of that kind (one file is enough when there are several)."""
        paths = self._file_dict.get(file_type, set())
        return self._json_dict_load(FileManager.file_read_all(next(iter(paths)), "rt")) if paths else {}

    def get_acl_to_npu_data(self) -> dict:
        return self.combine_acl_to_npu(self.get_timeline_all_data())

    def get_file_list_by_type(self, file_type: CANNDataEnum) -> set:
        return self._file_dict.get(file_type, set())

    def get_localtime_diff(self) -> int:
        """Wall clock minus monotonic clock (ns) from msprof's start_info, 0 when unknown."""
        if not self._cann_path:
            self.logger.error("Get localtime diff failed, the CANN path is not exist.")
            return 0
        start_info_path = ProfilerPathManager.get_start_info_path(self._cann_path)
        if not start_info_path:
            self.logger.error("Get localtime diff failed, the start info path is not exist.")
            return 0
        try:
            info = ast.literal_eval(FileManager.file_read_all(start_info_path, "rt"))
            return (convert_us2ns(info.get(Constant.CANN_BEGIN_TIME, 0))
                    - int(info.get(Constant.CANN_BEGIN_MONOTONIC, 0)))
        except (ValueError, SyntaxError, RuntimeError, AttributeError, TypeError):
            self.logger.exception("Failed to get CANN localtime diff.")
            return 0

    def del_summary_and_timeline_data(self) -> None:
        """Removes the devices' ``summary/`` and ``timeline/`` folders (msprof's intermediate files)."""
        device_paths = ProfilerPathManager.get_device_path(self._cann_path)
        if not device_paths:
            self.logger.error("Delete summary and timeline data failed, the device path is not exist.")
            return
        for device_path in device_paths:
            PathManager.remove_path_safety(os.path.join(device_path, "summary"))
            PathManager.remove_path_safety(os.path.join(device_path, "timeline"))

    def del_output_path_data(self) -> None:
        PathManager.remove_path_safety(os.path.join(self._cann_path, self.MINDSTUDIO_PROFILER_OUTPUT))

    def _file_dispatch(self) -> None:
        if not self._cann_path:
            return
        paths = ProfilerPathManager.get_output_all_file_list_by_type(self._cann_path, self.MINDSTUDIO_PROFILER_OUTPUT)
        paths += ProfilerPathManager.get_analyze_all_file(self._cann_path, self.ANALYZE)
        paths += ProfilerPathManager.get_database_all_file(self._cann_path)
        for path in paths:
            if not os.path.isfile(path):
                continue
            name = os.path.basename(path)
            for data_type, patterns in self.CANN_DATA_MATCH.items():
                if any(re.match(pattern, name) for pattern in patterns):
                    self._file_dict.setdefault(data_type, set()).add(path)
