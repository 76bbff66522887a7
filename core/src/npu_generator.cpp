#include "torch_npu/core/npu_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/CallOnce.h>

#include <cstring>

#include <deque>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

namespace torch_npu {

namespace {

constexpr const char* kSeedDuringCapture =
    "NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed is the same as the "
    "original seed.";

// The 8 bytes after the Philox offset in a state: 0, or a capture's tag (see Capture).
uint64_t capture_tag(uint32_t serial, uint32_t position) { return (uint64_t{serial} << 32) | (position + 1u); }

}  // namespace

namespace {

struct DrawOrder {
  std::mutex mu;
  std::unordered_set<aclmdlRI> random_models;               // captures that drew
  std::unordered_map<c10::DeviceIndex, aclrtEvent> last_replay;  // per device, or absent
};

DrawOrder& draw_order() {
  static DrawOrder* order = new DrawOrder();  // leaked: used during exit
  return *order;
}

// A draw on the host waits for the random replays enqueued before it.
void wait_for_random_replays(c10::DeviceIndex device) {
  DrawOrder& order = draw_order();
  std::lock_guard<std::mutex> lock(order.mu);
  auto it = order.last_replay.find(device);
  if (it == order.last_replay.end()) return;
  const aclrtEvent last = it->second;
  order.last_replay.erase(it);
  const aclError err = wait_event(last);
  aclrtDestroyEvent(last);
  NPU_CHECK(err);
}

}  // namespace

bool captured_random_draws(aclmdlRI model) {
  DrawOrder& order = draw_order();
  std::lock_guard<std::mutex> lock(order.mu);
  return order.random_models.count(model) > 0;
}

void forget_captured_model(aclmdlRI model) {
  DrawOrder& order = draw_order();
  std::lock_guard<std::mutex> lock(order.mu);
  order.random_models.erase(model);
}

void replay_in_draw_order(const NPUStream& stream, const std::function<void()>& enqueue) {
  DrawOrder& order = draw_order();
  std::lock_guard<std::mutex> lock(order.mu);
  auto it = order.last_replay.find(stream.device_index());
  if (it != order.last_replay.end()) {
    const aclrtEvent last = it->second;
    order.last_replay.erase(it);
    const aclError err = aclrtStreamWaitEvent(stream.stream(), last);
    aclrtDestroyEvent(last);  // the queued wait keeps it until it has run
    NPU_CHECK(err);
  }
  enqueue();
  aclrtEvent done = nullptr;
  NPU_CHECK(aclrtCreateEventWithFlag(&done, ACL_EVENT_SYNC));
  NPU_CHECK(aclrtRecordEvent(done, stream.stream()));
  order.last_replay[stream.device_index()] = done;
}

}  // namespace torch_npu

// The generator's members: torch_npu's public class (NPUGeneratorImpl.h).
namespace at_npu {

using namespace torch_npu;

NPUGeneratorImpl::NPUGeneratorImpl(c10::DeviceIndex device_index)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device_index < 0 ? current_device() : device_index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {
  check_device_index(device().index());
}

// One capture into an NPU graph as this generator sees it. `position` counts the random
// kernels recorded so far (set back by a restore); `snapshots[p]` is filled, at each
// replay, with the state at position p. The recorded tasks share the snapshots, so they
// live as long as the graph.
struct NPUGeneratorImpl::Capture {
  aclmdlRI model = nullptr;
  uint32_t serial = 0;
  uint32_t position = 0;
  std::shared_ptr<std::vector<at::Tensor>> snapshots = std::make_shared<std::vector<at::Tensor>>();
};

NPUGeneratorImpl::Capture* NPUGeneratorImpl::capture() const {
  const NPUStream stream = getCurrentNPUStream(device().index());
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI model = nullptr;
  if (in_kernel() || aclmdlRICaptureGetInfo(stream.stream(), &status, &model) != ACL_SUCCESS ||
      status != ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE) {
    return nullptr;
  }
  if (!capture_ || capture_->model != model) {
    capture_ = std::make_shared<Capture>();
    capture_->model = model;
    capture_->serial = ++captures_;
  }
  return capture_.get();
}

void NPUGeneratorImpl::note_captured_draw() {
  {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    if (Capture* c = capture()) {
      ++c->position;
      DrawOrder& order = draw_order();
      std::lock_guard<std::mutex> order_lock(order.mu);
      order.random_models.insert(c->model);
      return;
    }
  }
  // Not under the generator's lock: the replays' kernels take it to draw.
  if (!in_kernel()) wait_for_random_replays(device().index());
}

void NPUGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  if (capture() != nullptr) {
    TORCH_CHECK(seed == cpu_.current_seed(), kSeedDuringCapture);
    return;  // the same seed: nothing changes
  }
  cpu_.set_current_seed(seed);
  philox_offset_ = 0;
}

