// The runtime's side of the NPU generator (the class is torch_npu's public
// at_npu::NPUGeneratorImpl, core/sdk/torch_npu/csrc/aten/NPUGeneratorImpl.h): default
// generators per device, and the draw order of NPU graphs with random kernels.
#pragma once

#include <ATen/core/Generator.h>
#include "torch_npu/csrc/aten/NPUGeneratorImpl.h"
#include <acl/acl_rt.h>

#include <functional>

#include <memory>
#include <utility>

namespace torch_npu {

class NPUStream;

using at_npu::NPUGeneratorImpl;

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
