#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tpurt_torch {
std::map<std::string, uint64_t> fallback_counts();
// For a kernel that runs some of its cases on the CPU: raises
// NotImplementedError naming `what` when the fallback is off, else counts
// one call of `what`.
void count_cpu_fallback(const std::string& what);
void reset_fallback_counts();
}  // namespace tpurt_torch
