"""``torch.npu.aclnn``: switches of the aclnn operator library.

``allow_hf32`` is the HF32 switch of convolutions (``torch.npu.conv.allow_hf32``, default
``True``) under the name torch_npu's aclnn module gives it; ``flags(allow_hf32=...)``
sets it for a ``with`` block.
"""
import sys
import types
import warnings
from contextlib import contextmanager

__all__ = ["version", "allow_hf32", "flags", "set_flags"]


def version():
    r"""The aclnn library has no version of its own to report: warns and returns ``None``."""
    warnings.warn("torch.npu.aclnn.version isn't implemented!")
    return None


def _conv():
    from torch_npu.npu.config import conv

    return conv


def set_flags(_allow_hf32=None):
    r"""Set ``allow_hf32`` if given; return the previous flags as a tuple."""
    previous = (_conv().allow_hf32,)
    if _allow_hf32 is not None:
        _conv().allow_hf32 = _allow_hf32
    return previous


@contextmanager
def flags(allow_hf32=True):
    r"""Set ``allow_hf32`` inside the ``with`` block, restoring it afterwards."""
    previous = set_flags(allow_hf32)
    try:
        yield
    finally:
        set_flags(*previous)


class _AclnnModule(types.ModuleType):
    @property
    def allow_hf32(self) -> bool:
        return _conv().allow_hf32

    @allow_hf32.setter
    def allow_hf32(self, value: bool) -> None:
        _conv().allow_hf32 = value


sys.modules[__name__].__class__ = _AclnnModule

# torch_npu.npu.aclnn.backends (Huawei's aclnn is a package with a backends module): version().
backends = types.ModuleType(__name__ + ".backends", "The aclnn backend: ``version()``.")
backends.version = version
backends.__all__ = ["version"]
sys.modules[backends.__name__] = backends
