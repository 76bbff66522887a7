"""The parsers of the host records (FRAMEWORK/), as torch_npu's: ``TorchOpParser`` (the host
ops), ``TaskQueueParser`` (enqueues and dequeues), ``TreeBuildParser`` (the op tree: its
root, then every op), ``TracePreParser`` (writes the host side of trace_view.json, left open
for the device side) and ``DbPreParser`` (the PYTORCH_API rows of the db export). Each
returns (``Constant.SUCCESS``, its output) or (``Constant.FAIL``, an empty output)."""
import os

from ...prof_common_func._constant import Constant
from ...prof_common_func._file_manager import FileManager
from ...prof_common_func._file_tag import FileTag
from ...prof_common_func._log import ProfilerLogger
from ...prof_parse._fwk_file_parser import FwkFileParser
from .._base_parser import BaseParser

__all__ = []


def _task_queue(deps_data: dict) -> tuple:
    """(enqueues, dequeues) of the TaskQueueParser's output."""
    task_queue_data = deps_data.get(Constant.TASK_QUEUE_PARSER, {})
    return task_queue_data.get(Constant.ENQUEUE_DATA, []), task_queue_data.get(Constant.DEQUEUE_DATA, [])


class _FwkPreParser(BaseParser):
    """A parser whose run is ``produce(deps_data)`` in the parse's log; on an error it gives
    (FAIL, ``_fail_output()``)."""
    ERROR = ""

    def _fail_output(self):
        return None

    def run(self, deps_data: dict):
        return self._run_logged(lambda: self.produce(deps_data), self.ERROR, self._fail_output())

    def produce(self, deps_data: dict):
        raise NotImplementedError


class TracePreParser(_FwkPreParser):
    ERROR = "Failed to create prepare trace json"

    def produce(self, deps_data: dict):
        enqueue_data, dequeue_data = _task_queue(deps_data)
        fwk_trace_data = FwkFileParser(self._profiler_path).get_fwk_trace_data(
            deps_data.get(Constant.TORCH_OP_PARSER, []), enqueue_data, dequeue_data)
        trace_file_path = (os.path.join(self._output_path, Constant.TRACE_VIEW) if os.path.isdir(self._output_path)
                           else self._output_path)
        FileManager.create_prepare_trace_json_by_path(trace_file_path, fwk_trace_data)


class TreeBuildParser(_FwkPreParser):
    ERROR = "Failed to build torch op tree"

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        # its log is opened when it is made: the task manager runs it in a thread
        ProfilerLogger.init(self._profiler_path, "TreeBuildParser")
        self.logger = ProfilerLogger.get_instance()

    def _fail_output(self):
        return []

    def produce(self, deps_data: dict):
        enqueue_data, _ = _task_queue(deps_data)
        return FwkFileParser(self._profiler_path).get_torch_op_tree_node(
            deps_data.get(Constant.TORCH_OP_PARSER, []), enqueue_data)


class TaskQueueParser(_FwkPreParser):
    ERROR = "Failed to get task queue data"

    def _fail_output(self):
        return {}

    def produce(self, deps_data: dict):
        enqueue_data, dequeue_data = FwkFileParser(self._profiler_path).get_task_queue_data()
        return {Constant.ENQUEUE_DATA: enqueue_data, Constant.DEQUEUE_DATA: dequeue_data}


class TorchOpParser(_FwkPreParser):
    ERROR = "Failed to get torch op tree"

    def _fail_output(self):
        return []

    def produce(self, deps_data: dict):
        return FwkFileParser(self._profiler_path).get_file_data_by_tag(FileTag.TORCH_OP)


class DbPreParser(_FwkPreParser):
    ERROR = "Failed to create prepare db data"

    def produce(self, deps_data: dict):
        enqueue_data, dequeue_data = _task_queue(deps_data)
        return FwkFileParser(self._profiler_path).get_fwk_api(
            deps_data.get(Constant.TORCH_OP_PARSER, []), enqueue_data, dequeue_data)
