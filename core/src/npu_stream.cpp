#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_trace.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace torch_npu {
namespace {

// Stream ids per device, in torch_npu's layout (type << 5 | index): 0 = the default
// stream, type 2 = the sync-launch streams (ids 64..67), type 3 = the normal-priority pool
// (96..127), type 4 = the high-priority pool (128..159). An external stream's id is its handle's address (far above the pools' ids),
// registered so that any other id is still refused.
constexpr int kPoolBits = 5;
constexpr int kPoolSize = 1 << kPoolBits;
constexpr c10::StreamId kSyncLaunchType = 2, kNormalType = 3, kHighType = 4;
constexpr int kSyncLaunchStreams = 4;
constexpr c10::StreamId kLastPoolId = (kHighType << kPoolBits) | (kPoolSize - 1);
constexpr int kMaxDevices = 64;

std::mutex g_external_mu;
std::unordered_set<c10::StreamId> g_external;  // guarded by g_external_mu

struct DevicePools {
  std::once_flag once;
  std::array<aclrtStream, 2 * kPoolSize + 1 + kSyncLaunchStreams> streams{};  // default, pools, sync launch
  std::atomic<uint32_t> next[3] = {0, 0, 0};
};

DevicePools& pools(c10::DeviceIndex device) {
  static std::array<DevicePools, kMaxDevices> all;
  return all[device];
}

void init_pools(c10::DeviceIndex device) {
  auto& p = pools(device);
  std::call_once(p.once, [&] {
    int32_t prev = 0;
    NPU_CHECK(aclrtGetDevice(&prev));
    NPU_CHECK(aclrtSetDevice(device));
    p.streams[0] = aclsimDefaultStream(device);
    for (int i = 1; i <= 2 * kPoolSize + kSyncLaunchStreams; ++i) {
      // Creating a stream is cheap: its worker thread starts at its first task.
      NPU_CHECK(aclrtCreateStreamWithConfig(&p.streams[i], i > kPoolSize ? 1 : 0, 0));
      trace::emit(trace::Kind::StreamCreation, p.streams[i]);
    }
    NPU_CHECK(aclrtSetDevice(prev));
  });
}

thread_local std::array<c10::StreamId, kMaxDevices> tls_current_stream{};  // 0 = default

c10::DeviceIndex resolve(c10::DeviceIndex device) {
  if (device < 0) return current_device();
  check_device_index(device);
  return device;
}

}  // namespace

void check_acl(aclError err, const char* what) {
  if (err == ACL_SUCCESS) return;
  const char* msg = aclGetRecentErrMsg();
  // Out of device memory (an allocation, or a queued kernel's): torch.OutOfMemoryError, as
  // the caching allocator raises it, so `except torch.OutOfMemoryError` sees both.
  TORCH_CHECK_WITH(OutOfMemoryError, err != ACL_ERROR_RT_MEMORY_ALLOCATION, (msg && *msg) ? msg : "",
                   " [ACL error ", err, " from ", what, "]");
  TORCH_CHECK(false, (msg && *msg) ? msg : "", " [ACL error ", err, " from ", what, "]");
}

c10::DeviceIndex device_count() {
  static const c10::DeviceIndex count = [] {
    uint32_t n = 0;
    NPU_CHECK(aclrtGetDeviceCount(&n));
    TORCH_CHECK(n <= kMaxDevices, "at most ", kMaxDevices, " NPU devices are supported");
    return static_cast<c10::DeviceIndex>(n);
  }();
  return count;
}

void check_device_index(c10::DeviceIndex device) {
  TORCH_CHECK_INDEX(device >= 0 && device < device_count(), "Invalid device ordinal npu:",
                    static_cast<int>(device), ": this machine has ", static_cast<int>(device_count()),
                    " NPU device(s) (valid: npu:0..npu:", static_cast<int>(device_count()) - 1,
                    "; see ASCEND_RT_VISIBLE_DEVICES)");
}

c10::DeviceIndex current_device() {
  int32_t d = 0;
  NPU_CHECK(aclrtGetDevice(&d));
  return static_cast<c10::DeviceIndex>(d);
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  NPU_CHECK(aclrtSetDevice(device));
}

NPUStream::NPUStream(c10::Stream stream) : stream_(stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "expected an npu stream, got a stream on ", stream.device());
}

