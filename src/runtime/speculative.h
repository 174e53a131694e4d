// Speculative decoding's settings and its per-sequence draft length. A drafter proposes tokens, the
// runner computes them in one forward (kept for rollback), Sampler::verify accepts a prefix of them
// and RunnerSequence::truncate takes back the rest (docs/speculative.md).
#pragma once

#include <string_view>

#include "base/status.h"
#include "runtime/ngram_drafter.h"

namespace spw::runtime {

enum class SpeculativeMode { off, ngram };

// "off" | "ngram"; errors name the accepted values.
Result<SpeculativeMode> parse_speculative_mode(std::string_view name);
const char* to_string(SpeculativeMode mode);

struct SpeculativeSettings {
  SpeculativeMode mode = SpeculativeMode::off;
  int draft_tokens = 5;  // most tokens drafted for one sequence in one step
  NgramSettings ngram;
};

// How many tokens a sequence drafts next. Starts at 2, doubles (up to the maximum) while whole drafts are
// accepted and falls to one more than the accepted count when one fails. After a draft with nothing
// accepted it skips drafting for 1, 2, 4, … up to 64 steps, so a sequence whose drafts keep failing
// verifies an extra token on a vanishing share of its steps.
class DraftLength {
 public:
  explicit DraftLength(int max_tokens) : max_(max_tokens), len_(max_tokens < 2 ? max_tokens : 2) {}
  // Tokens to draft for the next step (0 while cooling down).
  int next() const { return cooldown_ > 0 ? 0 : len_; }
  // After each step the sequence took a decode token in: the cooldown counts these steps.
  void on_step();
  void on_verified(int drafted, int accepted);

  static constexpr int kMaxCooldown = 64;

 private:
  int max_, len_;
  int failures_ = 0;  // consecutive drafts with nothing accepted
  int cooldown_ = 0;  // steps left without drafting
};

}  // namespace spw::runtime
