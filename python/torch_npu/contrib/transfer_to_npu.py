r"""``torch_npu.contrib.transfer_to_npu``: run a script written for CUDA unchanged on NPUs.

Usage::

    import torch
    import torch_npu
    from torch_npu.contrib import transfer_to_npu  # noqa: F401  (global effect)

    model = MyModel().cuda()                          # on npu:0
    x = torch.randn(8, 16, device="cuda")             # on npu:0
    with torch.cuda.amp.autocast():                   # NPU autocast
        loss = model(x).sum()

or, without touching the script, ``TORCH_TRANSFER_TO_NPU=1 python train.py`` (the
import of ``torch_npu`` -- also the automatic one done by ``import torch`` -- then
imports this module; ``0`` or unset does nothing, other values are an error).

Importing the module changes ``torch`` for the whole process, once (importing it again
changes nothing) and says so with one warning (on rank 0 only when ``RANK`` is set):

* ``torch.cuda`` (and ``torch.cuda.amp``, ``.amp.autocast_mode``, ``.amp.grad_scaler``,
  ``.random``, ``.memory``, ``.streams``) gets every public name of the matching
  ``torch.npu`` module: ``is_available`` (so ``torch.cuda.is_available()`` is ``True``),
  ``device_count``, ``set_device``, ``synchronize``, ``Stream``/``Event``/``stream``, the
  memory statistics, ``manual_seed*``, ``amp.autocast``/``amp.GradScaler``,
  ``get_device_name``/``get_device_properties``, ... Their device arguments accept
  ``"cuda"``, ``"cuda:N"`` and ``torch.device("cuda", N)``; ``isinstance`` checks against
  ``torch.cuda.Stream``/``torch.cuda.device`` hold for the NPU objects.
* ``Tensor.cuda()``, ``Module.cuda()`` and ``Storage.cuda()`` are ``.npu()``;
  ``Tensor.is_cuda`` (and ``TypedStorage.is_cuda``) is ``is_npu``.
* A CUDA device (``"cuda"``, ``"cuda:N"``, ``torch.device("cuda"[, N])``) given to the
  tensor factories (``torch.tensor``, ``zeros``, ``ones``, ``empty``, ``randn``,
  ``arange``, ``full``, the ``*_like`` functions, ...), ``Tensor.to``/``new_*``/
  ``pin_memory``, ``Module.to``/``to_empty``, ``torch.UntypedStorage``,
  ``torch.autocast``, ``torch.amp.GradScaler`` (whose default ``"cuda"`` also becomes
  ``"npu"``), ``torch.amp.custom_fwd``/``custom_bwd``, ``torch.is_autocast_enabled`` and
  friends, ``torch.Generator``, ``torch.Event``, ``torch.set_default_device``,
  ``with torch.device("cuda")``, ``torch.get_device_module``, ``torch.fft.fftfreq``,
  ``DataLoader(pin_memory_device=...)``, ``torch.autograd.profiler_util.Kernel`` and
  ``torch.load(map_location=...)`` means the
  NPU of the same index. Checkpoints saved on a CUDA machine load onto the NPUs.
* ``torch.distributed``: backend ``"nccl"`` (also inside ``"cpu:gloo,cuda:nccl"``) is
  ``"hccl"`` in ``init_process_group``, ``new_group`` (and everything built on it),
  ``new_subgroups*`` and ``split_group``; ``is_nccl_available`` answers for hccl; CUDA
  devices are accepted by ``init_process_group(device_id=...)``,
  ``DistributedDataParallel(device_ids=..., output_device=...)``,
  ``FullyShardedDataParallel(device_id=...)``, ``DeviceMesh``/``init_device_mesh``.
* ``torch.cuda.CUDAGraph``/``graph``/``make_graphed_callables``/``graph_pool_handle``/
  ``is_current_stream_capturing`` become the ``torch.npu`` equivalents when those exist.

Code on CPU tensors keeps its behaviour: only arguments that *are* CUDA devices are
rewritten (a file called ``cuda_model.pt`` stays as it is), CPU devices and integer
indices are passed through unchanged. ``torch.backends.cuda``/``cudnn`` flags (e.g.
``torch.backends.cuda.matmul.allow_tf32 = True``) are left alone: setting them is
harmless and has no effect on NPUs.

Not mapped: ``x.device.type == "cuda"`` comparisons in user code, the legacy typed
tensor classes (``torch.cuda.FloatTensor``), ``torch.cuda.nvtx``, private
``torch.cuda._*`` functions, ``torch.profiler`` (torch_npu has no profiler yet),
TorchScript code, Inductor internals (Huawei's ``has_triton``/``get_gpu_type`` patches;
Dynamo itself traces through the wrappers), ``torch.distributed.pipelining``,
``ProcessGroupNCCL`` (no HCCL process group class exists yet), the library-specific
``is_available`` workarounds of Huawei's ``apis_config.json`` (transformers, ...).
Unlike Huawei's module this one does not disable ``torch.jit.script``, does not change
the global warning filters, and rewrites only arguments that are exactly CUDA devices.
"""

