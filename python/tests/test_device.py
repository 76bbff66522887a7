"""torch.npu device functions: selection, context managers, properties, errors."""

import json
import os
import re
import textwrap
import warnings

import pytest
import torch

import torch_npu
from conftest import run_python

GiB = 1024 ** 3


def expected_count():
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    return 8 if visible is None else len([v for v in visible.split(",") if v])


def test_availability_and_count():
    assert torch.npu.is_available()
    assert torch.npu.device_count() == expected_count()
    torch.npu.init()
    assert torch.npu.is_initialized()
    assert not torch.npu._is_in_bad_fork()


@pytest.mark.parametrize("spelling", [1, "npu:1", torch.device("npu", 1), "1"])
def test_set_device_spellings(spelling):
    torch.npu.set_device(spelling)
    assert torch.npu.current_device() == 1
    assert torch.empty(2, device="npu").device == torch.device("npu", 1)


def test_set_device_negative_is_noop():
    torch.npu.set_device(2)
    torch.npu.set_device(-1)
    assert torch.npu.current_device() == 2


def test_invalid_device_index():
    count = torch.npu.device_count()
    with pytest.raises(RuntimeError) as info:
        torch.npu.set_device(count)
    message = str(info.value)
    assert "set_device" in message and "'device'" in message and f"[0, {count - 1}]" in message
    assert re.search(r"Invalid device ID[\s\S]+Check whether the device ID is valid", message)  # torch_npu's
    # Also catchable as torch_npu's AssertionError("Invalid device id").
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.get_device_name(count + 3)
    with pytest.raises(AssertionError, match="get_device_properties"):
        torch.npu.get_device_properties(-2)
    assert torch.npu.current_device() == 0


@pytest.mark.parametrize("bad, error, text", [
    (1.5, TypeError, "got float"),
    (True, TypeError, "got bool"),
    ("cuda:0", ValueError, "must be an npu device"),
    ("npu:x", ValueError, "not a valid device string"),
    ([0], TypeError, "got list"),
])
def test_wrong_device_arguments(bad, error, text):
    with pytest.raises(error, match=text):
        torch.npu.set_device(bad)
    with pytest.raises(error, match="argument 'device'"):
        torch.npu.synchronize(bad)


def test_device_context_manager():
    assert torch.npu.current_device() == 0
    with torch.npu.device(3):
        assert torch.npu.current_device() == 3
        with torch.npu.device("npu:5"):
            assert torch.npu.current_device() == 5
            assert torch.zeros(1, device="npu").device.index == 5
        assert torch.npu.current_device() == 3
    assert torch.npu.current_device() == 0
    with torch.npu.device(None):
        assert torch.npu.current_device() == 0
    with torch.npu.device(-1):
        assert torch.npu.current_device() == 0


def test_device_context_restores_after_error():
    with pytest.raises(ZeroDivisionError):
        with torch.npu.device(2):
            1 / 0
    assert torch.npu.current_device() == 0


def test_device_of():
    t = torch.ones(2, device="npu:4")
    with torch.npu.device_of(t):
        assert torch.npu.current_device() == 4
    assert torch.npu.current_device() == 0
    with torch.npu.device_of(torch.ones(2)):  # a cpu tensor: no-op
        assert torch.npu.current_device() == 0


def test_device_name_and_properties():
    assert torch.npu.get_device_name() == "Ascend910B1"
    assert torch.npu.get_device_name(7) == "Ascend910B1"
    props = torch.npu.get_device_properties("npu:1")
    assert props.name == "Ascend910B1"
    assert props.total_memory == 64 * GiB
    assert props.cube_core_num > 0 and props.multi_processor_count == props.vector_core_num
    # CUDA / ROCm facts an NPU does not have are None, as in torch_npu
    for field in ("major", "minor", "is_multi_gpu_board", "is_integrated", "max_threads_per_multi_processor",
                  "warp_size", "regs_per_multiprocessor", "gcnArchName"):
        assert getattr(props, field) is None, field
    assert props.vector_core_num > 0 and props.L2_cache_size > 0
    assert repr(props) == "_NPUDeviceProperties(name='Ascend910B1', total_memory=65536MB)"
    # torch_npu's SocVersion enum: Ascend910B1 = 220 (names in get_device_name()).
    assert torch.npu.get_soc_version() == 220
    assert torch_npu._C._npu_get_soc_version() == 220
    assert len(str(props.uuid)) == 36 and props.uuid == torch.npu.get_device_properties(1).uuid
    assert props.uuid != torch.npu.get_device_properties(0).uuid


