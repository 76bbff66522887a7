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


def _check_out_shapes(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: Optional[int] = None) -> None:
    for i, o in enumerate(out):
        same = o.dim() == tensor.dim() and all(
            o.size(d) == tensor.size(d) for d in range(tensor.dim()) if d != dim)
        if not same:
            what = f"except dimension {dim} " if dim is not None else ""
            raise RuntimeError(f"Output tensor at index {i} has a shape {list(o.shape)} that does not match "
                               f"the input's {list(tensor.shape)} {what}(torch.nn.parallel.comm on npu)")


def _broadcast(tensor: torch.Tensor, devices: Sequence[int]) -> List[torch.Tensor]:
    """``tensor`` on each device; the tensor itself on its own device."""
    return [tensor if tensor.device == _npu(d) else tensor.to(_npu(d)) for d in devices]


def _broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    _check_out_shapes(tensor, out)
    for o in out:
        o.copy_(tensor)
    return list(out)


def _broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[int],
                         buffer_size: int) -> List[List[torch.Tensor]]:
    """For each device the tensors on it; the first device must hold them and gets them.

    ``buffer_size`` only bounds CUDA's flattening of small tensors into one transfer; the
    copies here are per tensor (same results).
    """
    if not devices:
        raise RuntimeError("_broadcast_coalesced: expected at least one device")
    source = _npu(devices[0])
    for t in tensors:
        if t.device != source:
            raise RuntimeError(f"_broadcast_coalesced: all tensors must be on devices[0] ({source}), "
                               f"got one on {t.device}")
    return [list(tensors)] + [[t.to(_npu(d)) for t in tensors] for d in devices[1:]]


def _scatter(tensor: torch.Tensor, devices: Sequence[int], chunk_sizes: Optional[Sequence[int]], dim: int,
             streams: Optional[Sequence[Optional[torch.Stream]]]) -> List[torch.Tensor]:
    """Chunks of ``tensor`` along ``dim``, chunk i on devices[i] (copied on streams[i] if given)."""
    if chunk_sizes is not None:
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, got "
                               f"{len(devices)} and {len(chunk_sizes)}")
        if sum(chunk_sizes) != tensor.size(dim):
            raise RuntimeError(f"Chunk sizes {list(chunk_sizes)} do not sum to the size of dimension {dim} "
                               f"({tensor.size(dim)})")
        chunks = tensor.split(list(chunk_sizes), dim)
    else:
        chunks = tensor.chunk(len(devices), dim)
    out = []
    for i, (chunk, d) in enumerate(zip(chunks, devices)):
        stream = streams[i] if streams else None
        with torch.npu.stream(stream) if stream is not None else torch.npu.device(d):
            out.append(chunk.to(_npu(d), non_blocking=True))
    return out


def _scatter_out(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int,
                 streams: Optional[Sequence[Optional[torch.Stream]]]) -> List[torch.Tensor]:
    _check_out_shapes(tensor, out, dim)
    chunks = tensor.split([o.size(dim) for o in out], dim)
    for i, (chunk, o) in enumerate(zip(chunks, out)):
        stream = streams[i] if streams else None
        with torch.npu.stream(stream) if stream is not None else torch.npu.device(o.device):
            o.copy_(chunk, non_blocking=True)
    return list(out)


def _gather(tensors: Sequence[torch.Tensor], dim: int, destination: Optional[int]) -> torch.Tensor:
    """The tensors concatenated along ``dim`` on the destination (-1: CPU, None: current npu)."""
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    device = torch.device("cpu") if destination == -1 else _npu(destination)
    return torch.cat([t.to(device) for t in tensors], dim)


def _gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    return torch.cat([t.to(out.device) for t in tensors], dim, out=out)


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
