// The npu's activity profiler for Kineto (torch.profiler's ProfilerActivity.PrivateUse1), as
// torch_npu plugs in its mspti one: with
//   torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])
// the chrome trace gets the npu's kernels, copies and memsets (category "kernel", "gpu_memcpy",
// "gpu_memset") on a device lane per npu (pid = device index, sorted below the CPU process),
// a lane per stream, args "type" and "streamId", and an "ac2g" flow from the operator that
// launched them: one flow per operator, id = the operator's "External id", starting at a
// PRIVATEUSE1_RUNTIME launch event on the launching thread and ending on each of its tasks.
//
// The device side is the simulator's task recorder (core/acl/src/profiler.cpp), the one
// torch_npu.profiler.profile reads: a session enables it while Kineto records and drains it
// when Kineto stops. Tasks are tagged with the operator they were launched from through
// Kineto's correlation ids (pushCorrelationId / popCorrelationId on the launching thread).
// torch_npu.profiler.profile uses Kineto's CPU activity only, so it never opens a session.
// Kineto's metadata formatting is fmt's, which libtorch does not export: compiled in here.
#define FMT_HEADER_ONLY
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <kineto/libkineto.h>
#include <kineto/output_base.h>

#include <acl/acl_rt.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "torch_npu/core/npu_stream.h"

namespace torch_npu {
namespace {

using libkineto::ActivityType;

// Above any process id (pid_max <= 2^22), so the npu lanes sort below the CPU process.
constexpr int64_t kNpuSortIndexBase = int64_t{1} << 28;

thread_local std::vector<uint64_t> tls_correlation;  // Kineto correlation ids entered here

bool wants_device_activities(const std::set<ActivityType>& types) {
  return types.count(ActivityType::CONCURRENT_KERNEL) || types.count(ActivityType::GPU_MEMCPY) ||
         types.count(ActivityType::GPU_MEMSET);
}

// Every device the program has used has finished its queued work (and so recorded it).
void synchronize_used_devices() {
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  if (impl == nullptr || !at::isPrivateUse1HooksRegistered()) return;
  const auto count = impl->deviceCount();
  for (c10::DeviceIndex d = 0; d < count; ++d) {
    try {
      if (at::detail::getPrivateUse1Hooks().hasPrimaryContext(d)) impl->synchronizeDevice(d);
    } catch (...) {
      // A failed kernel is reported by the program's own next synchronisation.
    }
  }
}

class NpuKinetoSession : public libkineto::IActivityProfilerSession {
 public:
  explicit NpuKinetoSession(std::set<ActivityType> types) : types_(std::move(types)) {}

