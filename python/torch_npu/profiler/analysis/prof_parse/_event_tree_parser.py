"""``EventTree``: a run's host ops, allocations and Python calls as one tree per thread, with
ids for tensors and their storage, as torch_npu's (the input of the memory timeline; it
mirrors what PyTorch's profiler builds in C++ for ``torch.profiler._memory_profiler``).

Events (``_ProfilerEvent``) come from the FRAMEWORK records: a host op (``TorchOpBean``,
with its inputs parsed from the record's text fields into ``_TensorMetadata``, lists of
them or scalars), an allocation or free (``MemoryUseBean``; frees of whole blocks are left
out) and a Python call (``PyTraceEvent``, with the parameters of a module or optimizer).

The text form of a tensor is ``impl;storage ptr;dtype;dtype size;sizes;strides;device
type;device index`` (pointers in hex, sizes ``1,2,3``); tensors are separated by ``)``, the
tensors of a list by ``)`` inside ``}``-separated lists, scalars by ``;``; a module
parameter is ``name)tensor)grad``, an optimizer parameter ``tensor)grad)state`` with state
``name>tensor]name>tensor]...``. Text that does not have that form gives None.

``build_event_tree(events)`` replays the events (sorted by start) on a stack per thread: an
event is a child of the innermost open event of its thread (for a backward op without one,
of its forward thread's), and an event ends the open ones that ended before it starts.
``calculate_unique_id(events)`` gives each storage (pointer and device, until freed) an
allocation id and each tensor whose storage is known an id.
"""
import heapq
import itertools
from enum import Enum
from typing import Dict, List, Optional, Tuple, Union

from ..prof_bean._memory_use_bean import MemoryUseBean
from ..prof_bean._torch_op_bean import TorchOpBean
from ..prof_common_func._constant import Constant, print_error_msg
from ..prof_common_func._file_tag import FileTag
from ._fwk_file_parser import FwkFileParser
from ._python_trace_parser import PythonTraceParser, PyTraceEvent

__all__ = []

BASE_16 = 16


class _EventType(Enum):
    TorchOp = 0
    Allocation = 1
    PyCall = 2


class _AllocEventType(Enum):
    MALLOC = 0
    FREE = 1
    BLOCK_FREE = 2


class _RecordScope(Enum):
    """at::RecordScope: where an op's record came from."""
    FUNCTION = 0
    BACKWARD_FUNCTION = 1
    TORCHSCRIPT_FUNCTION = 2
    KERNEL_FUNCTION_DTYPE = 3
    CUSTOM_CLASS = 4
    BUILD_FEATURE = 5
    LIFE_INTERPRETER = 6
    USER_SCOPE = 7
    STATIC_RUNTIME_OP = 8
    STATIC_RUNTIME_MODEL = 9
    NUM_SCOPES = 10


class _DeviceType(Enum):
    CPU = 0
    CUDA = 1
    NPU = 20  # PrivateUse1


class TensorEnum(Enum):
    """The fields of a tensor's text form."""
    TENSOR_IMPL = 0
    STORAGE_PTR = 1
    DTYPE = 2
    DTYPE_SIZE = 3
    SIZES = 4
    STRIDES = 5
    DEVICE_TYPE = 6
    DEVICE_INDEX = 7
    NUM_FIELDS = 8


class ModuleParamEnum(Enum):
    NAME = 0
    METADATA = 1
    GRAD = 2
    NUM_FIELDS = 3


class OptimizerParamEnum(Enum):
    METADATA = 0
    GRAD = 1
    STATE = 2
    NUM_FIELDS = 3


class StateParamEnum(Enum):
    NAME = 0
    METADATA = 1
    NUM_FIELDS = 2


class _IDReference:
    """A tensor's id and its storage's allocation id (shared by every record of that tensor)."""

    def __init__(self, tensor_id: Optional[int], allocation_id: Optional[int]):
        self.tensor_id = tensor_id
        self.allocation_id = allocation_id


class _WithIds:
    """A record with an ``id`` (_IDReference): its tensor and allocation ids."""

    @property
    def tensor_id(self) -> Optional[int]:
        return self.id.tensor_id

    @property
    def allocation_id(self) -> Optional[int]:
        return self.id.allocation_id


