// torch_npu._C bindings of NPU graphs (torch.npu.NPUGraph & co, see npu/graphs.py).
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "torch_npu/core/npu_caching_allocator.h"
#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"
#include "torch_npu/ops/zero_copy.h"

namespace py = pybind11;

namespace torch_npu {

namespace {

aclmdlRICaptureMode capture_mode(const std::string& mode) {
  if (mode == "global") return ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
  if (mode == "thread_local") return ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL;
  if (mode == "relaxed") return ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
  TORCH_CHECK(false, "Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got ", mode);
}

// ---- host kernels on the stream (Inductor's generated C++ kernels, see
// torch_npu/_inductor/runtime.py and codegen.py) -------------------------------------
// Each generated kernel module has, next to `kernel(T0, T1, ...)`, an entry
// `void npu_kernel_entry(const uintptr_t* words)` that converts one 64-bit word per
// argument back to the kernel's parameter type (pointers, integers, and a double's bits
// for float parameters) and calls the kernel: the compiler of the module knows the
// calling convention, so no argument type needs one here.
using HostKernelEntry = void (*)(const uintptr_t*);

// Task names must outlive their tasks (and the graphs recording them).
const char* intern_name(const std::string& name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

// Queues `entry(words)` on the current stream of `device` (recorded while it captures).
// Tensor arguments become their data pointers when the kernel runs, read from CPU
// aliases that keep their npu storages alive as long as the task (or graph) exists
// (CPU tensors, e.g. the 0-dim scalars Inductor passes by pointer, are read when the
// kernel runs too); ints and floats are taken by value: a graph's replays use the values
// of the capture, as CUDA graphs' kernel arguments. A `parallel` kernel (OpenMP) counts as
// large for runs_on_caller: it runs on the calling thread, on the host's OpenMP team, once
// the stream has drained.
void launch_host_kernel(int device, const std::string& name, uintptr_t entry, const py::tuple& args, bool parallel) {
  TORCH_CHECK(entry != 0, "_npu_launch_host_kernel: expected the address of ", name, "'s entry function, got 0");
  std::vector<at::Tensor> tensors;
  std::vector<uintptr_t> words(args.size());
  std::vector<std::pair<size_t, size_t>> tensor_words;  // (argument, tensor) positions
  int64_t work_numel = parallel ? std::numeric_limits<int64_t>::max() : 0;
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* arg = args[i].ptr();
    if (THPVariable_Check(arg)) {
      const at::Tensor& t = THPVariable_Unpack(arg);
      tensor_words.emplace_back(i, tensors.size());
      tensors.push_back(t);
      work_numel = std::max(work_numel, t.numel());
    } else if (PyLong_Check(arg)) {  // bools too
      words[i] = static_cast<uintptr_t>(py::cast<int64_t>(args[i]));
    } else if (PyFloat_Check(arg)) {
      const double value = PyFloat_AS_DOUBLE(arg);
      static_assert(sizeof(value) == sizeof(uintptr_t), "a double must fit a word");
      std::memcpy(&words[i], &value, sizeof(value));
    } else {
      TORCH_CHECK(false, "_npu_launch_host_kernel: argument ", i, " of ", name,
                  " must be a tensor, an int or a float, got ", Py_TYPE(arg)->tp_name);
    }
  }
  const char* task_name = intern_name(name);
  py::gil_scoped_release no_gil;
  ops::launch_kernel(task_name, static_cast<c10::DeviceIndex>(device), std::move(tensors), work_numel,
                     [entry, words = std::move(words), tensor_words = std::move(tensor_words)](
                         const std::vector<at::Tensor>& aliases) mutable {
                       for (const auto& [word, tensor] : tensor_words) {
                         words[word] = reinterpret_cast<uintptr_t>(aliases[tensor].data_ptr());
                       }
                       reinterpret_cast<HostKernelEntry>(entry)(words.data());
                     });
}

// Before a host kernel of an Inductor graph (outside a capture): waits for the work
// queued on the current stream of `device`; an idle stream is only queried, which is
// several times cheaper than a synchronize. While the stream captures, the query fails
// the capture (107027).
void host_kernel_wait(int device) {
  const NPUStream stream = getCurrentNPUStream(static_cast<c10::DeviceIndex>(device));
  if (!stream.query()) {
    py::gil_scoped_release no_gil;
    stream.synchronize();
  }
}

// ---- Python host functions on a stream (torch_npu's _launch_host_func) --------------
// A Python callable and its argument, owned by tasks (and graphs recording them) that may
// be destroyed on any thread: the references are dropped under the GIL.
struct HostFunc {
  py::object fn, data;
  ~HostFunc() {
    py::gil_scoped_acquire gil;
    fn = py::object();
    data = py::object();
  }
};

void call_host_func(const HostFunc& f) {
  py::gil_scoped_acquire gil;
  try {
    f.fn(f.data);
  } catch (py::error_already_set& e) {
    throw std::runtime_error(std::string("host function raised: ") + e.what());
  }
}

// Pending host functions: queued by their stream's task, run by a Python thread
// (torch_npu.npu._host_func_runner), so the stream does not wait for them.
struct PendingQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<HostFunc>> items;
};

PendingQueue& pending() {
  static auto* q = new PendingQueue();  // leaked: the runner thread may outlive statics
  return *q;
}

NPUStream stream_of(int64_t stream_id, int64_t device) {
  NPUStream s(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1,
                                                           static_cast<c10::DeviceIndex>(device)), stream_id));
  s.stream();  // validates the id
  return s;
}

