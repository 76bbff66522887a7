// torch_npu._C bindings of the caching allocator's memory tools (see npu/memory.py and
// npu/mem_pool.py): the snapshot with its history (_record_memory_history / _snapshot),
// private memory pools (torch.npu.MemPool / use_mem_pool), the pluggable allocator
// (NPUPluggableAllocator / change_current_allocator), with torch_npu's _C names.
#include <ATen/core/CachingHostAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

namespace py = pybind11;

namespace torch {
// Declared in torch/csrc/profiler/python/combined_traceback.h (libtorch_python), whose
// nlohmann/json include the installed torch headers lack: the frames of tracebacks as
// lists of {"filename", "line", "name"} dicts.
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace torch_npu {

py::dict stat_dict(const c10::CachingAllocator::Stat& s);  // module.cpp

namespace {

namespace alloc = NPUCachingAllocator;

// ---- memory history --------------------------------------------------------------------

std::shared_ptr<c10::GatheredContext> gather_python() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/false);
}

std::shared_ptr<c10::GatheredContext> gather_with_cpp() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/true);
}

void check_option(const char* arg, const std::string& value, std::initializer_list<const char*> valid) {
  std::string expected;
  for (const char* v : valid) {
    if (value == v) return;
    expected += std::string(expected.empty() ? "" : ", ") + "'" + v + "'";
  }
  TORCH_CHECK(false, "_record_memory_history(): argument '", arg, "' must be one of ", expected,
              (std::string(arg) == "stacks" ? "" : " or None"), ", got '", value, "'");
}

void record_memory_history(std::optional<std::string> enabled, std::optional<std::string> context,
                           const std::string& stacks, size_t max_entries) {
  if (enabled) check_option("enabled", *enabled, {"state", "all"});
  if (context) check_option("context", *context, {"state", "alloc", "all"});
  check_option("stacks", stacks, {"python", "all"});
  alloc::CreateContextFn recorder = stacks == "all" ? &gather_with_cpp : &gather_python;
  auto when = alloc::RecordContext::NEVER;
  if (context == "state") when = alloc::RecordContext::STATE;
  if (context == "alloc") when = alloc::RecordContext::ALLOC;
  if (context == "all") when = alloc::RecordContext::ALL;
  // "state": only what is allocated now keeps its stack; the history keeps one entry.
  const size_t entries = enabled && *enabled == "all" ? max_entries : 1;
  alloc::recordHistory(enabled.has_value(), recorder, entries, when);
}

torch::CapturedTraceback* traceback_of(const std::shared_ptr<c10::GatheredContext>& ctx) {
  auto* tb = dynamic_cast<torch::CapturedTraceback*>(ctx.get());
  TORCH_CHECK(tb != nullptr, "memory snapshot: a context not recorded by _record_memory_history");
  return tb;
}

const char* action_name(alloc::TraceEntry::Action action) {
  using A = alloc::TraceEntry;
  switch (action) {
    case A::ALLOC: return "alloc";
    case A::FREE_REQUESTED: return "free_requested";
    case A::FREE_COMPLETED: return "free_completed";
    case A::SEGMENT_ALLOC: return "segment_alloc";
    case A::SEGMENT_FREE: return "segment_free";
    case A::SEGMENT_MAP: return "segment_map";
    case A::SEGMENT_UNMAP: return "segment_unmap";
    case A::SNAPSHOT: return "snapshot";
    case A::OOM: return "oom";
    default: return "unknown";
  }
}

