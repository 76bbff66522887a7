"""``ProfilerConfig``: what a run was recorded with, and its clock (torch_npu's singleton of the
analysis; ``ProfilerConfig()`` always returns the same object).

``load_info(profiler_path)`` reads the run's ``profiler_info.json`` once (until
``reset_is_load()``): activities, rank id, the experimental config (profiler level, AI Core
metrics, l2_cache, msprof_tx, op_attr, data_simplification, export_type, sys_io,
sys_interconnection), the difference of wall clock and monotonic clock at the end of the run
and the system counter (frequency, start count, start monotonic time; msprof's
``host/info.json`` and ``host/host_start.log`` take precedence when the run has them).

The FRAMEWORK records carry raw times: ``get_timestamp_from_syscnt(syscnt)`` makes a counter
value monotonic ns (unchanged when the run did not record with the system counter) and
``get_local_time(ns)`` adds the wall-clock offset. Before ``load_info`` both are the identity.

What the parsers take from it: ``get_prune_config()`` (the CANN layers trace_view.json leaves
out at Level0), ``is_all_kernel_headers()`` (every op_summary column in kernel_details.csv
above Level0) and ``get_parser_bean()`` (msprof's summary files copied into the output).
"""
import json
import re
from configparser import ConfigParser, Error as ConfigParserError
from json import JSONDecodeError

from .prof_bean._ai_cpu_bean import AiCpuBean
from .prof_bean._api_statistic_bean import ApiStatisticBean
from .prof_bean._hccs_bean import HccsBean
from .prof_bean._l2_cache_bean import L2CacheBean
from .prof_bean._nic_bean import NicBean
from .prof_bean._npu_module_mem_bean import NpuModuleMemoryBean
from .prof_bean._op_statistic_bean import OpStatisticBean
from .prof_bean._pcie_bean import PcieBean
from .prof_bean._roce_bean import RoCEBean
from .prof_bean._soc_pmu_bean import SocPmuBean
from .prof_bean._task_time_bean import TaskTimeBean
from .prof_common_func._constant import Constant, print_error_msg, print_warn_msg
from .prof_common_func._file_manager import FileManager
from .prof_common_func._path_manager import ProfilerPathManager
from .prof_common_func._singleton import Singleton
from .prof_parse._cann_file_parser import CANNDataEnum

__all__ = []

_NUMBER = re.compile(r"^[-+]?[0-9]{0,20}\.?[0-9]{1,20}([eE][-+]?[0-9]{1,20})?$")


_LEVEL1_FILES = [(CANNDataEnum.OP_STATISTIC, OpStatisticBean), (CANNDataEnum.API_STATISTIC, ApiStatisticBean),
                 (CANNDataEnum.NPU_MODULE_MEM, NpuModuleMemoryBean), (CANNDataEnum.TASK_TIME, TaskTimeBean)]