class _RawTensorInfo:
    """A tensor or allocation seen by an event, for assigning the ids."""

    def __init__(self, impl: Optional[int], ptr: Optional[int], device_type: int, device_index: int, is_free: bool,
                 id_ref: _IDReference):
        self.impl = impl
        self.ptr = ptr
        self.device_type = device_type
        self.device_index = device_index
        self.is_free = is_free
        self.id_ref = id_ref


class _TensorMetadata(_WithIds):
    def __init__(self, impl: int, ptr: Optional[int], dtype: str, dtype_size: int, sizes: List[int],
                 strides: List[int], device_type: int, device_index: int):
        self.impl = impl
        self.ptr = ptr
        self.dtype = dtype
        self.dtype_size = dtype_size
        self.sizes = sizes
        self.strides = strides
        self.device_type = device_type
        self.device_index = device_index
        self.id = _IDReference(None, None)


def _ints(text: str) -> List[int]:
    return [int(item) for item in text.split(",")] if text else []


def parse_tensor_metadata(tensor_str: str) -> Optional[_TensorMetadata]:
    """A tensor from its text form; None when it has not exactly the eight fields."""
    parts = tensor_str.split(";")
    if len(parts) != TensorEnum.NUM_FIELDS.value:
        return None
    ptr = parts[TensorEnum.STORAGE_PTR.value]
    return _TensorMetadata(impl=int(parts[TensorEnum.TENSOR_IMPL.value], BASE_16),
                           ptr=int(ptr, BASE_16) if ptr else None,
                           dtype=parts[TensorEnum.DTYPE.value],
                           dtype_size=int(parts[TensorEnum.DTYPE_SIZE.value]),
                           sizes=_ints(parts[TensorEnum.SIZES.value]),
                           strides=_ints(parts[TensorEnum.STRIDES.value]),
                           device_type=int(parts[TensorEnum.DEVICE_TYPE.value]),
                           device_index=int(parts[TensorEnum.DEVICE_INDEX.value]))


def get_str_from_list(str_list: List[str], index: int, default_str: str = "") -> str:
    return str_list[index] if 0 <= index < len(str_list) else default_str


def parse_input_from_string(types: Optional[str], tensors: Optional[str], tensorlists: Optional[str],
                            scalars: Optional[str]) -> List[Union[_TensorMetadata, List[_TensorMetadata], str]]:
    """An op's inputs in order: each input's type ("Scalar", "TensorList", "None",
    "ScalarList" or a tensor's dtype) says which list the next value comes from."""
    input_types = types.strip().split(";\r\n") if types is not None else []
    queues = {
        "tensor": iter(tensors.strip().split(")") if tensors is not None else []),
        "list": iter(tensorlists.strip().split("}") if tensorlists is not None else []),
        "scalar": iter(scalars.strip().split(";") if scalars is not None else []),
    }
    inputs = []
    for input_type in input_types:
        if input_type == "TensorList":
            tensor_list = next(queues["list"], "").strip().rstrip(")").split(")")
            inputs.append([parse_tensor_metadata(text) for text in tensor_list])
        elif input_type == "Scalar":
            inputs.append(next(queues["scalar"], ""))
        elif input_type in ("None", "ScalarList"):
            inputs.append(input_type)
        else:
            inputs.append(parse_tensor_metadata(next(queues["tensor"], "")))
    return inputs


class _ExtraFields_TorchOp:
    def __init__(self, bean: TorchOpBean):
        self.name = bean.name
        self.end_time_ns = bean.end_ns
        self.scope = bean.scope
        self.forward_tid = bean.args.get(Constant.FORWARD_THREAD_ID, -1)
        self.sequence_num = bean.args.get(Constant.SEQUENCE_NUMBER, -1)
        self.inputs = parse_input_from_string(bean.args.get(Constant.INPUT_DTYPES),
                                              bean.inputs.get(Constant.INPUT_TENSORS),
                                              bean.inputs.get(Constant.INPUT_TENSORLISTS),
                                              bean.inputs.get(Constant.INPUT_SCALARS))


class _ExtraFields_Allocation(_WithIds):
    """An allocation (``alloc_size`` > 0) or free (< 0), bytes, with the allocator's totals after it."""

    def __init__(self, bean: MemoryUseBean):
        self.ptr = bean.ptr
        self.alloc_size = bean.alloc_size_for_db
        self.total_active = bean.total_active_for_db
        self.total_allocated = bean.total_allocated_for_db
        self.total_reserved = bean.total_reserved_for_db
        self.device_type = bean.device_type
        self.device_index = bean.device_index
        self.id = _IDReference(None, None)


