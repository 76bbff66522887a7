"""The stream check of the NPU sanitizer: data races between streams and the host.

Three parts, named as torch_npu's:

* :class:`NPUSanitizerDispatchMode` sees every operator call (a ``TorchDispatchMode``),
  asks :class:`NPUArgumentHandler` what the call reads and writes, and hands that to
  the event handler as one kernel launch on the stream it runs on.
* :class:`NPURecordStreamHandler` keeps the happens-before order (the vector clocks of
  ``torch.cuda._sanitizer.EventHandler``, fed by the NPU trace: events, stream and device
  synchronisations, allocations, ``record_stream``) and checks each launch against the
  earlier accesses to the same memory. At a free (or :meth:`flush_record_stream_warnings`)
  it reports tensors used on another stream with neither ``record_stream`` nor a wait of
  the allocation stream for the use.
* :class:`NPUArgumentHandler` parses an operator's arguments by its schema's alias
  annotations (``Tensor(a!)`` is written, views are not accesses).

Beyond ``torch.cuda._sanitizer``:

* Accesses are byte ranges of a storage, not data pointers: a write to ``x[0:50]`` on one
  stream and a read of ``x[25:75]`` on another is a race even though the two views start
  at different addresses; two views that do not share an element (``x[:, 0]`` and
  ``x[:, 1]``) are not.
* The host is a stream (:data:`HOST_STREAM`). Work launched on a stream is ordered after
  everything the host did or waited for before the launch, and CPU operators on pinned
  memory are host accesses: rewriting a pinned buffer before its ``non_blocking`` copy to
  the device is known to have run, or reading the pinned target of a ``non_blocking``
  copy from the device without synchronising, is reported like a race between streams.
* Synchronisations that happen inside an operator (a blocking copy, ``.item()``) order
  the host after that operator's own kernel.

What is reported does not depend on timing or on TASK_QUEUE_ENABLE: the trace is the
host's calls, in order.
"""
import functools
import inspect
import logging
import re
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

import torch
import torch.cuda._sanitizer as csan
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import torch_npu

logger = logging.getLogger(__name__)

# Factories that take a tensor only for its metadata (empty_like, new_zeros, ...).
FACTORY_FUNCTION_REGEX = re.compile("(new_.*|.*_like)")

# The stream id of the host thread (real stream ids are nonzero handles).
HOST_STREAM: csan.StreamId = -1

# Exact element-overlap checks of two strided views are done up to this many elements
# per view; beyond, overlapping byte ranges count as overlapping.
_EXACT_OVERLAP_LIMIT = 1 << 16


def _stack_trace() -> traceback.StackSummary:
    stack = traceback.StackSummary.extract(traceback.walk_stack(inspect.currentframe()), lookup_lines=False)
    stack.reverse()
    return stack


class _Region(NamedTuple):
    """The elements of a tensor view: where its storage starts, and its geometry."""
    storage: int
    start: int   # first byte, absolute
    end: int     # one past the last byte, absolute
    offset: int  # data_ptr() - storage start, in bytes
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]
    itemsize: int

    @staticmethod
    def of(t: torch.Tensor) -> Optional["_Region"]:
        if t.numel() == 0:
            return None
        storage = t.untyped_storage().data_ptr()
        if not storage:
            return None
        itemsize = t.element_size()
        span = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
        start = t.data_ptr() - itemsize * sum((s - 1) * -st for s, st in zip(t.shape, t.stride()) if st < 0)
        return _Region(storage, start, start + span * itemsize, t.data_ptr() - storage,
                       tuple(t.shape), tuple(t.stride()), itemsize)

    def _byte_offsets(self) -> torch.Tensor:
        offsets = torch.zeros((), dtype=torch.int64)
        for size, stride in zip(self.sizes, self.strides):
            offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
        offsets = offsets.reshape(-1) * self.itemsize + self.offset
        # every byte of each element
        return (offsets.unsqueeze(-1) + torch.arange(self.itemsize, dtype=torch.int64)).reshape(-1)

    def overlaps(self, other: "_Region") -> bool:
        if self.storage != other.storage or self.end <= other.start or other.end <= self.start:
            return False
        if self.is_dense() or other.is_dense():
            return True
        n1, n2 = _numel(self.sizes), _numel(other.sizes)
        if max(n1, n2) > _EXACT_OVERLAP_LIMIT:
            return True
        return bool(torch.isin(self._byte_offsets(), other._byte_offsets()).any())

    def covers(self, other: "_Region") -> bool:
        return self.is_dense() and self.start <= other.start and other.end <= self.end

    def is_dense(self) -> bool:
        return (self.end - self.start) == _numel(self.sizes) * self.itemsize


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


