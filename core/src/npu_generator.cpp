#include "torch_npu/core/npu_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/CallOnce.h>

#include <cstring>

#include <deque>
#include <mutex>
#include <random>

#include "torch_npu/core/npu_stream.h"

namespace torch_npu {

NPUGeneratorImpl::NPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void NPUGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.set_current_seed(seed);
  philox_offset_ = 0;
}

uint64_t NPUGeneratorImpl::current_seed() const { return cpu_.current_seed(); }

uint64_t NPUGeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  philox_offset_ = 0;
  return cpu_.seed();
}

void NPUGeneratorImpl::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  philox_offset_ = offset;
}

uint64_t NPUGeneratorImpl::get_offset() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return philox_offset_;
}

std::pair<uint64_t, uint64_t> NPUGeneratorImpl::philox_seed_and_offset(uint64_t increment) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  const uint64_t offset = philox_offset_;
  philox_offset_ += (increment + 3) / 4 * 4;
  return {cpu_.current_seed(), offset};
}

// The state is the CPU generator's state followed by the 8-byte Philox offset; a state
// without the offset (an older torch_npu's) sets it to 0.
void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  const auto cpu_size = static_cast<int64_t>(cpu_.unsafeGetGeneratorImpl()->get_state()->numel());
  const int64_t size = new_state.numel();
  TORCH_CHECK(size == cpu_size || size == cpu_size + 8, "set_rng_state: expected an npu generator state of ",
              cpu_size + 8, " bytes (from get_rng_state()), got ", size);
  at::Tensor state = at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(
      const_cast<c10::TensorImpl*>(&new_state)));
  cpu_.unsafeGetGeneratorImpl()->set_state(*state.narrow(0, 0, cpu_size).contiguous().unsafeGetTensorImpl());
  uint64_t offset = 0;
  if (size == cpu_size + 8) std::memcpy(&offset, state.const_data_ptr<uint8_t>() + cpu_size, sizeof offset);
  philox_offset_ = offset;
}

c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  at::Tensor cpu_state(cpu_.unsafeGetGeneratorImpl()->get_state());
  at::Tensor state = at::empty({cpu_state.numel() + 8}, cpu_state.options());
  std::memcpy(state.mutable_data_ptr<uint8_t>(), cpu_state.const_data_ptr<uint8_t>(), cpu_state.numel());
  std::memcpy(state.mutable_data_ptr<uint8_t>() + cpu_state.numel(), &philox_offset_, sizeof philox_offset_);
  return state.getIntrusivePtr();
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* gen = new NPUGeneratorImpl(device().index());
  gen->cpu_ = cpu_.clone();
  gen->philox_offset_ = philox_offset_;
  return gen;
}

const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::deque<at::Generator> defaults;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      defaults.emplace_back(at::make_generator<NPUGeneratorImpl>(i));
    }
  });
  if (device < 0) device = current_device();
  check_device_index(device);
  return defaults[device];
}

at::Generator createNPUGenerator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<NPUGeneratorImpl>(device);
}

at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  if (gen.has_value() && gen->defined()) {
    TORCH_CHECK(gen->device().type() == c10::DeviceType::PrivateUse1,
                "Expected a 'npu' device type for generator but found '", gen->device().type(), "'");
    return gen->get<NPUGeneratorImpl>()->cpu_generator();
  }
  return getDefaultNPUGenerator(device).get<NPUGeneratorImpl>()->cpu_generator();
}

}  // namespace torch_npu
