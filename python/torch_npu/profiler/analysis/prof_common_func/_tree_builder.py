"""``TreeBuilder``: the call tree of the host ops of a thread (``TorchOpNode``\\ s), as torch_npu's.

``build_tree(event_list, enqueue_list)`` sorts ops and enqueue marks by start; an op becomes a
child of the innermost open op (one whose end is not before its start), an enqueue mark adds
its correlation id to the innermost open op of the same thread. It returns every node, the
(event-less) root first and then the ops in start order. ``update_tree_node_info(ts, root)``
gives the id ``ts`` to the ops whose ranges hold ``ts`` (all as total, the innermost as self);
``match_self_torch_op(ts, root)`` is that innermost op (None when no op holds ``ts``).
"""
from ..prof_bean._torch_op_node import TorchOpNode

__all__ = []


class TreeBuilder:
    @classmethod
    def build_tree(cls, event_list: list, enqueue_list: list) -> list:
        root = TorchOpNode()
        nodes = [root]
        current = root
        for event in sorted(list(event_list) + list(enqueue_list), key=lambda e: e.ts):
            while current is not root and event.ts > current.end_time:
                current = current.parent_node  # the open op ended before this event
            if event.is_torch_op:
                node = TorchOpNode(event, current)
                current.add_child_node(node)
                nodes.append(node)
                current = node
            elif current.event is not None and current.event.tid == event.tid:
                current.update_corr_id(event.corr_id)
        return nodes

    @classmethod
    def _path_to(cls, ts: int, root_node: TorchOpNode) -> list:
        """The ops whose ranges hold ``ts``, outermost first."""
        path = []
        node = root_node.match_child_node(ts)
        while node is not None:
            path.append(node)
            node = node.match_child_node(ts)
        return path

    @classmethod
    def update_tree_node_info(cls, acl_ts: int, root_node: TorchOpNode):
        path = cls._path_to(acl_ts, root_node)
        for node in path:
            node.update_corr_id_total(acl_ts)
        if path:
            path[-1].update_corr_id_self(acl_ts)

    @classmethod
    def match_self_torch_op(cls, ts: int, root_node: TorchOpNode):
        path = cls._path_to(ts, root_node)
        return path[-1] if path else None
