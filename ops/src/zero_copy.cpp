// CPU aliases of npu tensors, the kernel-scope CPU allocator, and the boxed
// fallback that runs every ATen CPU kernel on npu tensors without copies.
#include "torch_npu/ops/zero_copy.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/op_registration.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/add_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/div_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/mul_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sub_compositeexplicitautogradnonfunctional_dispatch.h>
#include <torch/library.h>

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>
#include <exception>
#include <unordered_map>
#include <unordered_set>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_error.h"
#include "torch_npu/core/npu_generator.h"
#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

#include "op_table.h"
#include "torch_npu/ops/formats.h"
#include "torch_npu/ops/fft_plan_cache.h"

// MKL's per-thread thread count, C interface (exported by libtorch_cpu when it bundles
// MKL; weak so that a torch without MKL still links). Its lowercase alias there is the
// Fortran interface, which takes a pointer.
extern "C" int MKL_Set_Num_Threads_Local(int nthreads) __attribute__((weak));

namespace torch_npu::ops {
namespace {

// A CPU tensor (not a 0-dim one: those are scalars) among the arguments of an operator on npu
// tensors: torch_npu's error.
[[noreturn]] void fail_cpu_operand(const char* op, c10::DeviceIndex device, const c10::Device& other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device. Expected NPU tensor, please check whether the "
              "input tensor device is correct. (", op, ": npu:", static_cast<int>(device), " and ", other, ")",
              ops_error(ErrCode::TYPE));
  std::abort();  // not reached
}

void check_no_cpu_operand(const char* op, const at::Tensor& self, const at::Tensor& other) {
  constexpr c10::DeviceType npu_type = c10::DeviceType::PrivateUse1;
  const at::Tensor& npu = self.device().type() == npu_type ? self : other;
  const at::Tensor& cpu = self.device().type() == npu_type ? other : self;
  if (npu.device().type() == npu_type && cpu.device().type() == c10::DeviceType::CPU && cpu.dim() != 0) {
    fail_cpu_operand(op, npu.device().index(), cpu.device());
  }
}

// div's rounding_mode, checked before ATen's meta function would, with torch_npu's error.
void check_rounding_mode(std::optional<c10::string_view> mode) {
  TORCH_CHECK(!mode.has_value() || *mode == "trunc" || *mode == "floor",
              "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", mode.value_or(""),
              "'", ops_error(ErrCode::PARAM));
}

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

// Kernels on tensors up to this many elements call MKL single-threaded: forking MKL's
// OpenMP team for a tiny matmul costs more than the matmul (10x on a loaded 2-core host,
// where a tiny training step spent half its time in OpenMP barriers).
constexpr int64_t kSerialBlasNumel = 4096;

// While alive, MKL calls of this thread run on one thread if `numel` is small: up to
// kSerialBlasNumel elements, or kInlineNumel for a kernel run by a stream's worker (`queued`),
// which must not start an OpenMP team of its own (see runs_on_caller).
class SerialBlasScope {
 public:
  explicit SerialBlasScope(int64_t numel, bool queued = false) {
    if (numel <= (queued ? kInlineNumel : kSerialBlasNumel) && MKL_Set_Num_Threads_Local != nullptr) {
      prev_ = MKL_Set_Num_Threads_Local(1);
      active_ = true;
    }
  }
  ~SerialBlasScope() {
    if (active_) MKL_Set_Num_Threads_Local(prev_);
  }
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  bool active_ = false;
  int prev_ = 0;
};

thread_local c10::DeviceIndex tls_kernel_device = -1;

void npu_raw_delete(void* p) { NPUCachingAllocator::raw_delete(p); }

// Serves CPU allocations from NPU memory while a KernelScope is active on the thread.
struct KernelAllocator final : public c10::Allocator {
  c10::Allocator* base = nullptr;

  c10::DataPtr allocate(size_t n) override {
    if (tls_kernel_device >= 0) {
      c10::DataPtr dp = NPUCachingAllocator::allocate(n, tls_kernel_device);
      dp.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
      return dp;
    }
    return base->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return tls_kernel_device >= 0 ? &npu_raw_delete : base->raw_deleter();
  }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
};

KernelAllocator& kernel_allocator() {
  static KernelAllocator* a = new KernelAllocator();  // leaked: used during exit
  return *a;
}

void release_npu_storage(void* ctx) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx)); }
void borrowed_bytes(void*) {}  // the caching allocator owns them

bool frees_in_stream_order(const at::Tensor& t) {
  return t.device().type() == kNPU && tiled_storage(t) == nullptr &&
         NPUCachingAllocator::freesInStreamOrder(t.storage().data_ptr());
}

// What a CPU alias's storage holds of npu storage `npu`: a reference, or (borrow) nothing.
c10::DataPtr alias_bytes(c10::StorageImpl* npu, bool borrow) {
  void* data = const_cast<void*>(npu->data());
  const c10::Device cpu(c10::DeviceType::CPU);
  if (borrow) return c10::DataPtr(data, data, &borrowed_bytes, cpu);
  c10::raw::intrusive_ptr::incref(npu);
  return c10::DataPtr(data, npu, &release_npu_storage, cpu);
}

// A tensor over `storage` with `like`'s dtype, sizes, strides, offset and conj/neg bits.
at::Tensor tensor_over(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  c10::DispatchKeySet keys(key);
  // A ZeroTensor (at::_efficientzerotensor, e.g. the gradient of sgn on real inputs) has no
  // data: without its key, kernels would read its null buffer.
  if (like._is_zerotensor()) keys = keys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  impl->_set_conj(like.is_conj());
  impl->_set_neg(like.is_neg());
  return at::Tensor(std::move(impl));
}

// The npu buffer for what a CPU kernel left in `cpu`: its own buffer when it is NPU
// memory of `device` (a KernelScope allocation), else a copy in NPU memory (a buffer
// allocated on an OpenMP worker thread misses the thread-local scope). The CPU storage
// keeps pointing at the bytes, without owning them.
c10::DataPtr take_buffer(c10::StorageImpl* cpu, c10::DeviceIndex device) {
  const size_t nbytes = cpu->nbytes();
  // No bytes behind it (a ZeroTensor's storage claims nbytes over a null pointer).
  if (cpu->data() == nullptr) return c10::DataPtr(nullptr, c10::Device(kNPU, device));
  if (cpu->data() != nullptr && aclsimPointerDevice(cpu->data()) == device &&
      cpu->data_ptr().get_deleter() != &release_npu_storage && cpu->data_ptr().get_deleter() != &borrowed_bytes) {
    c10::DataPtr dp = cpu->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    dp.unsafe_set_device(c10::Device(kNPU, device));
    cpu->set_data_ptr_noswap(c10::DataPtr(dp.get(), c10::Device(c10::DeviceType::CPU)));
    return dp;
  }
  c10::DataPtr dp = NPUCachingAllocator::allocate(nbytes, device);
  if (nbytes > 0) std::memcpy(dp.get(), cpu->data(), nbytes);
  return dp;
}

}  // namespace

void install_kernel_allocator() {
  static const bool done = [] {
    kernel_allocator().base = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&kernel_allocator(), /*priority=*/100);
    return true;
  }();
  (void)done;
}

KernelScope::KernelScope(c10::DeviceIndex device) : prev_(tls_kernel_device) { tls_kernel_device = device; }
KernelScope::~KernelScope() { tls_kernel_device = prev_; }

c10::Storage AliasMap::npu_storage_for(const c10::Storage& cpu) {
  auto* impl = cpu.unsafeGetStorageImpl();
  for (auto& e : entries_) {
    if (e.from == impl) return e.npu;
  }
  // A fresh buffer made by the kernel.
  c10::Storage npu(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                         take_buffer(impl, device_), NPUCachingAllocator::get(),
                                                         /*resizable=*/true));
  entries_.push_back({impl, npu});
  return npu;
}

at::Tensor AliasMap::alias(const at::Tensor& t) {
  TORCH_CHECK(t.layout() == c10::kStrided, "npu tensors with layout ", t.layout(),
              " are not supported by the NPU simulator's kernels");
  for (const auto& [impl, a] : aliases_) {
    if (impl == t.unsafeGetTensorImpl()) return a;
  }
  const c10::Storage& npu = t.storage();
  c10::StorageImpl* npu_impl = npu.unsafeGetStorageImpl();
  c10::Storage cpu;
  for (auto& e : entries_) {
    if (e.npu.unsafeGetStorageImpl() == npu_impl) {
      cpu = c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(e.from));
      break;
    }
  }
  if (!cpu && tiled_storage(t) != nullptr) {
    cpu = untiled_copy(t);
    entries_.push_back({cpu.unsafeGetStorageImpl(), npu});
  } else if (!cpu) {
    c10::DataPtr dp = alias_bytes(npu_impl, borrow_ && frees_in_stream_order(t));
    cpu = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), npu_impl->nbytes(),
                                                             std::move(dp), &kernel_allocator(),
                                                             /*resizable=*/true));
    entries_.push_back({cpu.unsafeGetStorageImpl(), npu});
  }
  at::Tensor a = tensor_over(std::move(cpu), c10::DispatchKey::CPU, t);
  mirror_requires_grad(t, a);
  aliases_.emplace_back(t.unsafeGetTensorImpl(), a);
  return a;
}

