"""The changes torch_npu makes to ``torch`` at import that belong to no subsystem.

PyTorch's PrivateUse1 registration (``rename_privateuse1_backend``,
``_register_device_module``, ``generate_methods_for_privateuse1_backend``) already
gives ``torch.npu``, ``Tensor.npu()``/``is_npu``, ``Module.npu()``,
``Storage.npu()``/``is_npu``, ``PackedSequence.npu()``, ``ProfilerActivity.NPU``
(2.13) and makes ``torch.autocast("npu")``, ``torch.amp.GradScaler("npu")``,
``torch.Stream("npu")``, ``torch.Event("npu")`` and ``torch.accelerator`` work.
What is left is listed in :data:`PATCHES`: each entry is a small function with a
docstring saying what it changes and why, applied once by :func:`apply` at import.
Their tests are in ``python/tests/test_import.py`` unless the docstring names another
file. All are written for and tested with the torch of each pair in ``versions/``
(2.13, 2.14).

Changes that belong to one subsystem live with it, because they are applied when that
subsystem is (lazily, or only on request) or need its private state:

* ``_inductor/registration.py``: Dynamo's npu device interface, trace rules and RNG-state
  operators, and Inductor's scheduler, backend, lowering and codegen hooks (private torch
  APIs, each fetched through ``_private`` so that a renamed hook fails with a clear error).
  Applied by import hooks when ``torch._dynamo`` / ``torch._inductor.compile_fx`` is first
  imported, so ``import torch_npu`` does not import them. Tests: test_compile_inductor.py,
  test_compile_npu_semantics.py.
* ``_inductor/mlir/__init__.py``: the ``npu_backend`` Inductor config key and the
  ``torch.compile`` wrapper that routes to the MLIR compiler (installed at import; cheap,
  imports neither Inductor nor IREE). Tests: test_compile_mlir.py.
* ``multiprocessing/reductions.py``: the npu sharing methods of ``torch.UntypedStorage`` and
  ``torch.multiprocessing``'s tensor/storage reductions (installed at import by
  ``torch_npu/__init__.py``). Tests: test_multiprocessing_npu.py.
* ``_data_parallel.py``: ``torch._C._broadcast``, ``_scatter``, ``_gather`` & co. for npu
  tensors; installed through :data:`PATCHES` (``_data_parallel_comm``), the code lives with
  the rest of DataParallel's support. Tests: test_data_parallel.py.
* ``utils/__init__.py``: ``torch.version.cann``, set when ``torch_npu.utils`` is imported
  (``import torch_npu`` does), as torch_npu does; ``utils/collect_env.py`` sets it again when
  it reads the CANN version. Tests: test_compat_apis.py.
* ``_formats.py``: ``torch.Tensor.__deepcopy__`` keeps an npu tensor's tiled format (installed
  at import with ``torch_npu.Format``), as torch_npu's deepcopy does. Tests: test_formats.py.
* ``profiler/_add_metadata_sanitizer_patch.py``: ``torch.profiler``'s
  ``_KinetoProfile.add_metadata`` / ``add_metadata_json`` escape what would break the chrome
  trace (installed when ``torch_npu.profiler`` is imported). Tests: test_profiler.py.
* ``profiler/_flops_hook.py``: the operators with a FLOPs formula are wrapped only while a
  profile with ``with_flops=True`` records, and restored when it stops. Tests: test_utils_apis.py.
* ``profiler/_non_intrusive_profile.py``: ``torch.optim.Optimizer._patch_step_function``,
  only when ``PROF_CONFIG_PATH`` is set (dynamic profiling driven by ``optimizer.step()``).
  Tests: test_profiler.py.
* ``distributed/__init__.py``: the ``hccl`` backend of ``torch.distributed`` (registered
  through its plugin API), and ``torch.distributed.is_hccl_available`` /
  ``reinit_process_group`` (torch_npu's functions); once ``torch.distributed.tensor`` is imported,
  DTensor sharding strategies of npu operators (``distributed/tensor/_sharding.py``, through
  ``register_sharding``). Tests: test_hccl.py, test_hccl_reinit.py, test_dtensor_npu_ops.py.
* ``contrib/transfer_to_npu.py``: rewrites ``torch.cuda`` and CUDA device arguments to npu,
  only when a script imports it. Tests: test_transfer_to_npu.py.
* ``testing/_internal/common_fsdp.py``: points torch's FSDP test helpers
  (``torch.testing._internal.common_fsdp``: ``DEVICE_TYPE``, ``DISTRIBUTED_BACKEND``,
  ``DEVICE_COUNT``) at npu and hccl, only when a test imports it (``FSDPNPUTest``).
  Tests: test_fsdp_npu.py.
* ``testing/testcase.py``: ``run_tests`` swaps
  ``torch.testing._internal.common_utils.set_rng_seed`` for one that seeds torch and random
  only, for the duration of the call and restored afterwards, so numpy's generator stays as
  the test module seeded it, as torch_npu's runner does. Tests: test_testing_utils.py.
* ``distributed/tensor/experimental/_context_parallel/_attention.py``: ring attention over
  ``npu_fusion_attention`` in torch's context-parallel dispatcher (the SDPA-overrideable and fused
  attention operators' DTensor handlers), hooked in when the module is imported (by
  ``torch_npu.distributed.tensor.experimental``). Tests: test_context_parallel.py.
* ``distributed/rpc/backend_registry.py``: the ``NPU_TENSORPIPE`` RPC backend (torch's TensorPipe
  agent, CPU-only), registered when ``torch_npu.distributed.rpc`` is imported. Tests: test_rpc_npu.py.
* ``distributed/rpc/_transport.py``: while ``NPU_TENSORPIPE`` is the current agent, RPC's tensor
  pickling, ``rpc.remote`` and ``RRef.to_here`` move npu tensors through host memory by the device
  maps. Tests: test_rpc_npu.py.
* ``dynamo/trace_rules.py``: torch.npu's functions in Dynamo's trace rules, and
  ``torch.npu.Stream`` / ``Event`` / ``current_stream`` traced as torch.cuda's (Dynamo's
  ``UserDefinedClassVariable._in_graph_classes`` and ``TorchInGraphFunctionVariable._get_handlers``
  extended; applied with the device interface when ``torch._dynamo`` is first imported).
  Tests: test_compile_npu_semantics.py.
* ``dynamo/graphs.py``: the ``npugraphs`` backend swaps
  ``torch._dynamo.backends.common.aot_autograd`` for one that passes Inductor's decomposition
  table, only while it builds the AOTAutograd backend, and restores it. Tests: test_npu_graph.py.

A module that assigns to an attribute of ``torch``, or of a module or object it imported from
``torch`` (``common.aot_autograd = ...`` after ``from torch._dynamo.backends import common``),
must be this one or be named here: above, or in the docstring of the entry of :data:`PATCHES`
that installs it (test_import.py checks it).
"""

