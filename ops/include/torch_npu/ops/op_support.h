// Operators without an NPU kernel in this pair (see ops/npu_native_functions.yaml) raise
// "aten::<op> is not supported on NPU (...)" unless the CPU fallback is on: then they run
// on the CPU (arguments copied to the host and results back), with one warning per op.
#pragma once

namespace torch_npu::ops {

// Initially the value of TORCH_NPU_CPU_FALLBACK ("1" turns it on).
bool cpu_fallback_enabled();
void set_cpu_fallback(bool enabled);

}  // namespace torch_npu::ops