def test_device_capability(monkeypatch):
    monkeypatch.delenv("TORCH_NPU_DEVICE_CAPABILITY", raising=False)
    with pytest.warns(UserWarning, match="TORCH_NPU_DEVICE_CAPABILITY"):
        assert torch.npu.get_device_capability() is None
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "8.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.npu.get_device_capability(0) == (8, 0)
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "eight")
    with pytest.warns(UserWarning, match="Cannot parse"):
        assert torch.npu.get_device_capability() is None
    # The device is not used (as torch_npu): a device name is accepted too.
    monkeypatch.delenv("TORCH_NPU_DEVICE_CAPABILITY")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.npu.get_device_capability(torch.npu.get_device_name(0)) is None
        assert torch.npu.get_device_capability(torch.npu.device("npu")) is None


def test_peer_access():
    assert torch.npu.can_device_access_peer(0, 1)
    assert torch.npu.can_device_access_peer("npu:3", torch.device("npu:2"))
    assert not torch.npu.can_device_access_peer(1, 1)
    with pytest.raises(AssertionError, match="Invalid peer device id: .*'peer_device_id' is 42"):
        torch.npu.can_device_access_peer(0, 42)
    with pytest.raises(AssertionError, match="Invalid device id: .*'device_id' is -1"):
        torch.npu.can_device_access_peer(-1, 0)


def test_op_timeout_is_an_unsigned_32_bit_count():
    torch.npu.set_op_timeout_ms(1000)
    torch.npu.set_op_timeout_ms(2 ** 32 - 1)
    with pytest.raises(ValueError, match=r"timeout must be > 0, got -1 \(can't convert negative "
                                         r"value to unsigned int\)"):
        torch.npu.set_op_timeout_ms(-1)
    with pytest.raises(OverflowError, match="at most 4294967295 ms.*Overflow when unpacking"):
        torch.npu.set_op_timeout_ms(2 ** 32)
    with pytest.raises(ValueError, match="got 0"):
        torch.npu.set_op_timeout_ms(0)
    torch.npu.set_op_timeout_ms(1000)


def test_synchronize_waits_for_work():
    a = torch.randn(256, 256, device="npu")
    b = a @ a
    torch.npu.synchronize()
    torch.npu.synchronize("npu:0")
    torch.npu.synchronize(torch.device("npu", 1))
    assert torch.npu.current_stream().query()
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu(), rtol=1e-4, atol=1e-4)


def test_mem_get_info():
    free, total = torch.npu.mem_get_info()
    assert total == 64 * GiB
    assert 0 < free <= total
    assert torch.npu.mem_get_info(1)[1] == 64 * GiB


def test_utilization():
    assert 0 <= torch.npu.utilization() <= 100


