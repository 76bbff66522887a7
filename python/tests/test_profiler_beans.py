"""torch_npu.profiler.analysis.prof_bean: the decoders of the FRAMEWORK records and the row beans.

Records are packed here as torch_npu's C++ data reporter lays them out (little-endian:
``type:uint16 | length:uint32 | fixed struct | TLV fields tag:uint16 | length:uint32 | text``),
decoded with TLVDecoder / BinaryDecoder and checked field by field.
"""
import json
import struct
import warnings
from types import SimpleNamespace

import pytest

from torch_npu.profiler._profiler_gc_detect import ProfGCDetector
from torch_npu.profiler.analysis._profiler_config import ProfilerConfig
from torch_npu.profiler.analysis.prof_bean._event_bean import EventBean
from torch_npu.profiler.analysis.prof_bean._gc_record_bean import GCRecordBean
from torch_npu.profiler.analysis.prof_bean._ge_op_memory_bean import GeOpMemoryBean
from torch_npu.profiler.analysis.prof_bean._memory_use_bean import MemoryUseBean
from torch_npu.profiler.analysis.prof_bean._node_info_bean import NodeInfoBean
from torch_npu.profiler.analysis.prof_bean._npu_module_mem_bean import NpuModuleMemoryBean
from torch_npu.profiler.analysis.prof_bean._op_mark_bean import OpMarkBean
from torch_npu.profiler.analysis.prof_bean._op_summary_bean import OpSummaryBean
from torch_npu.profiler.analysis.prof_bean._param_tensor_bean import ParamTensorBean
from torch_npu.profiler.analysis.prof_bean._python_tracer_func_bean import PythonTracerFuncBean
from torch_npu.profiler.analysis.prof_bean._python_tracer_hash_bean import PythonTracerHashBean
from torch_npu.profiler.analysis.prof_bean._torch_op_bean import TorchOpBean
from torch_npu.profiler.analysis.prof_bean._torch_op_node import TorchOpNode
from torch_npu.profiler.analysis.prof_common_func._binary_decoder import BinaryDecoder
from torch_npu.profiler.analysis.prof_common_func._constant import Constant
from torch_npu.profiler.analysis.prof_common_func._tlv_decoder import TLVDecoder

# FwkDataType of the C++ reporter: the record type of each FRAMEWORK file
OP_RANGE, OP_MARK, MEMORY, PYTHON_TRACER_HASH, PARAM_TENSOR = 1, 2, 3, 4, 5


def _tlv(tag: int, value: bytes) -> bytes:
    return struct.pack("<HI", tag, len(value)) + value


def _record(data_type: int, fixed: bytes, fields=()) -> bytes:
    body = fixed + b"".join(_tlv(tag, text.encode()) for tag, text in fields)
    return _tlv(data_type, body)


@pytest.fixture
def config():
    """The singleton ProfilerConfig, back to its defaults afterwards."""
    cfg = ProfilerConfig()
    yield cfg
    cfg.__init__()


