"""The device primitives of ``torch.nn.DataParallel`` for npu tensors.

``torch.nn.parallel.comm`` (broadcast, scatter, gather; used by ``nn.DataParallel``'s
replicate/scatter/gather) calls ``torch._C._broadcast``, ``_broadcast_out``,
``_broadcast_coalesced``, ``_scatter``, ``_scatter_out``, ``_gather`` and ``_gather_out``,
which PyTorch defines in its CUDA build only. torch_npu defines them on ``torch._C`` for npu
devices (its ``initCommMethods``); these do the same with device copies, which queue on the
devices' current streams (a copy from another npu first waits for that device's stream).
Device indices are npu indices; ``_gather``'s destination ``-1`` is the CPU, ``None`` the
current npu.
"""

from typing import List, Optional, Sequence

import torch


def _npu(index: Optional[int]) -> torch.device:
    return torch.device("npu", torch.npu.current_device() if index is None else index)


def _wrap_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _check_npu_outputs(out: Sequence[torch.Tensor]) -> None:
    for i, o in enumerate(out):
        if o.device.type != "npu":
            raise RuntimeError(f"Expected all output tensors to be NPU tensors, but output tensor at index {i} "
                               f"has device '{o.device}'")


def _check_device_index(index: int) -> None:
    if index < 0:
        raise RuntimeError(f"Expected non-negative device index, but got {index}")


def _stream_for(streams, i: int, device_index: int):
    """The stream given for chunk i (checked against its device), or None."""
    stream = streams[i] if streams is not None and i < len(streams) else None
    if stream is not None and stream.device_index != device_index:
        raise RuntimeError(f"Expected the device associated with the stream at index {i} (was "
                           f"{stream.device_index}) to match the device supplied at that index (expected "
                           f"{device_index})")
    return stream


def _broadcast(tensor: torch.Tensor, devices: Sequence[int]) -> List[torch.Tensor]:
    """``tensor`` on each device; the tensor itself on its own device."""
    for d in devices:
        _check_device_index(d)
    own = tensor.get_device() if tensor.device.type == "npu" else None
    return [tensor if d == own else tensor.to(_npu(d), non_blocking=True) for d in devices]


def _broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    _check_npu_outputs(out)
    for i, o in enumerate(out):
        if o.shape != tensor.shape:
            raise RuntimeError(f"Expected all output tensors to have same shape as the source tensor "
                               f"{_shape(tensor)}, but output tensor at index {i} has shape {_shape(o)}")
    for o in out:
        o.copy_(tensor, non_blocking=True)
    return list(out)


def _broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[int],
                         buffer_size: int) -> List[List[torch.Tensor]]:
    """For each device the tensors on it; the first device must hold them and gets them.

    ``buffer_size`` only bounds CUDA's flattening of small tensors into one transfer; the
    copies here are per tensor (same results).
    """
    if not devices:
        raise RuntimeError("Expected at least one device to broadcast to")
    for t in tensors:
        if t.get_device() != devices[0]:
            raise RuntimeError(f"All tensors must be on devices[0]: {devices[0]}")
    # Fresh tensors with their own version counters, as CUDA's (re-wrapped after the split).
    return [list(tensors)] + [[t.detach().to(_npu(d), non_blocking=True) for t in tensors]
                              for d in devices[1:]]


def _scatter(tensor: torch.Tensor, devices: Sequence[int], chunk_sizes: Optional[Sequence[int]], dim: int,
             streams: Optional[Sequence[Optional[torch.Stream]]]) -> List[torch.Tensor]:
    """Chunks of ``tensor`` along ``dim``, chunk i on devices[i] (copied on streams[i] if given);
    a chunk already on its device is a view of ``tensor``."""
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None and len(chunk_sizes) != len(devices):
        raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got len(devices) = "
                           f"{len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}")
    dim = _wrap_dim(dim, tensor.dim())
    chunks = list(tensor.split_with_sizes(list(chunk_sizes), dim) if chunk_sizes is not None
                  else tensor.chunk(len(devices), dim))
    own = tensor.get_device() if tensor.device.type == "npu" else None
    for i, (chunk, d) in enumerate(zip(chunks, devices)):
        if d == own:
            continue
        stream = _stream_for(streams, i, d)
        _check_device_index(d)
        with torch.npu.stream(stream) if stream is not None else torch.npu.device(d):
            chunks[i] = chunk.to(_npu(d), non_blocking=True, memory_format=torch.preserve_format)
    return chunks


