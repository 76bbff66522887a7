"""Importing torch_npu: registration, version check, autoload, the monkey patches; import does
not start the runtime and fork children use the npu."""

import importlib
import os
import sys
import textwrap

import pytest
import torch

import torch_npu
from conftest import run_python


def test_registration():
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu is torch_npu.npu
    assert sys.modules["torch.npu"] is torch_npu.npu
    assert torch.device("npu:1").type == "npu"
    t = torch.ones(3).npu()
    assert t.is_npu and t.device == torch.device("npu:0")
    assert not torch.ones(1).is_npu
    m = torch.nn.Linear(2, 2).npu()
    assert m.weight.is_npu
    s = torch.UntypedStorage(8).npu()
    assert s.is_npu
    assert torch.get_device_module("npu") is torch_npu.npu


def test_version_attributes():
    from torch_npu import version

    assert torch_npu.__version__ == version.__version__
    assert torch_npu.__version__.startswith(version.torch_version)
    assert torch_npu._C.__torch_version__ == version.torch_version


def test_reimport_and_autoload_are_harmless():
    before = (torch.npu, torch.Tensor.npu, torch.nn.Module.npu)
    assert torch_npu._autoload() is None
    importlib.reload(torch_npu)
    assert (torch.npu, torch.Tensor.npu, torch.nn.Module.npu) == before
    assert torch.ones(2, device="npu").sum().item() == 2


def test_check_torch_version_logic():
    torch_npu._check_torch_version("2.13.0+cpu", "2.13.0", "2.13.0.post1")
    torch_npu._check_torch_version("2.13.0", "2.13.0", "2.13.0.post1")
    with pytest.raises(ImportError) as info:
        torch_npu._check_torch_version("2.14.1+cu126", "2.13.0", "2.13.0.post1")
    message = str(info.value)
    assert "torch_npu 2.13.0.post1" in message and "torch 2.13.0" in message
    assert "torch 2.14.1+cu126" in message
    assert "pip install torch==2.13.0" in message
    assert "torch_npu==2.14.1.*" in message