import functools
import importlib
import inspect
import os
import re
import types
import warnings

import torch

import torch_npu
import torch_npu.npu

__all__ = []

_NPU = "npu"

#: Set on every function this module installs, so that a second application (e.g. after
#: ``importlib.reload``) recognises its own wrappers and wraps nothing twice.
_MARK = "_torch_npu_transfer_to_npu"

#: Keyword arguments holding a device (or a device type).
_DEVICE_KWARGS = ("device", "device_type", "device_id", "output_device", "pin_memory_device",
                  "map_location")
#: Keyword arguments holding a list of devices.
_DEVICE_LIST_KWARGS = ("device_ids", "devices")


# ----------------------------------------------------------------------------------
# Translating arguments


def _to_npu(value):
    """``"cuda"``/``"cuda:N"``/``torch.device("cuda"[, N])`` -> the NPU equivalent.

    Everything else (CPU devices, indices, paths, other objects) is returned as it is,
    the very same object.
    """
    if type(value) is str:  # noqa: E721  (str subclasses such as Backend are not devices)
        if value == "cuda":
            return _NPU
        if value.startswith("cuda:") and value[5:].isdigit():
            return _NPU + value[4:]
        return value
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device(_NPU) if value.index is None else torch.device(_NPU, value.index)
    return value


def _to_npu_list(value):
    if isinstance(value, (list, tuple)) and any(_to_npu(v) is not v for v in value):
        return type(value)(_to_npu(v) for v in value)
    return value


def _to_npu_map_location(value):
    """``map_location`` of ``torch.load``: devices, and the values of a dict.

    A dict keeps its keys (the locations saved in a checkpoint written on a CUDA machine
    are ``"cuda:N"``) and gets the NPU spelling of each CUDA key as well (a checkpoint
    written under transfer_to_npu holds ``"npu:N"``), unless that key is already there.
    """
    if isinstance(value, dict):
        mapped = {key: _to_npu(val) for key, val in value.items()}
        for key, val in list(mapped.items()):
            npu_key = _to_npu(key)
            if npu_key is not key and npu_key not in mapped:
                mapped[npu_key] = val
        return mapped
    return _to_npu(value)


def _translate(args, kwargs, skip=0, list_positions=()):
    """Rewrite CUDA devices in ``args[skip:]`` and in the device keyword arguments.

    ``list_positions``: positions holding a list of devices (``device_ids``).
    Returns ``(args, kwargs)``; ``kwargs`` is changed in place (it is the callee's own).
    """
    new_args = None
    for index in range(skip, len(args)):
        arg = args[index]
        new = _to_npu_list(arg) if index in list_positions else _to_npu(arg)
        if new is not arg:
            if new_args is None:
                new_args = list(args)
            new_args[index] = new
    if kwargs:
        for key in _DEVICE_KWARGS:
            if key in kwargs:
                value = kwargs[key]
                new = _to_npu_map_location(value) if key == "map_location" else _to_npu(value)
                if new is not value:
                    kwargs[key] = new
        for key in _DEVICE_LIST_KWARGS:
            if key in kwargs:
                kwargs[key] = _to_npu_list(kwargs[key])
    return (args if new_args is None else tuple(new_args)), kwargs