def test_misc_queries():
    assert torch.npu.is_bf16_supported()
    assert torch.npu.is_support_inf_nan()
    with pytest.warns(UserWarning):
        assert torch.npu.current_blas_handle() is None
    torch.npu.set_sync_debug_mode("warn")
    assert torch.npu.get_sync_debug_mode() == 1
    torch.npu.set_sync_debug_mode(0)
    assert torch.npu.get_sync_debug_mode() == 0
    with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`, got 'loud'"):
        torch.npu.set_sync_debug_mode("loud")
    with pytest.raises(RuntimeError, match="invalid value of debug_mode, expected one of 0,1,2, got 3"):
        torch.npu.set_sync_debug_mode(3)
    assert torch.npu.get_sync_debug_mode() == 0


def test_config_options():
    torch.npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype", "ACL_AICORE_NUM": 8})
    assert torch.npu.get_option("ACL_PRECISION_MODE") == "must_keep_origin_dtype"
    assert torch.npu.get_option("ACL_AICORE_NUM") == "8"
    assert torch.npu.get_option("NEVER_SET") is None
    with pytest.raises(ValueError, match=r"value of ACL_PRECISION_MODE should be in "
                                         r"\['allow_fp32_to_fp16', 'must_keep_origin_dtype'\] "
                                         r"but got fastest"):
        torch.npu.set_option({"ACL_PRECISION_MODE": "fastest"})
    with pytest.raises(ValueError, match=r"ACL_AICORE_NUM should be an integer in \[1, 32\] but got 99"):
        torch.npu.set_option({"ACL_AICORE_NUM": 99})
    with pytest.raises(TypeError, match="npu option must be a dict .*'option'.*got list"):
        torch.npu.set_option(["ACL_PRECISION_MODE"])
    with pytest.raises(RuntimeError, match="invalid npu option name:ACL_OP_SELECT_IMPL .*known "
                                           "options are .*'ACL_OP_SELECT_IMPL_MODE'"):
        torch.npu.set_option({"ACL_OP_SELECT_IMPL": "high_precision"})
    assert torch.npu.get_option("ACL_OP_SELECT_IMPL") is None
    torch.npu.set_compile_mode(jit_compile=False)
    assert torch.npu.is_jit_compile_false()
    torch.npu.set_compile_mode(jit_compile=True)
    assert not torch.npu.is_jit_compile_false()
    torch.npu.set_compile_mode(jit_compile=False)


def test_set_aoe_sets_the_autotune_options(tmp_path):
    path = tmp_path / "aoe"
    torch.npu.set_aoe(str(path))
    assert path.is_dir()
    assert torch.npu.get_option("autotune") == "enable"
    assert torch.npu.get_option("autotunegraphdumppath") == str(path.resolve())


def test_hf32_and_internal_format_flags():
    assert torch.npu.matmul.allow_hf32 is False
    assert torch.npu.conv.allow_hf32 is True
    torch.npu.matmul.allow_hf32 = True
    torch.npu.conv.allow_hf32 = False
    try:
        assert torch.npu.matmul.allow_hf32 is True
        assert torch.npu.conv.allow_hf32 is False
        assert torch.npu.get_option("ALLOW_MATMUL_HF32") == "enable"
    finally:
        torch.npu.matmul.allow_hf32 = False
        torch.npu.conv.allow_hf32 = True
    with pytest.raises(TypeError, match="allow_hf32"):
        torch.npu.matmul.allow_hf32 = "yes"
    with pytest.raises(AttributeError, match="allow_tf32"):
        torch.npu.matmul.allow_tf32 = True
    assert torch_npu.npu.config.allow_internal_format is False
    torch_npu.npu.config.allow_internal_format = True
    assert torch.npu.config.allow_internal_format is True
    torch_npu.npu.config.allow_internal_format = False


def test_cann_version():
    from torch_npu import version

    assert torch_npu.utils.get_cann_version() == version.cann_version
    assert torch_npu.utils.get_cann_version(module="RUNTIME") == version.cann_version
    assert torch.npu.get_cann_version() == version.cann_version
    with pytest.raises(ValueError, match="module"):
        torch_npu.utils.get_cann_version("GPU")
    assert torch_npu.utils._is_gte_cann_version("8.0.RC1")
    assert torch_npu.utils._is_gte_cann_version(version.cann_version)
    assert not torch_npu.utils._is_gte_cann_version("99.0.0")


def test_visible_devices_env():
    code = "import torch, torch_npu; print('COUNT', torch.npu.device_count())"
    result = run_python(code, env={"ASCEND_RT_VISIBLE_DEVICES": "2,3",
                                   "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "COUNT 2" in result.stdout


def test_forked_child_cannot_use_npu():
    code = textwrap.dedent("""
        import os, torch, torch_npu
        torch.ones(1, device="npu")
        pid = os.fork()
        if pid == 0:
            ok = torch.npu._is_in_bad_fork() and not torch.npu.is_initialized()
            try:
                torch.npu.init()
                ok = False
            except RuntimeError as err:
                ok = ok and "spawn" in str(err)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status))
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "CHILD 0" in result.stdout


def test_forked_child_raises_instead_of_hanging():
    """New npu tensors in a child forked after initialisation raise torch_npu's error, and
    the parent's tensors (with work still queued at fork time) raise the runtime's instead
    of waiting forever for stream workers the child does not have; the child exits cleanly."""
    code = textwrap.dedent("""
        import os, sys, torch, torch_npu
        x = torch.ones(2000, 2000, device="npu")
        torch.npu._sleep(360_000_000)  # ~0.2 s queued on the stream worker when the fork happens
        pid = os.fork()
        if pid == 0:
            errors = []
            for use in (lambda: torch.tensor([2]).to("npu"), lambda: x.cpu(), lambda: x + 1,
                        lambda: torch.npu.synchronize()):
                try:
                    use()
                    errors.append("no error")
                except RuntimeError as err:
                    errors.append("spawn" in str(err) and ("forked" in str(err)))
            print("CHILD", errors, flush=True)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("EXIT", os.waitstatus_to_exitcode(status), bool(x[0, 0].item() > 0))
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "CHILD [True, True, True, True]" in result.stdout, result.stdout + result.stderr
    assert "EXIT 0 True" in result.stdout


# ---- start-up environment: TORCH_ACL_INIT_CONFIG_PATH, ACL_OP_INIT_MODE (npu/_acl_init.py) ----

@pytest.mark.parametrize("content, message", [
    (None, "is invalid"),  # no such file
    ("", "Failed to parse user acl json"),
    ("not a json{{{", "Failed to parse user acl json"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"dump": {"dump_scene": "lite_exception"}}', "lacks 'defaultDevice' object"),
    ('{"defaultDevice": "0"}', "lacks 'defaultDevice' object"),
    ('{"defaultDevice": {"default_device": "1"}}', "requires 'defaultDevice.default_device' to be \"0\""),
    ('{"defaultDevice": {"default_device": 0}}', "requires 'defaultDevice.default_device' to be \"0\""),
])
def test_user_acl_json_is_checked(tmp_path, monkeypatch, content, message):
    from torch_npu.npu import _acl_init

    path = tmp_path / "acl.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("TORCH_ACL_INIT_CONFIG_PATH", str(path))
    with pytest.raises(RuntimeError, match=re.escape(message)):
        _acl_init.check_environment()


def test_user_acl_json_accepted_and_kept(tmp_path, monkeypatch):
    from torch_npu.npu import _acl_init

    assert torch_npu.utils._is_gte_cann_version("8.3.RC1")  # lazy set_device: defaultDevice is required
    config = {"dump": {"dump_scene": "lite_exception"}, "defaultDevice": {"default_device": "0"}}
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("TORCH_ACL_INIT_CONFIG_PATH", str(path))
    try:
        _acl_init.check_environment()
        assert _acl_init.user_acl_config() == config
        monkeypatch.delenv("TORCH_ACL_INIT_CONFIG_PATH")
        _acl_init.check_environment()
        assert _acl_init.user_acl_config() is None
    finally:
        _acl_init.check_environment()


@pytest.mark.parametrize("value, mode, warns", [(None, 0, False), ("2", 2, False), (" 1", 1, False),
                                                ("999", 0, True), ("-1", 0, True), ("abc", 0, False)])
def test_acl_op_init_mode(monkeypatch, value, mode, warns):
    from torch_npu.npu import _acl_init

    if value is None:
        monkeypatch.delenv("ACL_OP_INIT_MODE", raising=False)
    else:
        monkeypatch.setenv("ACL_OP_INIT_MODE", value)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _acl_init.check_environment()
        assert _acl_init.acl_op_init_mode() == mode
        assert any("ACL_OP_INIT_MODE not in [0, 1, 2]" in str(w.message) for w in caught) == warns
    finally:
        monkeypatch.delenv("ACL_OP_INIT_MODE", raising=False)
        _acl_init.check_environment()


def test_set_device_starts_the_runtime_and_a_bad_acl_json_fails_it(tmp_path):
    code = textwrap.dedent("""
        import torch, torch_npu
        assert not torch_npu.npu.is_initialized()
        try:
            torch_npu.npu.set_device(0)
        except RuntimeError as e:
            print("FAILED", e)
        else:
            print("INITIALIZED", torch_npu.npu.is_initialized())
    """)
    bad = tmp_path / "bad.json"
    bad.write_text("not a json{{{")
    result = run_python(code, env={"TORCH_ACL_INIT_CONFIG_PATH": str(bad)})
    assert "FAILED Failed to parse user acl json" in result.stdout, result.stderr
    result = run_python(code)
    assert "INITIALIZED True" in result.stdout, result.stderr


def test_device_count_before_initialisation_follows_visible_devices():
    # not cached before the runtime starts: ASCEND_RT_VISIBLE_DEVICES set after a first
    # device_count() applies (torch_npu's test_device_count_not_cached_pre_init); from the first
    # device use on, the count is the runtime's
    code = textwrap.dedent("""
        import os, torch, torch_npu
        r1 = torch.npu.device_count()
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0,2"
        r2 = torch.npu.device_count()
        assert not torch_npu.npu.is_initialized()
        torch.empty(10, device="npu")
        r3 = torch.npu.device_count()
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "1"
        print("COUNTS", r1, r2, r3, torch.npu.device_count(), torch_npu._C._npu_getDeviceCount())
    """)
    result = run_python(code, env={"ASCEND_SIM_DEVICE_COUNT": "4", "ASCEND_RT_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "COUNTS 4 2 2 2 2" in result.stdout
