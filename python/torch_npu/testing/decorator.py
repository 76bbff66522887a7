"""Parametrising operator tests by dtype and NPU format (``torch_npu.testing.decorator``).

::

    @instantiate_tests
    class TestAdd(TestCase):
        @Dtypes(torch.float, torch.half)
        @Formats(0, 2)
        def test_add(self, device, dtype, npu_format):
            ...

expands ``test_add`` into ``test_add_float32_0``, ``test_add_float32_2``,
``test_add_float16_0``, ... (dtype first, then format, as torch_npu names them), each called with ``dtype=``,
``npu_format=`` (the parameter whose name contains ``format``) and, if the test takes
it, ``device="npu"``.
"""

import functools
import inspect
import itertools

import torch

__all__ = ["Dtypes", "Formats", "instantiate_tests"]


class Dtypes:
    """Decorator: run the test once per dtype."""

    def __init__(self, *args):
        if not args:
            raise RuntimeError("No dtypes given")
        if not all(isinstance(arg, torch.dtype) for arg in args):
            raise RuntimeError(f"Unknown dtype in {args}: every argument must be a torch.dtype")
        self.args = args

    def __call__(self, fn):
        fn.dtypes = self.args
        return fn


class Formats:
    """Decorator: run the test once per NPU format (ACL format numbers)."""

    def __init__(self, *args):
        if not args:
            raise RuntimeError("No formats given")
        if not all(isinstance(arg, int) and not isinstance(arg, bool) for arg in args):
            raise RuntimeError(f"Unknown format in {args}: every argument must be an int")
        self.args = args

    def __call__(self, fn):
        fn.formats = self.args
        return fn


def _bind(func, name, kwargs):
    @functools.wraps(func)
    def test(self):
        return func(self, **kwargs)

    test.__name__ = name
    test.__qualname__ = f"{func.__qualname__.rsplit('.', 1)[0]}.{name}"
    test.__wrapped__ = func
    return test


def _parameter_for(key: str, params) -> str:
    matches = [p for p in params if key in p]
    if len(matches) != 1:
        raise RuntimeError(f"instantiate_tests: the test needs exactly one parameter whose name "
                           f"contains {key!r}, found {matches}")
    return matches[0]


def instantiate_tests(arg=None, **kwargs):
    """Class decorator expanding the tests decorated with :class:`Dtypes` / :class:`Formats`."""

    def expand(cls):
        for name, func in list(cls.__dict__.items()):
            if not callable(func):
                continue
            axes = {}
            if hasattr(func, "dtypes"):
                axes["dtype"] = func.dtypes
            if hasattr(func, "formats"):
                axes["format"] = func.formats
            if not axes:
                continue
            params = inspect.signature(func).parameters
            for values in itertools.product(*axes.values()):
                call_kwargs = {"device": "npu"} if "device" in params else {}
                test_name = name
                for key, value in zip(axes, values):
                    if key == "format":
                        test_name += f"_{value}"
                    else:
                        test_name += "_" + str(value).split(".")[1]
                    call_kwargs[_parameter_for(key, params)] = value
                setattr(cls, test_name, _bind(func, test_name, call_kwargs))
            delattr(cls, name)
        return cls

    if arg is None:
        return expand
    return expand(arg)
