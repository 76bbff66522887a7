"""``export_memory_timeline`` from a run's FRAMEWORK records, as torch_npu's: PyTorch's memory
profiler (``torch.profiler._memory_profiler``) on the host records' event tree
(``prof_parse._event_tree_parser.EventTree``) instead of the profiler's C++ one.

``MemoryProfile(profiler_path)``:

* a data flow graph: its nodes are the top-most ops that match a registered operator schema
  (or run in backward) and the allocations; a node's edges are the tensors it touches: an
  input (with the version it read; mutated when the schema says so or is unknown), an
  allocation (a new tensor, version 0), a deletion;
* categories of each (tensor, version): GRADIENT (what AccumulateGrad or a module / optimizer
  call calls a gradient), PARAMETER (a module's or optimizer's parameter, or deduced: a
  tensor the forward pass reads that is not derived from the inputs and that contributes to
  a gradient), OPTIMIZER_STATE, INPUT (what contributes to a gradient without depending on
  one), ACTIVATION (forward outputs of inputs and activations), TEMPORARY (allocated and
  freed inside one op), AUTOGRAD_DETAIL (backward outputs), else unknown;
* ``timeline``: ``(time ns, Action, (key, version), bytes)`` for each creation, version
  increment and destruction (-1: existed before the profile), ``memory_history``: the
  allocator's totals after each allocation.

``MemoryProfileTimeline(profile)`` sums the live bytes per category on a device
(``"npu:0"``, ``"cpu"``) at each time (µs): ``export_memory_timeline_json`` (``[times,
sizes]``, gzipped for ``*.gz``), ``export_memory_timeline_json_raw`` (``(time, action, bytes,
category)`` per event, gzipped), ``export_memory_timeline_html`` (a stacked plot, needs
matplotlib). ``MemoryTimelineParser`` picks the one the output path's suffix asks for.
"""
import dataclasses
import importlib
import io
import itertools
from base64 import b64encode
from collections import defaultdict
from enum import Enum
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch.profiler._utils import traverse_dfs

from ..prof_common_func._constant import Constant, print_error_msg, print_warn_msg
from ..prof_common_func._file_manager import FileManager
from ..prof_common_func._log import ProfilerLogger
from ..prof_common_func._path_manager import ProfilerPathManager
from ..prof_parse._event_tree_parser import (EventTree, _DeviceType, _EventType, _ExtraFields_Allocation,
                                             _ExtraFields_TorchOp, _ProfilerEvent, _RecordScope, _TensorMetadata)
from ._base_parser import BaseParser

__all__ = []

_DEVICE_DICT = {"cpu": _DeviceType.CPU.value, "npu": _DeviceType.NPU.value}


class Category(Enum):
    INPUT = 0
    TEMPORARY = 1
    ACTIVATION = 2
    GRADIENT = 3
    AUTOGRAD_DETAIL = 4
    PARAMETER = 5
    OPTIMIZER_STATE = 6


# the plot's colors, in stacking order (the index of a category in the sizes' rows)
_CATEGORY_TO_COLORS = {
    Category.PARAMETER: "darkgreen",
    Category.OPTIMIZER_STATE: "goldenrod",
    Category.INPUT: "black",
    Category.TEMPORARY: "mediumpurple",
    Category.ACTIVATION: "red",
    Category.GRADIENT: "mediumblue",
    Category.AUTOGRAD_DETAIL: "royalblue",
    None: "grey",
}
_CATEGORY_TO_INDEX = {category: index for index, category in enumerate(_CATEGORY_TO_COLORS)}


class Action(Enum):
    PREEXISTING = 0
    CREATE = 1
    INCREMENT_VERSION = 2
    DESTROY = 3


_ACTION_TO_INDEX = {action: action.value for action in Action}


@dataclasses.dataclass(frozen=True)
class DeviceKey:
    device_type: int
    device_index: int

    def __eq__(self, other: "DeviceKey") -> bool:
        return (self.device_type, self.device_index) == (other.device_type, other.device_index)

    def __lt__(self, other: "DeviceKey") -> bool:
        return (self.device_type, self.device_index) < (other.device_type, other.device_index)


@dataclasses.dataclass
class Storage:
    """A storage: its allocation id (what identifies it) and its address."""
    allocation_id: int
    ptr: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Storage) and self.allocation_id == other.allocation_id

    def __hash__(self) -> int:
        return hash(self.allocation_id)


