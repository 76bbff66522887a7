// torch_npu's NPU random generator for C++ extensions (at_npu::NPUGeneratorImpl, torch_npu's
// path and names). Its state is torch_npu's: a seed and a Philox offset (16 bytes), as on
// CUDA and Ascend. Every random kernel takes its numbers from (seed, offset) alone and moves
// the offset on by the numbers it draws (rounded up to a multiple of 4): CPU kernels running
// on NPU memory get a CPU generator whose engine is derived from that pair, Philox kernels
// the pair itself (philox_npu_state, philox_engine_inputs). So a state restores exactly, in
// any process, and DTensor's offset-based RNG tracker can give each shard its own offset.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <memory>
#include <mutex>
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

  // A CPU generator for one random kernel of up to `numbers` values, launched now on this
  // generator's device: outside an NPU graph capture its engine comes from (seed, offset) and
  // the offset moves on; in a capture, each replay gives it the engine of the offset the
  // replay reserved (philox_engine_inputs of the graph's span, see NPUGraph::replay).
  at::Generator draw(uint64_t numbers);

 private:
  NPUGeneratorImpl* clone_impl() const override;
  // Graph-safe state, as CUDA's generator: in an NPU graph capture, a random kernel is given
  // its place in the graph's draws (an offset relative to the replay's start), and each
  // replay reserves the graph's span of offsets when the host enqueues it. get_state() in a
  // capture returns the seed and that relative position, tagged with the capture;
  // set_state() of such a state moves the capture back to it. Seeds may only stay the same.
  struct Capture;
  Capture* capture() const;  // the current capture on this generator's device, or nullptr
  mutable std::mutex state_mutex_;  // seed_, offset_, capture_ (GeneratorImpl::mutex_ is the caller's)
  uint64_t seed_;
  uint64_t offset_ = 0;
  mutable std::shared_ptr<Capture> capture_;  // the last capture seen
  mutable uint32_t captures_ = 0;
};

namespace detail {

// The default generator of npu:device_index (-1: the current device).
TORCH_NPU_API const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device_index = -1);
// A new generator of npu:device_index (-1: the current device), seeded with the default seed.
TORCH_NPU_API at::Generator createNPUGenerator(c10::DeviceIndex device_index = -1);

}  // namespace detail
}  // namespace at_npu