class _ModuleParam:
    def __init__(self, name: str, tensor: _TensorMetadata, grad: Optional[_TensorMetadata]):
        self.name = name
        self.tensor = tensor
        self.grad = grad


class _OptimizerParam:
    def __init__(self, tensor: _TensorMetadata, grad: Optional[_TensorMetadata],
                 state: Optional[List[Tuple[str, _TensorMetadata]]]):
        self.tensor = tensor
        self.grad = grad
        self.state = state


def parse_module_param(param_str: str) -> Optional[_ModuleParam]:
    fields = param_str.strip().split(")")
    if len(fields) != ModuleParamEnum.NUM_FIELDS.value:
        return None
    grad = fields[ModuleParamEnum.GRAD.value]
    return _ModuleParam(fields[ModuleParamEnum.NAME.value],
                        parse_tensor_metadata(fields[ModuleParamEnum.METADATA.value]),
                        parse_tensor_metadata(grad) if grad else None)


def parse_state_param(state_str: str) -> Optional[List[Tuple[str, _TensorMetadata]]]:
    pairs = []
    for item in state_str.strip().split("]"):
        if not item:
            continue
        name_and_tensor = item.strip().split(">")
        if len(name_and_tensor) != StateParamEnum.NUM_FIELDS.value:
            return None
        pairs.append((name_and_tensor[StateParamEnum.NAME.value],
                      parse_tensor_metadata(name_and_tensor[StateParamEnum.METADATA.value])))
    return pairs


def parse_optimizer_param(param_str: str) -> Optional[_OptimizerParam]:
    fields = param_str.strip().split(")")
    if len(fields) != OptimizerParamEnum.NUM_FIELDS.value:
        return None
    grad, state = fields[OptimizerParamEnum.GRAD.value], fields[OptimizerParamEnum.STATE.value]
    return _OptimizerParam(parse_tensor_metadata(fields[OptimizerParamEnum.METADATA.value]),
                           parse_tensor_metadata(grad) if grad else None,
                           parse_state_param(state) if state else [])


class _ExtraFields_PyCall:
    def __init__(self, bean: PyTraceEvent):
        self.name = bean.name
        self.end_time_ns = bean.end_time
        self.key = None
        self.module_parameters = None
        self.optimizer_parameters = None
        params = bean.params
        if params is not None:
            self.key = params.key
            if params.module_params:
                self.module_parameters = [parse_module_param(param) for param in params.module_params]
            elif params.optimizer_params:
                self.optimizer_parameters = [parse_optimizer_param(param) for param in params.optimizer_params]


class _ProfilerEvent:
    def __init__(self, bean: Union[TorchOpBean, MemoryUseBean, PyTraceEvent]):
        self.finished = False
        self.parent = None
        self.children: List["_ProfilerEvent"] = []
        if isinstance(bean, TorchOpBean):
            self.tag, self.start_time_ns, self.extra_fields = _EventType.TorchOp, bean.ts, _ExtraFields_TorchOp(bean)
        elif isinstance(bean, MemoryUseBean):
            self.tag, self.start_time_ns = _EventType.Allocation, bean.time_ns
            self.extra_fields = _ExtraFields_Allocation(bean)
        elif isinstance(bean, PyTraceEvent):
            self.tag, self.start_time_ns, self.extra_fields = _EventType.PyCall, bean.ts, _ExtraFields_PyCall(bean)
        else:
            raise TypeError(f"_ProfilerEvent: expected a TorchOpBean, MemoryUseBean or PyTraceEvent, "
                            f"got {type(bean).__name__}")
        self.tid = bean.tid

    @property
    def name(self) -> str:
        if self.tag == _EventType.Allocation:
            return "[Memory]"
        return str(self.extra_fields.name)

    @property
    def end_time_ns(self) -> int:
        """An allocation is an instant (its end is its start)."""
        if self.tag == _EventType.Allocation:
            return self.start_time_ns
        return self.extra_fields.end_time_ns

    def __lt__(self, other: "_ProfilerEvent") -> bool:
        return self.end_time_ns < other.end_time_ns


class _EndQueue:
    """The open events by end time (ties in the order they were opened)."""

    def __init__(self):
        self._heap = []
        self._count = itertools.count()

    def put(self, item: Tuple[int, _ProfilerEvent]) -> None:
        heapq.heappush(self._heap, (item[0], next(self._count), item[1]))

    def get(self) -> Tuple[int, _ProfilerEvent]:
        end, _, event = heapq.heappop(self._heap)
        return end, event

    def empty(self) -> bool:
        return not self._heap

    def first_end(self) -> int:
        return self._heap[0][0]