@dataclasses.dataclass(eq=True, unsafe_hash=True, frozen=True)
class TensorKey(DeviceKey):
    """A tensor (its id) on its storage."""
    id: int
    storage: Storage

    def __lt__(self, other: "TensorKey") -> bool:
        return self._as_sortable < other._as_sortable

    @staticmethod
    def _make(tensor_id: Optional[int], allocation_id: Optional[int], storage_ptr: Optional[int],
              device_type: int, device_index: int) -> Optional["TensorKey"]:
        if tensor_id is None or allocation_id is None or storage_ptr is None:
            return None
        return TensorKey(device_type, device_index, tensor_id, Storage(allocation_id, storage_ptr))

    @classmethod
    def from_allocation(cls, alloc: _ExtraFields_Allocation) -> Optional["TensorKey"]:
        return cls._make(alloc.tensor_id, alloc.allocation_id, alloc.ptr, alloc.device_type, alloc.device_index)

    @classmethod
    def from_tensor(cls, t: Optional[_TensorMetadata]) -> Optional["TensorKey"]:
        if t is None:
            return None
        return cls._make(t.tensor_id, t.allocation_id, t.ptr, t.device_type, t.device_index)

    @property
    def _as_sortable(self) -> Tuple[int, int, DeviceKey]:
        return self.id, self.storage.allocation_id, DeviceKey(self.device_type, self.device_index)


def check_tensor_in_accumulategrad(node: _ProfilerEvent, child: _ProfilerEvent) -> bool:
    """Is ``node`` autograd's AccumulateGrad (in backward) whose first child (``aten::detach``
    of a new gradient, ``aten::add_`` into an existing one) has a tensor first input."""
    if node.extra_fields.scope != _RecordScope.BACKWARD_FUNCTION.value or node.name not in (
            "torch::autograd::AccumulateGrad", "struct torch::autograd::AccumulateGrad"):
        return False
    return (child.tag == _EventType.TorchOp and child.name in ("aten::detach", "aten::add_")
            and len(child.extra_fields.inputs) > 0 and isinstance(child.extra_fields.inputs[0], _TensorMetadata))


def extract_parameters_and_gradients(node: _ProfilerEvent) -> Iterator[Tuple[Optional[TensorKey],
                                                                            Optional[TensorKey]]]:
    if node.tag == _EventType.TorchOp and node.children and check_tensor_in_accumulategrad(node, node.children[0]):
        yield None, TensorKey.from_tensor(node.children[0].extra_fields.inputs[0])
    elif node.tag == _EventType.PyCall:
        fields = node.extra_fields
        for param in itertools.chain(fields.module_parameters or [], fields.optimizer_parameters or []):
            yield TensorKey.from_tensor(param.tensor), TensorKey.from_tensor(param.grad)


def extract_parameters(event: _ProfilerEvent) -> Iterator[TensorKey]:
    return (param for param, _ in extract_parameters_and_gradients(event) if param is not None)


def extract_gradients(event: _ProfilerEvent) -> Iterator[TensorKey]:
    return (grad for _, grad in extract_parameters_and_gradients(event) if grad is not None)


def get_scopes(event: Optional[_ProfilerEvent]) -> Tuple[int, ...]:
    """The record scopes of the op and the ops above it."""
    scopes = []
    while event:
        if event.tag == _EventType.TorchOp:
            scopes.append(event.extra_fields.scope)
        event = event.parent
    return tuple(scopes)


def _tensors_of(event: _ProfilerEvent) -> Iterator[Optional[_TensorMetadata]]:
    """The tensors an op takes, or a module / optimizer call's parameters, gradients and states."""
    fields = event.extra_fields
    if event.tag == _EventType.TorchOp:
        for item in fields.inputs:
            if isinstance(item, _TensorMetadata):
                yield item
            elif isinstance(item, list):
                yield from item
    elif event.tag == _EventType.PyCall:
        for param in fields.module_parameters or fields.optimizer_parameters or []:
            yield param.tensor
            yield param.grad
            for _, state in getattr(param, "state", None) or []:
                yield state


class StorageSizeDict:
    """Bytes of each tensor: its allocation's size, else the largest its metadata showed."""

    def __init__(self, sorted_events: List[_ProfilerEvent]):
        self._size_dict: Dict[TensorKey, int] = {}
        for event in sorted_events:
            for tensor in _tensors_of(event):
                key = TensorKey.from_tensor(tensor)
                if key is not None:
                    size = tensor.dtype_size
                    for dim in tensor.sizes:
                        size *= dim
                    self._size_dict[key] = max(self._size_dict.get(key, 0), size)
        allocations: Dict[TensorKey, int] = {}
        for event in sorted_events:
            if event.tag == _EventType.Allocation:
                key = TensorKey.from_allocation(event.extra_fields)
                if key is not None:
                    allocations.setdefault(key, abs(event.extra_fields.alloc_size))
        self._size_dict.update(allocations)

    def __getitem__(self, key: TensorKey) -> int:
        return self._size_dict.get(key, 0)


