"""Combined (flattened) tensors, as torch_npu.utils has them: many tensors re-pointed into
one flat npu buffer, so that one kernel can update all of them (torch_npu.optim)."""
import torch

__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid"]


def npu_combine_tensors(list_of_tensor, require_copy_value=True):
    r"""Moves every tensor of ``list_of_tensor`` into one new flat npu buffer and returns it.

    Each tensor keeps its identity (the same Python object, same shape and strides) but its
    storage becomes a slice of the returned buffer, in list order. With
    ``require_copy_value=False`` the values are not copied (the tensors read zeros).
    Returns ``None`` for an empty list or when all tensors are empty.

    The tensors must be contiguous npu tensors of one dtype. Each gets its own storage
    over its part of the buffer (as torch_npu's do: ``get_storage_size(t)`` stays
    ``t.numel()``), which keeps the buffer alive. Anything that later replaces such a
    tensor's storage (``t.data = ...``, ``t.set_(...)``) detaches it from the buffer.
    """
    if len(list_of_tensor) == 0:
        return None
    if any(t is None for t in list_of_tensor):
        raise RuntimeError("Tensors to combine must not have `None`.")
    dtype = list_of_tensor[0].dtype
    device = list_of_tensor[0].device
    total = 0
    for t in list_of_tensor:
        if t.dtype != dtype:
            raise RuntimeError("Tensors to combine must have the same dtype.")
        if t.device.type != "npu":
            raise RuntimeError("Tensors to combine must be on NPU, got {}.".format(t.device.type))
        if t.device != device:
            raise RuntimeError("Tensors to combine must be on one device, got {} and {}.".format(device, t.device))
        if not t.is_contiguous():
            raise RuntimeError("Tensors to combine must be contiguous.")
        total += t.numel()
    if total == 0:
        return None
    combined = torch.zeros(total, dtype=dtype, device=device)
    storage = combined.untyped_storage()
    offset = 0
    # A kernel still queued on a tensor (e.g. the fill of a fresh zeros_like) must finish
    # before the tensor is re-pointed: its completion would otherwise map the tensor back
    # to the storage it was launched on.
    torch.npu.current_stream(device).synchronize()
    with torch.no_grad():
        for t in list_of_tensor:
            n = t.numel()
            if require_copy_value:
                combined[offset:offset + n].copy_(t.reshape(-1))
            _repoint(t, storage, offset, n)
            offset += n
    return combined


def _repoint(dst, storage, index, numel):
    """Give ``dst`` a storage of ``numel`` elements over ``storage``'s elements from ``index``
    (the new storage keeps ``storage`` alive); dst keeps sizes, strides and offset."""
    itemsize = dst.element_size()
    part = storage[index * itemsize:(index + numel) * itemsize]
    with torch.no_grad():
        dst.set_(part, dst.storage_offset(), dst.size(), dst.stride())


def get_part_combined_tensor(combined_tensor, index, size):
    r"""The flat slice ``[index, index + size)`` of a combined buffer (sharing its memory),
    or ``None`` when ``combined_tensor`` is ``None`` or ``size`` is 0."""
    if combined_tensor is None or size == 0:
        return None
    if index + size > combined_tensor.numel():
        raise RuntimeError("(index + size) ({}) > combined_tensor.numel() ({})".format(
            index + size, combined_tensor.numel()))
    return combined_tensor.view(-1)[index:index + size]


def is_combined_tensor_valid(combined_tensor, list_of_tensor):
    r"""Whether every tensor of ``list_of_tensor`` still lives inside ``combined_tensor``."""
    if len(list_of_tensor) == 0:
        return True
    if combined_tensor is None:
        return False
    start = combined_tensor.data_ptr()
    end = start + combined_tensor.numel() * combined_tensor.element_size()
    for t in list_of_tensor:
        if t is None or not t.is_contiguous() or t.device != combined_tensor.device:
            return False
        if not (start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= end):
            return False
    return True
