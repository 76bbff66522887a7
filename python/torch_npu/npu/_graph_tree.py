"""NPU graph trees: torch_npu's counterpart of PyTorch's CUDA graph trees
(``torch/_inductor/cudagraph_trees.py``), used when Inductor wraps npu graphs in NPU graphs
(``torch.compile(mode="reduce-overhead")``).

Every compiled function registered with :func:`npugraphify` is first run eagerly once (warm-up),
in the tree's private memory pool, then captured into a :class:`torch.npu.NPUGraph` (a *node*)
and replayed afterwards. The recordings of one device share one memory pool and form a tree: a
node recorded while outputs of another node were alive becomes that node's child, and is only
replayed after it, when the same outputs are alive or dead as at its recording. Outputs of a
replay live in the pool and are overwritten by the next replay of their node; a new
"generation" (a new ``torch.compile`` invocation, or :func:`mark_step_begin`) allows that.

The algorithm is PyTorch's; two things differ because the simulator's caching allocator cannot
be set back to a checkpoint of a pool (torch_npu's ``_npu_setCheckpointPoolState``):

* every output block a recording allocates stays allocated until the tree is shut down (the
  node keeps its storage: :attr:`NPUGraphNode.pinned_storages`; the simulator's allocator
  also keeps every block a live graph used). A recording that follows replays can then never
  be given memory a live replayed output uses, which is what restoring the checkpoint ensures
  on CUDA; the price is that recordings do not share memory. Liveness tracking discounts
  these references, and :func:`check_memory_pool` counts the blocks as accounted for.
* outputs of a previous generation that are still referenced keep their memory instead of
  being freed, and reading them is not made to raise (``_set_storage_access_error_msg`` has no
  counterpart either): a later replay silently overwrites their contents, as it overwrites the
  memory CUDA graph trees free.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import operator
import sys
import threading
import traceback
import warnings
import weakref
from collections import defaultdict
from enum import auto, Enum
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch._dynamo.mutation_guard import GenerationTracker
from torch._dynamo.utils import counters, preserve_rng_state
from torch._inductor import config
from torch._inductor.compile_fx import (
    align_inputs_from_check_idxs,
    copy_misaligned_inputs,
    get_expanded_dims,
    get_input_idxs_to_check,
    index_expanded_dims,
    remove_unaligned_input_idxs,
    static_input,
)
from torch._inductor.cudagraph_utils import (
    check_for_mutation,
    CheckInvariantStatus,
    FunctionID,
    log_cudagraph_skip_and_bump_counter,
    log_data_ptr_mismatch,
    maybe_warning_due_to_dynamic_shape,
    ModelType,
    OutputType,
    PlaceholderInfo,
    WrappedFunction,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.storage import UntypedStorage
from torch.utils import _pytree as pytree
from torch.utils.weak import TensorWeakRef

import torch_npu
from torch_npu.npu._graph_tree_state import MarkStepBox, mark_step_begin  # noqa: F401

InputType = Any  # Tensor, int, SymInt or Generator
StackTraces = List[Optional[str]]
PathOutputIndex = Tuple[int, int]  # (depth of the node in the path, index of its output)
StorageWeakRefPointer = int

log = torch._logging.getArtifactLogger(__name__, "cudagraphs")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


@dataclasses.dataclass(frozen=True)
class GraphID:
    "Unique counter of an NPU graph recording (warm-up nodes count down from -1)"
    id: int


def clear_cublass_cache() -> None:
    """CUDA graph trees empty cuBLAS's persistent workspaces around warm-ups and recordings so
    that they are allocated in the graph pool; the npu kernels of the simulator keep no such
    workspace, so there is nothing to clear. (The name, typo included, is torch_npu's.)"""


@contextlib.contextmanager
def clear_cublas_manager() -> Generator[None, None, None]:
    "Clears the matmul workspaces (see :func:`clear_cublass_cache`) on entry and on exit"
    clear_cublass_cache()
    try:
        yield
    finally:
        clear_cublass_cache()


@contextlib.contextmanager
def disable_conv_cache_emptying() -> Generator[None, None, None]:
    """CUDA graph trees stop cuDNN's benchmark from emptying the allocator's cache during a
    warm-up; npu convolutions do no such benchmarking, so this only marks the place."""
    yield


@contextlib.contextmanager
def enable_history_recording() -> Generator[None, None, None]:
    "Records the caching allocator's history (allocation stack traces) inside the block"
    enabled = torch_npu._C._npu_isHistoryEnabled()
    try:
        if not enabled:
            torch.npu.memory._record_memory_history()
        yield
    finally:
        if not enabled:
            torch.npu.memory._record_memory_history(None)


def get_history_recording() -> contextlib.AbstractContextManager:
    if not config.triton.cudagraph_trees_history_recording:
        return contextlib.nullcontext()
    return enable_history_recording()


class TreeManagerContainer:
    """Owns the tree manager of one device while compiled functions using it are alive: each
    :func:`npugraphify` function adds a reference; when the last one dies, the tree (and with
    it its memory pool) is dropped."""

    def __init__(self, device_index: int) -> None:
        self.tree_manager: Optional[NPUGraphTreeManager] = None
        self.live_npugraphify_fns = 0
        self.device_index = device_index
        # Only set while output tensors outlive the functions (keeps the pool's graph alive).
        self.live_storages_count = 0
        self.graph: Optional[torch.npu.NPUGraph] = None
        self.lock = threading.Lock()

    def _finalize_tensor(self) -> None:
        with self.lock:
            self.live_storages_count -= 1
            if self.live_storages_count == 0:
                self.graph = None
                if self.live_npugraphify_fns == 0:
                    self.tree_manager = None

    def finalize_npugraphify_fn(self) -> None:
        with self.lock:
            self.live_npugraphify_fns -= 1
            if self.live_npugraphify_fns == 0:
                self._finalize_tree_manager()

    def _finalize_tree_manager(self) -> None:
        _check(self.lock.locked(), "_finalize_tree_manager() must be called with the container's lock held")
        self.tree_manager = None

    def add_strong_reference(self, fn: Callable[..., Any]) -> None:
        with self.lock:
            self.live_npugraphify_fns += 1
        weakref.finalize(fn, self.finalize_npugraphify_fn)

    def get_tree_manager(self) -> NPUGraphTreeManager:
        with self.lock:
            if self.tree_manager is None:
                self.tree_manager = NPUGraphTreeManager(self.device_index)
            return self.tree_manager


def _initialize_tls(thread_local: threading.local) -> None:
    # One container per device; stashed so that autograd's threads (backward) see them too.
    thread_local.npu_tree_manager_containers = {}
    thread_local.npu_tree_manager_locks = defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("npu_tree_manager_containers", thread_local.npu_tree_manager_containers)
    torch._C._stash_obj_in_tls("npu_tree_manager_locks", thread_local.npu_tree_manager_locks)


local = threading.local()
_initialize_tls(local)


def get_obj(thread_local: Any, attr_name: str) -> Any:
    if hasattr(thread_local, attr_name):
        return getattr(thread_local, attr_name)
    if not torch._C._is_key_in_tls(attr_name):
        _initialize_tls(thread_local)
        return getattr(thread_local, attr_name)
    return torch._C._get_obj_in_tls(attr_name)


def reset_npugraph_trees() -> None:
    "Shut down and drop the NPU graph trees of all devices (of this thread)"
    container_dict = get_obj(local, "npu_tree_manager_containers")
    locks_dict = get_obj(local, "npu_tree_manager_locks")
    for device, lock in list(locks_dict.items()):
        with lock:
            container = container_dict.get(device)
            if container is not None and container.tree_manager is not None:
                container.tree_manager.shutdown()
    torch_npu._C._set_cached_tensors_enabled(False)
    container_dict.clear()
    MarkStepBox.mark_step_counter = 0


def get_container(device_index: int) -> TreeManagerContainer:
    container_dict = get_obj(local, "npu_tree_manager_containers")
    lock = get_obj(local, "npu_tree_manager_locks")[device_index]
    with lock:
        if device_index not in container_dict:
            container_dict[device_index] = TreeManagerContainer(device_index)
        return container_dict[device_index]


def get_manager(device_index: int, create_if_none_exists: bool = True) -> Optional[NPUGraphTreeManager]:
    if create_if_none_exists:
        return get_container(device_index).get_tree_manager()
    return get_container(device_index).tree_manager


def npugraphify_impl(model: ModelType, inputs: List[InputType], static_input_idxs: Sequence[int],
                     *args: Any, **kwargs: Any) -> ModelType:
    """Defers :func:`npugraphify` to the first call, once per combination of the int inputs
    (each is baked into its graphs)."""
    fn_cache: Dict[Any, Callable[..., Any]] = {}
    int_idxs = [i for i, v in enumerate(inputs) if isinstance(v, int)]
    get_ints: Any = operator.itemgetter(*int_idxs) if int_idxs else lambda _: None
    warned = False
    del inputs

    def deferred_npugraphify(inputs: List[InputType]) -> OutputType:
        nonlocal warned
        int_key = get_ints(inputs)
        fn = fn_cache.get(int_key)
        if fn is not None:
            return fn(inputs)
        log.debug("recording an NPU graph tree for int inputs %s", int_key)
        if not warned:
            warned = maybe_warning_due_to_dynamic_shape(fn_cache, int_key)
        # Misaligned inputs are copied (to aligned memory) on every call, so they are not static.
        check_input_idxs = get_input_idxs_to_check(inputs, static_input_idxs)
        new_static_input_idxs = remove_unaligned_input_idxs(inputs, static_input_idxs)
        copy_misaligned_inputs(inputs, check_input_idxs)
        fn, out = npugraphify(model, inputs, new_static_input_idxs, *args, **kwargs)
        fn = align_inputs_from_check_idxs(fn, inputs_to_check=check_input_idxs, mutated_input_idxs=set())
        fn_cache[int_key] = fn
        return out

    return deferred_npugraphify


def npugraphify(model: ModelType, inputs: List[InputType], static_input_idxs: Sequence[int] = (), *,
                device_index: int, is_backward: bool, is_inference: bool,
                stack_traces: Optional[StackTraces] = None, constants: Tuple[torch.Tensor, ...] = (),
                placeholders: Tuple[PlaceholderInfo, ...] = (),
                mutated_input_idxs: Tuple[int, ...] = ()) -> Tuple[ModelType, OutputType]:
    """Registers ``model`` with the graph tree of npu ``device_index`` and runs it on ``inputs``;
    returns the function to call from then on and the outputs."""
    manager = get_container(device_index).get_tree_manager()
    _check(not (is_backward and is_inference), "npugraphify(): is_backward and is_inference cannot both be True")
    mode = (CompilationMode.BACKWARD if is_backward
            else CompilationMode.INFERENCE if is_inference else CompilationMode.FORWARD)
    return manager.add_function(model, inputs, static_input_idxs, stack_traces, mode, constants,
                                placeholders, mutated_input_idxs)


class StorageWeakRefWrapper:
    """A weak reference to a storage that remembers its data pointer, and tells whether anybody
    but the graph tree still uses the storage.

    ``extra_ref_check`` is given for an output the node keeps as a cached tensor: the storage is
    then in use while the check says the cached tensor is referenced elsewhere, or while more
    than the cached tensor and the graph tree's own references hold the storage.
    ``owned_refs``: references the graph tree holds itself (a node keeps the storage of its
    recorded outputs, and the simulator's graph keeps what it used), discounted.
    """

    __slots__ = ["ref", "_data_ptr", "extra_ref_check", "owned_refs"]

    def __init__(self, inp: Union[Tensor, UntypedStorage], extra_ref_check: Optional[Callable[[], bool]] = None,
                 *, owned_refs: int = 0) -> None:
        if isinstance(inp, Tensor):
            stor = inp.untyped_storage()
        else:
            _check(isinstance(inp, UntypedStorage),
                   f"StorageWeakRefWrapper(): expected a Tensor or an UntypedStorage, got {type(inp).__name__}")
            stor = inp
        self.ref = StorageWeakRef(stor)
        self._data_ptr = stor.data_ptr()
        self.extra_ref_check = extra_ref_check
        self.owned_refs = owned_refs

    @classmethod
    def from_weakref_and_data_ptr(cls, cdata: Any, data_ptr: int,
                                  extra_ref_check: Optional[Callable[[], bool]] = None) -> StorageWeakRefWrapper:
        instance = cls.__new__(cls)
        instance._data_ptr = data_ptr
        instance.ref = StorageWeakRef.from_weakref(cdata)
        instance.extra_ref_check = extra_ref_check
        instance.owned_refs = 0
        return instance

    def __call__(self) -> Optional[StorageWeakRefPointer]:
        if self.expired():
            return None
        return self.ref.cdata

    def swap_weakref(self, cdata: Any) -> None:
        self.ref.__del__()
        self.ref.cdata = cdata

    def data_ptr(self) -> int:
        "The storage's data pointer, also after it expired"
        return self._data_ptr

    def remove_extra_reference(self) -> None:
        self.extra_ref_check = None

    def expired(self) -> bool:
        if self.extra_ref_check is not None and not self.extra_ref_check():
            return False
        count = torch_npu._C._storage_Use_Count(self.ref.cdata) - self.owned_refs
        if self.extra_ref_check is not None:
            # the cached tensor (and, as PyTorch counts, the node's storage when nothing else is)
            count -= 1 if self.owned_refs else 2
        _check(count >= 0, f"storage {self._data_ptr} has fewer references than the graph tree holds")
        return count == 0

    def __repr__(self) -> str:
        if self.ref is None or self.ref.expired():
            return f"StorageWeakRefWrapper to {self.data_ptr()}; dead"
        return f"StorageWeakRefWrapper to {self.data_ptr()}; alive"


def is_live(weak_ref: Optional[StorageWeakRefWrapper]) -> bool:
    return maybe_deref(weak_ref) is not None


def maybe_deref(weak_ref: Optional[StorageWeakRefWrapper]) -> Optional[Tuple[StorageWeakRefPointer, int]]:
    "(storage pointer, recorded data pointer) of a live reference, else None"
    if weak_ref is None:
        return None
    r = weak_ref()
    if r is None:
        return None
    return r, weak_ref.data_ptr()


@contextlib.contextmanager
def _use_npu_memory_pool_manager(device: int, mem_pool: Tuple[int, int],
                                 stream: torch.npu.Stream) -> Generator[None, None, None]:
    """Allocations of this thread inside the block (made on ``stream``) come from graph pool
    ``mem_pool``, which must already exist (a graph captured with it keeps it alive)."""
    torch.npu.synchronize()
    stream.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(stream), torch.device("npu", device):
        torch_npu._C._npu_beginAllocateCurrentThreadToPool(device, mem_pool)
        try:
            yield
        finally:
            torch_npu._C._npu_endAllocateToPool(device, mem_pool)
            torch_npu._C._npu_releasePool(device, mem_pool)
    torch.npu.current_stream().wait_stream(stream)


def map_to_ref(t: Optional[Tensor]) -> Optional[StorageWeakRefWrapper]:
    if not isinstance(t, torch.Tensor):
        _check(t is None, f"expected a Tensor or None, got {type(t).__name__}")
        return None
    return StorageWeakRefWrapper(t)


# Per memory pool: its graph nodes (whose graphs keep their blocks allocated), and the outputs of
# warm-ups of ended generations that are still referenced (CUDA graph trees free those).
_pool_nodes: Dict[Tuple[int, int], "weakref.WeakSet[NPUGraphNode]"] = defaultdict(weakref.WeakSet)
_pool_stale_outputs: Dict[Tuple[int, int], List[StorageWeakRefWrapper]] = defaultdict(list)


def _held_data_ptrs(pool: Tuple[int, int]) -> set:
    "Blocks of ``pool`` that are allocated though no current path accounts for them"
    stale = _pool_stale_outputs.get(pool)
    if stale:
        stale[:] = [ref for ref in stale if ref() is not None]
    return ({ptr for node in list(_pool_nodes.get(pool, ())) if node.graph is not None for ptr in node.graph_blocks}
            | {ref.data_ptr() for ref in stale or ()})


class NPUWarmupNode:
    """A function run eagerly (its first call, or after a recording was refused), with its
    allocations in the tree's pool; its outputs' storages are tracked like a graph's outputs.

    Its parent may be a graph node or a warm-up node; its children only warm-up nodes (nothing
    can be recorded on top of memory whose addresses were not recorded).
    """

    def __init__(self, wrapped_function: WrappedFunction, parent: Any, npu_graphs_pool: Tuple[int, int],
                 existing_npu_graph: Optional[torch.npu.NPUGraph], device_index: int,
                 stack_traces: Optional[StackTraces], stream: torch.npu.Stream, already_warm: bool,
                 graph_id: GraphID) -> None:
        self.wrapped_function = wrapped_function
        self.parent = parent
        self.npu_graphs_pool = npu_graphs_pool
        self.outputs_weakrefs: List[Optional[StorageWeakRefWrapper]] = []
        self.tensor_weakrefs: List[Optional[TensorWeakRef]] = []
        self.existing_npu_graph = existing_npu_graph
        self.has_run = False
        self.device_index = device_index
        self.stack_traces = stack_traces
        self.stream = stream
        self.already_warm = already_warm
        self.id = graph_id

    def run(self, new_inputs: Any) -> OutputType:
        _check(not self.has_run, "Wrapped function should never be run twice")
        # Outputs that are (views of) inputs or constants are not the pool's.
        path_ptrs = {t.data_ptr() for t in self.path_live_weakrefs() if t()}
        outside = [weakref.ref(t.untyped_storage())
                   for t in itertools.chain(new_inputs, self.wrapped_function.constants)
                   if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in path_ptrs]

        if config.triton.slow_path_cudagraph_asserts and not self.already_warm:
            check_memory_pool(self.device_index, self.npu_graphs_pool, list(self.path_live_weakrefs()))
        with torch.npu.device(self.device_index), disable_conv_cache_emptying(), clear_cublas_manager(), \
                _use_npu_memory_pool_manager(self.device_index, self.npu_graphs_pool, self.stream), \
                get_history_recording():
            out = self.wrapped_function.model(new_inputs)
        _check(len(new_inputs) == 0, "the compiled function must clear its list of inputs")

        outside_cdata = {s._cdata for s in (r() for r in outside) if s is not None}

        def in_pool(o: Any) -> bool:
            return (isinstance(o, torch.Tensor) and o.is_npu and o.untyped_storage()._cdata not in outside_cdata
                    and o.untyped_storage().data_ptr() != 0)

        self.outputs_weakrefs.extend([map_to_ref(o) if in_pool(o) else None for o in out])
        self.tensor_weakrefs.extend([TensorWeakRef(o) if in_pool(o) else None for o in out])
        self.has_run = True
        if config.triton.slow_path_cudagraph_asserts and not self.already_warm:
            check_memory_pool(self.device_index, self.npu_graphs_pool, list(self.path_live_weakrefs()))
        return out

    @property
    def _path_from_root(self) -> Generator[Any, None, None]:
        nodes = []
        node = self
        while node:
            nodes.append(node)
            node = node.parent
        yield from reversed(nodes)

    def path_live_weakrefs(self) -> Iterator[StorageWeakRefWrapper]:
        "The live output storages of the nodes from the root to this one"
        for node in self._path_from_root:
            for output in node.outputs_weakrefs:
                if is_live(output):
                    yield output

    def all_outputs_are_dead(self) -> bool:
        return not list(self.path_live_weakrefs())

    def _is_npu_graph_recorded_tensor(self, t: torch.Tensor) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(ptr == ref.data_ptr() for ref in self.path_live_weakrefs())


class OutputAliasInfo:
    __slots__ = []


class _UnaliasedStorage(OutputAliasInfo):
    "The output has a storage of its own (or is None)"


UnaliasedStorage = _UnaliasedStorage()


class AliasesPriorGraphOutput(OutputAliasInfo):
    "The output shares the storage of an output (depth, index) of a node earlier in the path"
    __slots__ = ["index"]

    def __init__(self, index: PathOutputIndex) -> None:
        _check(isinstance(index, tuple), f"AliasesPriorGraphOutput(): 'index' must be a tuple, got {index!r}")
        self.index = index


class AliasesNewOutput(OutputAliasInfo):
    "The output shares the storage of another output (index) of the same node"
    __slots__ = ["index"]

    def __init__(self, index: int) -> None:
        _check(isinstance(index, int), f"AliasesNewOutput(): 'index' must be an int, got {index!r}")
        self.index = index


class NPUGraphNode:
    """One recording of a function into an NPU graph, with a parent (the node whose outputs were
    alive when it was recorded, or None for a root) and children.

    The recording happens in the constructor (inputs are copied into the pool first); the first
    :meth:`run_first_inputs` returns the recorded outputs, later :meth:`run` calls copy the new
    inputs in, replay, and rebuild the outputs over the same memory. :meth:`check_invariants`
    tells whether a call may replay this node.
    """

    def __init__(self, wrapped_function: WrappedFunction, graph_id: GraphID, parent: Optional[NPUGraphNode],
                 inputs: List[InputType], npu_graphs_pool: Tuple[int, int], device_index: int,
                 stack_traces: Optional[StackTraces], stream: torch.npu.Stream) -> None:
        _check(isinstance(inputs, (list, tuple)),
               f"NPUGraphNode(): 'inputs' must be a list or tuple, got {type(inputs).__name__}")
        self.wrapped_function = wrapped_function
        self.id = graph_id
        self.device = device_index
        self.stack_traces = stack_traces
        self.stream = stream
        self.rerecord_if_static_inputs_change = True  # else a moved parameter is an error
        self._parent = weakref.ref(parent) if parent is not None else None
        self.npu_graphs_pool = npu_graphs_pool
        self.children: Dict[FunctionID, List[NPUGraphNode]] = defaultdict(list)
        # data_ptr -> storage of the outputs this recording allocated (kept allocated, see module doc)
        self.pinned_storages: Dict[int, UntypedStorage] = {}

        # Never reassigned: children hold these lists in their path_weakrefs.
        self.outputs_weakrefs: List[Optional[StorageWeakRefWrapper]] = []
        self.path_weakrefs: List[List[Optional[StorageWeakRefWrapper]]] = [
            node.outputs_weakrefs for node in self._path_from_root]
        self.path_stacktraces = [node.stack_traces for node in self._path_from_root]
        self.tensor_weakrefs: List[Optional[TensorWeakRef]] = []

        # Inputs that are outputs of nodes of the path (their memory is the pool's).
        self.npugraph_managed_idxs: List[int] = [
            i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and self._is_npu_graph_recorded_tensor(t)]
        self.live_npugraph_managed_path_refs: List[Optional[PathOutputIndex]] = [
            self._is_alias_of_live_recorded_tensor(t) if isinstance(t, torch.Tensor) else None for t in inputs]
        # Inputs aliasing a prior output that this node also outputs: not dropped before replay.
        self.preserved_aliased_inputs: List[bool] = [False] * len(inputs)

        static_idxs = set(wrapped_function.static_input_idxs)
        managed_idxs = set(self.npugraph_managed_idxs)
        self.static_input_idxs: List[int] = sorted(static_idxs | managed_idxs)
        self.non_static_input_idx: List[int] = [i for i in range(len(inputs)) if i not in self.static_input_idxs]
        counters["inductor"]["cudagraph_recorded_non_static_inputs"] += len(self.non_static_input_idx)
        self.non_managed_static_input_idxs: List[int] = sorted(static_idxs - managed_idxs)
        self.static_input_data_ptrs: List[Optional[int]] = [
            inp.data_ptr() if isinstance(inp, torch.Tensor) and i in self.static_input_idxs else None
            for i, inp in enumerate(inputs)]
        self.expanded_dims: List[List[int]] = [
            get_expanded_dims(x) if isinstance(x, torch.Tensor) and i not in self.static_input_idxs else []
            for i, x in enumerate(inputs)]

        # Liveness of the path's outputs seen before and after the recording.
        self.recorded_liveness_before_graph: List[List[bool]] = []
        self.recorded_liveness_after_graph: List[List[bool]] = []
        self.expected_dead_indices_before_graph: List[PathOutputIndex] = []
        self.expected_dead_indices_after_graph: List[PathOutputIndex] = []
        self.live_indices_after_graph: List[PathOutputIndex] = []
        if self.parent is not None:
            curr_liveness = self._get_liveness(self.path_weakrefs)
            self.expected_dead_indices_before_graph = self._get_different_indices(
                self.parent.recorded_liveness_after_graph, curr_liveness)
            self.recorded_liveness_before_graph = curr_liveness

        rng_states = [inp for inp in inputs if isinstance(inp, torch.Generator)]
        # The simulator's allocator keeps every block a graph used allocated while the graph
        # lives: the blocks this node adds to the pool are its own (see _held_data_ptrs).
        self._blocks_before = set(get_block_addrs(npu_graphs_pool))
        self.graph_blocks: set = set()
        recording_inputs = self._allocate_and_copy_recording_inputs(inputs)
        inputs.clear()
        del inputs

        self.graph: Optional[torch.npu.NPUGraph] = torch.npu.NPUGraph()
        for rng_state in rng_states:
            self.graph.register_generator_state(rng_state)
        # The copies of the inputs are freed after the recording (their memory may serve later
        # recordings); replays copy the new inputs in through these non-owning tensors.
        self.reconstructed_inputs: List[InputType] = [
            self._reconstruct_from_tensor_metadata(self._tensor_metadata(x)) if isinstance(x, torch.Tensor) else x
            for x in recording_inputs]

        self.checkpointed_caching_state = None
        # Per output: UnaliasedStorage, AliasesPriorGraphOutput, AliasesNewOutput, or None (an
        # alias of a static input, or an int).
        self.output_storage_alias: List[Optional[OutputAliasInfo]] = []
        # Outputs whose storage no descendant aliases are returned as the same (cached) tensor
        # from replay to replay; set at the first replay, dropped before recording below.
        self.unaliased_in_all_paths: List[bool] = []
        self.cached_tensor_outputs: List[Optional[Tensor]] = []
        # Outputs that are static inputs (parameters) or views of them.
        self.static_output_tensors: List[Optional[Tensor]] = []

        self.recording_outputs: Optional[OutputType] = self._record(wrapped_function.model, recording_inputs)
        self.outputs_metadata: List[Union[Dict[str, Any], int, None]] = []
        _check(self.recording_outputs is not None, "the recording produced no outputs")
        for out in self.recording_outputs:
            if isinstance(out, torch.Tensor):
                self.outputs_metadata.append(self._tensor_metadata(out, ignore_storage_offset=False))
            else:
                _check(isinstance(out, (int, type(None))), f"unexpected graph output of type {type(out).__name__}")
                self.outputs_metadata.append(out)
        # A capture only records: run it once for the outputs of this first call.
        self.graph.replay()

    def _copy_inputs_and_remove_from_src(self, dsts: List[InputType], srcs: List[InputType]) -> None:
        dst_tensors, src_tensors = [], []
        for idx in self.non_static_input_idx:
            if not isinstance(srcs[idx], torch.Tensor):
                continue
            expanded_dims = self.expanded_dims[idx]
            dst_tensors.append(index_expanded_dims(dsts[idx], expanded_dims))
            src_tensors.append(index_expanded_dims(srcs[idx], expanded_dims))
            srcs[idx] = None
        if dst_tensors:
            torch._foreach_copy_(dst_tensors, src_tensors)

    def check_static_inputs_are_stable(self, new_inputs: List[InputType]) -> None:
        if not self.rerecord_if_static_inputs_change and not torch_npu._C._tensors_data_ptrs_at_indices_equal(
                new_inputs, self.static_input_data_ptrs, self.non_managed_static_input_idxs):
            error_msg = log_data_ptr_mismatch(self.wrapped_function.placeholders, new_inputs,
                                              self.static_input_data_ptrs, self.non_managed_static_input_idxs,
                                              CheckInvariantStatus.StaticInputIdxMismatch)
            raise RuntimeError(error_msg)

    def run_first_inputs(self, new_inputs: List[InputType]) -> OutputType:
        if config.triton.fast_path_cudagraph_asserts:
            self.debug_check_invariants_before_invocation()
        # The graph ran in the constructor, on the inputs copied there.
        _check(len(new_inputs) == 0, "the inputs must have been consumed by the recording")
        outputs = self.recording_outputs
        self.recording_outputs = None
        _check(outputs is not None, "run_first_inputs() may only be called once")
        return outputs

    def run(self, new_inputs: List[InputType]) -> OutputType:
        self.check_static_inputs_are_stable(new_inputs)
        self._copy_inputs_and_remove_from_src(self.reconstructed_inputs, new_inputs)
        self.run_graph()
        outputs = self.reconstruct_outputs()
        new_inputs.clear()
        if config.triton.fast_path_cudagraph_asserts:
            self.debug_check_invariants_after_invocation()
        if config.triton.force_cudagraph_sync:
            torch.npu.synchronize()
        return outputs

    def reconstruct_outputs(self) -> OutputType:
        "The outputs of a replay, rebuilt from their recorded metadata over the same memory"
        if not self.cached_tensor_outputs:
            self._initialize_cached_tensors()
        outputs: OutputType = []
        for i, (storage_info, metadata) in enumerate(zip(self.output_storage_alias, self.outputs_metadata)):
            if not isinstance(metadata, dict):  # an int or None
                outputs.append(metadata)
                continue
            cached_t = self.cached_tensor_outputs[i]
            if cached_t is not None:
                # Same tensor every replay; autograd resets its history, not its hooks.
                if cached_t._backward_hooks is not None:
                    cached_t._backward_hooks = None
                outputs.append(cached_t)
                continue
            static_t = self.static_output_tensors[i]
            if static_t is not None:
                outputs.append(static_t)
                continue
            storage = self.prepare_alias_info_for_tensor_construction(storage_info, metadata)
            if isinstance(storage, int):
                storage = outputs[storage].untyped_storage()
            out = self._reconstruct_from_tensor_metadata(metadata, storage)
            outputs.append(out)
            w = self.outputs_weakrefs[i]
            _check(w is not None, f"output {i} has no storage reference")
            w.swap_weakref(out.untyped_storage()._weak_ref())
        return outputs

    def prepare_alias_info_for_tensor_construction(
            self, out_alias_info: Optional[OutputAliasInfo],
            metadata: Union[Dict[str, Any], int, None]) -> Union[UntypedStorage, None, int]:
        """The storage to rebuild an output on: None (its own, from its metadata), a prior
        output's storage, or the index of an earlier output of this node."""
        if isinstance(metadata, (int, type(None))) or out_alias_info is UnaliasedStorage:
            return None
        if isinstance(out_alias_info, AliasesPriorGraphOutput):
            depth, existing_output_index = out_alias_info.index
            ref = self.path_weakrefs[depth][existing_output_index]
            _check(ref is not None, f"output {out_alias_info.index} of the path has no storage reference")
            return torch.UntypedStorage._new_with_weak_ptr(ref())
        _check(isinstance(out_alias_info, AliasesNewOutput),
               f"unexpected output alias information {out_alias_info!r}")
        return out_alias_info.index

    def prepare_storages_for_construction(self) -> List[Union[UntypedStorage, None, int]]:
        return [self.prepare_alias_info_for_tensor_construction(alias, metadata)
                for alias, metadata in zip(self.output_storage_alias, self.outputs_metadata)]

    def run_graph(self) -> None:
        _check(self.graph is not None, "the node's graph was released (the tree was shut down)")
        self.graph.replay()

    def all_outputs_are_dead(self) -> bool:
        "All outputs of the path from the root to this node are dead"
        return not any(is_live(self.path_weakrefs[d][i]) for d, i in self.live_indices_after_graph)

    def _record(self, model: ModelType, inputs: List[InputType]) -> OutputType:
        "Capture ``model(inputs)`` into the node's graph"
        def static_input_iter() -> Generator[torch.Tensor, None, None]:
            for i in self.wrapped_function.static_input_idxs:
                inp = inputs[i]
                if isinstance(inp, torch.Tensor) and not self._is_npu_graph_recorded_tensor(inp):
                    yield inp

        # Outputs that are static inputs or constants (or views of them) are not the pool's.
        static_input_persistent_storage_ptrs: Dict[int, StorageWeakRefWrapper] = {
            inp.untyped_storage().data_ptr(): StorageWeakRefWrapper(inp)
            for inp in itertools.chain(static_input_iter(), self.wrapped_function.constants)}

        if config.triton.slow_path_cudagraph_asserts:
            memory = [] if self.parent is None else list(self.parent.path_live_weakrefs())
            memory += [StorageWeakRefWrapper(elem) for i, elem in enumerate(inputs)
                       if isinstance(elem, torch.Tensor) and i not in self.wrapped_function.static_input_idxs
                       and elem.untyped_storage().data_ptr() != 0]
            check_memory_pool(self.device, self.npu_graphs_pool, memory)

        with preserve_rng_state(), torch.npu.device(self.device), clear_cublas_manager(), \
                torch.npu.graph(self.graph, stream=self.stream, pool=self.npu_graphs_pool,
                                capture_error_mode="thread_local"), get_history_recording():
            static_outputs = model(inputs)
        _check(len(inputs) == 0, "the compiled function must clear its list of inputs")
        if not isinstance(static_outputs, (list, tuple)):
            static_outputs = (static_outputs,)
        self._add_first_outputs(static_outputs, static_input_persistent_storage_ptrs)
        return static_outputs

    def _add_first_outputs(self, outputs: OutputType,
                           static_input_persistent_storage_ptrs: Dict[int, StorageWeakRefWrapper]) -> None:
        "Classify the recorded outputs (new storage, alias, static) and record the path's liveness"
        prev_liveness = self.recorded_liveness_before_graph
        curr_liveness = self._get_liveness(self.path_weakrefs)
        self.expected_dead_indices_after_graph = self._get_different_indices(prev_liveness, curr_liveness)

        _check(len(self.outputs_weakrefs) == 0, "the node's outputs were already added")
        new_storage_index: Dict[int, int] = {}  # data_ptr -> first output with that storage
        self.unaliased_in_all_paths = [False] * len(outputs)
        self.static_output_tensors = [None] * len(outputs)

        for i, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor):
                self.output_storage_alias.append(UnaliasedStorage)
                continue
            torch._check(o.is_npu or o.untyped_storage().data_ptr() == 0,
                         lambda: "Expected all npu outputs in npu graph recording. Non npu output from "
                                 f"{self.stack_traces[i] if self.stack_traces else '(unknown)'}")
            ptr = o.untyped_storage().data_ptr()
            ref = static_input_persistent_storage_ptrs.get(ptr)
            if (ref is not None and ref() is not None) or ptr == 0:
                self.output_storage_alias.append(None)
                self.static_output_tensors[i] = o
                continue
            path_ref = self._is_alias_of_live_recorded_tensor(o)
            if path_ref is not None:
                self._mark_prior_graph_output_as_aliased(path_ref)
                for idx, inp_path_ref in enumerate(self.live_npugraph_managed_path_refs):
                    if path_ref == inp_path_ref:
                        self.preserved_aliased_inputs[idx] = True
                self.output_storage_alias.append(AliasesPriorGraphOutput(path_ref))
                continue
            if ptr in new_storage_index:
                self.unaliased_in_all_paths[new_storage_index[ptr]] = False
                self.output_storage_alias.append(AliasesNewOutput(new_storage_index[ptr]))
                continue
            new_storage_index[ptr] = i
            self.output_storage_alias.append(UnaliasedStorage)
            self.unaliased_in_all_paths[i] = True
            self.pinned_storages[ptr] = o.untyped_storage()
        self.graph_blocks = (set(get_block_addrs(self.npu_graphs_pool)) - self._blocks_before) | set(self.pinned_storages)
        _pool_nodes[self.npu_graphs_pool].add(self)

        if self.stack_traces is None:
            self.stack_traces = [None] * len(outputs)
        else:
            _check(len(self.stack_traces) == len(outputs), "Wrong number of stack traces passed in")

        # References to each new storage beyond the outputs' are the tree's own.
        output_refs = defaultdict(int)
        for o in outputs:
            if isinstance(o, torch.Tensor):
                output_refs[o.untyped_storage().data_ptr()] += 1
        owned = {ptr: torch_npu._C._storage_Use_Count(stor._cdata) - output_refs[ptr]
                 for ptr, stor in self.pinned_storages.items()}
        for out, alias, static_output_tensor in zip(outputs, self.output_storage_alias, self.static_output_tensors):
            if not isinstance(out, torch.Tensor) or static_output_tensor is not None:
                self.outputs_weakrefs.append(None)
                self.tensor_weakrefs.append(None)
                continue
            if isinstance(alias, AliasesPriorGraphOutput):
                owned_refs = self.path_weakrefs[alias.index[0]][alias.index[1]].owned_refs
            else:
                owned_refs = owned[out.untyped_storage().data_ptr()]
            self.outputs_weakrefs.append(StorageWeakRefWrapper(out, owned_refs=owned_refs))
            self.tensor_weakrefs.append(TensorWeakRef(out))

        self.recorded_liveness_after_graph = self._get_liveness(self.path_weakrefs)
        self.checkpointed_caching_state = torch_npu._C._npu_getCheckpointState(self.device, self.npu_graphs_pool)
        for depth, refs in enumerate(self.path_weakrefs):
            for output_index, ref in enumerate(refs):
                if is_live(ref):
                    self.live_indices_after_graph.append((depth, output_index))

        self.debug_check_invariants_after_invocation()
        if config.triton.slow_path_cudagraph_asserts:
            check_memory_pool(self.device, self.npu_graphs_pool, list(self.path_live_weakrefs()))

    def _mark_prior_graph_output_as_aliased(self, index: PathOutputIndex) -> None:
        "An output of an ancestor is aliased: it can no longer be a cached tensor"
        depth, output_index = index
        node = list(self._path_from_root)[depth]
        node.unaliased_in_all_paths[output_index] = False
        x = self.path_weakrefs[depth][output_index]
        _check(x is not None, f"output {index} of the path has no storage reference")
        x.remove_extra_reference()

    def _initialize_cached_tensors(self) -> None:
        _check(len(self.outputs_weakrefs) == len(self.outputs_metadata),
               "the node's outputs must be recorded before caching them")
        for i, (storage_info, metadata, make_cached) in enumerate(
                zip(self.output_storage_alias, self.outputs_metadata, self.unaliased_in_all_paths)):
            if not make_cached:
                self.cached_tensor_outputs.append(None)
                continue
            _check(storage_info is UnaliasedStorage and isinstance(metadata, dict),
                   f"output {i} cannot be cached: it aliases another storage")
            out = self._reconstruct_from_tensor_metadata(metadata, storage=self.create_storage(metadata))
            # Tells autograd (in-place gradient accumulation) and the autocast cache that an
            # extra reference to this tensor is the graph tree's.
            torch_npu._C._add_cached_tensor(out)
            self_ref = weakref.ref(self)

            def check_refcount(i: int) -> bool:
                # True when only the node's list (and getrefcount's argument) hold the tensor:
                # 3 references if the C++ tensor is held once more (an autograd wrapper).
                node = self_ref()
                if node is None:
                    return False
                refcount = node.get_output_refcount(i)
                return refcount == (3 if node.cached_tensor_outputs[i]._use_count() > 1 else 2)

            recorded = self.outputs_weakrefs[i]
            self.outputs_weakrefs[i] = StorageWeakRefWrapper(
                out, extra_ref_check=functools.partial(check_refcount, i=i),
                owned_refs=recorded.owned_refs if recorded is not None else 0)
            self.cached_tensor_outputs.append(out)

    def get_output_refcount(self, index: int) -> int:
        return sys.getrefcount(self.cached_tensor_outputs[index])

    @property
    def parent(self) -> Optional[NPUGraphNode]:
        return self._parent() if self._parent is not None else None

    @property
    def _path_to_root(self) -> Generator[NPUGraphNode, None, None]:
        node = self
        while node:
            yield node
            node = node.parent

    @property
    def _path_from_root(self) -> Generator[NPUGraphNode, None, None]:
        yield from reversed(list(self._path_to_root))

    def _is_npu_graph_recorded_tensor(self, t: torch.Tensor) -> bool:
        "Is ``t`` an output (dead or alive: pool memory stays) of a node of this path"
        ptr = t.untyped_storage().data_ptr()
        return any(ref is not None and ref.data_ptr() == ptr for refs in self.path_weakrefs for ref in refs)

    def _is_alias_of_live_recorded_tensor(self, t: torch.Tensor) -> Optional[PathOutputIndex]:
        ptr = t.untyped_storage().data_ptr()
        for depth, output_refs in enumerate(self.path_weakrefs):
            for output_index, storage_ref in enumerate(output_refs):
                deref = maybe_deref(storage_ref)
                if deref is not None and deref[1] == ptr:
                    return depth, output_index
        return None

    @staticmethod
    def _check_liveness(indices: List[PathOutputIndex],
                        output_refs: List[List[Optional[StorageWeakRefWrapper]]]) -> bool:
        "All the outputs at ``indices`` are dead"
        for depth, output_index in indices:
            w = output_refs[depth][output_index]
            _check(w is not None, f"output {(depth, output_index)} of the path has no storage reference")
            if w() is not None:
                return False
        return True

    def add_child(self, function_id: FunctionID, node: NPUGraphNode) -> None:
        self.children[function_id].append(node)

    @staticmethod
    def _get_different_indices(prev: List[List[bool]], curr: List[List[bool]]) -> List[PathOutputIndex]:
        "(depth, index) where the two liveness lists differ"
        _check(len(prev) <= len(curr), "the earlier liveness covers a longer path")
        different = []
        for i, (outputs1, outputs2) in enumerate(zip(prev, curr)):
            _check(len(outputs1) == len(outputs2), "liveness lists of one node differ in length")
            different.extend((i, j) for j, (a, b) in enumerate(zip(outputs1, outputs2)) if a != b)
        return different

    @staticmethod
    def _get_liveness(weakrefs: List[List[Optional[StorageWeakRefWrapper]]]) -> List[List[bool]]:
        return [pytree.tree_map(is_live, outputs) for outputs in weakrefs]

    def debug_assert_invariants(self, expected_liveness: List[List[bool]],
                                newly_dead: List[PathOutputIndex]) -> None:
        "With ``fast_path_cudagraph_asserts``: outputs expected dead are dead"
        if not config.triton.fast_path_cudagraph_asserts:
            return
        for i, node in enumerate(self._path_from_root):
            _check(self.path_weakrefs[i] is node.outputs_weakrefs, "the path's outputs are out of date")
        nodes = list(self._path_from_root)
        live_blocks = get_block_addrs(self.npu_graphs_pool)
        live_data_ptrs, live_weak_ptrs = set(), set()
        for depth, outputs_liveness in enumerate(expected_liveness):
            for output_idx, output_liveness in enumerate(outputs_liveness):
                deref = maybe_deref(self.path_weakrefs[depth][output_idx])
                if deref is None:
                    continue  # an output may die early
                _check(output_liveness, f"output {(depth, output_idx)} is alive but was dead at recording")
                weak_ptr, data_ptr = deref
                _check((data_ptr in live_data_ptrs) == (weak_ptr in live_weak_ptrs),
                       "two storages share a data pointer")
                live_data_ptrs.add(data_ptr)
                live_weak_ptrs.add(weak_ptr)
                if nodes[depth].static_output_tensors[output_idx] is not None:
                    _check(data_ptr not in live_blocks, "a static output lies in the graph pool")
        for depth, output_index in newly_dead:
            _check(not is_live(self.path_weakrefs[depth][output_index]),
                   f"output {(depth, output_index)} should be dead")

    def debug_check_invariants_before_invocation(self) -> None:
        self.debug_assert_invariants(self.recorded_liveness_before_graph, self.expected_dead_indices_before_graph)

    def debug_check_invariants_after_invocation(self) -> None:
        self.debug_assert_invariants(self.recorded_liveness_before_graph, self.expected_dead_indices_after_graph)

    def data_ptrs_dead_since_invocation(self) -> List[int]:
        "Data pointers of the path's outputs that died since this node ran"
        curr_liveness = self._get_liveness(self.path_weakrefs)
        path = list(self._path_from_root)
        return [path[depth].outputs_metadata[index]["data_ptr"]
                for depth, index in self._get_different_indices(self.recorded_liveness_after_graph, curr_liveness)]

    def path_live_weakrefs(self) -> Iterator[StorageWeakRefWrapper]:
        for i, j in self.live_indices_after_graph:
            out = self.path_weakrefs[i][j]
            if out is not None and is_live(out):
                yield out

    def remove_node_cached_tensors(self) -> None:
        for t in self.cached_tensor_outputs:
            if t is not None:
                torch_npu._C._remove_cached_tensor(t)
        self.cached_tensor_outputs.clear()
        for i, unaliased in enumerate(self.unaliased_in_all_paths):
            if unaliased:
                n = self.outputs_weakrefs[i]
                _check(n is not None, f"output {i} has no storage reference")
                n.remove_extra_reference()

    def remove_path_cached_tensors(self) -> None:
        for node in self._path_from_root:
            node.remove_node_cached_tensors()

    def clear_path_state(self) -> None:
        "Clear the path state of this node (nothing is kept per path at present)"

    @staticmethod
    def _tensor_metadata(x: torch.Tensor, ignore_storage_offset: bool = True) -> Dict[str, Any]:
        _check(isinstance(x, torch.Tensor), f"expected a Tensor, got {type(x).__name__}")
        # Inputs are copied to offset 0; outputs keep theirs.
        return {
            "nbytes": x.untyped_storage().nbytes(),
            "data_ptr": x.untyped_storage().data_ptr(),
            "size": x.shape,
            "stride": x.stride(),
            "dtype": x.dtype,
            "device": x.device,
            "storage_offset": x.storage_offset() if not ignore_storage_offset else 0,
        }

    def _reconstruct_from_tensor_metadata(self, metadata: Dict[str, Any],
                                          storage: Optional[UntypedStorage] = None) -> Tensor:
        s = self.create_storage(metadata) if storage is None else storage
        return torch_npu._C._construct_NPU_Tensor_From_Storage_And_Metadata(metadata, s)

    def create_storage(self, metadata: Dict[str, Any]) -> UntypedStorage:
        """The storage at ``metadata["data_ptr"]``: the recorded one for an output of this node
        (which keeps its storage format), else a storage that does not own the memory."""
        pinned = self.pinned_storages.get(metadata["data_ptr"])
        if pinned is not None:
            return pinned
        return torch_npu._C._construct_storage_from_data_pointer(
            metadata["data_ptr"], torch.device(metadata["device"]), metadata["nbytes"])

    def _allocate_and_copy_recording_inputs(self, inputs: List[InputType]) -> List[InputType]:
        "Copies of the non-static tensor inputs, allocated in the pool"
        torch.npu.synchronize()
        self.stream.wait_stream(torch.npu.current_stream())
        recording_inputs: List[InputType] = []
        with warnings.catch_warnings(record=True), torch.npu.device(self.device), \
                _use_npu_memory_pool_manager(self.device, mem_pool=self.npu_graphs_pool, stream=self.stream):
            for i, inp in enumerate(inputs):
                if not isinstance(inp, torch.Tensor):
                    _check(isinstance(inp, (int, torch.Generator)),
                           f"graph input {i} must be a Tensor, an int or a Generator, got {type(inp).__name__}")
                    recording_inputs.append(inp)
                elif i not in self.static_input_idxs:
                    recording_inputs.append(static_input(inp))  # allocates in the pool
                else:
                    recording_inputs.append(inp)
            self._copy_inputs_and_remove_from_src(recording_inputs, inputs)
        return recording_inputs

    def check_invariants(self, inputs: List[InputType]) -> Tuple[CheckInvariantStatus, Callable[..., str]]:
        """Whether this node may replay for ``inputs``: same pool-managed and static input
        addresses, and the outputs that were dead at recording are dead."""
        logger = functools.partial(log_data_ptr_mismatch, self.wrapped_function.placeholders, inputs,
                                   self.static_input_data_ptrs)
        if not torch_npu._C._tensors_data_ptrs_at_indices_equal(inputs, self.static_input_data_ptrs,
                                                                 self.npugraph_managed_idxs):
            status = CheckInvariantStatus.CudagraphManagedIdxMismatch
            return status, functools.partial(logger, self.npugraph_managed_idxs, status)
        if not self._check_liveness(self.expected_dead_indices_before_graph, self.path_weakrefs):
            status = CheckInvariantStatus.ExpectedDeadIndicesBeforeGraphMismatch
            return status, lambda: f"{status}"
        if self.rerecord_if_static_inputs_change and not torch_npu._C._tensors_data_ptrs_at_indices_equal(
                inputs, self.static_input_data_ptrs, self.static_input_idxs):
            status = CheckInvariantStatus.StaticInputIdxMismatch
            return status, functools.partial(logger, self.static_input_idxs, status)
        # Managed inputs that died during the recording must die now, before the replay.
        for idx in self.npugraph_managed_idxs:
            if not self.preserved_aliased_inputs[idx]:
                inputs[idx] = None
        torch._check(self._check_liveness(self.expected_dead_indices_after_graph, self.path_weakrefs),
                     lambda: "an input tensor freed during the graph's recording is still alive at its replay")
        return CheckInvariantStatus.SUCCESS, lambda: f"{CheckInvariantStatus.SUCCESS}"

    def num_descendants(self) -> int:
        return sum(1 + child.num_descendants() for children in self.children.values() for child in children)


