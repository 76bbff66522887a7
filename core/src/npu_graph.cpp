// NPUGraph: capture and replay through the simulator's aclmdlRI API (see npu_graph.h).
#include "torch_npu/core/npu_graph.h"

#include <ATen/core/GraphImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_generator.h"
#include "torch_npu/core/npu_task_queue.h"

namespace torch_npu {
namespace {

std::atomic<CaptureId_t> g_pool_uid{1};

}  // namespace

CaptureStatus captureStatus(const NPUStream& stream) {
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  NPU_CHECK(aclmdlRICaptureGetInfo(stream.stream(), &status, nullptr));
  return static_cast<CaptureStatus>(status);
}

bool isStreamCapturing(const NPUStream& stream) { return captureStatus(stream) != CaptureStatus::None; }

bool currentStreamCapturing() { return isStreamCapturing(getCurrentNPUStream()); }

bool isStreamRecording(const NPUStream& stream) {
  if (isStreamCapturing(stream)) return true;
  aclmdlRI updating = nullptr;
  NPU_CHECK(aclsimStreamTaskUpdateModel(stream.stream(), &updating));
  return updating != nullptr;
}

void graph_task_group_begin(const NPUStream& stream) { NPU_CHECK(aclmdlRICaptureTaskGrpBegin(stream.stream())); }

aclrtTaskGrp graph_task_group_end(const NPUStream& stream) {
  aclrtTaskGrp group = nullptr;
  NPU_CHECK(aclmdlRICaptureTaskGrpEnd(stream.stream(), &group));
  return group;
}

void graph_task_update_begin(const NPUStream& stream, aclrtTaskGrp group) {
  NPU_CHECK(aclmdlRICaptureTaskUpdateBegin(stream.stream(), group));
}

void graph_task_update_end(const NPUStream& stream) { NPU_CHECK(aclmdlRICaptureTaskUpdateEnd(stream.stream())); }

MempoolId_t graph_pool_handle() { return {0, g_pool_uid.fetch_add(1)}; }

void fail_capture(const NPUStream& stream, const std::string& msg) {
  aclsimCaptureInvalidate(stream.stream(), msg.c_str());
  TORCH_CHECK(false, msg);
}

NPUGraph::NPUGraph() = default;

NPUGraph::~NPUGraph() {
  try {
    reset();
  } catch (const std::exception& e) {
    TORCH_WARN("NPUGraph: reset in the destructor failed: ", e.what());
  }
}

void NPUGraph::capture_begin(MempoolId_t pool, aclmdlRICaptureMode mode) {
  TORCH_CHECK(!NPUCachingAllocator::pinnedConfig().expandable_segments,
              "ACLGraph capture is not supported when pin_memory_expandable_segments=True: the expandable "
              "pinned-host pool has no private pool for the pinned blocks a capture allocates, which could be "
              "recycled while the graph still uses them. Unset pin_memory_expandable_segments in "
              "PYTORCH_NPU_ALLOC_CONF to capture graphs, or avoid pin_memory calls inside capture regions.");
  TORCH_CHECK(!has_graph_exec_ && !capturing_,
              "This NPUGraph instance already owns a captured graph. To capture a new graph, create a new "
              "instance or call reset() first.");
  NPUStream stream = getCurrentNPUStream();
  TORCH_CHECK(stream != getDefaultNPUStream(stream.device_index()),
              "NPU graphs must be captured on a non-default stream. (However, after capture, it's ok to replay "
              "them on the default stream.)");
  if (pool.first != 0 || pool.second != 0) {
    TORCH_CHECK(!(pool.first != 0 && pool.second != 0), "capture_begin: invalid pool id (", pool.first, ", ",
                pool.second, "); pass another graph's pool() or torch.npu.graph_pool_handle()");
    mempool_id_ = pool;
  } else {
    mempool_id_ = {g_pool_uid.fetch_add(1), 0};
  }
  capture_dev_ = stream.device_index();
  // Work queued before the capture still runs on the stream's worker; only what is
  // launched from here on is recorded.
  NPU_CHECK(aclmdlRICaptureBegin(stream.stream(), mode));
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI model = nullptr;
  NPU_CHECK(aclmdlRICaptureGetInfo(stream.stream(), &status, &model));
  TORCH_INTERNAL_ASSERT(status == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE && model != nullptr);
  begin_random_capture(model);
  // Streams recording into this capture (it and the streams that joined it) allocate
  // from the pool.
  NPUCachingAllocator::beginAllocateToPool(capture_dev_, mempool_id_, [model](aclrtStream s) {
    aclmdlRICaptureStatus st = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    aclmdlRI m = nullptr;
    return aclmdlRICaptureGetInfo(s, &st, &m) == ACL_SUCCESS && m == model;
  });
  pool_in_use_ = true;
  capturing_ = true;
  capture_stream_ = stream;
}

void NPUGraph::capture_end() {
  TORCH_CHECK(capturing_, "NPUGraph::capture_end() called before capture_begin().");
  NPUStream stream = getCurrentNPUStream(capture_dev_);
  TORCH_CHECK(stream == *capture_stream_, "Capture must end on the same stream it began on.");
  aclmdlRI model = nullptr;
  const aclError err = aclmdlRICaptureEnd(stream.stream(), &model);
  const std::string msg = err == ACL_SUCCESS ? "" : aclGetRecentErrMsg();
  capturing_ = false;
  NPUCachingAllocator::endAllocateToPool(capture_dev_, mempool_id_);
  if (err != ACL_SUCCESS) {
    // Nothing to replay: give the pool back (what the capture allocated returns as freed).
    pool_in_use_ = false;
    NPUCachingAllocator::releasePool(capture_dev_, mempool_id_);
    TORCH_CHECK(false, "NPU graph capture failed: ", msg, " [ACL error ", err, " from aclmdlRICaptureEnd]");
  }
  model_ = model;
  has_graph_exec_ = true;
  if (debug_) aclmdlRIDebugPrint(model_);
}

void NPUGraph::replay() {
  TORCH_CHECK(has_graph_exec_, "Called NPUGraph::replay without a preceding successful capture.");
  NPUStream stream = getCurrentNPUStream(capture_dev_);
  collect_finished_kernels();
  replay_random_draws(model_, stream);
  NPU_CHECK(aclmdlRIExecuteAsync(model_, stream.stream()));
}

void NPUGraph::reset() {
  if (capturing_) {
    // Abandoned capture (e.g. an exception inside `with torch.npu.graph(g)`): end it.
    aclmdlRI model = nullptr;
    if (aclmdlRICaptureEnd(capture_stream_->stream(), &model) == ACL_SUCCESS && model) aclmdlRIDestroy(model);
    capturing_ = false;
    NPUCachingAllocator::endAllocateToPool(capture_dev_, mempool_id_);
  }
  if (has_graph_exec_) {
    // Queued replays keep the model (and the memory its kernels hold) until they ran.
    forget_captured_model(model_);
    NPU_CHECK(aclmdlRIDestroy(model_));
    model_ = nullptr;
    has_graph_exec_ = false;
  }
  if (pool_in_use_) {
    pool_in_use_ = false;
    NPUCachingAllocator::releasePool(capture_dev_, mempool_id_);
  }
}

MempoolId_t NPUGraph::pool() const {
  TORCH_CHECK(has_graph_exec_, "Called NPUGraph::pool() without a preceding successful capture.");
  return mempool_id_;
}

void NPUGraph::enable_debug_mode() { debug_ = true; }

void NPUGraph::debug_dump(const std::string& path) {
  if (!has_graph_exec_) {
    TORCH_WARN("Called NPUGraph::debug_dump without a preceding successful capture.");
    return;
  }
  NPU_CHECK(aclmdlRIDebugJsonPrint(model_, path.c_str(), 1));
}

size_t NPUGraph::num_tasks() const {
  if (!has_graph_exec_) return 0;
  size_t n = 0;
  NPU_CHECK(aclsimModelRIInfo(model_, &n, nullptr));
  return n;
}

namespace {

aclmdlRICaptureMode to_acl(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL;
    case at::GraphCaptureMode::Relaxed:
      return ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
    default:  // "default" is torch_npu's default, "global"
      return ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
  }
}

// torch.accelerator.Graph on npu: PyTorch's device-generic graph API, served by NPUGraph.
// capture_end already yields the executable model, so instantiate() has nothing left to do
// (keep_graph=True changes nothing: the captured model is always kept until reset).
struct NPUGraphImpl final : at::GraphImplInterface {
  explicit NPUGraphImpl(const at::GraphImplArgs& /*args*/) {}
  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) override {
    graph_.capture_begin(pool, to_acl(mode));
  }
  void capture_end() override { graph_.capture_end(); }
  void instantiate() override {
    TORCH_CHECK(graph_.has_graph(), "Called NPUGraph::instantiate without a preceding successful capture.");
  }
  void replay() override { graph_.replay(); }
  void reset() override { graph_.reset(); }
  at::MempoolId_t pool() const override { return graph_.pool(); }
  void enable_debug_mode() override { graph_.enable_debug_mode(); }
  void debug_dump(const std::string& path) override { graph_.debug_dump(path); }

  NPUGraph graph_;
};

}  // namespace
}  // namespace torch_npu

namespace at {
// The registry key is c10::DeviceTypeName(PrivateUse1) once the backend is named "npu".
C10_REGISTER_CLASS(GraphImplRegistry, NPU, torch_npu::NPUGraphImpl)
}  // namespace at
