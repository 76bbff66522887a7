"""``FwkFileParser``: the host side's records of a run (``FRAMEWORK/``), as torch_npu's.

The profiler's data reporter writes one binary file per kind (``FileTag``; names and
layouts in ``prof_config._fwk_file_parser_config``). ``get_file_data_by_tag(tag)`` decodes
one into its beans. From those:

* ``get_task_queue_data()``: the task queue's enqueues and dequeues. Each is two op marks
  of a thread (start, end) with the op's name; a start is matched with the next end of the
  same thread and name, and the end mark becomes the span (``ts`` = the start's time,
  ``dur``);
* ``get_torch_op_tree_node(ops, enqueues)``: the call tree of the host ops (TreeBuilder);
* ``get_fwk_trace_data(ops, enqueues, dequeues)``: the host side of trace_view.json: the ops
  ("cpu_op"), enqueues and dequeues with a flow from each enqueue to its dequeue, an
  enqueue named ``<name>@<op>`` after its dequeue's op, process / thread metadata, a
  "fwdbwd" flow from a forward op to its backward, the Python tracer's calls and GC;
* ``get_fwk_api(ops, enqueues, dequeues)``: the same as rows of the db export's PYTORCH_API
  table (``TorchOpDataOri`` / ``TaskQueueDataOri`` columns), with string and connection ids
  (a forward and its backward op share a connection id; ``mstx_*`` ops are kept apart);
* ``get_gc_record_db_data`` / ``get_gc_record_trace_data``: the GC records.
"""
import os
import re
from collections import defaultdict

from .._profiler_config import ProfilerConfig
from ..prof_bean._torch_op_bean import TorchOpBean
from ..prof_common_func._binary_decoder import BinaryDecoder
from ..prof_common_func._constant import ApiType, Constant, DbConstant, contact_2num
from ..prof_common_func._file_manager import FileManager
from ..prof_common_func._file_tag import FileTag
from ..prof_common_func._id_manager import CallChainIdManager, ConnectionIdManager, Str2IdManager
from ..prof_common_func._log import ProfilerLogger
from ..prof_common_func._path_manager import ProfilerPathManager
from ..prof_common_func._tlv_decoder import TLVDecoder
from ..prof_common_func._trace_event_manager import TraceEventManager
from ..prof_common_func._tree_builder import TreeBuilder
from ..prof_config._fwk_file_parser_config import FwkFileParserConfig
from ._python_trace_parser import PythonTraceParser

__all__ = []


def _fwd_bwd_mode(torch_op) -> str:
    """A forward op (recorded on the forward thread, "Fwd thread id" 0) starts a fwd-bwd pair,
    its backward op ends it."""
    return "start" if torch_op.args.get(Constant.FORWARD_THREAD_ID) == 0 else "end"


def _record_latest(pairs: dict, torch_op, node: dict) -> None:
    """Keeps, per sequence number and side of the pair, the op that started last."""
    seq_num = torch_op.args.get(Constant.SEQUENCE_NUMBER, -1)
    if seq_num < 0:
        return
    mode = _fwd_bwd_mode(torch_op)
    if pairs.get(seq_num, {}).get(mode, {}).get("ts", -float("inf")) < torch_op.ts:
        pairs.setdefault(seq_num, {})[mode] = dict(node, ts=torch_op.ts)