c10::Storage AliasMap::untiled_copy(const at::Tensor& t) {
  const FormattedStorage& f = *tiled_storage(t);
  if (!in_kernel()) {
    NPUStream stream = getCurrentNPUStream(device_);
    if (isStreamRecording(stream)) {
      fail_capture(stream, "a tensor in " + format_name(f.format) +
                               " cannot be used while a stream captures (reading it means a synchronisation); "
                               "npu_format_cast it to ND (2) before the capture");
    }
    wait_stream(stream);
  }
  // The base array, then zeros up to the storage's size: what any view of the storage
  // (of any dtype, up to its nbytes) reads.
  const size_t nbytes = std::max(f.base_nbytes(), f.nbytes());
  c10::DataPtr dp = NPUCachingAllocator::allocate(nbytes, device_);
  dp.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
  if (f.base_nbytes() > 0) untile(f, dp.get());
  std::memset(static_cast<char*>(dp.get()) + f.base_nbytes(), 0, nbytes - f.base_nbytes());
  c10::Storage copy(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(dp),
                                                          &kernel_allocator(), /*resizable=*/true));
  untiled_.push_back({copy, t.storage(), nbytes});
  return copy;
}

void AliasMap::store_untiled() {
  for (const Untiled& u : untiled_) {
    FormattedStorage* f = formatted(u.npu.unsafeGetStorageImpl());
    if (f->tiled() && u.copy.nbytes() == u.nbytes && f->base_nbytes() > 0) tile(*f, u.copy.data());
  }
}

at::Tensor AliasMap::to_npu(const at::Tensor& cpu) {
  if (!cpu.defined()) return cpu;
  if (cpu.device().type() == kNPU) return cpu;
  if (cpu.is_nested()) return nested_result_to_npu(*this, cpu);
  if (cpu.layout() != c10::kStrided) return sparse_result_to_npu(*this, cpu);
  return tensor_over(npu_storage_for(cpu.storage()), c10::DispatchKey::PrivateUse1, cpu);
}

at::Tensor twin(const at::Tensor& t) {
  if (!t.defined()) return t;
  return tensor_over(t.storage(), t.device().type() == kNPU ? c10::DispatchKey::PrivateUse1 : c10::DispatchKey::CPU, t);
}

at::Tensor borrowed_twin(const at::Tensor& t) {
  if (!t.defined() || !frees_in_stream_order(t) || isStreamRecording(getCurrentNPUStream(t.device().index()))) {
    return twin(t);  // a graph's replays need what it captured
  }
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  void* data = const_cast<void*>(impl->data());
  c10::Storage borrowed(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), c10::DataPtr(data, data, &borrowed_bytes, t.device()),
      nullptr, /*resizable=*/false));
  return tensor_over(std::move(borrowed), c10::DispatchKey::PrivateUse1, t);
}

void AliasMap::sync_back(const WrittenArg& w) {
  auto* npu_storage = w.npu_storage.unsafeGetStorageImpl();
  auto* cpu_storage = w.alias.storage().unsafeGetStorageImpl();
  // Only a change the kernel made (out= resized) goes to the caller's tensor; comparing
  // with the tensor itself would undo what the caller did meanwhile (set_, resize_).
  const at::Tensor& a = w.alias;
  const bool reshaped = w.reshaped();
  // Written through an untiled copy (made by this map)?
  FormattedStorage* tiled = nullptr;
  size_t untiled_nbytes = 0;
  for (const Untiled& u : untiled_) {
    if (u.copy.unsafeGetStorageImpl() == cpu_storage) {
      tiled = formatted(npu_storage);
      untiled_nbytes = u.nbytes;
    }
  }
  if (tiled != nullptr && !tiled->tiled()) tiled = nullptr;
  if (tiled != nullptr && (reshaped || cpu_storage->nbytes() != untiled_nbytes)) {
    // The kernel resized an out= argument in a tiled format: it now holds the plain
    // bytes the kernel wrote (the tiling was for the old shape).
    npu_storage->set_data_ptr_noswap(take_buffer(cpu_storage, device_));
    npu_storage->set_nbytes(cpu_storage->nbytes());
    tiled->become_nd();
  } else if (tiled == nullptr &&
             (cpu_storage->data() != npu_storage->data() || cpu_storage->nbytes() != npu_storage->nbytes())) {
    // The kernel resized an out= argument: its alias got a new (NPU) buffer.
    npu_storage->set_data_ptr_noswap(take_buffer(cpu_storage, device_));
    npu_storage->set_nbytes(cpu_storage->nbytes());
  }
  // (Otherwise an untiled copy the kernel wrote in place: store_untiled() tiles it back.)
  if (!reshaped) return;
  if (auto original = w.original.lock()) {
    original->set_sizes_and_strides(a.sizes(), a.strides(), a.storage_offset());
  }
}

namespace {

// The warnings a kernel gives on a stream's worker while the caller waits for it, given
// again on the caller's thread (where Python's warning handler is) when it is done.
class WarningCollector final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { warnings_.push_back(warning); }
  void reissue() {
    for (const c10::Warning& w : warnings_) c10::warn(w);
  }

 private:
  std::vector<c10::Warning> warnings_;
};

}  // namespace

void run_now(const char* name, c10::DeviceIndex device, int64_t max_numel, const std::function<void()>& kernel) {
  NPUStream stream = getCurrentNPUStream(device);
  if (!in_kernel() && isStreamRecording(stream)) {
    fail_capture(stream, std::string(name) +
                             " cannot be captured into an NPU graph: it must run before the call returns, which a "
                             "capturing stream never does; run it outside the capture");
  }
  const bool on_worker = task_queue_enabled() && !in_kernel() && !runs_on_caller(stream, max_numel);
  if (!on_worker) {
    if (!in_kernel()) wait_stream(stream);
    InlineKernelRecord record(name, stream);
    KernelScope scope(device);
    SerialBlasScope blas(max_numel);
    kernel();
    return;
  }
  std::exception_ptr error;
  WarningCollector warnings;
  launch(stream, name, [&kernel, device, &error, &warnings, max_numel] {
    try {
      c10::WarningUtils::WarningHandlerGuard collect(&warnings);
      KernelScope scope(device);
      SerialBlasScope blas(max_numel, true);
      kernel();
    } catch (...) {
      error = std::current_exception();  // rethrown to the caller with its own type
    }
  });
  // Not stream.synchronize(): the wait is the simulator's, not the program's (on an NPU
  // these kernels are asynchronous), so the sanitizer's trace does not see it.
  wait_stream(stream);
  warnings.reissue();
  if (error) std::rethrow_exception(error);
}

void check_data_safe(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNPU || !t.has_storage()) return;
  TORCH_CHECK(NPUCachingAllocator::checkBlockIsSafe(t.storage().data_ptr()),
              "There is unsafe data in the input tensor.");
}

void check_and_update_for_copy(const at::Tensor& dst, const at::Tensor& src) {
  check_data_safe(src);
  if (dst.defined() && dst.device().type() == kNPU && dst.has_storage())
    NPUCachingAllocator::updateBlockToSafe(dst.storage().data_ptr());
}

void launch_kernel(const char* name, c10::DeviceIndex device, std::vector<at::Tensor> tensors, int64_t work_numel,
                   std::function<void(const std::vector<at::Tensor>&)> kernel) {
  if (C10_UNLIKELY(unsafe_data_check_enabled()) && !in_kernel()) {
    for (const auto& t : tensors) check_data_safe(t);
  }
  NPUStream stream = getCurrentNPUStream(device);
  // A capturing stream records the kernel (launch); it must not run here.
  const bool capture = !in_kernel() && isStreamRecording(stream);
  AliasMap aliases(device);
  if (!capture) aliases.borrow_stream_ordered_memory();  // run inline, the caller holds the tensors
  for (auto& t : tensors) {
    if (t.defined() && t.device().type() == kNPU) t = aliases.alias(t);
  }
  if (aliases.has_untiled() ||
      (!capture && (!task_queue_enabled() || in_kernel() || runs_on_caller(stream, work_numel)))) {
    if (!in_kernel()) wait_stream(stream);
    InlineKernelRecord record(name, stream);
    KernelScope scope(device);
    SerialBlasScope blas(work_numel);
    kernel(tensors);
    aliases.store_untiled();  // arguments in tiled formats: whatever the kernel wrote
    return;
  }
  launch(stream, name, [device, tensors = std::move(tensors), kernel = std::move(kernel), work_numel] {
    KernelScope scope(device);
    SerialBlasScope blas(work_numel, true);
    kernel(tensors);
  });
}