def _scatter_out(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int,
                 streams: Optional[Sequence[Optional[torch.Stream]]]) -> List[torch.Tensor]:
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = _wrap_dim(dim, tensor.dim())
    _check_npu_outputs(out)
    total = 0
    for i, o in enumerate(out):
        same = o.dim() == tensor.dim() and all(o.size(d) == tensor.size(d) for d in range(o.dim()) if d != dim)
        if not same:
            raise RuntimeError(f"Output tensor at index {i} has incorrect shape: {_shape(o)}. Expected same shape "
                               f"except for scatter dim {dim} as the source tensor: {_shape(tensor)}")
        total += o.size(dim)
    if total != tensor.size(dim):
        raise RuntimeError(f"Total size for output tensors along scatter dim {dim} does not match the source "
                           f"tensor size at dim {dim}. Expected {tensor.size(dim)}, but got total size {total}")
    chunks = tensor.split_with_sizes([o.size(dim) for o in out], dim)
    for i, (chunk, o) in enumerate(zip(chunks, out)):
        stream = _stream_for(streams, i, o.get_device())
        with torch.npu.stream(stream) if stream is not None else torch.npu.device(o.device):
            o.copy_(chunk, non_blocking=True)
    return list(out)


def _gathered_shape(tensors: Sequence[torch.Tensor], dim: int, device_text) -> List[int]:
    """The shape of the concatenation along ``dim`` (checked as torch's comm.gather checks)."""
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    expected = list(tensors[0].shape)
    total = 0
    for i, t in enumerate(tensors):
        if t.device.type != "npu":
            raise RuntimeError(f"Expected all input tensors to be NPU tensors, but tensor at index {i} has device "
                               f"{device_text(t.device)}")
        if t.dim() != len(expected):
            raise RuntimeError(f"Expected all input tensors to have the same number of dimensions, but tensor at "
                               f"index {i}has {t.dim()} dimensions, (expected {len(expected)})")
        expected[dim] = t.size(dim)
        if list(t.shape) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {_shape(t)}, but expected "
                               f"[{', '.join(map(str, expected))}]")
        total += t.size(dim)
    expected[dim] = total
    return expected


def _gather_into(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    for chunk, t in zip(out.split_with_sizes([t.size(dim) for t in tensors], dim), tensors):
        chunk.copy_(t, non_blocking=out.device.type == "npu")
    return out


def _gather(tensors: Sequence[torch.Tensor], dim: int, destination: Optional[int]) -> torch.Tensor:
    """The tensors concatenated along ``dim`` on the destination (-1: CPU, None: current npu),
    in their common memory format."""
    dim = _wrap_dim(dim, tensors[0].dim()) if tensors else dim
    shape = _gathered_shape(tensors, dim, str)
    first = tensors[0]
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(first.dim())
    if fmt is None or not all(t.is_contiguous(memory_format=fmt) and not t.is_contiguous() for t in tensors):
        fmt = torch.contiguous_format
    device = torch.device("cpu") if destination == -1 else _npu(destination)
    out = torch.empty(shape, dtype=first.dtype, device=device, memory_format=fmt)
    return _gather_into(tensors, out, dim)


def _gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    dim = _wrap_dim(dim, tensors[0].dim()) if tensors else dim
    shape = _gathered_shape(tensors, dim, lambda d: f"'{d}'")
    if list(out.shape) != shape:
        raise RuntimeError(f"Expected out tensor to have shape [{', '.join(map(str, shape))}], but got "
                           f"{_shape(out)}")
    return _gather_into(tensors, out, dim)


def _on_npu(values) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type == "npu":
            return True
        if isinstance(v, (list, tuple)) and _on_npu(v):
            return True
    return False


def _npu_or_original(ours, original):
    """A CUDA build of torch has these primitives for CUDA tensors: keep them for CUDA work
    and use ours for npu tensors (or when no CUDA device exists)."""
    def primitive(*args, **kwargs):
        if not torch.cuda.is_available() or _on_npu(args) or _on_npu(kwargs.values()):
            return ours(*args, **kwargs)
        return original(*args, **kwargs)
    primitive.__name__ = ours.__name__
    return primitive


def install() -> None:
    """Define the primitives on ``torch._C`` (CPU builds lack them; CUDA builds' serve CUDA only)."""
    for fn in (_broadcast, _broadcast_out, _broadcast_coalesced, _scatter, _scatter_out, _gather, _gather_out):
        original = getattr(torch._C, fn.__name__, None)
        setattr(torch._C, fn.__name__, fn if original is None else _npu_or_original(fn, original))
