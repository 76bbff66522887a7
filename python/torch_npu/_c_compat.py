"""Functions of Huawei's ``torch_npu._C`` that torch_npu's own code and its users call directly.

They are implemented here in Python over the public API and installed on ``torch_npu._C``
under torch_npu's names (see :func:`install`).
"""
import torch


def _npu_get_soc_version() -> int:
    """torch_npu's ``SocVersion`` number of the NPUs, e.g. 220 for Ascend910B1."""
    return torch.npu.get_soc_version()


def _get_cann_version(module: str) -> str:
    """The version of the CANN component ``module`` (``torch_npu.utils.get_cann_version``)."""
    from torch_npu.utils import get_cann_version

    return get_cann_version(module)


def _empty_strided_npu(sizes, strides, dtype):
    """An uninitialised tensor of ``sizes``/``strides``/``dtype`` on the current npu (the
    allocation Inductor's generated code calls)."""
    for name, value in (("sizes", sizes), ("strides", strides)):
        if not isinstance(value, (tuple, list, torch.Size)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(f"_empty_strided_npu(): argument '{name}' must be a tuple of ints, "
                            f"got {value!r}")
    if len(sizes) != len(strides):
        raise RuntimeError(f"_empty_strided_npu(): 'sizes' and 'strides' must have the same "
                           f"length, got {len(sizes)} and {len(strides)}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"_empty_strided_npu(): argument 'dtype' must be a torch.dtype, got "
                        f"{type(dtype).__name__}")
    device = torch.device("npu", torch.npu.current_device())
    return torch.empty_strided(sizes, strides, dtype=dtype, device=device)


def _weak_ref_tensor(tensor):
    """A new tensor over ``tensor``'s memory: same storage (so the same data pointer and
    storage format), sizes, strides and offset, without autograd history.

    torch_npu's returns a tensor that does not own the memory. Here it shares ``tensor``'s
    storage, so the memory also stays valid while only the new tensor is alive.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_weak_ref_tensor(): argument 'tensor' must be a Tensor, got "
                        f"{type(tensor).__name__}")
    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    with torch.no_grad():
        out.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())
    return out


def _npu_getCurrentRawStream(device_index: int) -> int:
    """The ``aclrtStream`` address of the current stream of npu ``device_index``."""
    return torch.npu.current_stream(device_index).npu_stream


# torch_npu's variant does not wait for its task queue to drain; nothing here waits either.
_npu_getCurrentRawStreamNoWait = _npu_getCurrentRawStream


# ---- graph trees (torch_npu.npu._graph_tree) ------------------------------------------------


class _npu_NPUAllocator_AllocatorState:
    """A checkpoint of one memory pool of the caching allocator: the blocks it had and which of
    them were allocated (``blocks``: ``(address, size, allocated)`` in address order).

    The simulator's allocator can report such a state but cannot be set back to one (torch_npu's
    ``_npu_setCheckpointPoolState`` has no counterpart here), so graph trees keep every recorded
    output allocated instead (see ``torch_npu.npu._graph_tree``).
    """

    def __init__(self, device: int, pool: tuple, blocks: list):
        self.device = device
        self.pool = pool
        self.blocks = blocks

    def allocated_addresses(self) -> set:
        return {addr for addr, _, allocated in self.blocks if allocated}

    def __repr__(self):
        return (f"_npu_NPUAllocator_AllocatorState(device={self.device}, pool={self.pool}, "
                f"blocks={len(self.blocks)}, allocated={len(self.allocated_addresses())})")


def _pool_blocks(device: int, mempool_id: tuple) -> list:
    """``(address, size, allocated)`` of the blocks of pool ``mempool_id`` on npu ``device``."""
    import torch_npu._C as _C

    blocks = []
    for segment in _C._npu_memorySnapshot(tuple(mempool_id))["segments"]:
        if segment["device"] != device or tuple(segment["segment_pool_id"]) != tuple(mempool_id):
            continue
        addr = segment["address"]
        for block in segment["blocks"]:
            blocks.append((addr, block["size"], block["state"] == "active_allocated"))
            addr += block["size"]
    return sorted(blocks)


def _device_index(device) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"expected an npu device, got {device}")
    return torch.npu.current_device() if device.index is None else device.index


def _npu_getCheckpointState(device, mempool_id) -> _npu_NPUAllocator_AllocatorState:
    """The state of memory pool ``mempool_id`` on npu ``device`` (its blocks and which are allocated)."""
    index = _device_index(device)
    return _npu_NPUAllocator_AllocatorState(index, tuple(mempool_id), _pool_blocks(index, mempool_id))


def _npu_checkPoolLiveAllocations(device, mempool_id, expected_live_allocations) -> bool:
    """Whether the allocated blocks of pool ``mempool_id`` are exactly the addresses
    ``expected_live_allocations``."""
    allocated = {addr for addr, _, live in _pool_blocks(_device_index(device), mempool_id) if live}
    return allocated == set(expected_live_allocations)


def _construct_NPU_Tensor_From_Storage_And_Metadata(metadata: dict, storage) -> torch.Tensor:
    """A tensor over ``storage`` with the ``size``, ``stride``, ``storage_offset`` and ``dtype`` of
    ``metadata`` (a graph tree's record of an output), on ``metadata["device"]``."""
    for key in ("size", "stride", "dtype", "device"):
        if key not in metadata:
            raise KeyError(f"_construct_NPU_Tensor_From_Storage_And_Metadata(): 'metadata' has no {key!r}")
    out = torch.empty((0,), dtype=metadata["dtype"], device=metadata["device"])
    with torch.no_grad():
        out.set_(storage, metadata.get("storage_offset", 0), metadata["size"], metadata["stride"])
    return out


def _tensors_data_ptrs_at_indices_equal(tensors, data_ptrs, indices) -> bool:
    """Whether ``tensors[i].data_ptr() == data_ptrs[i]`` for every ``i`` in ``indices`` (a tensor
    of ``None`` at an index counts as different)."""
    for i in indices:
        t = tensors[i]
        if not isinstance(t, torch.Tensor) or t.data_ptr() != data_ptrs[i]:
            return False
    return True


def _npu_fused_infer_attention_score_out_graph(stream, handle, event, *args, **kwargs):
    """torch_npu's one-call task group update of npu_fused_infer_attention_score: on ``stream``,
    records ``npu_fused_infer_attention_score.out(*args, **kwargs)`` (outputs as
    ``out=[attention_out, softmax_lse]``) as the new tasks of the captured group ``handle``,
    then records ``event`` (a torch.npu.ExternalEvent) so the next replay runs them. Returns
    the outputs."""
    out = kwargs.get("out")
    if not isinstance(out, (list, tuple)) or len(out) != 2:
        raise RuntimeError("_npu_fused_infer_attention_score_out_graph: out must have 2 tensors "
                           f"(attention_out, softmax_lse), got {out!r}")
    torch.npu.graph_task_update_begin(stream, handle)
    try:
        torch.ops.npu.npu_fused_infer_attention_score.out(*args, **kwargs)
    finally:
        torch.npu.graph_task_update_end(stream)
    event.record(stream)
    return out[0], out[1]


def _npu_getOption(option_type):
    """The value set for a runtime option (torch_npu.npu.set_option) as bytes, None if unset."""
    if not isinstance(option_type, str):
        raise TypeError("invalid argument to option_type,option_type must string!")
    from torch_npu.npu import npu_config

    with npu_config._options_lock:
        value = npu_config._options.get(option_type)
    return None if value is None else value.encode()


def install(c_module) -> None:
    """Put the functions above, and the submodules ``_mstx``, ``_npurt`` and ``_cd``, on ``torch_npu._C``
    (where the extension has none of its own)."""
    functions = {"_npu_get_soc_version": _npu_get_soc_version,
                 "_get_cann_version": _get_cann_version,
                 "_empty_strided_npu": _empty_strided_npu,
                 "_weak_ref_tensor": _weak_ref_tensor,
                 "_npu_getCurrentRawStream": _npu_getCurrentRawStream,
                 "_npu_getCurrentRawStreamNoWait": _npu_getCurrentRawStreamNoWait,
                 "_npu_getOption": _npu_getOption,
                 "_npu_NPUAllocator_AllocatorState": _npu_NPUAllocator_AllocatorState,
                 "_npu_getCheckpointState": _npu_getCheckpointState,
                 "_npu_checkPoolLiveAllocations": _npu_checkPoolLiveAllocations,
                 "_construct_NPU_Tensor_From_Storage_And_Metadata":
                     _construct_NPU_Tensor_From_Storage_And_Metadata,
                 "_tensors_data_ptrs_at_indices_equal": _tensors_data_ptrs_at_indices_equal,
                 "_npu_fused_infer_attention_score_out_graph": _npu_fused_infer_attention_score_out_graph}
    # Device-independent helpers of torch._C that torch_npu also exposes on its own _C.
    for name in ("_construct_storage_from_data_pointer", "_add_cached_tensor", "_remove_cached_tensor",
                 "_is_cached_tensor", "_set_cached_tensors_enabled", "_storage_Use_Count"):
        functions[name] = getattr(torch._C, name)
    for name, fn in functions.items():
        if not hasattr(c_module, name):
            setattr(c_module, name, fn)
    from torch_npu import _mstx, _npurt

    for name, module in (("_mstx", _mstx), ("_npurt", _npurt), ("_cd", _custom_dtype_module())):
        # the markers' runtime, raw runtime calls, the custom dtypes and their casts
        if not hasattr(c_module, name):
            setattr(c_module, name, module)
    if not hasattr(c_module, "_cd_init"):
        from torch_npu import _custom_dtype

        c_module._cd_init = _custom_dtype._cd_init


def _custom_dtype_module():
    """``torch_npu._C._cd`` as torch_npu has it: ``DType`` and the three casts (torch_npu._custom_dtype)."""
    import types

    from torch_npu import _custom_dtype

    module = types.ModuleType("torch_npu._C._cd", "_cd bindings")
    for name in ("DType", "cast_to_fp8", "cast_to_fp8_noalloc", "cast_from_fp8"):
        setattr(module, name, getattr(_custom_dtype, name))
    return module
