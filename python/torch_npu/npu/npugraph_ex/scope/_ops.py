"""``npugraph_ex::scope_enter`` / ``scope_exit``: the operators the scopes are made of.

A scope is entered and left through two operators with side effects, so that Dynamo and
AOTAutograd keep them in the graph (in order, around the operators of the scope) instead of
breaking the graph at the ``with``. Run (eagerly, or when a compiled graph is warmed up and
captured), they apply the scope's attributes and restore what was there before:

* ``_op_aicore_num`` / ``_op_vectorcore_num`` (``limit_core_num``): the cube / vector core
  limits of the stream (``torch.npu.set_stream_limit``), the scope's stream or the current one;
* ``_deterministic_level`` (``deterministic``): ``torch.use_deterministic_algorithms`` and
  ``torch.npu``'s deterministic level.

The ``npugraph_ex`` backend also records each scope's attributes on the FX nodes of its
operators (``node.meta["npugraph_ex_scope"]``), as torch_npu records them as operator
attributes for the graph it builds. Tracing (fake tensors) does nothing.
"""
from typing import List

import torch
from torch.fx.node import has_side_effect

_lib = torch.library.Library("npugraph_ex", "FRAGMENT")
_lib.define("scope_enter(str[] keys, str[] values, int stream_id=-1) -> ()")
_lib.define("scope_exit() -> ()")

# Saved states of the scopes entered (innermost last), per thread of execution.
_stack: List[list] = []
_streams = {}  # stream_id -> torch.npu.Stream, for scopes given a stream


def _stream(stream_id: int):
    return _streams[stream_id] if stream_id != -1 else torch.npu.current_stream()


def _enter(keys: List[str], values: List[str], stream_id: int = -1) -> None:
    import torch_npu

    attrs = dict(zip(keys, values))
    restore = []
    if "_op_aicore_num" in attrs or "_op_vectorcore_num" in attrs:
        from torch_npu.npu import npu_config

        stream = _stream(stream_id)
        key = npu_config._stream_key(stream, "limit_core_num")
        with npu_config._lock:
            before = dict(npu_config._stream_limits[key]) if key in npu_config._stream_limits else None
        torch_npu.npu.set_stream_limit(stream, int(attrs.get("_op_aicore_num", -1)),
                                       int(attrs.get("_op_vectorcore_num", -1)))
        restore.append(("limit", key, before))
    if "_deterministic_level" in attrs:
        npu = torch_npu.npu
        restore.append(("deterministic", torch.are_deterministic_algorithms_enabled(),
                        npu._deterministic_level))
        level = int(attrs["_deterministic_level"])
        torch.use_deterministic_algorithms(level >= 1)
        npu._deterministic_level = level
    _stack.append(restore)


def _exit() -> None:
    import torch_npu

    if not _stack:
        raise RuntimeError("npugraph_ex.scope: scope_exit without a scope entered")
    for entry in reversed(_stack.pop()):
        if entry[0] == "limit":
            from torch_npu.npu import npu_config

            _, key, before = entry
            with npu_config._lock:  # exactly the stream's limits before the scope
                if before is None:
                    npu_config._stream_limits.pop(key, None)
                else:
                    npu_config._stream_limits[key] = before
        else:
            _, enabled, level = entry
            torch.use_deterministic_algorithms(enabled)
            torch_npu.npu._deterministic_level = level


_lib.impl("scope_enter", _enter, "CompositeExplicitAutograd")
_lib.impl("scope_exit", _exit, "CompositeExplicitAutograd")


@torch.library.register_fake("npugraph_ex::scope_enter", lib=_lib)
def _enter_fake(keys, values, stream_id=-1):
    return None


@torch.library.register_fake("npugraph_ex::scope_exit", lib=_lib)
def _exit_fake():
    return None


has_side_effect(torch.ops.npugraph_ex.scope_enter.default)
has_side_effect(torch.ops.npugraph_ex.scope_exit.default)


def annotate(gm: torch.fx.GraphModule) -> None:
    """Record on each node inside a scope the attributes of the scopes around it."""
    active: List[dict] = []
    for node in gm.graph.nodes:
        if node.target is torch.ops.npugraph_ex.scope_enter.default:
            keys, values = node.args[0], node.args[1]
            merged = dict(active[-1]) if active else {}
            merged.update(zip(keys, values))
            active.append(merged)
        elif node.target is torch.ops.npugraph_ex.scope_exit.default:
            if active:
                active.pop()
        elif active and node.op == "call_function":
            node.meta["npugraph_ex_scope"] = dict(active[-1])