class SchemaMatcher:
    """The registered schemas an op's observed inputs fit (by name and argument types), and
    from them which inputs it may write."""

    @classmethod
    def inputs_are_mutable(cls, op: _ExtraFields_TorchOp) -> Tuple[Optional[bool], ...]:
        """Per input: written by some matching schema; None (unknown) without a match."""
        mutable = None
        for schema in cls.match_schemas(op):
            mutable = mutable or [False] * len(schema.arguments)
            for i, arg in enumerate(schema.arguments):
                mutable[i] = mutable[i] or getattr(arg.alias_info, "is_write", False)
        return tuple(mutable) if mutable else tuple(None for _ in op.inputs)

    @classmethod
    def match_schemas(cls, op: _ExtraFields_TorchOp) -> tuple:
        schemas = cls.lookup_schemas(op.name)
        if schemas is None:
            return ()
        signature = tuple(TensorKey.from_tensor(item) if isinstance(item, _TensorMetadata)
                          else [TensorKey.from_tensor(t) for t in item] if isinstance(item, list) else item
                          for item in op.inputs)
        return tuple(schema for schema in schemas if len(schema.arguments) == len(signature) and all(
            cls._types_match(observed, arg.type) for observed, arg in zip(signature, schema.arguments)))

    @classmethod
    def _types_match(cls, observed, schema_type) -> bool:
        if isinstance(schema_type, torch._C.OptionalType):
            return observed == "None" or cls._types_match(observed, schema_type.getElementType())
        if isinstance(schema_type, torch._C.AnyType):
            return True
        if isinstance(schema_type, torch._C.TensorType):
            return isinstance(observed, TensorKey)
        if schema_type.isSubtypeOf(torch._C.ListType.ofTensors()):
            return isinstance(observed, list) and all(isinstance(t, TensorKey) for t in observed)
        return not isinstance(observed, (TensorKey, list))

    @staticmethod
    def lookup_schemas(name: str) -> Optional[tuple]:
        """The schemas registered under an op name ("ns::op"), None for no such op."""
        if "::" not in name:
            return None
        try:
            return tuple(torch._C._jit_get_schemas_for_operator(name))
        except RuntimeError:
            return None


@dataclasses.dataclass
class DataFlowEdge:
    """``input_version`` None: allocated by the node; ``mutated`` None: freed by the node."""
    input_version: Optional[int] = None
    mutated: Optional[bool] = False

    @property
    def is_allocation(self) -> bool:
        return self.input_version is None

    @property
    def is_deletion(self) -> bool:
        return self.mutated is None


class DataFlowNode:
    def __init__(self, event: _ProfilerEvent, graph: "DataFlowGraph"):
        self._event = event
        self._graph = graph
        self._edges: Dict[TensorKey, DataFlowEdge] = self._determine_edges()
        for key, edge in self._edges.items():
            if edge.mutated and not edge.is_allocation:
                self._graph.increase_version(key)

    def _determine_edges(self) -> Dict[TensorKey, DataFlowEdge]:
        subtree = tuple(traverse_dfs([self._event]))
        mutable_by_key: Dict[TensorKey, Set[Optional[bool]]] = defaultdict(set)
        for op in (event.extra_fields for event in subtree if event.tag == _EventType.TorchOp):
            for item, mutable in zip(op.inputs, SchemaMatcher.inputs_are_mutable(op)):
                tensors = [item] if isinstance(item, _TensorMetadata) else item if isinstance(item, list) else []
                for tensor in tensors:
                    key = TensorKey.from_tensor(tensor)
                    if key is not None:
                        mutable_by_key[key].add(mutable)
        edges: Dict[TensorKey, DataFlowEdge] = defaultdict(DataFlowEdge)
        for key, mutable_set in mutable_by_key.items():
            edges[key].input_version = self._graph.lookup(key)
            # mutated when a schema writes it, or when no schema tells
            edges[key].mutated = True in mutable_set or mutable_set == {None}
        # a freed tensor is an input (deleted); then what the node allocated is no input
        allocations = [event.extra_fields for event in subtree if event.tag == _EventType.Allocation]
        for alloc in allocations:
            key = TensorKey.from_allocation(alloc)
            if alloc.alloc_size < 0 and key is not None:
                edges[key].mutated = None
                edges[key].input_version = self._graph.lookup(key)
        for alloc in allocations:
            key = TensorKey.from_allocation(alloc)
            if alloc.alloc_size > 0 and key is not None:
                edges[key].input_version = None
        return dict(sorted(edges.items()))

    @property
    def inputs(self) -> Dict[TensorKey, Tuple[bool, int]]:
        """{tensor: (mutated, version read)} of what the node did not allocate."""
        return {key: (bool(edge.mutated), edge.input_version) for key, edge in self._edges.items()
                if not edge.is_allocation}

    @property
    def outputs(self) -> Dict[TensorKey, int]:
        """{tensor: version} of what the node allocated and kept (0) or wrote (version read + 1)."""
        return {key: 0 if edge.input_version is None else edge.input_version + 1
                for key, edge in self._edges.items() if (edge.is_allocation and not edge.is_deletion) or edge.mutated}

    @property
    def intermediates(self) -> Tuple[TensorKey, ...]:
        """What the node allocated and freed."""
        return tuple(key for key, edge in self._edges.items() if edge.is_allocation and edge.is_deletion)

    @property
    def start_time(self) -> int:
        return self._event.start_time_ns