def test_op_range_records_round_trip(config):
    fixed1 = struct.pack("<3q4QB?", 1000, 5000, 7, 4242, 11, 12, 13, 2, True)
    fixed2 = struct.pack("<3q4QB?", -1, 9, -5, 2 ** 64 - 1, 1, 1, 1, 0, False)
    data = (_record(OP_RANGE, fixed1, [(2, "aten::addmm"), (3, "float;float;int"), (4, "2,3;3,4;"),
                                       (7, "1;1"), (8, "a.py(1): f;b.py(2): g"), (10, "flops:24")])
            + _record(OP_RANGE, fixed2, [(2, "aten::empty")]))
    ops = TLVDecoder.decode(data, TorchOpBean, struct.calcsize(TorchOpBean.CONSTANT_STRUCT))
    assert len(ops) == 2
    op = ops[0]
    assert (op.name, op.pid, op.tid, op.scope, op.is_async) == ("aten::addmm", 4242, 11, 2, True)
    assert (op.ts, op.end_ns, op.dur) == (1000, 5000, 4000)  # syscnt off, no offset: as recorded
    assert op.call_stack == "a.py(1): f;\r\nb.py(2): g"
    assert op.args == {Constant.SEQUENCE_NUMBER: 7, Constant.FORWARD_THREAD_ID: 13,
                       Constant.INPUT_DTYPES: "float;\r\nfloat;\r\nint", Constant.INPUT_SHAPES: "2,3;\r\n3,4;\r\n",
                       Constant.CALL_STACK: "a.py(1): f;\r\nb.py(2): g", Constant.FLOPS: "flops:24"}
    assert op.inputs == {Constant.INPUT_TENSORS: None, Constant.INPUT_TENSORLISTS: None,
                         Constant.INPUT_SCALARS: "1;1"}
    assert op.is_torch_op
    other = ops[1]
    assert (other.name, other.pid, other.ts, other.dur) == ("aten::empty", 2 ** 64 - 1, -1, 10)
    assert other.args == {Constant.SEQUENCE_NUMBER: -5, Constant.FORWARD_THREAD_ID: 1}
    assert other.call_stack == ""


def test_times_go_through_the_system_counter_and_the_local_offset(config, tmp_path):
    # profiler_info.json as torch_npu's profiler writes it (start_info / end_info)
    info = {Constant.CONFIG: {Constant.COMMON_CONFIG: {}, Constant.EXPERIMENTAL_CONFIG: {
                Constant.PROFILER_LEVEL: Constant.LEVEL1, Constant.EXPORT_TYPE: [Constant.Db, Constant.Text]}},
            Constant.START_INFO: {Constant.SyscntEable: True, Constant.SysCntFreq: 50.0,
                                  Constant.StartCnt: 1000, Constant.StartMonotonic: 7_000},
            Constant.END_INFO: {Constant.FWK_END_TIME: 1_700_000_000_000_000_000,
                                Constant.FWK_END_MONOTONIC: 1_000_000_000},
            Constant.RANK_ID: 3}
    (tmp_path / "profiler_info.json").write_text(json.dumps(info))
    config.load_info(str(tmp_path))
    assert config.rank_id == 3 and config.get_level() == Constant.LEVEL1
    assert config.export_type == [Constant.Db, Constant.Text]
    # 50 MHz: a tick is 20 ns; 1500 ticks after the start count -> 7000 + 500 * 20 ns monotonic
    assert config.get_timestamp_from_syscnt(1500) == 17_000
    local = 17_000 + 1_700_000_000_000_000_000 - 1_000_000_000
    fixed = struct.pack("<3q4QB?", 1500, 1600, 0, 1, 1, 1, 1, 0, False)
    (op,) = TLVDecoder.decode(_record(OP_RANGE, fixed, [(2, "aten::mul")]), TorchOpBean, len(fixed))
    assert (op.ts, op.dur) == (local, 2000)
    (mark,) = TLVDecoder.decode(_record(OP_MARK, struct.pack("<q4Q", 1500, 2, 9, 1, 1), [(1, "Add")]),
                                OpMarkBean, 40)
    assert mark.time_ns == local
    config.load_info(str(tmp_path / "elsewhere"))  # loaded once until reset_is_load
    assert config.rank_id == 3