def get_npugraph_segments(pool_id: Tuple[int, int]) -> Any:
    "The caching allocator's segments of memory pool ``pool_id``"
    return [segment for segment in torch.npu.memory_snapshot() if segment["segment_pool_id"] == pool_id]


def get_block_addrs(pool_id: Tuple[int, int], live_only: bool = True) -> List[int]:
    "Addresses of the (allocated, with ``live_only``) blocks of memory pool ``pool_id``"
    blocks = []
    for segment in get_npugraph_segments(pool_id):
        addr = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" or not live_only:
                blocks.append(addr)
            addr += block["size"]
    return blocks


def format_tb(frames: List[Any]) -> str:
    "A traceback of the allocator's frames (dicts with filename, line, name)"
    summaries = [traceback.FrameSummary(f["filename"], f["line"], f["name"]) for f in frames]
    return "".join(traceback.format_list(summaries))


def check_memory_pool(device: Any, pool_id: Tuple[int, int], live_storages_ptrs: List[StorageWeakRefWrapper]) -> None:
    """Raise unless the allocated blocks of pool ``pool_id`` are the live storages given (plus the
    outputs graph nodes keep allocated)."""
    _check(all(isinstance(elem, StorageWeakRefWrapper) for elem in live_storages_ptrs),
           "check all(isinstance(elem, StorageWeakRefWrapper) for elem in live_storages_ptrs) fail")
    unique_storages = {stor.data_ptr() for stor in live_storages_ptrs if stor()} | _held_data_ptrs(pool_id)
    if torch_npu._C._npu_checkPoolLiveAllocations(device, pool_id, unique_storages):
        return
    # Slow path: a dead tensor may only await collection.
    gc.collect()
    allocated_not_in_live_storages = {}
    for segment in get_npugraph_segments(pool_id):
        addr = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                if addr not in unique_storages:
                    allocated_not_in_live_storages[addr] = block
                else:
                    unique_storages.remove(addr)
            addr += block["size"]
    torch._check(len(unique_storages) == 0,
                 lambda: f"These storage data ptrs are not allocated in pool {pool_id} but should be {unique_storages}")
    if allocated_not_in_live_storages:
        formatted = "\n".join(f"Data Pointer: {dp}, history: \n{format_tb(block.get('frames', []))}"
                              for dp, block in allocated_not_in_live_storages.items())
        raise RuntimeError("These live storage data ptrs are in the npugraph pool but not accounted for as an "
                           f"output of npugraph trees: \n\n{formatted}")


