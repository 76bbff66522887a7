"""torch_npu's public API is Huawei's: every name, with the same signature.

The reference is ``tests/data/torch_npu_api.json``, derived by ``tools/derive_api_list.py``
from Ascend/pytorch's ``test/torch_npu_schema.json`` (its header names the commit). It keeps
every entry checkable from Python; excluded are the prefixes ``torch_c_func:`` (C++ header
declarations, not reachable from Python) and ``torch_npu_public_env:`` (environment-variable
value tables quoted from a C++ source) -- see the data file's ``_excluded_prefixes``.

* ``torch_npu.a.b.C.m`` entries are resolved by an attribute walk from ``torch_npu`` (a
  submodule that is not yet an attribute is imported, as ``import torch_npu.a.b`` would) and
  ``str(inspect.signature(obj))`` is compared with the recorded string, normalised only where
  the text is not about the API: runs of whitespace, object addresses (``<function f at
  0x7f..>`` -> ``<function f>``), module paths in module reprs, and the ``boundary=None`` that
  Python 3.11+ adds to Enum class signatures (Huawei's own test makes the same allowances).
* ``torch_npu.npu_*`` names that are ``torch.ops.npu`` operators (``OpOverloadPacket``, as in
  Huawei's torch_npu, which exports every ``torch.ops.npu.<op>`` as ``torch_npu.<op>``) are
  only checked for presence: their recorded strings are the parameters of long-gone Python
  wrappers, Huawei's own torch_npu does not match them either (its compatibility test skips
  ``torch._ops.npu`` objects: "checked in op-plugin"), and the operator's schema is op-plugin's.
* Names listed in ``tests/data/torch_npu_api_gaps.txt`` (with why) are known not to match yet;
  any other mismatch fails, and so does a listed name that now matches: the list only shrinks.
* ``__module__`` of public names (Huawei's test/npu/test_public_bindings.py rule): in a module
  with ``__all__``, a callable or class looks public when its name has no leading ``_`` and its
  ``__module__`` starts with the module's path with no ``._`` in it; it must be in ``__all__``
  exactly when it looks public. torch_npu's exported operators (``torch._ops.npu``, listed in
  ``torch_npu.__all__`` when op-plugin marks them ``exposed``) are the exception Huawei's test
  lets through with op-plugin's allow-list.
* ``func: name[.overload]`` entries are NPU native functions: the schema of
  ``torch.ops.npu.name.overload`` must match; an empty recorded signature means an ATen op that
  torch_npu implements for npu (a PrivateUse1 kernel must be registered for ``aten::name``).
"""

import importlib
import inspect
import json
import os
import re

import pytest
import torch
import torch_npu  # noqa: F401

from conftest import run_python

DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch_npu_api.json")
with open(DATA_FILE, encoding="utf-8") as _f:
    DATA = json.load(_f)
ENTRIES = DATA["entries"]
GAPS_FILE = os.path.join(os.path.dirname(DATA_FILE), "torch_npu_api_gaps.txt")


def normalise(sig: str) -> str:
    sig = re.sub(r" at 0x[0-9a-fA-F]+>", ">", sig)
    sig = re.sub(r"<module '([\w.]+)' from '[^']*'>", r"<module '\1'>", sig)
    sig = re.sub(r",\s*boundary=[^,)]+", "", sig)
    return re.sub(r"\s+", " ", sig).strip()


def resolve(name: str):
    """The object a qualified name denotes, or raise LookupError naming the missing part.

    An attribute walk from the root package; where an attribute is missing, the prefix is
    taken as a module path (as Huawei's list was made: by importing each module), so that
    ``torch_npu.npu.mstx.mstx.mark`` finds the module ``torch_npu.npu.mstx`` even though the
    attribute ``torch_npu.npu.mstx`` is the class ``mstx``."""
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i in range(1, len(parts)):
        try:
            obj = getattr(obj, parts[i])
            continue
        except AttributeError:
            pass
        for module_path in (".".join(parts[: i + 1]), ".".join(parts[:i])):
            try:
                module = importlib.import_module(module_path)
            except ModuleNotFoundError:
                continue
            if module_path == ".".join(parts[: i + 1]):
                obj = module
                break
            if hasattr(module, parts[i]):
                obj = getattr(module, parts[i])
                break
        else:
            raise LookupError(".".join(parts[: i + 1]))
    return obj


