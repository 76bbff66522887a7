"""torch_npu.profiler.analysis's parsers of a real device's output (prof_parse, prof_view).

A result directory is built here as a run on an Ascend device leaves it: FRAMEWORK/ binary
records (torch.op_range, torch.op_mark, torch.memory_usage, packed as torch_npu's C++ data
reporter lays them out), profiler_info.json, and msprof's PROF_* folder with its export
(mindstudio_profiler_output/ op_summary CSV and timeline JSON, analyze/ communication JSON,
host/start_info, an msprof database). The parsers run on it -- alone and as tasks of the
task manager -- and the views they write are checked value by value. The path finders also
run on a result directory the simulator's profiler wrote.
"""
import csv
import json
import os
import sqlite3
import struct

import pytest
import torch

import torch_npu
from torch_npu.profiler.analysis._profiler_config import ProfilerConfig
from torch_npu.profiler.analysis.prof_bean._op_summary_bean import OpSummaryBean
from torch_npu.profiler.analysis.prof_common_func import _db_manager, _id_manager
from torch_npu.profiler.analysis.prof_common_func._constant import Constant, DbConstant, contact_2num
from torch_npu.profiler.analysis.prof_common_func._file_tag import FileTag
from torch_npu.profiler.analysis.prof_common_func._log import ProfilerLogger
from torch_npu.profiler.analysis.prof_common_func._path_manager import ProfilerPathManager
from torch_npu.profiler.analysis.prof_common_func._task_manager import ConcurrentTasksManager, TaskStatus
from torch_npu.profiler.analysis.prof_parse._cann_file_parser import CANNDataEnum, CANNFileParser
from torch_npu.profiler.analysis.prof_parse._fwk_cann_relation_parser import FwkCANNRelationParser
from torch_npu.profiler.analysis.prof_parse._fwk_file_parser import FwkFileParser
from torch_npu.profiler.analysis.prof_view._communication_parser import CommunicationParser
from torch_npu.profiler.analysis.prof_view._kernel_view_parser import KernelViewParser
from torch_npu.profiler.analysis.prof_view._memory_timeline_parser import (Action, MemoryProfile,
                                                                          MemoryProfileTimeline, MemoryTimelineParser)
from torch_npu.profiler.analysis.prof_view._trace_step_time_parser import TraceStepTimeParser
from torch_npu.profiler.analysis.prof_view._trace_view_parser import TraceViewParser
from torch_npu.profiler.analysis.prof_view.cann_parse._cann_export import CANNTimelineParser
from torch_npu.profiler.analysis.prof_view.prepare_parse._fwk_pre_parser import (DbPreParser, TaskQueueParser,
                                                                                TorchOpParser, TracePreParser,
                                                                                TreeBuildParser)
from torch_npu.profiler.analysis.prof_view.prepare_parse._relation_parser import RelationParser
from torch_npu.profiler.analysis.prof_view.prof_db_parse._basic_db_parser import BasicDbParser
from torch_npu.profiler.analysis.prof_view.prof_db_parse._fwk_api_db_parser import FwkApiDbParser

PID, MAIN_TID, DEQUEUE_TID = 4242, 11, 12
NPU = 20  # PrivateUse1 in the records' device type


def _tlv(tag: int, value: bytes) -> bytes:
    return struct.pack("<HI", tag, len(value)) + value


def _record(fixed: bytes, fields=()) -> bytes:
    return _tlv(1, fixed + b"".join(_tlv(tag, text.encode()) for tag, text in fields))


def _op(name, start, end, tid=MAIN_TID, fields=(), scope=0):
    return _record(struct.pack("<3q4QB?", start, end, -1, PID, tid, tid, 0, scope, False), [(2, name), *fields])


def _mark(time_ns, category, corr_id, tid, name):
    return _record(struct.pack("<q4Q", time_ns, category, corr_id, tid, PID), [(1, name)])


def _alloc(ptr, time_ns, size, total, data_type=0):
    return _record(struct.pack("<7q2b3B2Q", ptr, time_ns, size, total, 4096, total, 0, NPU, 0, 0, data_type, 0,
                               MAIN_TID, PID))


