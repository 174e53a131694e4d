// Top-k selection: indices of the k largest values; ties go to the lower index (deterministic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spw::ref {

std::vector<int32_t> topk_indices(const float* values, size_t n, size_t k);

}  // namespace spw::ref