def test_op_mark_records_round_trip():
    data = b"".join(_record(OP_MARK, struct.pack("<q4Q", 100 + cat, cat, 77, 5, 6), [(1, "aten::add")])
                    for cat in range(4))
    marks = TLVDecoder.decode(data, OpMarkBean, struct.calcsize(OpMarkBean.CONSTANT_STRUCT))
    assert [m.name for m in marks] == ["Enqueue", "Enqueue", "Dequeue@aten::add", "Dequeue@aten::add"]
    assert [(m.is_enqueue_start, m.is_enqueue_end, m.is_dequeue_start, m.is_dequeue_end) for m in marks] == [
        (True, False, False, False), (False, True, False, False),
        (False, False, True, False), (False, False, False, True)]
    assert {(m.corr_id, m.tid, m.pid) for m in marks} == {(77, 5, 6)}
    assert marks[2].args == {"correlation_id": 77} and marks[2].time_ns == 102
    assert not marks[0].is_torch_op and marks[0].is_enqueue and marks[3].is_dequeue
    with pytest.raises(ValueError, match="category"):
        OpMarkBean({Constant.CONSTANT_BYTES: struct.pack("<q4Q", 0, 4, 0, 0, 0)})


def test_memory_records_round_trip():
    fixed = struct.pack("<7q2b3B2Q", 0x1000, 123_456, 2048, 3 * 2 ** 20, 4 * 2 ** 20, 2 ** 20, 0xBEEF,
                        20, 1, 0, 1, 0, 31, 32)
    fixed_cpu = struct.pack("<7q2b3B2Q", 0, 5, -512, 0, 0, 0, 0, 0, -1, 2, 0, 1, 0, 0)
    beans = TLVDecoder.decode(_record(MEMORY, fixed) + _record(MEMORY, fixed_cpu), MemoryUseBean,
                              struct.calcsize(MemoryUseBean.CONSTANT_STRUCT))
    npu, cpu = beans
    assert (npu.ptr, npu.time_ns, npu.stream_ptr, npu.tid, npu.pid) == (0x1000, 123_456, 0xBEEF, 31, 32)
    assert (npu.alloc_size, npu.alloc_size_for_db) == (2.0, 2048)
    assert (npu.total_allocated, npu.total_reserved, npu.total_active) == (3.0, 4.0, 1.0)
    assert npu.total_reserved_for_db == 4 * 2 ** 20
    assert npu.is_npu() and npu.device_index == 1 and npu.device_tag == "NPU:1"
    assert (npu.component_type, npu.data_type, npu.allocator_type) == (0, 1, 0) and npu.is_inner_allocator()
    assert npu.row == [Constant.PTA, "123.456\t", 3.0, 4.0, 1.0, 0xBEEF, "NPU:1"]
    npu.device_index = 5
    assert npu.device_tag == "NPU:5"
    assert not cpu.is_npu() and cpu.device_tag == "CPU" and cpu.alloc_size == -0.5 and cpu.device_index == -1
    assert not cpu.is_inner_allocator()


def test_python_tracer_and_param_records_round_trip():
    # python_tracer_func: fixed-size records without a TLV header, one after the other
    funcs = b"".join(struct.pack("<4QB", 10 * i, 100 + i, 200, 0xABC0 + i, i % 2) for i in range(3))
    beans = BinaryDecoder.decode(funcs + b"\x01\x02", PythonTracerFuncBean, struct.calcsize("<4QB"))
    assert [(b.start_ns, b.tid, b.pid, b.key, b.trace_tag) for b in beans] == [
        (0, 100, 200, 0xABC0, 0), (10, 101, 200, 0xABC1, 1), (20, 102, 200, 0xABC2, 0)]
    hashes = TLVDecoder.decode(_record(PYTHON_TRACER_HASH, struct.pack("<Q", 0xABC1), [(1, "train.py(3): step")]),
                               PythonTracerHashBean, 8)
    assert [(h.key, h.value) for h in hashes] == [(0xABC1, "train.py(3): step")]
    params = TLVDecoder.decode(_record(PARAM_TENSOR, struct.pack("<Q", 9), [(1, "weight,1}bias,2")])
                               + _record(PARAM_TENSOR, struct.pack("<Q", 10), [(2, "exp_avg,3")]),
                               ParamTensorBean, 8)
    assert params[0].params.key == 9 and params[0].params.module_params == ["weight,1", "bias,2"]
    assert params[0].params.optimizer_params is None
    assert params[1].key == 10 and params[1].params.optimizer_params == ["exp_avg,3"]


