// torch_npu's NPU random generator for C++ extensions (at_npu::NPUGeneratorImpl, torch_npu's
// path and names). It is the generator torch.npu's random functions use: it owns a
// CPUGeneratorImpl and forwards seed and state to it under its mutex, so CPU kernels
// running on NPU memory draw from the NPU generator (torch.npu.manual_seed makes them
// reproducible). Kernels with counter-based (Philox) randomness take (seed, offset) pairs
// instead, as on CUDA and Ascend: the offset advances with each draw (philox_npu_state,
// philox_engine_inputs), is reset by a new seed and is part of the state.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "torch_npu/csrc/core/npu/NPUMacros.h"

namespace at {
class Tensor;
}

namespace at_npu {

// The (seed, offset) a Philox kernel draws from, torch_npu's layout. This runtime hands
// out host values only (captured_ is false): a kernel recorded into an NPU graph takes its
// numbers when a replay runs it (see torch_npu.npu.NPUGraph).
struct PhiloxNpuState {
  PhiloxNpuState() = default;
  PhiloxNpuState(const PhiloxNpuState&) = default;
  PhiloxNpuState(uint64_t seed, uint64_t offset) {
    seed_.val = seed;
    offset_.val = offset;
  }

  union Payload {
    uint64_t val;
    at::Tensor* ptr;
  };
  Payload seed_{};
  Payload offset_{};
  uint64_t offset_intragraph_{0};
  bool captured_ = false;
};

struct TORCH_NPU_API NPUGeneratorImpl : public c10::GeneratorImpl {
  // device_index -1: the current device.
  NPUGeneratorImpl(c10::DeviceIndex device_index = -1);
  ~NPUGeneratorImpl() override = default;

  std::shared_ptr<NPUGeneratorImpl> clone() const;
  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t current_seed() const override;
  uint64_t get_offset() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  // The Philox offset (torch_npu's names for get_offset / set_offset).
  void set_philox_offset_per_thread(uint64_t offset);
  uint64_t philox_offset_per_thread() const;
  // The seed and the current offset, advancing the offset by `increment` (rounded up to a
  // multiple of 4: one Philox call yields four 32-bit numbers).
  PhiloxNpuState philox_npu_state(uint64_t increment);
  std::pair<uint64_t, uint64_t> philox_engine_inputs(uint64_t increment);
  static c10::DeviceType device_type();

  // The CPU generator CPU kernels consume in place of this one.
  const at::Generator& cpu_generator() const { return cpu_; }
  // A random kernel using this generator was recorded into an NPU graph (called at
  // launch, on the host): the graph's position in the generator's sequence moves on.
  void note_captured_draw();

 private:
  NPUGeneratorImpl* clone_impl() const override;
  // Graph-safe state, as CUDA's generator: during an NPU graph capture, nothing runs, so
  // the host cannot read or set the state the graph's kernels will see. get_state()
  // records a task that snapshots the state when a replay reaches that point, and returns
  // the host state tagged with the capture and its position in it; set_state() of such a
  // state records a task restoring the snapshot; any other state, or a seed, may only
  // keep the seed (torch_npu's error otherwise), and is applied by a recorded task.
  struct Capture;
  Capture* capture() const;  // the current capture on this generator's device, or nullptr
  mutable at::Generator cpu_;  // mutable: get_state() const locks its mutex
  uint64_t philox_offset_ = 0;  // guarded by cpu_'s mutex
  mutable std::shared_ptr<Capture> capture_;  // the last capture seen, guarded by cpu_'s mutex
  mutable uint32_t captures_ = 0;
};

namespace detail {

// The default generator of npu:device_index (-1: the current device).
TORCH_NPU_API const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device_index = -1);
// A new generator of npu:device_index (-1: the current device), seeded with the default seed.
TORCH_NPU_API at::Generator createNPUGenerator(c10::DeviceIndex device_index = -1);

}  // namespace detail
}  // namespace at_npu
