"""Messages and time conversions of torch_npu's profiling analysis (its ``_constant``).

* ``print_info_msg`` / ``print_warn_msg`` / ``print_error_msg``: a line on stdout,
  ``[YYYY-mm-dd HH:MM:SS] [LEVEL] [pid] profiler.py: message``, as torch_npu's analysis
  reports.
* ``convert_ns2us_str(ns)``: integer nanoseconds as exact microseconds text
  (``1459635878536856678`` -> ``"1459635878536856.678"``; a float would keep only ~0.25 µs
  of an epoch time), ``convert_ns2us_float``, ``convert_us2ns`` (the way back, from text or
  a number), ``contact_2num(high, low)`` (two 32-bit halves as one id).
* ``Constant``: the names of torch_npu's profiling files and keys, of the fields of the
  FRAMEWORK records (``prof_bean``), of the parsers and what they hand each other
  (``prof_view``), their return codes, and the unit factors (``B_TO_KB``, ``KB_TO_MB``, ...).
* ``DbConstant`` / ``TableColumnsManager``: the db export's files, tables and their columns;
  ``ApiType`` (PYTORCH_API.type), and the column indexes of the rows the parsers build
  (``TorchOpDataOri``, ``TaskQueueDataOri``, ``PythonTraceApiDataOri``, ``CannNodeLaunchApiOri``).
"""
import os
import time

__all__ = []

NS_PER_US = 1000