@Singleton
class ProfilerConfig:
    # msprof's summary files copied into ASCEND_PROFILER_OUTPUT at each level (IntegrateParser)
    LEVEL_PARSER_CONFIG = {
        Constant.LEVEL_NONE: [],
        Constant.LEVEL0: _LEVEL1_FILES[2:],
        Constant.LEVEL1: _LEVEL1_FILES,
        Constant.LEVEL2: [(CANNDataEnum.AI_CPU, AiCpuBean)] + _LEVEL1_FILES,
    }
    # host-side trace events dropped from the timeline at each profiler level
    LEVEL_TRACE_PRUNE_CONFIG = {
        Constant.LEVEL_NONE: [],
        Constant.LEVEL0: ["CANN", "AscendCL", "Runtime", "GE", "Node", "Model", "Hccl", "acl_to_npu",
                          "Communication@"],
        Constant.LEVEL1: [],
        Constant.LEVEL2: [],
    }

    def __init__(self):
        self._profiler_level = Constant.LEVEL0
        self._ai_core_metrics = Constant.AicMetricsNone
        self._l2_cache = False
        self._msprof_tx = False
        self._op_attr = False
        self._data_simplification = True
        self._localtime_diff = 0
        self._syscnt_enable = False
        self._sys_io = False
        self._sys_interconnection = False
        self._freq = 100.0
        self._time_offset = 0
        self._start_cnt = 0
        self._export_type = [Constant.Text]
        self._rank_id = -1
        self._activities = []
        self._is_load = False

    def reset_is_load(self):
        self._is_load = False

    @property
    def data_simplification(self):
        return self._data_simplification

    @property
    def export_type(self) -> list:
        return self._export_type

    @export_type.setter
    def export_type(self, export_type: list):
        self._export_type = export_type

    @property
    def activities(self) -> list:
        return self._activities

    @property
    def msprof_tx(self):
        return self._msprof_tx

    @property
    def rank_id(self):
        return self._rank_id

    def is_number(self, string) -> bool:
        if not isinstance(string, str):
            print_error_msg(f"Input string is not str, get type: {type(string)}")
            return False
        return _NUMBER.match(string) is not None

    def get_timestamp_from_syscnt(self, syscnt: int, time_fmt: int = 1000):
        """System counter ticks -> ns (``time_fmt`` 1000: the frequency is in MHz)."""
        if not self._syscnt_enable:
            return syscnt
        if abs(self._freq) < 1e-15:
            raise RuntimeError("The frequency value is too small to be close to zero, please check.")
        return int((syscnt - self._start_cnt) * (time_fmt / self._freq)) + self._time_offset

    def get_local_time(self, monotonic_time: int) -> int:
        return int(monotonic_time + self._localtime_diff)

    def get_level(self):
        return self._profiler_level

    def get_prune_config(self):
        return self.LEVEL_TRACE_PRUNE_CONFIG.get(self._profiler_level)

    def is_all_kernel_headers(self) -> bool:
        return self._profiler_level != Constant.LEVEL0

    def get_parser_bean(self) -> list:
        """[(CANNDataEnum, bean)] of the msprof summary files this run's config asks for."""
        files = list(self.LEVEL_PARSER_CONFIG.get(self._profiler_level, []))
        if self._l2_cache:
            files += [(CANNDataEnum.L2_CACHE, L2CacheBean), (CANNDataEnum.SOC_PMU, SocPmuBean)]
        if self._sys_io:
            files += [(CANNDataEnum.NIC, NicBean), (CANNDataEnum.ROCE, RoCEBean)]
        if self._sys_interconnection:
            files += [(CANNDataEnum.PCIE, PcieBean), (CANNDataEnum.HCCS, HccsBean)]
        return files

    @classmethod
    def _get_json_data(cls, json_file_path: str) -> dict:
        if not json_file_path:
            print_warn_msg(f"Failed to get file, expect path is {json_file_path}.")
            return {}
        try:
            return json.loads(FileManager.file_read_all(json_file_path, "rt"))
        except JSONDecodeError:
            print_warn_msg(f"Failed to get json from file, path is {json_file_path}")
            return {}

    def load_info(self, profiler_path: str):
        if self._is_load:
            return
        info_json = self._get_json_data(ProfilerPathManager.get_info_file_path(profiler_path))
        self.load_activities(profiler_path, info_json)
        self.load_rank_info(info_json)
        self.load_experimental_cfg_info(info_json)
        self.load_timediff_info(profiler_path, info_json)
        self.load_syscnt_info(profiler_path, info_json)
        self._is_load = True

    def load_activities(self, profiler_path: str, info_json: dict):
        self._activities = list(info_json.get(Constant.CONFIG, {}).get(Constant.COMMON_CONFIG, {})
                                .get(Constant.ACTIVITIES, []))
        if Constant.CPU_ACTIVITIES in self._activities and not ProfilerPathManager.get_fwk_path(profiler_path):
            print_error_msg("ProfilerActivity.CPU is set in activities, but FWK Profiling data does not exist.")
            self._activities.remove(Constant.CPU_ACTIVITIES)
        if Constant.NPU_ACTIVITIES in self._activities and not ProfilerPathManager.get_cann_path(profiler_path):
            print_error_msg("ProfilerActivity.NPU is set in activities, but CANN Profiling data does not exist.")
            self._activities.remove(Constant.NPU_ACTIVITIES)

    def load_rank_info(self, info_json: dict):
        self._rank_id = info_json.get(Constant.RANK_ID, -1)

    def load_timediff_info(self, profiler_path: str, info_json: dict):
        """Wall clock minus monotonic clock, from the run's end_info (collectionTimeEnd - MonotonicTimeEnd)."""
        end_info = info_json.get(Constant.END_INFO, {})
        if not self._localtime_diff and end_info:
            self._localtime_diff = (int(end_info.get(Constant.FWK_END_TIME, 0))
                                    - int(end_info.get(Constant.FWK_END_MONOTONIC, 0)))

    def load_syscnt_info(self, profiler_path: str, info_json: dict):
        start_info = info_json.get(Constant.START_INFO, {})
        self._syscnt_enable = start_info.get(Constant.SyscntEable, False)
        info_path = ProfilerPathManager.get_info_path(profiler_path)
        if info_path:
            try:
                freq = json.loads(FileManager.file_read_all(info_path, "rt")).get("CPU")[0].get("Frequency")
                if self.is_number(str(freq)):
                    self._freq = float(freq)
            except JSONDecodeError:
                print_warn_msg("Failed to get profiler info json from file.")
        else:
            self._freq = start_info.get(Constant.SysCntFreq, self._freq)
        start_log_path = ProfilerPathManager.get_host_start_log_path(profiler_path)
        if start_log_path:
            start_log = ConfigParser()
            try:
                start_log.read(start_log_path)
                offset = start_log.get("Host", "clock_monotonic_raw")
                start_cnt = start_log.get("Host", "cntvct")
            except ConfigParserError:
                print_warn_msg(f"Failed to read the Host section of {start_log_path}.")
                return
            if self.is_number(str(offset)) and self.is_number(str(start_cnt)):
                self._time_offset = int(offset)
                self._start_cnt = int(start_cnt)
        else:
            self._time_offset = start_info.get(Constant.StartMonotonic, self._time_offset)
            self._start_cnt = start_info.get(Constant.StartCnt, self._start_cnt)

    def load_experimental_cfg_info(self, info_json: dict):
        cfg = info_json.get(Constant.CONFIG, {}).get(Constant.EXPERIMENTAL_CONFIG, {})
        self._profiler_level = cfg.get(Constant.PROFILER_LEVEL, self._profiler_level)
        self._ai_core_metrics = cfg.get(Constant.AI_CORE_METRICS, self._ai_core_metrics)
        self._l2_cache = cfg.get(Constant.L2_CACHE, self._l2_cache)
        self._msprof_tx = cfg.get(Constant.MSPROF_TX, self._msprof_tx)
        self._op_attr = cfg.get(Constant.OP_ATTR, self._op_attr)
        self._data_simplification = cfg.get(Constant.DATA_SIMPLIFICATION, self._data_simplification)
        self._export_type = self._get_export_type_from_profiler_info(cfg)
        self._sys_io = cfg.get(Constant.SYS_IO, self._sys_io)
        self._sys_interconnection = cfg.get(Constant.SYS_INTERCONNECTION, self._sys_interconnection)

    def _get_export_type_from_profiler_info(self, experimental_config: dict) -> list:
        export_type = experimental_config.get(Constant.EXPORT_TYPE, self._export_type)
        if isinstance(export_type, str):
            export_type = [export_type]
        valid = (isinstance(export_type, list) and export_type
                 and all(isinstance(t, str) and t in (Constant.Text, Constant.Db) for t in export_type))
        if not valid:
            print_warn_msg(f"Invalid parameter export_type from profiler_info.json: {export_type}, "
                           "reset it to text.")
            return [Constant.Text]
        return list(dict.fromkeys(export_type))
