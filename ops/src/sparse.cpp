// Sparse layouts on npu, as PyTorch's CUDA backend has them: COO tensors (dispatch key
// SparsePrivateUse1) and compressed ones, CSR/CSC/BSR/BSC (SparseCsrPrivateUse1). Their
// member tensors (indices and values; compressed and plain indices and values) are
// ordinary strided npu tensors.
//
// An operator on sparse npu tensors runs PyTorch's sparse CPU kernel zero-copy: each
// argument becomes a CPU tensor of the same layout whose members are CPU aliases of the
// npu members (ops/include/torch_npu/ops/zero_copy.h), the SparseCPU / SparseCsrCPU kernel
// runs under a KernelScope (so the members it allocates are NPU memory), and results map
// back member by member: views of an argument's members stay views, fresh buffers are
// adopted. Arguments the kernel writes (in-place, out=) get their new members. Which
// operators take this path is the `sparse:` section of ops/npu_native_functions.yaml (the
// generated registrations call sparse_zero_copy_kernel); the dense operators that make a
// sparse tensor from strided ones (_to_sparse*, _embedding_bag_backward), copy_ and the
// metadata accessors are registered here.
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "torch_npu/core/npu_stream.h"
#include "torch_npu/ops/zero_copy.h"

#include "op_table.h"

namespace torch_npu::ops {

// Generated from the table's `sparse:` section: why a sparse overload has no npu kernel.
extern const OpNote kUnsupportedSparseOps[];

namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

bool is_npu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }
bool is_compressed(const at::Tensor& t) {
  const auto l = t.layout();
  return l == at::kSparseCsr || l == at::kSparseCsc || l == at::kSparseBsr || l == at::kSparseBsc;
}

