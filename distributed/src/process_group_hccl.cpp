#include "torch_npu/distributed/process_group_hccl.h"

#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

#include "algorithms.h"
#include "comm.h"
#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/ops/formats.h"
#include "torch_npu/ops/zero_copy.h"

namespace torch_npu::distributed {

struct CommState {  // first asynchronous failure of the group: later calls raise it at once
  std::mutex mu;
  std::exception_ptr error;
};

namespace {

constexpr auto kNPU = c10::DeviceType::PrivateUse1;
using std::chrono::milliseconds;

milliseconds env_seconds(const char* name, milliseconds dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  TORCH_CHECK(end && *end == '\0' && s > 0, "hccl: ", name, "=", v, " is not a positive number of seconds");
  return milliseconds(static_cast<int64_t>(s * 1000));
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

// NSLB_CP (torch_npu's input to the network load balancer, NSLB): the first
// NSLB_MAX_RECORD_NUM (default 1000) operations of each group are recorded, one line
// "<op> <input bytes> <global rank>" each, in <NSLB_CP>/<MASTER_ADDR>_<communicator>_<RANK>.log
// (headed "HCCL_ALGO=..." when set); then <NSLB_CP>/end_<MASTER_ADDR>_<pid>.log marks the
// end, after which the process records nothing more.
struct Nslb {
  const char* dir = std::getenv("NSLB_CP");
  int64_t limit = [] {
    const char* v = std::getenv("NSLB_MAX_RECORD_NUM");
    return v && *v ? std::strtol(v, nullptr, 10) : 1000;
  }();
  std::atomic<bool> ended{false};
  std::mutex mu;
};

Nslb& nslb() {
  static Nslb n;
  return n;
}

std::string nslb_file(const std::string& name) {
  Nslb& n = nslb();
  // every rank may make it at once: one mkdir wins, the others see EEXIST
  const int made = mkdir(n.dir, S_IRWXU | S_IRGRP | S_IXGRP) == 0 ? 0 : errno;
  TORCH_CHECK(made == 0 || made == EEXIST, "hccl: NSLB_CP=", n.dir, ": the directory cannot be made: ",
              std::strerror(made));
  TORCH_CHECK(access(n.dir, W_OK) == 0, "hccl: NSLB_CP=", n.dir, ": the directory cannot be written to");
  return std::string(n.dir) + "/" + name;
}

void nslb_record(const char* op, const std::vector<at::Tensor>& inputs, uint64_t seq, const std::string& comm) {
  Nslb& n = nslb();
  if (n.dir == nullptr || n.ended.load()) return;
  const char* master = std::getenv("MASTER_ADDR");
  const char* rank = std::getenv("RANK");
  TORCH_CHECK(master != nullptr, "hccl: NSLB_CP is set but MASTER_ADDR is not (NSLB names its files after it)");
  TORCH_CHECK(rank != nullptr, "hccl: NSLB_CP is set but RANK (the global rank NSLB records) is not");
  std::lock_guard<std::mutex> lock(n.mu);
  if (static_cast<int64_t>(seq) <= n.limit) {
    uint64_t volume = 0;
    for (const auto& t : inputs) volume += t.storage().nbytes();
    const std::string path = nslb_file(std::string(master) + "_" + comm + "_" + rank + ".log");
    const char* algo = std::getenv("HCCL_ALGO");
    const bool fresh = access(path.c_str(), F_OK) != 0;
    std::ofstream out(path, std::ios::app);
    TORCH_CHECK(out.good(), "hccl: NSLB_CP: cannot write ", path);
    if (fresh && algo != nullptr) out << "HCCL_ALGO=" << algo << "\n";
    out << (std::strncmp(op, "hccl:", 5) == 0 ? op + 5 : op) << " " << volume << " " << rank << "\n";
  }
  if (static_cast<int64_t>(seq) >= n.limit) {
    n.ended.store(true);
    std::ofstream(nslb_file("end_" + std::string(master) + "_" + std::to_string(getpid()) + ".log"), std::ios::app);
  }
}

RedOp to_redop(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return RedOp::Sum;
    case c10d::ReduceOp::AVG: return RedOp::Avg;
    case c10d::ReduceOp::PRODUCT: return RedOp::Product;
    case c10d::ReduceOp::MIN: return RedOp::Min;
    case c10d::ReduceOp::MAX: return RedOp::Max;
    case c10d::ReduceOp::BAND: return RedOp::Band;
    case c10d::ReduceOp::BOR: return RedOp::Bor;
    case c10d::ReduceOp::BXOR: return RedOp::Bxor;
    case c10d::ReduceOp::PREMUL_SUM: return RedOp::Sum;  // inputs scaled first (premul)
    default: TORCH_CHECK(false, "hccl: this ReduceOp (", static_cast<int>(op.op_), ") is not supported");
  }
}

// ReduceOp.PREMUL_SUM (torch_npu.distributed._make_hccl_premul_sum(f)): a SUM of the inputs
// each multiplied by f first. Returns `t` times f, in place or as a new tensor; queued on
// the current stream, which the communication stream waits for. Other ops: `t` as is.
at::Tensor premul(const c10d::ReduceOp& op, const at::Tensor& t, bool in_place) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return t;
  auto* f = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(f, "hccl: ReduceOp.PREMUL_SUM has no factor; make it with torch_npu.distributed._make_hccl_premul_sum");
  TORCH_CHECK(c10::isFloatingType(t.scalar_type()), "hccl: ReduceOp.PREMUL_SUM needs floating point tensors, got ",
              t.scalar_type());
  if (f->tensor_factor.defined()) {
    TORCH_CHECK(f->tensor_factor.numel() == 1, "hccl: the PREMUL_SUM factor must be a one-element tensor, got ",
                f->tensor_factor.sizes());
    const at::Tensor factor = f->tensor_factor.to(t.device(), t.scalar_type()).reshape({});
    return in_place ? t.mul_(factor) : t.mul(factor);
  }
  return in_place ? t.mul_(f->double_factor) : t.mul(f->double_factor);
}

// Options.hccl_config: the keys torch_npu passes to HCCL, type-checked as torch_npu does
// (the messages are torch_npu's). Returns hccl_exec_timeout (0 when not given).
milliseconds check_hccl_config(const ProcessGroupHCCL::Options& o) {
  static const char* const kInts[] = {"hccl_buffer_size",       "qos_traffic_class",  "qos_service_level",
                                      "hccl_sdma_qos",          "hccl_op_expansion_mode", "hccl_world_rank_id",
                                      "hccl_job_id",            "hccl_exec_timeout"};
  static const char* const kStrings[] = {"group_name", "hccl_algo", "hccl_retry_enable", "hccl_retry_params",
                                         "hccl_buffer_name"};
  for (const char* k : kInts) {
    auto it = o.hccl_config.find(k);
    if (it != o.hccl_config.end())
      TORCH_CHECK(std::holds_alternative<int64_t>(it->second), "Value type of ", k, " should be int.");
  }
  for (const char* k : kStrings) {
    auto it = o.hccl_config.find(k);
    if (it != o.hccl_config.end())
      TORCH_CHECK(std::holds_alternative<std::string>(it->second), "Value type of ", k, " should be string.");
  }
  auto it = o.hccl_config.find("hccl_exec_timeout");
  if (it == o.hccl_config.end()) return milliseconds(0);
  const int64_t secs = std::get<int64_t>(it->second);
  TORCH_CHECK(secs <= INT32_MAX, "Value type of hccl_exec_timeout exceeds INT32_MAX(2147483647).");
  if (secs <= 0) {
    TORCH_WARN_ONCE("hccl: hccl_exec_timeout ", secs, " is not positive; ignored");
    return milliseconds(0);
  }
  return milliseconds(secs * 1000);
}

struct Outcome {
  std::mutex mu;
  std::exception_ptr error;
};

class WorkHCCL : public c10d::Work {
 public:
  WorkHCCL(int rank, c10d::OpType type, c10::Stream comm, std::vector<at::Tensor> outputs, bool host_wait)
      : Work(rank, type), device_(comm.device_index()), comm_(comm), outputs_(std::move(outputs)),
        host_wait_(host_wait), outcome_(std::make_shared<Outcome>()) {}