uint64_t NPUGeneratorImpl::current_seed() const { return cpu_.current_seed(); }

uint64_t NPUGeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  TORCH_CHECK(capture() == nullptr, kSeedDuringCapture);
  philox_offset_ = 0;
  return cpu_.seed();
}

void NPUGeneratorImpl::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  philox_offset_ = offset;
}

uint64_t NPUGeneratorImpl::get_offset() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return philox_offset_;
}

std::pair<uint64_t, uint64_t> NPUGeneratorImpl::philox_engine_inputs(uint64_t increment) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  const uint64_t offset = philox_offset_;
  philox_offset_ += (increment + 3) / 4 * 4;
  return {cpu_.current_seed(), offset};
}

PhiloxNpuState NPUGeneratorImpl::philox_npu_state(uint64_t increment) {
  auto [seed, offset] = philox_engine_inputs(increment);
  return PhiloxNpuState(seed, offset);
}

void NPUGeneratorImpl::set_philox_offset_per_thread(uint64_t offset) { set_offset(offset); }
uint64_t NPUGeneratorImpl::philox_offset_per_thread() const { return get_offset(); }
c10::DeviceType NPUGeneratorImpl::device_type() { return c10::DeviceType::PrivateUse1; }

std::shared_ptr<NPUGeneratorImpl> NPUGeneratorImpl::clone() const {
  return std::shared_ptr<NPUGeneratorImpl>(clone_impl());
}

// The state is the CPU generator's state, the 8-byte Philox offset and an 8-byte capture
// tag (0 outside captures); a state without the tag, or also without the offset (an
// older torch_npu's), sets them to 0. The state torch_npu has on Ascend, the 8-byte seed and
// 8-byte Philox offset (or the seed alone), as in a checkpoint written there, sets the seed
// (as manual_seed) and the offset.
void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  const auto cpu_size = static_cast<int64_t>(cpu_.unsafeGetGeneratorImpl()->get_state()->numel());
  const int64_t size = new_state.numel();
  TORCH_CHECK(size == cpu_size || size == cpu_size + 8 || size == cpu_size + 16 || size == 8 || size == 16,
              "set_rng_state: expected an npu generator state of ", cpu_size + 16,
              " bytes (from get_rng_state()), or of 16 or 8 bytes (seed and Philox offset, or the seed, as "
              "torch_npu on Ascend has it), got ", size);
  at::Tensor state = at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(
                                    const_cast<c10::TensorImpl*>(&new_state)))
                         .contiguous();
  at::Tensor cpu_state;
  uint64_t offset = 0, tag = 0;
  if (size <= 16) {
    uint64_t seed = 0;
    std::memcpy(&seed, state.const_data_ptr<uint8_t>(), sizeof seed);
    if (size == 16) std::memcpy(&offset, state.const_data_ptr<uint8_t>() + 8, sizeof offset);
    auto seeded = at::make_generator<at::CPUGeneratorImpl>(seed);
    cpu_state = at::Tensor(seeded.get_state());
  } else {
    cpu_state = state.narrow(0, 0, cpu_size).clone();
    if (size >= cpu_size + 8) std::memcpy(&offset, state.const_data_ptr<uint8_t>() + cpu_size, sizeof offset);
    if (size == cpu_size + 16) std::memcpy(&tag, state.const_data_ptr<uint8_t>() + cpu_size + 8, sizeof tag);
  }
  if (Capture* c = capture()) {
    auto self = c10::intrusive_ptr<NPUGeneratorImpl>::reclaim_copy(this);
    const NPUStream stream = getCurrentNPUStream(device().index());
    if (tag != 0 && (tag >> 32) == c->serial) {
      // A state this capture gave: replays go back to where they were then.
      const uint32_t position = static_cast<uint32_t>(tag) - 1;
      c->position = position;
      launch(stream, "npu_generator_restore_state", [self, snapshots = c->snapshots, position] {
        const at::Tensor& snapshot = (*snapshots)[position];
        std::lock_guard<std::mutex> lock(self->cpu_.mutex());
        self->cpu_.unsafeGetGeneratorImpl()->set_state(
            *snapshot.narrow(0, 0, snapshot.numel() - 8).unsafeGetTensorImpl());
        std::memcpy(&self->philox_offset_, snapshot.const_data_ptr<uint8_t>() + snapshot.numel() - 8, 8);
      });
      return;
    }
    auto probe = at::make_generator<at::CPUGeneratorImpl>();
    probe.set_state(cpu_state);
    TORCH_CHECK(probe.current_seed() == cpu_.current_seed(), kSeedDuringCapture);
    launch(stream, "npu_generator_set_state", [self, cpu_state, offset] {
      std::lock_guard<std::mutex> lock(self->cpu_.mutex());
      self->cpu_.unsafeGetGeneratorImpl()->set_state(*cpu_state.unsafeGetTensorImpl());
      self->philox_offset_ = offset;
    });
    return;
  }
  cpu_.unsafeGetGeneratorImpl()->set_state(*cpu_state.unsafeGetTensorImpl());
  philox_offset_ = offset;
}