// ------------------------------------------------------------------------------------
// The boxed fallback.

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  return type->kind() == c10::TypeKind::OptionalType &&
         type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

int written_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  const auto* info = ret.alias_info();
  if (!info || !info->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* a = args[i].alias_info();
    if (a && a->isWrite() && a->beforeSets() == info->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

void results_to_npu(torch::jit::Stack& stack, c10::ArrayRef<int> return_arg,
                    c10::SmallVectorImpl<c10::IValue>& results,
                    c10::function_ref<at::Tensor(const at::Tensor&)> to_npu) {
  const size_t first_ret = stack.size() - return_arg.size();
  for (size_t r = 0; r < return_arg.size(); ++r) {
    c10::IValue& v = stack[first_ret + r];
    if (return_arg[r] >= 0 && results[r].isTensor()) {
      v = std::move(results[r]);
    } else if (v.isTensor()) {
      v = to_npu(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(to_npu(t));
      v = std::move(out);
    }
  }
}

void run_on_cpu_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                          c10::function_ref<at::Tensor(const at::Tensor&, bool)> to_cpu,
                          c10::function_ref<void()> kernel,
                          c10::function_ref<at::Tensor(const at::Tensor&)> to_npu) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  c10::SmallVector<int, 4> return_arg;
  for (const auto& ret : schema.returns()) return_arg.push_back(written_argument(schema, ret));
  c10::SmallVector<c10::IValue, 4> results;
  for (int i : return_arg) results.push_back(i >= 0 ? (*stack)[begin + i] : c10::IValue());
  int64_t numbers = 0;  // a random kernel's draw: at most the largest tensor's elements
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (v.isTensor()) numbers = std::max(numbers, v.toTensor().numel());
  }

  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[begin + i];
    const auto* info = schema.arguments()[i].alias_info();
    const bool is_written = info && info->isWrite();
    if (v.isTensor()) {
      v = to_cpu(v.toTensor(), is_written);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(to_cpu(t, is_written));
      v = std::move(out);
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      v = c10::Device(c10::DeviceType::CPU);
    } else if (v.isGenerator()) {
      v = cpu_generator_for(v.toGenerator(), device, numbers);
    } else if (v.isNone() && is_optional_generator(schema.arguments()[i])) {
      v = cpu_generator_for(std::nullopt, device, numbers);
    }
  }
  kernel();
  results_to_npu(*stack, return_arg, results, to_npu);
}

namespace {

bool is_npu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }

// Tensor?[] (e.g. the indices of index/index_put_).
bool is_optional_tensor_list(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() != c10::TypeKind::ListType) return false;
  const auto& elem = type->castRaw<c10::ListType>()->getElementType();
  return elem->kind() == c10::TypeKind::OptionalType &&
         elem->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
}

// What the fallback needs to know of an operator's schema, computed once per schema.
struct OpTraits {
  c10::OperatorName name;                               // guards against a reused schema address
  static constexpr uint8_t kWritten = 1;                // Tensor(a!) / Tensor(a!)[]
  static constexpr uint8_t kOptionalTensorList = 2;     // Tensor?[]
  static constexpr uint8_t kOptionalGenerator = 4;      // Generator?
  static constexpr uint8_t kOut = 8;                    // a written keyword argument (out=)
  c10::SmallVector<uint8_t, 8> arg;                     // flags per argument
  c10::SmallVector<int, 4> return_arg;                  // per return: the written argument, or -1
  uint64_t dtypes = kAnyDtype;                          // what the op table allows
  bool has_out = false;                                 // any kOut argument
  bool has_meta = false;                                // a Meta kernel predicts its out= geometry
};

const OpTraits& traits_of(const c10::FunctionSchema& schema) {
  thread_local std::unordered_map<const c10::FunctionSchema*, OpTraits> cache;
  auto it = cache.find(&schema);
  if (it != cache.end() && it->second.name == schema.operator_name()) return it->second;
  OpTraits t{schema.operator_name()};
  for (const auto& arg : schema.arguments()) {
    uint8_t f = 0;
    if (arg.alias_info() && arg.alias_info()->isWrite()) f |= OpTraits::kWritten;
    if (is_optional_tensor_list(arg)) f |= OpTraits::kOptionalTensorList;
    if (is_optional_generator(arg)) f |= OpTraits::kOptionalGenerator;
    if ((f & OpTraits::kWritten) && arg.kwarg_only()) f |= OpTraits::kOut;
    t.has_out |= (f & OpTraits::kOut) != 0;
    t.arg.push_back(f);
  }
  for (const auto& ret : schema.returns()) t.return_arg.push_back(written_argument(schema, ret));
  t.dtypes = allowed_dtypes(schema.operator_name());
  if (t.has_out) {
    const auto handle = c10::Dispatcher::singleton().findOp(schema.operator_name());
    t.has_meta = handle && handle->hasKernelForDispatchKey(c10::DispatchKey::Meta);
  }
  return cache.insert_or_assign(&schema, std::move(t)).first->second;
}

// Finds the npu device of a call and rejects mixed devices as CUDA does.
struct CallScan {
  c10::DeviceIndex device = -1;
  bool has_generator = false;
  bool has_cpu_tensor = false;  // CPU index tensors (Tensor?[]): read by the kernel, may be large
  bool has_tiled = false;       // npu tensors in a tiled storage format: run through untiled copies
  int64_t max_numel = 0;        // of the npu tensors: small kernels never enter OpenMP

  void tensor(const at::Tensor& t, const c10::OperatorHandle& op, bool index_list) {
    if (!t.defined()) return;
    if (t.device().type() == kNPU) {
      max_numel = std::max(max_numel, t.numel());
      has_tiled = has_tiled || tiled_storage(t) != nullptr;
      if (device < 0) {
        device = t.device().index();
      } else {
        TORCH_CHECK(t.device().index() == device,
                    "Expected all tensors to be on the same device, but found at least two devices, npu:",
                    static_cast<int>(device), " and ", t.device(), "! (when checking arguments of ",
                    op.schema().name(), ")");
      }
    } else if (t.device().type() == c10::DeviceType::CPU) {
      if (index_list) {
        has_cpu_tensor = true;
      } else if (t.dim() != 0) {  // 0-dim CPU tensors are scalars (Python numbers arrive so)
        cpu_mixed = t.device();
      }
    }
  }
  std::optional<c10::Device> cpu_mixed;
};

// Rewrites the arguments on the stack for the CPU kernel: npu tensors become aliases,
// npu devices become cpu, generators become the CPU generators of a draw of up to
// `numbers` values (the largest npu tensor's elements).
void to_cpu_arguments(const OpTraits& traits, torch::jit::Stack& s, size_t begin, c10::DeviceIndex device,
                      int64_t numbers, AliasMap& aliases, std::vector<WrittenArg>& written) {
  auto alias = [&](const at::Tensor& t, bool is_written) {
    at::Tensor a = aliases.alias(t);
    if (is_written) written.emplace_back(a, t.storage(), t);
    return a;
  };
  for (size_t i = 0; i < traits.arg.size(); ++i) {
    c10::IValue& v = s[begin + i];
    const bool is_written = traits.arg[i] & OpTraits::kWritten;
    if (v.isTensor()) {
      if (is_npu(v.toTensor())) v = alias(v.toTensor(), is_written);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(is_npu(t) ? alias(t, is_written) : t);
      v = std::move(out);
    } else if (v.isList() && (traits.arg[i] & OpTraits::kOptionalTensorList)) {
      auto generic = v.toList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(generic.size());
      for (const c10::IValue& e : generic) {
        if (e.isTensor()) {
          const at::Tensor& t = e.toTensor();
          out.push_back(is_npu(t) ? alias(t, false) : t);
        } else {
          out.push_back(std::nullopt);
        }
      }
      v = std::move(out);
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      v = c10::Device(c10::DeviceType::CPU);
    } else if (v.isGenerator()) {
      v = cpu_generator_for(v.toGenerator(), device, numbers);
    } else if (v.isNone() && (traits.arg[i] & OpTraits::kOptionalGenerator)) {
      v = cpu_generator_for(std::nullopt, device, numbers);
    }
  }
}

