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
from functools import partialmethod

import torch

__all__ = ["Dtypes", "Formats", "instantiate_tests", "feed_data", "instantiate_ops_tests", "gen_ops_testcase",
           "gen_op_input"]


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


def feed_data(func, new_name, *args, **kwargs):
    """``func`` bound to the test data: a test method ``new_name(self)`` calling ``func(self, *args, **kwargs)``."""
    @functools.wraps(func)
    def wrapper(self):
        return func(self, *args, **kwargs)
    wrapper.__name__ = new_name
    wrapper.__wrapped__ = func
    return wrapper


def gen_ops_testcase(cls, func, name, keys, value, op_info):
    """Add to ``cls`` the test ``<func>_<name>[_<npu_format>][_<dtype>]``: ``func`` with the
    keyword arguments ``keys``=``value`` and ``op=op_info``, under ``op_info``'s decorators."""
    new_kwargs = {}
    test_name = f"{func.__name__}_{name}"
    for k, v in zip(keys, value):
        if k == "npu_format":
            test_name += "_" + str(v)
        elif k == "dtype":
            test_name += "_" + str(v).split(".")[1]
        new_kwargs[k] = v
    new_kwargs["op"] = op_info
    new_func = partialmethod(func, **new_kwargs)
    setattr(cls, test_name, new_func)
    for decorator in op_info.get_decorators(cls.__name__, func.__name__, "cpu", value[0], {}):
        setattr(cls, test_name, decorator(new_func))


def gen_op_input(testcase, func, op_info):
    """The dtypes and npu formats to test ``op_info`` with: the test's ``Dtypes``/``Formats``, else
    the OpInfo's ``dtypesIfNPU``/``formats``; one dtype (float32 if supported) for
    ``test_variant_consistency_eager``."""
    data = {
        "dtype": func.dtypes if hasattr(func, "dtypes") else op_info.dtypesIfNPU,
        "npu_format": func.formats if hasattr(func, "formats") else op_info.formats,
    }
    if "test_variant_consistency_eager" in testcase:
        if torch.float32 in op_info.dtypesIfNPU:
            data["dtype"] = {torch.float32}
        else:
            data["dtype"] = {list(op_info.dtypesIfNPU)[-1]}
    return data


def instantiate_ops_tests(op_db):
    """Class decorator: replace every ``test_*`` method by one test per OpInfo of ``op_db``,
    dtype and npu format (see :func:`gen_op_input`, :func:`gen_ops_testcase`)."""

    def wrapper(cls):
        testcases = [x for x in dir(cls) if x.startswith("test_")]
        for testcase in testcases:
            if hasattr(cls, testcase):
                func = getattr(cls, testcase)
                for op_info in op_db:
                    data = gen_op_input(testcase, func, op_info)
                    keys = data.keys()
                    values = [data.get(key) for key in keys]
                    for value in itertools.product(*values):
                        gen_ops_testcase(cls, func, op_info.name, keys, value, op_info)
                delattr(cls, testcase)
        return cls

    return wrapper
