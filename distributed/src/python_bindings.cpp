// torch_npu._C._distributed_c10d: ProcessGroupHCCL as a subclass of torch's c10d Backend
// (and its Options of Backend.Options), as torch registers ProcessGroupGloo.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "torch_npu/distributed/process_group_hccl.h"
#include "torch_npu/distributed/python.h"

namespace py = pybind11;

namespace torch_npu::distributed {

void init_python_bindings(PyObject* module) {
  auto m = py::reinterpret_borrow<py::module_>(module).def_submodule("_distributed_c10d", "HCCL backend");
  auto c10d = py::module_::import("torch._C._distributed_c10d");
  using PG = ProcessGroupHCCL;
  auto pg = py::class_<PG, c10::intrusive_ptr<PG>>(m, "ProcessGroupHCCL", c10d.attr("Backend"));
  pg.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout) {
           auto options = c10::make_intrusive<PG::Options>();
           options->timeout = timeout;
           return c10::make_intrusive<PG>(store, rank, size, options);
         }),
         py::arg("store"), py::arg("rank"), py::arg("size"),
         py::arg("timeout") = std::chrono::milliseconds(::kBackendDefaultTimeout),
         py::call_guard<py::gil_scoped_release>())
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, c10::intrusive_ptr<PG::Options>>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("options", &PG::options)
      // torch_npu's extensions.
      .def("get_hccl_comm_name", &PG::hccl_comm_name, py::arg("rankid"), py::arg("init_comm") = true,
           py::call_guard<py::gil_scoped_release>())
      .def("get_coll_stream_id", &PG::coll_stream_id, py::arg("device"))
      .def("get_p2p_stream_id", &PG::p2p_stream_id, py::arg("device"), py::arg("peer"), py::arg("is_batched"))
      .def("_get_stream_id", &PG::stream_id, py::arg("p2p") = false, py::arg("peer") = -1)
      .def("reduce_scatter_tensor_uneven", &PG::reduce_scatter_tensor_uneven, py::arg("output"), py::arg("input"),
           py::arg("input_split_sizes") = std::vector<int64_t>{}, py::arg("opts") = c10d::ReduceScatterOptions(),
           py::call_guard<py::gil_scoped_release>())
      .def("all_gather_into_tensor_uneven", &PG::all_gather_into_tensor_uneven, py::arg("output"), py::arg("input"),
           py::arg("output_split_sizes") = std::vector<int64_t>{}, py::arg("opts") = c10d::AllgatherOptions(),
           py::call_guard<py::gil_scoped_release>())
      .def("abort_hccl_comm", &PG::abort_comm, py::arg("reason"))
      .def("resume_hccl_comm", &PG::resume_comm, py::arg("device_id"))
      .def("_delete_tcpstore_key", &PG::delete_store_keys)
      .def("_group_start", &PG::group_start)
      .def("_group_end", &PG::group_end)
      // Simulator introspection (not torch_npu API): the transport to a peer, TCP counters.
      .def("_transport", &PG::transport, py::arg("peer"))
      .def("_tcp_stats", &PG::tcp_stats)
      .def("_tcp_peers", &PG::tcp_peers)
      .def("_tcp_address", &PG::tcp_address);
  py::class_<PG::Options, c10::intrusive_ptr<PG::Options>>(pg, "Options", c10d.attr("Backend").attr("Options"))
      .def(py::init<bool>(), py::arg("is_high_priority_stream") = false)
      .def_readwrite("op_timeout", &PG::Options::op_timeout)
      .def_readwrite("is_high_priority_stream", &PG::Options::is_high_priority_stream)
      .def_readwrite("hccl_config", &PG::Options::hccl_config)
      .def_readwrite("group_id", &PG::Options::group_id);
}

}  // namespace torch_npu::distributed
