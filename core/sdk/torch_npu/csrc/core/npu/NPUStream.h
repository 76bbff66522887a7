// torch_npu's NPU streams for C++ extensions (c10_npu::NPUStream, torch_npu's path and
// names): a c10::Stream of the npu device whose id names an ACL stream of the simulator.
// Id 0 of a device is its default stream; the pool is a lazily created round robin per
// device, as CUDA's. stream() is the aclrtStream to pass to AscendCL (acl_rt.h).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <ostream>

#include "torch_npu/csrc/core/npu/NPUMacros.h"
#if __has_include("third_party/acl/inc/acl/acl_rt.h")
#include "third_party/acl/inc/acl/acl_rt.h"
#else
#include <acl/acl_rt.h>
#endif

namespace c10_npu {

class C10_NPU_API NPUStream {
 public:
  enum Unchecked { UNCHECKED };

  // Checks that `stream` is an npu stream.
  explicit NPUStream(c10::Stream stream);
  explicit NPUStream(Unchecked, c10::Stream stream) : stream_(stream) {}
  ~NPUStream() {}

  bool operator==(const NPUStream& other) const noexcept { return unwrap() == other.unwrap(); }
  bool operator!=(const NPUStream& other) const noexcept { return unwrap() != other.unwrap(); }

  operator aclrtStream() const { return stream(); }
  operator c10::Stream() const { return unwrap(); }

  c10::DeviceType device_type() const { return c10::DeviceType::PrivateUse1; }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::Device device() const { return c10::Device(c10::DeviceType::PrivateUse1, device_index()); }
  c10::StreamId id() const { return stream_.id(); }

  // True when the work queued on the stream so far has finished.
  bool query() const;
  // Waits for the stream's work; a kernel's failure is raised here as c10::Error.
  void synchronize() const;
  // The simulator's ACL stream (the default stream resolved to its handle).
  aclrtStream stream() const;
  // need_empty: torch_npu drains its task queue first; this runtime's queue is the
  // stream itself, so the handle is the same either way.
  aclrtStream stream(const bool need_empty) const;
  c10::Stream unwrap() const { return stream_; }

  struct c10::StreamData3 pack3() const { return stream_.pack3(); }
  static NPUStream unpack3(c10::StreamId stream_id, c10::DeviceIndex device_index, c10::DeviceType device_type) {
    return NPUStream(c10::Stream::unpack3(stream_id, device_index, device_type));
  }

  // A stream marked as a data-preprocessing stream (torch_npu's DataLoader pin-memory
  // thread uses one); a flag kept per stream.
  void setDataPreprocessStream(bool is_data_preprocess_stream);
  bool isDataPreprocessStream();
  // A sync-launch stream runs its kernels on the calling thread, in stream order.
  bool isSyncLaunchStream() const;

 private:
  c10::Stream stream_;
};

// A stream of the device's pool (round robin), low priority.
C10_NPU_API NPUStream getNPUStreamFromPool(c10::DeviceIndex device = -1);
C10_NPU_API NPUStream getStreamFromPool(const bool isHighPriority, c10::DeviceIndex device_index);
C10_NPU_API NPUStream getDefaultNPUStream(c10::DeviceIndex device_index = -1);
// The thread's current stream of the device (-1: the current device).
C10_NPU_API NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1);
// An aclrtStream created outside torch_npu, on `device_index`, as a torch stream; the
// caller keeps it alive while it is used.
C10_NPU_API NPUStream getStreamFromExternal(aclrtStream stream, c10::DeviceIndex device_index);
// One of the device's sync-launch streams.
C10_NPU_API NPUStream getNPUStreamFromSyncLaunchPool(c10::DeviceIndex device_index = -1);
C10_NPU_API void setCurrentNPUStream(NPUStream stream);
// Waits for every stream of the current device (torch.npu.synchronize()); returns true
// when no kernel failed, and raises the failure when check_error is true.
C10_NPU_API bool npuSynchronizeDevice(bool check_error = true);

C10_NPU_API std::ostream& operator<<(std::ostream& stream, const NPUStream& s);

}  // namespace c10_npu

namespace std {
template <>
struct hash<c10_npu::NPUStream> {
  size_t operator()(c10_npu::NPUStream s) const noexcept { return std::hash<c10::Stream>{}(s.unwrap()); }
};
}  // namespace std
