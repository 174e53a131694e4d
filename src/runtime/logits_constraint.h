// A per-sequence restriction on the next token (grammar-constrained decoding), applied before the
// draw: the sampled token and the reported logprobs both come from the masked distribution. The
// scheduler thread alone calls it, once per generated token, in the order allowed → (draw) → accept.
// The restriction is a set of token ids, independent of the logits, so a runner can apply it on the
// device (TokenPick::allowed). Implementations live above the runtime (src/server/grammar_constraint.h).
#pragma once

#include <cstdint>
#include <span>

namespace spw::runtime {

class LogitsConstraint {
 public:
  virtual ~LogitsConstraint() = default;
  // Sets bit id % 64 of bits[id / 64] for every token that may come next, at least one; bits holds
  // (vocab + 63) / 64 words, zeroed by the caller.
  virtual void allowed(std::span<uint64_t> bits) = 0;
  // Records the token that was sampled.
  virtual void accept(int32_t id) = 0;
};

// Sets logits[id] to −infinity for every id whose bit is clear in bits ((logits.size() + 63) / 64 words).
void apply_mask(std::span<float> logits, std::span<const uint64_t> bits);

}  // namespace spw::runtime
