"""torch_npu's C++ API for extensions (torch_npu/include/torch_npu/csrc/...: NPUStream.h,
NPUEvent.h, NPUGuard.h, NPUFunctions.h, NPUException.h, NPUFormat.h, NPUHooksInterface.h,
aten/NPUGeneratorImpl.h, libs/init_npu.h, register/OptionsManager.h): one C++ library built
against the shipped headers and linked with -ltorch_npu drives this process's runtime
through them; the environment switches and the sync debug mode they expose."""
import ctypes
import os
import shutil
import subprocess
import textwrap
import warnings

import pytest
import torch
import torch.utils.cpp_extension

import torch_npu
from conftest import run_python

PKG = os.path.dirname(os.path.abspath(torch_npu.__file__))
INCLUDE = os.path.join(PKG, "include")
LIB = os.path.join(PKG, "lib")

_API_CPP = r"""
#include <cstdint>
#include <vector>

#include "torch_npu/csrc/aten/NPUGeneratorImpl.h"
#include "torch_npu/csrc/core/npu/NPUEvent.h"
#include "torch_npu/csrc/core/npu/NPUException.h"
#include "torch_npu/csrc/core/npu/NPUFormat.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUHooksInterface.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/core/npu/register/OptionsManager.h"
#include "torch_npu/csrc/libs/init_npu.h"

// Each check sets one bit; the test expects them all.
extern "C" int64_t stream_and_guard_checks() {
  int64_t ok = 0, bit = 0;
  auto check = [&](bool cond) { ok |= int64_t(cond) << bit++; };
  const auto def = c10_npu::getDefaultNPUStream();
  check(c10_npu::getCurrentNPUStream() == def);
  auto pool = c10_npu::getNPUStreamFromPool();
  check(pool != def && pool.device_index() == 0 && pool.device_type() == c10::DeviceType::PrivateUse1);
  {
    c10_npu::NPUStreamGuard guard(pool);
    check(c10_npu::getCurrentNPUStream() == pool);
    check(guard.original_stream() == def && guard.current_stream() == pool);
  }
  check(c10_npu::getCurrentNPUStream() == def);
  check(pool.stream() != nullptr && static_cast<aclrtStream>(pool) == pool.stream(false));
  const auto packed = pool.pack3();
  check(c10_npu::NPUStream::unpack3(packed.stream_id, packed.device_index, packed.device_type) == pool);
  {
    c10_npu::NPUGuard guard(1);
    check(c10_npu::current_device() == 1 && guard.original_device().index() == 0);
    check(c10_npu::getCurrentNPUStream().device_index() == 1);
  }
  check(c10_npu::current_device() == 0);
  {
    c10_npu::OptionalNPUGuard none;
    check(!none.original_device().has_value());
  }
  check(c10_npu::device_count() == c10_npu::device_count_ensure_non_zero());
  int32_t device = -1;
  check(c10_npu::GetDevice(&device) == ACL_SUCCESS && device == 0);
  check(c10_npu::SetDevice(c10_npu::device_count()) != ACL_SUCCESS);  // no such device: an ACL error code
  check(c10_npu::ExchangeDevice(2) == 0 && c10::npu::current_device() == 2 && c10_npu::ExchangeDevice(0) == 2);
  pool.setDataPreprocessStream(true);
  auto same = c10_npu::NPUStream(c10::Stream(pool));
  check(same.isDataPreprocessStream() && !c10_npu::getDefaultNPUStream().isDataPreprocessStream());
  check(!pool.isSyncLaunchStream() && c10_npu::getNPUStreamFromSyncLaunchPool().isSyncLaunchStream());
  return ok;
}

// Records an event on the current stream (busy with the caller's torch.npu._sleep).
extern "C" int64_t event_checks() {
  int64_t ok = 0, bit = 0;
  auto check = [&](bool cond) { ok |= int64_t(cond) << bit++; };
  c10_npu::NPUEvent event;
  check(!event.isCreated() && event.query() && !event.device().has_value());
  event.record();
  check(event.isCreated() && event.device_index() == 0 && event.event() != nullptr);
  check(!event.query());  // the sleep queued before it is still running
  auto side = c10_npu::getNPUStreamFromPool();
  event.block(side);  // side now waits for the sleep
  check(!side.query());
  event.synchronize();
  check(event.query());
  side.synchronize();
  c10_npu::NPUEvent start(ACL_EVENT_TIME_LINE), end(ACL_EVENT_TIME_LINE);
  start.record(c10_npu::getCurrentNPUStream());
  end.recordOnce(c10_npu::getCurrentNPUStream());
  check(start.elapsed_time(end) >= 0.0f);
  c10_npu::NPUEvent moved(std::move(start));
  check(moved.isCreated() && !start.isCreated());
  return ok;
}

extern "C" int64_t generator_checks(uint64_t seed) {
  int64_t ok = 0, bit = 0;
  auto check = [&](bool cond) { ok |= int64_t(cond) << bit++; };
  const at::Generator& gen = at_npu::detail::getDefaultNPUGenerator(0);
  auto* impl = gen.get<at_npu::NPUGeneratorImpl>();
  check(impl->current_seed() == seed);
  std::lock_guard<std::mutex> lock(impl->mutex_);
  const uint64_t before = impl->philox_offset_per_thread();
  const at_npu::PhiloxNpuState state = impl->philox_npu_state(10);  // rounds up to 12
  check(state.seed_.val == seed && state.offset_.val == before && !state.captured_);
  const auto inputs = impl->philox_engine_inputs(4);
  check(inputs.first == seed && inputs.second == before + 12 && impl->get_offset() == before + 16);
  auto copy = impl->clone();
  check(copy->current_seed() == seed && copy->philox_offset_per_thread() == before + 16);
  at::Generator fresh = at_npu::detail::createNPUGenerator(1);
  check(fresh.device().index() == 1);
  c10_npu::NPUHooksInterface hooks;
  check(&hooks.getDefaultGenerator(0) == &gen);
  return ok;
}

extern "C" int64_t format_checks() {
  int64_t ok = 0, bit = 0;
  auto check = [&](bool cond) { ok |= int64_t(cond) << bit++; };
  const auto options = c10::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, 0)).dtype(at::kHalf);
  at::Tensor nz = at_npu::native::empty_with_format({4, 32}, options, 29);
  check(at_npu::native::get_npu_format(nz) == 29);
  check(at_npu::native::get_npu_storage_sizes(nz) == std::vector<int64_t>({2, 1, 16, 16}));
  at::Tensor nd = at_npu::native::npu_format_cast(nz, 2);
  check(at_npu::native::get_npu_format(nd) == 2 && nd.sizes() == nz.sizes());
  check(at_npu::native::get_npu_storage_sizes(nd) == std::vector<int64_t>({4, 32}));
  at::Tensor swapped = at_npu::native::empty_with_swapped_memory({8}, at::kFloat, c10::Device(c10::DeviceType::PrivateUse1, 0));
  check(swapped.device().type() == c10::DeviceType::PrivateUse1 && swapped.numel() == 8);
  return ok;
}

extern "C" int64_t init_and_error_checks(int64_t task_queue_level) {
  int64_t ok = 0, bit = 0;
  auto check = [&](bool cond) { ok |= int64_t(cond) << bit++; };
  torch_npu::init_npu("npu:3");
  check(c10_npu::current_device() == 3);
  torch::npu::synchronize();
  torch_npu::init_npu(c10::Device(c10::DeviceType::PrivateUse1, 0));
  check(c10_npu::current_device() == 0);
  try {
    NPU_CHECK_ERROR(aclrtSetDevice(99));
    check(false);
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    check(what.find("aclrtSetDevice(99)") != std::string::npos && what.find("ERR00100") != std::string::npos);
  }
  check(std::string(c10_npu::c10_npu_get_error_message()).size() > 0);
  bool blocking_listed = false;
  for (const auto& env : c10_npu::option::OptionsManager::describe_public_envs()) {
    if (env.name == "ASCEND_LAUNCH_BLOCKING") blocking_listed = env.effective == 0 && env.mode == "disable";
  }
  check(blocking_listed);
  check(c10_npu::option::OptionsManager::GetTaskQueueEnable() == task_queue_level &&
        !c10_npu::option::OptionsManager::CheckBlockingEnable());
  return ok;
}
"""


