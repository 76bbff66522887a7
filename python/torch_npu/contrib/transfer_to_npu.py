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

* ``torch.cuda`` (and ``torch.cuda.amp``, ``.amp.autocast_mode``, ``.amp.common``,
  ``.amp.grad_scaler``, ``.random``, ``.memory``, ``.streams``) gets every public name of
  the matching ``torch.npu`` module: ``is_available`` (so ``torch.cuda.is_available()`` is
  ``True``), ``device_count``, ``set_device``, ``synchronize``, ``Stream``/``Event``/
  ``stream``, the memory statistics, ``manual_seed*``, ``amp.autocast``/``amp.GradScaler``,
  ``get_device_name``/``get_device_properties``, ... Their device arguments accept
  ``"cuda"``, ``"cuda:N"`` and ``torch.device("cuda", N)``; ``isinstance`` checks against
  ``torch.cuda.Stream``/``torch.cuda.device`` hold for the NPU objects. The attributes
  ``torch.cuda.amp.autocast_mode``/``common``/``grad_scaler`` are the ``torch.npu.amp``
  modules; ``torch.cuda.memory._record_memory_history``/``_snapshot``/``_dump_snapshot``
  are the NPU ones and ``torch._C._host_emptyCache`` empties the NPU pinned-memory cache.
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
  ``DataLoader(pin_memory_device=...)``, ``torch.autograd.profiler_util.Kernel``,
  ``torch.utils.cpp_extension.include_paths`` and ``torch.load(map_location=...)`` means
  the NPU of the same index. Checkpoints saved on a CUDA machine load onto the NPUs.
* ``torch.distributed``: backend ``"nccl"`` (also inside ``"cpu:gloo,cuda:nccl"``) is
  ``"hccl"`` in ``init_process_group``, ``new_group`` (and everything built on it),
  ``new_subgroups*`` and ``split_group``; ``is_nccl_available`` answers for hccl and
  ``ProcessGroupNCCL`` is ``ProcessGroupHCCL``; ``"cuda"`` has no entry in
  ``Backend.default_device_backend_map``; CUDA devices are accepted by
  ``init_process_group(device_id=...)``, ``get_default_backend_for_device``,
  ``ProcessGroup._get_backend``,
  ``DistributedDataParallel(device_ids=..., output_device=...)``,
  ``FullyShardedDataParallel(device_id=...)``, ``DeviceMesh``/``init_device_mesh``.
* ``torch.profiler.profile``/``schedule``/``tensorboard_trace_handler`` are
  ``torch_npu.profiler``'s; ``ProfilerActivity.CUDA`` among the activities records the
  NPUs, and an ``experimental_config`` that is not torch_npu's is dropped (logged).
* The library functions listed in ``apis_config.json`` (transformers, accelerate, peft,
  trl: bitsandbytes/flash-attention probes, NCCL set-ups, ...) see torch's own
  ``torch.cuda.is_available()`` while they run, so they keep their NPU code paths.
* ``torch.cuda.CUDAGraph``/``graph``/``make_graphed_callables``/``graph_pool_handle``/
  ``is_current_stream_capturing`` become the ``torch.npu`` equivalents when those exist.

Code on CPU tensors keeps its behaviour: only arguments that *are* CUDA devices are
rewritten (a file called ``cuda_model.pt`` stays as it is), CPU devices and integer
indices are passed through unchanged. ``torch.backends.cuda``/``cudnn`` flags (e.g.
``torch.backends.cuda.matmul.allow_tf32 = True``) are left alone: setting them is
harmless and has no effect on NPUs.

The legacy typed tensor classes (``torch.cuda.FloatTensor(2)``) make NPU tensors;
``torch.cuda.DoubleTensor`` keeps float64, which the simulated NPUs compute (torch_npu
narrows it to ``FloatTensor``).

