// Operators the op table does not serve on this pair (among them every overload torch_npu
// registers no NPU kernel for, see ops/torchnpugen): as in torch_npu, they run on the CPU
// (arguments copied to the host, results back) with one warning per operator on stderr in
// torch_npu's words, unless TORCH_NPU_FALLBACK_CPU_DISABLE=1 (or
// torch.npu.set_cpu_fallback(False)) makes them raise torch_npu's error. The sparse CSR
// sum/prod reductions copy to the CPU explicitly, as torch_npu's do.
// Operators of other namespaces (torchvision::, user libraries) run their CPU kernels on
// NPU memory like supported ATen operators.
#include "torch_npu/ops/op_support.h"

#include <ATen/DeviceGuard.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_sparse_csr_prod.h>
#include <ATen/ops/_sparse_csr_sum.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "op_table.h"
#include "torch_npu/csrc/core/npu/register/OptionsManager.h"

namespace torch_npu::ops {
namespace {

std::atomic<bool>& cpu_fallback_flag() {
  static std::atomic<bool> flag(c10_npu::option::OptionsManager::IsCpuFallbackEnable());
  return flag;
}

std::string overload_name(const c10::OperatorName& op) {
  std::string name = op.name.substr(op.name.find("::") + 2);
  return op.overload_name.empty() ? name : name + "." + op.overload_name;
}

template <typename Entry, typename Value>
const std::unordered_map<std::string, Value>& index(const Entry* entries, Value Entry::*field) {
  static const auto* map = [&] {
    auto* m = new std::unordered_map<std::string, Value>();
    for (const Entry* e = entries; e->op != nullptr; ++e) m->emplace(e->op, e->*field);
    return m;
  }();
  return *map;
}

// Why the table has no NPU kernel for `op` on this pair.
std::string why_unsupported(const c10::OperatorName& op) {
  const auto& notes = index(kUnsupportedOps, &OpNote::why);
  auto it = notes.find(overload_name(op));
  return it != notes.end() ? it->second : "not in the op table (ops/npu_native_functions.yaml)";
}

// torch_npu's TORCH_NPU_WARN: straight to c10's base warning handler (stderr, "Warning: <msg>
// (function <func>)"), not through Python's warnings module.
void warn_npu(const char* func, const std::string& msg) {
  static c10::WarningHandler base;
  base.process(c10::Warning(c10::UserWarning(), {func, __FILE__, static_cast<uint32_t>(__LINE__)}, msg, false));
}

// torch_npu's CheckCpuFallbackAllowed: refuses when TORCH_NPU_FALLBACK_CPU_DISABLE=1.
void check_cpu_fallback_allowed(const std::string& op, const char* kind, const std::string& reason,
                                const std::string& detail) {
  if (cpu_fallback_enabled()) return;
  TORCH_CHECK_NOT_IMPLEMENTED(false, "The operator '", op, "' would execute its main computation on CPU through ",
                              kind, " because ", reason,
                              ", but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1. ", detail,
                              "Unset it (or torch.npu.set_cpu_fallback(True)) to run the operator on the CPU, or "
                              "move its inputs to the CPU yourself. torch.npu.is_op_supported(\"", op,
                              "\") checks an operator ahead of time.");
}

// torch_npu's npu_cpu_fallback: the boxed PrivateUse1 fallback.
void npu_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  if (name.name.rfind("aten::", 0) != 0) {
    zero_copy_kernel(op, stack);
    return;
  }
  const std::string text = c10::toString(name);
  check_cpu_fallback_allowed(text, "dispatcher backend fallback", "no kernel is registered for the NPU PrivateUse1 backend",
                             c10::str(text, " is not supported on NPU (", kPairDescription, "): ", why_unsupported(name), ". "));
  {
    static std::mutex mu;
    static std::unordered_set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(text).second) {
      warn_npu("npu_cpu_fallback", c10::str("CAUTION: The operator '", text,
                                            "' is not currently supported on the NPU backend and will fall back to run "
                                            "on the CPU. This may have performance implications."));
    }
  }
  at::native::cpu_fallback(op, stack);
}

// torch_npu's explicit CPU kernels for two sparse CSR reductions (it has no NPU kernel for
// them): the operand copied to the CPU, the result back, a warning once per operator.
template <at::Tensor (*Reduce)(const at::Tensor&, at::IntArrayRef, bool, std::optional<at::ScalarType>)>
at::Tensor sparse_csr_reduction_on_cpu(const char* op, const char* func, std::once_flag& warned, const at::Tensor& self,
                                       at::IntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  check_cpu_fallback_allowed(op, "explicit CPU kernel",
                             "torch_npu currently provides only a CPU implementation for this Sparse CSR reduction", "");
  std::call_once(warned, [op, func] {
    warn_npu(func, c10::str("CPU fallback is allowed because TORCH_NPU_FALLBACK_CPU_DISABLE=0. Since the NPU "
                                "interface does not support operator '", op, "', the operator will fall back to CPU."));
  });
  const at::OptionalDeviceGuard guard(at::device_of(self));
  return Reduce(self.cpu(), dim, keepdim, dtype).to(self.device());
}

at::Tensor sparse_csr_sum_cpu_fallback(const at::Tensor& self, at::IntArrayRef dim, bool keepdim,
                                       std::optional<at::ScalarType> dtype) {
  static std::once_flag warned;
  return sparse_csr_reduction_on_cpu<&at::_sparse_csr_sum>("aten::_sparse_csr_sum.dim_dtype", __func__, warned, self, dim,
                                                           keepdim, dtype);
}

at::Tensor sparse_csr_prod_cpu_fallback(const at::Tensor& self, at::IntArrayRef dim, bool keepdim,
                                        std::optional<at::ScalarType> dtype) {
  static std::once_flag warned;
  return sparse_csr_reduction_on_cpu<&at::_sparse_csr_prod>("aten::_sparse_csr_prod.dim_dtype", __func__, warned, self, dim,
                                                            keepdim, dtype);
}

}  // namespace

bool cpu_fallback_enabled() { return cpu_fallback_flag().load(std::memory_order_relaxed); }
void set_cpu_fallback(bool enabled) { cpu_fallback_flag().store(enabled, std::memory_order_relaxed); }

uint64_t allowed_dtypes(const c10::OperatorName& op) {
  const auto& restricted = index(kRestrictedDtypes, &OpDtypes::dtypes);
  if (restricted.empty()) return kAnyDtype;
  auto it = restricted.find(overload_name(op));
  return it != restricted.end() ? it->second : kAnyDtype;
}

}  // namespace torch_npu::ops

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::npu_cpu_fallback>());
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("_sparse_csr_sum.dim_dtype", TORCH_FN(torch_npu::ops::sparse_csr_sum_cpu_fallback));
  m.impl("_sparse_csr_prod.dim_dtype", TORCH_FN(torch_npu::ops::sparse_csr_prod_cpu_fallback));
}
