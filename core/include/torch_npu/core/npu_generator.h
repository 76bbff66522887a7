// The runtime's side of the NPU generator (the class is torch_npu's public
// at_npu::NPUGeneratorImpl, core/sdk/torch_npu/csrc/aten/NPUGeneratorImpl.h): default
// generators per device, the CPU generators random kernels draw from, and the offsets of
// NPU graphs with random kernels.
#pragma once

#include <ATen/core/Generator.h>
#include "torch_npu/csrc/aten/NPUGeneratorImpl.h"
#include <acl/acl_rt.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

namespace torch_npu {

class NPUStream;

using at_npu::NPUGeneratorImpl;

// A replay of `model` (enqueued now on `stream`): each generator its random kernels draw
// from reserves the graph's span of offsets, and a task before the graph gives the kernels'
// CPU generators the engines of their offsets in it (as CUDA graphs' Philox offsets).
void replay_random_draws(aclmdlRI model, const NPUStream& stream);
// A capture into `model` begins (its address may be a destroyed model's), or the model goes.
void begin_random_capture(aclmdlRI model);
void forget_captured_model(aclmdlRI model);

const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device = -1);
at::Generator createNPUGenerator(c10::DeviceIndex device = -1);
// The CPU generator a random kernel of up to `numbers` values draws from, for `gen` (an npu
// generator) or, when gen is empty, the default generator of `device` (see NPUGeneratorImpl::draw).
at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t numbers);

}  // namespace torch_npu
