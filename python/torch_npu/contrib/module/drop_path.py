import torch
from torch import nn

__all__ = ["NpuDropPath"]


def _npu_drop_path(x, random_tensor, keep_prob):
    """x / keep_prob where floor(keep_prob + u) is 1, else 0 (u: the pre-generated uniforms)."""
    random_tensor += keep_prob
    random_tensor.floor_()
    return x.div(keep_prob) * random_tensor


class _DropPathTask:
    """The uniforms wanted for one (shape, device, dtype): how many a forward pass uses and
    those generated ahead on NpuDropPath.droppath_stream."""

    def __init__(self, shape, device, dtype, ndim):
        self.shape = shape
        self.device = device
        self.dtype = dtype
        self.ndim = ndim
        self.request_count = 0
        self.rand_queue = []


class NpuDropPath(nn.Module):
    """Stochastic depth (drop paths per sample) with the random tensors generated ahead of
    time on a side stream, as torch_npu's NpuDropPath.

    As in torch_npu, samples are dropped only with the ensemble enabled
    (``NpuDropPath.enable_droppath_ensemble(model)``): its forward pre-hooks generate, on
    ``NpuDropPath.droppath_stream``, the uniforms that the drop paths of the *next* forward
    pass consume. A forward with no pre-generated tensor for the input's (shape, device,
    dtype) registers the need and returns ``x`` unchanged (so does a drop path outside
    training or with ``drop_prob == 0``); a kept sample is scaled by ``1 / (1 - drop_prob)``.
    """
    task_dict = {}
    droppath_stream = None

    def __init__(self, drop_prob=None):
        super().__init__()
        if drop_prob is None or not 0 <= drop_prob < 1:
            raise ValueError(f"NpuDropPath: expected drop_prob in [0, 1), got {drop_prob!r}")
        self.drop_prob = drop_prob
        self.keep_prob = 1 - drop_prob

    def forward(self, x):
        if self.drop_prob == 0. or not self.training:
            return x
        if not isinstance(x, torch.Tensor):
            # RuntimeError, as torch_npu raises for a wrong input type.
            raise RuntimeError(f"NpuDropPath: expected a Tensor input, got {type(x).__name__}")
        key = (x.shape, x.device, x.dtype, x.ndim)
        task = NpuDropPath.task_dict.get(key)
        if task is None:
            task = NpuDropPath.task_dict[key] = _DropPathTask(x.shape, x.device, x.dtype, x.ndim)
        if not task.rand_queue:
            task.request_count += 1
            return x
        random_tensor = task.rand_queue.pop(0)
        if random_tensor.device.type != "cpu":
            # Made on droppath_stream, consumed (and freed) on this one.
            random_tensor.record_stream(torch.npu.current_stream(random_tensor.device))
        return _npu_drop_path(x, random_tensor, self.keep_prob)

    @classmethod
    def enable_droppath_ensemble(cls, model):
        """Register the forward pre-hooks on ``model`` that make the current stream wait for
        ``droppath_stream`` and then queue on it the uniforms of the next forward pass."""
        if cls.droppath_stream is None:
            cls.droppath_stream = torch.npu.Stream()

        def wait_stream(module, inputs):
            torch.npu.current_stream().wait_stream(cls.droppath_stream)

        def generate(module, inputs):
            # The uniforms freed since were used on the current stream: their memory may
            # only be reused on droppath_stream after that use.
            cls.droppath_stream.wait_stream(torch.npu.current_stream())
            with torch.npu.stream(cls.droppath_stream), torch.no_grad():
                for task in cls.task_dict.values():
                    shape = (task.shape[0],) + (1,) * (task.ndim - 1)
                    while len(task.rand_queue) < task.request_count:
                        task.rand_queue.append(torch.rand(shape, dtype=task.dtype, device=task.device))

        model.register_forward_pre_hook(wait_stream)
        model.register_forward_pre_hook(generate)