// torch.cuda.memory._snapshot()'s layout: {"segments": [...], "device_traces": [[...] per
// device]}; "frames" of blocks, segments and trace entries are the recorded stacks.
py::dict memory_snapshot(std::optional<alloc::MempoolId_t> mempool_id) {
  collect_finished_kernels();  // what finished kernels held is free memory
  const auto snap = alloc::snapshotWithTraces(mempool_id.value_or(alloc::MempoolId_t{0, 0}));
  std::vector<torch::CapturedTraceback*> to_symbolize;
  std::vector<py::dict> frame_owners;
  const py::list no_frames;
  auto add_frames = [&](py::dict& d, const std::shared_ptr<c10::GatheredContext>& ctx) {
    if (ctx) {
      to_symbolize.push_back(traceback_of(ctx));
      frame_owners.push_back(d);
    } else {
      d["frames"] = no_frames;
    }
  };

  py::list segments;
  for (const auto& seg : snap.segments) {
    py::dict s;
    s["device"] = seg.device;
    s["address"] = seg.address;
    s["total_size"] = seg.total_size;
    s["allocated_size"] = seg.allocated_size;
    s["active_size"] = seg.active_size;
    s["requested_size"] = seg.requested_size;
    s["stream"] = reinterpret_cast<uintptr_t>(seg.stream);
    s["segment_type"] = seg.is_large ? "large" : "small";
    s["segment_pool_id"] = py::make_tuple(seg.owner_private_pool_id.first, seg.owner_private_pool_id.second);
    s["is_expandable"] = seg.is_expandable;
    add_frames(s, seg.context_when_allocated);
    py::list blocks;
    size_t address = seg.address;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated" : (b.active ? "active_pending_free" : "inactive");
      add_frames(bd, b.context_when_allocated);
      blocks.append(bd);
      address += b.size;
    }
    s["blocks"] = blocks;
    segments.append(s);
  }

  py::list device_traces;
  for (const auto& trace : snap.device_traces) {
    py::list entries;
    for (const auto& te : trace) {
      py::dict e;
      e["action"] = action_name(te.action_);
      e[te.action_ == alloc::TraceEntry::OOM ? "device_free" : "addr"] = te.addr_;
      e["size"] = te.size_;
      e["stream"] = reinterpret_cast<uintptr_t>(te.stream_);
      e["pool_id"] = py::make_tuple(te.mempool_.first, te.mempool_.second);
      e["time_us"] = static_cast<int64_t>(te.time_.approx_t_);  // recorded in microseconds
      add_frames(e, te.context_);
      entries.append(e);
    }
    device_traces.append(entries);
  }

  const std::vector<py::object> frames = torch::py_symbolize(to_symbolize);
  for (size_t i = 0; i < frames.size(); ++i) frame_owners[i]["frames"] = frames[i];
  py::dict d;
  d["segments"] = segments;
  d["device_traces"] = device_traces;
  return d;
}

// ---- memory pools ----------------------------------------------------------------------

// torch.npu.MemPool's C++ part (torch_npu's c10_npu::MemPool): a private pool of the caching
// allocator on the device current at creation, held while the object lives.
class MemPool {
 public:
  MemPool(std::shared_ptr<alloc::CustomAllocator> allocator, bool is_user_created, bool use_on_oom,
          bool no_split)
      : device_(current_device()), allocator_(allocator) {
    // A user pool is {0, n}, a pool a graph capture created is {n, 0} (as torch_npu's).
    id_ = graph_pool_handle();
    if (!is_user_created) id_ = {id_.second, 0};
    alloc::createOrIncrefPool(device_, id_, use_on_oom, no_split, std::move(allocator));
  }
  ~MemPool() {
    try {
      alloc::releasePool(device_, id_);  // its memory returns to the device once unused
      alloc::emptyCache(id_);
    } catch (const std::exception& e) {
      TORCH_WARN("MemPool: releasing pool (", id_.first, ", ", id_.second, ") failed: ", e.what());
    }
  }
  MemPool(const MemPool&) = delete;
  MemPool& operator=(const MemPool&) = delete;

  alloc::MempoolId_t id() const { return id_; }
  int use_count() const { return alloc::getPoolUseCount(device_, id_); }
  c10::DeviceIndex device() const { return device_; }
  const std::shared_ptr<alloc::CustomAllocator>& allocator() const { return allocator_; }

 private:
  c10::DeviceIndex device_;
  std::shared_ptr<alloc::CustomAllocator> allocator_;
  alloc::MempoolId_t id_;
};

// ---- pluggable allocator -----------------------------------------------------------------

