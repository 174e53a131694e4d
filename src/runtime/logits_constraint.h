// A per-sequence restriction on the next token (grammar-constrained decoding), applied by the
// Sampler before it draws: the sampled token and the reported logprobs both come from the masked
// distribution. The scheduler thread alone calls it, once per generated token, in the order
// mask → (draw) → accept. Implementations live above the runtime (src/server/grammar_constraint.h).
#pragma once

#include <cstdint>
#include <span>

namespace spw::runtime {

class LogitsConstraint {
 public:
  virtual ~LogitsConstraint() = default;
  // Sets the logits of tokens that may not come next to -infinity; leaves at least one finite.
  virtual void mask(std::span<float> logits) = 0;
  // Records the token that was sampled.
  virtual void accept(int32_t id) = 0;
};

}  // namespace spw::runtime
