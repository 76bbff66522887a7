"""The simulated CANN toolkit home (torch_npu/cann) and the environment torch_npu exports.

Tools written for Ascend find CANN through ASCEND_HOME_PATH (DeepSpeed's npu op builders
read it unguarded; torch_npu checks it at import): importing torch_npu with it unset points it
and set_env.sh's other variables at the home shipped in the package; set by the user, it is
checked with torch_npu's texts.
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

import torch_npu
from conftest import subprocess_env

HOME = os.path.join(os.path.dirname(os.path.abspath(torch_npu.__file__)), "cann")
pytestmark = pytest.mark.skipif(not os.path.isdir(HOME), reason="no torch_npu/cann (source tree without tools/dev_link.sh)")
CANN_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_AICPU_PATH", "ASCEND_OPP_PATH")


def _python(code, **env_changes):
    env = {k: v for k, v in subprocess_env().items() if k not in CANN_VARS}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_import_exports_the_home_when_unset():
    p = _python("import os, torch_npu; print([os.environ.get(k) for k in %r])" % (CANN_VARS,))
    assert p.returncode == 0, p.stderr[-2000:]
    home = os.path.realpath(HOME)
    values = [os.path.realpath(v) for v in eval(p.stdout.strip().splitlines()[-1])]
    assert values == [home, home, home, os.path.join(home, "opp")]


def test_set_env_sh_sets_what_import_sets():
    out = subprocess.run(["bash", "-c", f"source {HOME}/set_env.sh && "
                          "echo $ASCEND_HOME_PATH $ASCEND_TOOLKIT_HOME $ASCEND_OPP_PATH $LD_LIBRARY_PATH"],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]}).stdout.split()
    home = os.path.realpath(HOME)
    assert [os.path.realpath(v) for v in out[:3]] == [home, home, os.path.join(home, "opp")]
    assert os.path.realpath(out[3].split(":")[0]) == os.path.join(home, "lib64")


def test_the_home_is_shaped_as_an_installed_toolkit():
    # torch_npu's own get_cann_version (and DeepSpeed's) walk the home for ascend_*_install.info
    infos = [f for _, _, files in os.walk(os.path.realpath(HOME)) for f in files
             if re.match(r"ascend_.*_install\.info", f)]
    assert infos == ["ascend_toolkit_install.info"]
    info = open(os.path.join(HOME, infos[0])).read()
    assert f"version={torch_npu.version.cann_version}\n" in info
    from torch_npu.utils.collect_env import get_cann_version
    assert get_cann_version() == torch_npu.version.cann_version
    for component in ("runtime", "compiler", "opp"):
        assert open(os.path.join(HOME, component, "version.info")).read() == \
            f"Version={torch_npu.version.cann_version}\n"


def test_lib64_libascendcl_is_the_simulator_runtime():
    lib = ctypes.CDLL(os.path.join(HOME, "lib64", "libascendcl.so"))
    count = ctypes.c_uint32()
    assert lib.aclrtGetDeviceCount(ctypes.byref(count)) == 0
    assert count.value == 8


def test_include_has_acl_headers():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    p = subprocess.run([cc, "-fsyntax-only", "-x", "c", "-I", os.path.join(HOME, "include"), "-"],
                       input="#include <acl/acl.h>\nint main(void) { return aclrtSetDevice(0); }\n",
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_user_set_home_is_checked_with_torch_npus_texts(tmp_path):
    p = _python("import torch_npu", ASCEND_HOME_PATH=str(tmp_path / "nowhere"))
    assert p.returncode != 0
    assert f"ASCEND_HOME_PATH : {tmp_path / 'nowhere'} does not exist. Please run 'source set_env.sh'" in p.stderr
    p = _python("import torch_npu", ASCEND_HOME_PATH=HOME)
    assert p.returncode != 0 and "ASCEND_OPP_PATH environment variable is not set" in p.stderr
    (tmp_path / "opp").mkdir()
    p = _python("import torch_npu", ASCEND_HOME_PATH=str(tmp_path), ASCEND_OPP_PATH=str(tmp_path / "opp"))
    assert p.returncode != 0 and f"ASCEND_RUNTIME_PATH : {tmp_path / 'runtime'} does not exist" in p.stderr
    # a complete toolkit elsewhere (as set_env.sh of another install leaves it) is accepted
    (tmp_path / "runtime").mkdir()
    (tmp_path / "compiler").mkdir()
    p = _python("import os, torch_npu; print(os.environ['ASCEND_HOME_PATH'])",
                ASCEND_HOME_PATH=str(tmp_path), ASCEND_OPP_PATH=str(tmp_path / "opp"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == str(tmp_path)


def test_deepspeed_npu_op_builder_finds_this_cann():
    pytest.importorskip("deepspeed", reason="tools/venv.py installs deepspeed")
    p = _python("import torch_npu\nfrom deepspeed.ops.op_builder.npu import CPUAdamBuilder as B\n"
                "b = B(); print(b.installed_cann_path(), b.installed_cann_version(), b.cann_defs())")
    assert p.returncode == 0, p.stderr[-2000:]
    path, version, defs = p.stdout.strip().splitlines()[-1].split()
    assert os.path.realpath(path) == os.path.realpath(HOME)
    assert version == torch_npu.version.cann_version and defs == "-D__ENABLE_CANN__"
