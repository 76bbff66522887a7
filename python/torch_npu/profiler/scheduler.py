"""``torch_npu.profiler.schedule`` (the class ``Schedule``), as in torch_npu.

Unlike ``torch.profiler.schedule`` (a closure that raises on bad arguments), torch_npu's
schedule is an object that keeps its settings as attributes (``wait``, ``active``, ...)
and resets an invalid one to its default with a warning, so a training script with a bad
config keeps running. Its actions are torch_npu's ``ProfilerAction`` (an Enum of its own, as
in torch_npu, with torch.profiler.ProfilerAction's members NONE ... RECORD_AND_SAVE);
``torch_npu.profiler.profile`` (a torch.profiler.profile) takes schedules returning either.
"""
import warnings
from enum import Enum

import torch.profiler

__all__ = ["ProfilerAction", "Schedule"]


class ProfilerAction(Enum):
    """What the profiler does at a step: nothing, warm up, record, or record and save."""
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def _to_torch_action(action):
    """torch.profiler.ProfilerAction of the same name (torch's profile drives on those)."""
    return torch.profiler.ProfilerAction[action.name] if isinstance(action, ProfilerAction) else action


def _from_torch_action(action):
    """torch_npu's ProfilerAction of a torch.profiler.ProfilerAction (others unchanged)."""
    if isinstance(action, torch.profiler.ProfilerAction):
        return ProfilerAction.__members__.get(action.name, action)
    return action


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