class DataFlowGraph:
    def __init__(self, root_nodes: List[_ProfilerEvent]):
        self._root_nodes = root_nodes
        self._leaf_events = self._extract_leaf_events(root_nodes)
        self._active_version: Dict[TensorKey, int] = {}
        self._flow_nodes = sorted((DataFlowNode(event, self) for event in self._leaf_events),
                                  key=lambda node: node.start_time)
        self.validate()

    @property
    def flow_nodes(self) -> Tuple[DataFlowNode, ...]:
        return tuple(self._flow_nodes)

    @property
    def leaf_events(self) -> Tuple[_ProfilerEvent, ...]:
        return self._leaf_events

    def validate(self) -> None:
        """Warns when an NPU (tensor, version) is created by two nodes (records are missing)."""
        outputs: Set[Tuple[TensorKey, int]] = set()
        for node in self._flow_nodes:
            node_outputs = set(node.outputs.items())
            if any(key.device_type == _DeviceType.NPU.value for key, _ in outputs & node_outputs):
                print_warn_msg("Warn in data flow graph: the NPU memory record maybe incomplete.")
                return
            outputs |= node_outputs

    @staticmethod
    def _leaf_op(event: _ProfilerEvent) -> bool:
        return event.tag == _EventType.TorchOp and (
            event.extra_fields.scope == _RecordScope.BACKWARD_FUNCTION.value
            or bool(SchemaMatcher.match_schemas(event.extra_fields)))

    def _get_children(self, event: _ProfilerEvent) -> List[_ProfilerEvent]:
        return [] if self._leaf_op(event) or event.tag == _EventType.Allocation else event.children

    def _extract_leaf_events(self, root_nodes: List[_ProfilerEvent]) -> Tuple[_ProfilerEvent, ...]:
        """The top-most schema ops (a ``record_function`` block is too coarse, an op's inner
        ops too fine) and the allocations, by start."""
        leaves = [event for event in traverse_dfs(root_nodes, children_fn=self._get_children)
                  if self._leaf_op(event) or event.tag == _EventType.Allocation]
        return tuple(sorted(leaves, key=lambda event: event.start_time_ns))

    def lookup(self, key: TensorKey) -> int:
        return self._active_version.setdefault(key, 0)

    def increase_version(self, key: TensorKey) -> None:
        self._active_version[key] = self._active_version.get(key, 0) + 1


@dataclasses.dataclass
class CategoryElement:
    """The categories of one tensor id: for every key and version (``by_id``: PARAMETER,
    GRADIENT, OPTIMIZER_STATE), per key (TEMPORARY), per key and version (the others)."""
    by_id: Optional[Category] = None
    by_key: Dict[TensorKey, Category] = dataclasses.field(default_factory=dict)
    by_version: Dict[Tuple[TensorKey, int], Category] = dataclasses.field(default_factory=dict)
    by_id_keyset: Set[TensorKey] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class CategoryDict:
    _category_dict: Dict[int, CategoryElement] = dataclasses.field(
        default_factory=lambda: defaultdict(CategoryElement))

    def set_by_id(self, key: TensorKey, category: Category) -> None:
        self._category_dict[key.id].by_id = category
        self._category_dict[key.id].by_id_keyset.add(key)

    def set_by_key(self, key: TensorKey, category: Category) -> None:
        self._category_dict[key.id].by_key[key] = category

    def setdefault_by_version(self, key: TensorKey, version: int, category: Category) -> None:
        self._category_dict[key.id].by_version.setdefault((key, version), category)

    def get(self, key: DeviceKey, version: int) -> Optional[Category]:
        if not isinstance(key, TensorKey):
            return None  # memory that no tensor is known to use
        element = self._category_dict[key.id]
        return element.by_id or element.by_key.get(key) or element.by_version.get((key, version))


