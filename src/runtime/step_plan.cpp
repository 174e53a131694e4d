#include "runtime/step_plan.h"

#include <algorithm>

namespace spw::runtime {

int64_t max_cached_prefix(int64_t n_prompt) { return std::max<int64_t>(0, n_prompt - 2); }

int64_t next_prefill_end(int64_t done, int64_t n_prompt, int64_t chunk, int64_t block) {
  const int64_t last_aligned = n_prompt >= 2 ? (n_prompt - 2) / block * block : 0;
  int64_t end = std::min((done / chunk + 1) * chunk, n_prompt);
  if (done < last_aligned && last_aligned < end) end = last_aligned;
  // A chunk boundary one token before the end: cut two tokens before it instead (done + chunk − 1
  // tokens, ≥ 15, then 2), so no piece is a single token.
  if (n_prompt - end == 1) end = n_prompt - 2 > done ? n_prompt - 2 : n_prompt;
  return end;
}

StepPlan plan_step(std::span<const PlanEntry> entries, size_t max_batch, int64_t token_budget, size_t rotate) {
  StepPlan plan;
  std::vector<size_t> decoders;
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].decoding) decoders.push_back(i);
  const size_t n_dec = decoders.size();
  // While a prompt waits, decodes leave room for its next piece, so prefill always progresses.
  int64_t decode_budget = token_budget;
  for (const PlanEntry& e : entries)
    if (!e.decoding) {
      decode_budget = std::max<int64_t>(1, token_budget - e.n_tokens);
      break;
    }
  for (size_t k = 0; k < n_dec && plan.members.size() < max_batch && plan.n_tokens < decode_budget; ++k) {
    plan.members.push_back(decoders[(k + rotate) % n_dec]);
    plan.n_tokens += 1;
  }
  // Keep the decode members in admission order (stable output order; rotation only chooses who).
  std::sort(plan.members.begin(), plan.members.end());
  for (size_t i : plan.members) {
    const int64_t drafts = entries[i].n_tokens - 1;
    if (drafts <= 0) continue;
    if (plan.n_tokens + drafts <= decode_budget) plan.n_tokens += drafts;
    else plan.without_drafts.push_back(i);
  }
  for (size_t i = 0; i < entries.size() && plan.members.size() < max_batch; ++i) {
    if (entries[i].decoding) continue;
    const int64_t n = entries[i].n_tokens;
    if (plan.members.empty() || plan.n_tokens + n <= token_budget) {
      plan.members.push_back(i);
      plan.n_tokens += n;
    } else {
      break;  // FIFO: a later prompt does not overtake an earlier one that does not fit
    }
  }
  return plan;
}

}  // namespace spw::runtime
