// The tpu generator: a Philox (seed, offset) pair, advanced by each draw.
// The runtime's random ops take both, so a seed gives the same numbers in
// every eager mode and on every platform.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace tpurt_torch {

struct TpuGenerator : public c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index);
  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The (seed, offset) for a draw of `count` elements; advances the offset.
  std::pair<uint64_t, uint64_t> take(uint64_t count);

 private:
  TpuGenerator* clone_impl() const override;
  uint64_t seed_ = 67280421310721ULL;
  uint64_t offset_ = 0;
};

// `gen` if given, else the device's default generator.
TpuGenerator& generator_of(const std::optional<at::Generator>& gen, int device);
std::vector<at::Generator>& all_default_generators();

}  // namespace tpurt_torch