  bool isCompleted() override { return failed() || done_.query(); }
  bool isSuccess() const override { return !failed(); }
  std::exception_ptr exception() const override {
    for (const auto& o : joined_) {
      std::lock_guard<std::mutex> lock(o->mu);
      if (o->error) return o->error;
    }
    std::lock_guard<std::mutex> lock(outcome_->mu);
    return outcome_->error;
  }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    if (host_wait_ || env_flag("TORCH_HCCL_BLOCKING_WAIT") || env_flag("HCCL_BLOCKING_WAIT")) {
      synchronize();
    } else {
      rethrow();
      done_.block(getCurrentNPUStream(device_).unwrap());
    }
    return true;
  }
  void synchronize() override {
    done_.synchronize();
    rethrow();
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  // Made on first use (DDP asks for it at once): completed in stream order, so consumers
  // wait for the comm stream (at worst for work queued there after this one, too).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{c10::Device(kNPU, device_)});
      c10::StreamGuard guard(comm_);
      future_->markCompleted(c10::IValue(outputs_));
    }
    return future_;
  }

  c10::DeviceIndex device_;
  c10::Stream comm_;
  std::vector<at::Tensor> outputs_;
  bool host_wait_;
  std::shared_ptr<Outcome> outcome_;
  c10::Event done_{kNPU};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<std::shared_ptr<Outcome>> joined_;  // a coalescing block's operations

 private:
  bool failed() const { return exception() != nullptr; }
  void rethrow() const {
    if (auto e = exception()) std::rethrow_exception(e);
  }
};

// Argument checks: before any communication, on the calling thread.
void check_tensor(const at::Tensor& t, const char* name, int rank) {
  TORCH_CHECK(t.defined(), "hccl: ", name, " got an undefined tensor");
  TORCH_CHECK(t.device().type() == kNPU, "hccl: ", name, " on rank ", rank, " expects npu tensors, got a tensor on ",
              t.device(), ". Move it with .npu(), or use a gloo group for CPU tensors "
              "(init_process_group(backend=\"cpu:gloo,npu:hccl\")).");
  TORCH_CHECK(t.layout() == c10::kStrided, "hccl: ", name, " does not support sparse tensors");
  // A storage in a tiled format (FRACTAL_NZ, NC1HWC0, ...): torch_npu's rule and message.
  TORCH_CHECK(!ops::tiled_storage(t) || t.storage_offset() == 0,
              "For a tensor of internal format, it's storage_offset must be 0 (hccl: ", name, ")");
  TORCH_CHECK(t.is_contiguous(), "hccl: ", name, " on rank ", rank, " expects contiguous tensors (call .contiguous())");
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* name, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "hccl: ", name, ": ", what, " has dtype ", b.scalar_type(),
              ", expected ", a.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), "hccl: ", name, ": ", what, " has ", b.numel(), " elements, expected ",
              a.numel(), " (sizes ", b.sizes(), " vs ", a.sizes(), ")");
}

void check_rank(int r, int size, const char* name, const char* what) {
  TORCH_CHECK(r >= 0 && r < size, "hccl: ", name, ": invalid ", what, " ", r, " for a group of size ", size);
}

// Elements a collective moves: as torch_npu, a tensor in a tiled format is its whole
// physical storage (the same format on every rank; the zero padding reduces to zero).
int64_t hccl_numel(const at::Tensor& t) {
  return ops::tiled_storage(t) ? static_cast<int64_t>(t.storage().nbytes() / t.element_size()) : t.numel();
}

// Collectives that place parts of tensors (gather, scatter, all-to-all) need plain layouts.
void check_plain(const std::vector<at::Tensor>& ts, const char* name) {
  for (const auto& t : ts)
    TORCH_CHECK(!t.defined() || !ops::tiled_storage(t), "hccl: ", name, " does not support tensors in the internal "
                "format ", ops::format_name(ops::npu_format_of(t)), "; cast them with torch_npu.npu_format_cast(t, 2)");
}

