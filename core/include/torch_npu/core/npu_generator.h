// Per-device NPU random generator. It owns a CPUGeneratorImpl and forwards seed and
// state to it under its mutex, so that CPU kernels running on NPU memory draw from
// the NPU generator (torch.npu.manual_seed makes them reproducible). Fused kernels with
// counter-based (Philox) randomness take (seed, offset) pairs instead, as on CUDA and
// Ascend: the offset advances with each draw, is reset by a new seed and is part of
// the state.
#pragma once

#include <ATen/core/Generator.h>

#include <utility>

namespace torch_npu {

struct NPUGeneratorImpl : public c10::GeneratorImpl {
  explicit NPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The CPU generator CPU kernels consume in place of this one.
  const at::Generator& cpu_generator() const { return cpu_; }

  // The seed and the current Philox offset, advancing the offset by `increment`
  // (rounded up to a multiple of 4: one Philox call yields four 32-bit numbers).
  std::pair<uint64_t, uint64_t> philox_seed_and_offset(uint64_t increment);

 private:
  NPUGeneratorImpl* clone_impl() const override;
  mutable at::Generator cpu_;  // mutable: get_state() const locks its mutex
  uint64_t philox_offset_ = 0;  // guarded by cpu_'s mutex
};

const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device = -1);
at::Generator createNPUGenerator(c10::DeviceIndex device = -1);
// The CPU generator standing in for `gen` (an npu generator) or, when gen is empty,
// for the default generator of `device`.
at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace torch_npu
