"""``RelationParser``: the kernel dict of the run (host launch or dequeue correlation id ->
the device tasks it started, ``FwkCANNRelationParser.get_kernel_dict``), as torch_npu's."""
from ...prof_common_func._constant import Constant
from ...prof_parse._fwk_cann_relation_parser import FwkCANNRelationParser
from ._fwk_pre_parser import _FwkPreParser, _task_queue

__all__ = []


class RelationParser(_FwkPreParser):
    ERROR = "Failed to get acl to npu flow dict"

    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._dequeue_data = []

    def _fail_output(self):
        return {}

    def produce(self, deps_data: dict):
        _, self._dequeue_data = _task_queue(deps_data)
        return FwkCANNRelationParser(self._profiler_path).get_kernel_dict(self._dequeue_data)