// Tiled tensors in collectives that place parts of tensors: as torch_npu, they run on
// plain (ND) stand-ins. Inputs are cast (copies, in stream order); outputs get ND
// temporaries whose values tile_back() copies in after the collective.
bool any_tiled(const std::vector<at::Tensor>& ts) {
  bool any = false;
  for (const auto& t : ts) {
    if (!t.defined() || !ops::tiled_storage(t)) continue;
    TORCH_CHECK(t.storage_offset() == 0, "For a tensor of internal format, it's storage_offset must be 0");
    any = true;
  }
  return any;
}
bool any_tiled(const std::vector<std::vector<at::Tensor>>& tss) {
  bool any = false;
  for (const auto& ts : tss) any = any_tiled(ts) || any;
  return any;
}
std::vector<at::Tensor> plain_inputs(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() && ops::tiled_storage(t) ? ops::format_cast(t, ops::kFormatND) : t);
  return out;
}
std::vector<std::vector<at::Tensor>> plain_inputs(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& ts : tss) out.push_back(plain_inputs(ts));
  return out;
}
std::vector<at::Tensor> plain_outputs(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts)
    out.push_back(t.defined() && ops::tiled_storage(t) ? at::empty(t.sizes(), t.options()) : t);
  return out;
}
std::vector<std::vector<at::Tensor>> plain_outputs(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& ts : tss) out.push_back(plain_outputs(ts));
  return out;
}
// The current stream waits for `work`, then the results are tiled into the outputs.
c10::intrusive_ptr<c10d::Work> tile_back(c10::intrusive_ptr<c10d::Work> work, const std::vector<at::Tensor>& outs,
                                         const std::vector<at::Tensor>& plain) {
  bool waited = false;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].is_same(plain[i])) continue;
    if (!waited) work->wait();
    waited = true;
    outs[i].copy_(plain[i]);
  }
  return work;
}
c10::intrusive_ptr<c10d::Work> tile_back(c10::intrusive_ptr<c10d::Work> work,
                                         const std::vector<std::vector<at::Tensor>>& outs,
                                         const std::vector<std::vector<at::Tensor>>& plain) {
  std::vector<at::Tensor> o, p;
  for (size_t i = 0; i < outs.size(); ++i) {
    o.insert(o.end(), outs[i].begin(), outs[i].end());
    p.insert(p.end(), plain[i].begin(), plain[i].end());
  }
  return tile_back(std::move(work), o, p);
}

void* ptr(const at::Tensor& t) { return t.data_ptr(); }
size_t bytes(const at::Tensor& t) { return hccl_numel(t) * t.element_size(); }

// After a failure: make local peers and the other hosts fail now, not at their timeout;
// the Work and every later call of the group raise `e`.
void record_failure(Comm& comm, CommState& state, Outcome& outcome, std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& ex) {
    comm.abort(ex.what_without_backtrace());
  } catch (const std::exception& ex) {
    comm.abort(ex.what());
  } catch (...) {
    comm.abort("hccl: unknown error");
  }
  {
    std::lock_guard<std::mutex> lock(outcome.mu);
    outcome.error = e;
  }
  std::lock_guard<std::mutex> lock(state.mu);
  if (!state.error) state.error = e;
}

// Collectives moving at most this many bytes (all their tensors together) may run on the
// calling thread; larger ones always go to the communication stream, to overlap compute.
constexpr size_t kInlineBytes = 256 << 10;

// How long an inline attempt waits for the peers before handing the collective to the
// communication stream (which keeps waiting): long enough for a peer in a loop of
// collectives, short enough that a caller whose peers are busy elsewhere goes on.
std::chrono::nanoseconds inline_budget() {
  static const std::chrono::nanoseconds budget = [] {
    const char* v = std::getenv("TORCH_NPU_HCCL_INLINE_US");  // simulator knob; 0 disables
    return std::chrono::microseconds(v && *v ? std::atoll(v) : 200);
  }();
  return budget;
}

}  // namespace

ProcessGroupHCCL::Options::Options(bool is_high_priority_stream)
    : c10d::Backend::Options("hccl"), is_high_priority_stream(is_high_priority_stream) {}

ProcessGroupHCCL::ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   c10::intrusive_ptr<Options> options)
    : Backend(rank, size), options_(std::move(options)), state_(std::make_shared<CommState>()) {
  connect_timeout_ = env_seconds("HCCL_CONNECT_TIMEOUT", milliseconds(120000));
  const milliseconds config_exec = check_hccl_config(*options_);
  exec_timeout_ = options_->op_timeout.count() > 0 ? options_->op_timeout
                  : config_exec.count() > 0        ? config_exec
                                                   : env_seconds("HCCL_EXEC_TIMEOUT", options_->timeout);
  std::string group = options_->group_name.empty() ? options_->group_id : options_->group_name;
  store_ = store;
  group_ = group.empty() ? "default" : group;
  comm();  // the rendezvous of the first communicator
}

c10::intrusive_ptr<c10d::Store> ProcessGroupHCCL::generation_store() const {
  // Each rebuild rendezvouses under keys of its own: the aborted communicator's stay.
  if (generation_ == 0) return store_;
  return c10::make_intrusive<c10d::PrefixStore>("hccl/reinit" + std::to_string(generation_), store_);
}

const std::shared_ptr<Comm>& ProcessGroupHCCL::comm() const {
  if (!comm_) {
    comm_ = std::make_shared<Comm>(generation_store(), rank_, size_, group_,
                                   Timeouts{connect_timeout_, exec_timeout_});
  }
  return comm_;
}

void ProcessGroupHCCL::abort_comm(const std::string& reason) {
  if (!comm_) return;  // already aborted, not rebuilt since
  const std::string why = "hccl: the communicator of group '" + group_ + "' was aborted (" + reason + ")";
  comm_->local().mark_failed(why);
  comm_->abort(why);
  comm_.reset();  // queued operations keep the old one alive until they fail
  ++generation_;
  state_ = std::make_shared<CommState>();
  seq_ = 0;
  p2p_seq_ = 0;
}

void ProcessGroupHCCL::resume_comm(int device) { check_device_index(static_cast<c10::DeviceIndex>(device)); }

void ProcessGroupHCCL::delete_store_keys() { generation_store()->deleteKey("hccl/host/" + std::to_string(rank_)); }

ProcessGroupHCCL::~ProcessGroupHCCL() = default;

std::string ProcessGroupHCCL::transport(int peer) const { return comm()->transport(peer); }