class Constant:
    DEFAULT_PROCESS_NUMBER = max(1, (os.cpu_count() or 2) // 2)
    NS_TO_US = 1000
    US_TO_MS = 1000
    NS_TO_MS = 1000 * 1000
    GC_RECORD_FORMAT = "<3Q"  # FRAMEWORK/torch.gc_record: pid, start and end (system counter) of a collection
    # profiler levels and AI Core metrics (torch_npu.profiler.ProfilerLevel / AiCMetrics)
    LEVEL0 = "Level0"
    LEVEL1 = "Level1"
    LEVEL2 = "Level2"
    LEVEL_NONE = "Level_none"
    AicPipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    AicArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    AicMemory = "ACL_AICORE_MEMORY_BANDWIDTH"
    AicMemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    AicMemoryUB = "ACL_AICORE_MEMORY_UB"
    AicResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    AicL2Cache = "ACL_AICORE_L2_CACHE"
    AicMemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AicMetricsNone = "ACL_AICORE_NONE"
    # host_sys (torch_npu.profiler.HostSystem)
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"
    PROFILER_META_DATA = "profiler_metadata.json"
    FRAMEWORK_DIR = "FRAMEWORK"
    # how a run is parsed
    TENSORBOARD_TRACE_HANDLER = "tensorboard_trace_handler"
    EXPORT_CHROME_TRACE = "export_chrome_trace"
    EXPORT_STACK = "export_stack"
    EXPORT_MEMORY_TIMELINE = "export_memory_timeline"
    # profiler_info.json
    CONFIG = "config"
    COMMON_CONFIG = "common_config"
    EXPERIMENTAL_CONFIG = "experimental_config"
    START_INFO = "start_info"
    SysCntFreq = "freq"
    StartCnt = "start_cnt"
    StartMonotonic = "start_monotonic"
    SyscntEable = "syscnt_enable"
    END_INFO = "end_info"
    FWK_END_TIME = "collectionTimeEnd"
    FWK_END_MONOTONIC = "MonotonicTimeEnd"
    TORCH_NPU_VERSION = "torch_npu_version"
    CANN_VERSION = "cann_version"
    # export types
    Db = "db"
    Text = "text"
    # environment variables of the msprof command line tool
    MSPROF_STATIC_ENV = "PROFILER_SAMPLECONFIG"
    MSPROF_DYNAMIC_ENV = "PROFILING_MODE"
    MAX_FILE_SIZE = 10 * 1024 ** 3  # files larger than this are not read (FileManager)
    MAX_CSV_SIZE = 5 * 1024 ** 3  # CSV files larger than this are not read (FileManager.read_csv_file)
    # profiler_info.json: common and experimental config keys
    RANK_ID = "rank_id"
    ACTIVITIES = "activities"
    CPU_ACTIVITIES = "ProfilerActivity.CPU"
    NPU_ACTIVITIES = "ProfilerActivity.NPU"
    PROFILER_LEVEL = "_profiler_level"
    AI_CORE_METRICS = "_aic_metrics"
    L2_CACHE = "_l2_cache"
    MSPROF_TX = "_msprof_tx"
    OP_ATTR = "_op_attr"
    DATA_SIMPLIFICATION = "_data_simplification"
    SYS_IO = "_sys_io"
    SYS_INTERCONNECTION = "_sys_interconnection"
    EXPORT_TYPE = "_export_type"
    # FRAMEWORK records (prof_bean): the fixed-size head of a TLV record, and the names of its fields
    CONSTANT_BYTES = "constant_bytes"
    SEQUENCE_NUMBER = "Sequence number"
    FORWARD_THREAD_ID = "Fwd thread id"
    OP_NAME = "op_name"
    INPUT_DTYPES = "Input type"
    INPUT_SHAPES = "Input Dims"
    INPUT_TENSORS = "Input Tensors"
    INPUT_TENSORLISTS = "Input TensorLists"
    INPUT_SCALARS = "Input Scalars"
    CALL_STACK = "Call stack"
    MODULE_HIERARCHY = "Module Hierarchy"
    FLOPS = "flops"
    NAME = "name"
    VALUE = "value"
    MODULE_PARAM = "module parameter"
    OPTIMIZER_PARAM = "optimizer parameter"
    # feature negotiation with CANN (FeatureManager): keys of a feature's entry
    AffectedComponent = "affectedComponent"
    AffectedComponentVersion = "affectedComponentVersion"
    Compatibility = "compatibility"
    FeatureVersion = "featureVersion"
    InfoLog = "infoLog"
    # metadata events of a Chrome trace
    PROCESS_NAME = "process_name"
    PROCESS_LABEL = "process_labels"
    PROCESS_SORT = "process_sort_index"
    THREAD_NAME = "thread_name"
    THREAD_SORT = "thread_sort_index"
    # task types and memory record components
    AI_CORE = "AI_CORE"
    PTA = "PTA"
    GE = "GE"
    APP = "APP"
    PTA_GE = "PTA+GE"
    B_TO_KB = 1024.0
    KB_TO_MB = 1024.0
    B_TO_MB = 1024.0 ** 2
    B_TO_GB = 1024.0 ** 3
    INVALID_VALUE = -1
    NULL_VALUE = 0
    SLEEP_TIME = 0.1  # s, the polls of the task manager and of CANNTimelineParser
    # folders of a run
    OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
    ASCEND_WORK_PATH = "ASCEND_WORK_PATH"
    PROFILING_WORK_PATH = "profiling_data"
    MINDSTUDIO_PROFILER_OUTPUT = "mindstudio_profiler_output"  # msprof's exported files in PROF_*/
    PLATFORM_ANALYSIS_DIR = "PLATFORM"
    MAX_PATH_LENGTH = 4096
    MAX_WORKER_NAME_LENGTH = 226
    MAX_FILE_NAME_LENGTH = 255
    PROF_WARN_SIZE = 1024 ** 3  # raw msprof data above this takes long to export: warn
    SCOPE = "Scope"
    FLOW_START_PH = "s"
    FLOW_END_PH = "f"
    ACL_OP_EXE_NAME = ("ascendcl@aclopcompileandexecute", "ascendcl@aclopcompileandexecutev2")
    # memory records (torch.memory_usage and msprof's memory CSVs)
    WORKSPACE = "WORKSPACE"
    CANN_OP_MEM_LEN = 10
    PTA_OP_MEM_LEN = 14
    CANN_MEM_RECORD_LEN = 4
    PTA_MEM_RECORD_LEN = 5
    PTA_RECORD_TYPE_NUM = 3
    MEMORY_MALLOC = 0
    MEMORY_FREE = 1
    MEMORY_BLOCK_FREE = 2
    CACHING_TYPE = 0
    WORKSPACE_TYPE = 1
    # msprof's start_info: wall clock (us) and monotonic clock (ns) at the start of collection
    CANN_BEGIN_TIME = "collectionTimeBegin"
    CANN_BEGIN_MONOTONIC = "clockMonotonicRaw"
    METRIC_CPU_TIME = "self_cpu_time_total"
    METRIC_NPU_TIME = "self_npu_time_total"
    # what the parsers hand each other
    TREE_NODE = "tree_node"
    STEP_NODE = "step_range"
    STEP_ID = "step_id"
    START_TS = "start_ts"
    END_TS = "end_ts"
    COMM_OPS = "comm_ops"
    TASK_INFO = "task_info"
    FWK_START_TS = "fwk_step_start_ts"
    ENQUEUE_DATA = "enqueue_data"
    DEQUEUE_DATA = "dequeue_data"
    TORCH_OP_DATA = "torch_op_data"
    PYTHON_TRACE_DATA = "python_trace_data"
    MSTX_OP_DATA = "mstx_op_data"
    # the task manager: a parser's concurrency mode and dependencies, its return codes
    MODE = "mode"
    DEPS = "deps_parser"
    SUCCESS = 0
    FAIL = 1
    # parser names (the keys of a parser's output in its dependents' deps_data)
    TASK_QUEUE_PARSER = "task_queue"
    TORCH_OP_PARSER = "torch_op"
    DB_PRE_PARSER = "db_prepare"
    TRACE_PRE_PARSER = "trace_prepare"
    TREE_BUILD_PARSER = "build_tree"
    CANN_EXPORT_PARSER = "export"
    CANN_TIMELINE_PARSER = "timeline"
    CANN_ANALYZE_PARSER = "analyze"
    OPERATOR_VIEW_PARSER = "operator"
    TRACE_VIEW_PARSER = "trace"
    KERNEL_VIEW_PARSER = "kernel"
    TRACE_STEP_TIME_PARSER = "step_time"
    MEMORY_VIEW_PARSER = "memory"
    INTEGRATE_PARSER = "integrate"
    COMMUNICATION_PARSER = "communication"
    RELATION_PARSER = "relation"
    STACK_VIEW_PARSER = "export_stack"
    MEMORY_PREPARE = "memory_prepare"
    MEMORY_TIMELINE_PARSER = "memory_timeline"
    DB_PARSER = "torch_db"
    BASIC_DB_PARSER = "basic_db"
    FWK_API_DB_PARSER = "fwk_api_db"
    MEMORY_DB_PARSER = "memory_db"
    STEP_INFO_DB_PARSER = "step_info_db"
    COMMUNICATION_DB_PARSER = "communication_db"
    TRACE_STEP_TIME_DB_PARSER = "trace_step_time_db"
    GC_RECORD_DB_PARSER = "gc_record_db"
    TRACE_VIEW = "trace_view.json"
    # SQLite column types
    SQL_TEXT_TYPE = "TEXT"
    SQL_INTEGER_TYPE = "INTEGER"
    SQL_NUMERIC_TYPE = "NUMERIC"
    SQL_REAL_TYPE = "REAL"


def _print(level: str, message: str) -> None:
    stamp = time.strftime("[%Y-%m-%d %H:%M:%S]", time.localtime())
    print(f"{stamp} [{level}] [{os.getpid()}] profiler.py: {message}", flush=True)


def print_info_msg(message: str) -> None:
    _print("INFO", message)


def print_warn_msg(message: str) -> None:
    _print("WARNING", message)


def print_error_msg(message: str) -> None:
    _print("ERROR", message)


def _check_ns(ns) -> None:
    if isinstance(ns, bool) or not isinstance(ns, int):
        raise TypeError(f"Input must be integer nanoseconds, got {ns!r}.")


def convert_ns2us_float(ns) -> float:
    if isinstance(ns, float) and abs(ns) == float("inf"):
        return ns
    _check_ns(ns)
    return ns / NS_PER_US


def convert_ns2us_str(ns, tail: str = "") -> str:
    if isinstance(ns, float) and abs(ns) == float("inf"):
        return str(ns)
    _check_ns(ns)
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{ns // NS_PER_US}.{ns % NS_PER_US:03d}{tail}"


def convert_us2ns(us, tail: str = "\t") -> int:
    """Microseconds (text such as ``"12.345\\t"``, or a number, through its str) -> integer ns;
    digits past the third decimal are dropped."""
    text = str(us).strip(tail)
    whole, dot, frac = text.partition(".")
    if "." in frac or not (whole.lstrip("-").isdigit() and (frac.isdigit() or not dot)):
        raise RuntimeError(f"Invalid input us: {us!r}")
    value = int(whole.lstrip("-")) * NS_PER_US + int((frac[:3] or "0").ljust(3, "0"))
    return -value if whole.startswith("-") else value


def contact_2num(high_num: int, low_num: int) -> int:
    return high_num << 32 | low_num


class DbConstant:
    """Values of the ``export_type="db"`` databases: files, tables, id ranges."""
    DB_INVALID_VALUE = 4294967295  # an id that names nothing (uint32 max)
    DB_INVALID_CONNECTION_ID = -1
    DB_ASCEND_PYTORCH_PROFILER = "ascend_pytorch_profiler.db"
    DB_ANALYSIS = "analysis.db"
    TABLE_STRING_IDS = "STRING_IDS"
    TABLE_ENUM_API_TYPE = "ENUM_API_TYPE"
    TABLE_MSTX_EVENTS = "MSTX_EVENTS"
    TABLE_GC_RECORD = "GC_RECORD"
    TABLE_PYTORCH_API = "PYTORCH_API"
    TABLE_CONNECTION_IDS = "CONNECTION_IDS"
    TABLE_PYTORCH_CALLCHAINS = "PYTORCH_CALLCHAINS"
    TABLE_CANN_API = "CANN_API"
    TABLE_TASK = "TASK"
    TABLE_COMMUNICATION_OP = "COMMUNICATION_OP"
    TABLE_COMPUTE_TASK_INFO = "COMPUTE_TASK_INFO"
    TABLE_COMMUNICATION_TASK_INFO = "COMMUNICATION_TASK_INFO"
    TABLE_MEMORY_RECORD = "MEMORY_RECORD"
    TABLE_OPERATOR_MEMORY = "OP_MEMORY"
    TABLE_NPU_OP_MEM = "NPU_OP_MEM"
    TABLE_META_DATA = "META_DATA"
    TABLE_RANK_DEVICE_MAP = "RANK_DEVICE_MAP"
    TABLE_HOST_INFO = "HOST_INFO"
    TABLE_STEP_TIME = "STEP_TIME"
    TABLE_ANALYZER_BANDWIDTH = "CommAnalyzerBandwidth"
    TABLE_ANALYZER_MATRIX = "CommAnalyzerMatrix"
    TABLE_ANALYZER_TIME = "CommAnalyzerTime"
    TABLE_STEP_TRACE_TIME = "StepTraceTime"
    # the framework's ids start above CANN's: strings of the APIs, of memory, connection ids
    START_STRING_ID_FWK_API = 1 << 28
    START_STRING_ID_MEMORY = 2 << 28
    START_CONNECTION_ID_FWK_API = 5 << 28


def _columns(spec: str) -> list:
    """``"a INTEGER, b TEXT"`` -> ``[("a", "INTEGER"), ("b", "TEXT")]``."""
    return [tuple(column.split()) for column in spec.split(",")]


class TableColumnsManager:
    """The columns (name, SQLite type) of each table torch_npu writes into its databases."""
    TableColumns = {
        DbConstant.TABLE_CANN_API: _columns(
            "startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER, connectionId INTEGER, name INTEGER"),
        DbConstant.TABLE_STRING_IDS: _columns("id INTEGER, value TEXT"),
        DbConstant.TABLE_CONNECTION_IDS: _columns("id INTEGER, connectionId INTEGER"),
        DbConstant.TABLE_PYTORCH_CALLCHAINS: _columns("id INTEGER, stack INTEGER, stackDepth INTEGER"),
        DbConstant.TABLE_RANK_DEVICE_MAP: _columns("rankId INTEGER, deviceId INTEGER"),
        DbConstant.TABLE_ENUM_API_TYPE: _columns("id INTEGER, name TEXT"),
        DbConstant.TABLE_PYTORCH_API: _columns(
            "startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, name INTEGER, "
            "sequenceNumber INTEGER, fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, "
            "callchainId INTEGER, type INTEGER"),
        DbConstant.TABLE_MEMORY_RECORD: _columns(
            "component INTEGER, timestamp INTEGER, totalAllocated INTEGER, totalReserved INTEGER, "
            "totalActive INTEGER, streamPtr INTEGER, deviceId INTEGER"),
        DbConstant.TABLE_OPERATOR_MEMORY: _columns(
            "name INTEGER, size INTEGER, allocationTime INTEGER, releaseTime INTEGER, activeReleaseTime INTEGER, "
            "duration INTEGER, activeDuration INTEGER, allocationTotalAllocated INTEGER, "
            "allocationTotalReserved INTEGER, allocationTotalActive INTEGER, releaseTotalAllocated INTEGER, "
            "releaseTotalReserved INTEGER, releaseTotalActive INTEGER, streamPtr INTEGER, deviceId INTEGER"),
        DbConstant.TABLE_ANALYZER_BANDWIDTH: _columns(
            "hccl_op_name TEXT, group_name TEXT, transport_type TEXT, transit_size NUMERIC, transit_time NUMERIC, "
            "bandwidth NUMERIC, large_packet_ratio NUMERIC, package_size NUMERIC, count NUMERIC, "
            "total_duration NUMERIC, step TEXT, type TEXT"),
        DbConstant.TABLE_ANALYZER_MATRIX: _columns(
            "hccl_op_name TEXT, group_name TEXT, src_rank TEXT, dst_rank TEXT, transport_type TEXT, "
            "transit_size NUMERIC, transit_time NUMERIC, bandwidth NUMERIC, step TEXT, type TEXT, op_name TEXT"),
        DbConstant.TABLE_ANALYZER_TIME: _columns(
            "hccl_op_name TEXT, group_name TEXT, start_timestamp NUMERIC, elapse_time NUMERIC, "
            "transit_time NUMERIC, wait_time NUMERIC, synchronization_time NUMERIC, idle_time NUMERIC, "
            "step TEXT, type TEXT"),
        DbConstant.TABLE_STEP_TRACE_TIME: _columns(
            "deviceId INTEGER, step TEXT, computing NUMERIC, communication_not_overlapped NUMERIC, "
            "overlapped NUMERIC, communication NUMERIC, free NUMERIC, stage NUMERIC, bubble NUMERIC, "
            "communication_not_overlapped_and_exclude_receive NUMERIC, preparing NUMERIC"),
        DbConstant.TABLE_HOST_INFO: _columns("hostUid TEXT, hostName TEXT"),
        DbConstant.TABLE_META_DATA: _columns("name TEXT, value TEXT"),
        DbConstant.TABLE_STEP_TIME: _columns("id INTEGER, startNs INTEGER, endNs INTEGER"),
        DbConstant.TABLE_GC_RECORD: _columns("startNs INTEGER, endNs INTEGER, globalTid INTEGER"),
    }


class ApiType:
    """``PYTORCH_API.type`` (the ids of ``ENUM_API_TYPE``)."""
    TORCH_OP = 50001
    TASK_QUEUE = 50002
    PYTHON_TRACE = 50003
    MSTX_OP = 50004


class TorchOpDataOri:
    """Column indexes of a host op's row of the db export (``FwkFileParser.get_fwk_api``)."""
    START_NS = 0
    END_NS = 1
    GLOBAL_TID = 2
    CONNECTION_ID = 3
    NAME = 4
    SEQUENCE_NUM = 5
    FWD_THREAD_ID = 6
    INPUT_DIMS = 7
    INPUT_SHAPES = 8
    CALL_STACK = 9


class TaskQueueDataOri:
    """Column indexes of an enqueue / dequeue row."""
    START_NS = 0
    END_NS = 1
    GLOBAL_TID = 2
    CORRELATION_ID = 3
    NAME = 4


class PythonTraceApiDataOri:
    START_NS = 0
    END_NS = 1
    GLOBAL_TID = 2
    NAME = 3


class CannNodeLaunchApiOri:
    """Column indexes of the node launches selected from msprof's CANN_API table."""
    START_NS = 0
    END_NS = 1
    GLOBAL_TID = 2
    CORRELATION_ID = 3
