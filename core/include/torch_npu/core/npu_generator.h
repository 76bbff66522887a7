// Per-device NPU random generator. It owns a CPUGeneratorImpl and forwards seed and
// state to it under its mutex, so that CPU kernels running on NPU memory draw from
// the NPU generator (torch.npu.manual_seed makes them reproducible). Fused kernels with
// counter-based (Philox) randomness take (seed, offset) pairs instead, as on CUDA and
// Ascend: the offset advances with each draw, is reset by a new seed and is part of
// the state.
#pragma once

#include <ATen/core/Generator.h>
#include <acl/acl_rt.h>

#include <functional>

#include <memory>
#include <utility>

namespace torch_npu {

class NPUStream;

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

// NPU graphs with random kernels draw from their generators when a replay runs, not
// when it is enqueued. For the numbers CUDA's graph-safe generators give (drawn in the
// order of the host's replay and eager calls, whatever the streams), such replays run one
// after the other (replay_in_draw_order), and a kernel launched outside a capture waits
// for the replays enqueued before it (cpu_generator_for).
bool captured_random_draws(aclmdlRI model);
void forget_captured_model(aclmdlRI model);
void replay_in_draw_order(const NPUStream& stream, const std::function<void()>& enqueue);

const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device = -1);
at::Generator createNPUGenerator(c10::DeviceIndex device = -1);
// The CPU generator standing in for `gen` (an npu generator) or, when gen is empty,
// for the default generator of `device`, for a kernel being launched.
at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace torch_npu
