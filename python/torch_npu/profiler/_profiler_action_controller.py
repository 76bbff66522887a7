"""``ProfActionController``: what a ``_ProfInterface`` session does when the schedule's
action changes from one step to the next, as torch_npu's.

``transit_action(prev, current)`` runs the calls of that transition: entering WARMUP
initializes and warms up a session, entering RECORD / RECORD_AND_SAVE starts one, leaving
RECORD_AND_SAVE stops and finalizes it and calls ``on_trace_ready(prof)``; ``current`` None
is the profiler's stop (a session still warming up is deleted: it recorded nothing). Odd
schedules (RECORD followed by WARMUP, ...) are warned about and handled.
"""
from functools import partial
from typing import Any, Callable, Optional

from .analysis.prof_common_func._constant import print_warn_msg
from .profiler_interface import _ProfInterface
from .scheduler import ProfilerAction, _from_torch_action

__all__ = []


class ProfActionController:
    def __init__(self, prof, prof_inst: _ProfInterface, on_trace_ready: Optional[Callable[..., Any]] = None) -> None:
        self.prof = prof
        self.prof_inst = prof_inst
        self.action_map = self._init_action_map()
        self.on_trace_ready = on_trace_ready

    def transit_action(self, prev_action, current_action) -> None:
        prev_action, current_action = _from_torch_action(prev_action), _from_torch_action(current_action)
        for action in self.action_map.get((prev_action, current_action)) or ():
            action()

    def _trace_ready(self) -> None:
        if self.on_trace_ready:
            self.on_trace_ready(self.prof)

    def _init_action_map(self) -> dict:
        p = self.prof_inst
        none, warmup, record, save = (ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
                                      ProfilerAction.RECORD_AND_SAVE)
        begin_warmup = [p.init_trace, p.warmup_trace]
        begin_record = [p.init_trace, p.start_trace]
        save_run = [p.stop_trace, p.finalize_trace, self._trace_ready]
        return {
            (none, none): [],
            (none, warmup): begin_warmup,
            (none, record): begin_record,
            (none, save): begin_record,
            (warmup, none): [partial(print_warn_msg, "Incorrect schedule: WARMUP followed by NONE"),
                             p.start_trace, p.stop_trace, p.finalize_trace],
            (warmup, warmup): [],
            (warmup, record): [p.start_trace],
            (warmup, save): [p.start_trace],
            (record, none): [partial(print_warn_msg, "Incorrect schedule: RECORD followed by NONE"),
                             p.stop_trace, p.finalize_trace],
            (record, warmup): [partial(print_warn_msg, "Incorrect schedule: RECORD followed by WARMUP"),
                               p.stop_trace, p.finalize_trace],
            (record, record): [],
            (record, save): [],
            (save, none): save_run,
            (save, warmup): save_run + begin_warmup,
            (save, record): save_run + begin_record,
            (save, save): save_run + begin_record,
            # the profiler stops
            (warmup, None): [partial(print_warn_msg, "Incorrect schedule: Stop profiler while current state is "
                                                     "WARMUP which will result in empty parsed data."),
                             p.finalize_trace, p.delete_prof_dir],
            (record, None): [partial(print_warn_msg, "Incorrect schedule: Stop profiler while current state is "
                                                     "RECORD which may result in incomplete parsed data."),
                             p.stop_trace, p.finalize_trace, self._trace_ready],
            (save, None): [partial(print_warn_msg, "Stop profiler while current state is RECORD_AND_SAVE, "
                                                   "perhaps the scheduling cycle has not yet completed."),
                           p.stop_trace, p.finalize_trace, self._trace_ready],
        }