at::SparseTensorImpl* coo_impl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}
at::SparseCsrTensorImpl* compressed_impl(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

// A COO tensor of `key` (SparseCPU, SparsePrivateUse1) over the given members.
at::Tensor make_coo(c10::DispatchKey key, const at::Tensor& like, const at::Tensor& indices, const at::Tensor& values) {
  // The constructor allocates empty members on the current device: make it the members'.
  c10::OptionalDeviceGuard guard(key == c10::DispatchKey::SparseCPU ? std::nullopt
                                                                      : std::optional<c10::Device>(values.device()));
  auto impl = c10::make_intrusive<at::SparseTensorImpl>(c10::DispatchKeySet(key), like.dtype());
  // The impl's accessors, not Tensor methods: those would dispatch (to this file's kernel).
  const auto* src = coo_impl(like);
  impl->raw_resize_(src->sparse_dim(), src->dense_dim(), like.sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(src->coalesced());
  return at::Tensor(std::move(impl));
}

// A compressed tensor (CSR, CSC, BSR, BSC) of `key` over the given members.
at::Tensor make_compressed(c10::DispatchKey key, const at::Tensor& like, const at::Tensor& compressed,
                           const at::Tensor& plain, const at::Tensor& values) {
  auto impl = c10::make_intrusive<at::SparseCsrTensorImpl>(c10::DispatchKeySet(key), values.device(), like.layout(),
                                                           like.dtype());
  impl->set_member_tensors(compressed, plain, values, like.sizes());
  return at::Tensor(std::move(impl));
}

// The member tensors of a sparse tensor, in the order make_coo / make_compressed take them.
std::vector<at::Tensor> members(const at::Tensor& t) {
  if (t.layout() == at::kSparse) return {coo_impl(t)->indices(), coo_impl(t)->values()};
  auto* impl = compressed_impl(t);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

at::Tensor rebuild(c10::DispatchKey key, const at::Tensor& like, const std::vector<at::Tensor>& m) {
  return like.layout() == at::kSparse ? make_coo(key, like, m[0], m[1]) : make_compressed(key, like, m[0], m[1], m[2]);
}

bool is_sparse_layout(const at::Tensor& t) { return t.defined() && (t.layout() == at::kSparse || is_compressed(t)); }

// One sparse npu argument and the CPU tensor standing for it.
struct SparseArg {
  at::Tensor npu;
  at::Tensor cpu;
  std::vector<at::Tensor> cpu_members;  // as given to the kernel
  bool written;
};

// Converts the npu tensors of one call to CPU ones over the same memory and maps the
// kernel's results back.
class SparseCall {
 public:
  explicit SparseCall(c10::DeviceIndex device) : aliases_(device) {}

  at::Tensor to_cpu(const at::Tensor& t, bool is_written) {
    if (!is_npu(t)) return t;
    if (!is_sparse_layout(t)) {
      at::Tensor a = aliases_.alias(t);
      if (is_written) written_.emplace_back(a, t.storage(), t);
      return a;
    }
    SparseArg arg{t, at::Tensor(), {}, is_written};
    for (const at::Tensor& m : members(t)) {
      at::Tensor a = aliases_.alias(m);
      // A kernel may resize a member of a written argument in place (a new buffer).
      if (is_written) written_.emplace_back(a, m.storage(), m);
      arg.cpu_members.push_back(a);
    }
    const bool coo = t.layout() == at::kSparse;
    arg.cpu = rebuild(coo ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparseCsrCPU, t, arg.cpu_members);
    mirror_requires_grad(t, arg.cpu);
    sparse_.push_back(arg);
    return arg.cpu;
  }

  // After the kernel: written arguments get what the kernel left in their CPU stand-ins.
  void sync_written() {
    for (const auto& w : written_) aliases_.sync_back(w);
    for (const SparseArg& a : sparse_) {
      if (!a.written) continue;
      std::vector<at::Tensor> now = members(a.cpu);
      const bool coo = a.npu.layout() == at::kSparse;
      bool same = a.cpu.sizes() == a.npu.sizes() &&
                  (!coo || coo_impl(a.cpu)->coalesced() == coo_impl(a.npu)->coalesced());
      for (size_t i = 0; same && i < now.size(); ++i) {
        same = now[i].unsafeGetTensorImpl() == a.cpu_members[i].unsafeGetTensorImpl() &&
               now[i].sizes() == a.cpu_members[i].sizes() && now[i].strides() == a.cpu_members[i].strides();
      }
      if (same) continue;  // the kernel wrote the members' bytes only: they are the npu bytes
      std::vector<at::Tensor> npu_members;
      for (const at::Tensor& m : now) npu_members.push_back(aliases_.to_npu(m));
      at::Tensor target = a.npu;
      if (coo) {
        auto* impl = coo_impl(target);
        const auto* src = coo_impl(a.cpu);
        impl->raw_resize_(src->sparse_dim(), src->dense_dim(), a.cpu.sizes());
        impl->set_indices_and_values_unsafe(npu_members[0], npu_members[1]);
        impl->set_coalesced(src->coalesced());
      } else {
        compressed_impl(target)->set_member_tensors(npu_members[0], npu_members[1], npu_members[2], a.cpu.sizes());
      }
    }
  }

  // The npu tensor for a result of the kernel.
  at::Tensor to_npu(const at::Tensor& cpu) {
    if (!cpu.defined() || cpu.device().type() == kNPU) return cpu;
    for (const SparseArg& a : sparse_) {
      if (a.cpu.unsafeGetTensorImpl() == cpu.unsafeGetTensorImpl()) return a.npu;  // the argument itself
    }
    return aliases_.to_npu(cpu);
  }

 private:
  AliasMap aliases_;
  std::vector<WrittenArg> written_;
  std::vector<SparseArg> sparse_;
};

// The npu device of a call; rejects tensors of two devices (CPU ones but Python numbers).
c10::DeviceIndex call_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t begin,
                             int64_t* max_numel) {
  c10::DeviceIndex device = -1;
  std::optional<c10::Device> other;
  auto scan = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == kNPU) {
      if (device < 0) device = t.device().index();
      if (t.device().index() != device) other = t.device();
      int64_t n = 0;
      if (is_sparse_layout(t)) {
        for (const at::Tensor& m : members(t)) n = std::max(n, m.numel());
      } else {
        n = t.numel();
      }
      *max_numel = std::max(*max_numel, n);
    } else if (t.dim() != 0 || is_sparse_layout(t)) {  // 0-dim CPU tensors are scalars
      other = t.device();
    }
  };
  std::optional<c10::DeviceIndex> device_arg;
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      scan(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) scan(t);
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      device_arg = v.toDevice().has_index() ? v.toDevice().index() : current_device();
    }
  }
  if (device >= 0 && other) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, npu:",
                static_cast<int>(device), " and ", *other, "! (when checking arguments of ", op.schema().name(),
                " on sparse npu tensors)");
  }
  return device >= 0 ? device : device_arg.value_or(current_device());
}

