#include "torch_npu/core/npu_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/CallOnce.h>

#include <cstring>

#include <algorithm>
#include <deque>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "torch_npu/core/npu_graph.h"
#include "torch_npu/core/npu_stream.h"
#include "torch_npu/core/npu_task_queue.h"

namespace torch_npu {

namespace {

constexpr const char* kSeedDuringCapture =
    "NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed is the same as the "
    "original seed.";

// A state's offset inside a capture: the top bit, the capture's serial (23 bits) and the
// position relative to a replay's start (40 bits).
constexpr uint64_t kCaptureBit = uint64_t{1} << 63;
constexpr int kSerialShift = 40;
constexpr uint64_t kPositionMask = (uint64_t{1} << kSerialShift) - 1;

uint64_t capture_offset(uint32_t serial, uint64_t position) {
  return kCaptureBit | (uint64_t{serial & 0x7fffffu} << kSerialShift) | (position & kPositionMask);
}

// Offsets advance by whole Philox calls (four 32-bit numbers), at least one per kernel.
uint64_t span_of(uint64_t numbers) { return (std::max<uint64_t>(numbers, 1) + 3) / 4 * 4; }

uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The Mersenne Twister engine a CPU kernel draws from for (seed, offset): its 624 words of
// state filled by a splitmix64 sequence keyed on both (distinct pairs, unrelated engines).
void set_engine(const at::Generator& cpu, uint64_t seed, uint64_t offset) {
  at::mt19937_data_pod pod{};
  pod.seed_ = seed;
  pod.left_ = 1;
  pod.seeded_ = true;
  pod.next_ = 0;
  uint64_t x = mix64(seed) ^ (mix64(offset + 0x632be59bd9b4e019ULL) << 1);
  for (auto& word : pod.state_) {
    x += 0x9e3779b97f4a7c15ULL;
    word = static_cast<uint32_t>(mix64(x) >> 32);
  }
  at::mt19937 engine;
  engine.set_data(pod);
  auto* impl = cpu.get<at::CPUGeneratorImpl>();
  std::lock_guard<std::mutex> lock(impl->mutex_);
  impl->set_engine(engine);
  impl->set_next_float_normal_sample(std::nullopt);
  impl->set_next_double_normal_sample(std::nullopt);
}

// The random kernels one capture recorded for one generator: their CPU generators and their
// offsets relative to a replay's start; `span` is the offsets a replay uses up.
struct CapturedDraws {
  std::vector<std::pair<at::Generator, uint64_t>> draws;
  uint64_t span = 0;
};

// Per captured graph, the generators it draws from; per capture under way, its number (a
// destroyed model's address may come back for a new capture).
struct RandomGraphs {
  std::mutex mu;
  std::unordered_map<aclmdlRI, std::vector<std::pair<at::Generator, std::shared_ptr<CapturedDraws>>>> graphs;
  std::unordered_map<aclmdlRI, uint64_t> captures;
  uint64_t last_capture = 0;
};

RandomGraphs& random_graphs() {
  static RandomGraphs* graphs = new RandomGraphs();  // leaked: used during exit
  return *graphs;
}

}  // namespace

void replay_random_draws(aclmdlRI model, const NPUStream& stream) {
  std::vector<std::pair<at::Generator, std::shared_ptr<CapturedDraws>>> generators;
  {
    RandomGraphs& rg = random_graphs();
    std::lock_guard<std::mutex> lock(rg.mu);
    auto it = rg.graphs.find(model);
    if (it == rg.graphs.end()) return;
    generators = it->second;
  }
  std::vector<std::tuple<std::shared_ptr<CapturedDraws>, uint64_t, uint64_t>> replay;
  for (auto& [gen, draws] : generators) {
    // The host reserves the replay's offsets now, in the order of its calls.
    auto [seed, base] = gen.get<NPUGeneratorImpl>()->philox_engine_inputs(draws->span);
    replay.emplace_back(draws, seed, base);
  }
  launch(stream, "npu_generator_replay_offsets", [replay = std::move(replay)] {
    for (const auto& [draws, seed, base] : replay) {
      for (const auto& [cpu, position] : draws->draws) set_engine(cpu, seed, base + position);
    }
  });
}

void begin_random_capture(aclmdlRI model) {
  RandomGraphs& rg = random_graphs();
  std::lock_guard<std::mutex> lock(rg.mu);
  rg.graphs.erase(model);
  rg.captures[model] = ++rg.last_capture;
}

void forget_captured_model(aclmdlRI model) {
  RandomGraphs& rg = random_graphs();
  std::lock_guard<std::mutex> lock(rg.mu);
  rg.graphs.erase(model);
  rg.captures.erase(model);
}

namespace {

uint64_t capture_number(aclmdlRI model) {
  RandomGraphs& rg = random_graphs();
  std::lock_guard<std::mutex> lock(rg.mu);
  auto it = rg.captures.find(model);
  return it == rg.captures.end() ? 0 : it->second;
}

}  // namespace

}  // namespace torch_npu