c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  at::Tensor cpu_state(cpu_.unsafeGetGeneratorImpl()->get_state());
  const int64_t cpu_size = cpu_state.numel();
  at::Tensor state = at::empty({cpu_size + 16}, cpu_state.options());
  std::memcpy(state.mutable_data_ptr<uint8_t>(), cpu_state.const_data_ptr<uint8_t>(), cpu_size);
  std::memcpy(state.mutable_data_ptr<uint8_t>() + cpu_size, &philox_offset_, sizeof philox_offset_);
  uint64_t tag = 0;
  if (Capture* c = capture()) {
    tag = capture_tag(c->serial, c->position);
    const uint32_t position = c->position;
    if (c->snapshots->size() <= position) c->snapshots->resize(position + 1);
    auto self = c10::intrusive_ptr<NPUGeneratorImpl>::reclaim_copy(const_cast<NPUGeneratorImpl*>(this));
    launch(getCurrentNPUStream(device().index()), "npu_generator_snapshot_state",
           [self, snapshots = c->snapshots, position] {
             std::lock_guard<std::mutex> lock(self->cpu_.mutex());
             at::Tensor cpu(self->cpu_.unsafeGetGeneratorImpl()->get_state());
             at::Tensor snapshot = at::empty({cpu.numel() + 8}, cpu.options());
             std::memcpy(snapshot.mutable_data_ptr<uint8_t>(), cpu.const_data_ptr<uint8_t>(), cpu.numel());
             std::memcpy(snapshot.mutable_data_ptr<uint8_t>() + cpu.numel(), &self->philox_offset_, 8);
             (*snapshots)[position] = snapshot;
           });
  }
  std::memcpy(state.mutable_data_ptr<uint8_t>() + cpu_size + 8, &tag, sizeof tag);
  return state.getIntrusivePtr();
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* gen = new NPUGeneratorImpl(device().index());
  gen->cpu_ = cpu_.clone();
  gen->philox_offset_ = philox_offset_;
  return gen;
}

}  // namespace at_npu

namespace torch_npu {

const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::deque<at::Generator> defaults;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      defaults.emplace_back(at::make_generator<NPUGeneratorImpl>(i));
    }
  });
  if (device < 0) device = current_device();
  check_device_index(device);
  return defaults[device];
}

at::Generator createNPUGenerator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<NPUGeneratorImpl>(device);
}

at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  if (gen.has_value() && gen->defined()) {
    TORCH_CHECK(gen->device().type() == c10::DeviceType::PrivateUse1,
                "Expected a 'npu' device type for generator but found '", gen->device().type(), "'");
    gen->get<NPUGeneratorImpl>()->note_captured_draw();
    return gen->get<NPUGeneratorImpl>()->cpu_generator();
  }
  auto* impl = getDefaultNPUGenerator(device).get<NPUGeneratorImpl>();
  impl->note_captured_draw();
  return impl->cpu_generator();
}

}  // namespace torch_npu

namespace at_npu::detail {
const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device_index) {
  return torch_npu::getDefaultNPUGenerator(device_index);
}
at::Generator createNPUGenerator(c10::DeviceIndex device_index) { return torch_npu::createNPUGenerator(device_index); }
}  // namespace at_npu::detail