// The CPU dispatch key that serves what reached us under `key`.
c10::DispatchKey cpu_key(c10::DispatchKeySet ks) {
  switch (ks.highestPriorityTypeId()) {
    case c10::DispatchKey::SparsePrivateUse1:
      return c10::DispatchKey::SparseCPU;
    case c10::DispatchKey::SparseCsrPrivateUse1:
      return c10::DispatchKey::SparseCsrCPU;
    default:
      return c10::DispatchKey::CPU;
  }
}

// PyTorch's sparse CPU add (sparse + sparse) has no Half / BFloat16 kernel, CUDA's and
// torch_npu's have: nn.Embedding(sparse=True) in fp16 accumulates its gradients with it.
// As CUDA's kernel, the sum of such COO operands (the CPU stand-ins on `stack`) concatenates
// their indices and values (other's values times alpha, computed in float and rounded once)
// into an uncoalesced tensor: a gradient accumulated twice holds both gradients' entries. A
// sum with more entries than elements is coalesced (in float, rounded once), so repeated
// accumulation stays bounded. Returns false for any other call.
bool reduced_precision_sparse_add(const c10::FunctionSchema& schema, torch::jit::Stack* stack, size_t begin) {
  if (schema.name() != "aten::add" && schema.name() != "aten::add_") return false;
  const c10::IValue& a = (*stack)[begin];
  const c10::IValue& b = (*stack)[begin + 1];
  if (!a.isTensor() || !b.isTensor()) return false;
  const at::Tensor self = a.toTensor();
  const at::Tensor other = b.toTensor();
  const auto dtype = self.scalar_type();
  if (self.layout() != at::kSparse || other.layout() != at::kSparse || other.scalar_type() != dtype ||
      (dtype != at::kHalf && dtype != at::kBFloat16)) {
    return false;
  }
  const std::string& overload = schema.overload_name();
  const bool out = overload == "out";
  if (overload != "Tensor" && !out) return false;
  const at::Scalar alpha = (*stack)[begin + 2].toScalar();
  TORCH_CHECK(self.sizes().equals(other.sizes()), "add: expected 'self' and 'other' to have same size, but self has size ",
              self.sizes(), " while other has size ", other.sizes(),
              " (FYI: dense-sparse addition does not currently support broadcasting)");
  TORCH_CHECK(self.sparse_dim() == other.sparse_dim() && self.dense_dim() == other.dense_dim(),
              "add: expected 'self' and 'other' to have same density, but 'self' has ", self.sparse_dim(),
              " sparse dimensions while 'other' has ", other.sparse_dim(), " sparse dimensions");
  at::Tensor other_values = other._values();
  const bool unit = alpha.isIntegral(false) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0;
  if (!unit) other_values = other_values.to(at::kFloat).mul(alpha).to(dtype);
  at::Tensor sum = at::_sparse_coo_tensor_with_dims_and_tensors(
      self.sparse_dim(), self.dense_dim(), self.sizes(), at::cat({self._indices(), other._indices()}, 1),
      at::cat({self._values(), other_values}, 0), self.options(), /*is_coalesced=*/false);
  if (sum._nnz() > sum.numel()) sum = sum.to(at::kFloat).coalesce().to(dtype);
  at::Tensor result = sum;
  if (schema.name() == "aten::add_") {
    result = self;
  } else if (out) {
    result = (*stack)[begin + 3].toTensor();
  }
  if (!result.is_same(sum)) result.copy_(sum);  // sparse copy_: the target takes sum's members
  torch::jit::drop(*stack, schema.arguments().size());
  torch::jit::push(*stack, result);
  return true;
}

}  // namespace

at::Tensor sparse_result_to_npu(AliasMap& aliases, const at::Tensor& cpu) {
  TORCH_CHECK_NOT_IMPLEMENTED(is_sparse_layout(cpu), "npu tensors with layout ", cpu.layout(),
                              " are not supported by the NPU simulator's kernels");
  std::vector<at::Tensor> npu_members;
  for (const at::Tensor& m : members(cpu)) npu_members.push_back(aliases.to_npu(m));
  const bool coo = cpu.layout() == at::kSparse;
  return rebuild(coo ? c10::DispatchKey::SparsePrivateUse1 : c10::DispatchKey::SparseCsrPrivateUse1, cpu, npu_members);
}