void launch_host_func(int64_t stream_id, int64_t device, py::object fn, py::object data, bool wait) {
  TORCH_CHECK(PyCallable_Check(fn.ptr()), "_launch_host_func: argument 'fn' must be callable, got ",
              py::str(py::type::of(fn)).cast<std::string>());
  auto f = std::make_shared<HostFunc>();
  f->fn = std::move(fn);
  f->data = std::move(data);
  NPUStream stream = stream_of(stream_id, device);
  py::gil_scoped_release no_gil;
  if (wait) {
    launch(stream, "host_func", [f] { call_host_func(*f); });
  } else {
    launch(stream, "host_func_pending", [f] {
      PendingQueue& q = pending();
      {
        std::lock_guard<std::mutex> lock(q.mu);
        q.items.push_back(f);
      }
      q.cv.notify_one();
    });
  }
}

// The next pending host function (blocks without the GIL until there is one), run here.
void run_next_pending_host_func() {
  std::shared_ptr<HostFunc> f;
  {
    py::gil_scoped_release no_gil;
    PendingQueue& q = pending();
    std::unique_lock<std::mutex> lock(q.mu);
    q.cv.wait(lock, [&q] { return !q.items.empty(); });
    f = std::move(q.items.front());
    q.items.pop_front();
  }
  f->fn(f->data);
}

// The handle of a captured task group (graph_task_group_end), as torch_npu's _NPUTaskGroupHandle.
struct TaskGroupHandle {
  aclrtTaskGrp task_group = nullptr;
};

