import torch

__all__ = ["NpuPreGenDropout"]


class _PreGenMasks:
    """A buffer of pre-drawn keep-masks for one probability, consumed front to back."""

    def __init__(self, device, p, numel):
        self.device, self.p, self.numel = device, p, numel
        self.mask, self.idx = None, 0

    def generate(self):
        self.mask = torch.rand(self.numel, device=self.device) >= self.p
        self.idx = 0

    def take(self, n):
        if self.idx + n > self.mask.numel():  # ran out: grow, so the next generation fits the model
            self.numel = max(self.numel, 2 * (self.idx + n))
            self.generate()
        out = self.mask[self.idx:self.idx + n]
        self.idx += n
        return out


class NpuPreGenDropout(torch.nn.Dropout):
    """Dropout whose masks are drawn ahead of time, as torch_npu's: ``enable_dropout_ensemble(model)``
    draws a buffer of masks per registered probability on a side stream after every forward
    of ``model``, and the next forward waits for it and consumes masks from the buffer.

    Args:
        p (float): probability of an element to be zeroed.
        module_name (str): the name of the model (informational).
    forward(x) returns ``x * mask / (1 - p)`` in training (x in eval); forward([shape, dtype,
    device]) returns the next keep-mask of that shape (bool; torch_npu returns its bit-packed
    form for npu_dropout_do_mask).
    """

    prob = set()
    task_dict = {}
    dropout_stream = None
    initial_numel = 1 << 22

    def __init__(self, p, module_name=None):
        super().__init__(p)
        self.module_name = module_name
        NpuPreGenDropout.prob.add(p)

    def forward(self, x):
        if isinstance(x, torch.Tensor):
            shape, apply = x.shape, True
        elif isinstance(x, (list, tuple)) and len(x) == 3:
            shape, apply = torch.Size(x[0]), False
        else:
            # RuntimeError, as torch_npu raises for a wrong input type.
            raise RuntimeError(f"NpuPreGenDropout: expected a tensor or [shape, dtype, device], got {type(x).__name__}")
        if self.p == 0 or (apply and not self.training):
            return x if apply else None
        task = NpuPreGenDropout.task_dict.get(self.p)
        if task is None:
            raise RuntimeError(f"NpuPreGenDropout: no masks for p={self.p}; registered: "
                               f"{sorted(NpuPreGenDropout.task_dict)} (call NpuPreGenDropout.enable_dropout_ensemble"
                               f"(model) after creating the model)")
        mask = task.take(shape.numel()).view(shape)
        if not apply:
            return mask
        return x * mask.to(x.dtype) * (1.0 / (1.0 - self.p))

    @classmethod
    def enable_dropout_ensemble(cls, model):
        if cls.dropout_stream is None:
            cls.dropout_stream = torch.npu.Stream()
        device = torch.device("npu", torch.npu.current_device())
        with torch.npu.stream(cls.dropout_stream):
            for p in cls.prob:
                cls.task_dict[p] = _PreGenMasks(device, p, cls.initial_numel)
                cls.task_dict[p].generate()

        def wait_for_masks(module, inputs):
            torch.npu.current_stream().wait_stream(cls.dropout_stream)

        def regenerate(module, inputs, outputs):
            cls.dropout_stream.wait_stream(torch.npu.current_stream())
            with torch.npu.stream(cls.dropout_stream):
                for task in cls.task_dict.values():
                    task.generate()

        model.register_forward_pre_hook(wait_for_masks)
        model.register_forward_hook(regenerate)
        return model