// The op table restricts this operator's dtypes on the NPU: reject others by name.
void check_dtypes(const OpTraits& traits, const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                  size_t begin) {
  auto check = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNPU || (traits.dtypes & dtype_bit(t.scalar_type()))) return;
    std::string allowed;
    for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
      if (traits.dtypes & (uint64_t{1} << i)) {
        allowed += (allowed.empty() ? "" : ", ") + std::string(c10::toString(static_cast<c10::ScalarType>(i)));
      }
    }
    const std::string& overload = schema.overload_name();
    TORCH_CHECK(false, schema.name(), overload.empty() ? "" : ".", overload, " does not support ", t.scalar_type(),
                " on NPU (", kPairDescription, "); it takes ", allowed);
  };
  for (size_t i = begin; i < stack.size(); ++i) {
    if (stack[i].isTensor()) {
      check(stack[i].toTensor());
    } else if (stack[i].isTensorList()) {
      for (const at::Tensor& t : stack[i].toTensorList()) check(t);
    }
  }
}

// A twin of npu tensor `t` on the meta device, sharing a meta storage with the other
// twins of the call whose npu storage is the same (so overlap checks see the aliasing).
at::Tensor meta_twin(const at::Tensor& t,
                     c10::SmallVectorImpl<std::pair<const c10::StorageImpl*, c10::Storage>>& storages) {
  if (!is_npu(t)) return t;
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (const auto& [from, meta] : storages) {
    if (from == impl) return tensor_over(meta, c10::DispatchKey::Meta, t);
  }
  c10::Storage meta(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)),
      c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true));
  storages.emplace_back(impl, meta);
  return tensor_over(std::move(meta), c10::DispatchKey::Meta, t);
}

// An empty meta tensor of `t`'s dtype: resized by a Meta kernel without the warning a
// non-empty out= tensor gives (the real kernel gives it).
at::Tensor empty_meta_like(const at::Tensor& t) {
  if (!is_npu(t)) return t;
  return at::empty({0}, t.options().device(c10::DeviceType::Meta));
}

// Runs the op's Meta kernel on meta twins of the arguments, empty ones for the out=
// arguments, and tells whether the shape it gave an out= argument differs from the
// caller's tensor's (resize_output changes an out tensor's geometry only then); yes when
// it raises (the real kernel will raise the user's error).
bool meta_resizes_outs(const c10::OperatorHandle& op, const OpTraits& traits, const torch::jit::Stack& stack,
                       size_t begin) {
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 8> storages;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> outs;  // (meta tensor, npu tensor)
  torch::jit::Stack meta;
  meta.reserve(traits.arg.size());
  for (size_t i = 0; i < traits.arg.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    const bool out = traits.arg[i] & OpTraits::kOut;
    if (v.isTensor()) {
      meta.emplace_back(out ? empty_meta_like(v.toTensor()) : meta_twin(v.toTensor(), storages));
      if (out) outs.emplace_back(meta.back().toTensor(), v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) {
        list.push_back(out ? empty_meta_like(t) : meta_twin(t, storages));
        if (out) outs.emplace_back(list.get(list.size() - 1), t);
      }
      meta.emplace_back(std::move(list));
    } else if (v.isList() && (traits.arg[i] & OpTraits::kOptionalTensorList)) {
      c10::List<std::optional<at::Tensor>> list;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          list.push_back(meta_twin(e.toTensor(), storages));
        } else {
          list.push_back(std::nullopt);
        }
      }
      meta.emplace_back(std::move(list));
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      meta.emplace_back(c10::Device(c10::DeviceType::Meta));
    } else {
      meta.push_back(v);
    }
  }
  // out= arguments sharing memory (e.g. kthvalue(..., out=(t, t))): the kernel resizes the
  // one tensor twice, which separate meta twins cannot show, so the call runs synchronously.
  for (size_t i = 0; i < outs.size(); ++i) {
    for (size_t j = i + 1; j < outs.size(); ++j) {
      if (outs[i].second.defined() && outs[j].second.defined() &&
          outs[i].second.storage().is_alias_of(outs[j].second.storage())) {
        return true;
      }
    }
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    return true;
  }
  for (const auto& [predicted, npu] : outs) {
    if (predicted.sizes() != npu.sizes()) return true;
  }
  return false;
}

// What determines the geometry an op's Meta kernel computes, as integers: per argument,
// the geometry, dtype and storage (by order of appearance) of tensors, and the values of
// the others. False for an argument of a kind it does not encode.
bool encode_call(const OpTraits& traits, const torch::jit::Stack& stack, size_t begin,
                 c10::SmallVectorImpl<int64_t>& key) {
  c10::SmallVector<const c10::StorageImpl*, 8> storages;
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) {
      key.push_back(-1);
      return;
    }
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const auto found = std::find(storages.begin(), storages.end(), impl);
    key.push_back(found - storages.begin());
    if (found == storages.end()) storages.push_back(impl);
    key.push_back(static_cast<int64_t>(t.device().type()));
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(t.is_conj() | t.is_neg() << 1 | t._is_zerotensor() << 2 |
                  t.unsafeGetTensorImpl()->is_wrapped_number() << 3);
    key.push_back(t.dim());
    key.append(t.sizes().begin(), t.sizes().end());
    key.append(t.strides().begin(), t.strides().end());
    key.push_back(t.storage_offset());
  };
  auto number = [&](const c10::IValue& v) {
    if (v.isInt()) {
      key.append({1, v.toInt()});
    } else if (v.isDouble()) {
      key.append({2, std::bit_cast<int64_t>(v.toDouble())});
    } else if (v.isBool()) {
      key.append({3, v.toBool()});
    } else if (v.isComplexDouble()) {
      const auto z = v.toComplexDouble();
      key.append({4, std::bit_cast<int64_t>(z.real()), std::bit_cast<int64_t>(z.imag())});
    } else if (v.isNone()) {
      key.push_back(5);
    } else {
      return false;
    }
    return true;
  };
  for (size_t i = 0; i < traits.arg.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    if (v.isTensor()) {
      key.push_back(10);
      tensor(v.toTensor());
    } else if (v.isTensorList()) {
      key.append({11, static_cast<int64_t>(v.toTensorList().size())});
      for (const at::Tensor& t : v.toTensorList()) tensor(t);
    } else if (v.isList() && (traits.arg[i] & OpTraits::kOptionalTensorList)) {
      key.append({12, static_cast<int64_t>(v.toListRef().size())});
      for (const c10::IValue& e : v.toListRef()) tensor(e.isTensor() ? e.toTensor() : at::Tensor());
    } else if (v.isIntList() || v.isDoubleList() || v.isBoolList()) {
      key.append({13, static_cast<int64_t>(v.toListRef().size())});
      for (const c10::IValue& e : v.toListRef()) number(e);
    } else if (v.isDevice()) {
      key.append({14, static_cast<int64_t>(v.toDevice().type()), v.toDevice().index()});
    } else if (!number(v)) {
      return false;  // strings, generators, symbolic values, ...: not kept
    }
  }
  return true;
}

// Whether the kernel of an out= form may change the geometry of an out= argument
// (ATen's resize_output: an out tensor of the wrong shape). Such a change must reach the
// caller's tensor before the call returns, as when the kernel runs synchronously, so the
// call cannot be queued. The op's Meta kernel tells (yes without one). Many are Python
// functions (torch._meta_registrations): the answers are kept per thread, for each
// operator and encode_call of its arguments, so a loop asks once per shape.
bool may_resize_outs(const c10::OperatorHandle& op, const OpTraits& traits, const torch::jit::Stack& stack,
                     size_t begin) {
  if (!traits.has_meta) return true;
  struct Answer {
    std::vector<int64_t> key;
    bool resizes;
  };
  thread_local std::unordered_multimap<uint64_t, Answer> answers;
  constexpr size_t kMaxAnswers = 8192;
  c10::SmallVector<int64_t, 64> key;
  key.push_back(reinterpret_cast<intptr_t>(&op.schema()));
  if (!encode_call(traits, stack, begin, key)) return meta_resizes_outs(op, traits, stack, begin);
  uint64_t hash = 14695981039346656037ull;
  for (int64_t k : key) hash = (hash ^ static_cast<uint64_t>(k)) * 1099511628211ull;
  const auto [first, last] = answers.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    if (std::equal(key.begin(), key.end(), it->second.key.begin(), it->second.key.end())) return it->second.resizes;
  }
  const bool resizes = meta_resizes_outs(op, traits, stack, begin);
  if (answers.size() >= kMaxAnswers) answers.clear();
  answers.emplace(hash, Answer{std::vector<int64_t>(key.begin(), key.end()), resizes});
  return resizes;
}