// torch_npu._C._npu_NPUAllocator: an allocator handle; `fns` is nullptr for the caching
// allocator itself (what _npu_getAllocator returns when no custom one is installed).
struct AllocatorHandle {
  std::shared_ptr<alloc::CustomAllocator> fns;
  virtual ~AllocatorHandle() = default;
};
struct PluggableAllocatorHandle : AllocatorHandle {};

template <typename F>
F* fn_ptr(uint64_t address, const char* what) {
  TORCH_CHECK(address != 0, "NPUPluggableAllocator: the address of ", what, " is 0");
  return reinterpret_cast<F*>(address);
}

// Setters of the optional functions, as torch_npu's _NPUPluggableAllocator has them. They
// apply to an installed allocator too (as torch_npu's).
template <typename F, typename Member>
void bind_setter(py::class_<PluggableAllocatorHandle, AllocatorHandle, std::shared_ptr<PluggableAllocatorHandle>>& c,
                 const char* name, Member member) {
  c.def(name, [name, member](PluggableAllocatorHandle& self, uint64_t address) {
    (*self.fns).*member = fn_ptr<F>(address, name);
  }, py::arg("func_ptr"));
}

// ---- device utilization (torch.npu.utilization) -------------------------------------------

// Percent of the wall time since the previous call for `device` (the first call: since
// torch_npu._C was loaded) that the device's streams spent running tasks, summed over
// streams and capped at 100. A task counts when it finishes.
int64_t g_loaded_ns = 0;  // when torch_npu._C was loaded

int device_utilization(int device) {
  struct Sample {
    int64_t wall_ns;
    int64_t busy_ns;
  };
  static std::mutex mutex;
  static std::vector<std::optional<Sample>> last;
  check_device_index(static_cast<c10::DeviceIndex>(device));
  const int64_t busy = aclsimDeviceBusyNs(device);
  const int64_t now = aclsimNowNs();
  TORCH_CHECK(busy >= 0, "utilization(): invalid npu device ", device);
  std::lock_guard<std::mutex> lock(mutex);
  if (last.size() <= static_cast<size_t>(device)) last.resize(static_cast<size_t>(device) + 1);
  const Sample prev = last[static_cast<size_t>(device)].value_or(Sample{g_loaded_ns, 0});
  last[static_cast<size_t>(device)] = Sample{now, busy};
  const int64_t wall = now - prev.wall_ns;
  if (wall <= 0) return 0;
  const double percent = 100.0 * static_cast<double>(busy - prev.busy_ns) / static_cast<double>(wall);
  return static_cast<int>(std::min(100.0, std::max(0.0, percent)));
}

// ---- the pinned-host allocator (core/src/npu_hooks.cpp), as torch.cuda's host stats ----

py::dict host_memory_stats() {
  collect_finished_kernels();  // pinned blocks finished copies held are free
  const at::HostStats s = at::getHostAllocator(c10::DeviceType::PrivateUse1)->get_stats();
  auto duration = [](const c10::CachingAllocator::DurationStat& x) {
    py::dict d;
    d["total"] = x.total;
    d["max"] = x.max;
    d["min"] = x.min;
    d["count"] = x.count;
    d["avg"] = x.count == 0 ? 0 : x.total / x.count;
    return d;
  };
  py::dict d;
  d["allocations"] = stat_dict(s.allocations);
  d["allocated_bytes"] = stat_dict(s.allocated_bytes);
  d["active_requests"] = stat_dict(s.active_requests);
  d["active_bytes"] = stat_dict(s.active_bytes);
  d["num_host_alloc"] = s.num_host_alloc;
  d["num_host_free"] = s.num_host_free;
  d["host_alloc_time"] = duration(s.host_alloc_time);
  d["host_free_time"] = duration(s.host_free_time);
  return d;
}

}  // namespace

