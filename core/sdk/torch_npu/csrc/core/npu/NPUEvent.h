// torch_npu's NPU events for C++ extensions (c10_npu::NPUEvent, torch_npu's path and names):
// movable, not copyable wrappers of an aclrtEvent. An event is created lazily by its first
// record, on the recording stream's device (later records must use that device), unless it
// is opened from an IPC handle. Default flags: ACL_EVENT_SYNC (no timing); pass
// ACL_EVENT_TIME_LINE for elapsed_time, ACL_EVENT_IPC to share it with other processes.
#pragma once

#include <ATen/Device.h>
#include <c10/util/Optional.h>

#include <cstdint>

#include "torch_npu/csrc/core/npu/NPUMacros.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace c10_npu {

struct C10_NPU_API NPUEvent {
  NPUEvent();
  NPUEvent(unsigned int flags);
  // Opens the event another process shared (ipc_handle) on device_index.
  NPUEvent(c10::DeviceIndex device_index, const aclrtIpcEventHandle* handle);
  ~NPUEvent();

  NPUEvent(const NPUEvent&) = delete;
  NPUEvent& operator=(const NPUEvent&) = delete;
  NPUEvent(NPUEvent&& other);
  NPUEvent& operator=(NPUEvent&& other);

  operator aclrtEvent() const { return event(); }

  c10::optional<at::Device> device() const {
    if (is_created_) return at::Device(c10::DeviceType::PrivateUse1, device_index_);
    return {};
  }
  bool isCreated() const { return is_created_; }
  c10::DeviceIndex device_index() const { return device_index_; }
  aclrtEvent event() const { return event_; }

  // True when the work before the last record has finished (or the event was never recorded).
  bool query() const;
  // Records on the current stream of the current device.
  void record();
  // Records on `stream` the first time only.
  void recordOnce(const NPUStream& stream);
  void record(const NPUStream& stream);
  // Makes `stream` wait for the last record (no wait when the event was never recorded).
  void block(const NPUStream& stream);
  // Milliseconds from this event to `other`, waiting for both (both need ACL_EVENT_TIME_LINE).
  float elapsed_time(const NPUEvent& other) const;
  // Waits on the host for the last record.
  void synchronize() const;
  // A handle another process opens with NPUEvent(device_index, &handle) (ACL_EVENT_IPC only).
  void ipc_handle(aclrtIpcEventHandle* handle);

 private:
  unsigned int flags_;
  bool is_created_ = false;
  bool was_recorded_ = false;
  c10::DeviceIndex device_index_ = -1;
  aclrtEvent event_ = nullptr;

  void createEvent(c10::DeviceIndex device_index);
  void moveHelper(NPUEvent&& other);
};

}  // namespace c10_npu
