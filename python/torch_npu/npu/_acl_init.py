"""The environment torch_npu reads when its runtime starts (the first npu call), as AscendCL's
``aclInit`` gets it:

- ``TORCH_ACL_INIT_CONFIG_PATH``: the user's aclInit JSON file. It must exist and parse; with
  CANN 8.3.RC1 or later (``set_device`` is lazy there) it must hold
  ``"defaultDevice": {"default_device": "0"}``, before that it must not hold ``defaultDevice``.
  A bad file makes the start fail with RuntimeError. The simulator keeps the parsed file
  (:func:`user_acl_config`); its other sections (dump, profiling) configure CANN tools that
  the simulator does not have.
- ``ACL_OP_INIT_MODE``: how aclop kernels are loaded (0, 1 or 2); another value warns and
  the default is used (:func:`acl_op_init_mode`). The simulator has no aclop kernels to load.
"""
import json
import os
import re
import warnings

_state = {"config": None, "op_init_mode": None}


def _lazy_set_device() -> bool:
    from torch_npu.utils import _is_gte_cann_version

    return _is_gte_cann_version("8.3.RC1")


def _read_user_acl_json(env_value: str) -> dict:
    path = os.path.realpath(env_value)
    if not os.path.exists(path):
        raise RuntimeError(f"TORCH_ACL_INIT_CONFIG_PATH {env_value} is invalid. Please set the environment variable "
                           "'TORCH_ACL_INIT_CONFIG_PATH' to a valid JSON config file path.")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise RuntimeError(f"Failed to open user acl json {path}. Please ensure the file exists and has read "
                           "permission.") from err
    try:
        config = json.loads(text)
    except ValueError as err:
        raise RuntimeError(f"Failed to parse user acl json {path}. Please check that the file contains valid JSON "
                           f"syntax. Error: {err}") from err
    if not isinstance(config, dict):
        raise RuntimeError(f"Failed to parse user acl json {path}: the file must hold a JSON object.")
    default = config.get("defaultDevice")
    if _lazy_set_device():
        if not isinstance(default, dict):
            raise RuntimeError(f"User acl json {path} lacks 'defaultDevice' object, required for lazy set_device "
                               "mode. Please add: \"defaultDevice\": {\"default_device\": \"0\"}")
        if default.get("default_device") != "0":
            raise RuntimeError(f"User acl json {path} requires 'defaultDevice.default_device' to be \"0\" in lazy "
                               "set_device mode. Please set: \"defaultDevice\": {\"default_device\": \"0\"}")
    elif "defaultDevice" in config:
        raise RuntimeError(f"User acl json {path} contains 'defaultDevice' which is not expected in non-lazy "
                           "set_device mode. Please remove the 'defaultDevice' field from your JSON config.")
    return config


def _op_init_mode(env_value) -> int:
    default = 0  # the aclop-capable SoCs of the simulator (Ascend910B) start in mode 0
    if env_value is None:
        return default
    leading = re.match(r"\s*([+-]?\d+)", env_value)  # the leading integer, as strtol reads it
    mode = int(leading.group(1)) if leading else 0
    if mode not in (0, 1, 2):
        warnings.warn(f"Get env ACL_OP_INIT_MODE not in [0, 1, 2], so reset it to the default value {default}.")
        return default
    return mode


def check_environment() -> None:
    """Reads and checks the start-up environment (called once, when the runtime starts)."""
    path = os.environ.get("TORCH_ACL_INIT_CONFIG_PATH")
    _state["config"] = _read_user_acl_json(path) if path is not None else None
    _state["op_init_mode"] = _op_init_mode(os.environ.get("ACL_OP_INIT_MODE"))


def user_acl_config():
    """The parsed ``TORCH_ACL_INIT_CONFIG_PATH`` file of the running runtime, or None."""
    return _state["config"]


def acl_op_init_mode():
    """The ACL_OP_INIT_MODE the runtime started with (None before it started)."""
    return _state["op_init_mode"]