// The arguments of a recorded kernel, copied for one replay (the call consumes its
// stack) into a per-thread vector that keeps its capacity: no allocation per replay.
class ReplayStack {
 public:
  explicit ReplayStack(const torch::jit::Stack& args) {
    stack_.swap(spare());  // a nested replay on this thread finds an empty spare
    stack_.assign(args.begin(), args.end());
  }
  ~ReplayStack() {
    stack_.clear();
    spare().swap(stack_);
  }
  torch::jit::Stack* get() { return &stack_; }

 private:
  static torch::jit::Stack& spare() {
    thread_local torch::jit::Stack s;
    return s;
  }
  torch::jit::Stack stack_;
};

// A CPU tensor the caller owns could change before a queued kernel reads it: copy it.
// Python numbers (wrapped numbers) are the call's own.
void clone_cpu_tensors(c10::IValue& v) {
  auto owned = [](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && !t.unsafeGetTensorImpl()->is_wrapped_number();
  };
  if (v.isTensor()) {
    if (owned(v.toTensor())) v = v.toTensor().clone();
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    if (std::none_of(list.begin(), list.end(), [&](const at::Tensor& t) { return owned(t); })) return;
    c10::List<at::Tensor> copy;  // a new list: the caller's list object stays as it is
    for (const at::Tensor& t : list) copy.push_back(owned(t) ? t.clone() : t);
    v = std::move(copy);
  } else if (v.isList()) {  // Tensor?[]
    auto list = v.toList();
    bool any = false;
    for (const c10::IValue& e : list) any |= e.isTensor() && owned(e.toTensor());
    if (!any) return;
    c10::List<std::optional<at::Tensor>> copy;
    for (const c10::IValue& e : list) {
      if (e.isTensor()) {
        copy.push_back(owned(e.toTensor()) ? e.toTensor().clone() : e.toTensor());
      } else {
        copy.push_back(std::nullopt);
      }
    }
    v = std::move(copy);
  }
}

// While a stream captures, an op whose outputs its CPU kernel allocates cannot be
// queued (its outputs must exist when the call returns) nor run after queued work
// (nothing captured runs). It runs once here, on the host, to learn its outputs, which
// are allocated in the graph's pool; written arguments get their bytes back afterwards
// (nothing may change during a capture). The recorded task re-runs the kernel and
// copies what it produces into those outputs (record_functional). Data-dependent ops
// (nonzero & co) would need the host to read device data: they invalidate the capture
// with an error.
torch::jit::Stack capture_run(const c10::OperatorHandle& op, c10::DeviceIndex device, const NPUStream& stream,
                              torch::jit::Stack* stack, size_t args_begin, const std::vector<WrittenArg>& written,
                              int64_t max_numel) {
  const auto& schema = op.schema();
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  if (op.hasTag(at::Tag::dynamic_output_shape) || op.hasTag(at::Tag::data_dependent_output)) {
    fail_capture(stream, name + " cannot be captured into an NPU graph: its output depends on tensor values "
                                "that the host would have to read (a synchronisation with the capturing stream)");
  }
  // What the kernel may write: the written arguments, and the running statistics that
  // native_batch_norm updates although its schema does not say so.
  std::vector<at::Tensor> targets;
  for (const auto& w : written) targets.push_back(w.alias);
  if (schema.name() == "aten::native_batch_norm") {
    for (size_t i : {size_t(3), size_t(4)}) {
      const c10::IValue& v = (*stack)[args_begin + i];
      if (v.isTensor() && v.toTensor().defined()) targets.push_back(v.toTensor());
    }
  }
  std::vector<at::Tensor> saved;
  saved.reserve(targets.size());
  for (const auto& t : targets) saved.push_back(t.clone());  // host memory
  torch::jit::Stack args(stack->begin() + args_begin, stack->end());
  // This run draws from copies of the generators: the numbers are the replays' to draw
  // (multinomial replayed after manual_seed gives eager's numbers).
  for (auto it = stack->begin() + args_begin; it != stack->end(); ++it) {
    if (it->isGenerator()) *it = it->toGenerator().clone();
  }
  try {
    KernelScope scope(device);
    SerialBlasScope blas(max_numel);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (const std::exception& e) {
    fail_capture(stream, name + " cannot be captured into an NPU graph: running it during the capture to learn "
                                "its outputs failed: " + e.what());
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].sizes() == saved[i].sizes()) targets[i].copy_(saved[i]);
  }
  return args;
}

// Records the replay task of a capture_run op whose results (npu tensors, the last
// `num_returns` values of `stack`) are its captured outputs.
void record_functional(const c10::OperatorHandle& op, c10::DeviceIndex device, const NPUStream& stream,
                       torch::jit::Stack args, const torch::jit::Stack& stack, size_t num_returns,
                       int64_t max_numel) {
  // Results over an argument's memory (views) are updated by the kernel itself.
  std::vector<const void*> arg_data;
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined()) arg_data.push_back(v.toTensor().storage().data());
  }
  auto fresh = [&](const at::Tensor& t) {
    return t.defined() && t.numel() > 0 && !t._is_zerotensor() &&
           std::find(arg_data.begin(), arg_data.end(), t.storage().data()) == arg_data.end();
  };
  struct Out {
    size_t ret;
    int64_t index;     // in a Tensor[] result, or -1
    at::Tensor alias;  // CPU alias of the captured npu output (holds its storage)
  };
  std::vector<Out> outs;
  AliasMap aliases(device);
  const size_t first_ret = stack.size() - num_returns;
  for (size_t r = 0; r < num_returns; ++r) {
    const c10::IValue& v = stack[first_ret + r];
    if (v.isTensor() && fresh(v.toTensor())) {
      outs.push_back({r, -1, aliases.alias(v.toTensor())});
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        if (fresh(list.get(i))) outs.push_back({r, static_cast<int64_t>(i), aliases.alias(list.get(i))});
      }
    }
  }
  launch(stream, op.schema().name().c_str(),
         [op, device, args = std::move(args), outs = std::move(outs), num_returns, max_numel] {
           KernelScope scope(device);
           SerialBlasScope blas(max_numel, true);
           ReplayStack replay(args);
           torch::jit::Stack& s = *replay.get();
           op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
           const size_t first = s.size() - num_returns;
           for (const Out& o : outs) {
             const c10::IValue& v = s[first + o.ret];
             at::Tensor produced = o.index < 0 ? v.toTensor() : v.toTensorList().get(static_cast<size_t>(o.index));
             TORCH_CHECK(produced.sizes() == o.alias.sizes(), op.schema().name(), ": output ", o.ret, " has shape ",
                         produced.sizes(), " on replay but had ", o.alias.sizes(),
                         " when the graph was captured");
             o.alias.copy_(produced);
           }
         });
}

// The operator and the dtypes of its tensor arguments, as one number. A CPU kernel refuses
// a dtype (AT_DISPATCH's "... not implemented for 'Bool'") only when it runs, where torch_npu's
// aclnn operators refuse it at the call (aclnnXxxGetWorkspaceSize). So the first call of each
// signature runs synchronously and raises such an error at the call, as synchronous mode
// does; once a signature has run, its later calls may be queued (proven_signatures).
uint64_t dtype_signature(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t begin,
                         size_t num_args) {
  uint64_t h = reinterpret_cast<uintptr_t>(&schema) * 0x9E3779B97F4A7C15ull;
  auto mix = [&h](uint64_t v) { h = (h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2))) * 0xBF58476D1CE4E5B9ull; };
  auto tensor = [&mix](const at::Tensor& t) { mix(t.defined() ? static_cast<uint64_t>(t.scalar_type()) + 1 : 0); };
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = stack[begin + i];
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTensorList()) {
      mix(1000 + v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList()) tensor(t);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) tensor(e.isTensor() ? e.toTensor() : at::Tensor());
    } else if (v.isScalar()) {
      mix(2000 + static_cast<uint64_t>(v.toScalar().type()));  // a Python number's kind decides the dtype too
    } else {
      mix(3000);
    }
  }
  return h;
}

std::unordered_set<uint64_t>& proven_signatures() {
  thread_local std::unordered_set<uint64_t> proven;
  return proven;
}

// A kernel waiting on a stream: the aliased arguments and what it writes.
struct QueuedKernel {
  QueuedKernel(const c10::OperatorHandle& op, c10::DeviceIndex device, int64_t max_numel)
      : op(op), device(device), max_numel(max_numel) {}
  c10::OperatorHandle op;
  c10::DeviceIndex device;
  int64_t max_numel;
  torch::jit::Stack stack;
  std::vector<WrittenArg> written;
};

