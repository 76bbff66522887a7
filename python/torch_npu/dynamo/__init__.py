"""torch_npu's Dynamo backends: ``torch.compile(model, backend="npu")``.

``npu`` is Inductor generating C++ kernels for npu memory (``torch_npu._inductor``), i.e.
the same as the default ``torch.compile(model)`` on npu tensors, under the name torch_npu
registers. Backends are named in :data:`BACKENDS`; the installed wheel also declares them
as ``torch_dynamo_backends`` entry points (tools/build_wheel.py, ``ENTRY_POINTS``), and
``import torch_npu`` registers them when ``torch._dynamo`` is first imported, so that they
work from a source tree too. Either way the backend's module is imported only when it is
first used.
"""
from typing import Any, Dict, Optional

__all__ = ["BACKENDS", "npu_backend"]

# name -> "module:attribute" of the compiler function (entry point syntax). Keep in sync
# with the torch_dynamo_backends entry points in tools/build_wheel.py (a test checks it).
BACKENDS = {
    "npu": "torch_npu.dynamo:npu_backend",
    "npugraph_ex": "torch_npu.dynamo.graphs:npugraph_ex_backend",
    "npugraphs": "torch_npu.dynamo.graphs:npugraphs_backend",
}


def npu_backend(gm, example_inputs, mode: Optional[str] = None, options: Optional[Dict[str, Any]] = None):
    """Compile a Dynamo graph with Inductor for npu (``mode``/``options`` as for ``inductor``)."""
    import torch
    from torch_npu._inductor import register
    from torch_npu.dynamo._deterministic_guard import install_npu_deterministic_level_guard

    register()
    install_npu_deterministic_level_guard()  # a graph compiled at one level recompiles at another
    inductor = getattr(torch, "_TorchCompileInductorWrapper", None)
    if inductor is None:  # a torch without it: plain compile_fx, honouring options only
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx

        if mode not in (None, "default"):
            raise RuntimeError(f"backend 'npu': mode={mode!r} needs torch._TorchCompileInductorWrapper, "
                               f"which torch {torch.__version__} does not have; pass options= instead")
        with config.patch(options or {}):
            return compile_fx(gm, example_inputs)
    return inductor(mode, options, dynamic=None)(gm, example_inputs)


def _register_backends() -> None:
    """Add :data:`BACKENDS` to Dynamo's registry as lazily loaded entry points."""
    from importlib.metadata import EntryPoint

    from torch._dynamo.backends import registry

    for name, value in BACKENDS.items():
        if name not in registry._BACKENDS:
            registry._BACKENDS[name] = EntryPoint(name=name, value=value, group="torch_dynamo_backends")
