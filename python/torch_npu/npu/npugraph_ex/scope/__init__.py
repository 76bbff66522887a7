"""``torch.npu.npugraph_ex.scope``: attributes for the operators of a ``with`` block.

The scopes work eagerly and inside ``torch.compile(backend="npugraph_ex")`` graphs (no graph
break: they are two operators, ``torch.ops.npugraph_ex.scope_enter`` / ``scope_exit``, see
``_ops.py``). On the simulator a core limit is the stream's limit that
``torch.npu.get_stream_limit`` reports for the duration of the scope (the kernels run on the
CPU, so it does not change how they compute), and a deterministic level turns
``torch.use_deterministic_algorithms`` on (level >= 1) or off (0) for the scope's operators;
both are restored when the scope is left.
"""
__all__ = ["limit_core_num", "deterministic"]


class _Scope:
    def __init__(self, keys, values, stream_id=-1):
        self.keys, self.values, self.stream_id = keys, values, stream_id

    def __enter__(self):
        import torch

        from . import _ops  # noqa: F401  (defines the operators)

        torch.ops.npugraph_ex.scope_enter(self.keys, self.values, self.stream_id)
        return self

    def __exit__(self, *exc):
        import torch

        torch.ops.npugraph_ex.scope_exit()
        return False


def _check_int(value, name, fn, low):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}(): {name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{fn}(): {name} must be >= {low}, got {value}")


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int, stream=None):
    r"""Run the operators of the ``with`` block with at most ``op_aicore_num`` AI cores and
    ``op_vectorcore_num`` vector cores, on ``stream`` (default: the current stream)."""
    import torch

    from . import _ops

    _check_int(op_aicore_num, "op_aicore_num", "limit_core_num", 1)
    _check_int(op_vectorcore_num, "op_vectorcore_num", "limit_core_num", 0)
    stream_id = -1
    if stream is not None:
        if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
            raise TypeError(f"limit_core_num(): stream must be a torch.npu.Stream, got {type(stream).__name__}")
        stream_id = int(stream.stream_id)
        _ops._streams[stream_id] = stream
    return _Scope(["_op_aicore_num", "_op_vectorcore_num"], [str(op_aicore_num), str(op_vectorcore_num)],
                  stream_id)


def deterministic(level: int):
    r"""Run the operators of the ``with`` block at deterministic ``level`` (0 off, 1
    deterministic operators, 2 operators and collectives), as
    ``torch.npu.set_deterministic_level`` would, and restore the previous setting after."""
    _check_int(level, "level", "deterministic", 0)
    if level > 2:
        raise ValueError(f"deterministic(): level must be 0, 1 or 2, got {level}")
    return _Scope(["_deterministic_level"], [str(level)])