def _tensor(impl, ptr, numel):
    return f"{impl:x};{ptr:x};float;4;{numel};1;{NPU};0"


PROF = "PROF_000001_20240101000000000_ABCDEFGHIJ"
OP_SUMMARY_HEADERS = ["Device_id", "Op Name", "OP Type", "Task Type", "Task Start Time(us)", "Task Duration(us)",
                      "Task Wait Time(us)", "Block Num", "Model ID", "Input Shapes"]
COMMUNICATION = {"hcom_allReduce__123_0_1@group": {
    "Communication Time Info": {"Start Timestamp(us)": "11.000", "Elapse Time(ms)": 0.5, "Transit Time(ms)": 0.25,
                                "Wait Time(ms)": 0.25, "Synchronization Time(ms)": 0.1, "Wait Time Ratio": 0.5,
                                "Synchronization Time Ratio": 0.28},
    "Communication Bandwidth Info": {"HCCS": {"Transit Size(MB)": 1.0, "Transit Time(ms)": 0.25,
                                              "Bandwidth(GB/s)": 4.0, "Size Distribution": {"1.0": [1, 0.25]}}}}}


def _write_run(root) -> str:
    """A run of ProfilerStep#1 [1, 9] us holding aten::mul [2, 4] and aten::add [5, 8] on the
    main thread; each enqueues its launch, dequeued on another thread, where CANN launches the
    kernels Mul [10, 12] and Add [12, 15] us on device 0. Times in ns."""
    run = root / "w_1_2_ascend_pt"
    fwk = run / "FRAMEWORK"
    fwk.mkdir(parents=True)
    (fwk / "torch.op_range").write_bytes(
        _op("ProfilerStep#1", 1000, 9000) + _op("aten::mul", 2000, 4000) + _op("aten::add", 5000, 8000))
    (fwk / "torch.op_mark").write_bytes(b"".join([
        _mark(2500, 0, 1, MAIN_TID, "aten::mul"), _mark(2600, 1, 1, MAIN_TID, "aten::mul"),
        _mark(3000, 2, 1, DEQUEUE_TID, "aten::mul"), _mark(3900, 3, 1, DEQUEUE_TID, "aten::mul"),
        _mark(5500, 0, 2, MAIN_TID, "aten::add"), _mark(5600, 1, 2, MAIN_TID, "aten::add"),
        _mark(6000, 2, 2, DEQUEUE_TID, "aten::add"), _mark(7000, 3, 2, DEQUEUE_TID, "aten::add")]))
    (run / "profiler_info.json").write_text(json.dumps({
        Constant.CONFIG: {Constant.COMMON_CONFIG: {Constant.ACTIVITIES: [Constant.CPU_ACTIVITIES,
                                                                          Constant.NPU_ACTIVITIES]},
                          Constant.EXPERIMENTAL_CONFIG: {Constant.PROFILER_LEVEL: Constant.LEVEL1}},
        Constant.RANK_ID: 0}))
    prof = run / PROF
    (prof / "device_0").mkdir(parents=True)
    (prof / "host").mkdir()
    (prof / "host" / "start_info").write_text(
        json.dumps({Constant.CANN_BEGIN_TIME: "1700000000000000", Constant.CANN_BEGIN_MONOTONIC: "5000"}))
    output = prof / "mindstudio_profiler_output"
    output.mkdir()
    events = [{"name": "process_labels", "ph": "M", "pid": 100, "tid": 0, "args": {"labels": "NPU 0"}},
              {"name": "launch", "ph": "X", "pid": 200, "tid": DEQUEUE_TID, "ts": "3.200", "dur": 0.1},
              {"name": "launch", "ph": "X", "pid": 200, "tid": DEQUEUE_TID, "ts": "6.500", "dur": 0.1}]
    for flow_id, (launch, kernel, dur) in enumerate([("3.200", "10.000", 2.0), ("6.500", "12.000", 3.0)]):
        name = "Mul" if flow_id == 0 else "Add"
        events += [{"name": name, "ph": "X", "pid": 100, "tid": 5, "ts": kernel, "dur": dur,
                    "args": {"Task Type": "AI_CORE"}},
                   {"name": "HostToDevice", "cat": "HostToDevice", "ph": "s", "id": flow_id, "pid": 200,
                    "tid": DEQUEUE_TID, "ts": launch},
                   {"name": "HostToDevice", "cat": "HostToDevice", "ph": "f", "id": flow_id, "pid": 100, "tid": 5,
                    "ts": kernel},
                   {"name": "Computing", "ph": "X", "pid": 100, "tid": 1, "ts": kernel, "dur": dur}]
    (output / "msprof_0_20240101.json").write_text(json.dumps(events))
    with open(output / "op_summary_0_20240101.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(OP_SUMMARY_HEADERS)
        writer.writerow([0, "aten::mul", "Mul", "AI_CORE", "10.000\t", 2.0, 0, 8, 4294967295, "2,3;2,3"])
        writer.writerow([0, "aten::add", "Add", "AI_CORE", "12.000\t", 3.0, 0, 8, 4294967295, "2,3;2,3"])
    (prof / "analyze").mkdir()
    (prof / "analyze" / "communication.json").write_text(json.dumps(COMMUNICATION))
    return str(run)


@pytest.fixture(autouse=True)
def fresh_state():
    """The analysis's singletons (config, id tables, databases, log) back to new afterwards."""
    yield
    ProfilerConfig().__init__()
    OpSummaryBean.headers = []
    for singleton in (_id_manager.Str2IdManager, _id_manager.ConnectionIdManager, _id_manager.CallChainIdManager,
                      _db_manager.TorchDb, _db_manager.AnalysisDb):
        singleton._instance.clear()
    ProfilerLogger.destroy()


@pytest.fixture
def run(tmp_path):
    path = _write_run(tmp_path)
    ProfilerConfig().load_info(path)
    return path


def _params(run, **extra):
    out = os.path.join(run, Constant.OUTPUT_DIR)
    os.makedirs(out, exist_ok=True)
    return dict({"profiler_path": run, "output_path": out, Constant.EXPORT_TYPE: [Constant.Text]}, **extra)


def _prepared(run) -> dict:
    """The outputs of the host record parsers and RelationParser, as the task manager hands them on."""
    params = _params(run)
    deps = {}
    for parser_class, name in ((TorchOpParser, Constant.TORCH_OP_PARSER), (TaskQueueParser, Constant.TASK_QUEUE_PARSER),
                               (TreeBuildParser, Constant.TREE_BUILD_PARSER),
                               (RelationParser, Constant.RELATION_PARSER)):
        status, deps[name] = parser_class(name, params).run(deps)
        assert status == Constant.SUCCESS, name
    return deps


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_path_finders_on_a_simulator_result_directory(tmp_path):
    with torch_npu.profiler.profile(on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))):
        torch.ones(4, device="npu").add_(1)
    (result,) = ProfilerPathManager.get_profiler_path_list(str(tmp_path))
    assert result.endswith("_ascend_pt") and ProfilerPathManager.get_profiler_path_list(result) == [result]
    assert ProfilerPathManager.get_fwk_path(result) == os.path.join(result, "FRAMEWORK")
    cann = ProfilerPathManager.get_cann_path(result)
    assert os.path.basename(cann).startswith("PROF_")
    assert ProfilerPathManager.get_device_id(cann) == [torch.npu.current_device()]
    assert ProfilerPathManager.get_host_path(cann) == os.path.join(cann, "host")
    assert ProfilerPathManager.get_info_file_path(result) == os.path.join(result, "profiler_info.json")
    # the simulator's task records are no msprof export: the CANN parser finds no files in it
    parser = CANNFileParser(result)
    assert parser.get_timeline_all_data() == [] and parser.get_file_list_by_type(CANNDataEnum.OP_SUMMARY) == set()
    assert FwkFileParser(result).get_file_data_by_tag(FileTag.TORCH_OP) == []  # no binary records either