def _positions(fn, names):
    """Positional indices of the parameters ``names`` of ``fn`` (empty if unknown)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ()
    return tuple(i for i, p in enumerate(params)
                 if p.name in names and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _mark(wrapper):
    setattr(wrapper, _MARK, True)
    return wrapper


def _is_ours(fn):
    return getattr(fn, _MARK, False)


def _device_args(fn, skip=0, list_positions=()):
    """Wrap ``fn`` so that CUDA devices among its arguments become NPU devices.

    ``skip``: leading positional arguments left alone; ``list_positions``: positions
    holding a list of devices.
    """
    if _is_ours(fn):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args, kwargs = _translate(args, kwargs, skip, list_positions)
        return fn(*args, **kwargs)

    return _mark(wrapper)


def _patch(owner, name, make_wrapper, *extra):
    """``owner.name = make_wrapper(owner.name, *extra)`` if ``owner.name`` exists."""
    fn = getattr(owner, name, None)
    if fn is None or _is_ours(fn):
        return
    setattr(owner, name, make_wrapper(fn, *extra))


def _takes_device(fn):
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any("device" in p.name or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params)


# ----------------------------------------------------------------------------------
# Classes whose constructor takes a device: an alias type that translates the
# arguments and builds an object of the original class. ``isinstance`` and
# ``issubclass`` against the alias answer for the original class; subclassing the alias
# works as subclassing the original.

_aliases = {}


def _device_translating_alias(cls, module, qualname):
    if cls in _aliases:
        return _aliases[cls]

    class _AliasMeta(type(cls)):
        def __call__(self, *args, **kwargs):
            args, kwargs = _translate(args, kwargs)
            if self is alias:
                return cls(*args, **kwargs)
            return super().__call__(*args, **kwargs)

        def __instancecheck__(self, instance):
            if self is alias:
                return isinstance(instance, cls)
            return super().__instancecheck__(instance)

        def __subclasscheck__(self, subclass):
            if self is alias:
                return issubclass(subclass, cls)
            return super().__subclasscheck__(subclass)

    alias = _AliasMeta(cls.__name__, (cls,), {
        "__module__": module,
        "__qualname__": qualname,
        "__doc__": cls.__doc__,
        _MARK: True,
    })
    _aliases[cls] = alias
    return alias


def _alias_class(owner, name, module):
    cls = getattr(owner, name, None)
    if isinstance(cls, type) and not cls.__dict__.get(_MARK, False):
        setattr(owner, name, _device_translating_alias(cls, module, name))


# ----------------------------------------------------------------------------------
# torch.cuda -> torch.npu


def _overlay(dest, src):
    """Give ``dest`` (a ``torch.cuda`` module) every public name of ``src`` (torch.npu)."""
    for name in getattr(src, "__all__", ()):
        value = getattr(src, name, None)
        if value is None or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, type):
            init = value.__dict__.get("__new__") or value.__init__
            if not issubclass(value, BaseException) and _takes_device(init):
                value = _device_translating_alias(value, dest.__name__, name)
        elif callable(value) and _takes_device(value):
            value = _device_args(value)
        setattr(dest, name, value)


#: torch.cuda names -> torch.npu names of the graph API (another issue's work: mapped
#: only if torch.npu has them).
_GRAPH_NAMES = (
    ("CUDAGraph", "NPUGraph"),
    ("graph", "graph"),
    ("make_graphed_callables", "make_graphed_callables"),
    ("graph_pool_handle", "graph_pool_handle"),
    ("is_current_stream_capturing", "is_current_stream_capturing"),
)


def _patch_cuda():
    npu = torch_npu.npu
    for name in ("amp.autocast_mode", "amp.grad_scaler", "memory", "random", "streams"):
        importlib.import_module("torch.cuda." + name)

    pairs = [
        (torch.cuda, npu),
        (torch.cuda.amp, npu.amp),
        (torch.cuda.amp.autocast_mode, npu.amp.autocast_mode),
        (torch.cuda.amp.grad_scaler, npu.amp.grad_scaler),
        (torch.cuda.random, npu.random),
        (torch.cuda.memory, npu.memory),
        (torch.cuda.streams, npu.streams),
    ]
    graphs = getattr(npu, "graphs", None)
    cuda_graphs = getattr(torch.cuda, "graphs", None)
    if isinstance(graphs, types.ModuleType) and isinstance(cuda_graphs, types.ModuleType):
        pairs.append((cuda_graphs, graphs))
    for dest, src in pairs:
        _overlay(dest, src)

    for cuda_name, npu_name in _GRAPH_NAMES:
        if hasattr(npu, npu_name):
            setattr(torch.cuda, cuda_name, getattr(npu, npu_name))

    # default_generators is filled when the NPU runtime initialises.
    def _copy_default_generators():
        torch.cuda.default_generators = npu.default_generators

    npu._lazy_call(_copy_default_generators)


# ----------------------------------------------------------------------------------
# torch.* / Tensor / Module / Storage


#: torch functions with a device argument (those this torch has are wrapped).
_TORCH_FACTORIES = (
    "tensor", "as_tensor", "asarray", "scalar_tensor", "empty", "empty_like", "empty_strided",
    "empty_permuted", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "rand",
    "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal",
    "arange", "range", "linspace", "logspace", "eye", "tril_indices", "triu_indices",
    "hann_window", "hamming_window", "bartlett_window", "blackman_window", "kaiser_window",
    "sparse_coo_tensor", "sparse_csr_tensor", "sparse_csc_tensor", "sparse_bsr_tensor",
    "sparse_bsc_tensor", "sparse_compressed_tensor", "frombuffer", "_pin_memory",
    "_empty_affine_quantized", "_empty_per_channel_affine_quantized", "empty_quantized",
    "set_default_device", "get_device_module", "is_autocast_available",
    "get_autocast_dtype", "set_autocast_dtype",
)
#: Their first positional argument is a file name, never a device.
_TORCH_FILE_FUNCTIONS = ("from_file",)
_TENSOR_METHODS = ("to", "new_empty", "new_empty_strided", "new_full", "new_ones",
                   "new_tensor", "new_zeros", "pin_memory")
_MODULE_METHODS = ("to", "to_empty")


def _autocast_state(fn, arity):
    """``torch.is_autocast_enabled()``/``set_autocast_enabled(flag)``: the no-device forms
    mean CUDA, so they mean NPU here; the forms with a device are translated."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if len(args) == arity and not kwargs:
            args = (_NPU,) + args
        args, kwargs = _translate(args, kwargs)
        return fn(*args, **kwargs)

    return _mark(wrapper)