@pytest.fixture(scope="module")
def api_lib(tmp_path_factory):
    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("no c++ on PATH")
    tmp = tmp_path_factory.mktemp("cpp_api")
    src = tmp / "api.cpp"
    src.write_text(_API_CPP)
    so = tmp / "libapi.so"
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cmd = [compiler, "-shared", "-fPIC", "-std=c++20", "-O0", "-I", INCLUDE]  # torch 2.14 headers need C++20
    for inc in torch.utils.cpp_extension.include_paths():
        cmd += ["-isystem", inc]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", str(src), "-o", str(so),
            "-L", LIB, "-ltorch_npu", f"-Wl,-rpath,{LIB}", "-L", torch_lib, "-lc10", "-ltorch_cpu",
            f"-Wl,-rpath,{torch_lib}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lib = ctypes.CDLL(str(so))
    for name in ("stream_and_guard_checks", "event_checks", "generator_checks", "format_checks",
                 "init_and_error_checks"):
        getattr(lib, name).restype = ctypes.c_int64
    lib.generator_checks.argtypes = [ctypes.c_uint64]
    lib.init_and_error_checks.argtypes = [ctypes.c_int64]
    return lib


def _all_bits(value, count):
    missing = [i for i in range(count) if not (value >> i) & 1]
    assert not missing, f"checks {missing} failed"