def python_signature(obj) -> str:
    return normalise(str(inspect.signature(obj)))


def op_signature(name: str):
    """(found, signature) of a 'func: ' entry."""
    op = name[len("func: "):]
    base, _, overload = op.partition(".")
    if not ENTRIES[name]:
        return torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{base}",
                                                                      "PrivateUse1"), ""
    packet = getattr(torch.ops.npu, base, None)
    if packet is None:
        return False, None
    try:
        schema = str(getattr(packet, overload or "default")._schema)
    except AttributeError:
        return False, None
    return True, normalise(schema[schema.index("("):])


def check_all():
    """(missing names, changed signatures, names that are torch.ops.npu operators)."""
    missing, changed, ops = [], [], []
    for name, expected in ENTRIES.items():
        if name.startswith("func: "):
            found, sig = op_signature(name)
        else:
            try:
                obj = resolve(name)
            except LookupError:
                found, sig = False, None
            except Exception as e:  # an import that fails is a missing name, with its reason
                missing.append(f"{name}  (import failed: {type(e).__name__}: {e})")
                continue
            else:
                found = True
                if isinstance(obj, torch._ops.OpOverloadPacket):
                    ops.append(name)
                    continue
                try:
                    sig = python_signature(obj)
                except (TypeError, ValueError) as e:
                    sig = f"<no signature: {e}>"
        if not found:
            missing.append(name)
        elif sig != normalise(expected):
            changed.append(f"{name}\n    expected {normalise(expected)}\n    actual   {sig}")
    return missing, changed, ops


def test_data_file_is_derived():
    src = DATA["_source"]
    assert src["repository"] == "https://github.com/Ascend/pytorch" and len(src["commit"]) == 40
    excluded = sum(v["count"] for v in DATA["_excluded_prefixes"].values())
    assert len(ENTRIES) + excluded == src["schema_entries"]
    assert not any(n.startswith(tuple(DATA["_excluded_prefixes"])) for n in ENTRIES)


def known_gaps() -> set:
    """The names of ``tests/data/torch_npu_api_gaps.txt``: what is not matched yet, and why."""
    with open(GAPS_FILE, encoding="utf-8") as f:
        return {line.split("#")[0].strip() for line in f if line.split("#")[0].strip()}


def test_public_api_matches_torch_npu():
    missing, changed, _ = check_all()
    gaps = known_gaps()
    name = lambda entry: entry.split("\n")[0].split("  (")[0]  # noqa: E731
    new_missing = [m for m in missing if name(m) not in gaps]
    new_changed = [c for c in changed if name(c) not in gaps]
    closed = sorted(gaps - {name(m) for m in missing} - {name(c) for c in changed})
    msg = []
    if new_missing:
        msg.append(f"{len(new_missing)} of {len(ENTRIES)} public names are missing:\n  "
                   + "\n  ".join(new_missing))
    if new_changed:
        msg.append(f"{len(new_changed)} signatures differ from Huawei's:\n  " + "\n  ".join(new_changed))
    if closed:
        msg.append(f"{len(closed)} names of {os.path.basename(GAPS_FILE)} now match: remove them:\n  "
                   + "\n  ".join(closed))
    assert not msg, "\n".join(msg)


