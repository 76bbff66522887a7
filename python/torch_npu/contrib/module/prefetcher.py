import torch

__all__ = ["Prefetcher"]


def _to_npu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.npu(non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_npu(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_npu(v) for k, v in obj.items()}
    return obj


class Prefetcher(object):
    """Copies the next batch of ``loader`` to the npu on a side stream while the current
    one is used. ``next()`` returns the batch (on npu), or None when the loader is done."""

    def __init__(self, loader, stream=None):
        self.loader = iter(loader)
        self.stream = stream if stream is not None else torch.npu.Stream()
        self.next_batch = None
        self.preload()

    def preload(self):
        try:
            batch = next(self.loader)
        except StopIteration:
            self.next_batch = None
            return
        with torch.npu.stream(self.stream):
            self.next_batch = _to_npu(batch)

    def next(self):
        current = torch.npu.current_stream()
        current.wait_stream(self.stream)
        batch = self.next_batch
        if batch is not None:
            # The batch was allocated on the side stream and is used on this one: without
            # record_stream, its memory could go to the next preload while still in use.
            torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.record_stream(current), batch)
            self.preload()
        return batch
