"""``IntegrateParser``: msprof's summary files the run's config asks for
(``ProfilerConfig.get_parser_bean``: task_time, npu_module_mem at every level; op / api
statistic from Level1; AI CPU from Level2; l2_cache and soc_pmu with l2_cache; nic, roce with
sys_io; pcie, hccs with sys_interconnection) copied into the output folder, their parts
joined, under torch_npu's names (``CSV_FILENAME_MAP``)."""
from .._profiler_config import ProfilerConfig
from ..prof_common_func._constant import Constant
from ..prof_common_func._file_manager import FileManager
from ..prof_common_func._log import ProfilerLogger
from ..prof_parse._cann_file_parser import CANNDataEnum, CANNFileParser
from ._base_parser import BaseParser

__all__ = []


class IntegrateParser(BaseParser):
    CSV_FILENAME_MAP = {
        CANNDataEnum.NIC: "nic.csv",
        CANNDataEnum.ROCE: "roce.csv",
        CANNDataEnum.PCIE: "pcie.csv",
        CANNDataEnum.HCCS: "hccs.csv",
        CANNDataEnum.AI_CPU: "data_preprocess.csv",
        CANNDataEnum.L2_CACHE: "l2_cache.csv",
        CANNDataEnum.API_STATISTIC: "api_statistic.csv",
        CANNDataEnum.OP_STATISTIC: "op_statistic.csv",
        CANNDataEnum.NPU_MODULE_MEM: "npu_module_mem.csv",
        CANNDataEnum.TASK_TIME: "task_time.csv",
        CANNDataEnum.SOC_PMU: "soc_pmu.csv",
    }

    def run(self, deps_data: dict):
        ProfilerLogger.init(self._profiler_path, "IntegrateParser")
        self.logger = ProfilerLogger.get_instance()
        self.logger.info("IntegrateParser start.")
        try:
            ProfilerConfig().load_info(self._profiler_path)
            self.generate_view()
        except Exception:
            self.logger.exception("Failed to generate data_preprocess.csv or l2_cache.csv.")
            return Constant.FAIL, None
        self.logger.info("IntegrateParser finish.")
        return Constant.SUCCESS, None

    def generate_view(self) -> None:
        for cann_data_enum, parser_bean in ProfilerConfig().get_parser_bean():
            self.generate_csv(cann_data_enum, parser_bean, self._output_path)

    def generate_csv(self, cann_data_enum: CANNDataEnum, parser_bean, output_path: str) -> None:
        """The rows of every file of that kind, with the first file's headers."""
        rows, headers = [], []
        for path in CANNFileParser(self._profiler_path).get_file_list_by_type(cann_data_enum):
            beans = FileManager.read_csv_file(path, parser_bean)
            rows.extend(bean.row for bean in beans)
            if beans and not headers:
                headers = beans[0].headers
        FileManager.create_csv_file(output_path, rows, self.CSV_FILENAME_MAP.get(cann_data_enum, "none"), headers)