import functools
import os
import sys
import types
from typing import Callable, List

import torch

# Submodules of torch_npu.npu that must be reachable as torch.npu.<name>.
_NPU_SUBMODULES = ("utils", "streams", "memory", "random", "config", "graphs", "amp",
                   "amp.autocast_mode", "amp.grad_scaler")


def _alias_torch_npu_submodules() -> None:
    """Register ``torch.npu.<sub>`` in ``sys.modules`` for every submodule of ``torch_npu.npu``.

    ``torch._register_device_module`` only maps ``torch.npu`` itself. Without the
    aliases, ``import torch.npu.amp`` (or ``from torch.npu.amp import autocast``) would
    import ``torch_npu/npu/amp`` a second time under another name, giving duplicate
    classes (``isinstance`` checks between the two copies fail).
    """
    import importlib

    for name in _NPU_SUBMODULES:
        module = importlib.import_module(f"torch_npu.npu.{name}")
        sys.modules.setdefault(f"torch.npu.{name}", module)


def _profiler_activity_npu() -> None:
    """Make ``torch.profiler.ProfilerActivity.NPU`` an alias of ``PrivateUse1``.

    ``rename_privateuse1_backend("npu")`` does it in torch 2.13+; this only fills it
    in for a torch that does not.
    """
    activity = torch._C._profiler.ProfilerActivity
    if not hasattr(activity, "NPU"):
        setattr(activity, "NPU", activity.PrivateUse1)


