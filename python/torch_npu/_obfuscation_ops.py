"""op-plugin's model-obfuscation operators of PMCC (Privacy and Model Confidential Computing):
``obfuscation_initialize`` / ``obfuscation_calculate`` / ``obfuscation_finalize`` (also
``torch_npu.npu.<name>`` and ``torch_npu.npu.utils.<name>``).

On Ascend they send tensors to the PMCC obfuscation engine: a client application in the normal
OS talking over a socket to a trusted application in the TEE, which holds the obfuscation factors
registered with the key-management service. A node has the engine only after its deployment
(certificates, kmsAgent, registered factors); on a node without it the operators' AI CPU task
fails with error 507018, which op-plugin's documentation names as an expected result. The
simulated 910B node has no TEE, so it is such a node: each operator checks its arguments as
op-plugin does, then fails as aclnnObfuscationSetupV2 / aclnnObfuscationCalculateV2 fail there.
"""
from __future__ import annotations

import torch

from torch_npu._composite_ops import _check, _op
from torch_npu.utils._error_code import ErrCode, pta_error

# ACL_ERROR_RT_AICPU_EXCEPTION: the AI CPU task of the engine's client failed.
_PMCC_NOT_DEPLOYED = 507018
# cmd of obfuscation_initialize: 1 float inference, 2 quantised inference, 3 release
_CMDS = (1, 2, 3)
_DATA_TYPES = (torch.float16, torch.float32, torch.int8, torch.bfloat16)


def _engine_call(api: str):
    raise RuntimeError(
        f"{api}: NPU function error: call {api} failed, error code is {_PMCC_NOT_DEPLOYED}{pta_error(ErrCode.ACL)}\n"
        "[Error]: The AI CPU task of the PMCC obfuscation engine failed: PMCC is not deployed on this node "
        "(no obfuscation SDK client, TEE trusted application or registered obfuscation factors; the NPU "
        "simulator has no TEE).")


def _scalar_int(name: str, t: torch.Tensor) -> int:
    _check(t.numel() >= 1, f"Failed to process {name}: {name} must hold at least one element, got shape "
                           f"{list(t.shape)}")
    _check(not t.is_floating_point() and not t.is_complex(),
           f"Failed to process {name}: {name} must be an integer tensor, got {t.dtype}")
    return int(t.reshape(-1)[0])


@_op("obfuscation_initialize(int hidden_size, int tp_rank, int cmd, *, ScalarType? data_type=None, "
     "int? model_obf_seed_id=0, int? data_obf_seed_id=0, int? thread_num=4, float? obf_coefficient=1.0) -> Tensor",
     keys=("CompositeExplicitAutograd",))
def _obfuscation_initialize(hidden_size, tp_rank, cmd, *, data_type=None, model_obf_seed_id=0, data_obf_seed_id=0,
                            thread_num=4, obf_coefficient=1.0):
    """Connects to the engine and sets it up (cmd 1: float inference, 2: quantised inference) or
    releases it (cmd 3); returns the connection's fd, int32 of shape [1]."""
    _check(data_type is not None, "data_type cannot be empty")
    _check(cmd in _CMDS, f"obfuscation_initialize: cmd must be 1 (float inference), 2 (quantised inference) "
                         f"or 3 (release), got {cmd}")
    if cmd != 3:
        _check(1 <= hidden_size <= 10000, f"obfuscation_initialize: hidden_size must be in [1, 10000], got {hidden_size}")
        _check(0 <= tp_rank <= 1024, f"obfuscation_initialize: tp_rank must be in [0, 1024], got {tp_rank}")
        _check(data_type in _DATA_TYPES, f"obfuscation_initialize: data_type must be one of float16, float32, int8, "
                                         f"bfloat16, got {data_type}")
        threads = 4 if thread_num is None else thread_num
        _check(1 <= threads <= 6, f"obfuscation_initialize: thread_num must be in [1, 6], got {threads}")
    coefficient = 1.0 if obf_coefficient is None else obf_coefficient
    _check(0.0 <= coefficient <= 1.0, f"obfuscation_initialize: obf_coefficient must be in [0, 1], got {coefficient}")
    _engine_call("aclnnObfuscationSetupV2")


@_op("obfuscation_finalize(Tensor fd_to_close) -> Tensor", keys=("CompositeExplicitAutograd",))
def _obfuscation_finalize(fd_to_close):
    """Releases the engine's resources of the connection fd_to_close (from obfuscation_initialize)."""
    _scalar_int("fd_to_close", fd_to_close)
    _engine_call("aclnnObfuscationSetupV2")


@_op("obfuscation_calculate(Tensor fd, Tensor x, Tensor param, *, float? obf_coefficient=1.0) -> Tensor",
     keys=("CompositeExplicitAutograd",))
def _obfuscation_calculate(fd, x, param, *, obf_coefficient=1.0):
    """Obfuscates x [..., hidden_size] through the engine connected as fd; param holds x's last
    dimension. The result has x's shape and dtype."""
    _scalar_int("fd", fd)
    hidden = _scalar_int("param", param)
    _check(x.dim() >= 1 and x.size(-1) == hidden,
           f"obfuscation_calculate: the last dimension of x must be param ({hidden}), got shape {list(x.shape)}")
    _check(x.dtype in _DATA_TYPES, f"obfuscation_calculate: x must be float16, float32, int8 or bfloat16, got {x.dtype}")
    coefficient = 1.0 if obf_coefficient is None else obf_coefficient
    _check(0.0 < coefficient <= 1.0, f"obfuscation_calculate: obf_coefficient must be in (0, 1], got {coefficient}")
    _engine_call("aclnnObfuscationCalculateV2")
