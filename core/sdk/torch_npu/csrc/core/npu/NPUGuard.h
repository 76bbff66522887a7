// torch_npu's RAII device and stream guards for C++ extensions (c10_npu::, torch_npu's path
// and names), over c10's inline guards and the npu's registered DeviceGuardImpl.
#pragma once

#include <c10/core/impl/InlineDeviceGuard.h>
#include <c10/core/impl/InlineStreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>

#include "torch_npu/csrc/core/npu/NPUMacros.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace c10_npu {
namespace impl {
// The npu's DeviceGuardImpl (registered by torch_npu), with the device type known
// statically as c10's inline guards need for their index forms.
struct NPUGuardImplRef final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;
  NPUGuardImplRef() : impl_(c10::impl::getDeviceGuardImpl(static_type)) {}
  explicit NPUGuardImplRef(c10::DeviceType type) : impl_(c10::impl::getDeviceGuardImpl(type)) {}

  c10::DeviceType type() const override { return impl_->type(); }
  c10::Device exchangeDevice(c10::Device d) const override { return impl_->exchangeDevice(d); }
  c10::Device getDevice() const override { return impl_->getDevice(); }
  void setDevice(c10::Device d) const override { impl_->setDevice(d); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { impl_->uncheckedSetDevice(d); }
  c10::Stream getStream(c10::Device d) const override { return impl_->getStream(d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return impl_->getDefaultStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return impl_->exchangeStream(s); }
  c10::DeviceIndex deviceCount() const noexcept override { return impl_->deviceCount(); }

 private:
  const c10::impl::DeviceGuardImplInterface* impl_;
};
}  // namespace impl

// Sets the current npu device for its scope and restores the previous one.
struct NPUGuard {
  explicit NPUGuard() = delete;
  explicit NPUGuard(c10::DeviceIndex device_index) : guard_(device_index) {}
  explicit NPUGuard(c10::Device device) : guard_(device) {}
  NPUGuard(const NPUGuard&) = delete;
  NPUGuard& operator=(const NPUGuard&) = delete;
  NPUGuard(NPUGuard&& other) = delete;
  NPUGuard& operator=(NPUGuard&& other) = delete;

  void set_device(c10::Device device) { guard_.set_device(device); }
  void reset_device(c10::Device device) { guard_.reset_device(device); }
  void set_index(c10::DeviceIndex device_index) { guard_.set_index(device_index); }
  c10::Device original_device() const { return guard_.original_device(); }
  c10::Device current_device() const { return guard_.current_device(); }

 private:
  c10::impl::InlineDeviceGuard<impl::NPUGuardImplRef> guard_;
};

// As NPUGuard, or nothing when given no device.
struct OptionalNPUGuard {
  explicit OptionalNPUGuard() : guard_() {}
  explicit OptionalNPUGuard(std::optional<c10::Device> device_opt) : guard_(device_opt) {}
  explicit OptionalNPUGuard(std::optional<c10::DeviceIndex> device_index_opt) : guard_(device_index_opt) {}
  OptionalNPUGuard(const OptionalNPUGuard&) = delete;
  OptionalNPUGuard& operator=(const OptionalNPUGuard&) = delete;
  OptionalNPUGuard(OptionalNPUGuard&& other) = delete;
  OptionalNPUGuard& operator=(OptionalNPUGuard&& other) = delete;

  void set_device(c10::Device device) { guard_.set_device(device); }
  void reset_device(c10::Device device) { guard_.reset_device(device); }
  void set_index(c10::DeviceIndex device_index) { guard_.set_index(device_index); }
  std::optional<c10::Device> original_device() const { return guard_.original_device(); }
  std::optional<c10::Device> current_device() const { return guard_.current_device(); }
  void reset() { guard_.reset(); }

 private:
  c10::impl::InlineOptionalDeviceGuard<impl::NPUGuardImplRef> guard_;
};

// Makes `stream` the current stream of its device, and its device current, for its scope.
struct NPUStreamGuard {
  explicit NPUStreamGuard() = delete;
  explicit NPUStreamGuard(c10::Stream stream) : guard_(stream) {}
  NPUStreamGuard(const NPUStreamGuard&) = delete;
  NPUStreamGuard& operator=(const NPUStreamGuard&) = delete;
  NPUStreamGuard(NPUStreamGuard&& other) = delete;
  NPUStreamGuard& operator=(NPUStreamGuard&& other) = delete;

  void reset_stream(c10::Stream stream) { guard_.reset_stream(stream); }
  NPUStream original_stream() const { return NPUStream(NPUStream::UNCHECKED, guard_.original_stream()); }
  NPUStream current_stream() const { return NPUStream(NPUStream::UNCHECKED, guard_.current_stream()); }
  c10::Device current_device() const { return guard_.current_device(); }
  c10::Device original_device() const { return guard_.original_device(); }

 private:
  c10::impl::InlineStreamGuard<impl::NPUGuardImplRef> guard_;
};

// As NPUStreamGuard, or nothing when given no stream.
struct OptionalNPUStreamGuard {
  explicit OptionalNPUStreamGuard() : guard_() {}
  explicit OptionalNPUStreamGuard(c10::Stream stream) : guard_(stream) {}
  explicit OptionalNPUStreamGuard(std::optional<c10::Stream> stream_opt) : guard_(stream_opt) {}
  OptionalNPUStreamGuard(const OptionalNPUStreamGuard&) = delete;
  OptionalNPUStreamGuard& operator=(const OptionalNPUStreamGuard&) = delete;
  OptionalNPUStreamGuard(OptionalNPUStreamGuard&& other) = delete;
  OptionalNPUStreamGuard& operator=(OptionalNPUStreamGuard&& other) = delete;

  void reset_stream(c10::Stream stream) { guard_.reset_stream(stream); }
  std::optional<NPUStream> original_stream() const {
    auto s = guard_.original_stream();
    return s.has_value() ? std::make_optional(NPUStream(NPUStream::UNCHECKED, *s)) : std::nullopt;
  }
  std::optional<NPUStream> current_stream() const {
    auto s = guard_.current_stream();
    return s.has_value() ? std::make_optional(NPUStream(NPUStream::UNCHECKED, *s)) : std::nullopt;
  }
  void reset() { guard_.reset(); }

 private:
  c10::impl::InlineOptionalStreamGuard<impl::NPUGuardImplRef> guard_;
};

}  // namespace c10_npu
