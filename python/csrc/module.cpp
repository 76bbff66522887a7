// torch_npu._C: the Python bindings of the runtime (see torch_npu/_C.pyi).
// The only translation unit that includes Python and pybind11 headers.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include "acl/acl_rt.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/register/OptionsManager.h"
#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_generator.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/core/npu_trace.h"
#include "torch_npu/distributed/python.h"
#include "torch_npu/ops/fft_plan_cache.h"
#include "torch_npu/ops/formats.h"
#include "torch_npu/ops/op_support.h"
#include "torch_npu/ops/zero_copy.h"

#ifndef NPU_TORCH_VERSION
#error "NPU_TORCH_VERSION must be defined by the build"
#endif
#ifndef NPU_CANN_VERSION
#error "NPU_CANN_VERSION must be defined by the build"
#endif

namespace py = pybind11;

namespace torch_npu {
void init_graph_bindings(py::module& m);  // graph_bindings.cpp
void init_memory_bindings(py::module& m);  // memory_bindings.cpp
void init_ipc_bindings(py::module& m);  // ipc_bindings.cpp

// {"current", "peak", "allocated", "freed"} of an allocator statistic (memory_bindings.cpp too).
py::dict stat_dict(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

namespace {

constexpr auto kNPU = c10::DeviceType::PrivateUse1;

// Set in a child forked after torch.npu's initialisation (torch.npu._is_in_bad_fork()).
bool in_bad_fork = false;

// Blocking waits release the GIL so that nothing queued can deadlock on it.
void release_gil_while(void (*fn)(void*), void* arg) {
  if (PyGILState_Check()) {
    py::gil_scoped_release no_gil;
    fn(arg);
  } else {
    fn(arg);
  }
}

// The NPU trace's sink while torch_npu.npu._sanitizer is on: each trace point calls
// torch_npu.utils._npu_trace._fire(kind, a, b) on the calling (host) thread.
void fire_python_trace(trace::Kind kind, uintptr_t a, uintptr_t b) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  static PyObject* fire = nullptr;  // leaked: it must outlive interpreter teardown order
  try {
    if (fire == nullptr) fire = py::module_::import("torch_npu.utils._npu_trace").attr("_fire").cast<py::object>().release().ptr();
    py::handle callback(fire);
    callback(static_cast<int>(kind), a, b);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_npu NPU trace callback");
  }
}

py::dict stat_array_dict(const c10::CachingAllocator::StatArray& a) {
  static const char* names[] = {"all", "small_pool", "large_pool"};
  py::dict d;
  for (size_t i = 0; i < a.size(); ++i) d[names[i]] = stat_dict(a[i]);
  return d;
}

py::dict memory_stats(c10::DeviceIndex device) {
  check_device_index(device);
  collect_finished_kernels();  // what finished kernels held is free memory
  const auto s = NPUCachingAllocator::getDeviceStats(device);
  py::dict d;
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_oom_rejections"] = s.num_oom_rejections;
  d["max_split_size"] = s.max_split_size;
  d["num_sync_all_streams"] = s.num_sync_all_streams;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["oversize_allocations"] = stat_dict(s.oversize_allocations);
  d["oversize_segments"] = stat_dict(s.oversize_segments);
  d["allocation"] = stat_array_dict(s.allocation);
  d["segment"] = stat_array_dict(s.segment);
  d["active"] = stat_array_dict(s.active);
  d["inactive_split"] = stat_array_dict(s.inactive_split);
  d["allocated_bytes"] = stat_array_dict(s.allocated_bytes);
  d["reserved_bytes"] = stat_array_dict(s.reserved_bytes);
  d["active_bytes"] = stat_array_dict(s.active_bytes);
  d["inactive_split_bytes"] = stat_array_dict(s.inactive_split_bytes);
  d["requested_bytes"] = stat_array_dict(s.requested_bytes);
  return d;
}

py::tuple stream_tuple(const NPUStream& s) {
  return py::make_tuple(static_cast<int64_t>(s.id()), static_cast<int64_t>(s.device_index()),
                        static_cast<int64_t>(kNPU));
}

}  // namespace
}  // namespace torch_npu