std::map<std::string, int64_t> ProcessGroupHCCL::tcp_stats() const {
  std::map<std::string, int64_t> s{{"bytes_sent", 0}, {"bytes_received", 0}, {"connections", 0}};
  if (!comm()->multi_host()) return s;
  s["bytes_sent"] = static_cast<int64_t>(comm()->net().bytes_sent());
  s["bytes_received"] = static_cast<int64_t>(comm()->net().bytes_received());
  s["connections"] = static_cast<int64_t>(comm()->net().connected_peers().size());
  return s;
}

std::string ProcessGroupHCCL::tcp_address() const { return comm()->multi_host() ? comm()->net().address() : ""; }

std::vector<int> ProcessGroupHCCL::tcp_peers() const {
  return comm()->multi_host() ? comm()->net().connected_peers() : std::vector<int>{};
}

c10::DeviceIndex ProcessGroupHCCL::device_of(const std::vector<at::Tensor>& tensors, const char* name) {
  TORCH_CHECK(!tensors.empty(), "hccl: ", name, " got no tensors");
  for (const auto& t : tensors) check_tensor(t, name, rank_);
  const c10::DeviceIndex d = tensors[0].device().index();
  for (const auto& t : tensors)
    TORCH_CHECK(t.device().index() == d, "hccl: ", name, ": all tensors must be on one device, got npu:", d,
                " and ", t.device());
  comm()->bind(d);
  TORCH_CHECK(comm()->device() == d, "hccl: rank ", rank_, " of group '", comm()->group(), "' uses npu:",
              comm()->device(), " (the device of its first collective), but ", name, " got a tensor on npu:", d,
              ". Call torch.npu.set_device(local_rank) and keep a rank's tensors on one device.");
  return d;
}

c10::Stream ProcessGroupHCCL::stream_for(c10::DeviceIndex device, Lane lane) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(static_cast<int>(device), static_cast<int>(lane));
  auto it = streams_.find(key);
  if (it == streams_.end())
    it = streams_.emplace(key, getStreamFromPool(options_->is_high_priority_stream, device).unwrap()).first;
  return it->second;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::enqueue(const char* name, Lane lane, c10::DeviceIndex device,
                                                         const std::vector<at::Tensor>& tensors,
                                                         std::vector<at::Tensor> outputs,
                                                         std::function<void(Comm&, uint64_t)> body) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->error) std::rethrow_exception(state_->error);
  }
  const uint64_t seq = lane == Lane::Collective ? ++seq_ : ++p2p_seq_;
  if (lane == Lane::Collective) nslb_record(name, tensors, seq, group_);
  const c10::Stream comm = stream_for(device, lane);
  auto work = c10::make_intrusive<WorkHCCL>(rank_, c10d::OpType::UNKNOWN, comm, std::move(outputs),
                                            /*host_wait=*/lane == Lane::Collective && tensors.empty());
  if (coalescing_) coalesced_.push_back(work);
  bool resume = false;  // an inline attempt already arrived at the first barrier

  // Small message, one host, nothing queued on the caller's stream or the communication
  // stream: run the collective right here. Handing it to the stream's worker and back
  // costs more than the collective (two thread wake-ups per rank). Stream semantics are
  // unchanged: everything the collective waits for is done, and it is done when the call
  // returns (the Work's event is never recorded, so wait() and the future have nothing
  // to wait for). If the peers do not all arrive within the budget, the collective
  // continues on the communication stream as usual, so a rank that issues it early never
  // blocks its caller.
  if (lane == Lane::Collective && !this->comm()->multi_host() && !in_kernel() && inline_budget().count() > 0) {
    size_t total = 0;
    for (const auto& t : tensors) total += bytes(t);
    const NPUStream current = getCurrentNPUStream(device);
    const NPUStream comm_stream(comm);
    if (total <= kInlineBytes && !isStreamCapturing(current) && !isStreamCapturing(comm_stream) &&
        comm_stream.query() && current.query()) {
      ShmComm& local = this->comm()->local();
      local.attempt(inline_budget());
      try {
        InlineKernelRecord record(name, comm_stream);  // on the profile's timeline
        body(*this->comm(), seq);
        local.attempt(std::chrono::nanoseconds(0));  // in case the body had no barrier
        return work;
      } catch (const ShmComm::NotArrived&) {
        resume = true;
      } catch (...) {
        local.attempt(std::chrono::nanoseconds(0));
        // As a collective that failed on the stream: work.wait() (so a synchronous call)
        // and later calls of the group raise the error, and so does the next
        // synchronisation of the stream.
        const auto e = std::current_exception();
        record_failure(*this->comm(), *state_, *work->outcome_, e);
        launch(comm_stream, name, [e] { std::rethrow_exception(e); });
        work->done_.record(comm);
        return work;
      }
    }
  }

  // The communication stream starts after what the caller queued so far.
  c10::Event ready(kNPU);
  ready.record(getCurrentNPUStream(device).unwrap());
  ready.block(comm);
  std::vector<at::Tensor> keep;  // twins: storages alive, no Python objects on the worker
  for (const auto& t : tensors) {
    NPUCachingAllocator::recordStream(t.storage().data_ptr(), comm);
    keep.push_back(ops::twin(t));
  }
  launch(NPUStream(comm), name,
         [comm_ptr = this->comm(), state = state_, outcome = work->outcome_, keep = std::move(keep), body = std::move(body),
          seq, resume] {
           try {
             if (resume) comm_ptr->local().resume();
             body(*comm_ptr, seq);
           } catch (...) {
             record_failure(*comm_ptr, *state, *outcome, std::current_exception());
             throw;
           }
         });
  work->done_.record(comm);
  return work;
}

