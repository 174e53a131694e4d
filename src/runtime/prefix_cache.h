// Prefix cache: copies of sequence states (RunnerSequence::clone) keyed on whole token blocks.
//
// A copy taken after `n` tokens (n a multiple of block_tokens) is stored under the hash chain
// of those n tokens' blocks, with the tokens themselves so a hash collision can never serve a
// wrong state. A runner's state is complete (window rings, compressor partial groups, compressed
// caches, Engram history), so a copy is exact at any token boundary, including in the middle of a
// V4.1 compressor group. A runner that cannot copy its states caches nothing. Lookups return the longest cached prefix; eviction is
// least-recently-used under a byte budget. Scheduler-thread only (not thread-safe).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/model_runner.h"

namespace spw::runtime {

class PrefixCache {
 public:
  // At most max_entries copies (negative: no limit) within max_nbytes.
  PrefixCache(int block_tokens, size_t max_nbytes, int max_entries = -1);

  int block_tokens() const { return block_tokens_; }

  // Longest cached prefix of `tokens` with length ≤ max_len: its length and a copy of its state
  // (0 and nullptr on a miss).
  std::pair<int64_t, std::unique_ptr<RunnerSequence>> lookup(std::span<const int32_t> tokens, int64_t max_len);
  // The state lookup would copy now (nullptr on a miss), without copying it or touching its recency.
  const RunnerSequence* peek(std::span<const int32_t> tokens, int64_t max_len) const;

  // Stores a copy of `state` as the state after `prefix` (prefix.size() a positive multiple of
  // block_tokens and state.n_past() == prefix.size()). Replaces nothing already present. Room is made by
  // dropping the least recently used copies, except those that begin one of `keep` (the prompts of queued
  // requests: a burst sharing a prefix must not lose it to its own members' copies); when only those are
  // left to drop, nothing is stored.
  void insert(std::span<const int32_t> prefix, const RunnerSequence& state,
              std::span<const std::span<const int32_t>> keep = {});

  // Drops the least recently used copy (KV memory for running sequences), except one whose tokens
  // begin `keep` (the copy a request about to start would use); false when there is none to drop.
  bool evict_oldest(std::span<const int32_t> keep = {});

  size_t n_entries() const { return entries_.size(); }
  size_t nbytes() const { return nbytes_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<RunnerSequence> state;
    size_t nbytes = 0;
    std::list<uint64_t>::iterator lru;
  };
  uint64_t chain(uint64_t parent, std::span<const int32_t> block) const;
  // The entries that may hold a prefix of tokens within max_len, longest first: (hash chain, length).
  std::vector<std::pair<uint64_t, size_t>> candidates(std::span<const int32_t> tokens, int64_t max_len) const;
  // The entry of that candidate, if it holds exactly those tokens (a hash collision's does not).
  const Entry* entry_for(std::pair<uint64_t, size_t> candidate, std::span<const int32_t> tokens) const;
  // Drops least recently used entries, none that begins one of `keep`, until within both limits; false when
  // that is not possible (what could go is gone).
  bool evict_to(size_t max_nbytes, size_t max_entries, std::span<const std::span<const int32_t>> keep);

  int block_tokens_;
  size_t max_nbytes_;
  int max_entries_;
  size_t nbytes_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // most recent first
};

}  // namespace spw::runtime