def test_cann_files_flows_and_clock(run):
    parser = CANNFileParser(run)
    output = os.path.join(run, PROF, "mindstudio_profiler_output")
    assert parser.get_file_list_by_type(CANNDataEnum.OP_SUMMARY) == {os.path.join(output, "op_summary_0_20240101.csv")}
    assert parser.get_file_list_by_type(CANNDataEnum.COMMUNICATION) == {
        os.path.join(run, PROF, "analyze", "communication.json")}
    assert len(parser.get_timeline_all_data()) == 11
    acl_to_npu = parser.get_acl_to_npu_data()
    assert sorted(acl_to_npu) == [3200, 6500]  # the launches' starts, ns
    assert [(k.name, k.ts, k.end_ns) for k in acl_to_npu[3200]] == [("Mul", 10000, 12000)]
    assert [(k.name, k.ts, k.end_ns) for k in acl_to_npu[6500]] == [("Add", 12000, 15000)]
    assert parser.get_localtime_diff() == 1700000000000000 * 1000 - 5000
    assert parser.get_analyze_communication_data(CANNDataEnum.COMMUNICATION) == COMMUNICATION


def test_host_records_task_queue_and_relation(run):
    deps = _prepared(run)
    assert [op.name for op in deps[Constant.TORCH_OP_PARSER]] == ["ProfilerStep#1", "aten::mul", "aten::add"]
    queue = deps[Constant.TASK_QUEUE_PARSER]
    assert [(m.name, m.ts, m.dur, m.corr_id) for m in queue[Constant.ENQUEUE_DATA]] == [
        ("Enqueue", 2500, 100, 1), ("Enqueue", 5500, 100, 2)]
    assert [(m.name, m.ts, m.dur, m.tid) for m in queue[Constant.DEQUEUE_DATA]] == [
        ("Dequeue@aten::mul", 3000, 900, DEQUEUE_TID), ("Dequeue@aten::add", 6000, 1000, DEQUEUE_TID)]
    root, step, mul, add = deps[Constant.TREE_BUILD_PARSER]
    assert root.event is None and step.parent_node is root and mul.parent_node is step and add.parent_node is step
    assert (mul.corr_id_self, add.corr_id_self, step.corr_id_total) == ([1], [2], [1, 2])
    kernels = deps[Constant.RELATION_PARSER]  # dequeue correlation id -> the kernels its launch started
    assert {corr: [k.name for k in ks] for corr, ks in kernels.items()} == {1: ["Mul"], 2: ["Add"]}
    steps = FwkCANNRelationParser(run).get_step_range(root, kernels)
    assert steps == [{Constant.STEP_ID: "1", Constant.START_TS: 10000, Constant.END_TS: 15000,
                      Constant.COMM_OPS: {}, Constant.FWK_START_TS: 1000}]