void init_memory_bindings(py::module& m) {
  g_loaded_ns = aclsimNowNs();
  m.def("_npu_hostMemoryStats", &host_memory_stats);
  m.def("_npu_resetAccumulatedHostMemoryStats",
        [] { at::getHostAllocator(c10::DeviceType::PrivateUse1)->reset_accumulated_stats(); });
  m.def("_npu_resetPeakHostMemoryStats",
        [] { at::getHostAllocator(c10::DeviceType::PrivateUse1)->reset_peak_stats(); });
  m.def("_npu_hostEmptyCache", [] {
    collect_finished_kernels();
    at::getHostAllocator(c10::DeviceType::PrivateUse1)->empty_cache();
  });
  m.def("_npu_getDeviceUtilizationRate", &device_utilization, py::arg("device"));

  // Data safety after a device fault (torch_npu.npu._recovery).
  m.def("_check_npu_data_ptr", [](const at::Storage& s) { return alloc::checkBlockIsSafe(s.data_ptr()); });
  m.def("_update_npu_data_ptr", [](const at::Storage& s) { alloc::updateBlockToSafe(s.data_ptr()); });
  m.def("_mark_all_npu_data_ptr_unsafe", [](int device) {
    alloc::markAllBlockUnsafe(static_cast<c10::DeviceIndex>(device));
  });
  m.def("_set_npu_data_unsafe_flag", &alloc::setNpuDataUnsafeFlag);
  m.def("_get_npu_data_unsafe_flag", &alloc::getNpuDataUnsafeFlag);
  // The simulator's streams survive a fault: recovering them drains the device's streams and
  // drops the errors of their failed tasks; restarting the device also lifts a stop_device.
  m.def("_recovery_all_npu_stream", [](int device) { recover_streams(static_cast<c10::DeviceIndex>(device)); });
  m.def("_npu_restart_device", [](int device) { restart_device(static_cast<c10::DeviceIndex>(device)); });
  m.def("_npu_stopDevice", [](int device) {
    stop_device(static_cast<c10::DeviceIndex>(device));
    return 0;  // torch_npu's: 0 when aclrtDeviceTaskAbort succeeded
  });

  m.def("_npu_memorySnapshot", &memory_snapshot, py::arg("mempool_id") = py::none());
  m.def("_npu_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"));
  m.def("_npu_isHistoryEnabled", &alloc::isHistoryEnabled);

  py::class_<MemPool, std::shared_ptr<MemPool>>(m, "_MemPool")
      .def(py::init([](const py::object& allocator, bool is_user_created, bool use_on_oom, bool no_split) {
             std::shared_ptr<alloc::CustomAllocator> fns;
             if (!allocator.is_none()) {
               TORCH_CHECK(py::isinstance<AllocatorHandle>(allocator),
                           "MemPool(): argument 'allocator' must be None or an NPUPluggableAllocator's "
                           "allocator(), got ", py::str(py::type::of(allocator)).cast<std::string>());
               fns = allocator.cast<std::shared_ptr<AllocatorHandle>>()->fns;
               TORCH_CHECK(fns != nullptr, "MemPool(): argument 'allocator' must be a pluggable allocator");
             }
             return std::make_shared<MemPool>(std::move(fns), is_user_created, use_on_oom, no_split);
           }),
           py::arg("allocator") = py::none(), py::arg("is_user_created") = true, py::arg("use_on_oom") = false,
           py::arg("no_split") = false)
      .def_property_readonly("id", &MemPool::id)
      .def_property_readonly("allocator", [](const MemPool& self) -> py::object {
        if (!self.allocator()) return py::none();
        auto handle = std::make_shared<PluggableAllocatorHandle>();
        handle->fns = self.allocator();
        return py::cast(std::static_pointer_cast<AllocatorHandle>(handle));
      })
      .def("use_count", &MemPool::use_count)
      .def_property_readonly("device", &MemPool::device);

  // use_mem_pool: the allocations of the calling thread go to the pool.
  m.def("_npu_beginAllocateCurrentThreadToPool", [](int device, alloc::MempoolId_t id) {
    const auto tid = std::this_thread::get_id();
    alloc::beginAllocateToPool(static_cast<c10::DeviceIndex>(device), id,
                               [tid](aclrtStream) { return std::this_thread::get_id() == tid; });
  });
  m.def("_npu_beginAllocateToPool", [](int device, alloc::MempoolId_t id) {
    alloc::beginAllocateToPool(static_cast<c10::DeviceIndex>(device), id, [](aclrtStream) { return true; });
  });
  m.def("_npu_beginAllocateCurrentStreamToPool", [](int device, alloc::MempoolId_t id) {
    const aclrtStream stream = getCurrentNPUStream(static_cast<c10::DeviceIndex>(device)).stream();
    alloc::beginAllocateToPool(static_cast<c10::DeviceIndex>(device), id,
                               [stream](aclrtStream s) { return s == stream; });
  });
  m.def("_npu_endAllocateToPool", [](int device, alloc::MempoolId_t id) {
    alloc::endAllocateToPool(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("_npu_releasePool", [](int device, alloc::MempoolId_t id) {
    alloc::releasePool(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("_npu_emptyCachePool", [](alloc::MempoolId_t id) {
    collect_finished_kernels();
    alloc::emptyCache(id);
  });

  py::class_<AllocatorHandle, std::shared_ptr<AllocatorHandle>>(m, "_npu_NPUAllocator");
  py::class_<PluggableAllocatorHandle, AllocatorHandle, std::shared_ptr<PluggableAllocatorHandle>> pluggable(
      m, "_NPUPluggableAllocator");
  using CA = alloc::CustomAllocator;
  bind_setter<void(int)>(pluggable, "set_init_fn", &CA::init_fn);
  bind_setter<void(bool)>(pluggable, "set_reset_fn", &CA::reset_fn);
  bind_setter<void(double, int)>(pluggable, "set_memory_fraction_fn", &CA::memory_fraction_fn);
  bind_setter<void*(void*, size_t*)>(pluggable, "set_base_alloc_fn", &CA::base_alloc_fn);
  bind_setter<void(void*, aclrtStream)>(pluggable, "set_record_stream_fn", &CA::record_stream_fn);
  bind_setter<void(void*, aclrtStream)>(pluggable, "set_erase_stream_fn", &CA::erase_stream_fn);
  bind_setter<alloc::DeviceStats(c10::DeviceIndex)>(pluggable, "set_get_device_stats_fn", &CA::get_device_stats_fn);
  bind_setter<void(c10::DeviceIndex)>(pluggable, "set_reset_peak_status_fn", &CA::reset_peak_status_fn);

  // torch_npu's signatures: void* alloc(size_t size, int device, aclrtStream stream),
  // void free(void* ptr, size_t size, int device, aclrtStream stream).
  m.def("_npu_customAllocator", [](uint64_t malloc_ptr, uint64_t free_ptr) {
    auto handle = std::make_shared<PluggableAllocatorHandle>();
    handle->fns = std::make_shared<CA>();
    handle->fns->alloc_fn = fn_ptr<void*(size_t, int, aclrtStream)>(malloc_ptr, "the alloc function");
    handle->fns->free_fn = fn_ptr<void(void*, size_t, int, aclrtStream)>(free_ptr, "the free function");
    return handle;
  }, py::arg("malloc_ptr"), py::arg("free_ptr"));
  m.def("_npu_changeCurrentAllocator", [](const std::shared_ptr<AllocatorHandle>& allocator) {
    TORCH_CHECK(allocator != nullptr && allocator->fns != nullptr,
                "change_current_allocator(): argument 'allocator' must be an NPUPluggableAllocator's "
                "allocator (the caching allocator is the default and cannot be re-installed)");
    alloc::changeCurrentAllocator(allocator->fns);
  });
  m.def("_npu_getAllocator", []() -> std::shared_ptr<AllocatorHandle> {
    auto fns = alloc::currentCustomAllocator();
    std::shared_ptr<AllocatorHandle> handle;
    if (fns) {
      handle = std::make_shared<PluggableAllocatorHandle>();
    } else {
      handle = std::make_shared<AllocatorHandle>();
    }
    handle->fns = std::move(fns);
    return handle;
  });
  // torch_npu's name of _npu_setAllocatorSettings (PYTORCH_NPU_ALLOC_CONF syntax).
  m.def("_npu_npuCachingAllocator_set_allocator_settings",
        [](const std::string& conf) { alloc::setAllocatorSettings(conf); });
  m.def("_npu_getAllocatorBackend", [] { return alloc::currentCustomAllocator() ? "pluggable" : "native"; });
}

}  // namespace torch_npu
