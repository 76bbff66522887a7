"""``export_type=ExportType.Db``: one run as torch_npu's SQLite file
``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler[_{rank}].db``.

The tables and columns are torch_npu's (and msprof's for TASK / COMPUTE_TASK_INFO):
texts are stored once in STRING_IDS and referenced by id, times are ns since the epoch,
a host operator and the device tasks it launched share a connectionId (PYTORCH_API rows
point at CONNECTION_IDS rows holding the tasks' connectionIds). Not written: CANN_API,
COMMUNICATION_OP and the per-communicator tables (analysis.db), which come from CANN's
own runtime records.
"""
import hashlib
import json
import os
import socket
from collections import defaultdict

from . import _analysis
from .analysis.prof_common_func._constant import ApiType, DbConstant, TableColumnsManager
from .analysis.prof_common_func._db_manager import DbManager

_INVALID = DbConstant.DB_INVALID_VALUE  # torch_npu's "no value" in integer columns

# The tables in the order they are written: torch_npu's columns (TableColumnsManager, shared
# with the parsers of prof_view.prof_db_parse), and msprof's for the ones below.
_TABLE_ORDER = ["STRING_IDS", "ENUM_API_TYPE", "PYTORCH_API", "CONNECTION_IDS", "TASK", "COMPUTE_TASK_INFO",
                "MEMORY_RECORD", "OP_MEMORY", "STEP_TIME", "META_DATA", "RANK_DEVICE_MAP", "HOST_INFO"]
_MSPROF_TABLES = {
    "STRING_IDS": "id INTEGER PRIMARY KEY, value TEXT",
    "ENUM_API_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
    "TASK": "startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, globalTaskId INTEGER, "
            "globalPid INTEGER, taskType INTEGER, contextId INTEGER, streamId INTEGER, taskId INTEGER, "
            "modelId INTEGER",
    "COMPUTE_TASK_INFO": "name INTEGER, globalTaskId INTEGER, blockDim INTEGER, mixBlockDim INTEGER, "
                         "taskType INTEGER, opType INTEGER, inputFormats INTEGER, inputDataTypes INTEGER, "
                         "inputShapes INTEGER, outputFormats INTEGER, outputDataTypes INTEGER, "
                         "outputShapes INTEGER, attrInfo INTEGER, opState INTEGER, hf32Eligible INTEGER",
}


def _headers(table):
    """[(column, SQLite type)] of a table."""
    if table in _MSPROF_TABLES:
        return [tuple(column.split(None, 1)) for column in _MSPROF_TABLES[table].split(", ")]
    return TableColumnsManager.TableColumns[table]


def db_name(rank):
    return f"ascend_pytorch_profiler_{rank}.db" if rank is not None and rank >= 0 else "ascend_pytorch_profiler.db"


class _Strings:
    def __init__(self):
        self.ids = {}

    def __call__(self, text):
        return self.ids.setdefault(str(text), len(self.ids))


