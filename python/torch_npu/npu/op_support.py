"""Which operators this build serves on the NPU, and the CPU fallback for the others.

The lists come from the op table (ops/npu_native_functions.yaml) as the build generated
it for this PyTorch x CANN pair (``torch_npu._op_table``). As in torch_npu, an ATen operator
that reaches the NPU without a kernel runs on the CPU, its arguments copied to the host and
its results back, with one warning per operator ("... will fall back to run on the CPU ...").
``TORCH_NPU_FALLBACK_CPU_DISABLE=1`` (read at import) or ``set_cpu_fallback(False)`` turns the
fallback off: such an operator then raises ``NotImplementedError`` ("aten::<op> is not
supported on NPU (...)").

``python -m torch_npu.npu.op_support script.py`` runs a script and lists the operators it
called that this pair does not support (see ``main``).
"""
from typing import Dict, Optional

import torch

from torch_npu import _C, _op_table

__all__ = ["is_op_supported", "unsupported_reason", "set_cpu_fallback", "get_cpu_fallback",
           "unsupported_ops_of", "OpRecorder"]


def _overload_name(op) -> str:
    """'aten::add.Tensor' / 'add.Tensor' / torch.ops.aten.add.Tensor -> 'add.Tensor'."""
    if isinstance(op, torch._ops.OpOverload):
        namespace, name = op.name().split("::", 1)
        return name if namespace == "aten" else op.name()
    if not isinstance(op, str):
        raise TypeError(f"op must be an operator name such as 'aten::isin.Tensor_Tensor' or an OpOverload, "
                        f"got {type(op).__name__}")
    name = op[len("aten::"):] if op.startswith("aten::") else op
    if name.endswith(".default"):
        name = name[:-len(".default")]
    return name


def _overloads(name: str):
    """The table names an overload ('isin.Tensor_Tensor'); a bare name ('isin') means all its overloads."""
    if "." in name or name in _op_table.SUPPORTED or name in _op_table.UNSUPPORTED:
        return [name]
    prefix = name + "."
    return [n for n in list(_op_table.SUPPORTED) + list(_op_table.UNSUPPORTED) if n.startswith(prefix)]


def unsupported_reason(op) -> Optional[str]:
    """Why `op` has no NPU kernel in this build (None when it is served).

    ATen operators that never reach a backend (composite operators, which decompose into
    others) are served: whether their pieces are is what counts.
    """
    name = _overload_name(op)
    if name.startswith("npu::") or name in _op_table.CUSTOM:
        return None
    reasons = [f"{n}: {_op_table.UNSUPPORTED[n]}" for n in _overloads(name) if n in _op_table.UNSUPPORTED]
    return "; ".join(reasons) or None


def _registered(qualified: str) -> bool:
    """Whether the dispatcher knows ``ns::name[.overload]`` (any overload for a bare name)."""
    namespace, _, rest = qualified.partition("::")
    base, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), base)
    except (AttributeError, RuntimeError):
        return False
    return not overload or overload in packet.overloads()


def is_op_supported(op) -> bool:
    """Whether the NPU serves ``op`` ("aten::isin", "aten::add.Tensor", torch.ops.aten.add.Tensor,
    or a fused "npu_rms_norm") in this PyTorch x CANN pair. Operators the dispatcher does not
    know are not."""
    name = _overload_name(op)
    if name in _op_table.CUSTOM or name.split(".")[0] in _op_table.CUSTOM:
        return True
    if "::" in name:  # npu:: fused operators, and other libraries' (their CPU kernels run on NPU memory)
        return _registered(name)
    return _registered("aten::" + name) and unsupported_reason(name) is None


def set_cpu_fallback(enabled: bool) -> None:
    """Run operators the NPU does not support on the CPU (True, the default unless
    ``TORCH_NPU_FALLBACK_CPU_DISABLE=1``) or raise (False)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    _C._npu_setCpuFallback(enabled)


def get_cpu_fallback() -> bool:
    return _C._npu_getCpuFallback()


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen overloads called inside it (on any device), e.g. on CPU tensors,
    to check a model against this pair before moving it to the NPU."""

    def __init__(self):
        super().__init__()
        self.ops: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _overload_name(func)
        self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def unsupported_ops_of(fn, *args, **kwargs) -> Dict[str, str]:
    """Calls fn(*args, **kwargs) (forward, and backward of a tensor result that requires
    grad) under an OpRecorder and returns {operator: why} for those this pair lacks."""
    with OpRecorder() as rec:
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward()
    return {op: unsupported_reason(op) for op in sorted(rec.ops) if unsupported_reason(op)}


def _main(argv=None) -> int:
    """python -m torch_npu.npu.op_support script.py [args...]: runs the script with every
    ATen call recorded and prints the operators this pair does not support."""
    import argparse
    import runpy
    import sys

    p = argparse.ArgumentParser(prog="python -m torch_npu.npu.op_support", description=_main.__doc__)
    p.add_argument("script", help="a Python script (run as __main__; use CPU or npu tensors)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    sys.argv = [ns.script] + ns.args
    with OpRecorder() as rec:
        runpy.run_path(ns.script, run_name="__main__")
    missing = {op: unsupported_reason(op) for op in sorted(rec.ops) if unsupported_reason(op)}
    print(f"torch_npu {_op_table.TORCH} / CANN {_op_table.CANN}: {len(rec.ops)} ATen operators called, "
          f"{len(missing)} not supported on NPU")
    for op, why in missing.items():
        print(f"  aten::{op}: {why}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(_main())
