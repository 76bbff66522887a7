"""Docstrings of the operators ``torch_npu`` exports by name (``torch_npu.npu_rms_norm`` is
``torch.ops.npu.npu_rms_norm``), as torch_npu gives each of them one: an operator without
its own docstring gets its signatures, one line per overload, from the schemas registered
with the dispatcher, and where it is registered."""
import torch

__all__ = []


def _signature(module_name: str, name: str, schema) -> str:
    text = str(schema)  # "npu::npu_linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"
    args = text[text.index("("):]
    overload = f"  (overload ``{schema.overload_name}``)" if schema.overload_name else ""
    return f"{module_name}.{name}{args}{overload}"


def docstring(module_name: str, name: str, packet) -> str:
    """The docstring of an operator packet (``torch.ops.<namespace>.<name>``)."""
    namespace, _, op = packet._qualified_op_name.partition("::")
    schemas = [getattr(packet, o)._schema for o in packet.overloads()]
    lines = [_signature(module_name, name, s) for s in schemas]
    lines += ["", f"The NPU operator ``torch.ops.{namespace}.{op}``."]
    return "\n".join(lines)


def install(module, names=None) -> list:
    """Gives every name of ``names`` (default ``module.__all__``) that is an operator packet
    without a docstring its generated one; returns those names."""
    done = []
    for name in (module.__all__ if names is None else names):
        obj = getattr(module, name, None)
        if isinstance(obj, torch._ops.OpOverloadPacket) and not obj.__doc__:
            obj.__doc__ = docstring(module.__name__, name, obj)
            done.append(name)
    return done