def mark_finished(event: _ProfilerEvent) -> bool:
    if event.finished:
        print_error_msg("Error when building tree: the event finished.")
        return False
    event.finished = True
    return True


def push_event(event: _ProfilerEvent, thread_event: Dict[int, _ProfilerEvent], unfinished_events) -> bool:
    """Opens ``event`` under the current event of its thread (or of its forward thread);
    an instant event is finished at once. False (with an error message) on an inconsistency."""
    if event.parent:
        print_error_msg("Error when building tree: the event had parent.")
        return False
    if any(not child.finished for child in event.children):
        print_error_msg("Error when building tree: the child dose not finished.")
        return False
    if event.finished:
        print_error_msg("Error when building tree: the event finished.")
        return False
    parent = thread_event.get(event.tid)
    if parent is None and event.tag == _EventType.TorchOp and event.extra_fields.forward_tid:
        parent = thread_event.get(event.extra_fields.forward_tid)
    if parent is not None:
        event.parent = parent
        parent.children.append(event)
    if event.end_time_ns > event.start_time_ns:
        thread_event[event.tid] = event
        unfinished_events.put((event.end_time_ns, event))
        return True
    return mark_finished(event)


def pop_event(event: _ProfilerEvent, thread_event: Dict[int, _ProfilerEvent]) -> bool:
    """Closes ``event`` and the events of its thread opened inside it."""
    if event.finished:
        return True
    current = thread_event.get(event.tid)
    if current is None:
        print_error_msg("Error when building tree: current event is none.")
        return False
    while current is not event:
        if not mark_finished(current):
            return False
        if current.parent is None:
            print_error_msg("Error when building tree: current event's parent is None.")
            return False
        current = current.parent
    if not mark_finished(event):
        return False
    thread_event.pop(event.tid, None)
    if event.parent:
        thread_event[event.tid] = event.parent
    return True


def build_event_tree(sorted_events: List[_ProfilerEvent]) -> None:
    """Links the events (sorted by start) into trees: ``parent`` and ``children``."""
    thread_event: Dict[int, _ProfilerEvent] = {}  # the innermost open event of each thread
    unfinished_events = _EndQueue()
    for event in sorted_events:
        while not unfinished_events.empty() and unfinished_events.first_end() < event.start_time_ns:
            if not pop_event(unfinished_events.get()[1], thread_event):
                return
        if not push_event(event, thread_event, unfinished_events):
            return
    while not unfinished_events.empty():
        if not pop_event(unfinished_events.get()[1], thread_event):
            return


def _raw(tensor: _TensorMetadata) -> _RawTensorInfo:
    return _RawTensorInfo(tensor.impl, tensor.ptr, tensor.device_type, tensor.device_index, False, tensor.id)


def get_tensor_info(sorted_events: List[_ProfilerEvent]) -> List[_RawTensorInfo]:
    """Every tensor and allocation the events saw, in order (a module's or optimizer's
    parameters once per module / optimizer)."""
    tensors: List[_RawTensorInfo] = []
    seen_pycalls = set()
    for event in sorted_events:
        fields = event.extra_fields
        if event.tag == _EventType.TorchOp:
            for item in fields.inputs:
                if isinstance(item, _TensorMetadata):
                    tensors.append(_raw(item))
                elif isinstance(item, list):
                    tensors.extend(_raw(t) for t in item if t is not None)
        elif event.tag == _EventType.Allocation:
            tensors.append(_RawTensorInfo(None, fields.ptr, fields.device_type, fields.device_index,
                                          fields.alloc_size < 0, fields.id))
        elif event.tag == _EventType.PyCall and fields.key is not None and fields.key not in seen_pycalls:
            seen_pycalls.add(fields.key)
            for param in fields.module_parameters or fields.optimizer_parameters or []:
                if param is None:
                    continue
                tensors.append(_raw(param.tensor))
                if param.grad:
                    tensors.append(_raw(param.grad))
                tensors.extend(_raw(t) for _, t in getattr(param, "state", None) or [] if t is not None)
    return tensors