def test_fwk_trace_events(run):
    deps = _prepared(run)
    queue = deps[Constant.TASK_QUEUE_PARSER]
    events = FwkFileParser(run).get_fwk_trace_data(deps[Constant.TORCH_OP_PARSER], queue[Constant.ENQUEUE_DATA],
                                                   queue[Constant.DEQUEUE_DATA])
    ops = {e["name"]: e for e in events if e.get("cat") == "cpu_op"}
    assert ops["aten::mul"]["ts"] == "2.000" and ops["aten::mul"]["dur"] == 2.0 and ops["aten::mul"]["tid"] == MAIN_TID
    enqueues = [e["name"] for e in events if e.get("cat") == "enqueue"]
    assert enqueues == ["Enqueue@aten::mul", "Enqueue@aten::add"]  # named after their dequeue's op
    flows = [(e["ph"], e["id"], e["ts"]) for e in events if e.get("cat") == "async_task_queue"]
    assert sorted(flows) == [("f", 1, "3.000"), ("f", 2, "6.000"), ("s", 1, "2.500"), ("s", 2, "5.500")]
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == Constant.THREAD_SORT}
    assert sort_index == {MAIN_TID: MAIN_TID, DEQUEUE_TID: DEQUEUE_TID + 1}  # the dequeue thread sorts last