class _TensorAccess(NamedTuple):
    """One tensor argument's access by a kernel (argument parsing's output)."""
    region: _Region
    is_write: bool
    aliases: Tuple[str, ...]
    is_output: bool
    data_ptr: int


class _RecordedAccess(NamedTuple):
    region: _Region
    access: csan.Access


@dataclass
class CrossStreamUsage:
    """A use of a tensor on a stream other than the one it was allocated on."""
    usage_stream: csan.StreamId
    seq_num: csan.SeqNum
    operator: str
    stack_trace: traceback.StackSummary


@dataclass
class NPUTensorInfo:
    """Allocation stream and cross-stream uses of one allocation, for the record_stream check."""
    allocation_stream: Optional[csan.StreamId] = None
    allocation_stack_trace: Optional[traceback.StackSummary] = None
    recorded_streams: Set[csan.StreamId] = field(default_factory=set)
    cross_stream_usages: Dict[csan.StreamId, CrossStreamUsage] = field(default_factory=dict)


class MissingRecordStreamError(csan.SynchronizationError):
    """A tensor used on another stream was freed with neither record_stream nor a wait
    of its allocation stream for that use: the caching allocator may hand its memory to
    new work on the allocation stream while the other stream still uses it."""

    def __init__(self, data_ptr, allocation_stack_trace, allocation_stream, usage_stream, usage,
                 recorded_streams):
        super().__init__()
        self.data_ptr = data_ptr
        self.allocation_stack_trace = allocation_stack_trace
        self.allocation_stream = allocation_stream
        self.usage_stream = usage_stream
        self.usage = usage
        self.recorded_streams = recorded_streams

    def __repr__(self):
        return (f"MissingRecordStreamError(data_ptr={self.data_ptr}, alloc_stream={self.allocation_stream}, "
                f"usage_stream={self.usage_stream}, operator='{self.usage.operator}')")

    def __str__(self):
        result = textwrap.dedent(f"""\
            ============================
            NPUSanitizer: missing record_stream detected!
            Tensor (data ptr: {self.data_ptr}) allocated on stream {self.allocation_stream}
            was used on stream {self.usage_stream} without record_stream or
            creation_stream.wait_stream(usage_stream).

            The caching allocator may reuse its memory for new work on the allocation
            stream while stream {self.usage_stream} still uses it.

            Fix with ONE of:
              A) tensor.record_stream(stream) before the tensor is freed
              B) creation_stream.wait_stream(usage_stream) before the tensor is freed

            Cross-stream usage during kernel:
              {self.usage.operator}
            """)
        result += f"With stack trace:\n{''.join(self.usage.stack_trace.format())}\n"
        if self.recorded_streams:
            result += f"Streams recorded via record_stream: {self.recorded_streams}\n"
        else:
            result += "No streams were recorded via record_stream.\n"
        if self.allocation_stack_trace:
            result += f"Tensor was allocated with stack trace:\n{''.join(self.allocation_stack_trace.format())}"
        return result