def test_gc_records_from_the_gc_detector():
    data = ProfGCDetector.to_bytes([(321, 1000, 4500), (321, 9000, 9100)])
    beans = BinaryDecoder.decode(data, GCRecordBean, struct.calcsize(Constant.GC_RECORD_FORMAT))
    assert [(b.name, b.pid, b.tid, b.ts, b.dur, b.args) for b in beans] == [
        ("GC", 321, 321, 1000, 3500, {}), ("GC", 321, 321, 9000, 100, {})]
    with pytest.raises(ValueError, match="struct_size"):
        BinaryDecoder.decode(data, GCRecordBean, 0)


def test_tlv_decoder_drops_cut_and_short_records():
    good = _record(OP_MARK, struct.pack("<q4Q", 1, 0, 2, 3, 4), [(1, "x")])
    with pytest.warns(UserWarning, match="lost"):
        beans = TLVDecoder.decode(good + good[:-3], OpMarkBean, 40)  # the last one was cut off
    assert len(beans) == 1
    with pytest.warns(UserWarning, match="lost"):
        assert TLVDecoder.decode(_record(OP_MARK, b"\x00" * 8), OpMarkBean, 40) == []
    bad_text = _tlv(OP_MARK, struct.pack("<q4Q", 1, 2, 2, 3, 4) + _tlv(1, b"\xff\xfe"))
    with pytest.warns(UserWarning, match="1 items of undecoded"):
        (bean,) = TLVDecoder.decode(bad_text, OpMarkBean, 40)
    assert bean.name == "Dequeue@N/A"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TLVDecoder.tlv_list_decode(_tlv(7, b"ab") + _tlv(8, b"")) == [b"ab", b""]


def test_row_beans():
    event = EventBean({"name": "MatMul", "pid": 8, "tid": 1, "ts": "17669.780\t", "dur": 160.26,
                       "args": {"Task Type": "AI_CORE"}})
    assert (event.ts, event.end_ns, event.unique_id, event.is_ai_core) == (17669780, 17830040, "8-1-17669780", True)
    assert EventBean({"ph": "M"}).ts == 0 and not EventBean({"args": {}}).is_ai_core
    ge = GeOpMemoryBean({"Name": "g", "Size(KB)": "2", "Allocation Time(us)": "1.500\t", "Duration(us)": "0.75",
                         "Allocation Total Allocated(KB)": "1024", "Release Total Reserved(KB)": "0"})
    assert ge.row == ["cann::g", "2", "1.500\t", "2.250\t", None, "0.75", None, 1.0, None, None, None, 0.0,
                      None, None, None]
    assert GeOpMemoryBean({"Name": "g"}).release_time is None
    module = NpuModuleMemoryBean({"Device_id": "0", "Component": "HCCL", "Total Reserved(KB)": "2048"})
    assert module.row == ["0", "HCCL", "", "2.0", ""]
    try:
        OpSummaryBean.headers = ["Op Name", "Missing"]
        assert OpSummaryBean({"Op Name": "Add", "Task Start Time(us)": "5"}).row == ["Add", ""]
    finally:
        OpSummaryBean.headers = []
    assert OpSummaryBean({"Op Name": "Add", "Task Start Time(us)": "5"}).ts == "5"
    kernels = [SimpleNamespace(ts=1000, dur=1.5, is_ai_core=True), SimpleNamespace(ts=500, dur=0.25, is_ai_core=False)]
    info = NodeInfoBean(kernels)
    assert (info.device_dur, info.device_dur_with_ai_core, info.min_start, info.max_end) == (1.75, 1.5, 500, 2500)
    with pytest.raises(ValueError, match="kernel_list"):
        NodeInfoBean([])