def test_kernel_step_time_and_communication_views(run):
    deps = _prepared(run)
    params = _params(run)
    out = params["output_path"]
    assert KernelViewParser(Constant.KERNEL_VIEW_PARSER, params).run(deps) == (Constant.SUCCESS, None)
    rows = _rows(os.path.join(out, "kernel_details.csv"))
    # Level1: every op_summary column, under torch_npu's names, with the step of each task
    assert rows[0] == ["Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
                       "Wait Time(us)", "Block Num", "Model ID", "Input Shapes"]
    assert [row[:3] + row[5:7] for row in rows[1:]] == [["1", "0", "aten::mul", "10.000\t", "2.0"],
                                                        ["1", "0", "aten::add", "12.000\t", "3.0"]]

    assert TraceStepTimeParser(Constant.TRACE_STEP_TIME_PARSER, params).run(deps)[0] == Constant.SUCCESS
    header, row = _rows(os.path.join(out, "step_trace_time.csv"))
    values = dict(zip(header, row))
    assert (values["Device_id"], values["Step"]) == ("0", "1")
    # computing 2 + 3 us; the step's tasks span 10 -> 15 us; 9 us from the step's host start to its first task
    assert float(values["Computing"]) == 5.0 and float(values["Stage"]) == 5.0
    assert float(values["Preparing"]) == 9.0 and float(values["Communication"]) == 0.0

    assert CommunicationParser(Constant.COMMUNICATION_PARSER, params).run(deps)[0] == Constant.SUCCESS
    with open(os.path.join(out, "communication.json")) as f:
        communication = json.load(f)
    assert set(communication) == {"step1"} and communication["step1"]["p2p"] == {}
    collective = communication["step1"]["collective"]
    total = collective["Total Op Info"]
    assert collective["hcom_allReduce__123_0_1@group"] == COMMUNICATION["hcom_allReduce__123_0_1@group"]
    times = total["Communication Time Info"]
    assert (times["Transit Time(ms)"], times["Wait Time(ms)"], times["Wait Time Ratio"]) == (0.25, 0.25, 0.5)
    assert times["Synchronization Time Ratio"] == round(0.1 / 0.35, 4) and "Start Timestamp(us)" not in times
    hccs = total["Communication Bandwidth Info"]["HCCS"]
    assert (hccs["Transit Size(MB)"], hccs["Bandwidth(GB/s)"], hccs["Size Distribution"]) == (1.0, 4.0,
                                                                                           {"1.0": [1, 0.25]})


def test_parsers_as_tasks_write_the_trace_view(run):
    params = _params(run)
    manager = ConcurrentTasksManager()
    for parser_class, name in ((TorchOpParser, Constant.TORCH_OP_PARSER),
                               (TaskQueueParser, Constant.TASK_QUEUE_PARSER),
                               (TracePreParser, Constant.TRACE_PRE_PARSER),
                               (TreeBuildParser, Constant.TREE_BUILD_PARSER),
                               (CANNTimelineParser, Constant.CANN_TIMELINE_PARSER),
                               (RelationParser, Constant.RELATION_PARSER),
                               (TraceViewParser, Constant.TRACE_VIEW_PARSER),
                               (TraceStepTimeParser, Constant.TRACE_STEP_TIME_PARSER)):
        manager.add_task(parser_class(name, params))
    manager.run()
    assert {name: info.status for name, info in manager.task_infos.items()} == {
        name: TaskStatus.Succeed for name in manager.task_infos}
    with open(os.path.join(params["output_path"], "trace_view.json")) as f:
        trace = json.load(f)  # the host side (TracePreParser), then msprof's timeline and the op -> kernel flows
    names = [e["name"] for e in trace]
    assert {"aten::mul", "Enqueue@aten::mul", "Dequeue@aten::mul", "Mul", "Add", "Computing"} <= set(names)
    flows = sorted((e["ph"], e["tid"], e["ts"]) for e in trace if e.get("name") == "torch_to_npu")
    assert flows == [("f", 5, "10.000"), ("f", 5, "12.000"), ("s", MAIN_TID, "2.000"), ("s", MAIN_TID, "5.000")]
    assert os.path.isfile(os.path.join(params["output_path"], "step_trace_time.csv"))
    manager.clear()


