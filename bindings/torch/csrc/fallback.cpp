// The CPU fallback for aten ops without a tpu kernel: switchable
// (torch.tpu.enable_cpu_fallback) and counted per op
// (torch.tpu.fallback_stats). Off, an unsupported op raises
// NotImplementedError naming it.
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "common.h"
#include "fallback.h"

namespace tpurt_torch {

namespace {

std::atomic<bool>& enabled() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("TPURT_CPU_FALLBACK");
    return v == nullptr || std::string(v) != "0";
  }()};
  return on;
}

std::mutex g_mu;
std::map<std::string, uint64_t> g_counts;

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  std::string base = name.name.rfind("aten::", 0) == 0 ? name.name.substr(6) : name.name;
  std::string full = base + (name.overload_name.empty() ? "" : "." + name.overload_name);
  TORCH_CHECK_NOT_IMPLEMENTED(enabled().load(), "tpu: ", full,
                              " has no tpu kernel and the CPU fallback is off "
                              "(torch.tpu.enable_cpu_fallback(True) turns it on)");
  {
    std::lock_guard<std::mutex> g(g_mu);
    ++g_counts[full];
  }
  at::native::cpu_fallback(op, stack);
}

}  // namespace

bool cpu_fallback_enabled() { return enabled().load(); }
void set_cpu_fallback_enabled(bool on) { enabled().store(on); }

void count_cpu_fallback(const std::string& what) {
  TORCH_CHECK_NOT_IMPLEMENTED(enabled().load(), "tpu: ", what,
                              " has no tpu kernel and the CPU fallback is off "
                              "(torch.tpu.enable_cpu_fallback(True) turns it on)");
  std::lock_guard<std::mutex> g(g_mu);
  ++g_counts[what];
}

std::map<std::string, uint64_t> fallback_counts() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_counts;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> g(g_mu);
  g_counts.clear();
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
}

}  // namespace tpurt_torch
