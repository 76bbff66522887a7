// Operators without an NPU kernel in this pair (see ops/npu_native_functions.yaml) run on
// the CPU (arguments copied to the host and results back), with one warning per op, unless
// the CPU fallback is off: then they raise "aten::<op> is not supported on NPU (...)".
#pragma once

namespace torch_npu::ops {

// On unless TORCH_NPU_FALLBACK_CPU_DISABLE is "1" (read once), as in torch_npu.
bool cpu_fallback_enabled();
void set_cpu_fallback(bool enabled);

}  // namespace torch_npu::ops
