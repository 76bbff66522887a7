"""Running code right after a module's first import, without importing it earlier.

``when_imported("torch.distributed.tensor", fn)`` calls ``fn`` at once if the module is loaded,
else once the module has been executed by its first import: registrations with optional
subsystems (Dynamo, Inductor, DTensor) cost nothing to programs that never load them.
"""
import importlib.util
import sys

__all__ = ["when_imported"]


class _PostImportHook:
    """A meta path finder that runs ``callback`` once ``module`` has been executed.

    It finds the module's spec with the other finders and wraps that spec's loader's
    ``exec_module`` (an attribute of this one loader instance), then removes itself.
    """

    def __init__(self, module: str, callback) -> None:
        self.module = module
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_callback(module):
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_callback
        return spec


def when_imported(module: str, callback) -> None:
    """Calls ``callback()`` now if ``module`` is imported, else right after its first import."""
    if module in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _PostImportHook(module, callback))