int NPUStream::priority() const { return (id() >> kPoolBits) == kHighType && !is_external() ? -1 : 0; }

bool NPUStream::is_external() const { return id() > kLastPoolId; }

bool NPUStream::is_sync_launch() const { return (id() >> kPoolBits) == kSyncLaunchType; }

aclrtStream NPUStream::stream() const {
  auto device = device_index();
  check_device_index(device);
  auto id = this->id();
  if (is_external()) {
    std::lock_guard<std::mutex> lock(g_external_mu);
    TORCH_CHECK(g_external.count(id), "invalid npu stream id ", id);
    return reinterpret_cast<aclrtStream>(static_cast<uintptr_t>(id));
  }
  const c10::StreamId type = id >> kPoolBits;
  const c10::StreamId index = id & (kPoolSize - 1);
  TORCH_CHECK(id == 0 || type == kNormalType || type == kHighType || (type == kSyncLaunchType && index < kSyncLaunchStreams),
              "invalid npu stream id ", id, " (0 is the default stream, ", kSyncLaunchType << kPoolBits, "..",
              (kSyncLaunchType << kPoolBits) + kSyncLaunchStreams - 1, " the sync-launch streams, ",
              kNormalType << kPoolBits, "..", kLastPoolId, " the pools, larger ids external streams)");
  init_pools(device);
  if (id == 0) return pools(device).streams[0];
  if (type == kSyncLaunchType) return pools(device).streams[1 + 2 * kPoolSize + index];
  return pools(device).streams[1 + index + (type == kHighType ? kPoolSize : 0)];
}

bool NPUStream::query() const {
  aclrtStreamStatus status = ACL_STREAM_STATUS_COMPLETE;
  NPU_CHECK(aclrtStreamQuery(stream(), &status));
  return status == ACL_STREAM_STATUS_COMPLETE;
}

// synchronize(): see npu_task_queue.cpp (it may release the GIL).

NPUStream getDefaultNPUStream(c10::DeviceIndex device) {
  device = resolve(device);
  return NPUStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), 0));
}

NPUStream getCurrentNPUStream(c10::DeviceIndex device) {
  device = resolve(device);
  return NPUStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
                               tls_current_stream[device]));
}

void setCurrentNPUStream(NPUStream stream) {
  check_device_index(stream.device_index());
  tls_current_stream[stream.device_index()] = stream.id();
}

NPUStream getStreamFromExternal(aclrtStream stream, c10::DeviceIndex device) {
  device = resolve(device);
  TORCH_CHECK(stream != nullptr, "torch.npu.ExternalStream(): argument 'stream_ptr' must be the address of an "
              "aclrtStream, got 0");
  const int32_t owner = aclsimStreamDevice(stream);
  TORCH_CHECK(owner >= 0, "torch.npu.ExternalStream(): argument 'stream_ptr' (", stream,
              ") is not a live aclrtStream");
  TORCH_CHECK(owner == device, "torch.npu.ExternalStream(): the stream ", stream, " was created on npu:", owner,
              ", not on npu:", static_cast<int>(device));
  const auto id = static_cast<c10::StreamId>(reinterpret_cast<uintptr_t>(stream));
  {
    std::lock_guard<std::mutex> lock(g_external_mu);
    g_external.insert(id);
  }
  return NPUStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id));
}

NPUStream getStreamFromPool(int priority, c10::DeviceIndex device) {
  device = resolve(device);
  init_pools(device);
  const int high = priority < 0 ? 1 : 0;
  const uint32_t slot = pools(device).next[high]++ % kPoolSize;
  const c10::StreamId id = ((high ? kHighType : kNormalType) << kPoolBits) | slot;
  return NPUStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id));
}

NPUStream getSyncLaunchStream(c10::DeviceIndex device) {
  device = resolve(device);
  init_pools(device);
  const uint32_t slot = pools(device).next[2]++ % kSyncLaunchStreams;
  const c10::StreamId id = (kSyncLaunchType << kPoolBits) | slot;
  return NPUStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id));
}

NPUStream getStreamFromPool(bool isHighPriority, c10::DeviceIndex device) {
  return getStreamFromPool(isHighPriority ? -1 : 0, device);
}

}  // namespace torch_npu