void npu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const OpTraits& traits = traits_of(schema);
  const size_t num_args = traits.arg.size();
  const size_t args_begin = stack->size() - num_args;

  CallScan scan;
  std::optional<c10::DeviceIndex> device_arg;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[args_begin + i];
    if (v.isTensor()) {
      scan.tensor(v.toTensor(), op, false);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) scan.tensor(t, op, false);
    } else if (v.isList() && (traits.arg[i] & OpTraits::kOptionalTensorList)) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) scan.tensor(e.toTensor(), op, true);
      }
    } else if (v.isGenerator()) {
      scan.has_generator = true;
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      device_arg = v.toDevice().has_index() ? v.toDevice().index() : current_device();
    } else if (v.isNone() && (traits.arg[i] & OpTraits::kOptionalGenerator)) {
      scan.has_generator = true;
    }
  }
  if (C10_UNLIKELY(unsafe_data_check_enabled()) && !in_kernel()) {
    for (size_t i = 0; i < num_args; ++i) {
      const c10::IValue& v = (*stack)[args_begin + i];
      if (v.isTensor()) {
        check_data_safe(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) check_data_safe(t);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef())
          if (e.isTensor()) check_data_safe(e.toTensor());
      }
    }
  }
  if (traits.dtypes != kAnyDtype) check_dtypes(traits, schema, *stack, args_begin);
  const c10::DeviceIndex device = scan.device >= 0 ? scan.device : device_arg.value_or(current_device());
  if (scan.cpu_mixed && scan.device >= 0) fail_cpu_operand(schema.name().c_str(), device, *scan.cpu_mixed);

  // Results that are written arguments (in-place and out= forms) are the caller's tensors.
  const auto& return_arg = traits.return_arg;
  bool all_written = true;
  for (int i : return_arg) all_written &= i >= 0 && (*stack)[args_begin + i].isTensor();
  c10::SmallVector<c10::IValue, 4> results;
  for (int i : return_arg) results.push_back(i >= 0 ? (*stack)[args_begin + i] : c10::IValue());

  // Asynchronous when every result is such an argument (where structured ops'
  // functional forms land) and nothing ties the kernel to host state: generators, CPU
  // tensors, an out=empty(0) the kernel will resize. While the stream captures, all
  // such kernels are recorded (generators and copies of CPU tensors go with them).
  NPUStream stream = getCurrentNPUStream(device);
  const bool capture = !in_kernel() && isStreamRecording(stream);
  bool async = all_written && !scan.has_tiled &&
               (capture || (task_queue_enabled() && !in_kernel() && !scan.has_generator && !scan.has_cpu_tensor));
  for (size_t r = 0; async && r < results.size(); ++r) async = results[r].toTensor().numel() > 0;
  // Whether a signature runs synchronously the first time (proven_signatures) is decided
  // for every call that could queue, so a first call run inline below proves it too.
  const uint64_t signature = async && !capture ? dtype_signature(schema, *stack, args_begin, num_args) : 0;
  if (signature != 0 && !proven_signatures().count(signature)) async = false;
  // Run right here (runs_on_caller): a small kernel on an idle stream, a parallel one always.
  if (async && !capture && runs_on_caller(stream, scan.max_numel)) async = false;
  // An out= argument the kernel resizes: synchronously (while capturing, run once to learn
  // the new geometry, as a functional op).
  if (async && traits.has_out && may_resize_outs(op, traits, *stack, args_begin)) async = false;

  if (async || capture) {
    for (size_t i = args_begin; i < stack->size(); ++i) clone_cpu_tensors((*stack)[i]);
  }
  AliasMap aliases(device);
  if (async && !capture) aliases.borrow_stream_ordered_memory();
  std::vector<WrittenArg> written;
  to_cpu_arguments(traits, *stack, args_begin, device, scan.max_numel, aliases, written);

  if (async) {
    // The aliases point at memory the caching allocator hands out in stream order, so
    // the CPU kernel can run later on the stream's worker.
    auto queued = std::make_shared<QueuedKernel>(op, device, scan.max_numel);
    queued->stack.assign(std::make_move_iterator(stack->begin() + args_begin),
                         std::make_move_iterator(stack->end()));

    queued->written = std::move(written);
    for (auto& w : queued->written) w.npu_storage = c10::Storage();  // only sync_back needs it
    stack->erase(stack->begin() + args_begin, stack->end());
    launch(stream, schema.name().c_str(), [queued, capture] {
      KernelScope scope(queued->device);
      SerialBlasScope blas(queued->max_numel, true);
      if (capture) {
        ReplayStack replay(queued->stack);  // every replay runs on the same arguments
        queued->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), replay.get());
      } else {
        queued->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &queued->stack);
      }
      // may_resize_outs said no written argument changes shape: the caller's tensors
      // keep theirs (changing them here would race with the host, which already uses them).
      for (const auto& w : queued->written) {
        TORCH_CHECK(!w.reshaped(), queued->op.schema().name(), " changed the shape of a written argument from ",
                    c10::IntArrayRef(w.sizes), " to ", w.alias.sizes(),
                    " on the stream, after the call returned (a torch_npu defect: please report it; "
                    "TASK_QUEUE_ENABLE=0 avoids it)");
      }
    });
    for (auto& r : results) stack->push_back(std::move(r));
    return;
  }

  torch::jit::Stack captured_args;
  if (capture) {
    captured_args = capture_run(op, device, stream, stack, args_begin, written, scan.max_numel);
  } else {
    run_now(schema.name().c_str(), device, scan.max_numel,
            [&op, stack] { op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack); });
    if (signature != 0) proven_signatures().insert(signature);
  }
  for (const auto& w : written) aliases.sync_back(w);
  // Tensors in tiled formats ran through untiled copies. All go back, not only the
  // written arguments: native_batch_norm updates its running statistics in place
  // although its schema does not say so.
  aliases.store_untiled();
  // Other results map back to npu by storage: views of arguments, fresh NPU buffers.
  results_to_npu(*stack, return_arg, results, [&aliases](const at::Tensor& t) { return aliases.to_npu(t); });
  if (capture) {
    record_functional(op, device, stream, std::move(captured_args), *stack, return_arg.size(), scan.max_numel);
  }
}

}  // namespace

void zero_copy_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  npu_fallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
}

namespace {

// The hottest functional ops. PyTorch's structured wrapper would infer the output
// (a TensorIterator build), allocate it and queue the .out form, where the CPU kernel
// infers it again. Small operands on an idle stream instead run the CPU functional
// kernel right away, on their aliases: shape inference once, and no boxed stack (its
// copies of the caller's tensors would take the GIL: torch increfs the Python object of
// a tensor whose C++ refcount goes from 1 to 2, and the Python bindings call ops without
// the GIL). Operands the boxed fallback must check or copy (other devices, dtypes the op
// table excludes, tiled formats) take the structured path, which ends there.
bool small_operands_on_idle_stream(const at::Tensor& a, const at::Tensor& b) {
  // (with the unsafe-data check on, the boxed fallback checks the operands)
  if (in_kernel() || unsafe_data_check_enabled()) return false;
  const at::Tensor& t = is_npu(a) ? a : b;
  if (!is_npu(t)) return false;
  NPUStream stream = getCurrentNPUStream(t.device().index());
  const int64_t numel = std::max(a.numel(), b.numel());
  return !isStreamRecording(stream) && numel <= kInlineNumel && runs_on_caller(stream, numel);
}

// An operand the CPU kernel takes as it is (a Python number: a 0-dim CPU tensor) or as
// its alias (an npu tensor of `device` in a plain layout and a dtype the op takes).
bool direct_operand(const at::Tensor& t, c10::DeviceIndex device, uint64_t dtypes) {
  if (!is_npu(t)) return t.defined() && t.device().is_cpu() && t.dim() == 0;
  return t.device().index() == device && tiled_storage(t) == nullptr && (dtypes & dtype_bit(t.scalar_type())) != 0;
}

// Runs the functional op `name` on tensors a, b (one of them on npu) and `rest` as said
// above; nullopt (nothing done) when an operand is not a direct_operand.
template <typename... Rest>
std::optional<at::Tensor> run_direct(const char* name, const char* overload, const at::Tensor& a, const at::Tensor& b,
                                     const Rest&... rest) {
  using Fn = at::Tensor(const at::Tensor&, const at::Tensor&, const Rest&...);
  struct Op {
    c10::TypedOperatorHandle<Fn> handle;
    uint64_t dtypes;  // what the op table allows
  };
  static thread_local std::unordered_map<const char*, Op> ops;
  auto it = ops.find(name);
  if (it == ops.end()) {
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    it = ops.emplace(name, Op{op.typed<Fn>(), allowed_dtypes(op.schema().operator_name())}).first;
  }
  const Op& op = it->second;
  const c10::DeviceIndex device = (is_npu(a) ? a : b).device().index();
  if (!direct_operand(a, device, op.dtypes) || !direct_operand(b, device, op.dtypes)) return std::nullopt;
  AliasMap aliases(device);
  const at::Tensor cpu_a = is_npu(a) ? aliases.alias(a) : a;
  const at::Tensor cpu_b = is_npu(b) ? aliases.alias(b) : b;
  // run_now's inline case without its checks, which small_operands_on_idle_stream made (nothing
  // queued, no capture), nor its MKL thread setting (no BLAS here): the wait only collects
  // finished kernels and raises a failed one's error.
  const NPUStream stream = getCurrentNPUStream(device);
  wait_stream(stream);
  at::Tensor out;
  {
    InlineKernelRecord record(name, stream);
    KernelScope scope(device);  // the output in NPU memory
    out = op.handle.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), cpu_a, cpu_b, rest...);
  }
  return aliases.to_npu(out);
}