class MemoryProfile:
    def __init__(self, file_path: str) -> None:
        self._event_tree = EventTree(file_path)
        self._root_nodes = self._event_tree.get_root_nodes()
        self._data_flow_graph = DataFlowGraph(self._root_nodes)
        self._storage_size_dict = StorageSizeDict(self._event_tree.sorted_events)
        self._categories = CategoryDict()
        self._set_gradients_and_temporaries()
        self._set_parameters_using_python_tracer()
        self._set_inputs()
        self._set_parameters_using_data_flow()
        self._set_activations()
        self._set_optimizer_state()
        self._set_autograd_detail()

    def _allocations(self) -> List[_ProfilerEvent]:
        return sorted((event for event in traverse_dfs(self._root_nodes) if event.tag == _EventType.Allocation),
                      key=lambda event: event.start_time_ns)

    @property
    def timeline(self) -> Tuple[Tuple[int, Action, Tuple[DeviceKey, int], int], ...]:
        """``(time ns, action, (key, version), bytes)`` sorted by time and action; memory no
        tensor is known to use has a DeviceKey and version 0, time -1 is before the profile."""
        output = []
        allocation_times: Dict[Tuple[TensorKey, bool], int] = {}
        live_unknown: Dict[Tuple[int, DeviceKey], bool] = {}
        for event in self._allocations():
            alloc = event.extra_fields
            is_allocation, ts = alloc.alloc_size > 0, event.start_time_ns
            key = TensorKey.from_allocation(alloc)
            if key is not None:
                allocation_times[(key, is_allocation)] = ts
                continue
            device_key = DeviceKey(alloc.device_type, alloc.device_index)
            ptr_and_device = (alloc.ptr, device_key)
            if is_allocation:
                action = Action.INCREMENT_VERSION if ptr_and_device in live_unknown else Action.CREATE
                live_unknown[ptr_and_device] = True
                output.append((ts, action, (device_key, 0), alloc.alloc_size))
            else:
                output.append((ts, Action.DESTROY, (device_key, 0), -alloc.alloc_size))
                if not live_unknown.pop(ptr_and_device, False):  # allocated before the profile
                    output.append((-1, Action.PREEXISTING, (device_key, 0), -alloc.alloc_size))

        snapshot = self._category_snapshot()
        last_version = dict(sorted(snapshot))  # each key's last version
        events = [(-1, Action.PREEXISTING, (key, version)) for key, version in snapshot
                  if (key, True) not in allocation_times and version == 0]
        for node in self._data_flow_graph.flow_nodes:
            for key, edge in node._edges.items():
                if edge.is_allocation:
                    events.append((allocation_times.get((key, True)), Action.CREATE, (key, 0)))
                elif edge.mutated:
                    events.append((node._event.start_time_ns, Action.INCREMENT_VERSION, (key, edge.input_version)))
                if edge.is_deletion:
                    events.append((allocation_times.get((key, False)), Action.DESTROY, (key, last_version[key])))
        output.extend((ts, action, key_and_version, self._storage_size_dict[key_and_version[0]])
                      for ts, action, key_and_version in events)
        output.sort(key=lambda item: (item[0], item[1].value))
        return tuple(output)

    @property
    def memory_history(self) -> List[Tuple[DeviceKey, int, int, int]]:
        """(device, total active, total allocated, total reserved) after each allocator event."""
        return [(DeviceKey(event.extra_fields.device_type, event.extra_fields.device_index),
                 event.extra_fields.total_active, event.extra_fields.total_allocated,
                 event.extra_fields.total_reserved)
                for event in traverse_dfs(self._root_nodes) if event.tag == _EventType.Allocation]

    def _is_gradient(self, *args, **kwargs) -> bool:
        return self._categories.get(*args, **kwargs) == Category.GRADIENT

    @staticmethod
    def _is_backward(event: _ProfilerEvent) -> bool:
        return _RecordScope.BACKWARD_FUNCTION.value in get_scopes(event)

    def _category_snapshot(self) -> Dict[Tuple[TensorKey, int], Optional[Category]]:
        """The category of every (tensor, version) the graph or the categories know."""
        versions: Set[Tuple[TensorKey, int]] = set()
        for node in self._data_flow_graph.flow_nodes:
            versions.update((key, version) for key, (_, version) in node.inputs.items())
            versions.update((key, 0) for key in node.intermediates)
            versions.update(node.outputs.items())
        for element in self._categories._category_dict.values():
            versions.update((key, 0) for key in element.by_id_keyset)
        return {(key, version): self._categories.get(key, version) for key, version in sorted(versions)}

    def _any_version_depends_on_gradient(self) -> Set[int]:
        """Ids of the tensors computed (at some version) from a gradient or parameter."""
        model_relevant = {Category.GRADIENT, Category.PARAMETER}
        depends: Set[int] = set()
        while True:
            size = len(depends)
            for node in self._data_flow_graph.flow_nodes:
                ids = [key.id for key, (_, version) in node.inputs.items()
                       if self._categories.get(key, version) in model_relevant or key.id in depends]
                if ids:
                    depends.update(ids)
                    depends.update(key.id for key in node.outputs)
            if len(depends) == size:
                return depends

    def _set_gradients_and_temporaries(self) -> None:
        for event in traverse_dfs(self._root_nodes):
            for grad in extract_gradients(event):
                self._categories.set_by_id(grad, Category.GRADIENT)
        for node in self._data_flow_graph.flow_nodes:
            for key in node.intermediates:
                self._categories.set_by_key(key, Category.TEMPORARY)

    def _set_parameters_using_python_tracer(self) -> None:
        for event in traverse_dfs(self._root_nodes):
            for param in extract_parameters(event):
                self._categories.set_by_id(param, Category.PARAMETER)

    def _set_inputs(self) -> None:
        """INPUT: what flows into a gradient or parameter, was not made in backward and does
        not itself depend on a gradient."""
        model_relevant = {Category.GRADIENT, Category.PARAMETER}
        produces_gradient: Set[Tuple[TensorKey, int]] = set()
        for node in reversed(self._data_flow_graph.flow_nodes):
            tensors = {(key, version) for key, (_, version) in node.inputs.items()} | set(node.outputs.items())
            if any(self._categories.get(*t) in model_relevant or t in produces_gradient for t in tensors):
                produces_gradient |= tensors
        candidates = produces_gradient.copy()
        for node in self._data_flow_graph.flow_nodes:
            if self._is_backward(node._event):
                candidates -= set(node.outputs.items())
        depends_on_gradient = self._any_version_depends_on_gradient()
        for key, version in candidates:
            if key.id not in depends_on_gradient:
                self._categories.setdefault_by_version(key, version, Category.INPUT)

    def _set_parameters_using_data_flow(self) -> None:
        """PARAMETER: a forward op's input not derived from the inputs that contributes to a
        gradient and depends on one (it is updated from its gradient)."""
        snapshot = self._category_snapshot()
        candidate_parameters: Set[Tuple[TensorKey, int]] = set()
        candidate_fwd_tensors = {t for t, category in snapshot.items() if category == Category.INPUT}
        for node in self._data_flow_graph.flow_nodes:
            inputs = {(key, version) for key, (_, version) in node.inputs.items()}
            if (not self._is_backward(node._event)
                    and not any(self._is_gradient(*t) for t in inputs | set(node.outputs.items()))
                    and candidate_fwd_tensors & inputs):
                candidate_fwd_tensors |= set(node.outputs.items())
                candidate_parameters |= inputs - candidate_fwd_tensors
        used_for_gradient: Set[Tuple[TensorKey, int]] = set()
        for node in reversed(self._data_flow_graph.flow_nodes):
            if any(self._is_gradient(*t) or t in used_for_gradient for t in node.outputs.items()):
                used_for_gradient.update((key, version) for key, (_, version) in node.inputs.items())
        parameter_ids = {key.id for key, _ in candidate_parameters & used_for_gradient}
        parameter_ids &= self._any_version_depends_on_gradient()
        for key, _ in snapshot:
            if key.id in parameter_ids:
                self._categories.set_by_id(key, Category.PARAMETER)

    def _set_activations(self) -> None:
        """ACTIVATION: forward outputs of ops whose inputs are inputs or activations (besides
        parameters and temporaries)."""
        required = {Category.INPUT, Category.ACTIVATION}
        allowed = required | {Category.PARAMETER, Category.TEMPORARY}
        for node in self._data_flow_graph.flow_nodes:
            categories = {self._categories.get(key, version) for key, (_, version) in node.inputs.items()}
            if categories & required and not categories - allowed and not self._is_backward(node._event):
                for key, version in node.outputs.items():
                    self._categories.setdefault_by_version(key, version, Category.ACTIVATION)

    def _set_optimizer_state(self) -> None:
        for event in traverse_dfs(self._root_nodes):
            if event.tag != _EventType.PyCall or event.extra_fields.optimizer_parameters is None:
                continue
            for param in event.extra_fields.optimizer_parameters:
                for _, tensor in param.state or []:
                    key = TensorKey.from_tensor(tensor)
                    if key is not None:
                        self._categories.set_by_id(key, Category.OPTIMIZER_STATE)

    def _set_autograd_detail(self) -> None:
        prior = {None, Category.AUTOGRAD_DETAIL}
        for node in self._data_flow_graph.flow_nodes:
            if self._is_backward(node._event):
                for key, version in node.outputs.items():
                    if version == 0 or self._categories.get(key, version - 1) in prior:
                        self._categories.setdefault_by_version(key, version, Category.AUTOGRAD_DETAIL)


