#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tpurt_torch {
std::map<std::string, uint64_t> fallback_counts();
void reset_fallback_counts();
}  // namespace tpurt_torch
