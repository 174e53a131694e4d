// Step planning, separated from running (FlashInfer's plan/run split): which sequences take a
// decode token and which a prefill piece this step, under the batch and token budgets.
// Pure functions, unit-tested in tests/unit/test_runtime_step_plan.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace spw::runtime {

// End of the next prefill piece for a prompt of n_prompt tokens whose first `done` are computed.
// Pieces end on multiples of `chunk` and at the last multiple of `block` that leaves ≥ 2 tokens
// (or two tokens before the end where a chunk boundary would leave one), so no piece is a single
// token: a one-token forward is a decode step, which V4.1's
// stale-index-key quirk computes differently from a prefill. Piece boundaries therefore depend
// only on the prompt and where its cached prefix ended, never on load, so outputs are the same
// whether a request runs alone or among 63 others. chunk must be a multiple of block.
int64_t next_prefill_end(int64_t done, int64_t n_prompt, int64_t chunk, int64_t block);

// The longest prefix-cache hit a prompt may use: it must leave ≥ 2 tokens to prefill (see above).
int64_t max_cached_prefix(int64_t n_prompt);

struct PlanEntry {
  bool decoding = false;   // true: wants one decode token (or to verify drafts); false: wants a prefill piece
  int64_t n_tokens = 1;    // tokens of its next piece (decoding: 1, or 1 + drafts)
};

struct StepPlan {
  std::vector<size_t> members;  // indices into the input, decodes first, then prefills
  int64_t n_tokens = 0;
  std::vector<size_t> without_drafts;  // decode members whose drafts did not fit: they take one token
};

// Entries are in admission order. Decodes are taken first (rotating the start by `rotate` when
// more than max_batch want to decode, so none starves) but leave room in the budget for the
// oldest waiting prompt's next piece; a decode's drafts (n_tokens − 1) are optional and go in admission
// order while they fit that room, the others decode one token (without_drafts); then prefill pieces in admission order while they fit. A step that would otherwise be empty takes the first
// prefill piece whatever its size, so progress is guaranteed.
StepPlan plan_step(std::span<const PlanEntry> entries, size_t max_batch, int64_t token_budget, size_t rotate);

}  // namespace spw::runtime