class MemoryProfileTimeline:
    def __init__(self, memory_profile: MemoryProfile):
        self.timeline = memory_profile.timeline
        self.categories = memory_profile._categories
        self.memory_history = memory_profile.memory_history

    @staticmethod
    def _parse_device_info(device_str: str) -> Optional[DeviceKey]:
        """``"cpu"`` or ``"<type>:<index>"`` (``"npu:0"``); None (with an error) otherwise."""
        if device_str == "cpu":
            return DeviceKey(_DEVICE_DICT["cpu"], -1)
        parts = device_str.strip().split(":")
        device_type = _DEVICE_DICT.get(parts[0]) if len(parts) == 2 else None
        if device_type is None:
            print_error_msg(f"{device_str} is not in a valid format.")
            return None
        try:
            return DeviceKey(device_type, int(parts[1]))
        except ValueError:
            return None

    def _get_category_index(self, key, version) -> int:
        category = self.categories.get(key, version) if isinstance(key, TensorKey) else None
        return _CATEGORY_TO_INDEX[category]

    def _update_sizes_by_category(self, sizes_by_category: list, key, version, delta) -> None:
        sizes_by_category[-1][self._get_category_index(key, version) + 1] += int(delta)

    def _device_events(self, device: DeviceKey):
        return ((ts, action, key, version, numbytes) for ts, action, (key, version), numbytes in self.timeline
                if (key.device_type, key.device_index) == (device.device_type, device.device_index))

    def _construct_timeline(self, device_str: str) -> Tuple[List[int], List[List[int]]]:
        """(times µs, per time the live bytes per category): a row is ``[0, bytes of each
        category in _CATEGORY_TO_COLORS order]``; pre-existing memory is at the first time."""
        timestamps: List[int] = []
        sizes: List[List[int]] = []
        device = self._parse_device_info(device_str)
        if device is None:
            return timestamps, sizes
        first_ts = -1
        for ts, action, key, version, numbytes in self._device_events(device):
            if ts != -1:
                ts = int(ts / Constant.NS_TO_US)
            if first_ts == -1 or 0 < ts < first_ts:
                first_ts = ts
            if not timestamps or ts != timestamps[-1]:
                timestamps.append(ts)
                sizes.append(sizes[-1].copy() if sizes else [0] * (len(_CATEGORY_TO_INDEX) + 1))
            if action in (Action.PREEXISTING, Action.CREATE):
                self._update_sizes_by_category(sizes, key, version, numbytes)
            elif action == Action.INCREMENT_VERSION:
                self._update_sizes_by_category(sizes, key, version, -numbytes)
                self._update_sizes_by_category(sizes, key, version + 1, numbytes)
            elif action == Action.DESTROY:
                self._update_sizes_by_category(sizes, key, version, -numbytes)
        return [first_ts if t < 0 else t for t in timestamps], sizes

    @staticmethod
    def _draw_memory_timeline(timestamps, stacked, max_memory_allocated: int,
                              max_memory_reserved: int) -> Optional[str]:
        try:
            plt = importlib.import_module("matplotlib.pyplot")
        except ModuleNotFoundError:
            print_error_msg("matplotlib.pyplot was not found.")
            return None
        fig = plt.figure(figsize=(20, 12), dpi=80)
        axes = fig.gca()
        for category, color in _CATEGORY_TO_COLORS.items():
            index = _CATEGORY_TO_INDEX[category]
            axes.fill_between(timestamps / Constant.US_TO_MS, stacked[:, index], stacked[:, index + 1],
                              color=color, alpha=0.7)
        fig.legend(["Unknown" if category is None else category.name for category in _CATEGORY_TO_COLORS])
        axes.set_xlabel("Time (ms)")
        axes.set_ylabel("Memory (GB)")
        axes.set_title(f"Max memory allocated: {max_memory_allocated / Constant.B_TO_GB:.2f} GB \n"
                       f"Max memory reserved: {max_memory_reserved / Constant.B_TO_GB:.2f} GB")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        encoded = b64encode(buffer.getvalue()).decode("utf-8")
        return ("<html>\n<head><meta charset=\"utf-8\" /><title>Memory Timeline HTML</title></head>\n<body>\n"
                f"  <img src='data:image/png;base64,{encoded}'>\n</body>\n</html>")

    def export_memory_timeline_json(self, output_path: str, device_str: str) -> None:
        timestamps, sizes = self._construct_timeline(device_str)
        if not timestamps:
            print_error_msg("No memory timeline data.")
            return
        realpath = ProfilerPathManager.get_realpath(output_path)
        if output_path.endswith(".gz"):
            FileManager.create_json_gz_file_by_path(realpath, [timestamps, sizes])
        else:
            FileManager.create_json_file_by_path(realpath, [timestamps, sizes])

    def export_memory_timeline_json_raw(self, output_path: str, device_str: str) -> None:
        device = self._parse_device_info(device_str)
        if device is None:
            return
        raw_events: List[Tuple[int, int, int, int]] = []
        for ts, action, key, version, numbytes in self._device_events(device):
            index = _ACTION_TO_INDEX[action]
            if action in (Action.PREEXISTING, Action.CREATE):
                raw_events.append((ts, index, numbytes, self._get_category_index(key, version)))
            elif action == Action.INCREMENT_VERSION:
                raw_events.append((ts, index, -numbytes, self._get_category_index(key, version)))
                raw_events.append((ts, index, numbytes, self._get_category_index(key, version + 1)))
            elif action == Action.DESTROY:
                raw_events.append((ts, index, -numbytes, self._get_category_index(key, version)))
        if not raw_events:
            print_error_msg("No memory timeline data.")
            return
        FileManager.create_json_gz_file_by_path(ProfilerPathManager.get_realpath(output_path), raw_events)

    def export_memory_timeline_html(self, output_path: str, device_str: str) -> None:
        import numpy as np

        timestamps, sizes = self._construct_timeline(device_str)
        if not timestamps:
            print_error_msg("No memory timeline data.")
            return
        timestamps = np.array(timestamps)
        timestamps -= timestamps.min()
        stacked = np.cumsum(np.array(sizes), axis=1) / Constant.B_TO_GB
        device = self._parse_device_info(device_str)
        max_allocated = max((allocated for key, _, allocated, _ in self.memory_history if key == device), default=0)
        max_reserved = max((reserved for key, _, _, reserved in self.memory_history if key == device), default=0)
        html = self._draw_memory_timeline(timestamps, stacked, max_allocated, max_reserved)
        if html is not None:
            FileManager.create_text_file_by_path(ProfilerPathManager.get_realpath(output_path), html)


class MemoryTimelineParser(BaseParser):
    """``param_dict``: also ``device`` ("npu:0"); the output path's suffix chooses the format
    (``.html``, ``raw.json.gz``, else json)."""

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._device = self._param_dict.get("device")
        ProfilerLogger.init(self._profiler_path, "MemoryTimelineParser")
        self.logger = ProfilerLogger.get_instance()

    def run(self, deps_data: dict):
        try:
            timeline = MemoryProfileTimeline(MemoryProfile(self._profiler_path))
            if self._output_path.endswith(".html"):
                timeline.export_memory_timeline_html(self._output_path, self._device)
            elif self._output_path.endswith("raw.json.gz"):
                timeline.export_memory_timeline_json_raw(self._output_path, self._device)
            else:
                timeline.export_memory_timeline_json(self._output_path, self._device)
        except Exception as err:
            self.logger.error("Failed to generate %s, error: %s", self._output_path, str(err), exc_info=True)
            return Constant.FAIL, None
        return Constant.SUCCESS, None
