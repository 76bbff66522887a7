// Zero-copy execution of ATen CPU kernels on NPU memory.
//
// An npu tensor gets a CPU "alias": a CPU-tagged StorageImpl whose DataPtr points at
// the npu bytes (its context keeps the npu storage alive). A CPU kernel runs on the
// aliases; its outputs are mapped back: a view of an alias becomes a view of the npu
// storage, a fresh buffer (allocated from NPU memory while a KernelScope is active)
// becomes an npu storage. No byte moves between host and device memory.
#pragma once

#include "torch_npu/core/npu_caching_allocator.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

#include <functional>
#include <vector>

namespace torch_npu::ops {

// While alive, CPU allocations made on this thread are served from NPU memory of
// `device` (outputs and workspaces of CPU kernels count in memory_allocated and OOM).
class KernelScope {
 public:
  explicit KernelScope(c10::DeviceIndex device);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  c10::DeviceIndex prev_;
};

// An argument a kernel writes (in-place self, out=): its CPU alias, the npu storage
// behind it, the caller's tensor, weakly (a queued kernel must not keep it alive), and
// the alias's geometry before the kernel ran (to tell a resize by the kernel, which
// must reach the caller's tensor, from the caller's own later changes, which must stay).
struct WrittenArg {
  WrittenArg(at::Tensor alias, c10::Storage npu_storage, const at::Tensor& original)
      : alias(std::move(alias)), npu_storage(std::move(npu_storage)),
        original(original.getIntrusivePtr()), sizes(this->alias.sizes()), strides(this->alias.strides()),
        storage_offset(this->alias.storage_offset()) {}
  // The kernel changed the alias's geometry (an out= argument resized).
  bool reshaped() const {
    return alias.sizes() != c10::IntArrayRef(sizes) || alias.strides() != c10::IntArrayRef(strides) ||
           alias.storage_offset() != storage_offset;
  }
  at::Tensor alias;
  c10::Storage npu_storage;
  c10::weak_intrusive_ptr<c10::TensorImpl> original;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t storage_offset;
};

// A CPU stand-in carries its npu tensor's requires_grad: some CPU kernels look at it (the
// argmax/argmin that _sparse_mm_reduce_impl saves for backward). Only a floating or complex
// stand-in can be marked; an integer or bool tensor that autograd marked (an in-place op
// with a differentiable operand) is left unmarked, as no kernel reads it of such a tensor.
inline void mirror_requires_grad(const at::Tensor& npu, at::Tensor& cpu) {
  if (npu.requires_grad() && (at::isFloatingType(cpu.scalar_type()) || at::isComplexType(cpu.scalar_type()))) {
    cpu.set_requires_grad(true);
  }
}

// One alias storage per distinct npu storage in a call, so overlap checks behave
// as on CPU (x.add_(x)).
class AliasMap {
 public:
  explicit AliasMap(c10::DeviceIndex device) : device_(device) {}
  // Aliases made from now on borrow npu memory that frees in stream order
  // (NPUCachingAllocator::freesInStreamOrder) instead of keeping its storage alive: for a
  // kernel queued on the stream that owns the memory, so that `del x` frees at once.
  void borrow_stream_ordered_memory() { borrow_ = true; }
  // CPU tensor over the same memory, sizes, strides and offset as `npu`.
  at::Tensor alias(const at::Tensor& npu);
  // The npu tensor for a CPU kernel's output (a sparse one member by member, sparse.cpp).
  at::Tensor to_npu(const at::Tensor& cpu);
  // After a kernel: propagate a resize the kernel made to an alias (out= arguments) to
  // the npu storage and tensor it stands for (an argument in a tiled format becomes ND).
  void sync_back(const WrittenArg& written);
  // A storage in a tiled format (formats.h) is aliased through an untiled copy of it,
  // made when the alias is: on a host thread after the device's current stream has
  // drained, on a stream's worker in stream order. Every view of such a storage, of any
  // dtype (the bytes of untyped_storage() too), sees the base array's bytes; the tiled
  // ones are physical only (data_ptr()). True if this map made one.
  bool has_untiled() const { return !untiled_.empty(); }
  // Tiles every untiled copy back into its storage (after a kernel that may write them).
  void store_untiled();