def _checkpoint_default_device() -> None:
    """Make ``torch.utils.checkpoint`` default to ``"npu"`` (as torch_npu does).

    Activation checkpointing stashes and restores the RNG state of the default device
    type when it cannot infer one from the inputs; with the stock ``"cuda"`` default,
    dropout inside checkpointed NPU regions would not be replayed identically.
    """
    from torch.utils.checkpoint import DefaultDeviceType

    DefaultDeviceType.set_device_type("npu")


def _linear_cross_entropy_auto_options() -> None:
    """Resolve ``LinearCrossEntropyOptions``' ``"auto"`` picks for npu as for cpu.

    ``F.linear_cross_entropy``'s chunked path picks its accumulation dtype, precision
    policy and chunking per device type from lists that know only cuda and cpu; any other
    device gets float16/bfloat16 accumulation (``acc_dtype`` = the input dtype) and the
    ``"compact"`` policy. The 910B's cube units do have mixed-precision matmuls (half
    inputs, float32 results), and npu kernels are the CPU's, whose half GEMMs upcast to
    float32 -- the case the options' docs say to pick ``"accurate"`` for. So npu resolves
    like cpu: float32 accumulation, ``"accurate"``, ``"aspect_ratio"`` chunks, and the
    same results as the cpu.
    """
    from torch.nn.modules import linear_cross_entropy_options as lce

    options = getattr(lce, "LinearCrossEntropyOptions", None)
    adjust = getattr(options, "_adjust", None)
    if adjust is None or getattr(adjust, "_torch_npu_patched", False):
        return

    # Later torch releases add keyword arguments (2.14: prob_target): passed through as they are.
    def _adjust(self, num_batches, in_features, num_classes, dtype, device=None, **kwargs):
        if device is not None and torch.device(device).type == "npu":
            device = torch.device("cpu")
        return adjust(self, num_batches, in_features, num_classes, dtype, device, **kwargs)

    _adjust._torch_npu_patched = True
    options._adjust = _adjust


_DENSE_DEVICES = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", "npu"})
_SPARSE_DEVICES = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "npu"})
_shallow_copy_library = None  # keeps the kernel registered for the life of the process


def _npu_has_compatible_shallow_copy_type(self: torch.Tensor, src: torch.Tensor) -> bool:
    """``aten::_has_compatible_shallow_copy_type`` with npu among the dense and sparse backends.

    Dispatched here when the highest backend of the two tensors is npu (a dense or
    sparse COO one; sparse compressed, quantized, meta, ... tensors dispatch elsewhere).
    Mirrors ``TensorImpl::has_compatible_shallow_copy_type``: dense with dense and
    sparse with sparse across those devices.
    """

    def kind(t: torch.Tensor):
        if t.layout == torch.strided and t.device.type in _DENSE_DEVICES:
            return "dense"
        if t.layout == torch.sparse_coo and t.device.type in _SPARSE_DEVICES:
            return "sparse"
        return None

    self_kind = kind(self)
    return self_kind is not None and self_kind == kind(src)


def _lazy_modules_to_npu() -> None:
    """Let ``.npu()``/``.to("npu")`` move lazy modules (``nn.LazyLinear``, ...) as ``.cuda()`` does.

    Two things stock PyTorch knows only for its in-tree devices: (1) an
    ``UninitializedParameter`` allows ``Tensor.cuda`` but not ``Tensor.npu`` (else
    "Attempted to use an uninitialized parameter"), and (2) ``Module._apply`` keeps a
    parameter object (``param.data = moved``) only if ``torch._has_compatible_shallow_copy_type``
    is true, which ``TensorImpl`` hard-codes for cpu/cuda/...; for cpu -> npu it is false, so
    the uninitialized parameter was replaced by an empty ordinary ``Parameter`` and the
    first forward failed. (1) adds ``Tensor.npu`` to the allowed methods (as torch_npu does);
    (2) registers the operator for npu, the PrivateUse1 hook PyTorch documents for it.
    This also keeps ``param`` objects (and optimizers holding them) valid across
    ``Module.npu()`` like ``Module.cuda()``.
    """
    global _shallow_copy_library
    from torch.nn.parameter import UninitializedTensorMixin

    allowed = UninitializedTensorMixin._allowed_methods
    if torch.Tensor.npu not in allowed:
        allowed.append(torch.Tensor.npu)
    if _shallow_copy_library is None:
        library = torch.library.Library("aten", "IMPL")
        for key in ("PrivateUse1", "SparsePrivateUse1"):
            library.impl("_has_compatible_shallow_copy_type",
                         _npu_has_compatible_shallow_copy_type, key)
        _shallow_copy_library = library