// The generator's members: torch_npu's public class (NPUGeneratorImpl.h).
namespace at_npu {

using namespace torch_npu;

NPUGeneratorImpl::NPUGeneratorImpl(c10::DeviceIndex device_index)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device_index < 0 ? current_device() : device_index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(c10::default_rng_seed_val) {
  check_device_index(device().index());
}

// One capture into an NPU graph as this generator sees it: the position of its next draw
// relative to a replay's start, and the draws recorded so far.
struct NPUGeneratorImpl::Capture {
  aclmdlRI model = nullptr;
  uint64_t number = 0;  // begin_random_capture's
  uint32_t serial = 0;
  uint64_t position = 0;
  std::shared_ptr<CapturedDraws> draws = std::make_shared<CapturedDraws>();
};

NPUGeneratorImpl::Capture* NPUGeneratorImpl::capture() const {
  const NPUStream stream = getCurrentNPUStream(device().index());
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI model = nullptr;
  if (in_kernel() || aclmdlRICaptureGetInfo(stream.stream(), &status, &model) != ACL_SUCCESS ||
      status != ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE) {
    return nullptr;
  }
  const uint64_t number = capture_number(model);
  if (!capture_ || capture_->model != model || capture_->number != number) {
    capture_ = std::make_shared<Capture>();
    capture_->model = model;
    capture_->number = number;
    capture_->serial = ++captures_;
  }
  return capture_.get();
}

at::Generator NPUGeneratorImpl::draw(uint64_t numbers) {
  at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>();
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (Capture* c = capture()) {
    CapturedDraws& captured = *c->draws;
    if (captured.draws.empty()) {  // its first draw in this capture: the graph's replays reserve for it
      RandomGraphs& rg = random_graphs();
      std::lock_guard<std::mutex> graphs_lock(rg.mu);
      rg.graphs[c->model].emplace_back(
          at::Generator(c10::intrusive_ptr<NPUGeneratorImpl>::reclaim_copy(this)), c->draws);
    }
    captured.draws.emplace_back(cpu, c->position);
    c->position += span_of(numbers);
    captured.span = std::max(captured.span, c->position);
    return cpu;  // its engine is set by each replay
  }
  set_engine(cpu, seed_, offset_);
  offset_ += span_of(numbers);
  return cpu;
}

void NPUGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (capture() != nullptr) {
    TORCH_CHECK(seed == seed_, kSeedDuringCapture);
    return;  // the same seed: nothing changes
  }
  seed_ = seed;
  offset_ = 0;
}

uint64_t NPUGeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return seed_;
}

uint64_t NPUGeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  TORCH_CHECK(capture() == nullptr, kSeedDuringCapture);
  seed_ = c10::detail::getNonDeterministicRandom();
  offset_ = 0;
  return seed_;
}

void NPUGeneratorImpl::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  offset_ = offset;
}

uint64_t NPUGeneratorImpl::get_offset() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return offset_;
}

std::pair<uint64_t, uint64_t> NPUGeneratorImpl::philox_engine_inputs(uint64_t increment) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  const uint64_t offset = offset_;
  offset_ += (increment + 3) / 4 * 4;
  return {seed_, offset};
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

// The state is torch_npu's: the 8-byte seed and the 8-byte Philox offset; the seed alone (8
// bytes) sets the offset to 0. In a capture, the offset of a state is the capture's position.
void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  const int64_t size = new_state.numel();
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && (size == 16 || size == 8),
              "set_rng_state: expected an npu generator state of 16 bytes (seed and Philox offset, from "
              "get_rng_state(), as torch_npu's), or of 8 (the seed), got ",
              size, " elements of ", new_state.dtype());
  at::Tensor state =
      at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(const_cast<c10::TensorImpl*>(&new_state)))
          .contiguous();
  uint64_t seed = 0, offset = 0;
  std::memcpy(&seed, state.const_data_ptr<uint8_t>(), sizeof seed);
  if (size == 16) std::memcpy(&offset, state.const_data_ptr<uint8_t>() + 8, sizeof offset);
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (Capture* c = capture()) {
    TORCH_CHECK(seed == seed_, kSeedDuringCapture);
    TORCH_CHECK((offset & kCaptureBit) && ((offset >> kSerialShift) & 0x7fffffu) == (c->serial & 0x7fffffu),
                "set_rng_state during an NPU graph capture takes a state get_rng_state() returned in the same "
                "capture (its offset is a position in the graph's draws)");
    c->position = offset & kPositionMask;
    return;
  }
  seed_ = seed;
  offset_ = offset;
}

c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  std::lock_guard<std::mutex> lock(state_mutex_);
  uint64_t offset = offset_;
  if (Capture* c = capture()) offset = capture_offset(c->serial, c->position);
  std::memcpy(state.mutable_data_ptr<uint8_t>(), &seed_, 8);
  std::memcpy(state.mutable_data_ptr<uint8_t>() + 8, &offset, 8);
  return state.getIntrusivePtr();
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* gen = new NPUGeneratorImpl(device().index());
  std::lock_guard<std::mutex> lock(state_mutex_);
  gen->seed_ = seed_;
  gen->offset_ = offset_;
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

at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t numbers) {
  if (gen.has_value() && gen->defined()) {
    TORCH_CHECK(gen->device().type() == c10::DeviceType::PrivateUse1,
                "Expected a 'npu' device type for generator but found '", gen->device().type(), "'");
    return gen->get<NPUGeneratorImpl>()->draw(numbers);
  }
  return getDefaultNPUGenerator(device).get<NPUGeneratorImpl>()->draw(numbers);
}

}  // namespace torch_npu

namespace at_npu::detail {
const at::Generator& getDefaultNPUGenerator(c10::DeviceIndex device_index) {
  return torch_npu::getDefaultNPUGenerator(device_index);
}
at::Generator createNPUGenerator(c10::DeviceIndex device_index) { return torch_npu::createNPUGenerator(device_index); }
}  // namespace at_npu::detail
