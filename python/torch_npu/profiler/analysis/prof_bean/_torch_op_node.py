"""``TorchOpNode``: a host op (a ``TorchOpBean``-like event) in the call tree of a thread:
children in start order, self / total host duration (ns), and the correlation ids of the
device tasks it launched (``corr_id_self``) and those of its subtree (``corr_id_total``)."""
from ..prof_common_func._constant import Constant

__all__ = []


class TorchOpNode:
    def __init__(self, event=None, parent_node=None):
        self._event = event
        self._parent_node = parent_node
        self._child_list = []
        self._corr_id_total = []
        self._corr_id_self = []

    @property
    def event(self):
        return self._event

    @property
    def pid(self):
        return self._event.pid

    @property
    def name(self):
        return self._event.name

    @property
    def input_shape(self):
        return self._event.args.get(Constant.INPUT_SHAPES, "")

    @property
    def call_stack(self):
        return self._event.call_stack

    @property
    def start_time(self) -> int:
        return self._event.ts

    @property
    def end_time(self) -> int:
        return self._event.end_ns

    @property
    def host_self_dur(self):
        return self._event.dur - sum(node.event.dur for node in self._child_list)

    @property
    def host_total_dur(self):
        return self._event.dur

    @property
    def child_node_list(self) -> list:
        return self._child_list

    @property
    def parent_node(self):
        return self._parent_node

    @property
    def corr_id_total(self) -> list:
        return self._corr_id_total

    @property
    def corr_id_self(self) -> list:
        return self._corr_id_self

    def is_profiler_step(self) -> bool:
        return "ProfilerStep#" in self._event.name

    def add_child_node(self, child_node):
        self._child_list.append(child_node)

    def match_child_node(self, ts_time: int):
        """The child whose range holds ``ts_time`` (the last one starting at or before it), or None."""
        lo, hi = 0, len(self._child_list)
        while lo < hi:  # first child starting after ts_time
            mid = (lo + hi) // 2
            if self._child_list[mid].start_time <= ts_time:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        child = self._child_list[lo - 1]
        return child if child.end_time > ts_time else None

    def update_corr_id_total(self, corr_id: int):
        self._corr_id_total.append(corr_id)

    def update_corr_id_self(self, corr_id: int):
        self._corr_id_self.append(corr_id)

    def update_corr_id(self, corr_id: int):
        """A device task launched by this op: its own id, and that of every op with a parent on
        the way up (the root, a step, keeps only its own)."""
        self.update_corr_id_self(corr_id)
        node = self
        while node.parent_node:
            node.update_corr_id_total(corr_id)
            node = node.parent_node
