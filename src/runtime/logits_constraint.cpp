#include "runtime/logits_constraint.h"

#include <limits>

namespace spw::runtime {

void apply_mask(std::span<float> logits, std::span<const uint64_t> bits) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!((bits[i / 64] >> (i % 64)) & 1)) logits[i] = kMasked;
}

}  // namespace spw::runtime