  void start() override {
    const int64_t unix_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    unix_minus_sim_ns_ = unix_ns - aclsimNowNs();
    std::vector<aclsimProfRecord> stale(aclsimProfilerDrain(nullptr, 0, nullptr));
    aclsimProfilerDrain(stale.data(), stale.size(), nullptr);  // nothing from before this trace
    aclsimProfilerEnable(1);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    synchronize_used_devices();
    aclsimProfilerEnable(0);
    uint64_t dropped = 0;
    records_.resize(aclsimProfilerDrain(nullptr, 0, nullptr));
    records_.resize(aclsimProfilerDrain(records_.data(), records_.size(), &dropped));
    if (dropped) errors_.push_back(std::to_string(dropped) + " npu task records were dropped (buffer full)");
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  void pushCorrelationId(uint64_t id) override {
    tls_correlation.push_back(id);
    aclsimProfilerSetLaunchTag(id);
  }

  void popCorrelationId() override {
    if (!tls_correlation.empty()) tls_correlation.pop_back();
    aclsimProfilerSetLaunchTag(tls_correlation.empty() ? 0 : tls_correlation.back());
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_op,
                    int64_t /*startTime*/, int64_t /*endTime*/) override {
    std::set<uint64_t> flows_started;
    const int32_t pid = libkineto::processId();
    for (const auto& r : records_) {
      ActivityType type;
      std::string kind;
      std::string launch;
      switch (r.kind) {
        case ACLSIM_PROF_KERNEL:
          type = ActivityType::CONCURRENT_KERNEL, kind = "KERNEL", launch = "aclrtLaunchKernel";
          break;
        case ACLSIM_PROF_GRAPH:
          type = ActivityType::CONCURRENT_KERNEL, kind = "GRAPH", launch = "aclmdlRIExecuteAsync";
          break;
        case ACLSIM_PROF_MEMCPY:
          type = ActivityType::GPU_MEMCPY, kind = "MEMCPY", launch = "aclrtMemcpyAsync";
          break;
        case ACLSIM_PROF_MEMSET:
          type = ActivityType::GPU_MEMSET, kind = "MEMSET", launch = "aclrtMemsetAsync";
          break;
        default:
          continue;  // host callbacks run on the host, not on the device
      }
      if (!types_.count(type)) continue;
      const libkineto::ITraceActivity* op = r.host_op ? linked_op(static_cast<int32_t>(r.host_op)) : nullptr;

      libkineto::GenericTraceActivity task;
      task.activityType = type;
      task.activityName = r.kind == ACLSIM_PROF_MEMCPY ? "Memcpy" : r.kind == ACLSIM_PROF_MEMSET ? "Memset" : r.name;
      task.startTime = r.start_ns + unix_minus_sim_ns_;
      task.endTime = r.end_ns + unix_minus_sim_ns_;
      task.id = static_cast<int32_t>(r.correlation);
      task.device = r.device;
      task.resource = r.stream;
      task.linked = op;
      task.addMetadataQuoted("type", kind);
      task.addMetadata("device", std::to_string(r.device));
      task.addMetadata("streamId", std::to_string(r.stream));
      if (r.bytes) task.addMetadata("bytes", std::to_string(r.bytes));
      if (op != nullptr) {
        const auto flow = static_cast<uint32_t>(r.host_op);
        if (flows_started.insert(r.host_op).second) {
          // Where the operator launched its first task: the flow's start, on the host thread.
          libkineto::GenericTraceActivity site;
          site.activityType = ActivityType::PRIVATEUSE1_RUNTIME;
          site.activityName = launch;
          site.startTime = site.endTime = r.launch_ns + unix_minus_sim_ns_;
          site.id = static_cast<int32_t>(r.host_op);
          site.device = pid;
          site.resource = r.launch_tid;
          site.linked = op;
          site.flow.id = flow;
          site.flow.type = libkineto::kLinkAsyncCpuGpu;
          site.flow.start = true;
          site.log(logger);
        }
        task.flow.id = flow;
        task.flow.type = libkineto::kLinkAsyncCpuGpu;
        task.flow.start = false;
      }
      task.log(logger);
      lanes_[r.device].insert(r.stream);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // One process entry per session (Kineto's interface): the first npu that ran a task.
    const int64_t device = lanes_.empty() ? static_cast<int64_t>(current_device()) : lanes_.begin()->first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, kNpuSortIndexBase + device, "NPU " + std::to_string(device), "npu:" + std::to_string(device)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, streams] : lanes_) {
      for (int32_t stream : streams) {
        out.push_back(libkineto::ResourceInfo{stream, stream, device, "Stream " + std::to_string(stream)});
      }
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  std::set<ActivityType> types_;
  int64_t unix_minus_sim_ns_ = 0;
  std::vector<aclsimProfRecord> records_;
  std::vector<std::string> errors_;
  std::map<int32_t, std::set<int32_t>> lanes_;  // device -> streams that ran a task
};

class NpuKinetoProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    if (!wants_device_activities(types)) return nullptr;  // a CPU-only trace
    return std::make_unique<NpuKinetoSession>(types);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t, const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "torch_npu_simulator";
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                     ActivityType::GPU_MEMSET, ActivityType::PRIVATEUSE1_RUNTIME};
};

struct RegisterNpuKinetoProfiler {
  RegisterNpuKinetoProfiler() {
    libkineto::api().registerProfilerFactory(
        []() -> std::unique_ptr<libkineto::IActivityProfiler> { return std::make_unique<NpuKinetoProfiler>(); });
  }
};
RegisterNpuKinetoProfiler register_npu_kineto_profiler;

}  // namespace
}  // namespace torch_npu