def test_torch_op_node_tree():
    def ev(name, ts, end):
        return SimpleNamespace(name=name, ts=ts, end_ns=end, dur=end - ts, pid=1, args={}, call_stack="")

    root = TorchOpNode(ev("ProfilerStep#3", 0, 100))
    a, b = TorchOpNode(ev("a", 10, 20), root), TorchOpNode(ev("b", 40, 80), root)
    root.add_child_node(a)
    root.add_child_node(b)
    leaf = TorchOpNode(ev("c", 50, 60), b)
    b.add_child_node(leaf)
    assert root.is_profiler_step() and not a.is_profiler_step()
    assert (root.host_self_dur, b.host_self_dur, root.host_total_dur) == (50, 30, 100)
    assert [root.match_child_node(t) for t in (5, 10, 19, 20, 30, 45, 79, 80)] == [None, a, a, None, None, b, b, None]
    leaf.update_corr_id(7)
    a.update_corr_id(8)
    root.update_corr_id(9)
    assert (leaf.corr_id_self, leaf.corr_id_total, b.corr_id_total, a.corr_id_total) == ([7], [7], [7], [8])
    assert (root.corr_id_self, root.corr_id_total) == ([9], [])


def test_file_manager_writes_and_reads(tmp_path, monkeypatch):
    from torch_npu.profiler.analysis.prof_bean._ge_memory_record_bean import GeMemoryRecordBean
    from torch_npu.profiler.analysis.prof_common_func import _file_manager
    from torch_npu.profiler.analysis.prof_common_func._file_manager import FileManager

    out = tmp_path / "a" / "b"
    FileManager.create_csv_file(str(out), [["GE", "1.5", "2048", "4096", "NPU:0"]], "m.csv",
                                ["Component", "Timestamp(us)", "Total Allocated(KB)", "Total Reserved(KB)", "Device"])
    (row,) = FileManager.read_csv_file(str(out / "m.csv"), GeMemoryRecordBean)
    assert (row.component, row.time_ns, row.total_allocated, row.device_tag) == ("GE", 1500, 2.0, "NPU:0")
    assert row.row == [Constant.GE, "1.500\t", 2.0, 4.0, None, None, "NPU:0"]
    assert oct((out / "m.csv").stat().st_mode & 0o777) == "0o640"
    FileManager.create_csv_file(str(out), [], "none.csv")
    FileManager.create_json_file(str(out), {}, "none.json")
    assert not (out / "none.csv").exists() and not (out / "none.json").exists()
    trace = str(out / "trace.json")
    FileManager.create_prepare_trace_json_by_path(trace, [{"name": "a"}])
    FileManager.append_trace_json_by_path(trace, [{"name": "b"}, {"name": "c"}], str(out / "done.json"))
    assert FileManager.read_json_file(str(out / "done.json")) == [{"name": "a"}, {"name": "b"}, {"name": "c"}]
    assert FileManager.read_json_file(str(out / "missing.json")) == {}
    FileManager.create_empty_file(str(out), "parser.done")
    assert FileManager.file_read_all(str(out / "parser.done")) == ""
    FileManager.create_text_file_by_path(str(out / "t.log"), "x" * 20)
    assert FileManager.file_read_all(str(out / "t.log"), "rb") == b"x" * 20
    monkeypatch.setattr(_file_manager.Constant, "MAX_FILE_SIZE", 10)
    assert FileManager.file_read_all(str(out / "t.log")) == ""  # too large: not read
    with pytest.raises(RuntimeError, match="Invalid db file size"):
        FileManager.check_db_file_vaild(str(out / "t.log"))
    with pytest.raises(RuntimeError, match="does not exist"):
        FileManager.file_read_all(str(out / "nothing.log"))
    assert FileManager.check_file_owner(str(out / "t.log"))