def calculate_unique_id(sorted_events: List[_ProfilerEvent]) -> None:
    """Allocation ids: one per storage (pointer and device) from its first sight until it is
    freed. Tensor ids: one per allocation id seen by a tensor (not only by the allocator)."""
    tensors = get_tensor_info(sorted_events)
    storage_ids: Dict[Tuple, int] = {}
    next_allocation_id = itertools.count()
    for t in tensors:
        key = (t.ptr, t.device_type, t.device_index)
        if key not in storage_ids:
            storage_ids[key] = next(next_allocation_id)
        t.id_ref.allocation_id = storage_ids[key]
        if t.is_free:
            del storage_ids[key]
    tensor_storages = {t.id_ref.allocation_id for t in tensors if t.impl is not None}
    tensor_ids: Dict[int, int] = {}
    for t in tensors:
        allocation_id = t.id_ref.allocation_id
        if allocation_id in tensor_storages:
            t.id_ref.tensor_id = tensor_ids.setdefault(allocation_id, len(tensor_ids))


class EventTree:
    """The event trees of the run at ``profiler_path``: ``sorted_events`` (by start),
    ``get_root_nodes()``."""

    def __init__(self, profiler_path: str):
        self.profiler_path = profiler_path
        self.events: List[_ProfilerEvent] = []
        fwk_file_parser = FwkFileParser(self.profiler_path)
        self.fetch_op_events(fwk_file_parser)
        self.fetch_allocation_events(fwk_file_parser)
        self.fetch_pycall_events(fwk_file_parser)
        self.sorted_events: List[_ProfilerEvent] = sorted(self.events, key=lambda ev: ev.start_time_ns)
        build_event_tree(self.sorted_events)
        calculate_unique_id(self.sorted_events)
        self.validate_events()

    def fetch_op_events(self, fwk_file_parser: FwkFileParser) -> None:
        op_events = [_ProfilerEvent(bean) for bean in fwk_file_parser.get_file_data_by_tag(FileTag.TORCH_OP)]
        # autograd's "evaluate_function" record precedes its backward op's: give it the
        # backward op's sequence number and forward thread
        for event, following in zip(op_events, op_events[1:]):
            fields, next_fields = event.extra_fields, following.extra_fields
            if (fields.scope == _RecordScope.FUNCTION.value
                    and next_fields.scope == _RecordScope.BACKWARD_FUNCTION.value
                    and fields.name.startswith("autograd::engine::evaluate_function: ")):
                fields.sequence_num = next_fields.sequence_num
                fields.forward_tid = next_fields.forward_tid
        self.events.extend(op_events)

    def fetch_allocation_events(self, fwk_file_parser: FwkFileParser) -> None:
        self.events.extend(_ProfilerEvent(bean) for bean in fwk_file_parser.get_file_data_by_tag(FileTag.MEMORY)
                           if bean.data_type != _AllocEventType.BLOCK_FREE.value)

    def fetch_pycall_events(self, fwk_file_parser: FwkFileParser) -> None:
        parser = PythonTraceParser(fwk_file_parser.get_file_data_by_tag(FileTag.PYTHON_TRACER_HASH),
                                   fwk_file_parser.get_file_data_by_tag(FileTag.PYTHON_TRACER_FUNC),
                                   fwk_file_parser.get_file_data_by_tag(FileTag.PARAM_TENSOR_INFO))
        self.events.extend(_ProfilerEvent(bean) for bean in parser.get_pycall_data())

    def validate_events(self) -> None:
        """Reports (once) the first event with an inconsistent time or unparsable inputs / parameters."""
        for event in self.sorted_events:
            fields = event.extra_fields
            problem = None
            if event.start_time_ns > event.end_time_ns:
                problem = f"Error in {event.name}: {event.start_time_ns} > {event.end_time_ns}."
            elif event.tag == _EventType.TorchOp and any(item is None for item in fields.inputs):
                problem = f"Error in the inputs of {event.name}."
            elif event.tag == _EventType.PyCall:
                if fields.module_parameters is not None and fields.optimizer_parameters is not None:
                    problem = f"{event.name} has module parameters and optimizer parameters."
                elif fields.module_parameters is not None and any(p is None for p in fields.module_parameters):
                    problem = "Error in parsed module parameters."
                elif fields.optimizer_parameters is not None and any(
                        p is None or p.state is None for p in fields.optimizer_parameters):
                    problem = "Error in parsed optimizer parameters."
            if problem:
                print_error_msg(problem)
                return

    def get_root_nodes(self) -> List[_ProfilerEvent]:
        return [event for event in self.sorted_events if event.parent is None]
