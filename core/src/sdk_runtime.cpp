// torch_npu's C++ API for extensions (core/sdk/torch_npu/csrc/...: NPUStream.h, NPUEvent.h,
// NPUFunctions.h, NPUException.h, NPUHooksInterface.h, libs/init_npu.h) over this runtime.
#include "torch_npu/csrc/core/npu/NPUEvent.h"
#include "torch_npu/csrc/core/npu/NPUException.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUHooksInterface.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/libs/init_npu.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_error.h"
#include "torch_npu/core/npu_generator.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/core/npu_trace.h"

namespace c10_npu {

namespace impl = torch_npu;

namespace {
impl::NPUStream internal(const NPUStream& s) { return impl::NPUStream(s.unwrap()); }
NPUStream external(const impl::NPUStream& s) { return NPUStream(NPUStream::UNCHECKED, s.unwrap()); }

std::mutex g_preprocess_mu;
std::unordered_set<c10::Stream>& preprocess_streams() {
  static std::unordered_set<c10::Stream> streams;
  return streams;
}
}  // namespace

// ---- streams ----

NPUStream::NPUStream(c10::Stream stream) : stream_(stream) { impl::NPUStream checked(stream); }

bool NPUStream::query() const { return internal(*this).query(); }
void NPUStream::synchronize() const {
  warn_or_error_on_sync();
  internal(*this).synchronize();
}
aclrtStream NPUStream::stream() const { return internal(*this).stream(); }
aclrtStream NPUStream::stream(const bool /*need_empty*/) const { return stream(); }
bool NPUStream::isSyncLaunchStream() const { return internal(*this).is_sync_launch(); }

void NPUStream::setDataPreprocessStream(bool is_data_preprocess_stream) {
  std::lock_guard<std::mutex> lock(g_preprocess_mu);
  if (is_data_preprocess_stream) {
    preprocess_streams().insert(stream_);
  } else {
    preprocess_streams().erase(stream_);
  }
}

bool NPUStream::isDataPreprocessStream() {
  std::lock_guard<std::mutex> lock(g_preprocess_mu);
  return preprocess_streams().count(stream_) > 0;
}

NPUStream getNPUStreamFromPool(c10::DeviceIndex device) { return external(impl::getStreamFromPool(false, device)); }
NPUStream getStreamFromPool(const bool isHighPriority, c10::DeviceIndex device_index) {
  return external(impl::getStreamFromPool(isHighPriority, device_index));
}
NPUStream getDefaultNPUStream(c10::DeviceIndex device_index) { return external(impl::getDefaultNPUStream(device_index)); }
NPUStream getCurrentNPUStream(c10::DeviceIndex device_index) { return external(impl::getCurrentNPUStream(device_index)); }
NPUStream getStreamFromExternal(aclrtStream stream, c10::DeviceIndex device_index) {
  return external(impl::getStreamFromExternal(stream, device_index));
}
NPUStream getNPUStreamFromSyncLaunchPool(c10::DeviceIndex device_index) {
  return external(impl::getSyncLaunchStream(device_index));
}
void setCurrentNPUStream(NPUStream stream) { impl::setCurrentNPUStream(internal(stream)); }

bool npuSynchronizeDevice(bool check_error) {
  try {
    impl::synchronize_device(impl::current_device());
  } catch (const c10::Error&) {
    if (check_error) throw;
    return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& stream, const NPUStream& s) { return stream << s.unwrap(); }

// ---- devices ----

c10::DeviceIndex device_count() noexcept {
  try {
    return impl::device_count();
  } catch (...) {
    return 0;
  }
}

c10::DeviceIndex device_count_ensure_non_zero() {
  const c10::DeviceIndex n = impl::device_count();
  TORCH_CHECK(n > 0, "No NPUs are available (ASCEND_SIM_DEVICE_COUNT, ASCEND_RT_VISIBLE_DEVICES)",
              impl::pta_error(impl::ErrCode::UNAVAIL));
  return n;
}

aclError GetDevice(int32_t* device) { return aclrtGetDevice(device); }

aclError SetDevice(c10::DeviceIndex device) {
  if (device < 0 || device >= device_count()) return ACL_ERROR_RT_INVALID_DEVICEID;
  return aclrtSetDevice(device);
}

c10::DeviceIndex current_device() { return impl::current_device(); }
void set_device(c10::DeviceIndex device) { impl::set_device(device); }
void device_synchronize() { impl::synchronize_device(impl::current_device()); }

int ExchangeDevice(int device) {
  const int previous = impl::current_device();
  if (device != previous) impl::set_device(static_cast<c10::DeviceIndex>(device));
  return previous;
}

namespace {
std::atomic<int> g_sync_debug_mode{static_cast<int>(SyncDebugMode::L_DISABLED)};
}

void WarningState::set_sync_debug_mode(SyncDebugMode level) { g_sync_debug_mode.store(static_cast<int>(level)); }
SyncDebugMode WarningState::get_sync_debug_mode() { return static_cast<SyncDebugMode>(g_sync_debug_mode.load()); }

WarningState& warning_state() {
  static WarningState state;
  return state;
}

void warn_or_error_on_sync() {
  const SyncDebugMode mode = warning_state().get_sync_debug_mode();
  TORCH_CHECK(mode != SyncDebugMode::L_ERROR, "called a synchronizing NPU operation",
              impl::pta_error(impl::ErrCode::ACL));
  if (mode == SyncDebugMode::L_WARN) TORCH_WARN("called a synchronizing NPU operation");
}

void stream_synchronize(aclrtStream stream) {
  warn_or_error_on_sync();
  NPU_CHECK_ERROR(aclrtSynchronizeStream(stream));
  impl::trace::emit(impl::trace::Kind::StreamSynchronization, stream);
}

// ---- errors ----

const char* c10_npu_get_error_message() {
  const char* msg = aclGetRecentErrMsg();
  return msg ? msg : "";
}

void raise_acl_error(aclError err, const char* expr, const char* file, int line) {
  const char* msg = aclGetRecentErrMsg();
  TORCH_CHECK_WITH(OutOfMemoryError, err != ACL_ERROR_RT_MEMORY_ALLOCATION, (msg && *msg) ? msg : "",
                   " [ACL error ", err, " from ", expr, " at ", file, ":", line, "]",
                   impl::pta_error(impl::ErrCode::ACL));
  TORCH_CHECK(false, (msg && *msg) ? msg : "", " [ACL error ", err, " from ", expr, " at ", file, ":", line, "]",
              impl::pta_error(impl::ErrCode::ACL));
}

// ---- events ----

NPUEvent::NPUEvent() : flags_(ACL_EVENT_SYNC) {}
NPUEvent::NPUEvent(unsigned int flags) : flags_(flags) {}

NPUEvent::NPUEvent(c10::DeviceIndex device_index, const aclrtIpcEventHandle* handle) : flags_(ACL_EVENT_IPC) {
  TORCH_CHECK(handle != nullptr, "NPUEvent: argument 'handle' must not be null", impl::pta_error(impl::ErrCode::PARAM));
  device_index_ = device_index;
  impl::check_device_index(device_index);
  NPU_CHECK_ERROR(aclrtIpcOpenEventHandle(*handle, &event_));
  is_created_ = true;
  impl::trace::emit(impl::trace::Kind::EventCreation, event_);
}

NPUEvent::~NPUEvent() {
  if (is_created_) {
    impl::trace::emit(impl::trace::Kind::EventDeletion, event_);
    aclrtDestroyEvent(event_);
  }
}

NPUEvent::NPUEvent(NPUEvent&& other) : flags_(other.flags_) { moveHelper(std::move(other)); }

NPUEvent& NPUEvent::operator=(NPUEvent&& other) {
  if (this != &other) moveHelper(std::move(other));
  return *this;
}

void NPUEvent::moveHelper(NPUEvent&& other) {
  std::swap(flags_, other.flags_);
  std::swap(is_created_, other.is_created_);
  std::swap(was_recorded_, other.was_recorded_);
  std::swap(device_index_, other.device_index_);
  std::swap(event_, other.event_);
}

void NPUEvent::createEvent(c10::DeviceIndex device_index) {
  device_index_ = device_index;
  NPU_CHECK_ERROR(aclrtCreateEventWithFlag(&event_, flags_));
  is_created_ = true;
  impl::trace::emit(impl::trace::Kind::EventCreation, event_);
}

bool NPUEvent::query() const {
  if (!is_created_) return true;
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  NPU_CHECK_ERROR(aclrtQueryEventStatus(event_, &status));
  return status == ACL_EVENT_RECORDED_STATUS_COMPLETE;
}

void NPUEvent::record() { record(getCurrentNPUStream()); }

void NPUEvent::recordOnce(const NPUStream& stream) {
  if (!was_recorded_) record(stream);
}

void NPUEvent::record(const NPUStream& stream) {
  if (!is_created_) createEvent(stream.device_index());
  TORCH_CHECK(device_index_ == stream.device_index(), "Event device ", static_cast<int>(device_index_),
              " does not match recording stream's device ", static_cast<int>(stream.device_index()), ".",
              impl::pta_error(impl::ErrCode::PARAM));
  NPU_CHECK_ERROR(aclrtRecordEvent(event_, stream.stream()));
  impl::trace::emit(impl::trace::Kind::EventRecord, event_, stream.stream());
  was_recorded_ = true;
}

void NPUEvent::block(const NPUStream& stream) {
  if (!is_created_) return;
  NPU_CHECK_ERROR(aclrtStreamWaitEvent(stream.stream(), event_));
  impl::trace::emit(impl::trace::Kind::EventWait, event_, stream.stream());
}

float NPUEvent::elapsed_time(const NPUEvent& other) const {
  TORCH_CHECK(is_created_ && other.isCreated(), "Both events must be recorded before calculating elapsed time.",
              impl::pta_error(impl::ErrCode::INTERNAL));
  NPU_CHECK_ERROR(impl::wait_event(event_));
  NPU_CHECK_ERROR(impl::wait_event(other.event_));
  float time_ms = 0;
  NPU_CHECK_ERROR(aclrtEventElapsedTime(&time_ms, event_, other.event_));
  return time_ms;
}

void NPUEvent::synchronize() const {
  if (!is_created_) return;
  NPU_CHECK_ERROR(impl::wait_event(event_));
  impl::trace::emit(impl::trace::Kind::EventSynchronization, event_);
}

void NPUEvent::ipc_handle(aclrtIpcEventHandle* handle) {
  TORCH_CHECK(handle != nullptr, "ipc_handle: argument 'handle' must not be null", impl::pta_error(impl::ErrCode::PARAM));
  if (!is_created_) createEvent(impl::current_device());
  NPU_CHECK_ERROR(aclrtIpcGetEventHandle(event_, handle));
}

// ---- hooks ----

const at::Generator& NPUHooksInterface::getDefaultGenerator(c10::DeviceIndex device_index) {
  return impl::getDefaultNPUGenerator(device_index);
}

}  // namespace c10_npu

// ---- libtorch programs ----

namespace torch_npu {

void init_npu(const c10::DeviceIndex device_index) {
  // Initialising twice is harmless (import torch_npu, or an earlier init_npu, did it).
  const aclError err = aclInit(nullptr);
  if (err != ACL_ERROR_REPEAT_INITIALIZE) NPU_CHECK_ERROR(err);
  set_device(device_index);
}

void init_npu(const std::string& device_str) { init_npu(c10::Device(device_str)); }

void init_npu(const at::Device& device) {
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "init_npu: expected an npu device, got ", device,
              pta_error(ErrCode::PARAM));
  init_npu(device.has_index() ? device.index() : c10::DeviceIndex(0));
}

void finalize_npu() {
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) synchronize_device(d);
  NPUCachingAllocator::emptyCache();
}

}  // namespace torch_npu

namespace torch::npu {
void synchronize(int64_t device_index) {
  torch_npu::synchronize_device(device_index < 0 ? torch_npu::current_device() : static_cast<c10::DeviceIndex>(device_index));
}
}  // namespace torch::npu

namespace c10::npu {
DeviceIndex current_device() { return torch_npu::current_device(); }
}  // namespace c10::npu