def test_submodules_after_plain_import():
    """`import torch_npu` alone makes the submodules available that Huawei's import does."""
    code = ("import torch, torch_npu\n"
            "torch_npu.optim.NpuFusedAdamW; torch_npu._afd; torch_npu.npu.aclnn\n"
            "torch_npu.contrib.function; torch_npu.contrib.module\n"
            "torch_npu.utils.syncbatchnorm; torch_npu.profiler; torch_npu.distributed\n"
            "print('ok')\n")
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_exported_operators_have_docstrings():
    # torch_npu gives every name of torch_npu.__all__ a docstring; the operators get their signatures
    missing = [name for name in torch_npu.__all__ if getattr(torch_npu, name).__doc__ is None]
    assert not missing
    doc = torch_npu.npu_format_cast.__doc__
    assert doc.splitlines()[0].startswith("torch_npu.npu_format_cast(Tensor self, int acl_format")
    assert "(overload ``Tensor``)" in doc and "torch.ops.npu.npu_format_cast" in doc
    assert torch.ops.npu.npu_linear.__doc__ == torch_npu.npu_linear.__doc__
    # a docstring of its own is kept
    assert torch_npu.matmul_checksum.__doc__ and "torch_npu.matmul_checksum(" not in torch_npu.matmul_checksum.__doc__


def _module_name_violations(modname, exempt=()):
    """Names of module ``modname`` that break the __module__ rule (see the module docstring)."""
    import collections.abc

    mod = importlib.import_module(modname)
    bad = []
    for elem in dir(mod):
        obj = getattr(mod, elem)
        if elem in exempt or not (isinstance(obj, (collections.abc.Callable, torch.dtype)) or inspect.isclass(obj)):
            continue
        module = getattr(obj, "__module__", None) or ""
        looks_public = not elem.startswith("_") and module.startswith(modname) and "._" not in module
        public = elem in mod.__all__ if hasattr(mod, "__all__") else not elem.startswith("_")
        if public != looks_public and (hasattr(mod, "__all__") or not elem.startswith("_")):
            bad.append(f"{elem} (__module__ {module!r}, {'in' if public else 'not in'} __all__)")
    return bad


@pytest.mark.parametrize("modname", [
    "torch_npu.npu.utils", "torch_npu.npu.memory", "torch_npu.npu.npu_config", "torch_npu.npu.config",
    "torch_npu.npu.op_support", "torch_npu.contrib.function.anchor_generator", "torch_npu.contrib.module.focus",
    "torch_npu.contrib.module.channel_shuffle", "torch_npu.contrib.module.linear_quant",
    "torch_npu.contrib.module.linear_a8w8_quant", "torch_npu.contrib.module.linear_weight_quant",
    "torch_npu.multiprocessing.reductions", "torch_npu.testing.common_utils", "torch_npu.testing.common_distributed",
    "torch_npu.profiler.scheduler", "torch_npu.distributed"])
def test_public_names_have_their_modules(modname):
    assert not _module_name_violations(modname)


def test_public_names_of_packages_with_allowlisted_exceptions():
    # the exceptions Huawei's allow-list (test/allowlist_for_publicAPI.json) names
    assert not _module_name_violations("torch_npu.profiler", exempt=("ProfilerActivity", "_ExperimentalConfig"))
    assert not _module_name_violations("torch_npu.profiler.profiler", exempt=("_KinetoProfile",))
    tensor_types = ("BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor",
                    "LongTensor", "ShortTensor", "BFloat16Tensor", "restart_device", "stop_device", "set_op_timeout_ms",
                    "NpuGraphOpHandler", "register_npu_graph_handler")
    assert not _module_name_violations("torch_npu.npu", exempt=tensor_types)
    # torch_npu: only operators (torch.ops.npu packets, exported by name) keep torch's module
    bad = _module_name_violations("torch_npu")
    assert bad and all("'torch._ops.npu'" in b for b in bad), bad
    from torch_npu import _fused_ops
    ops = [n for n in torch_npu.__all__ if isinstance(getattr(torch_npu, n), torch._ops.OpOverloadPacket)]
    assert set(ops) <= _fused_ops.EXPOSED and {"npu_rms_norm", "npu_lstm", "npu_rotated_iou"} <= set(ops)
    assert "npu_lstm_backward" not in torch_npu.__all__ and hasattr(torch_npu, "npu_lstm_backward")
    assert not hasattr(torch.distributed, "ProcessGroupHCCL")  # torch_npu sets none (its class is in _C)