def test_tree_builder_from_decoded_records():
    from torch_npu.profiler.analysis.prof_common_func._tree_builder import TreeBuilder

    def op(name, start, end, tid=1):
        return struct.pack("<3q4QB?", start, end, 0, 9, tid, tid, tid, 0, False), name

    records = [op("ProfilerStep#1", 10, 100), op("aten::mm", 20, 30), op("aten::add", 50, 80),
               op("aten::mul", 60, 70), op("aten::other_thread", 55, 58, tid=2)]
    data = b"".join(_record(OP_RANGE, fixed, [(2, name)]) for fixed, name in records)
    ops = TLVDecoder.decode(data, TorchOpBean, struct.calcsize(TorchOpBean.CONSTANT_STRUCT))
    marks = TLVDecoder.decode(_record(OP_MARK, struct.pack("<q4Q", 65, 0, 501, 1, 9), [(1, "")])
                              + _record(OP_MARK, struct.pack("<q4Q", 66, 0, 502, 2, 9), [(1, "")]),
                              OpMarkBean, 40)
    for mark in marks:
        mark.ts = mark.time_ns
    thread1 = [o for o in ops if o.tid == 1]
    nodes = TreeBuilder.build_tree(thread1, [m for m in marks if m.tid == 1] + [marks[1]])
    root, step, mm, add, mul = nodes
    assert root.event is None and [n.name for n in nodes[1:]] == ["ProfilerStep#1", "aten::mm", "aten::add",
                                                                  "aten::mul"]
    assert root.child_node_list == [step] and step.child_node_list == [mm, add] and add.child_node_list == [mul]
    assert mul.corr_id_self == [501]  # the other thread's enqueue (502) is not this tree's
    assert (add.corr_id_total, step.corr_id_total) == ([501], [501])
    TreeBuilder.update_tree_node_info(25, root)
    assert (mm.corr_id_self, step.corr_id_total, step.corr_id_self) == ([25], [501, 25], [])
    assert TreeBuilder.match_self_torch_op(65, root) is mul
    assert TreeBuilder.match_self_torch_op(40, root) is step
    assert TreeBuilder.match_self_torch_op(5, root) is None
    TreeBuilder.update_tree_node_info(200, root)  # outside every op: nothing changes
    assert step.corr_id_total == [501, 25]


def test_trace_events_of_decoded_records():
    from torch_npu.profiler.analysis.prof_common_func._trace_event_manager import TraceEventManager

    fixed = struct.pack("<3q4QB?", 1_234_567, 1_240_067, 3, 77, 5, 5, 5, 0, False)
    (op,) = TLVDecoder.decode(_record(OP_RANGE, fixed, [(2, "aten::mm")]), TorchOpBean, len(fixed))
    x = TraceEventManager.create_x_event(op, "cpu_op")
    assert x == {"ph": "X", "name": "aten::mm", "pid": 77, "tid": 5, "ts": "1234.567", "dur": 5.5, "cat": "cpu_op",
                 "args": {Constant.SEQUENCE_NUMBER: 3, Constant.FORWARD_THREAD_ID: 5}}
    meta = TraceEventManager.create_m_event(77, {5: False, 9: True})
    sorts = {(e["tid"], e["name"]): e["args"] for e in meta}
    assert sorts[(0, Constant.PROCESS_NAME)] == {"name": "Python"}
    assert sorts[(5, Constant.THREAD_SORT)] == {"sort_index": 5}
    assert sorts[(9, Constant.THREAD_SORT)] == {"sort_index": 10}  # the dequeue thread goes last
    assert sorts[(9, Constant.THREAD_NAME)] == {"name": "Thread 9"}
    gc_meta = TraceEventManager.create_gc_m_event(77, 77)
    assert [e["name"] for e in gc_meta][-2:] == [Constant.THREAD_NAME, Constant.THREAD_SORT]
    assert gc_meta[2]["args"] == {"sort_index": TraceEventManager.GC_SORT_INDEX}
    task = SimpleNamespace(pid=1, tid=2, ts=2_000_500)
    s, f = TraceEventManager.create_torch_to_npu_flow(op, task)
    assert (s["ph"], s["id"], s["ts"], s["tid"]) == ("s", 2_000_500, "1234.567", 5)
    assert (f["ph"], f["id"], f["ts"], f["pid"]) == ("f", 2_000_500, "2000.500", 1)
    fwd = {1: {"start": {"pid": 1, "tid": 1, "ts": 1000}, "end": {"pid": 1, "tid": 2, "ts": 3000}},
           2: {"start": {"pid": 1, "tid": 1, "ts": 1000}, "end": {"pid": 1, "tid": 1, "ts": 2000}},
           3: {"start": {"pid": 1, "tid": 1, "ts": 1000}}}
    assert [(e["ph"], e["id"], e["ts"]) for e in TraceEventManager.create_fwd_flow(fwd)] == [
        ("s", 1, "1.000"), ("f", 1, "3.000")]
    assert TraceEventManager.get_pid_format(3, 2, 1) == (3 << 10) | (2 << 5) | 1