class _NpuBackendsModule(types.ModuleType):
    """``torch.backends.npu``; ``enabled`` as the switch of the npu op library."""

    _enabled = True

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        from torch_npu import _C

        if not isinstance(value, bool):
            raise TypeError(f"torch.backends.npu.enabled must be a bool, got {type(value).__name__}")
        self._enabled = value
        # False: operators without an npu kernel run on the CPU even under
        # TORCH_NPU_FALLBACK_CPU_DISABLE=1; True: back to what that variable says.
        _C._npu_setCpuFallback(not value or os.environ.get("TORCH_NPU_FALLBACK_CPU_DISABLE") != "1")


def _torch_backends_npu() -> None:
    """Add ``torch.backends.npu`` with ``enabled`` (default True).

    Guides for torch_npu suggest ``torch.backends.npu.enabled = False`` to let operators the
    npu library does not support run on the CPU (copied to the CPU and back, with a warning):
    the default here as in torch_npu, and what False keeps even under
    ``TORCH_NPU_FALLBACK_CPU_DISABLE=1``; True restores what that variable says.
    """
    import torch.backends

    if "torch.backends.npu" not in sys.modules:
        module = _NpuBackendsModule("torch.backends.npu", _NpuBackendsModule.__doc__)
        # torch_npu's torch.backends.npu also has the SDPA switches of torch.npu
        # (sdp_kernel, enable_flash_sdp, ...; Huawei's test_native_mha uses them).
        from torch_npu.npu import backends as npu_backends

        for name in npu_backends.__all__:
            setattr(module, name, getattr(npu_backends, name))
        sys.modules["torch.backends.npu"] = module
        torch.backends.npu = module


def _flex_attention_on_npu() -> None:
    """Let ``torch.nn.attention.flex_attention`` run on npu tensors, under autocast too.

    torch_npu supports FlexAttention; PyTorch's entry point rejects devices outside its
    list (``_validate_device``, looked up at call time, so wrapping it also serves code
    that imported ``flex_attention`` before torch_npu), and its higher-order operator has
    autocast rules for CPU and CUDA only: under ``torch.autocast("npu")`` query, key and
    value are cast to the autocast dtype, as those rules do, and the operator runs below
    autocast. Tested in python/tests/test_sdpa.py.
    """
    import torch.nn.attention.flex_attention as api
    from torch._C import DispatchKey
    from torch._higher_order_ops.flex_attention import _autocast_cast, flex_attention

    original = api._validate_device

    def _validate_device(query, key, value):
        if query.device.type != "npu":
            original(query, key, value)

    api._validate_device = _validate_device

    @flex_attention.py_impl(DispatchKey.AutocastPrivateUse1)
    def _flex_attention_autocast_npu(query, key, value, score_mod, block_mask, scale, kernel_options,
                                     score_mod_other_buffers=(), mask_mod_other_buffers=()):
        dtype = torch.get_autocast_dtype("npu")
        query, key, value = (_autocast_cast(t, "npu", dtype) for t in (query, key, value))
        below = torch._C.DispatchKeySet(DispatchKey.AutocastPrivateUse1)
        with torch._C._ExcludeDispatchKeyGuard(below):
            return flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                                  score_mod_other_buffers, mask_mod_other_buffers)


