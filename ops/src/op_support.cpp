// Operators the op table does not serve on this pair: as in torch_npu, they run on the
// CPU (arguments copied to the host, results back) with one warning per operator, unless
// TORCH_NPU_FALLBACK_CPU_DISABLE=1 (or torch.npu.set_cpu_fallback(False)) makes them raise.
// Operators of other namespaces (torchvision::, user libraries) run their CPU kernels on
// NPU memory like supported ATen operators.
#include "torch_npu/ops/op_support.h"

#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "op_table.h"

namespace torch_npu::ops {
namespace {

std::atomic<bool>& cpu_fallback_flag() {
  static std::atomic<bool> flag([] {
    const char* v = std::getenv("TORCH_NPU_FALLBACK_CPU_DISABLE");
    return v == nullptr || std::strcmp(v, "1") != 0;
  }());
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

void unlisted_operator(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  if (name.name.rfind("aten::", 0) != 0) {
    zero_copy_kernel(op, stack);
    return;
  }
  if (!cpu_fallback_enabled()) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, name, " is not supported on NPU (", kPairDescription, "): ",
                                why_unsupported(name), ". The operator '", name,
                                "' would execute its main computation on CPU through dispatcher backend fallback, "
                                "but CPU fallback is disabled by TORCH_NPU_FALLBACK_CPU_DISABLE=1 (or "
                                "torch.npu.set_cpu_fallback(False)); unset it to run the operator on the CPU, or "
                                "move its inputs to the CPU yourself. torch.npu.is_op_supported(\"",
                                name, "\") checks an operator ahead of time.");
  }
  {
    static std::mutex mu;
    static std::unordered_set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(c10::toString(name)).second) {
      TORCH_WARN("CAUTION: The operator '", name, "' is not currently supported on the NPU backend and will fall ",
                 "back to run on the CPU. This may have performance implications.");
    }
  }
  at::native::cpu_fallback(op, stack);
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
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::unlisted_operator>());
}
