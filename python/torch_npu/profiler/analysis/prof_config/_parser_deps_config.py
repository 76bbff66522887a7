"""``ParserDepsConfig``: each parser's dependencies (the parsers whose output it reads) and
how the task manager runs it, for a run with msprof data (``COMMON_CONFIG``) and for a run
with host data only (``ONLY_FWK_CONFIG``)."""
from ..prof_common_func._constant import Constant
from ..prof_common_func._task_manager import ConcurrentMode

__all__ = []

_THREAD, _PROCESS = ConcurrentMode.PTHREAD, ConcurrentMode.SUB_PROCESS
_TORCH_OP, _TASK_QUEUE = Constant.TORCH_OP_PARSER, Constant.TASK_QUEUE_PARSER
_TREE, _TIMELINE, _RELATION = Constant.TREE_BUILD_PARSER, Constant.CANN_TIMELINE_PARSER, Constant.RELATION_PARSER
_EXPORT, _ANALYZE = Constant.CANN_EXPORT_PARSER, Constant.CANN_ANALYZE_PARSER


def _task(mode: int, *deps: str) -> dict:
    return {Constant.MODE: mode, Constant.DEPS: list(deps)}


class ParserDepsConfig:
    COMMON_CONFIG = {
        _TORCH_OP: _task(_THREAD),
        _TASK_QUEUE: _task(_THREAD),
        Constant.TRACE_PRE_PARSER: _task(_PROCESS, _TORCH_OP, _TASK_QUEUE),
        _TREE: _task(_THREAD, _TORCH_OP, _TASK_QUEUE),
        _EXPORT: _task(_PROCESS),
        # it waits for msprof's export; the run does not wait for it
        _TIMELINE: _task(ConcurrentMode.NON_BLOCKING | _THREAD),
        _RELATION: _task(_THREAD, _TASK_QUEUE, _TIMELINE),
        _ANALYZE: _task(_PROCESS, _TIMELINE),
        Constant.OPERATOR_VIEW_PARSER: _task(_PROCESS, _TREE, _TIMELINE, _RELATION, _TORCH_OP),
        Constant.TRACE_VIEW_PARSER: _task(_PROCESS, _TREE, Constant.TRACE_PRE_PARSER, _TIMELINE, _TASK_QUEUE,
                                          _TORCH_OP),
        Constant.KERNEL_VIEW_PARSER: _task(_PROCESS, _TREE, _EXPORT, _RELATION),
        Constant.TRACE_STEP_TIME_PARSER: _task(_PROCESS, _TREE, _TIMELINE, _RELATION, _TORCH_OP),
        Constant.MEMORY_VIEW_PARSER: _task(_PROCESS, _EXPORT, Constant.MEMORY_PREPARE),
        Constant.INTEGRATE_PARSER: _task(_PROCESS, _EXPORT),
        Constant.COMMUNICATION_PARSER: _task(_PROCESS, _TREE, _ANALYZE, _RELATION),
        Constant.STACK_VIEW_PARSER: _task(_PROCESS, _TREE, _TIMELINE, _TASK_QUEUE, _TORCH_OP),
        Constant.MEMORY_PREPARE: _task(_THREAD, _TREE, _TASK_QUEUE, _TORCH_OP),
        Constant.DB_PRE_PARSER: _task(_THREAD, _TORCH_OP, _TASK_QUEUE),
        Constant.DB_PARSER: _task(_THREAD, _EXPORT, Constant.MEMORY_PREPARE, _TREE, _ANALYZE,
                                  Constant.DB_PRE_PARSER),
        Constant.MEMORY_TIMELINE_PARSER: {},
    }

    ONLY_FWK_CONFIG = {
        _TORCH_OP: _task(_THREAD),
        _TASK_QUEUE: _task(_THREAD),
        _TREE: _task(_THREAD, _TORCH_OP, _TASK_QUEUE),
        Constant.OPERATOR_VIEW_PARSER: _task(_PROCESS, _TORCH_OP),
        Constant.TRACE_VIEW_PARSER: _task(_PROCESS, _TASK_QUEUE, _TORCH_OP),
        Constant.MEMORY_VIEW_PARSER: _task(_PROCESS, Constant.MEMORY_PREPARE),
        Constant.STACK_VIEW_PARSER: _task(_PROCESS, _TORCH_OP, _TASK_QUEUE),
        _EXPORT: _task(_PROCESS),
        Constant.DB_PRE_PARSER: _task(_THREAD, _TORCH_OP, _TASK_QUEUE),
        Constant.MEMORY_PREPARE: _task(_THREAD, _TASK_QUEUE, _TORCH_OP),
        Constant.DB_PARSER: _task(_THREAD, Constant.DB_PRE_PARSER, Constant.MEMORY_PREPARE, _TREE),
        Constant.MEMORY_TIMELINE_PARSER: {},
    }
