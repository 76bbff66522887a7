// NPU graphs (torch.npu.NPUGraph): capture the work launched on a stream into a model
// runtime instance of the simulator (aclmdlRICaptureBegin/End) and replay it with one
// aclmdlRIExecuteAsync. As CUDA graphs: memory allocated on the capturing stream comes
// from a private pool of the caching allocator that lives as long as a graph uses it,
// synchronising with a capturing stream fails and invalidates the capture, and the graph
// is replayed on the memory it was captured with.
#pragma once

#include <acl/acl_rt.h>

#include <optional>
#include <string>
#include <utility>

#include "torch_npu/core/npu_stream.h"

namespace torch_npu {

using CaptureId_t = unsigned long long;
// first: set by NPUGraph::capture_begin; second: set by graph_pool_handle().
using MempoolId_t = std::pair<CaptureId_t, CaptureId_t>;

enum class CaptureStatus : int { None = 0, Active = 1, Invalidated = 2 };

CaptureStatus captureStatus(const NPUStream& stream);
// True while `stream` takes part in a capture (active or invalidated).
bool isStreamCapturing(const NPUStream& stream);
// torch.npu.is_current_stream_capturing().
bool currentStreamCapturing();
// True while work launched on `stream` is recorded instead of run: it captures, or it
// records a task group update (graph_task_update_begin). Ops keep what such work uses.
bool isStreamRecording(const NPUStream& stream);

// Task groups of a capture and their updates (torch.npu.graph_task_group_begin & co, over
// aclmdlRICaptureTaskGrp* / aclmdlRICaptureTaskUpdate*): the work launched on a capturing
// stream between group begin and end can be launched again, with new parameters, on
// another stream between update begin and end; the graph's replays then run that.
void graph_task_group_begin(const NPUStream& stream);
aclrtTaskGrp graph_task_group_end(const NPUStream& stream);
void graph_task_update_begin(const NPUStream& stream, aclrtTaskGrp group);
void graph_task_update_end(const NPUStream& stream);
// A pool id no capture uses yet (torch.npu.graph_pool_handle()).
MempoolId_t graph_pool_handle();
// Invalidates the capture `stream` takes part in and throws c10::Error(msg): for
// operations found to be uncapturable while capturing, so that the capture cannot end
// with the operation silently missing.
[[noreturn]] void fail_capture(const NPUStream& stream, const std::string& msg);

class NPUGraph {
 public:
  NPUGraph();
  ~NPUGraph();
  NPUGraph(const NPUGraph&) = delete;
  NPUGraph& operator=(const NPUGraph&) = delete;

  // On the current stream (not the default one). pool: {0, 0} for a new private pool,
  // else another graph's pool() or a graph_pool_handle() to share.
  void capture_begin(MempoolId_t pool = {0, 0},
                     aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL);
  void capture_end();
  // Enqueues the captured work on the current stream.
  void replay();
  // Frees the graph and releases its pool (memory returns once no tensor uses it).
  void reset();
  MempoolId_t pool() const;
  void enable_debug_mode();
  void debug_dump(const std::string& path);
  // Recorded tasks (0 before a successful capture).
  size_t num_tasks() const;
  bool has_graph() const { return has_graph_exec_; }

 private:
  aclmdlRI model_ = nullptr;        // after a successful capture
  bool has_graph_exec_ = false;
  bool capturing_ = false;
  bool pool_in_use_ = false;        // holds a reference to mempool_id_
  bool debug_ = false;
  MempoolId_t mempool_id_{0, 0};
  std::optional<NPUStream> capture_stream_;
  c10::DeviceIndex capture_dev_ = -1;
};

}  // namespace torch_npu