// torch.npu.ExternalEvent's event: an ACL_EVENT_EXTERNAL event (a flag a record sets and a
// reset clears; a wait, also one recorded into a graph, waits for it), created on first use.
class ExternalEvent {
 public:
  ~ExternalEvent() {
    if (event_ != nullptr) aclrtDestroyEvent(event_);  // queued tasks and graphs keep it until done
  }
  void record(int64_t stream_id, int64_t device) {
    NPUStream s = stream_of(stream_id, device);
    NPU_CHECK(aclrtRecordEvent(get(s), s.stream()));
  }
  void wait(int64_t stream_id, int64_t device) {
    NPUStream s = stream_of(stream_id, device);
    NPU_CHECK(aclrtStreamWaitEvent(s.stream(), get(s)));
  }
  void reset(int64_t stream_id, int64_t device) {
    NPUStream s = stream_of(stream_id, device);
    NPU_CHECK(aclrtResetEvent(get(s), s.stream()));
  }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(event_); }

 private:
  aclrtEvent get(const NPUStream& s) {
    if (event_ == nullptr) {
      NPU_CHECK(aclrtCreateEventWithFlag(&event_, ACL_EVENT_EXTERNAL));
      device_ = s.device_index();
    }
    TORCH_CHECK(s.device_index() == device_, "ExternalEvent: the event belongs to npu:", device_,
                ", the stream to npu:", s.device_index());
    return event_;
  }
  aclrtEvent event_ = nullptr;
  c10::DeviceIndex device_ = -1;
};

}  // namespace

void init_graph_bindings(py::module& m) {
  py::class_<TaskGroupHandle>(m, "_NPUTaskGroupHandle")
      .def_property_readonly("task_group",
                             [](const TaskGroupHandle& h) { return reinterpret_cast<uintptr_t>(h.task_group); })
      .def("__repr__", [](const TaskGroupHandle& h) {
        return "<torch_npu._C._NPUTaskGroupHandle " + std::to_string(reinterpret_cast<uintptr_t>(h.task_group)) + ">";
      });
  m.def("_graph_task_group_begin", [](int64_t stream_id, int64_t device) {
    graph_task_group_begin(stream_of(stream_id, device));
  });
  m.def("_graph_task_group_end", [](int64_t stream_id, int64_t device) {
    return TaskGroupHandle{graph_task_group_end(stream_of(stream_id, device))};
  });
  m.def("_graph_task_update_begin", [](int64_t stream_id, int64_t device, const TaskGroupHandle& handle) {
    graph_task_update_begin(stream_of(stream_id, device), handle.task_group);
  });
  m.def("_graph_task_update_end", [](int64_t stream_id, int64_t device) {
    graph_task_update_end(stream_of(stream_id, device));
  }, py::call_guard<py::gil_scoped_release>());
  py::class_<ExternalEvent>(m, "_NPUExternalEvent")
      .def(py::init<>())
      .def("record", &ExternalEvent::record)
      .def("wait", &ExternalEvent::wait)
      .def("reset", &ExternalEvent::reset)
      .def_property_readonly("npu_event", &ExternalEvent::address);
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
      // (its warning, "without a preceding successful capture", as a Python warning)
      .def("debug_dump", torch::wrap_pybind_function([](NPUGraph& self, const std::string& path) {
             self.debug_dump(path);
           }), py::arg("debug_path"))
      .def("_num_tasks", &NPUGraph::num_tasks);
  m.def("_npu_launch_host_kernel", &launch_host_kernel, py::arg("device"), py::arg("name"), py::arg("entry"),
        py::arg("args"), py::arg("parallel") = false);
  m.def("_npu_host_kernel_wait", &host_kernel_wait, py::arg("device"));
  m.def("_npu_is_stream_capturing", [](int device) {
    return isStreamCapturing(getCurrentNPUStream(static_cast<c10::DeviceIndex>(device)));
  }, py::arg("device"));
  m.def("_npu_launch_host_func", &launch_host_func, py::arg("stream_id"), py::arg("device"), py::arg("fn"),
        py::arg("data"), py::arg("wait"));
  m.def("_npu_run_next_pending_host_func", &run_next_pending_host_func);
  m.def("_graph_pool_handle", &graph_pool_handle);
  m.def("_npu_isCurrentStreamCapturing", &currentStreamCapturing);
  m.def("_npu_graphPoolInfo", [](int device, MempoolId_t pool) {
    return NPUCachingAllocator::graphPoolInfo(static_cast<c10::DeviceIndex>(device), pool);
  });
}

}  // namespace torch_npu
