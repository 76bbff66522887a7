// Graph capture memory of the NPU caching allocator: private pools (beginAllocateToPool
// & co), frees during a capture, and the NPUGraph C++ class around them.
#include <torch_npu/core/npu_caching_allocator.h>
#include <torch_npu/core/npu_graph.h>
#include <torch_npu/core/npu_stream.h>

#include <acl/acl_rt.h>

#include "check.h"

#include <c10/util/Exception.h>

#include <string>

namespace alloc = torch_npu::NPUCachingAllocator;
using torch_npu::MempoolId_t;
using torch_npu::NPUStream;

namespace {

aclmdlRI capture_model(const NPUStream& s) {
  aclmdlRICaptureStatus st = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI m = nullptr;
  aclmdlRICaptureGetInfo(s.stream(), &st, &m);
  return m;
}

void test_private_pool() {
  NPUStream s = torch_npu::getStreamFromPool(false, 0);
  NPUStream other = torch_npu::getStreamFromPool(true, 0);
  REQUIRE(s != other);
  // A block of the capturing stream's ordinary pool, freed during the capture.
  void* before = alloc::raw_alloc_with_stream(4096, s);
  const MempoolId_t pool{1000, 0};
  CHECK_OK(aclmdlRICaptureBegin(s.stream(), ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
  aclmdlRI model = capture_model(s);
  alloc::beginAllocateToPool(0, pool, [model](aclrtStream st) {
    aclmdlRICaptureStatus status;
    aclmdlRI m = nullptr;
    return aclmdlRICaptureGetInfo(st, &status, &m) == ACL_SUCCESS && m == model;
  });
  CHECK(alloc::graphPoolInfo(0, pool) == std::make_pair(1, size_t(0)));
  void* a = alloc::raw_alloc_with_stream(4096, s);
  CHECK(alloc::graphPoolInfo(0, pool).second == 1);  // a segment of the pool
  alloc::raw_delete(before);                          // deferred: the stream captures
  void* b = alloc::raw_alloc_with_stream(4096, s);
  CHECK(b != before);                                 // not from the ordinary pool
  alloc::raw_delete(a);
  void* c = alloc::raw_alloc_with_stream(4096, s);
  CHECK(c == a);                                      // reused in capture order
  void* o = alloc::raw_alloc_with_stream(4096, other);  // another stream: not the pool
  CHECK(o != a && o != b);
  aclmdlRI ended = nullptr;
  CHECK_OK(aclmdlRICaptureEnd(s.stream(), &ended));  // as NPUGraph: end, then stop the pool
  CHECK(ended == model);
  alloc::endAllocateToPool(0, pool);
  // After the capture the stream allocates from its ordinary pool again.
  void* d = alloc::raw_alloc_with_stream(4096, s);
  CHECK(d == before);  // the deferred free came back
  // Released while blocks are alive: the pool stays until they are freed.
  alloc::releasePool(0, pool);
  CHECK(alloc::graphPoolInfo(0, pool).first == 0);
  alloc::raw_delete(b);
  CHECK(alloc::graphPoolInfo(0, pool).first == 0);
  alloc::raw_delete(c);
  CHECK(alloc::graphPoolInfo(0, pool) == std::make_pair(-1, size_t(0)));  // gone
  alloc::raw_delete(o);
  alloc::raw_delete(d);
  CHECK_OK(aclmdlRIDestroy(ended));
  bool threw = false;
  try {
    alloc::releasePool(0, pool);
  } catch (const c10::Error& e) {
    threw = std::string(e.what_without_backtrace()).find("no graph memory pool") != std::string::npos;
  }
  CHECK(threw);
}

void test_npugraph_class() {
  NPUStream s = torch_npu::getStreamFromPool(false, 0);
  torch_npu::NPUGraph g;
  bool threw = false;
  try {
    g.capture_begin();  // the current stream is the default stream
  } catch (const c10::Error& e) {
    threw = std::string(e.what_without_backtrace()).find("non-default stream") != std::string::npos;
  }
  CHECK(threw);
  torch_npu::setCurrentNPUStream(s);
  g.capture_begin();
  CHECK(torch_npu::currentStreamCapturing());
  void* p = alloc::raw_alloc(1 << 20);
  g.capture_end();
  CHECK(!torch_npu::currentStreamCapturing());
  const MempoolId_t pool = g.pool();
  CHECK(pool.first != 0 && pool.second == 0);
  CHECK(alloc::graphPoolInfo(0, pool).first == 1);
  g.replay();  // nothing recorded: an empty model runs
  s.synchronize();
  g.reset();
  alloc::raw_delete(p);
  CHECK(alloc::graphPoolInfo(0, pool).first == -1);
  torch_npu::setCurrentNPUStream(torch_npu::getDefaultNPUStream(0));
  const MempoolId_t handle = torch_npu::graph_pool_handle();
  CHECK(handle.first == 0 && handle.second != 0);
}

}  // namespace

int main() {
  setenv("ASCEND_SIM_HBM_BYTES", "4G", 1);
  setenv("ASCEND_SIM_DEVICE_COUNT", "1", 1);
  test_private_pool();
  test_npugraph_class();
  return Finish();
}