// The kernel of every supported sparse overload (registered by the generated code) and of
// the dense operators that make sparse tensors (_to_sparse*).
void sparse_zero_copy_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  int64_t max_numel = 0;
  const c10::DeviceIndex device = call_device(op, *stack, begin, &max_numel);

  SparseCall call(device);
  const c10::DispatchKeySet cpu(cpu_key(ks));
  run_on_cpu_stand_ins(
      op, stack, device, [&call](const at::Tensor& t, bool written) { return call.to_cpu(t, written); },
      [&] {
        run_now(schema.name().c_str(), device, max_numel, [&] {
          if (!reduced_precision_sparse_add(schema, stack, begin)) op.redispatchBoxed(cpu, stack);
        });
        call.sync_written();
      },
      [&call](const at::Tensor& t) { return call.to_npu(t); });
}

namespace {

std::string overload_name(const c10::OperatorName& op) {
  std::string name = op.name.substr(op.name.find("::") + 2);
  return op.overload_name.empty() ? name : name + "." + op.overload_name;
}

// An operator without a sparse npu kernel: the error names it, the layout and why.
void sparse_unsupported(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack*) {
  static const auto* notes = [] {
    auto* m = new std::unordered_map<std::string, std::string>();
    for (const OpNote* e = kUnsupportedSparseOps; e->op != nullptr; ++e) m->emplace(e->op, e->why);
    return m;
  }();
  const auto& name = op.schema().operator_name();
  auto it = notes->find(overload_name(name));
  const bool coo = ks.highestPriorityTypeId() == c10::DispatchKey::SparsePrivateUse1;
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, name, " is not supported for sparse ", coo ? "COO" : "compressed (CSR/CSC/BSR/BSC)",
      " tensors on npu (", kPairDescription, "): ",
      it != notes->end() ? it->second
                         : "PyTorch has no sparse CPU kernel for it to run (the CPU raises for such tensors too)",
      ". Convert the sparse operand with .to_dense() first, or move it to the CPU.");
}

}  // namespace

}  // namespace torch_npu::ops

// Operators on strided npu tensors whose CPU kernels return sparse tensors: Tensor.to_sparse()
// (COO). Listed as native in the table. The compressed conversions (_to_sparse_csr & co.) and
// EmbeddingBag's backward take torch_npu's CPU fallback, as in torch_npu.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  const auto kernel = [] {
    return torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::sparse_zero_copy_kernel>();
  };
  for (const char* op : {"_to_sparse", "_to_sparse.sparse_dim"}) {
    m.impl(op, kernel());
  }
}

// PyTorch's device-generic kernels (those it registers for SparseCPU and SparseCUDA alike):
// - copies between sparse tensors copy member by member, so a copy between npu and cpu
//   moves the members through the dense copy;
// - metadata and members are read off the TensorImpl: no kernel, no wait for the stream,
//   and _values() & co. return the npu member itself, as on CUDA.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  using namespace at::native;
  m.impl("copy_", TORCH_FN(copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(copy_sparse_));
  m.impl("sparse_dim", TORCH_FN(sparse_dim_sparse));
  m.impl("_dimI", TORCH_FN(sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(dense_dim_sparse));
  m.impl("_dimV", TORCH_FN(dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(_nnz_sparse));
  m.impl("is_coalesced", TORCH_FN(is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(_coalesced_sparse_));
  m.impl("_indices", TORCH_FN(_indices_sparse));
  m.impl("_values", TORCH_FN(_values_sparse));
  m.impl("indices", TORCH_FN(indices_sparse));
  m.impl("values", TORCH_FN(values_sparse));
}
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  using namespace at::native;
  m.impl("copy_", TORCH_FN(copy_sparse_compressed_));
  m.impl("sparse_dim", TORCH_FN(sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(dense_dim_sparse_csr));
  m.impl("_nnz", TORCH_FN(_nnz_sparse_csr));
  m.impl("values", TORCH_FN(values_sparse_csr));
  m.impl("crow_indices", TORCH_FN(crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(row_indices_sparse_csr));
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::sparse_unsupported>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::sparse_unsupported>());
}
