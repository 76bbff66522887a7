"""The CANN environment torch_npu runs in: the simulated toolkit's home (torch_npu/cann).

On an Ascend machine CANN's ``set_env.sh`` exports ASCEND_HOME_PATH and friends before
Python starts, and torch_npu checks at import that they name an installed toolkit. Here the
simulator is the toolkit and its home ships in the package, so ``import torch_npu`` exports
what ``torch_npu/cann/set_env.sh`` would when ASCEND_HOME_PATH is unset (for this process and
the processes it starts), and checks the variables as torch_npu does when it is set.
"""
import os

from torch_npu.utils._error_code import ErrCode, pta_error

HOME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cann")


def _missing(what: str, path: str, hint: str) -> Exception:
    return Exception(f"{what} : {path} does not exist. {hint}" + pta_error(ErrCode.NOT_FOUND))


def apply() -> None:
    env = os.environ
    if "ASCEND_HOME_PATH" not in env:
        if not os.path.isdir(HOME):  # a source tree without tools/dev_link.sh's links
            return
        env["ASCEND_HOME_PATH"] = HOME
        env.setdefault("ASCEND_TOOLKIT_HOME", HOME)
        env.setdefault("ASCEND_AICPU_PATH", HOME)
        env.setdefault("ASCEND_OPP_PATH", os.path.join(HOME, "opp"))
        return
    # Set by the user (or by a set_env.sh): torch_npu's checks and texts.
    sourced = "Please run 'source set_env.sh' in the CANN installation path."
    installed = "Please check whether the {} package has been installed. If exist, please run " \
                "'source set_env.sh' in the CANN installation path."
    home = env["ASCEND_HOME_PATH"]
    if not os.path.exists(home):
        raise _missing("ASCEND_HOME_PATH", home, sourced)
    if "ASCEND_OPP_PATH" not in env:
        raise Exception("ASCEND_OPP_PATH environment variable is not set. " + installed.format("opp")
                        + pta_error(ErrCode.NOT_FOUND))
    if not os.path.exists(env["ASCEND_OPP_PATH"]):
        raise _missing("ASCEND_OPP_PATH", env["ASCEND_OPP_PATH"], installed.format("opp"))
    for component, what in (("runtime", "ASCEND_RUNTIME_PATH"), ("compiler", "ASCEND_COMPILER_PATH")):
        path = os.path.join(home, component)
        if not os.path.exists(path):
            raise _missing(what, path, installed.format(component))
