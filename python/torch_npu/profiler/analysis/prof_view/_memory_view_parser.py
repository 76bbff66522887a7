"""``MemoryViewParser``: operator_memory.csv and memory_record.csv, as torch_npu's.

operator_memory.csv: the framework's allocations (MemoryPrepareParser's rows) and GE's
(msprof's operator_memory, ``cann::<name>``). memory_record.csv: msprof's device memory of
the process (npu_mem ``APP`` rows), the framework allocator's totals after each event
(``PTA``), GE's (``GE``), and after each of those the two summed (``PTA+GE``: the framework's
latest totals of that device plus GE's); workspace allocations are ``WORKSPACE`` rows. The
msprof files are read only when NPU activity was profiled.
"""
from ..prof_bean._ge_memory_record_bean import GeMemoryRecordBean
from ..prof_bean._ge_op_memory_bean import GeOpMemoryBean
from ..prof_bean._npu_mem_bean import NpuMemoryBean
from ..prof_common_func._constant import Constant, convert_ns2us_str
from ..prof_common_func._csv_headers import CsvHeaders
from ..prof_common_func._file_manager import FileManager
from ..prof_common_func._path_manager import ProfilerPathManager
from ..prof_parse._cann_file_parser import CANNDataEnum, CANNFileParser
from ._base_parser import BaseParser

__all__ = []


def _record(component: str, record, allocated, reserved, active, stream_ptr) -> list:
    return [component, convert_ns2us_str(record.time_ns, tail="\t"), allocated, reserved, active, stream_ptr,
            record.device_tag]


class MemoryViewParser(BaseParser):
    HEADERS_OPERATOR = CsvHeaders.OPERATOR_MEMORY
    HEADERS_RECORD = CsvHeaders.MEMORY_RECORD
    OPERATOR_MEMORY = "operator_memory.csv"
    MEMORY_RECORD = "memory_record.csv"
    MAX_FIND_LAYERS = 100

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._activities = param_dict.get(Constant.ACTIVITIES, [])
        self.size_record_list = []
        self.pta_record_list = []
        self.ge_record_list = []
        self.memory_data = []
        self.component_list = []
        self.device_index = -1

    @staticmethod
    def _get_data_from_file(file_set: set, file_type_bean, bean_list: bool = False) -> list:
        """The beans (``bean_list``) or non-empty rows of one file of the set (one is enough)."""
        if not file_set:
            return []
        beans = FileManager.read_csv_file(next(iter(file_set)), file_type_bean)
        return beans if bean_list else [bean.row for bean in beans if bean.row]

    @staticmethod
    def _combine_record(last_record: dict, cur_record) -> list:
        """The rows of one record: a workspace row, or the record's row and its PTA+GE sum with
        ``last_record`` (the other component's latest record per device)."""
        if getattr(cur_record, "component_type", None) == Constant.WORKSPACE_TYPE:
            return [_record(Constant.WORKSPACE, cur_record, cur_record.total_allocated, cur_record.total_reserved,
                            cur_record.total_active, cur_record.stream_ptr)]
        other = last_record.get(cur_record.device_tag)
        if other is None:
            total = _record(Constant.PTA_GE, cur_record, cur_record.total_allocated, cur_record.total_reserved,
                            cur_record.total_active, cur_record.stream_ptr)
        else:
            total = _record(Constant.PTA_GE, cur_record, cur_record.total_allocated + other.total_allocated,
                            cur_record.total_reserved + other.total_reserved,
                            cur_record.total_active + other.total_active, cur_record.stream_ptr or other.stream_ptr)
        return [cur_record.row, total]

    def run(self, deps_data: dict):
        def work():
            prepared = deps_data.get(Constant.MEMORY_PREPARE, {})
            self.memory_data = prepared.get("memory_data", {}).get(Constant.Text, [])
            self.pta_record_list = prepared.get("pta_record_list", [])
            device_ids = ProfilerPathManager.get_device_id(ProfilerPathManager.get_cann_path(self._profiler_path))
            self.device_index = device_ids[0] if len(device_ids) == 1 else -1
            self.generate_view()

        return self._run_logged(work, "Failed to generate operator_memory.csv or memory_record.csv")

    def generate_view(self) -> None:
        self._add_memory_from_cann()
        self._add_pta_ge_record_data()
        FileManager.create_csv_file(self._output_path, self.memory_data, self.OPERATOR_MEMORY, self.HEADERS_OPERATOR)
        FileManager.create_csv_file(self._output_path, self.size_record_list + self.component_list, self.MEMORY_RECORD,
                                    self.HEADERS_RECORD)

    def _add_pta_ge_record_data(self) -> None:
        """Merges the framework's records (in time order already) with GE's, by time."""
        try:
            self.ge_record_list = sorted(self.ge_record_list, key=lambda record: record.time_ns)
        except (RuntimeError, TypeError, ValueError) as err:
            raise RuntimeError("Can't sort records for cann memory record") from err
        last_ge, last_pta = {}, {}
        ge_index = 0
        for pta_record in self.pta_record_list:
            pta_record.device_index = self.device_index
            while ge_index < len(self.ge_record_list) and self.ge_record_list[ge_index].time_ns < pta_record.time_ns:
                ge_record = self.ge_record_list[ge_index]
                self.size_record_list.extend(self._combine_record(last_pta, ge_record))
                last_ge[ge_record.device_tag] = ge_record
                ge_index += 1
            self.size_record_list.extend(self._combine_record(last_ge, pta_record))
            if getattr(pta_record, "component_type", None) != Constant.WORKSPACE_TYPE:
                last_pta[pta_record.device_tag] = pta_record
        for ge_record in self.ge_record_list[ge_index:]:
            self.size_record_list.extend(self._combine_record(last_pta, ge_record))

    def _add_device_type_for_npu(self) -> None:
        for record in self.size_record_list:
            if record[0] == Constant.APP:
                record[-1] = f"NPU:{record[-1]}"

    def split_component_ge(self, data: list) -> None:
        for row in data:
            (self.ge_record_list if row.component == Constant.GE else self.component_list).append(row)

    def _cann_files(self, kind: CANNDataEnum) -> set:
        if Constant.NPU_ACTIVITIES not in self._activities:
            return set()
        return CANNFileParser(self._profiler_path).get_file_list_by_type(kind)

    def _add_memory_from_cann(self) -> None:
        """The process's device memory (APP), GE's records and GE's allocations from msprof's files."""
        self.size_record_list.extend(self._get_data_from_file(self._cann_files(CANNDataEnum.NPU_MEMORY),
                                                              NpuMemoryBean))
        self._add_device_type_for_npu()
        self.split_component_ge(self._get_data_from_file(self._cann_files(CANNDataEnum.GE_MEMORY_RECORD),
                                                         GeMemoryRecordBean, bean_list=True))
        self.memory_data.extend(self._get_data_from_file(self._cann_files(CANNDataEnum.GE_OPERATOR_MEMORY),
                                                         GeOpMemoryBean))