 private:
  struct Entry {
    c10::StorageImpl* from;  // CPU-side storage (alias, untiled copy or fresh output)
    c10::Storage npu;
  };
  c10::DeviceIndex device_;
  bool borrow_ = false;
  c10::SmallVector<Entry, 8> entries_;
  // An npu tensor passed twice gets the same alias object, as the CPU kernel would get the
  // same tensor (out=(t, t): both results resize and squeeze the one tensor).
  c10::SmallVector<std::pair<const c10::TensorImpl*, at::Tensor>, 8> aliases_;
  struct Untiled {
    c10::Storage copy;  // CPU storage of the base array, plain
    c10::Storage npu;   // the tiled storage it stands for
    size_t nbytes;      // of the copy as made (a kernel resizing it makes the storage ND)
  };
  c10::SmallVector<Untiled, 1> untiled_;
  c10::Storage npu_storage_for(const c10::Storage& cpu);
  c10::Storage untiled_copy(const at::Tensor& npu);
};

// A TensorImpl over the same storage with the same sizes, strides, offset and dtype,
// owned by no Python object and carrying no autograd state. Queued kernels capture
// twins, never the user's tensors: dropping the last reference to a tensor that owns a
// Python object would take the GIL on the stream's worker thread.
at::Tensor twin(const at::Tensor& t);
// For a kernel queued on the current stream of t's device: a twin that borrows t's bytes
// when they free in stream order (see AliasMap::borrow_stream_ordered_memory), else twin(t).
at::Tensor borrowed_twin(const at::Tensor& t);

// Runs `kernel` (CPU work on aliases of NPU memory of `device`) and returns when it is
// done, on the calling thread where runs_on_caller (npu_task_queue.h) says so, else on the
// stream's worker while the caller waits (a small kernel behind queued work). Exceptions
// reach the caller with their own type.
void run_now(const char* name, c10::DeviceIndex device, int64_t max_numel, const std::function<void()>& kernel);

// Runs a kernel whose outputs the caller has allocated (fused operators): `kernel`
// receives CPU aliases of `tensors`, in order (undefined ones stay undefined, CPU
// tensors pass as they are). It is queued on the current stream of `device` and the
// call returns at once, unless the task queue is off or runs_on_caller (npu_task_queue.h)
// keeps the work (`work_numel` elements) here. An exception thrown by a queued kernel
// surfaces at the next synchronisation, so callers check arguments first.
void launch_kernel(const char* name, c10::DeviceIndex device, std::vector<at::Tensor> tensors, int64_t work_numel,
                   std::function<void(const std::vector<at::Tensor>&)> kernel);

// While the unsafe-data check is on (torch_npu.npu._recovery: set_npu_tensor_unsafe_check_flag,
// restart_device), operators refuse npu inputs whose memory is marked unsafe, with
// torch_npu's "There is unsafe data in the input tensor."; a copy checks its source and
// marks its destination safe (check_and_update_for_copy).
inline bool unsafe_data_check_enabled() { return torch_npu::NPUCachingAllocator::getNpuDataUnsafeFlag(); }
void check_data_safe(const at::Tensor& t);
void check_and_update_for_copy(const at::Tensor& dst, const at::Tensor& src);

// Installs the CPU allocator that serves KernelScope (idempotent).
void install_kernel_allocator();

// Shared by the boxed kernels that run an operator's CPU kernel on CPU stand-ins of its
// npu arguments (npu_fallback in zero_copy.cpp, the sparse and nested kernels).

// An argument of type Generator? (None: the device's default generator).
bool is_optional_generator(const c10::Argument& arg);

// The argument a written return (Tensor(a!): in-place and out= forms) aliases, or -1.
int written_argument(const c10::FunctionSchema& schema, const c10::Argument& ret);

// The sparse npu tensor (COO or compressed) for a sparse result of a CPU kernel: each member
// mapped by `aliases` (views of an argument's members stay views, fresh buffers are adopted).
at::Tensor sparse_result_to_npu(AliasMap& aliases, const at::Tensor& cpu);
// A nested CPU result: its storage mapped to npu under the same metadata (nested.cpp).
at::Tensor nested_result_to_npu(AliasMap& aliases, const at::Tensor& cpu);

// After the CPU kernel: the last return_arg.size() values of `stack`, its results, become
// npu values. Result r with return_arg[r] >= 0 (a written argument) becomes results[r], the
// caller's tensor taken off the stack before the arguments were rewritten (moved from);
// other tensors and tensor lists are mapped one tensor at a time by `to_npu`.
void results_to_npu(torch::jit::Stack& stack, c10::ArrayRef<int> return_arg,
                    c10::SmallVectorImpl<c10::IValue>& results,
                    c10::function_ref<at::Tensor(const at::Tensor&)> to_npu);

// The frame of the kernels that run a CPU layout backend's kernel (sparse.cpp, nested.cpp) on
// CPU stand-ins of the npu arguments of `op` on `stack`: each tensor argument becomes
// to_cpu(tensor, written by the op?) (lists element by element), an npu device argument the CPU,
// a generator the device's CPU stand-in (cpu_generator_for); then `kernel` runs (the caller
// redispatches, in stream order), and the results become npu values (results_to_npu).
void run_on_cpu_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                          c10::function_ref<at::Tensor(const at::Tensor&, bool)> to_cpu,
                          c10::function_ref<void()> kernel,
                          c10::function_ref<at::Tensor(const at::Tensor&)> to_npu);

}  // namespace torch_npu::ops