def _data_parallel_comm() -> None:
    """Define ``torch._C._broadcast``, ``_scatter``, ``_gather`` & co. for npu tensors.

    ``nn.DataParallel`` / ``torch.nn.parallel.comm`` call them; PyTorch has them in CUDA
    builds only and torch_npu adds them to ``torch._C`` (see torch_npu/_data_parallel.py).
    """
    from torch_npu import _data_parallel

    _data_parallel.install()


def _default_tensor_type_npu() -> None:
    """``torch.set_default_tensor_type`` takes ``torch.npu``'s legacy types (``torch.npu.FloatTensor``
    or its name), as torch_npu's does.

    torch's accepts only the types it registered in C++. For an npu floating type, factory
    functions then make npu tensors of its dtype (``set_default_device("npu")`` and
    ``set_default_dtype``); a CPU type afterwards puts the default device back.
    """
    original = torch.set_default_tensor_type
    state = {"npu": False}

    @functools.wraps(original)  # torch's name, module and docstring (it stays torch.set_default_tensor_type)
    def set_default_tensor_type(t, /):
        from torch_npu.npu import _tensor_types

        if isinstance(t, str) and t.startswith("torch.npu."):
            t = getattr(_tensor_types, t[len("torch.npu."):], t)
        if isinstance(t, _tensor_types._NpuTensorType):
            if not t.dtype.is_floating_point:
                raise TypeError("invalid type object: only floating-point types are supported as the default type")
            torch.set_default_dtype(t.dtype)
            torch.set_default_device("npu")
            state["npu"] = True
            return
        original(t)
        if state["npu"]:
            torch.set_default_device(None)
            state["npu"] = False

    torch.set_default_tensor_type = set_default_tensor_type


def _legacy_save_npu_storages() -> None:
    """``torch.save(..., _use_new_zipfile_serialization=False)`` of npu tensors warns and raises
    naming NPUStorageImpl, as torch_npu's does (torch_npu/utils/serialization.py,
    ``_install_legacy_save_check``). Tests: test_utils_apis.py."""
    from torch_npu.utils import serialization

    serialization._install_legacy_save_check()


def _compiler_npugraph_mark_step_begin() -> None:
    """``torch.compiler.npugraph_mark_step_begin()``, torch_npu's counterpart of
    ``cudagraph_mark_step_begin`` for NPU graph trees (``mode="reduce-overhead"`` on npu): outputs
    of the previous step's graphs may be overwritten from the call on. It marks a step without
    importing Dynamo or Inductor. Tests: test_graph_tree.py."""
    from torch_npu.npu._graph_tree_state import mark_step_begin

    def npugraph_mark_step_begin():
        mark_step_begin()

    npugraph_mark_step_begin.__doc__ = mark_step_begin.__doc__
    torch.compiler.npugraph_mark_step_begin = npugraph_mark_step_begin


_philox_library = None


def _philox_rand_on_npu() -> None:
    """``torch.ops.rngprims.philox_rand`` (torch's stateless Philox rand; CUDA only) for npu:
    ``torch_npu.npu.random._philox_rand``. Inductor lowers it on npu as a call of that kernel
    (_inductor/registration.py). Tests: test_compile_inductor.py."""
    global _philox_library
    if _philox_library is None:
        from torch_npu.npu.random import _philox_rand

        library = torch.library.Library("rngprims", "IMPL")
        library.impl("philox_rand", _philox_rand, "PrivateUse1")
        _philox_library = library


#: The patches, in application order.
PATCHES: List[Callable[[], None]] = [
    _alias_torch_npu_submodules,
    _profiler_activity_npu,
    _checkpoint_default_device,
    _linear_cross_entropy_auto_options,
    _lazy_modules_to_npu,
    _torch_backends_npu,
    _flex_attention_on_npu,
    _data_parallel_comm,
    _default_tensor_type_npu,
    _legacy_save_npu_storages,
    _compiler_npugraph_mark_step_begin,
    _philox_rand_on_npu,
]

_applied = False


def apply() -> None:
    """Apply :data:`PATCHES` once per process."""
    global _applied
    if _applied:
        return
    for patch in PATCHES:
        patch()
    _applied = True
