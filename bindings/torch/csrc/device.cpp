// PyTorch's device plumbing for PrivateUse1 ("tpu"): the DeviceGuardImpl
// over the runtime's real streams and events, the hooks interface, and the
// Philox generator whose (seed, offset) the runtime's random ops take.
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstring>
#include <mutex>
#include <random>

#include "common.h"
#include "generator.h"

namespace tpurt_torch {

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

tpurt_event event_of(void* e) { return tpurt_event{reinterpret_cast<uint64_t>(e)}; }

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) {
      set_current_device(d.index());
    }
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kTpu, static_cast<c10::DeviceIndex>(current_device()));
  }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      set_current_device(d.index());
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return stream_from_id(d.index(), 0); }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return new_stream(d.index(), priority, false);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return new_stream(d.index(), high_priority ? -1 : 0, false);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return set_current_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 0;
    }
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event != nullptr) {
      tpurt_status_destroy(tpurt_event_destroy(event_of(event)));
    }
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "tpu: event device ",
                device_index, " does not match the stream's device ", stream.device_index());
    if (*event == nullptr) {
      tpurt_event e{0};
      // Timing is cheap (a clock read when the event completes): always on,
      // so elapsed_time works for every event.
      check(tpurt_event_create(runtime(), TPURT_EVENT_TIMING, &e), "creating an event");
      *event = reinterpret_cast<void*>(e.handle);
    }
    check(tpurt_event_record(event_of(*event), stream_handle(stream)), "recording an event");
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) {
      return;  // never recorded: nothing to wait for
    }
    check(tpurt_stream_wait_event(stream_handle(stream), event_of(event)), "waiting for an event");
  }
  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;
    }
    bool done = false;
    check(tpurt_event_query(event_of(event), &done), "querying an event");
    return done;
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      check(tpurt_event_synchronize(event_of(event)), "synchronizing an event");
    }
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "tpu: both events must be recorded before elapsed_time");
    float ms = 0;
    check(tpurt_event_elapsed_time(event_of(start), event_of(end), &ms), "elapsed_time");
    return ms;
  }
  bool queryStream(const c10::Stream& s) const override {
    bool done = false;
    check(tpurt_stream_query(stream_handle(s), &done), "querying a stream");
    return done;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    check(tpurt_stream_synchronize(stream_handle(s)), "synchronizing a stream");
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    check(tpurt_device_synchronize(runtime(), static_cast<uint32_t>(d)), "synchronizing a device");
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    record_stream_of(data_ptr, stream);
  }

  static void record_stream_of(const c10::DataPtr& data_ptr, const c10::Stream& stream);
};

}  // namespace

// --- the generator ------------------------------------------------------------

TpuGenerator::TpuGenerator(c10::DeviceIndex index)
    : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

void TpuGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
void TpuGenerator::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t TpuGenerator::get_offset() const { return offset_; }
uint64_t TpuGenerator::current_seed() const { return seed_; }
uint64_t TpuGenerator::seed() {
  std::random_device rd;
  uint64_t s = (static_cast<uint64_t>(rd()) << 32) | rd();
  set_current_seed(s);
  return s;
}

// State: 16 bytes, the seed then the offset (little-endian u64s), as a
// CPU uint8 tensor (torch's convention for get_rng_state).
c10::intrusive_ptr<c10::TensorImpl> TpuGenerator::get_state() const {
  at::Tensor t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  uint64_t v[2] = {seed_, offset_};
  std::memcpy(t.data_ptr(), v, sizeof(v));
  return t.getIntrusivePtr();
}

void TpuGenerator::set_state(const c10::TensorImpl& state) {
  TORCH_CHECK(state.numel() == 16 && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
              "tpu: an RNG state is a uint8 tensor of 16 bytes (seed, offset), got ", state.numel(),
              " elements of ", state.dtype());
  uint64_t v[2];
  std::memcpy(v, state.data(), sizeof(v));
  seed_ = v[0];
  offset_ = v[1];
}

TpuGenerator* TpuGenerator::clone_impl() const {
  auto* g = new TpuGenerator(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

std::pair<uint64_t, uint64_t> TpuGenerator::take(uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto out = std::make_pair(seed_, offset_);
  // Each element takes one counter; keep offsets multiples of 4 (one
  // Philox block) so draws never share a block.
  offset_ += (count + 3) / 4 * 4;
  return out;
}

namespace {

std::vector<at::Generator>& default_generators() {
  static auto* gens = [] {
    auto* v = new std::vector<at::Generator>();
    for (int i = 0; i < device_count(); ++i) {
      auto g = at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(i));
      g.set_current_seed(c10::detail::getNonDeterministicRandom());
      v->push_back(g);
    }
    return v;
  }();
  return *gens;
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    int i = index < 0 ? current_device() : index;
    check_device(i);
    return default_generators()[i];
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    int i = index < 0 ? current_device() : index;
    check_device(i);
    return at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(i));
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(kTpu, static_cast<c10::DeviceIndex>(current_device()));
  }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return runtime_initialized() && index >= 0 && index < device_count();
  }
  void init() const override { runtime(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(current_device());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_current_device(d);
    return static_cast<c10::DeviceIndex>(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_bytes(storage, newsize);
  }
};

}  // namespace

TpuGenerator& generator_of(const std::optional<at::Generator>& gen, int device) {
  const at::Generator& g = gen.has_value() && gen->defined()
                               ? *gen
                               : default_generators()[device];
  TORCH_CHECK(g.device().type() == kTpu, "tpu: expected a tpu generator, got one for ", g.device());
  return *at::check_generator<TpuGenerator>(g);
}

std::vector<at::Generator>& all_default_generators() { return default_generators(); }

void TpuGuardImpl::record_stream_of(const c10::DataPtr& data_ptr, const c10::Stream& stream) {
  if (data_ptr.get() == nullptr) {
    return;
  }
  check(tpurt_buffer_record_stream(buffer_of_data_ptr(data_ptr), stream_handle(stream)),
        "record_stream");
}

void register_device() {
  static TpuHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace tpurt_torch
