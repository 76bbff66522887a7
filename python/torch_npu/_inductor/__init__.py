"""torch.compile on npu through Inductor's C++ (CPU) code generator.

npu memory is host memory here, so the C++ kernels Inductor generates for CPU tensors can
read and write npu tensors through their data pointers; matmuls and convolutions stay calls
into torch_npu's op library (``extern_kernels.*``), which queue on the npu stream. What npu
needs from Dynamo and Inductor (all private hooks of torch, see ``registration.py``):

* a Dynamo device interface for ``npu`` (device count, current device, synchronize, ...);
* Inductor's code generators for ``npu``: ``CppScheduling`` and a wrapper code generator
  that queues each generated host kernel on the current npu stream, through an entry
  function appended to the kernel's source (``codegen.py``, ``runtime.py``);
* treating ``npu`` like ``cpu`` where Inductor's scheduler checks ``device.type == "cpu"``.

Registration is lazy, so that ``import torch_npu`` does not import Dynamo/Inductor (about
1-2 s): importing this package (``import torch_npu`` does) calls :func:`install`, which only
adds import hooks. The Dynamo part runs when ``torch._dynamo`` is first imported
(``torch.compile`` does that), the Inductor part when ``torch._inductor.compile_fx`` is
(Inductor's entry point, imported by the ``inductor`` backend on the first compile, before
any graph is lowered), and Inductor's cache system info names the npu device when
``torch._inductor.codecache`` is. :func:`register` does both at once.
"""
import warnings

from torch_npu.utils._post_import import when_imported

__all__ = ["install", "register"]

_installed = False


def register() -> None:
    """Register npu with Dynamo and Inductor now (idempotent; imports both)."""
    from torch_npu._inductor import registration

    registration.register_dynamo()
    registration.register_inductor()


def _registering(what: str):
    """A post-import callback that runs ``registration.register_<what>()``.

    It runs at the end of a torch import, so it never raises: a failure becomes one warning
    and torch.compile on npu then fails where it needs the missing piece.
    """
    def callback() -> None:
        try:
            from torch_npu._inductor import registration

            getattr(registration, f"register_{what}")()
        except Exception as err:
            warnings.warn(f"torch_npu: registering the npu device with torch {what} failed, torch.compile "
                          f"on npu tensors will not work: {err}", RuntimeWarning, stacklevel=2)
    return callback


# module whose first import triggers the registration -> what it registers
_HOOKS = {"torch._dynamo": "dynamo", "torch._inductor.compile_fx": "inductor",
          "torch._inductor.codecache": "codecache"}


def install() -> None:
    """Called by ``import torch_npu``: set up the lazy registration (cheap, idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    for module, what in _HOOKS.items():
        when_imported(module, _registering(what))
    from torch_npu._inductor import mlir  # the npu_backend option (MLIR through IREE); imports no IREE

    mlir.install()


install()