class NPURecordStreamHandler(csan.EventHandler):
    """Happens-before bookkeeping and the checks (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._npu_tensors: Dict[csan.DataPtr, NPUTensorInfo] = {}
        self.record_stream_errors: List[MissingRecordStreamError] = []
        # storage start -> the accesses that later ones must be ordered after
        self._accesses: Dict[int, List[_RecordedAccess]] = {}
        # The host is a stream whose state is csan's host_sync_state (what the host waited for).
        self.syncs.current_sync_states[HOST_STREAM] = self.syncs.host_sync_state
        self.syncs.host_sync_state[HOST_STREAM] = 0
        self._kernel_depth = 0
        self._deferred: List[Tuple] = []

    # ---- the host's synchronisations -------------------------------------------------

    def _begin_kernel(self) -> None:
        self._kernel_depth += 1

    def _end_kernel(self) -> None:
        """After an operator's launch was handled: apply the synchronisations it made
        (a blocking copy waits for its own kernel)."""
        self._kernel_depth -= 1
        if self._kernel_depth == 0:
            deferred, self._deferred = self._deferred, []
            for fn, args in deferred:
                fn(*args)

    def _sync(self, fn, *args) -> None:
        if self._kernel_depth:
            self._deferred.append((fn, args))
        else:
            fn(*args)

    def _handle_device_synchronization(self) -> None:
        self._sync(super()._handle_device_synchronization)

    def _handle_stream_synchronization(self, stream: csan.StreamId) -> None:
        self._sync(super()._handle_stream_synchronization, stream)

    def _handle_event_synchronization(self, event: csan.EventId) -> None:
        self._sync(super()._handle_event_synchronization, event)

    def _handle_event_record(self, event: csan.EventId, stream: csan.StreamId) -> None:
        self._launched_from_host(stream)
        super()._handle_event_record(event, stream)

    def _handle_event_wait(self, event: csan.EventId, stream: csan.StreamId) -> None:
        self._launched_from_host(stream)
        super()._handle_event_wait(event, stream)

    def _launched_from_host(self, stream: csan.StreamId) -> None:
        """Work queued on `stream` from now on runs after what the host has done so far."""
        if stream != HOST_STREAM:
            self.syncs._ensure_stream_exists(stream)
            self.syncs._state_wait_for_other(self.syncs.current_sync_states[stream], self.syncs.host_sync_state)

    # ---- allocations and record_stream -----------------------------------------------

    def _handle_memory_allocation(self, data_ptr: csan.DataPtr) -> None:
        super()._handle_memory_allocation(data_ptr)
        self._accesses.pop(data_ptr, None)
        try:
            stream = int(torch_npu.npu.current_stream().npu_stream)
        except RuntimeError:
            stream = None
        self._npu_tensors[data_ptr] = NPUTensorInfo(
            allocation_stream=stream,
            allocation_stack_trace=self.tensors_accessed.get_allocation_stack_trace(data_ptr))

    def _handle_memory_deallocation(self, data_ptr: csan.DataPtr) -> None:
        if data_ptr in self._npu_tensors:
            for error in self._get_record_stream_errors(data_ptr):
                print(error, file=sys.stderr)
                self.record_stream_errors.append(error)
            del self._npu_tensors[data_ptr]
        self._accesses.pop(data_ptr, None)
        super()._handle_memory_deallocation(data_ptr)

    def _handle_host_memory_allocation(self, data_ptr: int) -> None:
        self._accesses.pop(data_ptr, None)  # a reused pinned block: its earlier accesses are over

    _handle_host_memory_deallocation = _handle_host_memory_allocation

    def _handle_record_stream(self, data_ptr: csan.DataPtr, stream: csan.StreamId) -> None:
        self._npu_tensors.setdefault(data_ptr, NPUTensorInfo()).recorded_streams.add(stream)

    def _handle_erase_stream(self, data_ptr: csan.DataPtr, stream: csan.StreamId) -> None:
        info = self._npu_tensors.get(data_ptr)
        if info is not None:
            info.recorded_streams.discard(stream)

    def _is_creation_stream_synced_to_usage(self, creation_stream, usage_stream, usage_seq_num=0) -> bool:
        """Whether the allocation stream waited for the use (a later wait does not count
        for uses after it)."""
        state = self.syncs.current_sync_states.get(creation_stream, {})
        return state.get(usage_stream, -1) >= usage_seq_num

    def _get_record_stream_errors(self, data_ptr) -> List[MissingRecordStreamError]:
        info = self._npu_tensors.get(data_ptr)
        if info is None or info.allocation_stream is None:
            return []
        return [
            MissingRecordStreamError(data_ptr, info.allocation_stack_trace, info.allocation_stream, stream, usage,
                                     info.recorded_streams.copy())
            for stream, usage in info.cross_stream_usages.items()
            if stream not in info.recorded_streams
            and not self._is_creation_stream_synced_to_usage(info.allocation_stream, stream, usage.seq_num)
        ]

    def flush_record_stream_warnings(self) -> List[MissingRecordStreamError]:
        """Checks every live allocation for uses that would need record_stream if it were
        freed now; prints and returns the errors (also kept in record_stream_errors)."""
        errors = [e for ptr in list(self._npu_tensors) for e in self._get_record_stream_errors(ptr)]
        for error in errors:
            print(error, file=sys.stderr)
        self.record_stream_errors.extend(errors)
        return errors

    def _record_cross_stream_usage(self, stream, storages, operator, stack_trace) -> None:
        for ptr in storages:
            info = self._npu_tensors.get(ptr)
            if info is None or info.allocation_stream is None or info.allocation_stream == stream:
                continue
            info.cross_stream_usages[stream] = CrossStreamUsage(stream, self.seq_num, operator, stack_trace)

    # ---- kernel launches --------------------------------------------------------------

    def _handle_kernel_launch(self, stream, read_only, read_write, outputs, operator, tensor_aliases,
                              storage_dataptrs_accessed=None, accesses: Optional[List[_TensorAccess]] = None):
        """Checks one kernel's accesses. With ``accesses`` (what NPUArgumentHandler parsed)
        the check is by byte ranges; without, by data pointers as csan's."""
        self._launched_from_host(stream)
        if accesses is None:
            errors = super()._handle_kernel_launch(stream, read_only, read_write, outputs, operator,
                                                   tensor_aliases)
            self._record_cross_stream_usage(stream, storage_dataptrs_accessed or (read_only | read_write),
                                            operator, _stack_trace())
            return errors
        self.seq_num += 1
        self.syncs.update_seq_num(stream, self.seq_num)
        stack_trace = _stack_trace()
        errors: List[csan.SynchronizationError] = []
        # a tensor both read and written by the kernel is checked as written
        written = {a.region for a in accesses if a.is_write}
        for a in accesses:
            if not a.is_write and a.region in written:
                continue
            access = csan.Access(csan.AccessType.WRITE if a.is_write else csan.AccessType.READ, self.seq_num, stream,
                                 operator, list(a.aliases), a.is_output, stack_trace)
            history = self._accesses.setdefault(a.region.storage, [])
            for prev in history:
                if ((a.is_write or prev.access.type is csan.AccessType.WRITE)
                        and not self.syncs.is_ordered_after(stream, prev.access.seq_num, prev.access.stream)
                        and a.region.overlaps(prev.region)):
                    errors.append(csan.UnsynchronizedAccessError(
                        a.data_ptr, self._allocation_trace(a.region.storage), access, prev.access))
            self._remember(history, _RecordedAccess(a.region, access))
        if stream != HOST_STREAM:
            self._record_cross_stream_usage(stream, {a.region.storage for a in accesses}, operator, stack_trace)
        return errors

    def _remember(self, history: List[_RecordedAccess], new: _RecordedAccess) -> None:
        """Adds an access, dropping those every later access will be checked against
        through it: earlier accesses it covers that are ordered before it (a later access
        ordered after `new` is ordered after them; one that is not conflicts with `new`)."""
        access = new.access
        if access.type is csan.AccessType.WRITE:
            history[:] = [p for p in history
                          if not (new.region.covers(p.region)
                                  and self.syncs.is_ordered_after(access.stream, p.access.seq_num, p.access.stream))]
        else:
            history[:] = [p for p in history
                          if not (p.access.type is csan.AccessType.READ and p.access.stream == access.stream
                                  and new.region.covers(p.region))]
        history.append(new)

    def _allocation_trace(self, storage: int):
        try:
            return self.tensors_accessed.get_allocation_stack_trace(storage)
        except KeyError:
            return None