def _gpu_dtype(fn, getter):
    """``torch.get/set_autocast_gpu_dtype``: the dtype of NPU autocast."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getter:
            return torch.get_autocast_dtype(_NPU)
        return torch.set_autocast_dtype(_NPU, *args, **kwargs)

    return _mark(wrapper)


def _grad_scaler_init(fn):
    """``torch.amp.GradScaler(device="cuda", ...)``: ``"cuda"``, also as the default, is npu."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if not args and "device" not in kwargs:
            kwargs["device"] = _NPU
        args, kwargs = _translate(args, kwargs)
        return fn(self, *args, **kwargs)

    return _mark(wrapper)


def _load(fn):
    """``torch.load``: only ``map_location`` (second positional or keyword) is translated."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if len(args) > 1:
            location = _to_npu_map_location(args[1])
            if location is not args[1]:
                args = (args[0], location) + tuple(args[2:])
        args, kwargs = _translate(args, kwargs, skip=len(args))
        return fn(*args, **kwargs)

    return _mark(wrapper)


def _cuda_method(npu_method):
    """``Tensor.cuda``/``Module.cuda``/``Storage.cuda`` as ``.npu()`` taking CUDA devices."""
    return _device_args(npu_method, skip=1)


def _untyped_storage_new(fn):
    @functools.wraps(fn)
    def wrapper(cls, *args, **kwargs):
        args, kwargs = _translate(args, kwargs)
        return fn(cls, *args, **kwargs)

    return _mark(wrapper)


def _restore_cuda_location(storage, location):
    """Deserializer for storages saved on CUDA: restore them on the NPU of that index."""
    if isinstance(location, str) and location.startswith("cuda"):
        device = _to_npu(location)
        if device is not location:
            return storage.to(device=torch.device(device))
    return None


def _no_tag(obj):
    return None


def _register_cuda_deserializer():
    import torch.serialization as serialization

    registry = serialization._package_registry
    if any(getattr(entry[2], _MARK, False) for entry in registry):
        return
    cuda_priorities = [p for p, tagger, _ in registry if "cuda" in repr(tagger)] or [20]
    used = {p for p, _, _ in registry}
    priority = min(cuda_priorities) - 1
    while priority in used:
        priority -= 0.5
    serialization.register_package(priority, _mark(_no_tag), _mark(_restore_cuda_location))


def _patch_torch():
    # DeviceContext (``with torch.device(...)``, set_default_device) recognises the
    # factories by identity through this cached set: fill it with the original
    # functions before they are wrapped.
    from torch.utils._device import _device_constructors

    _device_constructors()

    for name in _TORCH_FACTORIES:
        _patch(torch, name, _device_args)
    for name in _TORCH_FILE_FUNCTIONS:
        _patch(torch, name, _device_args, 1)
    _patch(torch, "load", _load)
    _patch(torch, "is_autocast_enabled", _autocast_state, 0)
    _patch(torch, "set_autocast_enabled", _autocast_state, 1)
    _patch(torch, "get_autocast_gpu_dtype", _gpu_dtype, True)
    _patch(torch, "set_autocast_gpu_dtype", _gpu_dtype, False)
    for name in ("is_autocast_available", "custom_fwd", "custom_bwd"):
        _patch(torch.amp, name, _device_args)
        _patch(torch.amp.autocast_mode, name, _device_args)
    for name in ("fftfreq", "rfftfreq"):
        _patch(torch.fft, name, _device_args)

    _patch(torch.amp.autocast_mode.autocast, "__init__", _device_args, 1)
    _patch(torch.amp.grad_scaler.GradScaler, "__init__", _grad_scaler_init)
    _patch(importlib.import_module("torch.utils._device").DeviceContext, "__init__",
           _device_args, 1)

    for name in ("Generator", "Event"):
        _alias_class(torch, name, "torch")

    _register_cuda_deserializer()

    _patch(importlib.import_module("torch.utils.data").DataLoader, "__init__", _device_args, 1)
    # Profiler tables: Kernel(name, device, duration) records of "cuda" kernels are npu's.
    _patch(importlib.import_module("torch.autograd.profiler_util").Kernel, "__new__", _device_args, 1)

    # torch._utils picks "cuda" first now that torch.cuda.is_available() is True.
    torch_utils = importlib.import_module("torch._utils")
    _get_available_device_type = torch_utils._get_available_device_type
    if not _is_ours(_get_available_device_type):
        @functools.wraps(_get_available_device_type)
        def _available_device_type():
            if torch_npu.npu.is_available():
                return _NPU
            return _get_available_device_type()

        torch_utils._get_available_device_type = _mark(_available_device_type)


def _patch_tensor_module_storage():
    originals = {}
    for name in _TENSOR_METHODS:
        originals[name] = getattr(torch.Tensor, name, None)
        _patch(torch.Tensor, name, _device_args, 1)
    for name in _MODULE_METHODS:
        _patch(torch.nn.Module, name, _device_args, 1)

    originals["cuda"] = torch.Tensor.cuda
    if not _is_ours(torch.Tensor.cuda):
        torch.Tensor.cuda = _cuda_method(torch.Tensor.npu)
    torch.Tensor.is_cuda = torch.Tensor.is_npu
    if not _is_ours(torch.nn.Module.cuda):
        torch.nn.Module.cuda = _cuda_method(torch.nn.Module.npu)
    for storage in (torch.UntypedStorage, torch.storage.TypedStorage):
        if not _is_ours(storage.cuda) and hasattr(storage, "npu"):
            storage.cuda = _cuda_method(storage.npu)
    torch.storage.TypedStorage.is_cuda = torch.storage.TypedStorage.is_npu
    _patch(torch.UntypedStorage, "__new__", _untyped_storage_new)

    # UninitializedParameter (lazy modules) allows the Tensor methods it lists, by
    # identity: list the wrappers instead, and .npu() where .cuda() is allowed.
    from torch.nn.parameter import UninitializedTensorMixin

    allowed = UninitializedTensorMixin._allowed_methods
    cuda_allowed = originals["cuda"] in allowed
    for index, method in enumerate(allowed):
        for name, original in originals.items():
            if original is not None and method is original:
                allowed[index] = getattr(torch.Tensor, name)
    if cuda_allowed:
        allowed.extend(m for m in (torch.Tensor.npu,) if m not in allowed)


# ----------------------------------------------------------------------------------
# torch.distributed: nccl -> hccl, CUDA devices -> NPU devices


def _to_hccl(backend):
    """``"nccl"`` -> ``"hccl"``; ``"cpu:gloo,cuda:nccl"`` -> ``"cpu:gloo,npu:hccl"``."""
    if not isinstance(backend, str):
        return backend
    items = []
    for item in backend.split(","):
        device, sep, name = item.rpartition(":")
        if name.strip().lower() == "nccl":
            name = "hccl"
        if sep and device.strip().lower() == "cuda":
            device = _NPU
        items.append(device + sep + name)
    translated = ",".join(items)
    return backend if translated == backend else translated


_BACKEND_SPEC = re.compile(r"\s*\w+(\s*:\s*\w+)?\s*(,\s*\w+(\s*:\s*\w+)?\s*)*")


def _looks_like_backend(value):
    """A bare name or ``device:name,...`` list naming nccl or cuda (not an init URL)."""
    return (isinstance(value, str) and _BACKEND_SPEC.fullmatch(value) is not None
            and _to_hccl(value) is not value)


def _hccl_backend(fn):
    """Wrap a c10d function with a ``backend`` parameter: nccl -> hccl, devices -> npu."""
    if _is_ours(fn):
        return fn
    positions = _positions(fn, ("backend",))
    position = positions[0] if positions else None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _to_hccl(kwargs["backend"])
        if position is not None:
            if len(args) > position:
                args = args[:position] + (_to_hccl(args[position]),) + args[position + 1:]
        elif args:
            # Signature unknown (e.g. a stand-in): only strings that are backends.
            args = tuple(_to_hccl(a) if _looks_like_backend(a) else a for a in args)
        args, kwargs = _translate(args, kwargs)
        return fn(*args, **kwargs)

    return _mark(wrapper)


@_mark
def _is_hccl_available():
    """``torch.distributed.is_nccl_available`` under transfer_to_npu: is hccl available?"""
    dist = torch.distributed
    is_hccl_available = getattr(dist, "is_hccl_available", None)
    if callable(is_hccl_available) and not _is_ours(is_hccl_available):
        return bool(is_hccl_available())
    return "hccl" in dist.Backend.backend_list


def _patch_distributed():
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for owner in (dist, distributed_c10d):
        for name in ("init_process_group", "new_group", "_new_group_with_tag", "new_subgroups",
                     "new_subgroups_by_enumeration", "split_group"):
            _patch(owner, name, _hccl_backend)
        if not _is_ours(getattr(owner, "is_nccl_available", None)):
            owner.is_nccl_available = _is_hccl_available

    from torch.nn.parallel import DistributedDataParallel

    # DistributedDataParallel.__init__(self, module, device_ids=None, output_device=None, ...)
    _patch(DistributedDataParallel, "__init__", _device_args, 1, (2,))

    try:
        from torch.distributed import device_mesh
    except ImportError:  # pragma: no cover
        device_mesh = None
    if device_mesh is not None:
        _patch(device_mesh.DeviceMesh, "__init__", _device_args, 1)
        _patch(device_mesh, "init_device_mesh", _device_args)
        _patch(dist, "init_device_mesh", _device_args)

    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        FullyShardedDataParallel = None
    if FullyShardedDataParallel is not None:
        _patch(FullyShardedDataParallel, "__init__", _device_args, 1)


# ----------------------------------------------------------------------------------


def _warn():
    rank = os.environ.get("RANK")
    if rank not in (None, "", "0"):
        return
    warnings.warn(
        "torch_npu.contrib.transfer_to_npu: CUDA calls now run on NPUs: torch.cuda.* and "
        "torch.cuda.amp.* are torch.npu.* and torch.npu.amp.*; Tensor.cuda()/Module.cuda() "
        "are .npu() and Tensor.is_cuda is is_npu; 'cuda' device arguments of the tensor "
        "factories, Tensor.to/new_*/pin_memory, Module.to/to_empty, torch.autocast, "
        "torch.amp.GradScaler, torch.Generator, torch.load(map_location=...), DataLoader and "
        "DistributedDataParallel mean 'npu'; the distributed backend nccl is hccl.",
        stacklevel=4)


def _is_applied():
    return _is_ours(torch.Tensor.cuda)


def _apply():
    """Apply every mapping once per process; a second call does nothing."""
    if _is_applied():
        return
    _patch_cuda()
    _patch_torch()
    _patch_distributed()
    _patch_tensor_module_storage()  # last: its Tensor.cuda marks the whole as applied
    _warn()


_apply()
