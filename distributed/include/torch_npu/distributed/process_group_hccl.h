// ProcessGroupHCCL: the `hccl` c10d backend for npu tensors (torch_npu's name and options).
//
// Each collective is queued on the group's communication stream of the tensors' device
// (an NPUStream from the pool) after that stream waits for the caller's current stream,
// and returns at once. The Work's wait() makes the current stream wait for the
// communication stream (a host wait only with TORCH_HCCL_BLOCKING_WAIT=1); its future is
// completed in stream order (DDP's comm hooks chain on it). Tensors are record_stream'ed
// on the communication stream. Point-to-point ops use two more streams (send, recv) so
// that a blocking send never holds back a receive. A small collective issued while both
// streams are idle runs on the calling thread instead (src/process_group_hccl.cpp,
// enqueue), and goes to the communication stream if its peers do not join it promptly.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>

namespace torch_npu::distributed {

class Comm;
struct CommState;

class ProcessGroupHCCL : public c10d::Backend {
 public:
  struct Options : c10d::Backend::Options {
    explicit Options(bool is_high_priority_stream = false);
    // Per-collective execution timeout; 0: HCCL_EXEC_TIMEOUT if set, else the group's timeout.
    std::chrono::milliseconds op_timeout{0};
    bool is_high_priority_stream;
    std::unordered_map<std::string, std::variant<int64_t, std::string>> hccl_config;
    std::string group_id;
  };

  ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   c10::intrusive_ptr<Options> options = c10::make_intrusive<Options>());
  ~ProcessGroupHCCL() override;

  const std::string getBackendName() const override { return "hccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  c10::intrusive_ptr<Options> options() const { return options_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

  // Not in torch_npu (the simulator's transports): how this rank reaches `peer` ("self",
  // "shm" or "tcp"), its TCP traffic so far and the ranks it has TCP connections with.
  std::string transport(int peer) const;
  std::map<std::string, int64_t> tcp_stats() const;
  std::vector<int> tcp_peers() const;
  std::string tcp_address() const;  // "ip:port" of this rank's listener ("" on one host)

  // torch_npu's extensions of ProcessGroupHCCL.
  // The communicator's name (the group's name, the same on every rank); with
  // init_comm=false "" while the communicator is not set up yet (no collective so far).
  std::string hccl_comm_name(int rankid, bool init_comm);
  // Id of the stream collectives run on (made now if need be); -1 for p2p streams not made yet.
  int64_t coll_stream_id(const c10::Device& device);
  int64_t p2p_stream_id(const c10::Device& device, int peer, bool is_batched);
  int64_t stream_id(bool p2p, int peer);
  // Uneven variants: rank r's part has split_sizes[r] rows (dim 0); empty: equal parts.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_uneven(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t> input_split_sizes,
                                                              const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> all_gather_into_tensor_uneven(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t> output_split_sizes,
                                                               const c10d::AllgatherOptions& opts);
  // torch_npu's reinit_process_group: abort_comm aborts the communicator (operations of the
  // group in flight on any rank fail) and the group's next operation builds a new one, a
  // rendezvous of every rank through the store (each rank must have aborted too); the
  // group's recorded error and sequence numbers start again. delete_store_keys drops this
  // rank's rendezvous keys of the current communicator. resume_comm(device): after
  // stop_device / restart_device; the simulator's stop leaves communicators as they are,
  // so there is nothing to resume beyond checking the device.
  void abort_comm(const std::string& reason);
  void resume_comm(int device);
  void delete_store_keys();

  // HcclGroupStart/End: operations are issued eagerly on their streams anyway, so a group
  // only has to be well nested.
  void group_start();
  void group_end();

  // Coalescing (`dist._coalescing_manager(group, device)`, batch_isend_irecv): the
  // operations issued between start and end run as usual, in order on their streams; the
  // Work endCoalescing() returns completes when all of them have.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

 private:
  // Coalesced: only joins the operations of a coalescing block (so that waiting for the
  // block adds no dependency between the other streams).
  enum class Lane { Collective, Send, Recv, Coalesced };
  // Queues `body` on the lane's stream of `device`; `tensors` are every tensor the op
  // touches (kept alive and record_stream'ed), `outputs` what the Work/future yield.
  c10::intrusive_ptr<c10d::Work> enqueue(const char* name, Lane lane, c10::DeviceIndex device,
                                         const std::vector<at::Tensor>& tensors, std::vector<at::Tensor> outputs,
                                         std::function<void(Comm&, uint64_t seq)> body);
  c10::DeviceIndex device_of(const std::vector<at::Tensor>& tensors, const char* name);
  c10::Stream stream_for(c10::DeviceIndex device, Lane lane);

  // The communicator, built now if abort_comm dropped it.
  const std::shared_ptr<Comm>& comm() const;
  // The store the current generation's communicator rendezvouses through.
  c10::intrusive_ptr<c10d::Store> generation_store() const;

  c10::intrusive_ptr<Options> options_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds connect_timeout_, exec_timeout_;
  std::string group_;
  int generation_ = 0;                 // communicators built after aborts
  mutable std::shared_ptr<Comm> comm_;  // nullptr after abort_comm until the next use
  std::shared_ptr<CommState> state_;  // first asynchronous error
  uint64_t seq_ = 0;                  // collectives issued
  uint64_t p2p_seq_ = 0;
  std::mutex mu_;
  std::map<std::pair<int, int>, c10::Stream> streams_;  // (device, lane)
  bool coalescing_ = false;
  int group_depth_ = 0;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;  // Works issued since startCoalescing
};

}  // namespace torch_npu::distributed