class ExecutionState(Enum):
    "What the tree manager's current node is doing"
    NONE = auto()
    WARMUP = auto()
    RECORDING = auto()
    EXECUTION = auto()


class CompilationMode(Enum):
    FORWARD = auto()
    BACKWARD = auto()
    INFERENCE = auto()


class NPUGraphTreeManager:
    """The graph tree of one device: dispatches each call of a registered function to a warm-up,
    a new recording, or the replay of a matching node, following the current path.

    A path ends (the next call starts from the roots again) when all its outputs are dead, or
    at a new generation: a new ``torch.compile`` invocation (``GenerationTracker``) or a
    :func:`mark_step_begin`, unless forwards are waiting for their backward.
    """

    def __init__(self, device_index: int) -> None:
        self.roots: Dict[FunctionID, List[NPUGraphNode]] = defaultdict(list)
        self.ids_to_funcs: Dict[FunctionID, WrappedFunction] = {}
        self.ids_to_stack_traces: Dict[FunctionID, Optional[StackTraces]] = {}
        self.warmed_up_functions: set = set()
        self.warned_functions: set = set()  # warned once about a stuck warm-up
        self.warned_mutation: set = set()
        torch_npu._C._set_cached_tensors_enabled(True)

        # One stream for all the pool's allocations: the allocator reuses a block on its stream only.
        with torch.npu.device(device_index):
            torch.npu.synchronize()
            self.stream = torch.npu.Stream()
            self.stream.wait_stream(torch.npu.current_stream())
            # An empty capture creates the pool, and keeps it alive while the tree is.
            self.graph: Optional[torch.npu.NPUGraph] = torch.npu.NPUGraph()
            self.npu_graphs_thread_pool = torch.npu.graph_pool_handle()
            with warnings.catch_warnings(record=True), torch.npu.graph(
                    self.graph, pool=self.npu_graphs_thread_pool, stream=self.stream,
                    capture_error_mode="thread_local"):
                pass

        self.graph_counter = itertools.count(0)
        self.func_counter = itertools.count(0)
        # node id -> function id -> whether it mutates inputs the tree does not manage
        self.non_npugraph_managed_mutation_hint: Dict[Optional[GraphID], Dict[FunctionID, bool]] = defaultdict(dict)
        self.warmup_node_counter = itertools.count(start=-1, step=-1)
        # node id -> function id -> re-recordings (past the limit, the function runs eagerly)
        self.num_rerecord: Dict[Optional[GraphID], Dict[FunctionID, int]] = defaultdict(lambda: defaultdict(int))
        self.path_state = ExecutionState.NONE
        self.device_index = device_index
        self.current_node: Union[NPUGraphNode, NPUWarmupNode, None] = None
        self.current_gen: int = -1
        self.debug_fail_counter = 0
        self.debug_checkpointing_counter = 0
        self.id_to_mode: Dict[FunctionID, CompilationMode] = {}
        # A forward ran whose backward has not: its outputs must survive a new generation
        # (mod2(mod1(x)).sum().backward() with two compiled modules).
        self.running_forwards_with_pending_backwards = False
        self.mode: Optional[CompilationMode] = None

    def run(self, new_inputs: List[InputType], function_id: FunctionID) -> OutputType:
        _check(self.graph is not None, "Running NPUGraph after shutdown")
        self.mode = self.id_to_mode[function_id]
        out = self._run(new_inputs, function_id)
        if self.mode == CompilationMode.FORWARD:
            self.running_forwards_with_pending_backwards = True
        elif self.mode == CompilationMode.BACKWARD:
            self.running_forwards_with_pending_backwards = False
        return out

    def set_to_running_backward(self) -> None:
        self.running_forwards_with_pending_backwards = False
        self.mode = CompilationMode.BACKWARD

    def _get_npu_graph_recorded_tensor_checker(self) -> Callable[[Tensor], bool]:
        if isinstance(self.current_node, (NPUGraphNode, NPUWarmupNode)):
            return self.current_node._is_npu_graph_recorded_tensor
        return lambda _: False

    def new_warmup_node_id(self) -> GraphID:
        return GraphID(next(self.warmup_node_counter))

    def _update_non_npugraph_managed_mutation(self, function_id: FunctionID, inputs: List[InputType]) -> None:
        node_id = self._get_node_id()
        mutation = check_for_mutation(self.ids_to_funcs[function_id], inputs,
                                      self._get_npu_graph_recorded_tensor_checker())
        self.non_npugraph_managed_mutation_hint[node_id][function_id] = bool(mutation)
        if mutation and function_id not in self.warned_mutation:
            self.warned_mutation.add(function_id)
            log_cudagraph_skip_and_bump_counter(mutation)

    def _get_node_id(self) -> Optional[GraphID]:
        if self.current_node is None:
            return None
        if isinstance(self.current_node, (NPUGraphNode, NPUWarmupNode)):
            return self.current_node.id
        raise RuntimeError(f"Unknown node type {type(self.current_node)}")

    def exceed_rerecord_limit(self, node_id: Optional[GraphID], function_id: FunctionID) -> bool:
        return self.num_rerecord[node_id][function_id] > config.triton.cudagraph_unexpected_rerecord_limit

    def _run(self, new_inputs: List[InputType], function_id: FunctionID) -> OutputType:
        # Ending the current path is checked lazily, but recording and warm-up happen once.
        if self.in_recording:
            self.try_end_curr_recording(function_id)
        if self.in_warmup:
            self.try_end_curr_warmup(function_id)

        node_id = self._get_node_id()
        if function_id not in self.non_npugraph_managed_mutation_hint[node_id]:
            self._update_non_npugraph_managed_mutation(function_id, new_inputs)
        # Functions mutating inputs outside the pool (and not parameters) run eagerly.
        if self.non_npugraph_managed_mutation_hint[node_id][function_id] or \
                self.exceed_rerecord_limit(node_id, function_id):
            return self.ids_to_funcs[function_id].model(new_inputs)

        # A warm-up moves allocations, so after one only warm-ups may follow on this path.
        if (function_id not in self.warmed_up_functions and not config.triton.skip_cudagraph_warmup) \
                or self.in_warmup or config.triton.force_cudagraphs_warmup:
            if self.path_state == ExecutionState.EXECUTION:
                self.apply_checkpoint_execution_state_in_allocator()
            return self.run_eager(new_inputs, function_id)

        _check(not isinstance(self.current_node, NPUWarmupNode), "cannot record after a warm-up on the same path")
        child_nodes = self.roots if self.current_node is None else self.current_node.children

        if not self.in_recording:
            unexpected_rerecord, reason = False, None
            for child in child_nodes[function_id]:
                status, status_logger = child.check_invariants(new_inputs)
                if status == CheckInvariantStatus.SUCCESS:
                    return self.execute_node(child, new_inputs)
                # Moved parameters (static inputs) re-record without counting against the limit.
                if status != CheckInvariantStatus.StaticInputIdxMismatch:
                    unexpected_rerecord, reason = True, status_logger

            # No child matches: a root may, once the current path ends.
            if self.current_node is not None and function_id in self.roots:
                self.try_end_curr_execution()
                if self.current_node is None:
                    return self.run(new_inputs, function_id)

            if len(self.ids_to_funcs[function_id].mutated_input_idxs) > 0:
                self._update_non_npugraph_managed_mutation(function_id, new_inputs)
                if self.non_npugraph_managed_mutation_hint[self._get_node_id()][function_id]:
                    return self.ids_to_funcs[function_id].model(new_inputs)

            if unexpected_rerecord:
                curr_node_id = self._get_node_id()
                self.num_rerecord[curr_node_id][function_id] += 1
                if self.exceed_rerecord_limit(curr_node_id, function_id):
                    log_cudagraph_skip_and_bump_counter(
                        f"skipping npugraph due to function {function_id.id} exceeding max re-recording limit "
                        f"(={config.triton.cudagraph_unexpected_rerecord_limit}) on npugraph node "
                        f"{curr_node_id.id if curr_node_id else None} due to {reason()}.")
                    return self.ids_to_funcs[function_id].model(new_inputs)

            self.debug_fail_counter += 1
            self.try_end_curr_execution()
            if self.current_node is not None:
                self.apply_checkpoint_execution_state_in_allocator()

        return self.record_function(new_inputs, function_id)

    def shutdown(self) -> None:
        """Drop the cached tensors and graphs of all nodes: cached tensors may hold gradients that
        reference a backward invoking a node, a cycle this breaks."""
        nodes = [node for roots in self.roots.values() for node in roots]
        while nodes:
            node = nodes.pop()
            nodes.extend(child for children in node.children.values() for child in children)
            node.remove_node_cached_tensors()
            node.graph = None
        self.graph = None
        self.roots = None
        self.current_node = None
        _pool_stale_outputs.pop(self.npu_graphs_thread_pool, None)

    def record_function(self, new_inputs: List[InputType], function_id: FunctionID) -> OutputType:
        _check(not isinstance(self.current_node, NPUWarmupNode), "cannot record after a warm-up on the same path")
        graph_id = self.new_graph_id()
        log.debug("recording function %d of the npu graph tree as graph %d", function_id.id, graph_id.id)
        torch.npu.synchronize()
        node = NPUGraphNode(self.ids_to_funcs[function_id], graph_id, self.current_node, new_inputs,
                            self.npu_graphs_thread_pool, self.device_index,
                            self.ids_to_stack_traces[function_id], self.stream)
        if self.current_node is None:
            self.roots[function_id].append(node)
        else:
            self.current_node.add_child(function_id, node)
        self.current_node = node
        self.path_state = ExecutionState.RECORDING
        self.update_generation()
        torch.npu.synchronize()
        return node.run_first_inputs(new_inputs)

    def execute_node(self, node: NPUGraphNode, new_inputs: List[InputType]) -> OutputType:
        self.current_node = node
        self.path_state = ExecutionState.EXECUTION
        self.update_generation()
        return node.run(new_inputs)

    def run_eager(self, new_inputs: List[InputType], function_id: FunctionID) -> OutputType:
        already_warm = function_id in self.warmed_up_functions
        self.warmed_up_functions.add(function_id)
        node = NPUWarmupNode(self.ids_to_funcs[function_id], self.current_node, self.npu_graphs_thread_pool,
                             self.graph, self.device_index, self.ids_to_stack_traces[function_id], self.stream,
                             already_warm, self.new_warmup_node_id())
        self.current_node = node
        self.path_state = ExecutionState.WARMUP
        self.update_generation()
        return node.run(new_inputs)

    def new_graph_id(self) -> GraphID:
        return GraphID(next(self.graph_counter))

    def new_func_id(self) -> FunctionID:
        return FunctionID(next(self.func_counter))

    def add_function(self, model: ModelType, inputs: List[InputType], static_input_idxs: Sequence[int],
                     stack_traces: Optional[StackTraces], mode: CompilationMode,
                     constants: Tuple[torch.Tensor, ...], placeholders: Tuple[PlaceholderInfo, ...],
                     mutated_input_idxs: Tuple[int, ...]) -> Tuple[ModelType, OutputType]:
        """Register ``model``; returns the function that runs it through the tree, and the
        outputs of running it on ``inputs``."""
        function_id = self.new_func_id()
        self.ids_to_stack_traces[function_id] = stack_traces
        self.ids_to_funcs[function_id] = WrappedFunction(
            model, list(static_input_idxs), function_id,
            tuple(t for t in constants if isinstance(t, torch.Tensor) and t.is_npu),
            placeholders, mutated_input_idxs)
        self.id_to_mode[function_id] = mode
        fn = functools.partial(self.run, function_id=function_id)
        get_container(self.device_index).add_strong_reference(fn)  # the tree lives while fn does
        return fn, fn(inputs)

    @property
    def in_recording(self) -> bool:
        return self.path_state == ExecutionState.RECORDING

    @property
    def in_warmup(self) -> bool:
        return self.path_state == ExecutionState.WARMUP

    def get_roots(self) -> Iterator[NPUGraphNode]:
        for nodes in self.roots.values():
            yield from nodes

    @property
    def current_node(self) -> Union[NPUGraphNode, NPUWarmupNode, None]:
        return self._current_node

    @current_node.setter
    def current_node(self, value: Union[NPUGraphNode, NPUWarmupNode, None]) -> None:
        self._current_node = value
        if value is None:
            self.path_state = ExecutionState.NONE

    def update_generation(self) -> None:
        self.current_gen = self.get_curr_generation()

    @staticmethod
    def get_curr_generation() -> int:
        if MarkStepBox.mark_step_counter != 0:
            return MarkStepBox.mark_step_counter
        return GenerationTracker.generation

    @staticmethod
    def user_invoked_mark_step() -> bool:
        return MarkStepBox.mark_step_counter != 0

    def can_start_new_generation(self) -> bool:
        if not self.in_new_torch_compile_invocation():
            return False
        if self.user_invoked_mark_step():
            return True
        return not self.running_forwards_with_pending_backwards

    def in_new_torch_compile_invocation(self) -> bool:
        return self.current_gen != self.get_curr_generation()

    def try_end_curr_recording(self, function_id: FunctionID) -> None:
        "End the path after a recording if a new generation may start or all its outputs are dead"
        _check(self.in_recording and self.current_node is not None, "no recording to end")
        if self.can_start_new_generation():
            self.dealloc_current_path_weakrefs()
            self.clear_current_path_state_and_set_to_none()
            return
        if self.current_node.all_outputs_are_dead():
            self.clear_current_path_state_and_set_to_none()
            return
        self.check_warn_on_unable_to_start_executing(function_id)

    def try_end_curr_execution(self) -> None:
        "End the path after replays if a new generation may start or all its outputs are dead"
        _check(not self.in_recording, "try_end_curr_execution() while recording")
        if self.current_node is None:
            return
        if self.can_start_new_generation() or self.current_node.all_outputs_are_dead():
            self.clear_current_path_state_and_set_to_none()

    def try_end_curr_warmup(self, function_id: FunctionID) -> None:
        if self.can_start_new_generation():
            self.dealloc_current_path_weakrefs()
            self.current_node = None
            return
        _check(self.current_node is not None, "no warm-up to end")
        if self.current_node.all_outputs_are_dead():
            self.current_node = None
            return
        self.check_warn_on_unable_to_start_executing(function_id)

    def check_warn_on_unable_to_start_executing(self, function_id: FunctionID) -> None:
        "Warn (once per function) when a path keeps growing with repeats of the same function"
        if function_id in self.warned_functions or not self.in_new_torch_compile_invocation():
            return
        _check(self.current_node is not None, "no current node")
        existing_nodes = [node for node in self.current_node._path_from_root
                          if node.wrapped_function.id == function_id]
        if len(existing_nodes) <= 1:
            return
        parents = {n.parent.wrapped_function.id
                   for n in itertools.chain(existing_nodes, (self.current_node,)) if n.parent is not None}
        if len(parents) == len(existing_nodes):
            return
        self.warned_functions.add(function_id)
        warnings.warn("Unable to hit fast path of NPUGraphs because of pending, uninvoked backwards. "
                      "Consider running with torch.no_grad() or using torch.compiler.npugraph_mark_step_begin() "
                      "before each model invocation")

    @staticmethod
    def format_dealloc_msg(stack_trace: Optional[str]) -> str:
        stack_trace = stack_trace.strip() if stack_trace else "[Could not find stack trace]"
        return ("Error: accessing tensor output of NPUGraphs that has been overwritten by a subsequent run. "
                f"Stack trace: {stack_trace}. To prevent overwriting, clone the tensor outside of torch.compile() "
                "or call torch.compiler.npugraph_mark_step_begin() before each model invocation.")

    def dealloc_current_path_weakrefs(self) -> None:
        """The current path's outputs may be overwritten from now on (a new generation).

        CUDA graph trees free their memory and make reading them raise; here they keep their
        memory (see the module's docstring), so there is nothing to free, and the simulator has
        no way to make a storage raise on access.
        """
        _check(self.current_node is not None, "no current path")
        for ref in self.current_node.path_live_weakrefs():
            log.debug("npu graph output %d may be overwritten from now on", ref.data_ptr())
            if not ref.owned_refs:  # a warm-up's output: the user's tensor owns the block
                _pool_stale_outputs[self.npu_graphs_thread_pool].append(ref)

    def clear_current_path_state_and_set_to_none(self) -> None:
        _check(isinstance(self.current_node, NPUGraphNode), "the current node is not a graph node")
        self.current_node.clear_path_state()
        self.current_node = None

    def apply_checkpoint_execution_state_in_allocator(self) -> None:
        """Prepare the pool for a recording or warm-up that follows replays.

        On CUDA the allocator is set back to its state after the current node's recording. Here
        it needs no change: the blocks of all recorded outputs stayed allocated. Cached tensors
        are dropped, as they must not keep outputs alive that descendants may alias.
        """
        _check(isinstance(self.current_node, NPUGraphNode), "the current node is not a graph node")
        self.debug_checkpointing_counter += 1
        self.current_node.remove_path_cached_tensors()
        if config.triton.slow_path_cudagraph_asserts:
            check_memory_pool(self.device_index, self.npu_graphs_thread_pool,
                              list(self.current_node.path_live_weakrefs()))

    def live_npugraph_pool_storages_in_curr_execution(self) -> List[StorageWeakRefPointer]:
        if self.current_node is None:
            return []
        return [t() for t in self.current_node.path_live_weakrefs()]
