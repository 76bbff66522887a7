#include "torch_npu/core/npu_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/util/CallOnce.h>

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
}

uint64_t NPUGeneratorImpl::current_seed() const { return cpu_.current_seed(); }

uint64_t NPUGeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.seed();
}

void NPUGeneratorImpl::set_offset(uint64_t) {
  TORCH_CHECK(false, "set_offset is not supported by the npu generator (it is Mersenne-Twister based "
              "in the simulator); use set_state/get_state");
}

uint64_t NPUGeneratorImpl::get_offset() const {
  TORCH_CHECK(false, "get_offset is not supported by the npu generator; use get_state");
}

void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.unsafeGetGeneratorImpl()->get_state();
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* gen = new NPUGeneratorImpl(device().index());
  gen->cpu_ = cpu_.clone();
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