def test_the_package_ships_the_headers():
    for rel in ("core/npu/NPUStream.h", "core/npu/NPUEvent.h", "core/npu/NPUGuard.h", "core/npu/NPUFunctions.h",
                "core/npu/NPUException.h", "core/npu/NPUFormat.h", "core/npu/NPUHooksInterface.h",
                "core/npu/NPUMacros.h", "core/npu/register/OptionsManager.h", "aten/NPUGeneratorImpl.h",
                "libs/init_npu.h"):
        assert os.path.isfile(os.path.join(INCLUDE, "torch_npu", "csrc", rel)), rel


def test_streams_guards_and_devices(api_lib):
    torch.npu.set_device(0)
    _all_bits(api_lib.stream_and_guard_checks(), 17)
    assert torch.npu.current_device() == 0


def test_events_order_streams_and_the_host(api_lib):
    torch.npu.set_device(0)
    torch.npu._sleep(200_000_000)  # ~0.1 s of simulated AI Core time on the current stream
    _all_bits(api_lib.event_checks(), 7)


def test_generator_is_the_one_torch_uses(api_lib):
    torch.npu.manual_seed(1234)
    _all_bits(api_lib.generator_checks(1234), 6)
    # The C++ draws above advanced the Philox offset torch's generator state carries.
    assert torch.npu.get_rng_state().numel() > 0


def test_storage_formats(api_lib):
    _all_bits(api_lib.format_checks(), 5)


def test_init_errors_and_options(api_lib):
    level = int(os.environ.get("TASK_QUEUE_ENABLE", "1") or "1")
    _all_bits(api_lib.init_and_error_checks(level), 6)
    assert torch.npu.current_device() == 0


def test_sync_debug_mode_warns_and_raises_on_synchronising_operations():
    x = torch.ones(4, device="npu")
    try:
        torch.npu.set_sync_debug_mode("warn")
        assert torch.npu.get_sync_debug_mode() == 1
        with pytest.warns(UserWarning, match="called a synchronizing NPU operation"):
            x.sum().item()
        with pytest.warns(UserWarning, match="called a synchronizing NPU operation"):
            x.cpu()
        torch.npu.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="called a synchronizing NPU operation"):
            x.sum().item()
        y = x * 2  # queued kernels and device-wide synchronisation are not flagged
        torch.npu.synchronize()
        torch.npu.set_sync_debug_mode("default")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert y.sum().item() == 8.0
    finally:
        torch.npu.set_sync_debug_mode(0)
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        torch.npu.set_sync_debug_mode("loud")


def test_launch_blocking_turns_the_task_queue_off():
    result = run_python(textwrap.dedent("""
        import torch, torch_npu
        print(torch_npu._C._npu_taskQueueEnabled())
        envs = {name: (value, effective, mode) for name, value, effective, mode in torch_npu._C._npu_public_envs()}
        print(envs["ASCEND_LAUNCH_BLOCKING"], envs["TASK_QUEUE_ENABLE"])
    """), env={"ASCEND_LAUNCH_BLOCKING": "1", "TASK_QUEUE_ENABLE": "1"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "False"
    assert lines[1] == "('1', 1, 'enable') ('1', 1, 'level 1')"


def test_a_task_queue_level_outside_the_table_is_refused():
    result = run_python("import torch, torch_npu; torch.ones(2, device='npu') + 1",
                        env={"TASK_QUEUE_ENABLE": "7"})
    assert result.returncode != 0
    assert "TASK_QUEUE_ENABLE should be one of 0 (close), 1 (level 1), 2 (level 2), got '7'" in result.stderr


def test_collect_env_lists_the_switches():
    from torch_npu.utils import collect_env
    report = collect_env._public_switches()
    assert "TASK_QUEUE_ENABLE" in report and "PYTORCH_NO_NPU_MEMORY_CACHING" in report