def test_db_export_connects_host_ops_to_cann_launches(run):
    # msprof's database of the run: the string "launch" and two node-level launches on the dequeue thread
    cann_db = os.path.join(run, PROF, "msprof_123.db")
    conn = sqlite3.connect(cann_db)
    conn.execute("CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO STRING_IDS VALUES (7, 'launch')")
    conn.execute("CREATE TABLE CANN_API (startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER, "
                 "connectionId INTEGER, name INTEGER)")
    dequeue_thread = contact_2num(PID, DEQUEUE_TID)
    conn.executemany("INSERT INTO CANN_API VALUES (?, ?, 10000, ?, ?, 7)",
                     [(3200, 3300, dequeue_thread, 77), (6500, 6600, dequeue_thread, 78)])
    conn.commit()
    conn.close()
    db_path = os.path.join(run, Constant.OUTPUT_DIR, DbConstant.DB_ASCEND_PYTORCH_PROFILER)
    os.makedirs(os.path.dirname(db_path))
    _db_manager.TorchDb().init(db_path)
    params = _params(run, **{Constant.EXPORT_TYPE: [Constant.Db]})
    deps = _prepared(run)
    assert DbPreParser(Constant.DB_PRE_PARSER, params).run(deps)[0] == Constant.SUCCESS
    deps[Constant.DB_PRE_PARSER] = DbPreParser(Constant.DB_PRE_PARSER, params).run(deps)[1]
    assert BasicDbParser(Constant.BASIC_DB_PARSER, params).run(deps) == (Constant.SUCCESS, "")
    assert not os.path.exists(cann_db)  # moved into place as the base of the export
    assert FwkApiDbParser(Constant.FWK_API_DB_PARSER, params).run(deps) == (Constant.SUCCESS, None)
    _db_manager.TorchDb().close()

    conn = sqlite3.connect(db_path)
    strings = dict(conn.execute("SELECT id, value FROM STRING_IDS"))
    connections = {}
    for conn_id, cann_id in conn.execute("SELECT id, connectionId FROM CONNECTION_IDS"):
        connections.setdefault(conn_id, []).append(cann_id)
    apis = {strings[name]: (int(start), conn_id, api_type) for start, name, conn_id, api_type in
            conn.execute("SELECT startNs, name, connectionId, type FROM PYTORCH_API")}
    assert apis["ProfilerStep#1"][1:] == (None, 50001)
    assert connections[apis["aten::mul"][1]] == [77] and connections[apis["aten::add"][1]] == [78]
    assert apis["Dequeue@aten::mul"][0] == 3000 and apis["Enqueue@aten::mul"][2] == 50002
    assert connections[apis["Enqueue@aten::mul"][1]] == [1 + DbConstant.START_CONNECTION_ID_FWK_API]
    assert conn.execute("SELECT rankId, deviceId FROM RANK_DEVICE_MAP").fetchall() == [(0, 0)]
    assert conn.execute("SELECT count(*) FROM HOST_INFO").fetchone() == (1,)
    assert ("ENV_VARIABLES",) in conn.execute("SELECT name FROM META_DATA").fetchall()
    assert sorted(conn.execute("SELECT id, name FROM ENUM_API_TYPE")) == [
        (50001, "op"), (50002, "queue"), (50003, "trace"), (50004, "mstx")]
    conn.close()


def _memory_run(root) -> str:
    """aten::empty allocates A (1 KB); aten::mul(A, A) allocates B; aten::add_(B, A, 1) writes B;
    A is freed after. Times in ns."""
    run = root / "mem_ascend_pt"
    (run / "FRAMEWORK").mkdir(parents=True)
    a, b = 0xA00, 0xB00
    (run / "FRAMEWORK" / "torch.op_range").write_bytes(
        _op("aten::empty", 100_000, 200_000)
        + _op("aten::mul", 300_000, 400_000, fields=[(3, "float;float"), (5, f"{_tensor(1, a, 256)})"
                                                                              f"{_tensor(1, a, 256)}")])
        + _op("aten::add_", 500_000, 600_000, fields=[(3, "float;float;Scalar"),
                                                      (5, f"{_tensor(2, b, 256)}){_tensor(1, a, 256)}"), (7, "1")]))
    (run / "FRAMEWORK" / "torch.memory_usage").write_bytes(
        _alloc(a, 150_000, 1024, 1024) + _alloc(b, 350_000, 1024, 2048) + _alloc(a, 700_000, -1024, 1024, 1))
    (run / "profiler_info.json").write_text(json.dumps(
        {Constant.CONFIG: {Constant.COMMON_CONFIG: {Constant.ACTIVITIES: [Constant.CPU_ACTIVITIES]}}}))
    return str(run)


