"""``PythonTraceParser``: the Python tracer's records (``with_stack=True`` + python tracing) as
calls, as torch_npu's.

FRAMEWORK/torch.python_tracer_func holds one record per call or return (thread, time, a
``TraceTag``, the key of the function); torch.python_tracer_hash maps keys to names
(``file(line): function``; a module's call is ``<name>######<module uid>``);
torch.param_tensor_info holds the parameters a module or optimizer call saw. Per thread the
records are replayed on a stack: a call opens a frame, a return closes the innermost one, and
frames still open at the end close at the thread's last record. Each closed frame is a
``PyTraceEvent`` (start, end, name, ids of itself and of its caller); an ``nn.Module`` call is
named ``nn.Module: <name>_<n>``, n counting the module instances of that name in order of
appearance.
"""
from collections import defaultdict
from enum import Enum

from ..prof_common_func._constant import ApiType, contact_2num
from ..prof_common_func._id_manager import Str2IdManager
from ..prof_common_func._trace_event_manager import TraceEventManager

__all__ = []

MODULE_NAME_DELIMITER = "######"


class TraceTag(Enum):
    kPy_Call = 0
    kPy_Return = 1
    kC_Call = 2
    kC_Return = 3


class CallType(Enum):
    kPyCall = 0
    kPyModuleCall = 1
    kCCall = 2


class PyTraceEvent:
    """One Python call: ``ts`` / ``end_time`` (ns), ``name``, ``pid`` / ``tid``, ``self_id``
    and ``parent_id`` (0: none), ``params`` (the module's or optimizer's parameters, if any)."""

    def __init__(self, start_time, end_time, name, thread_id, process_id, self_id, parent_id, call_type,
                 module_id, call_idx, return_idx, params):
        self._start_time = start_time
        self.end_time = end_time
        self._name = name
        self._tid = thread_id
        self._pid = process_id
        self._self_id = self_id
        self.parent_id = parent_id
        self._call_type = call_type
        self._module_id = module_id  # for a module call: its instance number
        self._call_idx = call_idx
        self.return_idx = return_idx
        self._params = params

    @property
    def self_id(self):
        return self._self_id

    @property
    def args(self) -> dict:
        args = {"Python id": self._self_id, "Python parent id": self.parent_id}
        if self._call_type == CallType.kPyModuleCall:
            args["Python module id"] = self._module_id
        return args

    @property
    def name(self) -> str:
        if self._call_type == CallType.kPyModuleCall:
            return f"nn.Module: {self._name}_{self._module_id}"
        return self._name

    @property
    def pid(self):
        return self._pid

    @property
    def tid(self):
        return self._tid

    @property
    def ts(self):
        return self._start_time

    @property
    def dur(self):
        return self.end_time - self._start_time

    @property
    def params(self):
        return self._params


class ReplayFrame:
    """An open call of the replay: its event (end not known yet), its id and its caller's."""

    def __init__(self, call_bean, name, event_idx, call_type, module_id, cur_id, parent_id, params):
        self.trace_event = PyTraceEvent(call_bean.start_ns, -1, name, call_bean.tid, call_bean.pid, cur_id, None,
                                        call_type, module_id, event_idx, 0, params)
        self.id = cur_id
        self.parent_id = parent_id


class PythonTraceParser:
    def __init__(self, hash_data: list, python_call_data: list, param_data: list = None):
        self._hash_data = hash_data
        self._python_call_data = python_call_data
        self._param_data = param_data
        self._hash_map = {}
        self._param_map = {}

    def get_python_trace_data(self, tid_dict: dict) -> list:
        """The calls as "python_function" trace events; their threads are added to
        ``tid_dict`` (as not the dequeue thread)."""
        events = []
        for event in self._gen_python_trace_event_data():
            events.append(TraceEventManager.create_x_event(event, "python_function"))
            tid_dict.setdefault(event.tid, False)
        return events

    def get_python_trace_api_data(self) -> list:
        """The calls as PYTORCH_API rows of the db export."""
        str2id = Str2IdManager()
        return [[event.ts, event.ts + event.dur, contact_2num(event.pid, event.tid), None,
                 str2id.get_id_from_str(event.name), None, None, None, None, None, ApiType.PYTHON_TRACE]
                for event in self._gen_python_trace_event_data()]

    def get_pycall_data(self) -> list:
        """The calls with the parameters their module / optimizer saw (for the memory timeline)."""
        if self._param_data is not None:
            self._param_map = {bean.key: bean.params for bean in self._param_data}
        return self._gen_python_trace_event_data()

    def _gen_python_trace_event_data(self) -> list:
        self._hash_map = {bean.key: bean.value for bean in self._hash_data}
        by_tid = defaultdict(list)
        for call_bean in self._python_call_data:
            by_tid[call_bean.tid].append(call_bean)
        events = []
        for records in by_tid.values():
            events.extend(self._replay_stack(records))
        return events

    def _open_frame(self, call_bean, name: str, event_idx: int, frame_id: int, parent_id: int,
                    module_names: dict, module_uids: dict) -> ReplayFrame:
        params = self._param_map.get(call_bean.key)
        if call_bean.trace_tag == TraceTag.kC_Call.value:
            return ReplayFrame(call_bean, name, event_idx, CallType.kCCall, 0, frame_id, parent_id, params)
        if MODULE_NAME_DELIMITER in name:
            module_name, module_id = self.get_module_info_from_value(name, module_names, module_uids)
            return ReplayFrame(call_bean, module_name, event_idx, CallType.kPyModuleCall, module_id, frame_id,
                               parent_id, params)
        return ReplayFrame(call_bean, name, event_idx, CallType.kPyCall, 0, frame_id, parent_id, params)

    def _replay_stack(self, records: list) -> list:
        records.sort(key=lambda bean: bean.start_ns)
        stack, closed = [], []
        module_names, module_uids = {}, {}
        last_time = 0
        event_idx = 0
        for frame_id, call_bean in enumerate(records):
            if call_bean.trace_tag in (TraceTag.kPy_Call.value, TraceTag.kC_Call.value):
                name = str(self._hash_map.get(call_bean.key, call_bean.key))
                parent_id = stack[-1].id if stack else 0
                stack.append(self._open_frame(call_bean, name, event_idx, frame_id, parent_id, module_names,
                                              module_uids))
            elif call_bean.trace_tag in (TraceTag.kPy_Return.value, TraceTag.kC_Return.value) and stack:
                frame = stack.pop()
                frame.trace_event.end_time = call_bean.start_ns
                frame.trace_event.return_idx = event_idx
                closed.append(frame)
            event_idx += 1
            last_time = max(last_time, call_bean.start_ns)
        while stack:  # still running when the trace ended
            frame = stack.pop()
            frame.trace_event.end_time = last_time
            frame.trace_event.return_idx = event_idx
            closed.append(frame)
            event_idx += 1
        by_id = {frame.id: frame.trace_event for frame in closed}
        for frame in closed:
            parent = by_id.get(frame.parent_id)
            frame.trace_event.parent_id = parent.self_id if parent is not None else 0
        return [frame.trace_event for frame in closed]

    @staticmethod
    def get_module_info_from_value(name: str, module_name_counter: dict, module_uid_map: dict):
        """``"<name>######<uid>"`` -> (name, the instance number of that uid among the modules of that name)."""
        module_name, module_uid = name.split(MODULE_NAME_DELIMITER)
        if module_uid not in module_uid_map:
            module_uid_map[module_uid] = module_name_counter.get(module_name, 0)
            module_name_counter[module_name] = module_uid_map[module_uid] + 1
        return module_name, module_uid_map[module_uid]