class FwkFileParser:
    def __init__(self, profiler_path: str):
        self._fwk_path = ProfilerPathManager.get_fwk_path(profiler_path)
        self._profiler_path = profiler_path
        self._file_list = {}
        self._file_dispatch()
        ProfilerLogger.init(self._profiler_path, "FwkFileParser")
        self.logger = ProfilerLogger.get_instance()

    def _file_dispatch(self) -> None:
        if not self._fwk_path:
            return
        for file_name in os.listdir(os.path.realpath(self._fwk_path)):
            file_path = os.path.join(self._fwk_path, file_name)
            if not os.path.isfile(file_path):
                continue
            for file_tag, pattern in FwkFileParserConfig.FILE_DISPATCH_MAP.items():
                if re.match(pattern, file_name):
                    self._file_list.setdefault(file_tag, file_path)

    def get_file_data_by_tag(self, file_tag: FileTag) -> list:
        file_path = self._file_list.get(file_tag)
        if not file_path:
            return []
        config = FwkFileParserConfig.FILE_BEAN_MAP.get(file_tag, {})
        decoder = TLVDecoder if config.get("is_tlv") else BinaryDecoder
        return decoder.decode(FileManager.file_read_all(file_path, "rb"), config.get("bean"), config.get("struct_size"))

    def has_task_queue_data(self) -> bool:
        return bool(self._file_list.get(FileTag.OP_MARK))

    def get_task_queue_data(self) -> tuple:
        """(enqueues, dequeues): the end marks, made spans from their start marks."""
        op_marks = self.get_file_data_by_tag(FileTag.OP_MARK)
        if not op_marks:
            return [], []
        op_marks.sort(key=lambda mark: mark.time_ns)
        open_marks = {"enqueue": defaultdict(list), "dequeue": defaultdict(list)}
        spans = {"enqueue": [], "dequeue": []}
        unmatched = {"enqueue": 0, "dequeue": 0}
        for mark in op_marks:
            kind = "enqueue" if (mark.is_enqueue_start or mark.is_enqueue_end) else "dequeue"
            key = (mark.tid, mark.origin_name)
            if mark.is_enqueue_start or mark.is_dequeue_start:
                open_marks[kind][key].append(mark)
            elif mark.is_enqueue_end or mark.is_dequeue_end:
                starts = open_marks[kind].get(key)
                if not starts:
                    unmatched[kind] += 1
                    continue
                start = starts.pop()
                starts.clear()  # older unmatched starts of that op are dropped
                mark.ts = start.time_ns
                mark.dur = mark.time_ns - start.time_ns
                spans[kind].append(mark)
        for kind, count in unmatched.items():
            if count:
                self.logger.warning("%s %s data failed to match.", count, kind)
        return spans["enqueue"], spans["dequeue"]

    def get_torch_op_tree_node(self, torch_op_data: list, enqueue_data: list = None) -> list:
        if Constant.CPU_ACTIVITIES not in ProfilerConfig().activities:
            return []
        if not torch_op_data:
            self.logger.error("Get torch op tree node failed, the torch op data is empty.")
            return []
        return TreeBuilder.build_tree(torch_op_data, enqueue_data or [])

    def _pid_of(self, torch_op_data: list, enqueue_data_list: list, dequeue_data_list: list, what: str):
        """The process of the host data (None, logged, when there is none or CPU was not profiled)."""
        if Constant.CPU_ACTIVITIES not in ProfilerConfig().activities:
            return None
        for data in (torch_op_data, enqueue_data_list, dequeue_data_list):
            if data:
                return data[0].pid
        self.logger.error("Get fwk %s data failed, framework data is empty.", what)
        return None

    def get_fwk_trace_data(self, torch_op_data: list, enqueue_data_list: list, dequeue_data_list: list) -> list:
        pid = self._pid_of(torch_op_data, enqueue_data_list, dequeue_data_list, "trace")
        if pid is None:
            return []
        tid_dict = {}  # thread -> is it the dequeue thread
        fwd_dict = {}
        events = []
        for torch_op in torch_op_data:
            self.filter_fwd_bwd_event(fwd_dict, torch_op)
            tid_dict[torch_op.tid] = False
            events.append(TraceEventManager.create_x_event(torch_op, "cpu_op"))
        op_of_corr_id = {}
        for dequeue in dequeue_data_list:
            tid_dict[dequeue.tid] = True
            events.append(TraceEventManager.create_x_event(dequeue, "dequeue"))
            events.append(TraceEventManager.create_task_queue_flow(Constant.FLOW_END_PH, dequeue))
            op_of_corr_id[dequeue.corr_id] = dequeue.origin_name
        for enqueue in enqueue_data_list:
            tid_dict[enqueue.tid] = False
            event = TraceEventManager.create_x_event(enqueue, "enqueue")
            if enqueue.corr_id in op_of_corr_id:
                event["name"] += f"@{op_of_corr_id[enqueue.corr_id]}"  # named as its dequeue
            events.append(event)
            events.append(TraceEventManager.create_task_queue_flow(Constant.FLOW_START_PH, enqueue))
        python_trace_data = self.get_python_trace_data(tid_dict)
        events.extend(TraceEventManager.create_m_event(pid, tid_dict))
        events.extend(TraceEventManager.create_fwd_flow(fwd_dict))
        events.extend(python_trace_data)
        events.extend(self.get_gc_record_trace_data())
        return events

    def _python_trace_parser(self):
        trace_hash_data = self.get_file_data_by_tag(FileTag.PYTHON_TRACER_HASH)
        func_call_data = self.get_file_data_by_tag(FileTag.PYTHON_TRACER_FUNC)
        return PythonTraceParser(trace_hash_data, func_call_data) if trace_hash_data and func_call_data else None

    def get_python_trace_data(self, tid_dict: dict) -> list:
        parser = self._python_trace_parser()
        return parser.get_python_trace_data(tid_dict) if parser else []

    @classmethod
    def filter_fwd_bwd_event(cls, fwd_dict: dict, torch_op: TorchOpBean) -> None:
        _record_latest(fwd_dict, torch_op, {"pid": torch_op.pid, "tid": torch_op.tid})

    def filter_fwd_bwd_api(self, fwd_bwd_dict: dict, torch_op: TorchOpBean, torch_op_idx: int) -> None:
        _record_latest(fwd_bwd_dict, torch_op, {"idx": torch_op_idx})

    def update_fwd_bwd_connection_id(self, fwd_dict: dict, torch_op_apis: list, start_connection_id: int) -> None:
        """Gives each complete forward-backward pair a new connection id (after the task queue's)."""
        for node in fwd_dict.values():
            if node.get("start") and node.get("end"):
                connection_id = start_connection_id + DbConstant.START_CONNECTION_ID_FWK_API
                torch_op_apis[node["start"]["idx"]][3].append(connection_id)
                torch_op_apis[node["end"]["idx"]][3].append(connection_id)
                start_connection_id += 1

    def get_fwk_api(self, torch_op_data: list, enqueue_data_list: list, dequeue_data_list: list) -> dict:
        pid = self._pid_of(torch_op_data, enqueue_data_list, dequeue_data_list, "api")
        if pid is None:
            return {}
        Str2IdManager().set_start_id(DbConstant.START_STRING_ID_FWK_API)
        connection_ids = ConnectionIdManager()
        strings = Str2IdManager()
        call_chains = CallChainIdManager()

        def queue_row(mark, name):
            return [mark.ts, mark.ts + mark.dur, contact_2num(pid, mark.tid),
                    connection_ids.get_id_from_connection_ids([mark.corr_id + DbConstant.START_CONNECTION_ID_FWK_API]),
                    strings.get_id_from_str(name), None, None, None, None, None, ApiType.TASK_QUEUE]

        def string_id(text):
            return strings.get_id_from_str(text) if text else None

        op_of_corr_id = {}
        task_dequeues = []
        for dequeue in dequeue_data_list:
            task_dequeues.append(queue_row(dequeue, dequeue.name))
            op_of_corr_id[dequeue.corr_id] = dequeue.origin_name
        task_enqueues = []
        for enqueue in enqueue_data_list:
            name = enqueue.name
            if enqueue.corr_id in op_of_corr_id:
                name += f"@{op_of_corr_id[enqueue.corr_id]}"
            task_enqueues.append(queue_row(enqueue, name))

        torch_op_apis, mstx_mark_apis, fwd_bwd_dict = [], [], {}
        for torch_op in torch_op_data:
            args = torch_op.args
            call_stack = args.get(Constant.CALL_STACK)
            api = [torch_op.ts, torch_op.end_ns, contact_2num(pid, torch_op.tid), [],
                   strings.get_id_from_str(torch_op.name), args.get(Constant.SEQUENCE_NUMBER, -1),
                   args.get(Constant.FORWARD_THREAD_ID), string_id(args.get(Constant.INPUT_DTYPES)),
                   string_id(args.get(Constant.INPUT_SHAPES)),
                   call_chains.get_callchain_id_from_callstack(call_stack) if call_stack else None,
                   ApiType.TORCH_OP]
            if torch_op.name.startswith("mstx_"):
                mstx_mark_apis.append(api)
            else:
                self.filter_fwd_bwd_api(fwd_bwd_dict, torch_op, len(torch_op_apis))
                torch_op_apis.append(api)
        queue_corr_ids = [enqueue.corr_id for enqueue in enqueue_data_list]
        self.update_fwd_bwd_connection_id(fwd_bwd_dict, torch_op_apis, max(queue_corr_ids) + 1 if queue_corr_ids else 0)

        parser = self._python_trace_parser()
        return {Constant.TORCH_OP_DATA: torch_op_apis, Constant.ENQUEUE_DATA: task_enqueues,
                Constant.DEQUEUE_DATA: task_dequeues,
                Constant.PYTHON_TRACE_DATA: parser.get_python_trace_api_data() if parser else [],
                Constant.MSTX_OP_DATA: mstx_mark_apis}

    def get_first_fwk_op(self, torch_op_data: list):
        return min(torch_op_data, key=lambda op: op.ts) if torch_op_data else None

    def get_gc_record_db_data(self) -> list:
        return [[event.ts, event.ts + event.dur, contact_2num(event.pid, event.tid)]
                for event in self.get_file_data_by_tag(FileTag.GC_RECORD)]

    def get_gc_record_trace_data(self) -> list:
        """The collections as "GC" events of a "Python GC" process (its pid formed from the
        process's and the first device's, TraceEventManager.get_pid_format)."""
        gc_events = self.get_file_data_by_tag(FileTag.GC_RECORD)
        if not gc_events:
            return []
        device_ids = ProfilerPathManager.get_device_id(ProfilerPathManager.get_cann_path(self._profiler_path))
        device_id = device_ids[0] if device_ids else Constant.INVALID_VALUE
        events = []
        for event in gc_events:
            event.pid = TraceEventManager.get_pid_format(event.pid, TraceEventManager.GC_SORT_INDEX, device_id)
            events.append(TraceEventManager.create_x_event(event, "GC"))
        return events + TraceEventManager.create_gc_m_event(gc_events[0].pid, gc_events[0].tid)
