// NPU streams on the torch side: a c10::Stream whose id names an ACL stream of the
// simulator. Modelled on c10::cuda::CUDAStream: per device, id 0 is the default
// stream and ids 1..kStreamsPerPool (x2 for high priority) name a lazily created
// round-robin pool, so torch.npu.Stream() in a loop never creates unbounded workers.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <acl/acl_rt.h>

namespace torch_npu {

class NPUStream {
 public:
  explicit NPUStream(c10::Stream stream);  // checks device type is npu

  c10::Stream unwrap() const { return stream_; }
  operator c10::Stream() const { return stream_; }
  c10::Device device() const { return stream_.device(); }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::StreamId id() const { return stream_.id(); }
  int priority() const;
  // A stream created outside torch_npu (torch.npu.ExternalStream): its id is its handle.
  bool is_external() const;
  // A sync-launch stream (torch_npu's SyncLaunchStream): its kernels bypass the task queue
  // and run on the calling thread, in stream order.
  bool is_sync_launch() const;

  // The simulator's handle (never NULL: the default stream is resolved).
  aclrtStream stream() const;
  // True when all work queued so far has finished.
  bool query() const;
  // Waits for all queued work; rethrows a kernel failure as c10::Error naming the op.
  // Releases nothing itself: callers holding the GIL must release it first.
  void synchronize() const;

  bool operator==(const NPUStream& o) const { return stream_ == o.stream_; }
  bool operator!=(const NPUStream& o) const { return !(*this == o); }

 private:
  c10::Stream stream_;
};

// Current device: per host thread (aclrtSetDevice), default 0.
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);  // validates the index
c10::DeviceIndex device_count();
void check_device_index(c10::DeviceIndex device);  // "Invalid device ordinal" error

NPUStream getDefaultNPUStream(c10::DeviceIndex device = -1);
NPUStream getCurrentNPUStream(c10::DeviceIndex device = -1);
// Thread-local per device, as torch.cuda.set_stream.
void setCurrentNPUStream(NPUStream stream);
NPUStream getStreamFromPool(bool isHighPriority = false, c10::DeviceIndex device = -1);
// One of the device's sync-launch streams (round robin over 4).
NPUStream getSyncLaunchStream(c10::DeviceIndex device = -1);
// An aclrtStream created outside torch_npu (e.g. torch.npu.npurt().npuStreamCreate) on
// `device`, as a torch stream. The caller keeps it alive while it is used.
NPUStream getStreamFromExternal(aclrtStream stream, c10::DeviceIndex device);
NPUStream getStreamFromPool(int priority, c10::DeviceIndex device);
// Throws a c10::Error carrying aclGetRecentErrMsg() when err != ACL_SUCCESS.
void check_acl(aclError err, const char* what);

}  // namespace torch_npu

#define NPU_CHECK(expr) ::torch_npu::check_acl((expr), #expr)