void ProcessGroupHCCL::startCoalescing() {
  TORCH_CHECK(!coalescing_, "hccl: startCoalescing was called twice without endCoalescing in between");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::endCoalescing() {
  TORCH_CHECK(coalescing_, "hccl: endCoalescing was called without startCoalescing");
  coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> members = std::move(coalesced_);
  coalesced_.clear();
  const c10::DeviceIndex device = comm()->device() >= 0 ? comm()->device() : current_device();
  // The block's Work: an event on a stream of its own that waits for every operation's.
  const c10::Stream join = stream_for(device, Lane::Coalesced);
  auto work = c10::make_intrusive<WorkHCCL>(rank_, c10d::OpType::COALESCED, join, std::vector<at::Tensor>{},
                                            /*host_wait=*/false);
  for (const auto& m : members) {
    auto* w = static_cast<WorkHCCL*>(m.get());
    w->done_.block(join);
    work->joined_.push_back(w->outcome_);
  }
  work->done_.record(join);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hccl: broadcast takes one tensor per process");
  const auto dev = device_of(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank + opts.rootTensor);
  check_rank(root, size_, "broadcast", "root");
  void* p = ptr(tensors[0]);
  const int64_t n = hccl_numel(tensors[0]);
  const auto dt = tensors[0].scalar_type();
  return enqueue("hccl:broadcast", Lane::Collective, dev, tensors, tensors,
                 [=](Comm& c, uint64_t seq) { distributed::broadcast(c, {"broadcast", seq}, p, n, dt, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hccl: allreduce takes one tensor per process");
  return allreduce_coalesced(tensors, c10d::AllreduceCoalescedOptions{opts});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  const auto dev = device_of(tensors, "allreduce");
  const RedOp op = to_redop(opts.reduceOp);
  struct Item {
    void* p;
    int64_t n;
    c10::ScalarType dt;
  };
  std::vector<Item> items;
  for (const auto& t : tensors) {
    check_reduction(t.scalar_type(), op);
    premul(opts.reduceOp, t, /*in_place=*/true);
    items.push_back({ptr(t), hccl_numel(t), t.scalar_type()});
  }
  return enqueue("hccl:allreduce", Lane::Collective, dev, tensors, tensors, [=](Comm& c, uint64_t seq) {
    for (const auto& it : items) distributed::allreduce(c, {"allreduce", seq}, it.p, it.n, it.dt, op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hccl: reduce takes one tensor per process");
  const auto dev = device_of(tensors, "reduce");
  const int root = static_cast<int>(opts.rootRank + opts.rootTensor);
  check_rank(root, size_, "reduce", "root");
  const RedOp op = to_redop(opts.reduceOp);
  check_reduction(tensors[0].scalar_type(), op);
  // PREMUL_SUM: the root scales its tensor (the result) in place, the others a copy.
  const std::vector<at::Tensor> bufs{premul(opts.reduceOp, tensors[0], /*in_place=*/rank_ == root)};
  void* p = ptr(bufs[0]);
  const int64_t n = hccl_numel(tensors[0]);
  const auto dt = tensors[0].scalar_type();
  return enqueue("hccl:reduce", Lane::Collective, dev, bufs, tensors,
                 [=](Comm& c, uint64_t seq) { distributed::reduce(c, {"reduce", seq}, p, n, dt, op, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "hccl: allgather takes one tensor per process");
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(allgather(outs, ins, opts), outputs, outs);
  }
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "hccl: allgather needs ", size_,
              " output tensors (one per rank), got ", outputs[0].size());
  std::vector<at::Tensor> all = inputs;
  for (const auto& o : outputs[0]) {
    check_same(inputs[0], o, "allgather", "an output tensor");
    all.push_back(o);
  }
  const auto dev = device_of(all, "allgather");
  check_plain(all, "allgather");
  std::vector<void*> outs;
  for (const auto& o : outputs[0]) outs.push_back(ptr(o));
  const void* in = ptr(inputs[0]);
  const int64_t n = inputs[0].numel();
  const auto dt = inputs[0].scalar_type();
  return enqueue("hccl:allgather", Lane::Collective, dev, all, outputs[0],
                 [=](Comm& c, uint64_t seq) { distributed::allgather(c, {"allgather", seq}, in, n, dt, outs); });
}

namespace {
// One all-gather of a coalesced call: an input buffer and the rank-ordered outputs.
struct GatherItem {
  const void* in;
  int64_t n;
  c10::ScalarType dt;
  std::vector<void*> outs;
};
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions&) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hccl: allgather_coalesced: ", inputs.size(), " inputs but ",
              outputs.size(), " output lists");
  std::vector<at::Tensor> all = inputs;
  std::vector<at::Tensor> results;
  std::vector<GatherItem> items;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(static_cast<int>(outputs[i].size()) == size_, "hccl: allgather_coalesced: output list ", i,
                " has ", outputs[i].size(), " tensors, expected one per rank (", size_, ")");
    GatherItem it{ptr(inputs[i]), inputs[i].numel(), inputs[i].scalar_type(), {}};
    for (const auto& o : outputs[i]) {
      check_same(inputs[i], o, "allgather_coalesced", "an output tensor");
      all.push_back(o);
      results.push_back(o);
      it.outs.push_back(ptr(o));
    }
    items.push_back(std::move(it));
  }
  const auto dev = device_of(all, "allgather_coalesced");
  check_plain(all, "allgather_coalesced");
  return enqueue("hccl:allgather_coalesced", Lane::Collective, dev, all, results, [=](Comm& c, uint64_t seq) {
    for (const auto& it : items) distributed::allgather(c, {"allgather_coalesced", seq}, it.in, it.n, it.dt, it.outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions& opts) {
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(allgather_into_tensor_coalesced(outs, ins, opts), outputs, outs);
  }
  TORCH_CHECK(outputs.size() == inputs.size(), "hccl: allgather_into_tensor: ", inputs.size(), " inputs but ",
              outputs.size(), " outputs");
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  const auto dev = device_of(all, "allgather_into_tensor");
  check_plain(all, "allgather_into_tensor");
  std::vector<GatherItem> items;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    const auto& out = outputs[i];
    TORCH_CHECK(out.scalar_type() == in.scalar_type(), "hccl: allgather_into_tensor: output dtype ",
                out.scalar_type(), " differs from input dtype ", in.scalar_type());
    TORCH_CHECK(out.numel() == in.numel() * size_, "hccl: allgather_into_tensor: the output must have world_size (",
                size_, ") times the input's elements: got ", out.numel(), " for an input of ", in.numel());
    GatherItem it{ptr(in), in.numel(), in.scalar_type(), {}};
    for (int r = 0; r < size_; ++r) it.outs.push_back(static_cast<char*>(ptr(out)) + r * bytes(in));
    items.push_back(std::move(it));
  }
  return enqueue("hccl:allgather_into_tensor", Lane::Collective, dev, all, outputs, [=](Comm& c, uint64_t seq) {
    for (const auto& it : items) distributed::allgather(c, {"allgather_into_tensor", seq}, it.in, it.n, it.dt, it.outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "hccl: reduce_scatter takes one tensor per process");
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(reduce_scatter(outs, ins, opts), outputs, outs);
  }
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "hccl: reduce_scatter needs ", size_,
              " input tensors (one per rank), got ", inputs[0].size());
  std::vector<at::Tensor> all = outputs;
  for (const auto& i : inputs[0]) {
    check_same(outputs[0], i, "reduce_scatter", "an input tensor");
    all.push_back(i);
  }
  const auto dev = device_of(all, "reduce_scatter");
  check_plain(all, "reduce_scatter");
  const RedOp op = to_redop(opts.reduceOp);
  check_reduction(outputs[0].scalar_type(), op);
  std::vector<const void*> ins;
  for (const auto& i : inputs[0]) {
    all.push_back(premul(opts.reduceOp, i, /*in_place=*/false));  // PREMUL_SUM: scaled copies
    ins.push_back(ptr(all.back()));
  }
  void* out = ptr(outputs[0]);
  const int64_t n = outputs[0].numel();
  const auto dt = outputs[0].scalar_type();
  return enqueue("hccl:reduce_scatter", Lane::Collective, dev, all, outputs, [=](Comm& c, uint64_t seq) {
    distributed::reduce_scatter(c, {"reduce_scatter", seq}, ins, out, n, dt, op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(reduce_scatter_tensor_coalesced(outs, ins, opts), outputs, outs);
  }
  TORCH_CHECK(outputs.size() == inputs.size(), "hccl: reduce_scatter_tensor: ", inputs.size(), " inputs but ",
              outputs.size(), " outputs");
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  const auto dev = device_of(all, "reduce_scatter_tensor");
  check_plain(all, "reduce_scatter_tensor");
  const RedOp op = to_redop(opts.reduceOp);
  struct Item {
    std::vector<const void*> ins;
    void* out;
    int64_t n;
    c10::ScalarType dt;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    const auto& out = outputs[i];
    TORCH_CHECK(out.scalar_type() == in.scalar_type(), "hccl: reduce_scatter_tensor: output dtype ",
                out.scalar_type(), " differs from input dtype ", in.scalar_type());
    TORCH_CHECK(in.numel() == out.numel() * size_, "hccl: reduce_scatter_tensor: the input must have world_size (",
                size_, ") times the output's elements: got ", in.numel(), " for an output of ", out.numel());
    check_reduction(out.scalar_type(), op);
    const at::Tensor src = premul(opts.reduceOp, in, /*in_place=*/false);  // PREMUL_SUM: a scaled copy
    if (!src.is_same(in)) all.push_back(src);
    Item it{{}, ptr(out), out.numel(), out.scalar_type()};
    for (int r = 0; r < size_; ++r) it.ins.push_back(static_cast<char*>(ptr(src)) + r * bytes(out));
    items.push_back(std::move(it));
  }
  return enqueue("hccl:reduce_scatter_tensor", Lane::Collective, dev, all, outputs, [=](Comm& c, uint64_t seq) {
    for (const auto& it : items)
      distributed::reduce_scatter(c, {"reduce_scatter_tensor", seq}, it.ins, it.out, it.n, it.dt, op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_split_sizes,
                                                               std::vector<int64_t>& input_split_sizes,
                                                               const c10d::AllToAllOptions& opts) {
  if (any_tiled({output, input})) {
    at::Tensor in = plain_inputs({input})[0];
    at::Tensor out = plain_outputs({output})[0];
    return tile_back(alltoall_base(out, in, output_split_sizes, input_split_sizes, opts), {output}, {out});
  }
  const auto dev = device_of({output, input}, "alltoall_base");
  check_plain({output, input}, "all_to_all_single");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hccl: all_to_all_single: output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  // Splits count rows (dim 0); empty splits: equal parts.
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    const int64_t rows = t.dim() ? t.size(0) : 1;
    const size_t row_bytes = rows ? bytes(t) / rows : 0;
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "hccl: all_to_all_single: the ", what, " has ", rows,
                  " rows, not divisible by the world size ", size_, "; pass split sizes");
      s.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(s.size()) == size_, "hccl: all_to_all_single: ", what, " split sizes have ",
                s.size(), " entries, expected ", size_);
    int64_t sum = 0;
    for (int64_t x : s) {
      TORCH_CHECK(x >= 0, "hccl: all_to_all_single: negative split size ", x);
      sum += x;
    }
    TORCH_CHECK(sum == rows, "hccl: all_to_all_single: ", what, " split sizes sum to ", sum, " but the ", what,
                " has ", rows, " rows");
    std::vector<char*> ptrs;
    std::vector<uint64_t> nbytes;
    char* p = static_cast<char*>(ptr(t));
    for (int64_t x : s) {
      ptrs.push_back(p);
      nbytes.push_back(x * row_bytes);
      p += x * row_bytes;
    }
    return std::make_pair(ptrs, nbytes);
  };
  auto [in_ptrs, send_bytes] = layout(input, input_split_sizes, "input");
  auto [out_ptrs, recv_bytes] = layout(output, output_split_sizes, "output");
  std::vector<const void*> ins(in_ptrs.begin(), in_ptrs.end());
  std::vector<void*> outs(out_ptrs.begin(), out_ptrs.end());
  const auto dt = input.scalar_type();
  return enqueue("hccl:all_to_all_single", Lane::Collective, dev, {output, input}, {output},
                 [=](Comm& c, uint64_t seq) {
                   distributed::alltoall(c, {"all_to_all_single", seq}, dt, ins, send_bytes, outs, recv_bytes);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(alltoall(outs, ins, opts), outputs, outs);
  }
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "hccl: all_to_all needs ", size_, " input and output tensors, got ", inputs.size(), " and ",
              outputs.size());
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  const auto dev = device_of(all, "all_to_all");
  check_plain(all, "all_to_all");
  std::vector<const void*> ins;
  std::vector<void*> outs;
  std::vector<uint64_t> send_bytes, recv_bytes;
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                    outputs[r].scalar_type() == inputs[0].scalar_type(),
                "hccl: all_to_all: all tensors must have one dtype");
    ins.push_back(ptr(inputs[r]));
    send_bytes.push_back(bytes(inputs[r]));
    outs.push_back(ptr(outputs[r]));
    recv_bytes.push_back(bytes(outputs[r]));
  }
  const auto dt = inputs[0].scalar_type();
  return enqueue("hccl:all_to_all", Lane::Collective, dev, all, outputs, [=](Comm& c, uint64_t seq) {
    distributed::alltoall(c, {"all_to_all", seq}, dt, ins, send_bytes, outs, recv_bytes);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1, "hccl: gather takes one tensor per process");
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(gather(outs, ins, opts), outputs, outs);
  }
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, size_, "gather", "root");
  std::vector<at::Tensor> all = inputs;
  std::vector<void*> outs;
  std::vector<at::Tensor> result;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "hccl: gather: the root needs ",
                size_, " output tensors");
    for (const auto& o : outputs[0]) {
      check_same(inputs[0], o, "gather", "an output tensor");
      all.push_back(o);
      outs.push_back(ptr(o));
    }
    result = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "hccl: gather: only the root (", root,
                ") takes output tensors");
  }
  const auto dev = device_of(all, "gather");
  check_plain(all, "gather");
  const void* in = ptr(inputs[0]);
  const int64_t n = inputs[0].numel();
  const auto dt = inputs[0].scalar_type();
  return enqueue("hccl:gather", Lane::Collective, dev, all, result,
                 [=](Comm& c, uint64_t seq) { distributed::gather(c, {"gather", seq}, in, n, dt, outs, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "hccl: scatter takes one tensor per process");
  if (any_tiled(inputs) || any_tiled(outputs)) {
    auto ins = plain_inputs(inputs);
    auto outs = plain_outputs(outputs);
    return tile_back(scatter(outs, ins, opts), outputs, outs);
  }
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, size_, "scatter", "root");
  std::vector<at::Tensor> all = outputs;
  std::vector<const void*> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "hccl: scatter: the root needs ",
                size_, " input tensors");
    for (const auto& i : inputs[0]) {
      check_same(outputs[0], i, "scatter", "an input tensor");
      all.push_back(i);
      ins.push_back(ptr(i));
    }
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "hccl: scatter: only the root (", root, ") takes input tensors");
  }
  const auto dev = device_of(all, "scatter");
  check_plain(all, "scatter");
  void* out = ptr(outputs[0]);
  const int64_t n = outputs[0].numel();
  const auto dt = outputs[0].scalar_type();
  return enqueue("hccl:scatter", Lane::Collective, dev, all, outputs,
                 [=](Comm& c, uint64_t seq) { distributed::scatter(c, {"scatter", seq}, ins, out, n, dt, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::barrier(const c10d::BarrierOptions&) {
  const bool bound = comm()->device() >= 0;
  auto work = enqueue("hccl:barrier", Lane::Collective, bound ? comm()->device() : current_device(), {}, {},
                      [](Comm& c, uint64_t seq) { distributed::barrier(c, {"barrier", seq}); });
  // Before the first collective the device is not known yet (users often call
  // set_device after a barrier): finish here, so that this stream and the one of the
  // device chosen later never run collectives concurrently.
  if (!bound) work->synchronize();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::send(std::vector<at::Tensor>& tensors, int dst, int) {
  TORCH_CHECK(tensors.size() == 1, "hccl: send takes one tensor");
  check_rank(dst, size_, "send", "destination rank");  // itself too: a receive on the recv stream pulls it
  const auto dev = device_of(tensors, "send");
  // A tensor in a tiled format travels in its logical layout (as torch_npu casts it to its
  // origin format): the receiver's tensor may have another format.
  const std::vector<at::Tensor> bufs{ops::tiled_storage(tensors[0]) ? ops::format_cast(tensors[0], ops::kFormatND)
                                                                    : tensors[0]};
  const void* p = ptr(bufs[0]);
  const uint64_t nbytes = bytes(bufs[0]);
  if (nbytes) comm()->offset_of(p, nbytes);  // in the device's shared arena (checked before queuing)
  const int32_t dt = static_cast<int32_t>(tensors[0].scalar_type());
  return enqueue("hccl:send", Lane::Send, dev, bufs, tensors,
                 [=](Comm& c, uint64_t seq) { c.send(dst, p, nbytes, dt, {"send", seq}); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  TORCH_CHECK(tensors.size() == 1, "hccl: recv takes one tensor");
  check_rank(src, size_, "recv", "source rank");
  const auto dev = device_of(tensors, "recv");
  if (ops::tiled_storage(tensors[0])) {
    // Into a tiled tensor: receive the logical values, then tile them in, in stream order.
    std::vector<at::Tensor> nd{at::empty(tensors[0].sizes(), tensors[0].options())};
    auto work = recv(nd, src, tag);
    work->wait();  // the current stream waits for the receive (the host does not)
    tensors[0].copy_(nd[0]);
    return work;
  }
  void* p = ptr(tensors[0]);
  const uint64_t nbytes = bytes(tensors[0]);
  const int32_t dt = static_cast<int32_t>(tensors[0].scalar_type());
  return enqueue("hccl:recv", Lane::Recv, dev, tensors, tensors,
                 [=](Comm& c, uint64_t seq) { c.recv(src, p, nbytes, dt, {"recv", seq}); });
}

}  // namespace torch_npu::distributed

namespace torch_npu::distributed {

std::string ProcessGroupHCCL::hccl_comm_name(int rankid, bool init_comm) {
  TORCH_CHECK(rankid >= 0, "hccl: get_hccl_comm_name: invalid rank ", rankid);
  if (!comm_ && !init_comm) return "";  // aborted, not rebuilt yet
  if (comm()->device() < 0) {
    if (!init_comm) return "";
    comm()->bind(current_device());  // what torch_npu's communicator creation does
  }
  return comm()->group();
}

int64_t ProcessGroupHCCL::coll_stream_id(const c10::Device& device) {
  TORCH_CHECK(device.type() == kNPU, "hccl: get_coll_stream_id expects an npu device, got ", device);
  return stream_for(device.has_index() ? device.index() : current_device(), Lane::Collective).id();
}

int64_t ProcessGroupHCCL::p2p_stream_id(const c10::Device& device, int peer, bool /*is_batched*/) {
  TORCH_CHECK(device.type() == kNPU, "hccl: get_p2p_stream_id expects an npu device, got ", device);
  check_rank(peer, size_, "get_p2p_stream_id", "peer");
  // One send stream per device (not per peer): the p2p stream, once a send was issued.
  std::lock_guard<std::mutex> lock(mu_);
  const int d = device.has_index() ? device.index() : current_device();
  auto it = streams_.find({d, static_cast<int>(Lane::Send)});
  return it == streams_.end() ? -1 : it->second.id();
}

int64_t ProcessGroupHCCL::stream_id(bool p2p, int peer) {
  if (p2p) TORCH_CHECK(peer >= 0, "hccl: _get_stream_id: in p2p mode the peer rank must be >= 0, got ", peer);
  std::lock_guard<std::mutex> lock(mu_);
  const auto id_of = [this](Lane lane) -> int64_t {
    auto it = streams_.find({current_device(), static_cast<int>(lane)});
    return it == streams_.end() ? -1 : it->second.id();
  };
  if (!p2p) return id_of(Lane::Collective);
  const int64_t send = id_of(Lane::Send);
  return send != -1 ? send : id_of(Lane::Recv);  // a rank that only received: its receive stream
}

void ProcessGroupHCCL::group_start() { ++group_depth_; }

void ProcessGroupHCCL::group_end() {
  TORCH_CHECK(group_depth_ > 0, "hccl: _group_end called without _group_start");
  --group_depth_;
}

namespace {
// Rows of each rank's part along dim 0 (empty: equal parts), checked against `t`.
std::vector<int64_t> row_splits(const at::Tensor& t, std::vector<int64_t> splits, int size, const char* name) {
  TORCH_CHECK(t.dim() > 0, "hccl: ", name, ": expects a tensor of at least one dimension");
  const int64_t rows = t.size(0);
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "hccl: ", name, ": ", rows, " rows are not divisible by the world size ", size,
                "; pass split sizes");
    splits.assign(size, rows / size);
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "hccl: ", name, ": split sizes have ", splits.size(),
              " entries, expected one per rank (", size, ")");
  int64_t sum = 0;
  for (int64_t x : splits) {
    TORCH_CHECK(x >= 0, "hccl: ", name, ": negative split size ", x);
    sum += x;
  }
  TORCH_CHECK(sum == rows, "hccl: ", name, ": split sizes sum to ", sum, " but the tensor has ", rows, " rows");
  return splits;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::all_gather_into_tensor_uneven(at::Tensor& output, at::Tensor& input,
                                                                              std::vector<int64_t> output_split_sizes,
                                                                              const c10d::AllgatherOptions&) {
  const char* name = "all_gather_into_tensor_uneven";
  const auto dev = device_of({output, input}, name);
  check_plain({output, input}, name);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hccl: ", name, ": output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type());
  const auto splits = row_splits(output, std::move(output_split_sizes), size_, name);
  const size_t row_bytes = output.size(0) ? bytes(output) / output.size(0) : 0;
  TORCH_CHECK(bytes(input) == splits[rank_] * row_bytes, "hccl: ", name, ": rank ", rank_, "'s input has ",
              input.numel(), " elements, but its part of the output has ", splits[rank_], " rows of ",
              row_bytes / output.element_size(), " elements");
  // An all-to-all that sends the same input to every rank: zero-copy, sizes checked across ranks.
  std::vector<const void*> ins(size_, ptr(input));
  std::vector<uint64_t> send_bytes(size_, bytes(input)), recv_bytes;
  std::vector<void*> outs;
  char* p = static_cast<char*>(ptr(output));
  for (int64_t x : splits) {
    outs.push_back(p);
    recv_bytes.push_back(x * row_bytes);
    p += x * row_bytes;
  }
  const auto dt = input.scalar_type();
  return enqueue("hccl:all_gather_into_tensor_uneven", Lane::Collective, dev, {output, input}, {output},
                 [=](Comm& c, uint64_t seq) {
                   distributed::alltoall(c, {"all_gather_into_tensor_uneven", seq}, dt, ins, send_bytes, outs,
                                         recv_bytes);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter_tensor_uneven(at::Tensor& output, at::Tensor& input,
                                                                             std::vector<int64_t> input_split_sizes,
                                                                             const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor_uneven";
  const auto dev = device_of({output, input}, name);
  check_plain({output, input}, name);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hccl: ", name, ": output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type());
  const RedOp op = to_redop(opts.reduceOp);
  check_reduction(input.scalar_type(), op);
  const auto splits = row_splits(input, std::move(input_split_sizes), size_, name);
  const int64_t row = input.size(0) ? input.numel() / input.size(0) : 0;
  TORCH_CHECK(output.numel() == splits[rank_] * row, "hccl: ", name, ": rank ", rank_, "'s output has ",
              output.numel(), " elements, but its part of the input has ", splits[rank_], " rows of ", row,
              " elements");
  // One reduce per rank's part into a scratch copy of the input (the input is left as is),
  // then the own part is copied out.
  const at::Tensor scratch = premul(opts.reduceOp, input, /*in_place=*/false);
  const at::Tensor work_buf = scratch.is_same(input) ? input.clone() : scratch;
  char* base = static_cast<char*>(ptr(work_buf));
  const size_t esize = input.element_size();
  std::vector<int64_t> first(size_ + 1, 0);
  for (int r = 0; r < size_; ++r) first[r + 1] = first[r] + splits[r] * row;
  void* out = ptr(output);
  const auto dt = input.scalar_type();
  const int me = rank_;
  return enqueue("hccl:reduce_scatter_tensor_uneven", Lane::Collective, dev, {output, input, work_buf}, {output},
                 [=](Comm& c, uint64_t seq) {
                   for (int r = 0; r < static_cast<int>(first.size()) - 1; ++r)
                     distributed::reduce(c, {"reduce_scatter_tensor_uneven", seq}, base + first[r] * esize,
                                         first[r + 1] - first[r], dt, op, r);
                   std::memcpy(out, base + first[me] * esize, (first[me + 1] - first[me]) * esize);
                 });
}

}  // namespace torch_npu::distributed
