// torch_npu._C bindings of NPU graphs (torch.npu.NPUGraph & co, see npu/graphs.py).
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_graph.h"

namespace py = pybind11;

namespace torch_npu {

namespace {

aclmdlRICaptureMode capture_mode(const std::string& mode) {
  if (mode == "global") return ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
  if (mode == "thread_local") return ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL;
  if (mode == "relaxed") return ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
  TORCH_CHECK(false, "Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got ", mode);
}

}  // namespace

void init_graph_bindings(py::module& m) {
  py::class_<NPUGraph, std::shared_ptr<NPUGraph>>(m, "_NPUGraph")
      .def(py::init<>())
      .def(
          "capture_begin",
          [](NPUGraph& self, std::optional<MempoolId_t> pool, const std::string& capture_error_mode) {
            const aclmdlRICaptureMode mode = capture_mode(capture_error_mode);
            py::gil_scoped_release no_gil;
            self.capture_begin(pool.value_or(MempoolId_t{0, 0}), mode);
          },
          py::arg("pool") = py::none(), py::arg("capture_error_mode") = "global")
      .def("capture_end", &NPUGraph::capture_end, py::call_guard<py::gil_scoped_release>())
      .def("replay", &NPUGraph::replay, py::call_guard<py::gil_scoped_release>())
      .def("reset", &NPUGraph::reset, py::call_guard<py::gil_scoped_release>())
      .def("pool", &NPUGraph::pool)
      .def("enable_debug_mode", &NPUGraph::enable_debug_mode)
      .def("debug_dump", &NPUGraph::debug_dump, py::arg("debug_path"))
      .def("_num_tasks", &NPUGraph::num_tasks);
  m.def("_graph_pool_handle", &graph_pool_handle);
  m.def("_npu_isCurrentStreamCapturing", &currentStreamCapturing);
  m.def("_npu_graphPoolInfo", [](int device, MempoolId_t pool) {
    return NPUCachingAllocator::graphPoolInfo(static_cast<c10::DeviceIndex>(device), pool);
  });
}

}  // namespace torch_npu
