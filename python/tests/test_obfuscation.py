"""PMCC model obfuscation (torch_npu.obfuscation_*): the simulated node has no PMCC deployment, so
each operator checks its arguments as op-plugin does and then fails with the engine's error 507018,
as on an Ascend node without PMCC."""
import pytest
import torch
import torch_npu


def test_initialize_without_pmcc_fails_with_507018():
    for fn in (torch_npu.obfuscation_initialize, torch_npu.npu.obfuscation_initialize,
               torch_npu.npu.utils.obfuscation_initialize):
        with pytest.raises(RuntimeError, match=r"call aclnnObfuscationSetupV2 failed, error code is 507018"):
            fn(3584, 0, 1, data_type=torch.bfloat16, thread_num=4, obf_coefficient=1.0)


def test_calculate_and_finalize_without_pmcc_fail_with_507018():
    fd = torch.tensor([35], dtype=torch.int32, device="npu")
    x = torch.randn(4, 16, dtype=torch.bfloat16, device="npu")
    param = torch.tensor([16], dtype=torch.int32, device="npu")
    with pytest.raises(RuntimeError, match=r"call aclnnObfuscationCalculateV2 failed, error code is 507018"):
        torch_npu.npu.obfuscation_calculate(fd, x, param, obf_coefficient=0.5)
    with pytest.raises(RuntimeError, match=r"error code is 507018"):
        torch_npu.obfuscation_finalize(fd)


def test_bad_arguments_are_named():
    with pytest.raises(RuntimeError, match="data_type cannot be empty"):
        torch_npu.obfuscation_initialize(3584, 0, 1)
    with pytest.raises(RuntimeError, match=r"cmd must be 1 .*got 4"):
        torch_npu.obfuscation_initialize(3584, 0, 4, data_type=torch.float16)
    with pytest.raises(RuntimeError, match=r"hidden_size must be in \[1, 10000\], got 0"):
        torch_npu.obfuscation_initialize(0, 0, 1, data_type=torch.float16)
    with pytest.raises(RuntimeError, match=r"thread_num must be in \[1, 6\], got 7"):
        torch_npu.obfuscation_initialize(16, 0, 1, data_type=torch.float16, thread_num=7)
    fd = torch.tensor([35], dtype=torch.int32, device="npu")
    x = torch.randn(4, 16, device="npu")
    with pytest.raises(RuntimeError, match=r"last dimension of x must be param \(8\)"):
        torch_npu.obfuscation_calculate(fd, x, torch.tensor([8], dtype=torch.int32, device="npu"))
    with pytest.raises(RuntimeError, match="Failed to process fd"):
        torch_npu.obfuscation_calculate(torch.empty(0, dtype=torch.int32, device="npu"), x,
                                        torch.tensor([16], dtype=torch.int32, device="npu"))
    with pytest.raises(RuntimeError, match=r"obf_coefficient must be in \(0, 1\]"):
        torch_npu.obfuscation_calculate(fd, x, torch.tensor([16], dtype=torch.int32, device="npu"),
                                        obf_coefficient=0.0)