def test_memory_timeline_from_the_host_records(tmp_path):
    run = _memory_run(tmp_path)
    ProfilerConfig().load_info(run)
    profile = MemoryProfile(run)
    roots = profile._event_tree.get_root_nodes()  # an allocation is a child of the op it happened in
    assert [(e.name, [c.name for c in e.children]) for e in roots] == [
        ("aten::empty", ["[Memory]"]), ("aten::mul", ["[Memory]"]), ("aten::add_", []), ("[Memory]", [])]
    mul_inputs = roots[1].extra_fields.inputs
    assert [(t.ptr, t.sizes, t.tensor_id, t.allocation_id) for t in mul_inputs] == [(0xA00, [256], 0, 0)] * 2
    timeline = [(ts, action, key.storage.ptr, version, size) for ts, action, (key, version), size in profile.timeline]
    assert timeline == [(150_000, Action.CREATE, 0xA00, 0, 1024), (350_000, Action.CREATE, 0xB00, 0, 1024),
                        (500_000, Action.INCREMENT_VERSION, 0xB00, 0, 1024), (700_000, Action.DESTROY, 0xA00, 0, 1024)]
    assert [(allocated, reserved) for _, _, allocated, reserved in profile.memory_history] == [
        (1024, 4096), (2048, 4096), (1024, 4096)]
    times, sizes = MemoryProfileTimeline(profile)._construct_timeline("npu:0")
    assert times == [150, 350, 500, 700] and [sum(row) for row in sizes] == [1024, 2048, 2048, 1024]
    assert MemoryProfileTimeline(profile)._construct_timeline("cpu") == ([], [])

    output = str(tmp_path / "timeline.json")
    parser = MemoryTimelineParser(Constant.MEMORY_TIMELINE_PARSER,
                                  {"profiler_path": run, "output_path": output, "device": "npu:0"})
    assert parser.run({}) == (Constant.SUCCESS, None)
    with open(output) as f:
        assert json.load(f) == [times, sizes]


def test_task_manager_hands_outputs_on_and_fails_dependents(tmp_path):
    from torch_npu.profiler.analysis.prof_common_func._task_manager import ConcurrentMode, ConcurrentTask

    class Task(ConcurrentTask):
        def __init__(self, name, deps, mode, work):
            super().__init__(name, deps, mode)
            self.work = work

        def run(self, user_input):
            return self.work(user_input)

    manager = ConcurrentTasksManager()
    manager.add_task(Task("a", [], ConcurrentMode.PTHREAD, lambda _: (Constant.SUCCESS, [1, 2])))
    manager.add_task(Task("b", ["a"], ConcurrentMode.SUB_PROCESS, lambda d: (Constant.SUCCESS, sum(d["a"]) * 10)))
    manager.add_task(Task("c", ["a", "b"], ConcurrentMode.MAIN_PROCESS,
                          lambda d: (Constant.SUCCESS, (d["a"], d["b"]))))
    manager.add_task(Task("d", ["c"], ConcurrentMode.PTHREAD, lambda d: (Constant.FAIL, None)))
    manager.add_task(Task("e", ["d"], ConcurrentMode.PTHREAD, lambda d: (Constant.SUCCESS, None)))
    manager.run()
    status = {name: info.status for name, info in manager.task_infos.items()}
    assert status == {"a": TaskStatus.Succeed, "b": TaskStatus.Succeed, "c": TaskStatus.Succeed,
                      "d": TaskStatus.Failed, "e": TaskStatus.Init}
    assert manager.task_infos["c"].output == ([1, 2], 30)  # b's output came through the pipe from its process
    with pytest.raises(ValueError, match="Unknow task x"):
        manager.add_task(Task("f", ["x"], ConcurrentMode.PTHREAD, lambda d: (Constant.SUCCESS, None)))
    manager.clear()