class NPUArgumentHandler:
    """What one operator call reads and writes, from its schema's alias annotations.

    ``dataptrs_read``, ``dataptrs_written``, ``tensor_aliases`` and ``outputs`` are by
    tensor data pointer (as torch_npu's); ``storage_dataptrs_accessed`` by storage; and
    ``accesses`` has each access as a byte range, which the checks use. Pinned host
    tensors are accesses too (a non_blocking copy's source or target).
    """

    def __init__(self):
        self.dataptrs_read: Set[csan.DataPtr] = set()
        self.dataptrs_written: Set[csan.DataPtr] = set()
        self.tensor_aliases: Dict[int, List[str]] = {}
        self.outputs: Set[csan.DataPtr] = set()
        self.storage_dataptrs_accessed: Set[csan.DataPtr] = set()
        self.accesses: List[_TensorAccess] = []
        self.devices: Set[int] = set()

    def _handle_argument(self, value, is_write: bool, metadata_only: bool, name: Optional[str] = None,
                         is_output: bool = False) -> None:
        if not isinstance(value, torch.Tensor) or metadata_only:
            return
        if value.is_npu:
            self.devices.add(value.device.index)
        elif not (value.device.type == "cpu" and value.is_pinned()):
            return
        region = _Region.of(value)
        if value.is_npu:
            data_ptr = value.data_ptr() if value.data_ptr() else id(value)
            (self.dataptrs_written if is_write else self.dataptrs_read).add(data_ptr)
            self.tensor_aliases.setdefault(data_ptr, [])
            if name is not None:
                self.tensor_aliases[data_ptr].append(name)
            if is_output:
                self.outputs.add(data_ptr)
            if region is not None:
                self.storage_dataptrs_accessed.add(region.storage)
        if region is not None:
            self.accesses.append(_TensorAccess(region, is_write, (name,) if name else (), is_output,
                                               value.data_ptr()))

    def parse_inputs(self, schema, args, kwargs, *, is_factory: bool = False) -> None:
        for argument, value in csan.zip_arguments(schema, args, kwargs):
            alias = argument.alias_info
            is_write = alias is not None and alias.is_write
            metadata_only = is_factory or (alias is not None and not alias.is_write)
            pytree.tree_map_(functools.partial(self._handle_argument, is_write=is_write, name=argument.name,
                                               metadata_only=metadata_only), value)

    def parse_outputs(self, schema, outputs, *, is_factory: bool = False) -> None:
        for res, value in zip(schema.returns, (outputs,)):
            # Returns that alias an argument (views, the self of an in-place op) were
            # accounted for as that argument.
            metadata_only = res.alias_info is not None
            pytree.tree_map_(functools.partial(self._handle_argument, is_write=True, metadata_only=metadata_only,
                                               is_output=True), value)