def test_version_mismatch_raises_before_loading_c():
    code = textwrap.dedent("""
        import sys, types
        fake = types.ModuleType("torch_npu.version")
        fake.__version__ = "9.9.0.post1"
        fake.torch_version = "9.9.0"
        fake.cann_version = "8.5.0"
        fake.git_version = "test"
        sys.modules["torch_npu.version"] = fake
        try:
            import torch_npu
        except ImportError as err:
            print("IMPORT-ERROR:", err)
            print("C-LOADED:", "torch_npu._C" in sys.modules)
        else:
            print("NO ERROR")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    installed = torch.__version__.split("+")[0]
    assert "IMPORT-ERROR:" in result.stdout, result.stdout + result.stderr
    assert "built for torch 9.9.0" in result.stdout
    assert f"torch {installed}" in result.stdout
    assert "pip install torch==9.9.0" in result.stdout
    assert f"torch_npu=={installed}.*" in result.stdout
    assert "C-LOADED: False" in result.stdout


def test_other_privateuse1_backend_is_refused():
    code = textwrap.dedent("""
        import torch
        torch.utils.rename_privateuse1_backend("foo")
        try:
            import torch_npu
        except ImportError as err:
            print("IMPORT-ERROR:", err)
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert "IMPORT-ERROR:" in result.stdout, result.stdout + result.stderr
    assert "'foo'" in result.stdout


def _write_entry_point(tmp_path):
    dist = tmp_path / "torch_npu_autoload_check-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-npu-autoload-check\n"
                                   "Version: 0.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return str(tmp_path)


def test_autoload_entry_point(tmp_path):
    site = _write_entry_point(tmp_path)
    code = textwrap.dedent("""
        import sys
        import torch
        print("LOADED:", "torch_npu" in sys.modules, hasattr(torch, "npu"))
        print("COUNT:", torch.npu.device_count())
        print("SUM:", torch.ones(3, device="npu").sum().item())
        import torch_npu
        torch_npu._autoload()
        print("SAME:", torch.npu is torch_npu.npu)
    """)
    env = {"PYTHONPATH": site, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    assert "LOADED: True True" in result.stdout
    assert "SUM: 3.0" in result.stdout
    assert "SAME: True" in result.stdout


def test_import_torch_npu_first_with_entry_point(tmp_path):
    # import torch_npu -> import torch -> autoload -> import torch_npu (partially initialised).
    site = _write_entry_point(tmp_path)
    code = "import torch_npu, torch; print('OK', torch.npu.device_count() > 0)"
    result = run_python(code, env={"PYTHONPATH": site, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert result.returncode == 0, result.stderr
    assert "OK True" in result.stdout


def test_autoload_disabled(tmp_path):
    site = _write_entry_point(tmp_path)
    code = "import sys, torch; print('LOADED:', 'torch_npu' in sys.modules)"
    result = run_python(code, env={"PYTHONPATH": site, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "LOADED: False" in result.stdout


def test_import_stays_light():
    code = textwrap.dedent("""
        import sys, torch
        before = set(sys.modules)
        import torch_npu
        new = set(sys.modules) - before
        heavy = sorted(m for m in new if m.startswith(("torch.testing", "torch._dynamo",
                                                       "torch._inductor", "torch_npu.testing")))
        print("HEAVY:", heavy)
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "HEAVY: []" in result.stdout


# ---- the monkey patches (torch_npu/_patches.py), one test each ---------------------


def test_patches_are_listed_and_documented():
    from torch_npu import _patches

    assert _patches._applied
    # Each is documented (the lazy-module patch is tested in test_lazy_modules.py; flex
    # attention in test_sdpa.py, DataParallel's torch._C primitives in test_data_parallel.py; the
    # others below).
    for patch in _patches.PATCHES:
        assert patch.__doc__ and len(patch.__doc__.strip()) > 40


def test_patches_elsewhere_name_real_modules_and_tests():
    """The modules _patches' docstring names for the other changes, and their tests, exist."""
    import re

    from torch_npu import _patches

    package = os.path.dirname(_patches.__file__)
    entries = re.findall(r"^\* ``([\w/]+\.py)``:.*?Tests: ([\w.,\s]+?)\.$", _patches.__doc__, re.M | re.S)
    assert [module for module, _ in entries] == re.findall(r"^\* ``([\w/]+\.py)``", _patches.__doc__, re.M)
    assert len(entries) >= 6
    for module, tests in entries:
        assert os.path.isfile(os.path.join(package, module)), module
        for test in re.split(r"[,\s]+", tests):
            assert os.path.isfile(os.path.join(os.path.dirname(__file__), test)), (module, test)


def _sets_attribute_of_torch(source):
    """Whether ``source`` sets an attribute of torch (``torch.x.y = ...``,
    ``setattr(torch.x, ...)``) or of a name it imported from torch (``from torch.x import m``
    or ``import torch.x as m``, then ``m.y = ...`` or ``setattr(m, ...)``)."""
    import re

    if re.search(r"^\s*(setattr\(\s*_?torch[.,]|_?torch(\.\w+)+\s*=[^=])", source, re.M):
        return True
    names = set()
    imports = r"^\s*(?:from\s+torch(?:\.\w+)*\s+import\s+(\([^)]*\)|[^\n]+)|import\s+torch(?:\.\w+)*\s+as\s+(\w+))"
    for imported, alias in re.findall(imports, source, re.M):
        names.update([alias] if alias else [])
        for part in re.sub(r"#[^\n]*", "", imported).strip("()\\ \n").split(","):
            names.update(part.split()[-1:])  # the name bound: "a" or the "b" of "a as b"
    if not names:
        return False
    name = "|".join(map(re.escape, sorted(names)))
    return bool(re.search(rf"^\s*(setattr\(\s*({name})\s*,|({name})(\.\w+)+\s*=[^=])", source, re.M))


def test_every_module_that_assigns_to_torch_is_in_the_patch_registry():
    """A module of the package that sets an attribute of torch (``torch.x.y = ...``,
    ``setattr(torch.x, ...)``, or ``m.y = ...`` where ``m`` was imported from torch) is
    _patches.py or is named there (its docstring, or the docstring of the patch in PATCHES
    that installs it)."""
    import re

    from torch_npu import _patches

    package = os.path.dirname(_patches.__file__)
    found = []
    for root, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                if _sets_attribute_of_torch(f.read()):
                    found.append(os.path.relpath(path, package).replace(os.sep, "/"))
    assert "_patches.py" in found and "_formats.py" in found  # the scan sees both forms
    # and assignments through a name imported from torch (a module, or an alias of one)
    assert "dynamo/graphs.py" in found and "testing/testcase.py" in found
    with open(_patches.__file__, encoding="utf-8") as f:
        registry = f.read()
    unlisted = [m for m in found if m != "_patches.py"
                and not re.search(r"(?<![\w/])(torch_npu/)?" + re.escape(m), registry)]
    assert not unlisted, f"modules changing torch that _patches' docstring does not name: {unlisted}"


def test_patch_torch_npu_submodule_aliases():
    import torch.npu.amp
    from torch.npu.amp import autocast

    assert torch.npu.amp is torch_npu.npu.amp
    assert autocast is torch_npu.npu.amp.autocast
    for name in ("streams", "memory", "random", "config", "utils", "amp.grad_scaler"):
        assert sys.modules[f"torch.npu.{name}"] is sys.modules[f"torch_npu.npu.{name}"]


def test_patch_profiler_activity_npu():
    activity = torch.profiler.ProfilerActivity
    assert activity.NPU == activity.PrivateUse1


def test_patch_torch_backends_npu():
    import torch.backends.npu  # noqa: F401  (importable, as torch.backends.cudnn is)

    assert torch.backends.npu.enabled is True
    torch.npu.set_cpu_fallback(False)  # as TORCH_NPU_FALLBACK_CPU_DISABLE=1
    try:
        torch.backends.npu.enabled = False  # unsupported operators fall back to the CPU all the same
        assert torch_npu._C._npu_getCpuFallback()
        with pytest.raises(TypeError, match="bool"):
            torch.backends.npu.enabled = "no"
    finally:
        torch.backends.npu.enabled = True  # back to what the environment says: the fallback, here
    assert torch_npu._C._npu_getCpuFallback()


def test_patch_checkpoint_default_device():
    from torch.utils.checkpoint import DefaultDeviceType

    assert DefaultDeviceType.get_device_type() == "npu"


def test_patch_linear_cross_entropy_auto_options():
    # npu resolves the chunked path's "auto" picks as cpu does (float32 accumulation for
    # half inputs), so the results equal the cpu's bit for bit.
    import torch.nn.functional as F
    from torch.nn import LinearCrossEntropyOptions

    opts = LinearCrossEntropyOptions(batch_chunk_size=2)
    resolved = opts._adjust(8, 8, 8, torch.float16, torch.device("npu:0"))
    assert resolved.acc_dtype == torch.float32
    assert resolved == opts._adjust(8, 8, 8, torch.float16, torch.device("cpu"))
    torch.manual_seed(0)
    x, w = torch.randn(8, 8, dtype=torch.float16), torch.randn(8, 8, dtype=torch.float16)
    target = torch.randint(0, 8, (8,))
    results = []
    for device in ("cpu", "npu"):
        xd, wd = x.to(device).requires_grad_(), w.to(device).requires_grad_()
        loss = F.linear_cross_entropy(xd, wd, target.to(device), reduction="sum", options=opts)
        results.append([t.cpu() for t in (loss, *torch.autograd.grad(loss, (xd, wd)))])
    for cpu, npu in zip(*results):
        assert torch.equal(cpu, npu)


def test_native_apis_need_no_patch():
    # These work through PyTorch's own PrivateUse1 support; torch_npu does not patch them.
    scaler = torch.amp.GradScaler("npu")
    assert scaler.is_enabled()
    assert torch.accelerator.current_accelerator().type == "npu"
    assert torch.accelerator.device_count() == torch.npu.device_count()
    assert isinstance(torch.Stream(device="npu:0"), torch.Stream)
    torch.Event("npu")


def test_patch_default_tensor_type_npu():
    try:
        torch.set_default_tensor_type(torch.npu.FloatTensor)
        x = torch.zeros(2)
        assert x.device.type == "npu" and x.dtype == torch.float32
        torch.set_default_tensor_type("torch.npu.DoubleTensor")
        assert torch.ones(1).dtype == torch.float64 and torch.ones(1).device.type == "npu"
        with pytest.raises(TypeError, match="floating-point"):
            torch.set_default_tensor_type(torch.npu.IntTensor)
    finally:
        torch.set_default_tensor_type(torch.FloatTensor)
    assert torch.zeros(1).device.type == "cpu" and torch.get_default_dtype() == torch.float32


# ---- import does not start the runtime; fork children use the npu (fresh interpreter) --

def test_import_does_not_start_runtime_and_fork_children_use_npu():
    code = textwrap.dedent("""
        import os, torch, torch_npu
        assert not torch_npu.npu.is_initialized(), "import started the runtime"
        assert torch.npu.is_available() and torch.npu.device_count() > 0
        assert not torch_npu.npu.is_initialized(), "a device query started the runtime"
        pid = os.fork()
        if pid == 0:
            ok = torch.equal((torch.ones(3, device="npu") * 2).cpu(), torch.full((3,), 2.))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status))
        torch.npu.manual_seed(7)
        a = torch.randn(4, device="npu")
        assert torch_npu.npu.is_initialized()
        torch.npu.manual_seed(7)
        assert torch.equal(a.cpu(), torch.randn(4, device="npu").cpu())
        print("OK")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "CHILD 0" in result.stdout and "OK" in result.stdout