def test_communication_overlap_ranges_and_host_info():
    import socket

    from torch_npu.profiler.analysis.prof_common_func._host_info import get_host_info
    from torch_npu.profiler.analysis.prof_common_func._time_range_calculator import (CommunicationTimeRange,
                                                                                      RangeCaculator)

    def comm(a, b):
        return RangeCaculator.generate_time_range(a, b, CommunicationTimeRange)

    def comp(a, b):
        return RangeCaculator.generate_time_range(a, b)

    def pairs(ranges):
        return [(r.start_ts, r.end_ts) for r in ranges]

    merged = RangeCaculator.merge_continuous_intervals([comp(10, 20), comp(20, 25), comp(1, 3), comp(2, 4)])
    assert pairs(merged) == [(1, 4), (10, 25)]
    assert RangeCaculator.merge_continuous_intervals([]) == []
    # communication hidden under computation, partly hidden, and alone; a gap where nothing runs
    pure, free = RangeCaculator.compute_pipeline_overlap(
        [comm(12, 18), comm(25, 40), comm(38, 45), comm(60, 70)], [comp(10, 30), comp(33, 35)])
    assert pairs(pure) == [(30, 33), (35, 45), (60, 70)]
    assert pairs(free) == [(45, 60)]
    assert RangeCaculator.compute_pipeline_overlap([], []) == ([], [])
    pure, free = RangeCaculator.compute_pipeline_overlap([comm(0, 5)], [comp(5, 9)])  # touching: no gap
    assert (pairs(pure), free) == ([(0, 5)], [])
    info = get_host_info()
    assert info["host_name"] == socket.gethostname() and info["host_uid"].isdigit() and info["host_uid"] != "0"


def test_db_id_managers():
    from torch_npu.profiler.analysis.prof_common_func import _id_manager
    from torch_npu.profiler.analysis.prof_common_func._constant import DbConstant

    strings, chains, conns = _id_manager.Str2IdManager(), _id_manager.CallChainIdManager(), \
        _id_manager.ConnectionIdManager()
    saved = [(m, dict(vars(m))) for m in (strings, chains, conns)]
    try:
        for m in (strings, chains, conns):
            m.__init__()
        assert _id_manager.Str2IdManager() is strings  # one table per process
        strings.set_start_id(100)
        assert [strings.get_id_from_str(s) for s in ("a", "b", "a", "")] == [100, 101, 100, DbConstant.DB_INVALID_VALUE]
        (op,) = TLVDecoder.decode(_record(OP_RANGE, struct.pack("<3q4QB?", 0, 1, 0, 1, 1, 1, 1, 0, False),
                                          [(2, "aten::mm"), (8, "train.py(3): step;a")]), TorchOpBean, 58)
        chain = chains.get_callchain_id_from_callstack(op.call_stack)
        assert chains.get_all_callchain_id()[chain] == [[102, 0], [100, 1]]  # "a" had its id already
        assert strings.get_all_string_2_id_data() == [[100, "a"], [101, "b"], [102, "train.py(3): step"]]
        assert strings.get_all_string_2_id_data() == []
        first = conns.get_id_from_connection_ids([7, 8])
        assert conns.get_connection_ids_from_id(first) == [7, 8]
        assert conns.get_connection_ids_from_id(first + 1) == [DbConstant.DB_INVALID_CONNECTION_ID]
    finally:
        for m, state in saved:
            vars(m).clear()
            vars(m).update(state)


