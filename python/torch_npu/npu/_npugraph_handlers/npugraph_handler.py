"""The handler base class and registry of NPU graph task updates.

The registry maps the ``__name__`` of an operator overload as ``__torch_dispatch__`` sees
it (``"op"``, ``"op.default"``, ``"op.out"``) to a handler class. Handlers are used as
classes, never instantiated: every hook is a classmethod.
"""
import copy
import logging

import torch

logger = logging.getLogger(__name__)

# operator overload name -> handler class
_NPU_GRAPH_OP_HANDLERS = {}


def _is_npu_tensor(value):
    return isinstance(value, torch.Tensor) and value.device.type == "npu"


def _weak_ref(tensor):
    import torch_npu
    return torch_npu._C._weak_ref_tensor(tensor)


class NpuGraphOpHandler:
    r"""How an operator is captured as an updatable task group, and updated.

    ``UPDATE_SPECS`` maps an operator name to the arguments an update may replace, as
    ``(where, position_or_name, key)`` tuples: ``("arg", i, key)`` is the ``i``-th argument of
    the operator's schema, ``("kwarg", name, key)`` the keyword argument ``name``; ``key`` is
    the key of the ``cpu_update_input`` dict of ``NPUGraph.update`` giving the new value.
    """

    UPDATE_SPECS = {}

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        r"""The ``(func, args, kwargs)`` to capture instead of the call (e.g. an ``.out``
        overload with preallocated outputs, whose update writes the same memory)."""
        return func, args, kwargs

    @classmethod
    def postprocess_result(cls, result, kwargs):
        r"""What the captured call returns to its caller."""
        return result

    @classmethod
    def record_wrap_kwarg(cls, key, value, tensor_param_names):
        r"""How the capture record keeps keyword argument ``key`` (called once per keyword
        argument when the call is recorded; updates assign their new values directly).

        npu tensors — a tensor-typed argument named in ``tensor_param_names`` (from the
        operator's schema), or an element of a list or tuple — are kept as
        ``torch_npu._C._weak_ref_tensor`` views of their memory, so the record holds no
        reference to the caller's tensor object; other values are deep-copied, so a later
        change of the caller's object does not reach the record. ``None`` stays ``None``.
        """
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return type(value)(_weak_ref(v) if _is_npu_tensor(v) else copy.deepcopy(v) for v in value)
        if key in tensor_param_names and _is_npu_tensor(value):
            return _weak_ref(value)
        return copy.deepcopy(value)

    @classmethod
    def get_update_specs(cls, op_name):
        r"""The update specs of ``op_name`` (an empty list if none)."""
        return list(cls.UPDATE_SPECS.get(op_name, []))

    @classmethod
    def update_args(cls, dispatch_record, update_input):
        r"""Writes the values of ``update_input`` the specs name into the recorded call.

        An ``("arg", i, key)`` spec writes argument ``i``: in ``dispatch_record.args`` when the
        call passed it by position, else in ``dispatch_record.kwargs`` under its schema name
        (``__torch_dispatch__`` passes keyword-only arguments by name). Keys of
        ``update_input`` that no spec of the operator names are left alone: one update dict
        may serve several operators.
        """
        func = dispatch_record.op_cache_entry
        schema_args = func._schema.arguments if hasattr(func, "_schema") else []
        for where, position, key in cls.get_update_specs(func.__name__):
            if key not in update_input:
                continue
            value = update_input[key]
            if where == "kwarg":
                dispatch_record.kwargs[position] = value
            elif where == "arg":
                if position < len(dispatch_record.args):
                    dispatch_record.args[position] = value
                elif position < len(schema_args):
                    dispatch_record.kwargs[schema_args[position].name] = value
                else:
                    raise RuntimeError(f"{cls.__name__}: update spec ('arg', {position}, {key!r}) of "
                                       f"{func.__name__} is past the operator's {len(schema_args)} arguments")
            else:
                raise RuntimeError(f"{cls.__name__}: update spec of {func.__name__} must start with 'arg' or "
                                   f"'kwarg', got {where!r}")


def register_npu_graph_handler(op_names):
    r"""Class decorator registering a handler for ``op_names`` (a name or a list of names)."""
    names = [op_names] if isinstance(op_names, str) else list(op_names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"register_npu_graph_handler: op_names must be a non-empty str or list of them, "
                        f"got {op_names!r}")

    def register(handler_cls):
        if not (isinstance(handler_cls, type) and issubclass(handler_cls, NpuGraphOpHandler)):
            raise TypeError(f"register_npu_graph_handler: expected a subclass of NpuGraphOpHandler, "
                            f"got {handler_cls!r}")
        for name in names:
            previous = _NPU_GRAPH_OP_HANDLERS.get(name)
            if previous is not None and previous is not handler_cls:
                logger.warning("NPU graph handler of %s replaced: %s -> %s", name, previous.__name__,
                               handler_cls.__name__)
            _NPU_GRAPH_OP_HANDLERS[name] = handler_cls
        return handler_cls

    return register