class NPUSanitizerDispatchMode(TorchDispatchMode):
    """Reports every operator call to the event handler as a kernel launch on the stream
    it runs on (the current stream of its npu tensors' device; the host for a CPU
    operator on pinned memory), and raises ``CUDASanitizerErrors`` on a race."""

    def __init__(self, event_handler: csan.EventHandler):
        super().__init__()
        self.event_handler = event_handler
        self.args_handler = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = {} if kwargs is None else kwargs
        if func is torch.ops.aten.record_stream.default:
            return func(*args, **kwargs)  # not a kernel: the allocator's trace reports it
        is_factory = bool(FACTORY_FUNCTION_REGEX.match(func._schema.name))
        self.args_handler = NPUArgumentHandler()
        self.parse_inputs(func._schema, args, kwargs, is_factory=is_factory)
        begin = getattr(self.event_handler, "_begin_kernel", None)
        if begin is not None:
            begin()
        try:
            outputs = func(*args, **kwargs)
            self.parse_outputs(func._schema, outputs, is_factory=is_factory)
            if self.args_handler.accesses or self.args_handler.dataptrs_read or self.args_handler.dataptrs_written:
                self.check_errors(func, self._stream_of(self.args_handler))
        finally:
            end = getattr(self.event_handler, "_end_kernel", None)
            if end is not None:
                end()
        return outputs

    @staticmethod
    def _stream_of(args_handler: NPUArgumentHandler) -> csan.StreamId:
        if not args_handler.devices:
            return HOST_STREAM
        device = min(args_handler.devices)
        return int(torch_npu.npu.current_stream(device).npu_stream)

    def parse_inputs(self, schema, args, kwargs, is_factory=False):
        self.args_handler.parse_inputs(schema, args, kwargs, is_factory=is_factory)

    def parse_outputs(self, schema, outputs, is_factory=False):
        self.args_handler.parse_outputs(schema, outputs, is_factory=is_factory)

    def check_errors(self, func, npu_stream):
        handler = self.args_handler
        kwargs = {"storage_dataptrs_accessed": handler.storage_dataptrs_accessed}
        if isinstance(self.event_handler, NPURecordStreamHandler):
            kwargs["accesses"] = handler.accesses
        errors = self.event_handler._handle_kernel_launch(
            npu_stream, handler.dataptrs_read - handler.dataptrs_written, handler.dataptrs_written,
            handler.outputs, str(func._schema), handler.tensor_aliases, **kwargs)
        if errors:
            for error in errors:
                print(error, file=sys.stderr)
            raise csan.CUDASanitizerErrors(errors)
