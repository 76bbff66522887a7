"""``torch_npu.profiler.schedule`` (the class ``Schedule``), as in torch_npu.

Unlike ``torch.profiler.schedule`` (a closure that raises on bad arguments), torch_npu's
schedule is an object that keeps its settings as attributes (``wait``, ``active``, ...)
and resets an invalid one to its default with a warning, so a training script with a bad
config keeps running. The actions are torch's ``ProfilerAction`` members, so the object
drives ``torch_npu.profiler.profile`` (a torch.profiler.profile) directly.
"""
import warnings

from torch.profiler import ProfilerAction

__all__ = ["ProfilerAction", "Schedule"]


def _warn(msg: str) -> None:
    warnings.warn(f"[torch_npu.profiler] {msg}", stacklevel=4)  # the caller of Schedule()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Schedule:
    """Skip the first ``skip_first`` steps, then cycle: ``wait`` idle steps, ``warmup``
    steps, ``active`` recorded steps (the last one saves the trace). ``repeat`` cycles
    (0: until profiling stops). With ``skip_first_wait`` non-zero the first cycle starts
    without its ``wait`` steps (later cycles still wait)."""

    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0,
                 skip_first_wait: int = 0) -> None:
        self.wait = wait
        self.active = active
        self.warmup = warmup
        self.repeat = repeat
        self.skip_first = skip_first
        self.skip_first_wait = skip_first_wait
        self._check_params()

    def __call__(self, step: int) -> ProfilerAction:
        if not _is_int(step) or step < 0:
            raise ValueError(f"schedule: step must be an int >= 0, got {step!r}")
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait != 0:
            step += self.wait  # as if the first cycle's wait had already passed
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step >= self.repeat * cycle:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < self.wait:
            return ProfilerAction.NONE
        if pos < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    def _check_params(self) -> None:
        # (name, smallest valid value, default)
        for name, low, default in (("wait", 0, 0), ("warmup", 0, 0), ("active", 1, 1), ("repeat", 0, 0),
                                   ("skip_first", 0, 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                _warn(f"Invalid parameter {name} {value!r} (expected an int >= {low}), reset it to {default}.")
                setattr(self, name, default)
        if not _is_int(self.skip_first_wait):
            _warn(f"Invalid parameter skip_first_wait {self.skip_first_wait!r} (expected an int), reset it to 0.")
            self.skip_first_wait = 0
        if self.warmup == 0:
            _warn("Profiler won't be using warmup, this can skew profiler results")

    def __repr__(self) -> str:
        return (f"Schedule(wait={self.wait}, active={self.active}, warmup={self.warmup}, repeat={self.repeat}, "
                f"skip_first={self.skip_first}, skip_first_wait={self.skip_first_wait})")