at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  check_no_cpu_operand("aten::add", self, other);
  if (small_operands_on_idle_stream(self, other)) {
    if (auto out = run_direct("aten::add", "Tensor", self, other, alpha)) return *std::move(out);
  }
  return at::compositeexplicitautogradnonfunctional::add(self, other, alpha);
}
at::Tensor sub_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  check_no_cpu_operand("aten::sub", self, other);
  if (small_operands_on_idle_stream(self, other)) {
    if (auto out = run_direct("aten::sub", "Tensor", self, other, alpha)) return *std::move(out);
  }
  return at::compositeexplicitautogradnonfunctional::sub(self, other, alpha);
}
at::Tensor mul_tensor(const at::Tensor& self, const at::Tensor& other) {
  check_no_cpu_operand("aten::mul", self, other);
  if (small_operands_on_idle_stream(self, other)) {
    if (auto out = run_direct("aten::mul", "Tensor", self, other)) return *std::move(out);
  }
  return at::compositeexplicitautogradnonfunctional::mul(self, other);
}
at::Tensor div_tensor(const at::Tensor& self, const at::Tensor& other) {
  check_no_cpu_operand("aten::div", self, other);
  if (small_operands_on_idle_stream(self, other)) {
    if (auto out = run_direct("aten::div", "Tensor", self, other)) return *std::move(out);
  }
  return at::compositeexplicitautogradnonfunctional::div(self, other);
}

at::Tensor div_tensor_mode(const at::Tensor& self, const at::Tensor& other,
                           std::optional<c10::string_view> rounding_mode) {
  check_rounding_mode(rounding_mode);
  check_no_cpu_operand("aten::div", self, other);
  return at::compositeexplicitautogradnonfunctional::div(self, other, rounding_mode);
}
at::Tensor& div__tensor_mode(at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> rounding_mode) {
  check_rounding_mode(rounding_mode);
  check_no_cpu_operand("aten::div_", self, other);
  return at::compositeexplicitautogradnonfunctional::div_(self, other, rounding_mode);
}
// div.out_mode: the check, then the zero-copy kernel.
void div_out_mode_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::IValue& mode = (*stack)[stack->size() - op.schema().arguments().size() + 2];
  check_rounding_mode(mode.isNone() ? std::nullopt : std::optional<c10::string_view>(mode.toStringView()));
  npu_fallback(op, keys, stack);
}

// torch_npu's histc (aclnnHistc) also counts integer tensors, into a result of the input's
// dtype, as CUDA's does (transformers' MoE routing passes int32 expert ids on every device
// but cpu and mps); ATen's CPU kernel takes floating types only. Integers are counted as
// doubles (exact up to 2^53), the counts cast back; floating inputs take the CPU kernel.
void histc_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t n_args = op.schema().arguments().size();  // histc: 4, histc.out: 5
  const size_t first = stack->size() - n_args;
  const at::Tensor self = (*stack)[first].toTensor();
  if (!at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    npu_fallback(op, keys, stack);
    return;
  }
  const int64_t bins = (*stack)[first + 1].toInt();
  const at::Scalar min = (*stack)[first + 2].toScalar(), max = (*stack)[first + 3].toScalar();
  at::Tensor counts = at::histc(self.to(at::kDouble), bins, min, max);
  at::Tensor result;
  if (n_args == 5) {
    result = (*stack)[first + 4].toTensor();
    TORCH_CHECK(result.scalar_type() == self.scalar_type(), "histc.out: expected out of dtype ", self.scalar_type(),
                " (the input's), got ", result.scalar_type());
    at::native::resize_output(result, counts.sizes());
    result.copy_(counts);
  } else {
    result = counts.to(self.scalar_type());
  }
  torch::jit::drop(*stack, n_args);
  torch::jit::push(*stack, std::move(result));
}

// Huawei's aclnn losses take int32 class targets, and put_ int32 indices; ATen's CPU kernels
// only int64 (and uint8 for nll_loss): an int32 npu target or index is taken as int64.
void int_target_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if ((args[i].name() == "target" || args[i].name() == "index") && v.isTensor() && is_npu(v.toTensor()) &&
        v.toTensor().scalar_type() == at::kInt) {
      v = v.toTensor().to(at::kLong);
    }
  }
  npu_fallback(op, keys, stack);
}

// _softmax / _log_softmax with half_to_float (a float32 result of a half input), which
// aclnn computes and ATen's CPU kernel refuses: the kernel runs on the input cast to float32.
void half_to_float_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 4;  // self, dim, half_to_float, out
  if ((*stack)[first + 2].toBool()) {
    (*stack)[first] = (*stack)[first].toTensor().to(at::kFloat);
    (*stack)[first + 2] = false;
  }
  npu_fallback(op, keys, stack);
}

// Their backward with a float32 gradient for a half input: computed in float32, written
// into the half grad_input.
void half_to_float_backward_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                   torch::jit::Stack* stack) {
  const size_t first = stack->size() - 5;  // grad_output, output, dim, input_dtype, out
  const at::Tensor grad = (*stack)[first].toTensor();
  const auto input_dtype = static_cast<at::ScalarType>((*stack)[first + 3].toInt());
  if (grad.scalar_type() == input_dtype) {
    npu_fallback(op, keys, stack);
    return;
  }
  const at::Tensor out = (*stack)[first + 4].toTensor();
  at::Tensor wide = at::empty_like(out, out.options().dtype(grad.scalar_type()));
  (*stack)[first + 3] = static_cast<int64_t>(grad.scalar_type());
  (*stack)[first + 4] = wide;
  npu_fallback(op, keys, stack);
  torch::jit::drop(*stack, 1);
  out.copy_(wide);
  torch::jit::push(*stack, out);
}


bool low_precision_float(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

// Operators that torch_npu's aclnn kernels compute in float16/bfloat16 with float32
// arithmetic inside (vector units upcast; the cube accumulates in float32), where ATen's CPU
// kernel either has no such dtype ("not implemented for 'Half'") or accumulates in the low
// precision itself (the slow convolutions): the float16/bfloat16 tensor arguments are cast
// to float32, the kernel (`inner`) runs on those, and its floating results are rounded
// back once to the low dtype. Arguments the operator writes (out=, in-place, rrelu's
// noise) get float32 stand-ins whose results are copied back into them, and the operator
// returns the caller's tensors.
void float32_compute(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack,
                     void (*inner)(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*)) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  std::optional<at::ScalarType> low;
  for (size_t i = 0; i < args.size() && !low; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (v.isTensor() && low_precision_float(v.toTensor())) low = v.toTensor().scalar_type();
  }
  if (!low) {
    inner(op, keys, stack);
    return;
  }
  // (argument index, the caller's tensor, its float32 stand-in) of the written arguments
  std::vector<std::tuple<size_t, at::Tensor, at::Tensor>> written;
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (!v.isTensor() || !low_precision_float(v.toTensor())) continue;
    const at::Tensor caller = v.toTensor();
    at::Tensor wide = caller.to(at::kFloat);
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) written.emplace_back(i, caller, wide);
    v = wide;
  }
  inner(op, keys, stack);
  for (auto& [i, caller, wide] : written) {
    if (caller.sizes() != wide.sizes()) at::native::resize_output(caller, wide.sizes());
    caller.copy_(wide);
  }
  const auto& returns = op.schema().returns();
  for (size_t r = 0; r < returns.size(); ++r) {
    c10::IValue& v = (*stack)[stack->size() - returns.size() + r];
    if (!v.isTensor()) continue;
    bool aliased = false;
    if (const auto* alias = returns[r].alias_info()) {
      for (auto& [i, caller, wide] : written) {
        if (args[i].alias_info()->beforeSets() == alias->beforeSets()) {
          v = caller;
          aliased = true;
          break;
        }
      }
    }
    if (!aliased && v.toTensor().defined() && v.toTensor().scalar_type() == at::kFloat) v = v.toTensor().to(*low);
  }
}