def test_feature_manager_negotiation():
    from torch_npu.profiler.analysis.prof_common_func._feature_manager import FeatureManager, FeatureName

    def entry(component="PTA", comp_version="all", version="0", compat="0"):
        return {Constant.AffectedComponent: component, Constant.AffectedComponentVersion: comp_version,
                Constant.FeatureVersion: version, Constant.Compatibility: compat, Constant.InfoLog: ""}

    mgr = FeatureManager()
    assert FeatureManager() is mgr
    try:
        mgr.load_feature_info({
            FeatureName.ATTR: entry(version="0"),  # same version as torch_npu's
            "newer_compatible": entry(version="10", compat="1"),  # CANN newer, says compatible
            "newer_breaking": entry(version="2"),
            "other_component": entry(component="MindSpore"),
            "other_version": entry(comp_version="2.1.0"),
            "bad_version": entry(version="v1"),
        })
        assert mgr.is_supported_feature(FeatureName.ATTR)
        assert mgr.is_supported_feature("newer_compatible")
        assert not mgr.is_supported_feature("newer_breaking")
        assert not mgr.is_supported_feature("other_component") and not mgr.is_supported_feature("other_version")
        assert not mgr.is_supported_feature("bad_version") and not mgr.is_supported_feature("unknown")
        mgr.fmkFeature["ours_newer"] = {Constant.FeatureVersion: "3", Constant.Compatibility: "1"}
        mgr.load_feature_info({"ours_newer": entry(version="1")})
        assert mgr.is_supported_feature("ours_newer")  # torch_npu newer, and compatible
        with pytest.raises(TypeError, match="feature_info"):
            mgr.load_feature_info(["attr"])
    finally:
        mgr.fmkFeature.pop("ours_newer", None)
        mgr.clear()


def test_profiler_logger(tmp_path):
    import logging
    import os

    from torch_npu.profiler.analysis.prof_common_func._log import ProfilerLogger

    ProfilerLogger.destroy()
    with pytest.raises(RuntimeError, match="not initialized"):
        ProfilerLogger.get_instance()
    try:
        ProfilerLogger.init(str(tmp_path), "parse")
        logger = ProfilerLogger.get_instance()
        assert logger.name == "AscendProfiler_parse" and logger.level == logging.INFO and not logger.propagate
        ProfilerLogger.init(str(tmp_path / "other"))  # once per process
        assert ProfilerLogger.get_instance() is logger and not (tmp_path / "other").exists()
        ProfilerLogger.set_level(logging.DEBUG)
        assert {h.level for h in logger.handlers} == {logging.DEBUG}
        logger.debug("decoded %d records", 3)
        (log_file,) = (tmp_path / "logs").iterdir()
        assert log_file.name.startswith("profiler_") and log_file.name.endswith(f"_{os.getpid()}_parse.log")
        for h in logger.handlers:
            h.flush()
        text = log_file.read_text()
        assert "[INFO] [AscendProfiler_parse:" in text and "decoded 3 records" in text
    finally:
        ProfilerLogger.destroy()
    assert ProfilerLogger._instance is None and not logging.getLogger("AscendProfiler_parse").handlers
    with pytest.raises(ValueError, match="output_dir"):
        ProfilerLogger.init("")