Not mapped: ``x.device.type == "cuda"`` comparisons in user code, ``torch.cuda.nvtx``, other
private ``torch.cuda._*`` functions, TorchScript code, Inductor internals (Huawei's
``has_triton``/``get_gpu_type`` patches; Dynamo itself traces through the wrappers),
``torch.distributed.pipelining`` (wrapping its stages would import it, over a second, in
every process). Unlike Huawei's module this one does not disable
``torch.jit.script``, does not change the global warning filters, and rewrites only
arguments that are exactly CUDA devices (``_replace_cuda_to_npu_in_dict``, kept for code
calling torch_npu's helper, replaces every "cuda" substring).
"""

import functools
import importlib
import importlib.metadata
import inspect
import json
import logging
import os
import re
import sys
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


def _device_translating_alias(cls, module, qualname, translate=_translate):
    """The alias of ``cls``; ``translate(args, kwargs) -> (args, kwargs)`` rewrites the
    constructor's arguments (CUDA devices by default)."""
    if (cls, translate) in _aliases:
        return _aliases[cls, translate]

    class _AliasMeta(type(cls)):
        def __call__(self, *args, **kwargs):
            args, kwargs = translate(args, kwargs)
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
    _aliases[cls, translate] = alias
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
    for name in ("amp.autocast_mode", "amp.common", "amp.grad_scaler", "memory", "random", "streams"):
        importlib.import_module("torch.cuda." + name)

    pairs = [
        (torch.cuda, npu),
        (torch.cuda.amp, npu.amp),
        (torch.cuda.amp.autocast_mode, npu.amp.autocast_mode),
        (torch.cuda.amp.common, npu.amp.common),
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

    # torch.cuda.amp's submodules are torch.npu.amp's (as in torch_npu); the modules
    # imported under the torch.cuda.amp names (above) hold the NPU names as well.
    for name in ("autocast_mode", "common", "grad_scaler"):
        setattr(torch.cuda.amp, name, getattr(npu.amp, name))

    # The memory history and snapshots (private in torch.cuda.memory too).
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        if hasattr(npu.memory, name):
            setattr(torch.cuda.memory, name, _device_args(getattr(npu.memory, name)))
    # torch.cuda.graph's capture empties the pinned host cache through this binding.
    torch._C._host_emptyCache = torch_npu._C._npu_hostEmptyCache

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
        # Modules that imported it by name before (distributed checkpoint loading).
        filesystem = sys.modules.get("torch.distributed.checkpoint.filesystem")
        if getattr(filesystem, "_get_available_device_type", None) is _get_available_device_type:
            filesystem._get_available_device_type = torch_utils._get_available_device_type

    cpp_extension = importlib.import_module("torch.utils.cpp_extension")
    _patch(cpp_extension, "include_paths", _device_args)


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


def _del_nccl_device_backend_map():
    """Forget the default backend of CUDA devices (``Backend.default_device_backend_map``).

    ``is_nccl_available()`` answers for hccl, so c10d would otherwise pick "nccl" for a
    "cuda" device type it meets untranslated; without the entry it has no default there.
    """
    backend_map = getattr(torch.distributed.Backend, "default_device_backend_map", None)
    if isinstance(backend_map, dict):
        backend_map.pop("cuda", None)


def _patch_distributed():
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for owner in (dist, distributed_c10d):
        for name in ("init_process_group", "new_group", "_new_group_with_tag", "new_subgroups",
                     "new_subgroups_by_enumeration", "split_group"):
            _patch(owner, name, _hccl_backend)
        _patch(owner, "get_default_backend_for_device", _device_args)
        if not _is_ours(getattr(owner, "is_nccl_available", None)):
            owner.is_nccl_available = _is_hccl_available
    _patch(dist.ProcessGroup, "_get_backend", _device_args, 1)

    # c10d refers to ProcessGroupNCCL wherever is_nccl_available() is true (options,
    # isinstance checks): the HCCL process group stands for it.
    hccl = getattr(getattr(torch_npu._C, "_distributed_c10d", None), "ProcessGroupHCCL", None)
    if hccl is not None:
        dist.ProcessGroupNCCL = distributed_c10d.ProcessGroupNCCL = hccl

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

    # Last: importing FSDP registers the "fake" backend, which claims "cuda" when free.
    _del_nccl_device_backend_map()


# ----------------------------------------------------------------------------------
# torch.profiler -> torch_npu.profiler


def _profiler_arguments(args, kwargs):
    """Arguments of ``torch.profiler.profile`` for ``torch_npu.profiler.profile``.

    ``ProfilerActivity.CUDA`` among the activities is the NPU activity. An
    ``experimental_config`` that is not torch_npu's ``_ExperimentalConfig`` (torch's is
    for CUDA) is dropped with a logged warning, so the NPU defaults apply.
    """
    import torch_npu.profiler as npu_profiler

    config = kwargs.get("experimental_config")
    if config is not None and not isinstance(config, npu_profiler._ExperimentalConfig):
        logging.warning(
            "transfer_to_npu: torch.profiler.profile(experimental_config=%r) is not a "
            "torch_npu.profiler._ExperimentalConfig (a CUDA profiler setting?) and was dropped; "
            "pass torch_npu.profiler._ExperimentalConfig(...) to configure the NPU profiler.",
            config)
        del kwargs["experimental_config"]
    activities = kwargs.get("activities")
    if activities is not None:
        cuda = torch.profiler.ProfilerActivity.CUDA
        kwargs["activities"] = [npu_profiler.ProfilerActivity.NPU if a == cuda else a
                                for a in activities]
    return args, kwargs


def _wrapper_profiler(fn):
    """Wrap a profiler constructor so that it takes the arguments CUDA code passes to
    ``torch.profiler.profile`` (see ``_profiler_arguments``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args, kwargs = _profiler_arguments(args, kwargs)
        return fn(*args, **kwargs)

    return _mark(wrapper)


def _patch_profiler():
    import torch_npu.profiler as npu_profiler

    if not _is_ours(torch.profiler.profile):
        torch.profiler.profile = _device_translating_alias(
            npu_profiler.profile, "torch.profiler", "profile", _profiler_arguments)
    torch.profiler.schedule = npu_profiler.schedule
    torch.profiler.tensorboard_trace_handler = npu_profiler.tensorboard_trace_handler


# ----------------------------------------------------------------------------------
# Libraries that must see whether CUDA itself is available
#
# apis_config.json (next to this file) names, per library and minimum version, functions
# and methods that ask ``torch.cuda.is_available()`` to choose CUDA-only code (bitsandbytes,
# flash-attn, NCCL set-ups, ...) where the library has an NPU path of its own:
# ``{"<distribution>": {"version": "<min>", "apis": {"<module>.<function>": "function",
# "<module>.<Class>.<method>": "method"}}}``. While such a function runs,
# ``torch.cuda.is_available`` is torch's own again.

_CONFIG_PATH = os.path.join(os.path.dirname(os.path.realpath(__file__)), "apis_config.json")
_MAX_CONFIG_BYTES = 10 * 1024 ** 2
_MAX_CONFIG_NAME = 200

#: torch's own torch.cuda.is_available (kept by importlib.reload, which reuses globals).
_cuda_is_available = globals().get("_cuda_is_available", torch.cuda.is_available)


def _check_input_file_valid(file_path):
    """Whether ``file_path`` is a file to read a configuration from: not a symbolic link,
    existing, readable, a name of at most 200 characters and at most 10 MiB."""
    if os.path.islink(os.path.abspath(file_path)):
        return False
    path = os.path.realpath(file_path)
    if not os.path.exists(path) or not os.access(path, os.R_OK):
        return False
    return len(os.path.basename(path)) <= _MAX_CONFIG_NAME and os.path.getsize(path) <= _MAX_CONFIG_BYTES


def _load_json_file(file_path):
    """The JSON object in ``file_path``; ``{}`` if the file is not valid (see
    ``_check_input_file_valid``), not JSON, or holds something other than an object."""
    if not _check_input_file_valid(file_path):
        return {}
    try:
        with open(file_path, "r", encoding="utf-8") as file:
            content = json.load(file)
    except (OSError, ValueError):  # json.JSONDecodeError is a ValueError
        return {}
    return content if isinstance(content, dict) else {}


def _wrapper_libraries_func(fn):
    """Run ``fn`` with torch's own ``torch.cuda.is_available`` (False without CUDA).

    The swap is process-wide for the duration of the call (as in torch_npu).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        patched = torch.cuda.is_available
        torch.cuda.is_available = _cuda_is_available
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.is_available = patched

    return _mark(wrapper)


def _version_at_least(version, minimum):
    try:
        from packaging.version import Version
    except ImportError:  # pragma: no cover  (packaging comes with torch's dependencies)
        def Version(text):
            return tuple(int(part) for part in re.findall(r"\d+", text))
    try:
        return Version(version) >= Version(minimum)
    except Exception:  # an unparsable version: leave the library alone
        return False


def _resolve(full_name, kind):
    """``(owner, attribute)`` of ``module.function`` / ``module.Class.method``, or None."""
    parts = full_name.split(".")
    split = -1 if kind == "function" else -2
    if kind not in ("function", "method") or len(parts) <= -split:
        return None
    try:
        owner = importlib.import_module(".".join(parts[:split]))
        if kind == "method":
            owner = getattr(owner, parts[-2])
    except Exception:  # the library's optional parts may not import: nothing to wrap
        return None
    return (owner, parts[-1]) if callable(getattr(owner, parts[-1], None)) else None


def _do_wrapper_libraries_func(config):
    """Wrap the functions ``config`` (apis_config.json's content) names in the installed
    libraries that are at least the given version."""
    for distribution, entry in config.items():
        if not isinstance(entry, dict):
            continue
        try:
            installed = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        minimum, apis = entry.get("version"), entry.get("apis")
        if not (isinstance(minimum, str) and isinstance(apis, dict)
                and _version_at_least(installed, minimum)):
            continue
        for full_name, kind in apis.items():
            found = _resolve(full_name, kind)
            if found is not None:
                _patch(found[0], found[1], _wrapper_libraries_func)


# ----------------------------------------------------------------------------------
# torch_npu's helper names, for code written against them


#: Wrap a function so that CUDA devices among its arguments (``device_ids`` lists included)
#: become NPU devices.
_wrapper_cuda = _device_args
#: Wrap a c10d function: backend nccl -> hccl, CUDA devices -> NPU devices.
_wrapper_hccl = _hccl_backend


def _replace_cuda_to_npu_in_dict(device_dict):
    """A copy of ``device_dict`` with "cuda" replaced by "npu" in every string key and value
    (``{"cuda:0": "cuda:1"}`` -> ``{"npu:0": "npu:1"}``), as torch_npu's helper does.

    The patched functions do not use it: ``torch.load``'s ``map_location`` dicts are
    translated by ``_to_npu_map_location``, which rewrites only whole device names.
    """
    def replace(value):
        return value.replace("cuda", _NPU) if isinstance(value, str) else value

    return {replace(key): replace(value) for key, value in device_dict.items()}


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


def _patch_dynamo_cuda_interface():
    """Dynamo's "cuda" device interface answers for NPUs now, which have no Triton backend:
    torch's Triton probes (torch.utils._triton, when the triton package is installed) would
    compare the NPU's compute capability (None, as torch_npu's get_device_capability gives)
    with CUDA's and fail the first torch.compile. Run when torch._dynamo is imported
    (torch_npu._inductor.registration) or at once if it is."""
    from torch._dynamo.device_interface import CudaInterface
    import torch.utils._triton as triton_utils

    CudaInterface.is_triton_capable = staticmethod(lambda device=None: False)
    probe = getattr(triton_utils, "_device_supports_tensor_descriptor", None)
    if probe is not None and hasattr(triton_utils, "has_triton_cpu_backend"):
        # CUDA's tensor descriptors need compute capability 9.0; NPUs have none.
        triton_utils._device_supports_tensor_descriptor = functools.cache(triton_utils.has_triton_cpu_backend)


def _apply():
    """Apply every mapping once per process; a second call does nothing."""
    if _is_applied():
        return
    _patch_cuda()
    _patch_torch()
    _patch_distributed()
    _patch_profiler()
    _do_wrapper_libraries_func(_load_json_file(_CONFIG_PATH))
    _patch_tensor_module_storage()  # last: its Tensor.cuda marks the whole as applied
    if "torch._dynamo.device_interface" in sys.modules:
        _patch_dynamo_cuda_interface()
    _warn()


_apply()
