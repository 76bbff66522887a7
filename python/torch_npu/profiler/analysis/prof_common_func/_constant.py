"""Messages and time conversions of torch_npu's profiling analysis (its ``_constant``).

* ``print_info_msg`` / ``print_warn_msg`` / ``print_error_msg``: a line on stdout,
  ``[YYYY-mm-dd HH:MM:SS] [LEVEL] [pid] profiler.py: message``, as torch_npu's analysis
  reports.
* ``convert_ns2us_str(ns)``: integer nanoseconds as exact microseconds text
  (``1459635878536856678`` -> ``"1459635878536856.678"``; a float would keep only ~0.25 µs
  of an epoch time), ``convert_ns2us_float``, ``convert_us2ns`` (the way back, from text or
  a number), ``contact_2num(high, low)`` (two 32-bit halves as one id).
* ``Constant``: the names of torch_npu's profiling files and keys, of the fields of the
  FRAMEWORK records (``prof_bean``) and the unit factors (``B_TO_KB``, ``KB_TO_MB``, ``B_TO_MB``).
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
    """Values of the ``export_type="db"`` databases."""
    DB_INVALID_VALUE = 4294967295  # an id that names nothing (uint32 max)
    DB_INVALID_CONNECTION_ID = -1