PYBIND11_MODULE(_C, m) {
  using namespace torch_npu;
  m.doc() = "torch_npu runtime bindings";
  m.attr("__torch_version__") = NPU_TORCH_VERSION;
  m.attr("__cann_version__") = NPU_CANN_VERSION;
  init_graph_bindings(m);
  init_memory_bindings(m);
  init_ipc_bindings(m);

  // At import: the CPU allocator wrapper through which ATen's CPU kernels allocate their
  // outputs in npu memory when they run as npu kernels, and the hook that releases the GIL
  // while a thread blocks on the runtime. Idempotent; nothing starts a device.
  auto install_hooks = [] {
    ops::install_kernel_allocator();
    set_blocking_hook(&release_gil_while);
  };
  m.def("_npu_install_hooks", install_hooks);
  // torch_npu's name for the initialisation torch.npu._lazy_init() runs: the hooks above
  // (if import did not install them). Devices, their memory and stream workers start at
  // their first use, not here.
  m.def("_npu_init", install_hooks);
  m.def("_npu_getDeviceCount", [] { return static_cast<int>(device_count()); });
  // Before the runtime starts: the count it would have now, without starting it (device_count()
  // before initialisation); after: the runtime's.
  m.def("_npu_visibleDeviceCount", [] { return static_cast<int>(aclsimVisibleDeviceCount()); });
  // torch.npu.backends.fft_plan_cache (torch_npu/npu/_fft_plan_cache.py)
  m.def("_npu_get_fft_plan_cache_size", &torch_npu::ops::fft_plan_cache::size);
  m.def("_npu_get_fft_plan_cache_max_size", &torch_npu::ops::fft_plan_cache::max_size);
  m.def("_npu_set_fft_plan_cache_max_size", &torch_npu::ops::fft_plan_cache::set_max_size, py::arg("size"));
  m.def("_npu_clear_fft_plan_cache", &torch_npu::ops::fft_plan_cache::clear);
  m.def("_npu_set_allow_internal_format", &torch_npu::ops::set_allow_internal_format, py::arg("allow"));
  m.def("_npu_setDevice", [](int d) { set_device(static_cast<c10::DeviceIndex>(d)); });
  // torch.npu.set_sync_debug_mode: 0 off, 1 warn, 2 error on synchronising operations.
  m.def("_npu_set_sync_debug_mode", [](int mode) {
    TORCH_CHECK(mode >= 0 && mode <= 2, "invalid value of debug_mode, expected one of 0,1,2, got ", mode);
    c10_npu::warning_state().set_sync_debug_mode(static_cast<c10_npu::SyncDebugMode>(mode));
  });
  // torch_npu's public environment switches: (name, value as set, value in force, its meaning).
  m.def("_npu_public_envs", [] {
    std::vector<std::tuple<std::string, std::string, int, std::string>> out;
    for (const auto& env : c10_npu::option::OptionsManager::describe_public_envs()) {
      out.emplace_back(env.name, env.value, env.effective, env.mode);
    }
    return out;
  });
  m.def("_npu_get_sync_debug_mode", [] { return static_cast<int>(c10_npu::warning_state().get_sync_debug_mode()); });
  m.def("_npu_getDevice", [] { return static_cast<int>(current_device()); });
  m.def("_npu_sleep", [](int64_t cycles) {
    sleep_on_stream(getCurrentNPUStream(), cycles);
  });
  m.def("_npu_synchronize", [](int d) { synchronize_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_npu_getDeviceName", [](int d) {
    check_device_index(static_cast<c10::DeviceIndex>(d));
    return std::string(aclrtGetSocName());
  });
  m.def("_npu_getDeviceTotalMemory", [](int d) {
    check_device_index(static_cast<c10::DeviceIndex>(d));
    return static_cast<uint64_t>(aclsimDeviceCapacity(d));
  });
  m.def("_npu_isInBadFork", [] { return in_bad_fork; });
  // Called in a child forked after initialisation: its next npu tensor op then calls
  // torch.npu._lazy_init() again (PyTorch's lazy-init flag came over from the parent),
  // which raises as CUDA does.
  m.def("_npu_markBadFork", [] {
    in_bad_fork = true;
    torch::utils::set_requires_device_init(kNPU, true);
  });

  m.def("_npu_getCurrentStream", [](int d) { return stream_tuple(getCurrentNPUStream(static_cast<c10::DeviceIndex>(d))); });
  m.def("_npu_getDefaultStream", [](int d) { return stream_tuple(getDefaultNPUStream(static_cast<c10::DeviceIndex>(d))); });
  m.def("_npu_setStream", [](int64_t id, int64_t device, int64_t type) {
    TORCH_CHECK(type == static_cast<int64_t>(kNPU), "expected an npu stream, got device type ", type);
    NPUStream stream(c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, static_cast<c10::DeviceIndex>(device)), id));
    // As torch_npu's (and CUDA's): the stream's device becomes the current device, so that
    // `with torch.npu.stream(s)` runs the block's work on s's device.
    if (current_device() != stream.device_index()) set_device(stream.device_index());
    setCurrentNPUStream(stream);
  });
  m.def("_npu_getStreamFromExternal", [](uintptr_t stream, int device) {
    return stream_tuple(getStreamFromExternal(reinterpret_cast<aclrtStream>(stream), static_cast<c10::DeviceIndex>(device)));
  });
  m.def("_npu_getSyncLaunchStream", [](int d) {
    return stream_tuple(getSyncLaunchStream(static_cast<c10::DeviceIndex>(d)));
  });
  m.def("_npu_streamPriority", [](int64_t id, int64_t device) {
    NPUStream s(c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, static_cast<c10::DeviceIndex>(device)), id));
    s.stream();  // validates the id
    return s.priority();
  });
  m.def("_npu_streamRawHandle", [](int64_t id, int64_t device) {
    NPUStream s(c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, static_cast<c10::DeviceIndex>(device)), id));
    return reinterpret_cast<uintptr_t>(s.stream());
  });

  m.def("_npu_eventElapsedTime", [](uintptr_t start, uintptr_t end, int device) {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    check_device_index(static_cast<c10::DeviceIndex>(device));
    pybind11::gil_scoped_release no_gil;  // it waits for both events
    return c10::impl::getDeviceGuardImpl(kNPU)->elapsedTime(reinterpret_cast<void*>(start),
                                                            reinterpret_cast<void*>(end),
                                                            static_cast<c10::DeviceIndex>(device));
  });

  m.def("_npu_eventRecordedTime", [](uintptr_t event) {
    TORCH_CHECK(event, "Event must be recorded before getting recorded timestamp.");
    uint64_t us = 0;
    NPU_CHECK(aclrtEventGetTimestamp(reinterpret_cast<aclrtEvent>(event), &us));
    return us;
  });

  m.def("_npu_memoryStats", [](int d) { return memory_stats(static_cast<c10::DeviceIndex>(d)); });
  m.def("_npu_resetAccumulatedMemoryStats", [](int d) {
    check_device_index(static_cast<c10::DeviceIndex>(d));
    NPUCachingAllocator::resetAccumulatedStats(static_cast<c10::DeviceIndex>(d));
  });
  m.def("_npu_resetPeakMemoryStats", [](int d) {
    check_device_index(static_cast<c10::DeviceIndex>(d));
    NPUCachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(d));
  });
  m.def("_npu_emptyCache", [] {
    collect_finished_kernels();
    NPUCachingAllocator::emptyCache();
  });
  m.def("_npu_emptyVirtAddrCache", [] {
    collect_finished_kernels();
    NPUCachingAllocator::emptyVirtAddrCache();
  });
  m.def("_npu_setMemoryFraction", [](double fraction, int d) {
    check_device_index(static_cast<c10::DeviceIndex>(d));
    NPUCachingAllocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(d));
  });
  m.def("_npu_getMemInfo", [](int d) {
    check_device_index(static_cast<c10::DeviceIndex>(d));
    return NPUCachingAllocator::memGetInfo(static_cast<c10::DeviceIndex>(d));
  });
  m.def("_npu_cachingAllocator_raw_alloc", [](size_t size, uintptr_t stream) {
    (void)stream;  // the current stream is used; a raw aclrtStream cannot name a pool slot
    return reinterpret_cast<uintptr_t>(NPUCachingAllocator::raw_alloc(size));
  });
  m.def("_npu_cachingAllocator_raw_delete", [](uintptr_t p) { NPUCachingAllocator::raw_delete(reinterpret_cast<void*>(p)); });
  m.def("_npu_setAllocatorSettings", [](const std::string& conf) { NPUCachingAllocator::setAllocatorSettings(conf); });
  // torch_npu.erase_stream(tensor, stream): undoes tensor.record_stream(stream).
  // torch_npu.npu._sanitizer: mode 0 (stream check) sends the NPU trace to Python;
  // _deactivate_npu_trace turns it off again.
  m.def("_activate_npu_trace", [](int mode) {
    TORCH_CHECK(mode == 0, "_activate_npu_trace: mode must be 0 (SanitizerMode.STREAM), got ", mode);
    trace::set_sink(&fire_python_trace);
  });
  m.def("_deactivate_npu_trace", [] { trace::set_sink(nullptr); });

  m.def("_npu_eraseStream", [](const at::Tensor& t, int64_t id, int64_t device, int64_t type) {
    TORCH_CHECK(type == static_cast<int64_t>(kNPU), "expected an npu stream, got device type ", type);
    NPUCachingAllocator::eraseStream(
        t.storage().data_ptr(),
        c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, static_cast<c10::DeviceIndex>(device)), id));
  });

  m.def("_npu_getDefaultGenerator", [](int d) {
    const auto& gen = getDefaultNPUGenerator(static_cast<c10::DeviceIndex>(d));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });

  m.def("_npu_copiedBytes", [](int kind) {
    TORCH_CHECK(kind >= 0 && kind <= 3, "kind must be 0..3 (aclrtMemcpyKind), got ", kind);
    return aclsimCopiedBytes(static_cast<aclrtMemcpyKind>(kind));
  });
  m.def("_npu_taskQueueEnabled", [] { return task_queue_enabled(); });
  // At exit, before the interpreter finalizes (torch_npu's name): a kernel still queued would
  // otherwise run while Python tears down. False if a device reported an error.
  m.def("_npu_shutdown_synchronize", [] {
    bool ok = true;
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      try {
        wait_device(d);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    return ok;
  });
  // ASCEND_SIM_INLINE at run time (tests of queued kernels): returns the previous setting.
  m.def("_npu_set_inline", [](bool on) { return set_runs_on_caller(on); }, py::arg("on"));
  // torch_npu.profiler: the simulator's task records (core/acl/src/profiler.cpp).
  m.def("_npu_profilerEnable", [](bool on) {
    track_host_ops(on);
    NPU_CHECK(aclsimProfilerEnable(on ? 1 : 0));
  });
  m.def("_npu_profilerNowNs", [] { return aclsimNowNs(); });
  // torch_npu.profiler.profile.enable/disable_profiler_in_child_thread: torch's profiler
  // records the threads it was started on; these add the calling thread to a running one.
  m.def("_npu_profilerEnableInChildThread", [] {
    if (!torch::autograd::profiler::isProfilerEnabledInMainThread()) return false;
    torch::autograd::profiler::enableProfilerInChildThread();
    return true;
  });
  m.def("_npu_profilerDisableInChildThread", [] { torch::autograd::profiler::disableProfilerInChildThread(); });
  m.def("_npu_profilerDrain", [] {
    static const char* kinds[] = {"kernel", "memcpy", "memset", "callback", "graph"};
    uint64_t dropped = 0;
    std::vector<aclsimProfRecord> records(aclsimProfilerDrain(nullptr, 0, nullptr));
    records.resize(aclsimProfilerDrain(records.data(), records.size(), &dropped));
    py::list out;
    for (const auto& r : records) {
      out.append(py::make_tuple(std::string(r.name), kinds[r.kind], r.device, r.stream, r.correlation, r.launch_tid,
                                r.launch_ns, r.start_ns, r.end_ns, r.bytes, r.host_op));
    }
    return py::make_tuple(out, dropped);
  });
  m.def("_npu_getCpuFallback", [] { return ops::cpu_fallback_enabled(); });
  m.def("_npu_setCpuFallback", [](bool enabled) { ops::set_cpu_fallback(enabled); });
  // A CPU tensor over an npu tensor's bytes (same sizes, strides, offset; it keeps the npu
  // storage alive): hands npu memory to code outside the dispatcher (DLPack consumers such
  // as the IREE runtime) without copies. No ordering: the caller synchronizes the stream.
  m.def("_npu_cpuAlias", [](const at::Tensor& t) {
    TORCH_CHECK(t.defined() && t.device().type() == kNPU, "_npu_cpuAlias: expected an npu tensor, got ",
                t.defined() ? t.device().str() : "an undefined tensor");
    return ops::AliasMap(t.device().index()).alias(t);
  });

  distributed::init_python_bindings(m.ptr());  // torch_npu._C._distributed_c10d (hccl)
}