def write_db(raw, tasks, host, steps, out, rank=None):
    """Writes the db of one run into ``out`` (ASCEND_PROFILER_OUTPUT); returns its path."""
    trace = raw["trace"]
    base_ns = int(trace.get("baseTimeNanoseconds", 0))

    def ns(us):
        return base_ns + int(round(us * 1000))

    sid = _Strings()
    pid = next((e["pid"] for evs in host.values() for e in evs), os.getpid())

    def global_tid(tid):
        return (int(pid) << 32) | (int(tid) & 0xFFFFFFFF)

    # Tasks, and which host operator launched each.
    launched = defaultdict(list)  # id(host op) -> the tasks' connection ids
    task_rows, info_rows = [], []
    for n, t in enumerate(tasks):
        if t.op is not None:
            launched[id(t.op)].append(t.correlation)
        task_rows.append((ns(t.start), ns(t.end), t.device, t.correlation, n, int(pid), sid(t.kind.upper()),
                          _INVALID, t.stream, t.correlation, _INVALID))
        if t.kind == "kernel":
            info_rows.append((sid(t.name), n, 0, 0, sid("AI_CORE" if not t.communication else "HCCL"), sid(t.type),
                              sid(""), sid(""), sid(_analysis._shapes(t.op)), sid(""), sid(""), sid(""), sid(""),
                              sid(""), sid("")))

    api_rows, conn_rows = [], []  # CONNECTION_IDS: (id, a launched task's connectionId)
    for tid, events in host.items():
        for e in events:
            if e.get("cat") != "cpu_op":
                continue
            args = e.get("args", {})
            conn = _INVALID
            if id(e) in launched:
                conn = len(api_rows)  # this operator's row number: unique
                conn_rows += [(conn, c) for c in launched[id(e)]]
            dtypes = args.get("Input type")
            api_rows.append((str(ns(e["ts"])), str(ns(e["ts"] + e.get("dur", 0))), global_tid(tid), conn,
                             sid(e["name"]), args.get("Sequence number", _INVALID), args.get("Fwd thread id", 0),
                             sid(";".join(map(str, dtypes)) if dtypes else ""), sid(_analysis._shapes(e)), _INVALID,
                             ApiType.TORCH_OP))

    for e in trace.get("traceEvents", []):  # torch_npu.npu.mstx's marks and ranges
        if e.get("cat") == "mstx":
            api_rows.append((str(ns(e["ts"])), str(ns(e["ts"] + e.get("dur", 0))), global_tid(e["tid"]), _INVALID,
                             sid(e["name"]), _INVALID, 0, sid(""), sid(""), _INVALID, ApiType.MSTX_OP))

    events = _analysis.memory_events(trace)
    pta = sid("PTA")
    mem_rows = [(pta, ns(e["ts"]), e["args"]["Total Allocated"], e["args"]["Total Reserved"],
                 e["args"]["Total Allocated"], _INVALID, e["args"]["Device Id"]) for e in events]
    op_mem_rows = []
    for name, alloc, free in _analysis.memory_blocks(events, host):
        a, f = alloc["args"], (free["args"] if free else None)
        end = ns(free["ts"]) if free else _INVALID
        dur = ns(free["ts"]) - ns(alloc["ts"]) if free else _INVALID
        op_mem_rows.append((sid(name), a["Bytes"], ns(alloc["ts"]), end, end, dur, dur, a["Total Allocated"],
                            a["Total Reserved"], a["Total Allocated"], f["Total Allocated"] if f else _INVALID,
                            f["Total Reserved"] if f else _INVALID, f["Total Allocated"] if f else _INVALID,
                            _INVALID, a["Device Id"]))

    import torch_npu

    meta = [("torch_npu_version", torch_npu.__version__), ("simulator", "true")]
    meta += [(str(k), v if isinstance(v, str) else json.dumps(v))
             for k, v in raw.get("metadata", {}).items()]
    devices = sorted({t.device for t in tasks})
    rows = {
        "ENUM_API_TYPE": [(ApiType.TORCH_OP, "op"), (ApiType.TASK_QUEUE, "queue"), (ApiType.PYTHON_TRACE, "trace"),
                          (ApiType.MSTX_OP, "mstx")],
        "PYTORCH_API": api_rows, "CONNECTION_IDS": conn_rows, "TASK": task_rows, "COMPUTE_TASK_INFO": info_rows,
        "MEMORY_RECORD": mem_rows, "OP_MEMORY": op_mem_rows,
        "STEP_TIME": [(n, ns(start), ns(end)) for n, start, end in steps], "META_DATA": meta,
        "RANK_DEVICE_MAP": [(rank if rank is not None else -1, d) for d in devices],
        "HOST_INFO": [(str(int(hashlib.sha1(socket.gethostname().encode()).hexdigest()[:15], 16)),
                       socket.gethostname())],  # a stable id per host
    }
    rows["STRING_IDS"] = [(i, text) for text, i in sid.ids.items()]  # last: every text is known now

    path = os.path.join(out, db_name(rank))
    if os.path.exists(path):
        os.remove(path)
    conn, cur = DbManager.create_connect_db(path)
    if not conn:
        raise RuntimeError(f"torch_npu.profiler: cannot create the profiler database {path}")
    try:
        for table in _TABLE_ORDER:
            DbManager.create_table_with_headers(conn, cur, table, _headers(table))
            DbManager.insert_data_into_table(conn, table, rows[table])
    finally:
        DbManager.destroy_db_connect(conn, cur)
    return path
