// Prompt-lookup drafting (speculative decoding without a draft model): the tokens that followed the
// latest earlier occurrence of the context's last n tokens are proposed as the next ones. Coding agents
// re-emit large spans of their context (file contents, diffs), where these drafts are long and free.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace spw::runtime {

struct NgramSettings {
  int min_ngram = 2;  // shortest match of the context's tail that may propose anything
  int max_ngram = 4;  // longer matches are preferred up to this length
};

// One sequence's drafter. The context (prompt, then generated tokens) must only grow between calls:
// its positions are indexed once, as they arrive, so a call costs O(new tokens + candidates).
class NgramDrafter {
 public:
  explicit NgramDrafter(NgramSettings settings);

  // Up to max_tokens tokens to follow `context`: among earlier positions where its last min_ngram
  // tokens occur (the latest kCandidates of them), the one whose match extends furthest back (up to
  // max_ngram; ties to the latest) proposes what followed it. Empty when the tail never occurred.
  std::vector<int32_t> propose(std::span<const int32_t> context, int max_tokens);

  // Candidate positions examined per call, newest first (bounds a call on very repetitive text).
  static constexpr int kCandidates = 64;

 private:
  uint64_t key(const int32_t* tokens) const;

  NgramSettings settings_;
  // Key of min_ngram tokens → the positions right after each occurrence, ascending.
  std::unordered_map<uint64_t, std::vector<int64_t>> follows_;
  int64_t indexed_end_ = 0;  // occurrences ending before this position are indexed
};

}  // namespace spw::runtime