void float32_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  float32_compute(op, keys, stack, &npu_fallback);
}

void float32_int_target_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  float32_compute(op, keys, stack, &int_target_kernel);
}

// native_batch_norm in inference: ATen's CPU kernel returns save_mean / save_invstd of shape
// [0]; torch_npu (and ATen's meta function) give [num_features], which inference leaves unfilled.
void batch_norm_inference_saves_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                       torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  const at::Tensor input = (*stack)[first].toTensor();
  const bool training = (*stack)[first + 5].toBool();
  npu_fallback(op, keys, stack);
  if (training || input.dim() < 2) return;
  for (size_t r = stack->size() - 2; r < stack->size(); ++r) {
    if ((*stack)[r].toTensor().numel() == 0) (*stack)[r] = at::empty({input.size(1)}, input.options());
  }
}

int64_t concrete_int(const c10::IValue& v) {
  return v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
}

// The FFT operators (_fft_c2c, _fft_r2c, _fft_c2r, and their out= forms): the plan of the
// transform goes through torch_npu's plan cache (torch.npu.backends.fft_plan_cache), then ATen's
// CPU FFT runs zero-copy.
void fft_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  namespace fpc = fft_plan_cache;
  const size_t first = stack->size() - op.schema().arguments().size();
  const at::Tensor self = (*stack)[first].toTensor();
  const c10::IValue& dim_arg = (*stack)[first + 1];
  std::vector<int64_t> dims;
  if (dim_arg.isIntList()) {
    dims = dim_arg.toIntVector();
  } else {
    for (const c10::IValue& d : dim_arg.toListRef()) dims.push_back(concrete_int(d));
  }
  const std::string& name = op.schema().name();  // aten::_fft_c2c, ...
  fpc::PlanKey key{fpc::Kind::C2C, {}, true, self.scalar_type()};
  if (name == "aten::_fft_r2c") {
    key.kind = fpc::Kind::R2C;
  } else if (name == "aten::_fft_c2r") {
    key.kind = fpc::Kind::C2R;
    key.forward = false;
  } else {
    key.forward = (*stack)[first + 3].toBool();
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = c10::maybe_wrap_dim(dims[i], self.dim());
    const bool last = i + 1 == dims.size();
    key.signal_sizes.push_back(key.kind == fpc::Kind::C2R && last ? concrete_int((*stack)[first + 3]) : self.size(d));
  }
  fpc::use(key);
  npu_fallback(op, keys, stack);
}

// _embedding_bag, _embedding_bag_forward_only: per_sample_weights must have weight's dtype.
// The device kernels (torch_npu's, CUDA's) report a mismatch as "expected scalar type ...";
// then ATen's CPU kernel runs zero-copy.
void embedding_bag_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  const c10::IValue& weights = (*stack)[first + 6];  // per_sample_weights
  if (weights.isTensor() && weights.toTensor().defined()) {
    const auto expected = (*stack)[first].toTensor().scalar_type();
    const auto found = weights.toTensor().scalar_type();
    TORCH_CHECK(found == expected, "expected scalar type ", expected, " but found ", found,
                " (embedding_bag: per_sample_weights must have the dtype of weight)");
  }
  npu_fallback(op, keys, stack);
}

// The operators float32_kernel serves (ops/npu_native_functions.yaml marks them native;
// overloads torch_npu does not register take its CPU fallback instead).
constexpr const char* kFloat32ComputeOps[] = {
    // no float16/bfloat16 CPU kernel (the functional forms of the structured ones take
    // PyTorch's composite kernel, which calls their .out overload)
    "avg_pool3d.out", "avg_pool3d_backward.grad_input", "_cdist_forward", "_cdist_backward",
    "_upsample_bicubic2d_aa.out", "_upsample_bicubic2d_aa_backward.grad_input", "_upsample_bilinear2d_aa.out",
    "_upsample_bilinear2d_aa_backward.grad_input", "_ctc_loss", "_ctc_loss_backward",
    "rrelu_with_noise", "rrelu_with_noise.out", "rrelu_with_noise_",
    // the CPU's slow convolutions accumulate in the low precision; torch_npu runs them as aclnnConvolution
    "slow_conv_transpose2d.out", "_slow_conv2d_forward", "_slow_conv2d_forward.output",
    "_slow_conv2d_backward.output_mask", "slow_conv3d_forward", "slow_conv3d_forward.output", "slow_conv_dilated2d",
    // a composite kernel (log-sigmoid, products, mean) that rounds after every step; aclnn computes in float32
    "binary_cross_entropy_with_logits",
    // the CPU kernel adds into the low-precision result one source row at a time (repeat_interleave's
    // and index_select's backward sum many rows); aclnnIndexAdd accumulates in float32
    "index_add", "index_add.out",
    // interpolations whose CPU kernel rounds the weighted sums in the low precision (up to a few ulps)
    "upsample_linear1d.out", "upsample_bicubic2d.out", "upsample_trilinear3d.out",
};
}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Through PyTorch's generic structured wrapper, mse_loss(reduction="mean") would call
  // mse_loss.out with a 0-dim output that the CPU kernel resizes, warning on every call.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  for (const char* name : kFloat32ComputeOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&float32_kernel>());
  }
  for (const char* name : {"_fft_c2c", "_fft_c2c.out", "_fft_r2c", "_fft_r2c.out", "_fft_c2r", "_fft_c2r.out"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fft_kernel>());
  }
  m.impl("native_batch_norm", torch::CppFunction::makeFromBoxedFunction<&batch_norm_inference_saves_kernel>());
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc_kernel>());
  for (const char* name : {"_embedding_bag", "_embedding_bag_forward_only"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&embedding_bag_kernel>());
  }
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&histc_kernel>());
  // (multilabel_margin_loss_backward takes torch_npu's CPU fallback, whose kernel wants int64 targets.)
  for (const char* name : {"nll_loss_backward", "nll_loss_backward.grad_input", "nll_loss2d_backward",
                           "nll_loss2d_backward.grad_input", "put_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&int_target_kernel>());
  }
  // the losses' sums over many rows: float16/bfloat16 accumulated in float32, as aclnn (the CPU
  // kernel sums in the low precision)
  for (const char* name : {"nll_loss_forward", "nll_loss_forward.output", "nll_loss2d_forward",
                           "nll_loss2d_forward.output"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&float32_int_target_kernel>());
  }
  // multilabel_margin_loss: int32 targets, and no float16 CPU kernel
  // (its backward is not registered by torch_npu: it falls back to the CPU)
  for (const char* name : {"multilabel_margin_loss_forward", "multilabel_margin_loss_forward.output"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&float32_int_target_kernel>());
  }
  m.impl("_softmax.out", torch::CppFunction::makeFromBoxedFunction<&half_to_float_kernel>());
  m.impl("_log_softmax.out", torch::CppFunction::makeFromBoxedFunction<&half_to_float_kernel>());
  m.impl("_softmax_backward_data.out", torch::CppFunction::makeFromBoxedFunction<&half_to_float_backward_kernel>());
  m.impl("_log_softmax_backward_data.out",
         torch::CppFunction::makeFromBoxedFunction<&half_to_float_backward_kernel>());
  // These have a CPU kernel and also a CompositeExplicitAutograd one (math_*), which the
  // generator leaves to PyTorch, so on npu they ran decomposed: other rounding, and
  // layer/group norm's mean and rstd in the input dtype where the CPU gives float32.
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("addr", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("addr.out", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("add.Tensor", TORCH_FN(add_tensor));
  m.impl("sub.Tensor", TORCH_FN(sub_tensor));
  m.impl("mul.Tensor", TORCH_FN(mul_tensor));
  m.impl("div.Tensor", TORCH_FN(div_tensor));
  m.impl("div.Tensor_mode", TORCH_FN(div_tensor_mode));
  m.impl("div_.Tensor_mode", TORCH_FN(div__tensor_mode));
  m.impl("div.out_mode", torch::CppFunction::makeFromBoxedFunction<&div_out_mode_kernel>());
}

}  // namespace torch_npu::ops
